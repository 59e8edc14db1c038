"""Alias of `pydotcompute.ring_kernels.tiers.gpu.layout` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import layout as module

sys.modules[__name__] = module
