"""The CPU backend: NumPy arrays, kernels as plain or Numba-compiled Python functions.

"Device" memory on the CPU is ordinary NumPy memory. ``copy_to_device`` still returns a copy
(never an alias), so code written for a discrete GPU behaves the same here and a
``UnifiedBuffer`` keeps honest host and device sides. Kernels are called once with the whole
arrays: ``grid_size`` and ``block_size`` are recorded but do not split the work. When Numba
is installed, ``compile_kernel`` JIT-compiles with ``numba.njit``; otherwise the function runs
as plain Python, so the CPU backend is always available.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .base import (
    Backend,
    BackendType,
    DTypeLike,
    KernelExecutionResult,
    Shape,
    as_shape,
    check_copy_compatible,
    check_on_error,
    normalize_grid,
)

__all__ = (
    "CPUBackend",
    "matrix_multiply_cpu",
    "numba_available",
    "parallel_for",
    "vector_add_cpu",
)


def numba_available() -> bool:
    """Whether Numba's CPU JIT can be imported. Never raises."""
    try:
        import numba  # noqa: F401
    except Exception:
        return False
    return True


def _vector_add(
    a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], out: np.ndarray[Any, Any]
) -> None:
    np.add(a, b, out=out)


def _matrix_multiply(
    a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], out: np.ndarray[Any, Any]
) -> None:
    np.matmul(a, b, out=out)


class CPUBackend(Backend):
    """NumPy on the host CPU; always available.

    Args:
        device_id: must be 0 (there is one CPU device).
    """

    backend_type = BackendType.CPU
    extra = None

    def _probe(self) -> str | None:
        if self.device_id != 0:
            return f"the CPU backend has one device (0), got device_id={self.device_id}"
        return None

    @property
    def device_count(self) -> int:
        """Always 1."""
        return 1

    @property
    def uses_numba(self) -> bool:
        """Whether ``compile_kernel`` JIT-compiles with Numba (else it runs plain Python)."""
        return numba_available()

    # --- memory ----------------------------------------------------------------------------

    def allocate(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> np.ndarray[Any, Any]:
        """A zero-filled NumPy array."""
        self.require()
        return np.zeros(as_shape(shape), dtype=dtype)

    def allocate_zeros(
        self, shape: int | Shape, dtype: DTypeLike = np.float32
    ) -> np.ndarray[Any, Any]:
        """A zero-filled NumPy array (the same as `allocate`, which also zero-fills)."""
        return self.allocate(shape, dtype)

    def empty(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> np.ndarray[Any, Any]:
        """An uninitialised NumPy array."""
        self.require()
        return np.empty(as_shape(shape), dtype=dtype)

    def copy_to_device(self, a: Any, *, out: Any | None = None, stream: Any | None = None) -> Any:
        """Copy ``a`` into ``out`` (checked) or into a new array; never returns ``a`` itself."""
        if type(out) is np.ndarray and type(a) is np.ndarray:  # the UnifiedBuffer fast path
            if a.shape != out.shape or a.dtype != out.dtype:
                check_copy_compatible(a, out, what="copy to device")
            np.copyto(out, a)
            return out
        src = np.asarray(a)
        if out is None:
            return np.array(src, copy=True, order="C")
        check_copy_compatible(src, out, what="copy to device")
        np.copyto(out, src)
        return out

    def copy_to_host(
        self, a: Any, *, out: np.ndarray[Any, Any] | None = None, stream: Any | None = None
    ) -> np.ndarray[Any, Any]:
        """Copy ``a`` into ``out`` (checked) or into a new array."""
        if type(out) is np.ndarray and type(a) is np.ndarray:
            if a.shape != out.shape or a.dtype != out.dtype:
                check_copy_compatible(a, out, what="copy to host")
            np.copyto(out, a)
            return out
        src = np.asarray(a)
        if out is None:
            return np.array(src, copy=True, order="C")
        check_copy_compatible(src, out, what="copy to host")
        np.copyto(out, src)
        return out

    def fill(self, a: Any, value: Any) -> Any:
        """``a[...] = value``."""
        a[...] = value
        return a

    def is_device_array(self, a: Any) -> bool:
        """NumPy arrays are the CPU backend's device arrays."""
        return isinstance(a, np.ndarray)

    def synchronize(self) -> None:
        """Nothing is queued on the CPU; returns at once."""

    # --- kernels ---------------------------------------------------------------------------

    def execute_kernel(
        self,
        kernel: Callable[..., Any],
        grid_size: int | Sequence[int],
        block_size: int | Sequence[int],
        *args: Any,
        stream: Any | None = None,
        shared_mem: int = 0,
        on_error: str = "return",
        **kwargs: Any,
    ) -> KernelExecutionResult:
        """Call ``kernel(*args, **kwargs)`` once and time it.

        The grid and block sizes are validated and recorded but do not split the work: a CPU
        kernel processes whole arrays (NumPy or a Numba loop). An exception from the kernel
        is returned in a result with ``success=False`` (``on_error="return"``, the default,
        as in PyDotCompute 0.2) or propagates unchanged (``on_error="raise"``).
        """
        check_on_error(on_error)
        grid = normalize_grid(grid_size, "grid_size")
        block = normalize_grid(block_size, "block_size")
        fn = getattr(kernel, "kernel", kernel) if _is_compiled(kernel) else kernel
        start = self._now()
        try:
            output = fn(*args, **kwargs)
        except Exception as exc:
            if on_error == "raise":
                raise
            return KernelExecutionResult(
                kernel_name=self._kernel_name(kernel),
                backend=self.backend_type,
                grid_size=grid,
                block_size=block,
                execution_time_ms=(self._now() - start) * 1e3,
                success=False,
                error=exc,
            )
        elapsed = (self._now() - start) * 1e3
        return KernelExecutionResult(
            kernel_name=self._kernel_name(kernel),
            backend=self.backend_type,
            grid_size=grid,
            block_size=block,
            execution_time_ms=elapsed,
            output=output,
        )

    def compile_kernel(
        self, func: Callable[..., Any] | str, signature: Any | None = None, **options: Any
    ) -> Any:
        """JIT-compile ``func`` with ``numba.njit`` (plain Python when Numba is missing).

        Compiled once per (source, signature, options) through the shared ``KernelCompiler``.

        Raises:
            KernelCompilationError: Numba cannot compile ``func`` for ``signature``.
        """
        from ..compilation.compiler import get_compiler

        return get_compiler().compile(func, signature=signature, device="cpu", **options)

    def parallel_for(self, start: int, end: int, func: Callable[[int], Any]) -> None:
        """Call ``func(i)`` for every ``i`` in ``range(start, end)``, in order (see the
        module-level `parallel_for`)."""
        parallel_for(start, end, func)

    def get_vector_add_kernel(self) -> Callable[..., Any]:
        """``(a, b, out)`` -> ``out[:] = a + b`` with NumPy."""
        return _vector_add

    def get_matrix_multiply_kernel(self) -> Callable[..., Any]:
        """``(a, b, out)`` -> ``out[:] = a @ b`` with NumPy (BLAS)."""
        return _matrix_multiply


def _is_compiled(kernel: Any) -> bool:
    from ..compilation.compiler import CompiledKernel

    return isinstance(kernel, CompiledKernel)


# --- module-level helpers older code imports -----------------------------------------------


def vector_add_cpu(a: Any, b: Any) -> np.ndarray[Any, Any]:
    """`a + b` as a new NumPy array.

    Raises:
        BufferMismatchError: the shapes do not broadcast together.
    """
    x, y = np.asarray(a), np.asarray(b)
    try:
        return np.asarray(np.add(x, y))
    except ValueError as exc:
        from ..exceptions import BufferMismatchError

        raise BufferMismatchError(
            f"vector_add_cpu: cannot add shapes {x.shape} and {y.shape}; give arrays of the "
            "same length"
        ) from exc


def matrix_multiply_cpu(a: Any, b: Any) -> np.ndarray[Any, Any]:
    """`a @ b` as a new NumPy array (BLAS).

    Raises:
        BufferMismatchError: the inner dimensions differ.
    """
    x, y = np.asarray(a), np.asarray(b)
    try:
        return np.asarray(np.matmul(x, y))
    except ValueError as exc:
        from ..exceptions import BufferMismatchError

        raise BufferMismatchError(
            f"matrix_multiply_cpu: cannot multiply {x.shape} by {y.shape}; the columns of "
            "the first must equal the rows of the second"
        ) from exc


def parallel_for(start: int, end: int, func: Callable[[int], Any]) -> None:
    """Call `func(i)` for every `i` in `range(start, end)`, in order, on this thread.

    A loop and not a thread pool: Python callables gain nothing from threads under the
    GIL, and in order is what a caller can rely on. For parallel loops write the body as
    a Numba kernel with `numba.prange` and compile it with `CPUBackend.compile_kernel`.

    Raises:
        TypeError: `func` is not callable (nothing has run).
    """
    if not callable(func):
        raise TypeError(f"parallel_for needs a callable func(i), got {type(func).__name__}")
    for i in range(start, end):
        func(i)
