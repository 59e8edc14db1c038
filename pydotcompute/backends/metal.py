"""The Metal backend: MLX arrays, elementwise/vector-add/matmul helpers, ``mx.compile``.

MLX runs on Apple GPUs through Metal on macOS and, with the ``mlx[cpu]`` build, on the CPU on
Linux. The backend is available whenever MLX imports; ``uses_metal_gpu`` says whether work
reaches a Metal GPU. Parts that only exist on Metal (custom Metal shaders through
``mx.fast.metal_kernel``) raise ``BackendNotAvailableError`` with the reason elsewhere.

MLX arrays are immutable values evaluated lazily, so ``copy_to_device(a, out=...)`` cannot fill
``out`` in place: it returns a new array, and callers (``UnifiedBuffer``) keep the returned
one. ``execute_kernel`` forces evaluation with ``mx.eval`` so the time it reports is the time
the work took. MLX on a GPU has no float64; such copies raise ``BufferMismatchError`` rather
than silently losing precision.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..exceptions import BackendNotAvailableError, BufferMismatchError, MetalError
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
    "ELEMENTWISE_OPS",
    "MetalBackend",
    "get_elementwise_kernel",
    "get_matrix_multiply_kernel",
    "get_vector_add_kernel",
    "mlx_dtype",
)

#: Names accepted by `MetalBackend.get_elementwise_kernel`.
ELEMENTWISE_OPS = (
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "power",
    "exp",
    "log",
    "sqrt",
    "abs",
    "negative",
    "square",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
)
_UNARY = {
    "exp",
    "log",
    "sqrt",
    "abs",
    "negative",
    "square",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
}


def mlx_dtype(dtype: Any) -> Any:
    """The MLX dtype for ``dtype``: an MLX dtype (returned as is) or a NumPy dtype-like.

    Raises:
        BufferMismatchError: ``dtype`` is neither, or MLX has no such dtype.
    """
    import mlx.core as mx

    if isinstance(dtype, mx.Dtype):
        return dtype
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as exc:
        raise BufferMismatchError(
            f"not a NumPy or MLX dtype: {dtype!r}; pass one like np.float32 or mx.float32"
        ) from exc
    name = "bool_" if np_dtype == np.bool_ else np_dtype.name
    mx_type = getattr(mx, name, None)
    if mx_type is None or not isinstance(mx_type, mx.Dtype):
        raise BufferMismatchError(
            f"MLX has no dtype matching NumPy {np_dtype}; use float32, float16, int32, ..."
        )
    return mx_type


class MetalBackend(Backend):
    """Apple GPUs through MLX (MLX's CPU device on Linux). Never raises when constructed.

    Args:
        device_id: must be 0 (MLX exposes one device per process).
    """

    backend_type = BackendType.METAL
    extra = "metal"

    def __init__(self, device_id: int = 0) -> None:
        super().__init__(device_id)
        self._metal_gpu = False

    def _probe(self) -> str | None:
        try:
            import mlx.core as mx
        except Exception as exc:
            hint = (
                "" if platform.system() == "Darwin" else " (on Linux the extra installs mlx[cpu])"
            )
            return f"MLX is not installed{hint}: {type(exc).__name__}: {exc}"
        if self.device_id != 0:
            return f"MLX exposes one device (0), asked for {self.device_id}"
        try:
            self._metal_gpu = bool(mx.metal.is_available())
        except Exception:
            self._metal_gpu = False
        return None

    @property
    def uses_metal_gpu(self) -> bool:
        """Whether MLX computes on a Metal GPU (``False`` for the MLX CPU build)."""
        return self.is_available and self._metal_gpu

    @property
    def device_count(self) -> int:
        """1 when MLX imports, else 0."""
        return 1 if self.is_available else 0

    @property
    def device_description(self) -> str:
        """``"Metal GPU"`` or ``"MLX cpu"``, for messages and ``show_config``."""
        if not self.is_available:
            return "unavailable"
        import mlx.core as mx

        return "Metal GPU" if self._metal_gpu else f"MLX {mx.default_device()}"

    def require_metal_gpu(self, what: str) -> None:
        """Raise ``BackendNotAvailableError`` unless a Metal GPU is in use."""
        self.require()
        if not self._metal_gpu:
            raise BackendNotAvailableError(
                f"{what} needs a Metal GPU (macOS on Apple silicon); MLX here runs on "
                f"{self.device_description}"
            )

    def _mx(self) -> Any:
        self.require()
        import mlx.core as mx

        return mx

    # --- memory ----------------------------------------------------------------------------

    def allocate(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> Any:
        """A zero-filled ``mx.array``; ``dtype`` is a NumPy or an MLX dtype (``mx.bfloat16``).

        Raises:
            BufferMismatchError: an unknown dtype, or float64 on a Metal GPU.
        """
        mx = self._mx()
        return mx.zeros(as_shape(shape), dtype=self._checked_dtype(dtype))

    def _checked_dtype(self, dtype: Any) -> Any:
        mx_type = mlx_dtype(dtype)
        float64 = getattr(self._mx(), "float64", None)  # absent from older MLX
        if self._metal_gpu and float64 is not None and mx_type == float64:
            raise BufferMismatchError(
                "MLX on a Metal GPU has no float64; convert to float32 (got float64)"
            )
        return mx_type

    def copy_to_device(self, a: Any, *, out: Any | None = None, stream: Any | None = None) -> Any:
        """A new ``mx.array`` holding ``a`` with the same dtype (``out`` is only checked).

        MLX arrays are immutable, so the result is always a new array; pass ``out`` to have
        shape and dtype checked against it.
        """
        mx = self._mx()
        src = np.asarray(a)
        if out is not None:
            check_copy_compatible(src, out, what="copy to device")
        try:
            return mx.array(src, dtype=self._checked_dtype(src.dtype))
        except BufferMismatchError:
            raise
        except Exception as exc:
            raise MetalError(
                f"MLX could not copy {src.dtype} {src.shape} to the device: {exc}"
            ) from exc

    def copy_to_host(
        self, a: Any, *, out: np.ndarray[Any, Any] | None = None, stream: Any | None = None
    ) -> np.ndarray[Any, Any]:
        """A NumPy copy of ``a`` (into ``out`` when given; shapes/dtypes checked)."""
        self._mx()
        host = np.array(a, copy=True)
        if out is None:
            return host
        check_copy_compatible(host, out, what="copy to host")
        np.copyto(out, host)
        return out

    def fill(self, a: Any, value: Any) -> Any:
        """A new array shaped like ``a`` holding ``value`` (MLX arrays are immutable)."""
        mx = self._mx()
        return mx.full(a.shape, value, dtype=a.dtype)

    def copy_device_to_device(self, src: Any, dst: Any) -> Any:
        """MLX arrays are immutable values: checks ``dst`` and returns ``src`` itself."""
        check_copy_compatible(src, dst, what="copy on the device")
        return src

    def is_device_array(self, a: Any) -> bool:
        """Whether ``a`` is an ``mx.array``."""
        if not self.is_available:
            return False
        import mlx.core as mx

        return isinstance(a, mx.array)

    def synchronize(self) -> None:
        """Wait for all queued MLX work."""
        mx = self._mx()
        mx.synchronize()

    def create_stream(self) -> Any:
        """A new MLX stream on the default device, usable from any thread.

        In recent MLX a stream from ``mx.new_stream`` exists only in the thread that made
        it, but launches from `ComputeOrchestrator` run in worker
        threads. The stream returned is a ``ThreadLocalStream`` where MLX has one (each
        thread that uses it gets its own queue on the device), else an ordinary stream
        (older MLX, whose streams work in every thread).
        """
        mx = self._mx()
        make = getattr(mx, "new_thread_local_stream", None) or mx.new_stream
        return make(mx.default_device())

    def schedule_inputs(self, args: Sequence[Any]) -> None:
        """Start evaluating the lazy ``mx.array``s among ``args`` in this thread.

        MLX with thread-local streams evaluates an unevaluated array only in the thread
        whose stream recorded it, so an input built lazily on an event loop
        (``mx.arange(n)``, ``a + b``) fails in a worker thread with "There is no
        Stream(...) in current thread". `ComputeOrchestrator`
        calls this on the caller's thread before it hands a launch to a worker:
        ``mx.async_eval`` queues the pending work there without waiting for it, and the
        worker waits for the results instead of evaluating them. Containers (lists,
        tuples, dicts) are searched; other values are ignored.
        """
        mx = self._mx()
        schedule = getattr(mx, "async_eval", None) or mx.eval
        schedule(*args)

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
        """Call ``kernel(*args, **kwargs)`` and evaluate its result with ``mx.eval``.

        MLX schedules the threads itself, so the grid and block sizes are validated and
        recorded only. NumPy arguments are converted to ``mx.array`` first.

        Raises:
            MetalError: the kernel failed while tracing or evaluating and ``on_error`` is
                ``"raise"`` (with ``"return"``, the default, the result carries it).
        """
        check_on_error(on_error)
        try:
            return self._execute(kernel, grid_size, block_size, args, kwargs, stream)
        except MetalError as exc:
            if on_error == "raise":
                raise
            return KernelExecutionResult(
                kernel_name=self._kernel_name(kernel),
                backend=self.backend_type,
                grid_size=normalize_grid(grid_size, "grid_size"),
                block_size=normalize_grid(block_size, "block_size"),
                success=False,
                error=exc,
            )

    def _execute(
        self,
        kernel: Callable[..., Any],
        grid_size: int | Sequence[int],
        block_size: int | Sequence[int],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stream: Any,
    ) -> KernelExecutionResult:
        mx = self._mx()
        grid = normalize_grid(grid_size, "grid_size")
        block = normalize_grid(block_size, "block_size")
        name = self._kernel_name(kernel)
        call_args = [mx.array(a) if isinstance(a, np.ndarray) else a for a in args]
        call_kwargs = {
            k: mx.array(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()
        }
        start = self._now()
        try:
            if stream is not None:
                with mx.stream(stream):
                    output = kernel(*call_args, **call_kwargs)
                    mx.eval(output)
            else:
                output = kernel(*call_args, **call_kwargs)
                mx.eval(output)
        except Exception as exc:
            hint = ""
            if stream is not None and "in current thread" in str(exc):
                hint = (
                    f"; {stream} was made by mx.new_stream() in another thread and MLX runs "
                    "such a stream only in its own thread: use MetalBackend.create_stream() "
                    "(a stream for every thread) or mx.new_thread_local_stream()"
                )
            raise MetalError(
                f"MLX kernel {name!r} failed: {type(exc).__name__}: {exc}{hint}"
            ) from exc
        elapsed = (self._now() - start) * 1e3
        return KernelExecutionResult(
            kernel_name=name,
            backend=self.backend_type,
            grid_size=grid,
            block_size=block,
            execution_time_ms=elapsed,
            output=output,
        )

    def compile_kernel(
        self, func: Callable[..., Any] | str, signature: Any | None = None, **options: Any
    ) -> Any:
        """Compile a Python function over ``mx.array``s with ``mx.compile`` (once, cached).

        Example: ``MetalBackend().compile_kernel(lambda x: x * 2 + 1)``.

        Raises:
            KernelCompilationError: ``func`` is not callable.
        """
        from ..compilation.compiler import get_compiler

        return get_compiler().compile(func, signature=signature, device="metal", **options)

    def get_vector_add_kernel(self) -> Callable[..., Any]:
        """A compiled ``(a, b) -> a + b`` over ``mx.array``s."""
        return self.get_elementwise_kernel("add")

    def get_matrix_multiply_kernel(self) -> Callable[..., Any]:
        """A compiled ``(a, b) -> a @ b`` over ``mx.array``s."""
        mx = self._mx()
        return self.compile_kernel(mx.matmul, name="mlx_matmul")  # type: ignore[no-any-return]

    def get_elementwise_kernel(self, op: str) -> Callable[..., Any]:
        """A compiled elementwise kernel; ``op`` is one of `ELEMENTWISE_OPS`.

        Binary ops take ``(a, b)``, unary ops ``(a,)``.

        Raises:
            InvalidConfigurationError: unknown ``op``.
        """
        from ..exceptions import InvalidConfigurationError

        if op not in ELEMENTWISE_OPS:
            raise InvalidConfigurationError(
                f"unknown elementwise op {op!r}; expected one of {', '.join(ELEMENTWISE_OPS)}"
            )
        mx = self._mx()
        fn: Callable[..., Any]
        if op == "relu":
            fn = _relu
        elif op == "square":
            fn = mx.square
        else:
            fn = getattr(mx, op)
        return self.compile_kernel(fn, name=f"mlx_{op}")  # type: ignore[no-any-return]

    def get_memory_info(self) -> dict[str, int]:
        """MLX's memory figures in bytes: `active_memory` (held by live arrays),
        `peak_memory` (the most active so far) and `cache_memory` (freed, kept for reuse).

        Raises:
            BackendNotAvailableError: MLX is not installed.
        """
        mx = self._mx()
        return {
            "active_memory": int(mx.get_active_memory()),
            "peak_memory": int(mx.get_peak_memory()),
            "cache_memory": int(mx.get_cache_memory()),
        }

    def clear_cache(self) -> None:
        """Release the memory MLX keeps cached for reuse (`cache_memory` drops to 0).

        Raises:
            BackendNotAvailableError: MLX is not installed.
        """
        self._mx().clear_cache()

    def compile_metal_kernel(
        self,
        name: str,
        source: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
    ) -> Any:
        """A custom Metal shader through ``mx.fast.metal_kernel`` (Metal GPUs only).

        Raises:
            BackendNotAvailableError: no Metal GPU (for example MLX's CPU build on Linux).
        """
        self.require_metal_gpu("compile_metal_kernel")
        mx = self._mx()
        return mx.fast.metal_kernel(
            name=name, input_names=list(input_names), output_names=list(output_names), source=source
        )


def _relu(x: Any) -> Any:
    import mlx.core as mx

    return mx.maximum(x, 0)


def elementwise_is_unary(op: str) -> bool:
    """Whether ``op`` takes one argument."""
    return op in _UNARY


# --- module-level helpers older code imports -----------------------------------------------


def get_vector_add_kernel() -> Callable[..., Any]:
    """A compiled `(a, b) -> a + b` over `mx.array`s (`MetalBackend().get_vector_add_kernel()`).

    Raises:
        BackendNotAvailableError: MLX is not installed.
    """
    return MetalBackend().get_vector_add_kernel()


def get_matrix_multiply_kernel() -> Callable[..., Any]:
    """A compiled `(a, b) -> a @ b` over `mx.array`s.

    Raises:
        BackendNotAvailableError: MLX is not installed.
    """
    return MetalBackend().get_matrix_multiply_kernel()


def get_elementwise_kernel(op: str) -> Callable[..., Any]:
    """A compiled elementwise kernel; `op` is one of `ELEMENTWISE_OPS`.

    Raises:
        InvalidConfigurationError: unknown `op`.
        BackendNotAvailableError: MLX is not installed.
    """
    return MetalBackend().get_elementwise_kernel(op)
