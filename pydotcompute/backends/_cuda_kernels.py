"""CUDA kernels shipped with the CUDA backend, in Numba Python and in CUDA C.

Numba kernels are built by `numba_kernels` on first use (importing ``numba.cuda`` at
module import would break the lazy-import rule). The same Python functions, with explicit
signatures, are listed by `shipped_kernels` so that
`pydotcompute.compilation.check_ptx` can compile every kernel to PTX on a machine without
a GPU. CUDA C kernels are plain source strings compiled by NVRTC through the
``KernelCompiler`` (and its on-disk PTX cache).
"""

from __future__ import annotations

import functools
from typing import Any

from ._cuda_probe import numba_cuda

__all__ = (
    "VECTOR_ADD_CU",
    "VECTOR_ADD_CU_NAME",
    "numba_kernels",
    "shipped_kernels",
)

#: Name of the ``extern "C"`` entry point in :data:`VECTOR_ADD_CU`.
VECTOR_ADD_CU_NAME = "pdc_vector_add_f32"

#: CUDA C source of a float32 vector add, launched as ``(a, b, out, n)``.
VECTOR_ADD_CU = r"""
extern "C" __global__ void pdc_vector_add_f32(const float* __restrict__ a,
                                              const float* __restrict__ b,
                                              float* __restrict__ out,
                                              const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}
"""


def _python_kernels() -> dict[str, Any]:
    """The undecorated Python kernel functions (importing them imports ``numba.cuda``)."""
    from . import _cuda_kernel_defs as defs

    return {
        "vector_add": defs.vector_add,
        "scale_add": defs.scale_add,
        "matmul_f32": defs.matmul_f32,
    }


@functools.cache
def numba_kernels() -> dict[str, Any]:
    """The shipped kernels as lazily compiled ``numba.cuda.jit`` dispatchers (cached)."""
    cuda = numba_cuda()

    return {name: cuda.jit(fn) for name, fn in _python_kernels().items()}


def shipped_kernels() -> list[Any]:
    """Describe every CUDA kernel this module ships, for the PTX compile check."""
    from ..compilation.ptx_check import ShippedKernel

    def py(name: str) -> Any:
        return lambda: _python_kernels()[name]

    return [
        ShippedKernel(
            name="backends.cuda.vector_add",
            kind="numba",
            load=py("vector_add"),
            signatures=(
                "void(float32[::1], float32[::1], float32[::1])",
                "void(float64[::1], float64[::1], float64[::1])",
                "void(int32[::1], int32[::1], int32[::1])",
            ),
        ),
        ShippedKernel(
            name="backends.cuda.scale_add",
            kind="numba",
            load=py("scale_add"),
            signatures=("void(float32[::1], float32, float32[::1], float32[::1])",),
        ),
        ShippedKernel(
            name="backends.cuda.matmul_f32",
            kind="numba",
            load=py("matmul_f32"),
            signatures=("void(float32[:, ::1], float32[:, ::1], float32[:, ::1])",),
        ),
        ShippedKernel(
            name="backends.cuda.vector_add_cu",
            kind="cuda-c",
            load=lambda: VECTOR_ADD_CU,
            entry=VECTOR_ADD_CU_NAME,
        ),
    ]
