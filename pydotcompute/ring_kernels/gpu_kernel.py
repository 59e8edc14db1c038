"""GPU-resident ring kernels (an alias path).

The GPU tier lives in `pydotcompute.ring_kernels.tiers.gpu`; this module re-exports its
public names so that imports from the old path keep working.
"""

from __future__ import annotations

from .tiers.gpu.kernel import (
    STATUS_OK,
    GPUKernelOptions,
    GPUKernelStatistics,
    GPURingKernel,
)
from .tiers.gpu.prepare import (
    check_gpu_kernel_spec,
    compile_gpu_kernel_cuda_c,
    compile_gpu_kernel_ptx,
    compile_within,
    prepare_gpu_kernel,
    reserve_gpu_memory,
)

__all__ = (
    "STATUS_OK",
    "GPUKernelOptions",
    "GPUKernelStatistics",
    "GPURingKernel",
    "check_gpu_kernel_spec",
    "compile_gpu_kernel_cuda_c",
    "compile_gpu_kernel_ptx",
    "compile_within",
    "prepare_gpu_kernel",
    "reserve_gpu_memory",
)
