"""Alias of `pydotcompute.ring_kernels.tiers.gpu.slab` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import slab as module

sys.modules[__name__] = module
