"""The process tier used directly, by its old path; it lives in `tiers.process`.

`CythonRingKernel` is `tiers.process.kernel.ProcessKernel`, a synchronous façade over the
tier's `ProcessWorker`.
"""

from __future__ import annotations

from .tiers.process.kernel import CythonKernelConfig as CythonKernelConfig
from .tiers.process.kernel import CythonKernelContext as CythonKernelContext
from .tiers.process.kernel import CythonKernelState as CythonKernelState
from .tiers.process.kernel import CythonRingKernel as CythonRingKernel
from .tiers.process.kernel import is_cython_kernel_available as is_cython_kernel_available

__all__ = (
    "CythonKernelConfig",
    "CythonKernelContext",
    "CythonKernelState",
    "CythonRingKernel",
    "is_cython_kernel_available",
)
