"""Python source of the shipped Numba CUDA kernels.

This module imports ``numba.cuda`` at the top, so it is imported only on first use (by
``_cuda_kernels``), never by ``import pydotcompute``. The kernels refer to ``cuda`` as a
module global on purpose: the Numba CUDA simulator swaps module globals that are the
``numba.cuda`` module for its per-thread emulation, which it cannot do for a closure.
`MATMUL_TILE` is defined here, beside the kernel that compiles it in as a constant; the
backend reads it when it launches that kernel, which has imported this module by then.
"""

from __future__ import annotations

from typing import Any

from .numba_compat import ensure_numpy_compat

ensure_numpy_compat()  # before numba-cuda loads its NumPy support (NumPy 2.5: np.row_stack)

from numba import cuda as _numba_cuda  # noqa: E402
from numba import float32 as _float32  # noqa: E402

# Typed Any: Numba ships no type hints. Still module globals, as the simulator requires.
cuda: Any = _numba_cuda
float32: Any = _float32

#: Tile edge of the shared-memory matrix multiply (threads per block = MATMUL_TILE ** 2).
MATMUL_TILE = 16


def vector_add(a: Any, b: Any, out: Any) -> None:
    """``out[i] = a[i] + b[i]``, one thread per element."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]


def scale_add(a: Any, alpha: Any, b: Any, out: Any) -> None:
    """``out[i] = alpha * a[i] + b[i]``, one thread per element."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = alpha * a[i] + b[i]


def matmul_f32(a: Any, b: Any, out: Any) -> None:
    """``out = a @ b`` in float32 tiles staged through shared memory.

    Every thread of a block reaches every ``syncthreads`` (out-of-range threads load zeros),
    which the tiled loop needs to be correct.
    """
    sa = cuda.shared.array(shape=(MATMUL_TILE, MATMUL_TILE), dtype=float32)
    sb = cuda.shared.array(shape=(MATMUL_TILE, MATMUL_TILE), dtype=float32)
    row, col = cuda.grid(2)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    n_inner = a.shape[1]
    acc = float32(0.0)
    for t in range((n_inner + MATMUL_TILE - 1) // MATMUL_TILE):
        k_a = t * MATMUL_TILE + ty
        k_b = t * MATMUL_TILE + tx
        if row < a.shape[0] and k_a < n_inner:
            sa[tx, ty] = a[row, k_a]
        else:
            sa[tx, ty] = 0.0
        if col < b.shape[1] and k_b < n_inner:
            sb[tx, ty] = b[k_b, col]
        else:
            sb[tx, ty] = 0.0
        cuda.syncthreads()
        for k in range(MATMUL_TILE):
            acc += sa[tx, k] * sb[k, ty]
        cuda.syncthreads()
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = acc
