"""Alias of `pydotcompute.ring_kernels.tiers.gpu.spec` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import spec as module

sys.modules[__name__] = module
