"""Alias of `pydotcompute.ring_kernels.tiers.gpu.cuda_c` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import cuda_c as module

sys.modules[__name__] = module
