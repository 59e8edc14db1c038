"""Alias of `pydotcompute.ring_kernels.tiers.gpu.build` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import build as module

sys.modules[__name__] = module
