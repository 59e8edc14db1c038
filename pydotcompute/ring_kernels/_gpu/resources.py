"""Alias of `pydotcompute.ring_kernels.tiers.gpu.resources` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import resources as module

sys.modules[__name__] = module
