"""RecordingBackend: a CPU-only ``Backend`` that writes down every allocation and transfer.

Code that moves data between host and device (buffers, pools, orchestrators, actors that
own device state) is tested for *what it moves*: one host-to-device copy after a host
write, none when nothing changed, a synchronize before reading back. This backend behaves
like the CPU backend (device arrays are separate NumPy copies, never aliases of the host
array) and records each call as an `BackendCall`, so a test can assert on
counts, directions and byte totals without a GPU. ``available=False`` makes it behave like
a backend whose library is missing, and `RecordingBackend.fail_next` injects an error
into the next call of one operation.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.base import (
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

__all__ = ("BackendCall", "RecordingBackend")

#: The operations that move bytes, by direction.
TRANSFERS = ("copy_to_device", "copy_to_host", "copy_device_to_device")


@dataclass(frozen=True, slots=True)
class BackendCall:
    """One recorded backend operation.

    Attributes:
        op: The method name (``allocate``, ``copy_to_device``, ``synchronize``, ...).
        nbytes: Bytes allocated, freed, filled or copied (0 for others).
        shape, dtype: Of the array involved, when there is one.
        detail: The kernel name for ``execute_kernel`` / ``compile_kernel``, else ``""``.
    """

    op: str
    nbytes: int = 0
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    detail: str = ""


def _describe(a: Any) -> tuple[int, tuple[int, ...] | None, str | None]:
    arr = np.asarray(a) if not hasattr(a, "nbytes") else a
    shape = tuple(int(d) for d in arr.shape) if hasattr(arr, "shape") else None
    dtype = str(arr.dtype) if hasattr(arr, "dtype") else None
    return int(getattr(arr, "nbytes", 0)), shape, dtype


class RecordingBackend(Backend):
    """A fake device backed by NumPy that records every call (see the module docstring).

    Args:
        available: False to behave like a backend whose library or device is missing:
            ``is_available`` is False and every operation raises
            ``BackendNotAvailableError``.
        reason: The unavailability reason reported when ``available`` is False.
        device_count: What ``device_count`` reports when available.
    """

    backend_type = BackendType.CPU
    extra = None

    def __init__(
        self,
        *,
        available: bool = True,
        reason: str = "disabled by the test (RecordingBackend(available=False))",
        device_count: int = 1,
    ) -> None:
        super().__init__(0)
        self._fake_available = available
        self._fake_reason = reason
        self._device_count = device_count
        self.calls: list[BackendCall] = []
        self._device_arrays: dict[int, weakref.ref[np.ndarray[Any, Any]]] = {}
        self._failures: dict[str, BaseException] = {}

    # -- recording ---------------------------------------------------------------------------

    def _record(self, op: str, a: Any = None, detail: str = "") -> None:
        failure = self._failures.pop(op, None)
        if failure is not None:
            raise failure
        if a is None:
            self.calls.append(BackendCall(op, detail=detail))
        else:
            nbytes, shape, dtype = _describe(a)
            self.calls.append(BackendCall(op, nbytes, shape, dtype, detail))

    def _track(self, a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        key = id(a)
        arrays = self._device_arrays

        def forget(_ref: object) -> None:
            arrays.pop(key, None)

        arrays[key] = weakref.ref(a, forget)
        return a

    def fail_next(self, op: str, error: BaseException) -> None:
        """Make the next call of ``op`` (a method name) raise ``error`` instead of running."""
        self._failures[op] = error

    def reset(self) -> None:
        """Forget every recorded call (allocated arrays stay valid)."""
        self.calls.clear()

    def calls_of(self, op: str) -> list[BackendCall]:
        """The recorded calls of one operation, in order."""
        return [c for c in self.calls if c.op == op]

    def count(self, op: str) -> int:
        """How many times ``op`` was called."""
        return sum(1 for c in self.calls if c.op == op)

    @property
    def transfers(self) -> list[BackendCall]:
        """Every copy, in order (host->device, device->host, device->device)."""
        return [c for c in self.calls if c.op in TRANSFERS]

    @property
    def host_to_device(self) -> int:
        """Number of host-to-device copies."""
        return self.count("copy_to_device")

    @property
    def device_to_host(self) -> int:
        """Number of device-to-host copies."""
        return self.count("copy_to_host")

    @property
    def bytes_to_device(self) -> int:
        return sum(c.nbytes for c in self.calls_of("copy_to_device"))

    @property
    def bytes_to_host(self) -> int:
        return sum(c.nbytes for c in self.calls_of("copy_to_host"))

    @property
    def live_device_arrays(self) -> int:
        """Device arrays this backend handed out that are still referenced somewhere."""
        return sum(1 for ref in self._device_arrays.values() if ref() is not None)

    def assert_transfers(self, *, to_device: int | None = None, to_host: int | None = None) -> None:
        """Fail unless exactly this many copies happened in each direction given.

        Raises:
            AssertionError: listing the copies that were recorded.
        """
        wrong = []
        if to_device is not None and self.host_to_device != to_device:
            wrong.append(f"{self.host_to_device} host->device (expected {to_device})")
        if to_host is not None and self.device_to_host != to_host:
            wrong.append(f"{self.device_to_host} device->host (expected {to_host})")
        if wrong:
            seen = ", ".join(f"{c.op}({c.shape}, {c.dtype}, {c.nbytes} B)" for c in self.transfers)
            raise AssertionError(f"{' and '.join(wrong)}; recorded: [{seen}]")

    # -- Backend interface -------------------------------------------------------------------

    def _probe(self) -> str | None:
        return None if self._fake_available else self._fake_reason

    @property
    def device_count(self) -> int:
        return self._device_count if self.is_available else 0

    def allocate(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> np.ndarray[Any, Any]:
        self.require()
        arr = np.zeros(as_shape(shape), dtype=dtype)
        self._record("allocate", arr)
        return self._track(arr)

    def empty(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> np.ndarray[Any, Any]:
        self.require()
        arr = np.empty(as_shape(shape), dtype=dtype)
        self._record("empty", arr)
        return self._track(arr)

    def free(self, a: Any) -> None:
        self._record("free", a)
        self._device_arrays.pop(id(a), None)

    def copy_to_device(self, a: Any, *, out: Any | None = None, stream: Any | None = None) -> Any:
        self.require()
        src = np.asarray(a)
        if out is not None:
            check_copy_compatible(src, out, what="copy to device")
        self._record("copy_to_device", src)
        if out is None:
            return self._track(np.array(src, copy=True, order="C"))
        np.copyto(out, src)
        return out

    def copy_to_host(
        self, a: Any, *, out: np.ndarray[Any, Any] | None = None, stream: Any | None = None
    ) -> np.ndarray[Any, Any]:
        self.require()
        src = np.asarray(a)
        if out is not None:
            check_copy_compatible(src, out, what="copy to host")
        self._record("copy_to_host", src)
        if out is None:
            return np.array(src, copy=True, order="C")
        np.copyto(out, src)
        return out

    def copy_device_to_device(self, src: Any, dst: Any) -> Any:
        self.require()
        check_copy_compatible(src, dst, what="copy on the device")
        self._record("copy_device_to_device", src)
        dst[...] = src
        return dst

    def fill(self, a: Any, value: Any) -> Any:
        self.require()
        self._record("fill", a)
        a[...] = value
        return a

    def is_device_array(self, a: Any) -> bool:
        ref = self._device_arrays.get(id(a))
        return ref is not None and ref() is a

    def synchronize(self) -> None:
        self.require()
        self._record("synchronize")

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
        """Call ``kernel(*args, **kwargs)`` once (like the CPU backend) and record the launch.

        ``stream`` and ``shared_mem`` are accepted for signature parity and ignored; a
        failing kernel gives a result with ``success=False`` unless ``on_error="raise"``.
        """
        check_on_error(on_error)
        self.require()
        grid = normalize_grid(grid_size, "grid_size")
        block = normalize_grid(block_size, "block_size")
        name = self._kernel_name(kernel)
        self._record("execute_kernel", detail=name)
        start = self._now()
        try:
            output = kernel(*args, **kwargs)
        except Exception as exc:
            if on_error == "raise":
                raise
            return KernelExecutionResult(
                kernel_name=name,
                backend=self.backend_type,
                grid_size=grid,
                block_size=block,
                execution_time_ms=(self._now() - start) * 1e3,
                success=False,
                error=exc,
            )
        return KernelExecutionResult(
            kernel_name=name,
            backend=self.backend_type,
            grid_size=grid,
            block_size=block,
            execution_time_ms=(self._now() - start) * 1e3,
            output=output,
        )

    def compile_kernel(
        self, func: Callable[..., Any] | str, signature: Any | None = None, **options: Any
    ) -> Any:
        """Record the request and return ``func`` unchanged (nothing is compiled)."""
        self.require()
        self._record("compile_kernel", detail=self._kernel_name(func))
        return func

    def get_vector_add_kernel(self) -> Callable[..., Any]:
        def vector_add(a: Any, b: Any, out: Any) -> None:
            np.add(a, b, out=out)

        return vector_add

    def get_matrix_multiply_kernel(self) -> Callable[..., Any]:
        def matrix_multiply(a: Any, b: Any, out: Any) -> None:
            np.matmul(a, b, out=out)

        return matrix_multiply
