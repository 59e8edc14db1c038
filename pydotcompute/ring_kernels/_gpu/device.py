"""Alias of `pydotcompute.ring_kernels.tiers.gpu.device` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import device as module

sys.modules[__name__] = module
