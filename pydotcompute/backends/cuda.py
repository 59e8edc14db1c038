"""The CUDA backend: CuPy arrays, kernels from Numba CUDA or CUDA C (NVRTC), streams.

Design. The backend runs in one of three modes, picked by a probe that never raises:

* ``"cupy"`` — a GPU is visible to the CuPy runtime. Device arrays are ``cupy.ndarray``;
  Numba kernels take them through ``__cuda_array_interface__`` and run on CuPy streams
  (wrapped with ``numba.cuda.external_stream``); CUDA C kernels are ``cupy.RawKernel``s
  loaded from PTX that the ``KernelCompiler`` produced with NVRTC and cached on disk.
* ``"numba"`` — a GPU is visible to Numba but CuPy is missing: device arrays are Numba
  ``DeviceNDArray``s. CUDA C kernels need CuPy and raise ``BackendNotAvailableError``.
* ``"simulator"`` — ``NUMBA_ENABLE_CUDASIM=1``: the Numba CUDA simulator stands in for the
  GPU, so CI exercises the same allocation, copy, stream and launch logic without hardware.

Rejected: making CuPy mandatory (the simulator would then be unusable) and hiding the mode
(tests and ``show_config`` need to know which path ran, so ``mode`` is public).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..exceptions import BackendNotAvailableError, CUDAError, KernelCompilationError
from ._cuda_probe import cuda_simulator_enabled as cuda_simulator_enabled
from ._cuda_probe import numba_cuda as numba_cuda
from .base import (
    Backend,
    BackendType,
    DTypeLike,
    KernelExecutionResult,
    Shape,
    as_shape,
    check_copy_compatible,
    check_on_error,
    error_text,
    normalize_grid,
    numpy_dtype_of,
)
from .device_sync import refuse_device_sync

__all__ = ("CUDABackend", "cuda_simulator_enabled", "numba_cuda")


def _launch_1d(n: int, block: int = 256) -> tuple[int, int]:
    return max(1, (n + block - 1) // block), block


class CUDABackend(Backend):
    """NVIDIA GPUs through CuPy and Numba CUDA (or the Numba CUDA simulator).

    Constructing it never raises; check ``is_available`` or call ``require()``.

    Args:
        device_id: the CUDA device index.
    """

    backend_type = BackendType.CUDA
    extra = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        super().__init__(device_id)
        self._mode: str | None = None
        self._count = 0

    # --- probing ---------------------------------------------------------------------------

    def _probe(self) -> str | None:
        if cuda_simulator_enabled():
            cuda = numba_cuda()

            self._count = len(cuda.gpus)
            if self.device_id >= self._count:
                return f"the CUDA simulator has {self._count} device(s), asked for {self.device_id}"
            self._mode = "simulator"
            return None
        reason: str
        try:
            import cupy
        except Exception as exc:
            reason = f"CuPy is not installed ({type(exc).__name__}: {exc})"
        else:
            try:
                count = int(cupy.cuda.runtime.getDeviceCount())
            except Exception as exc:
                reason = f"CuPy found no usable CUDA GPU ({exc})"
            else:
                self._count = count
                if self.device_id < count:
                    self._mode = "cupy"
                    return None
                reason = f"asked for CUDA device {self.device_id} but {count} device(s) exist"
        try:
            nb_cuda = numba_cuda()

            if nb_cuda.is_available() and self.device_id < len(nb_cuda.gpus):
                self._count = len(nb_cuda.gpus)
                self._mode = "numba"
                return None
        except Exception:
            pass
        return reason

    @property
    def mode(self) -> str | None:
        """``"cupy"``, ``"numba"``, ``"simulator"``, or ``None`` when unavailable."""
        self._ensure_probed()
        return self._mode

    @property
    def is_simulated(self) -> bool:
        """Whether kernels run on the Numba CUDA simulator instead of a GPU."""
        return self.mode == "simulator"

    @property
    def device_count(self) -> int:
        """Number of CUDA devices (simulated ones included); 0 when unavailable."""
        return self._count if self.is_available else 0

    def _cupy(self) -> Any:
        self.require()
        if self._mode != "cupy":
            raise BackendNotAvailableError(
                f"this operation needs CuPy with a CUDA GPU, but the CUDA backend runs in "
                f'{self._mode!r} mode; install it with pip install "pydotcompute[cuda]"'
            )
        import cupy

        return cupy

    def _device_ctx(self) -> Any:
        """A context manager selecting this backend's device (CuPy mode) or a no-op."""
        import contextlib

        if self._mode == "cupy":
            import cupy

            return cupy.cuda.Device(self.device_id)
        return contextlib.nullcontext()

    # --- memory ----------------------------------------------------------------------------

    def allocate(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> Any:
        """A zero-filled device array (``cupy.ndarray`` or a Numba device array)."""
        self.require()
        dims = as_shape(shape)
        if self._mode == "cupy":
            import cupy

            with self._device_ctx():
                return cupy.zeros(dims, dtype=dtype)
        cuda = numba_cuda()

        return cuda.to_device(np.zeros(dims, dtype=dtype))

    def empty(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> Any:
        """An uninitialised device array."""
        self.require()
        dims = as_shape(shape)
        if self._mode == "cupy":
            import cupy

            with self._device_ctx():
                return cupy.empty(dims, dtype=dtype)
        cuda = numba_cuda()

        return cuda.device_array(dims, dtype=dtype)

    def pinned_empty(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> Any:
        """A page-locked NumPy array: host memory the GPU copies to and from at full speed."""
        self.require()
        dims = as_shape(shape)
        if self._mode == "cupy":
            import cupyx

            return cupyx.empty_pinned(dims, dtype=dtype)
        cuda = numba_cuda()

        return cuda.pinned_array(dims, dtype=dtype)

    def free(self, a: Any) -> None:
        """Drop a device array; CuPy returns its memory to the memory pool when unreferenced."""
        del a

    def is_device_array(self, a: Any) -> bool:
        """Whether ``a`` is a CuPy array or a Numba (or simulator) device array."""
        if isinstance(a, np.ndarray):
            return False
        if self._mode == "cupy":
            import cupy

            return isinstance(a, cupy.ndarray)
        return hasattr(a, "copy_to_host") and hasattr(a, "copy_to_device")

    def copy_to_device(self, a: Any, *, out: Any | None = None, stream: Any | None = None) -> Any:
        """Copy a host array to the device (into ``out`` when given; shapes/dtypes checked).

        With a pinned host array and a stream the copy is asynchronous; call
        ``stream.synchronize()`` before reusing the host memory.
        """
        self.require()
        src = np.ascontiguousarray(a)
        if out is not None:
            check_copy_compatible(src, out, what="copy to device")
        try:
            if self._mode == "cupy":
                import cupy

                with self._device_ctx():
                    if out is None:
                        out = cupy.empty(src.shape, dtype=src.dtype)
                    out.set(src, stream=stream)
                    return out
            cuda = numba_cuda()

            if out is None:
                return cuda.to_device(src, stream=stream or 0)
            out.copy_to_device(src, stream=stream or 0)
            return out
        except Exception as exc:
            raise self._wrap(exc, "copy to device") from exc

    def copy_to_host(
        self, a: Any, *, out: np.ndarray[Any, Any] | None = None, stream: Any | None = None
    ) -> np.ndarray[Any, Any]:
        """Copy a device array to the host (into ``out`` when given; shapes/dtypes checked)."""
        self.require()
        if isinstance(a, np.ndarray):  # already on the host
            if out is None:
                return a.copy()
            check_copy_compatible(a, out, what="copy to host")
            np.copyto(out, a)
            return out
        if out is not None:
            check_copy_compatible(a, out, what="copy to host")
        try:
            if self._mode == "cupy":
                with self._device_ctx():
                    return a.get(stream=stream, out=out)  # type: ignore[no-any-return]
            if out is None:
                return a.copy_to_host(stream=stream or 0)  # type: ignore[no-any-return]
            a.copy_to_host(out, stream=stream or 0)
            return out
        except Exception as exc:
            raise self._wrap(exc, "copy to host") from exc

    def copy_device_to_device(self, src: Any, dst: Any) -> Any:
        """Copy device array ``src`` into ``dst`` on the device (checked)."""
        self.require()
        check_copy_compatible(src, dst, what="copy on the device")
        if self._mode == "cupy":
            with self._device_ctx():
                dst[...] = src
            return dst
        dst.copy_to_device(src)
        return dst

    def fill(self, a: Any, value: Any) -> Any:
        """Set every element of device array ``a`` to ``value``."""
        self.require()
        if self._mode == "cupy":
            with self._device_ctx():
                a.fill(value)
            return a
        a.copy_to_device(np.full(a.shape, value, dtype=numpy_dtype_of(a)))
        return a

    def to_numpy(self, a: Any) -> np.ndarray[Any, Any]:
        """A host copy of ``a`` (device array or anything NumPy accepts)."""
        if isinstance(a, np.ndarray):
            return a
        return self.copy_to_host(a)

    def get_memory_info(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of the device; ``(0, 0)`` when the simulator is on."""
        self.require()
        if self._mode == "cupy":
            import cupy

            with self._device_ctx():
                free, total = cupy.cuda.runtime.memGetInfo()
            return int(free), int(total)
        if self._mode == "simulator":
            return 0, 0
        cuda = numba_cuda()

        info = cuda.current_context().get_memory_info()
        return int(info.free), int(info.total)

    # --- streams and synchronisation ----------------------------------------------------------

    def create_stream(self) -> Any:
        """A new non-blocking stream (``cupy.cuda.Stream`` or a Numba stream)."""
        self.require()
        if self._mode == "cupy":
            import cupy

            with self._device_ctx():
                return cupy.cuda.Stream(non_blocking=True)
        cuda = numba_cuda()

        return cuda.stream()

    def synchronize(self) -> None:
        """Wait for all work on this device.

        Raises:
            CUDAError: persistent GPU ring kernels are running (the wait would never end:
                they stop only when told to); use `synchronize_stream` instead.
        """
        refuse_device_sync(
            "CUDABackend.synchronize()",
            "Wait for your own work with backend.synchronize_stream(stream) or an event",
        )
        self.require()
        try:
            if self._mode == "cupy":
                import cupy

                cupy.cuda.Device(self.device_id).synchronize()
                return
            cuda = numba_cuda()

            cuda.synchronize()
        except Exception as exc:
            raise self._wrap(exc, "synchronize") from exc

    def synchronize_stream(self, stream: Any = None) -> None:
        """Wait for the work queued on ``stream`` (the current stream when ``None``).

        Never waits for a persistent ring kernel: those run on non-blocking streams, which
        the legacy default stream does not wait for.
        """
        self.require()
        try:
            if stream is not None and hasattr(stream, "synchronize"):
                stream.synchronize()
            elif self._mode == "cupy":
                import cupy

                with self._device_ctx():
                    cupy.cuda.get_current_stream().synchronize()
            else:
                _default_stream_sync()
        except Exception as exc:
            raise self._wrap(exc, "synchronize a stream") from exc

    def _numba_stream(self, stream: Any | None) -> Any:
        """The stream in the form a Numba launch accepts (0 is the default stream)."""
        if stream is None:
            if self._mode == "cupy":
                import cupy

                ptr = cupy.cuda.get_current_stream().ptr
                if ptr:
                    cuda = numba_cuda()

                    return cuda.external_stream(ptr)
            return 0
        if self._mode == "cupy" and hasattr(stream, "ptr"):
            cuda = numba_cuda()

            return cuda.external_stream(stream.ptr) if stream.ptr else 0
        return stream

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
        """Launch ``kernel`` on ``grid_size`` blocks of ``block_size`` threads and wait for it.

        ``kernel`` may be a Numba CUDA kernel, a ``cupy.RawKernel``, a ``CompiledKernel``
        wrapping either, or any other callable (called as ``kernel(*args)``, e.g. a CuPy
        elementwise function). The time is measured with CUDA events on the launch stream.
        A failure is returned in a result with ``success=False`` (``on_error="return"``,
        the default, as in PyDotCompute 0.2) or raised (``on_error="raise"``).

        Raises:
            InvalidConfigurationError: keyword arguments for the kernel (device kernels
                take positional arguments only).
            KernelCompilationError: Numba cannot compile the kernel for these arguments.
            CUDAError: the launch or the kernel failed on the device.
        """
        check_on_error(on_error)
        if kwargs:
            from ..exceptions import InvalidConfigurationError

            raise InvalidConfigurationError(
                f"CUDA kernels take positional arguments only, got keyword arguments "
                f"{sorted(kwargs)}; pass them in the kernel's parameter order"
            )
        self.require()
        try:
            return self._execute(kernel, grid_size, block_size, args, stream, shared_mem)
        except (CUDAError, KernelCompilationError) as exc:
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
        stream: Any,
        shared_mem: int,
    ) -> KernelExecutionResult:
        grid = normalize_grid(grid_size, "grid_size")
        block = normalize_grid(block_size, "block_size")
        name = self._kernel_name(kernel)
        fn = getattr(kernel, "kernel", kernel)
        try:
            with self._device_ctx():
                if self._mode == "cupy":
                    elapsed, output = self._run_cupy(fn, grid, block, args, stream, shared_mem)
                else:
                    start = self._now()
                    output = self._launch(fn, grid, block, args, stream, shared_mem)
                    # the launch stream only: a device-wide wait would wait for every
                    # persistent ring kernel too
                    if stream is not None and hasattr(stream, "synchronize"):
                        stream.synchronize()
                    else:
                        _default_stream_sync()
                    elapsed = (self._now() - start) * 1e3
        except (KernelCompilationError, BackendNotAvailableError):
            raise
        except Exception as exc:
            raise self._wrap(exc, f"run kernel {name!r}") from exc
        return KernelExecutionResult(
            kernel_name=name,
            backend=self.backend_type,
            grid_size=grid,
            block_size=block,
            execution_time_ms=elapsed,
            output=output,
        )

    def _run_cupy(
        self,
        fn: Any,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: tuple[Any, ...],
        stream: Any | None,
        shared_mem: int,
    ) -> tuple[float, Any]:
        import cupy

        launch_stream = stream if stream is not None else cupy.cuda.get_current_stream()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        with launch_stream:
            start.record(launch_stream)
            output = self._launch(fn, grid, block, args, launch_stream, shared_mem)
            end.record(launch_stream)
        end.synchronize()
        return float(cupy.cuda.get_elapsed_time(start, end)), output

    def _launch(
        self,
        fn: Any,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: tuple[Any, ...],
        stream: Any | None,
        shared_mem: int = 0,
    ) -> Any:
        if self._mode == "cupy":
            import cupy

            if isinstance(fn, cupy.RawKernel):
                fn(grid, block, args, shared_mem=shared_mem)
                return None
        if hasattr(fn, "py_func") and hasattr(fn, "__getitem__"):  # a Numba CUDA kernel
            try:
                fn[grid, block, self._numba_stream(stream), shared_mem](*args)
            except Exception as exc:
                if _is_numba_typing_error(exc):
                    raise KernelCompilationError(
                        f"Numba could not compile CUDA kernel {self._kernel_name(fn)!r} for "
                        f"arguments ({', '.join(type(a).__name__ for a in args)}): "
                        f"{error_text(exc)}"
                    ) from exc
                raise
            return None
        return fn(*args)

    def compile_kernel(
        self, func: Callable[..., Any] | str, signature: Any | None = None, **options: Any
    ) -> Any:
        """Compile a Python function (Numba CUDA) or CUDA C source (NVRTC) once, cached.

        For CUDA C pass the entry point as ``name=``. Goes through the shared
        ``KernelCompiler``, which also persists PTX of CUDA C kernels on disk.

        Raises:
            KernelCompilationError: the compiler rejected the kernel (its log is included).
        """
        from ..compilation.compiler import get_compiler

        return get_compiler().compile(func, signature=signature, device="cuda", **options)

    def load_ptx(self, ptx: str, name: str) -> Any:
        """Load PTX (as the ``KernelCompiler`` made it) and return kernel ``name``.

        The module is loaded on CuPy's current device, where the kernel will be launched.

        Raises:
            BackendNotAvailableError: CuPy or a GPU is missing (the simulator cannot run PTX).
            KernelCompilationError: CuPy rejected the PTX (its message is included).
        """
        cupy = self._cupy()
        try:
            return cupy.RawModule(code=ptx).get_function(name)
        except Exception as exc:
            raise KernelCompilationError(
                f"CuPy could not load PTX of CUDA C kernel {name!r}: {error_text(exc)}"
            ) from exc

    def get_vector_add_kernel(self) -> Callable[..., Any]:
        """A Numba CUDA kernel ``(a, b, out)`` over 1-D arrays; launch one thread per element."""
        self.require()
        from ._cuda_kernels import numba_kernels

        return numba_kernels()["vector_add"]  # type: ignore[no-any-return]

    def get_matrix_multiply_kernel(self) -> Callable[..., Any]:
        """A shared-memory tiled float32 ``(a, b, out)`` kernel; blocks of 16 x 16 threads."""
        self.require()
        from ._cuda_kernels import numba_kernels

        return numba_kernels()["matmul_f32"]  # type: ignore[no-any-return]

    def get_raw_vector_add_kernel(self) -> Any:
        """The CUDA C vector add (NVRTC, PTX cached on disk); launch with ``(a, b, out, n)``.

        Raises:
            BackendNotAvailableError: CuPy (needed to load CUDA C) or a GPU is missing.
        """
        self._cupy()
        from ._cuda_kernels import VECTOR_ADD_CU, VECTOR_ADD_CU_NAME

        return self.compile_kernel(VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME)

    # --- conveniences ----------------------------------------------------------------------

    def vector_add(self, a: Any, b: Any, out: Any | None = None, *, stream: Any = None) -> Any:
        """``out = a + b`` on the device with the shipped kernel; returns the device array."""
        if out is None:
            out = self.empty(tuple(a.shape), numpy_dtype_of(a) or np.float32)
        grid, block = _launch_1d(int(np.prod(a.shape)))
        self.execute_kernel(
            self.get_vector_add_kernel(), grid, block, a, b, out, stream=stream, on_error="raise"
        )
        return out

    def matmul(self, a: Any, b: Any, out: Any | None = None, *, stream: Any = None) -> Any:
        """``out = a @ b`` for float32 matrices with the shipped tiled kernel."""
        if a.shape[1] != b.shape[0]:
            from ..exceptions import BufferMismatchError

            raise BufferMismatchError(
                f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)}: inner dimensions differ"
            )
        kernel = self.get_matrix_multiply_kernel()
        from ._cuda_kernel_defs import MATMUL_TILE as tile

        if out is None:
            out = self.empty((a.shape[0], b.shape[1]), np.float32)
        grid = ((a.shape[0] + tile - 1) // tile, (b.shape[1] + tile - 1) // tile)
        self.execute_kernel(kernel, grid, (tile, tile), a, b, out, stream=stream, on_error="raise")
        return out

    def _wrap(self, exc: BaseException, what: str) -> Exception:
        if isinstance(exc, (CUDAError, KernelCompilationError, BackendNotAvailableError)):
            return exc
        from ..exceptions import BufferMismatchError

        if isinstance(exc, BufferMismatchError):
            return exc
        return CUDAError(
            f"CUDA {what} failed on {self.name}: {type(exc).__name__}: {error_text(exc)}"
        )


def _default_stream_sync() -> None:
    """Wait for Numba's default stream (the simulator has none: its launches are synchronous)."""
    cuda = numba_cuda()
    default = getattr(cuda, "default_stream", None)
    if default is None:
        cuda.synchronize()
    else:
        default().synchronize()


def _is_numba_typing_error(exc: BaseException) -> bool:
    numba_errors = sys.modules.get("numba.core.errors")
    if numba_errors is None:
        return False
    return isinstance(exc, (numba_errors.TypingError, numba_errors.LoweringError))


# --- module-level helpers older code imports -----------------------------------------------


def get_vector_add_kernel() -> Callable[..., Any]:
    """The shipped Numba CUDA vector add `(a, b, out)` of the default device.

    Raises:
        BackendNotAvailableError: no usable CUDA device (the message says what is missing).
    """
    return CUDABackend().get_vector_add_kernel()


def get_matrix_multiply_kernel() -> Callable[..., Any]:
    """The shipped tiled float32 matrix multiply `(a, b, out)` of the default device.

    Raises:
        BackendNotAvailableError: no usable CUDA device (the message says what is missing).
    """
    return CUDABackend().get_matrix_multiply_kernel()
