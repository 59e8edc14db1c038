"""Kept for 0.2 code: ``from pydotcompute.ring_kernels.cython_kernel import ...`` (API.md).

The process tier lives in `tiers.process`: `CythonRingKernel` is
`tiers.process.kernel.ProcessKernel`, a synchronous façade over the tier's
`ProcessWorker`; new code imports it from `pydotcompute.ring_kernels`.
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
