"""The old home of the lifecycle names, kept so that existing imports work.

The kernel lives in `kernel.py`, its states in `states.py`, its configuration in
`config.py` and the actor's context in `context.py`.
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
