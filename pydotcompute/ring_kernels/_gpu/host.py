"""Alias of `pydotcompute.ring_kernels.tiers.gpu.host` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import host as module

sys.modules[__name__] = module
