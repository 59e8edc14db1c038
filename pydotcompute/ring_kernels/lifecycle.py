"""Kept for 0.2 code: ``from pydotcompute.ring_kernels.lifecycle import ...`` (API.md).

The names live in `kernel.py` (the kernel), `states.py` (its states), `config.py` (its
configuration) and `context.py` (the actor's context); new code imports them from
`pydotcompute.ring_kernels`.
"""

from __future__ import annotations

from .config import RingKernelConfig as RingKernelConfig
from .context import SEND_YIELD_EVERY as SEND_YIELD_EVERY
from .context import KernelContext as KernelContext
from .kernel import ABANDONED_REQUESTS_KEPT as ABANDONED_REQUESTS_KEPT
from .kernel import KernelFunc as KernelFunc
from .kernel import RingKernel as RingKernel
from .kernel import managed_kernel as managed_kernel
from .kernel import restart_log as restart_log
from .states import KernelState as KernelState

__all__ = (
    "ABANDONED_REQUESTS_KEPT",
    "SEND_YIELD_EVERY",
    "KernelContext",
    "KernelFunc",
    "KernelState",
    "RingKernel",
    "RingKernelConfig",
    "managed_kernel",
    "restart_log",
)
