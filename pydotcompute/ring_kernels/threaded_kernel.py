"""Kept for 0.2 code: ``from pydotcompute.ring_kernels.threaded_kernel import ...`` (API.md).

The thread tier's standalone kernel lives in `pydotcompute.ring_kernels.tiers.thread`; new
code imports it from `pydotcompute.ring_kernels`.
"""

from __future__ import annotations

from .tiers.thread.context import ThreadedKernelContext as ThreadedKernelContext
from .tiers.thread.standalone import ThreadedKernelPool as ThreadedKernelPool
from .tiers.thread.standalone import ThreadedKernelState as ThreadedKernelState
from .tiers.thread.standalone import ThreadedRingKernel as ThreadedRingKernel
from .tiers.thread.worker import ThreadedKernelConfig as ThreadedKernelConfig
from .tiers.thread.worker import ThreadedKernelFunc as ThreadedKernelFunc

__all__ = (
    "ThreadedKernelConfig",
    "ThreadedKernelContext",
    "ThreadedKernelPool",
    "ThreadedKernelState",
    "ThreadedRingKernel",
)
