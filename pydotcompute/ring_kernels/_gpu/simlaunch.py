"""Alias of `pydotcompute.ring_kernels.tiers.gpu.simlaunch` (the module itself, not a copy)."""

import sys

from ..tiers.gpu import simlaunch as module

sys.modules[__name__] = module
