"""UnifiedBuffer: one array with a host side and a device side, copied only when needed.

State machine (``H`` = host copy, ``D`` = device copy; "dirty" = written since the other side
last matched it):

```text
                  allocate(host, device)
UNINITIALIZED ──────────────────────────────┬──────────────┬──────────────┐
      ▲                                     ▼              ▼              ▼
      │ free()                          HOST_ONLY     SYNCHRONIZED    DEVICE_ONLY
      │                                   │ read D       ▲   │           │ read H
      │                                   └──copy H→D───►│   │◄──copy D→H┘
      │                                                  │   │
      │              read D / ensure_on_device: copy H→D │   │ mark_host_dirty()
      │                                   HOST_DIRTY ────┘   ├──────────────► HOST_DIRTY
      │              read H / ensure_on_host: copy D→H       │ mark_device_dirty()
      └─ (from any state)                 DEVICE_DIRTY ──────┴──────────────► DEVICE_DIRTY
```

Reading the side that is current never copies; reading the stale side copies once and moves
to ``SYNCHRONIZED``. Marking one side dirty while the other is dirty means both were written
since they last matched and one side's writes are lost: as in PyDotCompute 0.2 the last mark
wins, with a ``RuntimeWarning``; ``strict_sync=True`` raises ``BufferSyncError`` instead.
Transfer counters (``transfer_stats``) record every copy, so tests can prove that no
redundant copy happens.

The device side comes from a ``Backend``: CuPy arrays on CUDA (Numba device arrays under the
CUDA simulator), ``mx.array`` on Metal. On the CPU the device side *is* the host array (as in
0.2: a write on either side is seen on the other, marks or not, and nothing is copied);
``device_copy=True`` keeps a second NumPy array instead, so code written for a discrete GPU
can be exercised on the CPU with real, counted copies. ``.metal`` is an extra MLX mirror of
the host side when the device is not Metal.

Async ``ensure_on_device``/``ensure_on_host`` copy in a worker thread (``asyncio.to_thread``)
from `ASYNC_COPY_THRESHOLD` bytes up, so a large copy does not stall the event loop;
smaller copies run inline because a thread hop costs more than the copy. A re-entrant lock
guards the state, so a copy in a worker thread and a read on the loop thread never interleave.
"""

from __future__ import annotations

import asyncio
import enum
import math
import threading
import types
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..backends.base import BackendType, as_shape, check_copy_compatible
from ..backends.device_sync import ring_kernels_running
from ..exceptions import (
    BufferMismatchError,
    BufferNotAllocatedError,
    BufferSyncError,
    InvalidConfigurationError,
)

if TYPE_CHECKING:
    from types import TracebackType

    from ..backends.base import Backend
    from .memory_pool import MemoryPool

__all__ = ("ASYNC_COPY_THRESHOLD", "BufferState", "TransferStats", "UnifiedBuffer")

#: Copies of at least this many bytes run in a worker thread in the async ``ensure_*`` methods.
#: A hop to the thread and back costs about 80 us on the 2-core reference machine, what a
#: 2-4 MiB host copy takes; below this size the copy stalls the loop less than the hop costs.
ASYNC_COPY_THRESHOLD = 4 << 20


class BufferState(enum.Enum):
    """Where a ``UnifiedBuffer``'s current data lives (see the module's state diagram)."""

    UNINITIALIZED = "uninitialized"
    HOST_ONLY = "host_only"
    DEVICE_ONLY = "device_only"
    SYNCHRONIZED = "synchronized"
    HOST_DIRTY = "host_dirty"
    DEVICE_DIRTY = "device_dirty"


# states are compared by identity on the hot paths: ``state in {...}`` hashes an Enum member,
# which runs Enum.__hash__ in Python
_SYNC = BufferState.SYNCHRONIZED
_H_ONLY, _H_DIRTY = BufferState.HOST_ONLY, BufferState.HOST_DIRTY
_D_ONLY, _D_DIRTY = BufferState.DEVICE_ONLY, BufferState.DEVICE_DIRTY


@dataclass(frozen=True, slots=True)
class TransferStats:
    """Copies a buffer has made since it was created (or since ``reset_transfer_stats``)."""

    host_to_device: int = 0
    device_to_host: int = 0
    bytes_host_to_device: int = 0
    bytes_device_to_host: int = 0
    host_to_metal: int = 0
    metal_to_host: int = 0

    @property
    def total_transfers(self) -> int:
        """All copies in either direction, Metal mirror included."""
        return self.host_to_device + self.device_to_host + self.host_to_metal + self.metal_to_host


def _resolve_backend(backend: Backend | BackendType | str | None) -> Backend:
    from ..backends import get_backend
    from ..backends.base import Backend

    if isinstance(backend, Backend):
        return backend
    if backend is None:
        from .accelerator import get_accelerator

        return get_accelerator().get_backend()  # type: ignore[no-any-return]
    return get_backend(backend)


class UnifiedBuffer:
    """An array with lazily synchronised host (NumPy) and device copies.

    Args:
        shape: the array shape (an int for 1-D).
        dtype: a NumPy dtype; object dtypes are rejected.
        pinned: allocate the host side in page-locked memory on CUDA (faster, asynchronous
            copies); ignored on other backends.
        backend: the device backend (a ``Backend``, ``"cpu"``, ``"cuda"``, ``"metal"``) or
            ``None`` for the accelerator's choice.
        pool: take memory from this ``MemoryPool`` and return it on ``free()``.
        device_copy: on the CPU backend, keep a separate device array (copied on demand, as
            on a GPU) instead of sharing the host array.
        strict_sync: raise ``BufferSyncError`` when both sides are marked dirty (one
            side's writes would be lost) instead of warning and keeping the last mark.

    Raises:
        InvalidConfigurationError: a bad shape or dtype.

    Example:
        >>> buf = UnifiedBuffer((4,), dtype=np.float32, backend="cpu").allocate()
        >>> buf.host[:] = 1.0
        >>> buf.mark_host_dirty()
        >>> float(buf.device.sum())  # copies host -> device once
        4.0
    """

    def __init__(
        self,
        shape: int | Sequence[int],
        dtype: npt.DTypeLike = np.float32,
        *,
        pinned: bool = False,
        backend: Backend | BackendType | str | None = None,
        pool: MemoryPool | None = None,
        device_copy: bool = False,
        strict_sync: bool = False,
    ) -> None:
        self._shape = as_shape(shape)
        try:
            self._dtype = np.dtype(dtype)
        except TypeError as exc:
            raise InvalidConfigurationError(
                f"dtype {dtype!r} is not a NumPy dtype: {exc}"
            ) from None
        if self._dtype.hasobject:
            raise InvalidConfigurationError(
                f"UnifiedBuffer holds plain numeric data; dtype {self._dtype} contains Python "
                "objects, which cannot live on a device"
            )
        self._size = math.prod(self._shape)
        self._nbytes = self._size * self._dtype.itemsize
        self._kind: BackendType | None = None
        self._cpu_copy: bool | None = None  # see _plain_cpu
        self._requested_pinned = bool(pinned)
        self._pinned = False
        self._backend_spec = backend
        self._backend: Backend | None = None
        self._pool = pool
        self._device_copy = bool(device_copy)
        self.strict_sync = bool(strict_sync)
        self._host: np.ndarray[Any, Any] | None = None
        self._device: Any = None
        self._metal: Any = None
        self._metal_valid = False
        self._state = BufferState.UNINITIALIZED
        self._freed = False
        self._lock = threading.RLock()
        self._h2d = self._d2h = self._h2m = self._m2h = 0
        self._bytes_h2d = self._bytes_d2h = 0

    # ``UnifiedBuffer[np.float32]`` works at runtime, as it did for 0.2's Generic class.
    def __class_getitem__(cls, item: Any) -> types.GenericAlias:
        return types.GenericAlias(cls, item)

    # --- properties ------------------------------------------------------------------------

    @property
    def shares_memory(self) -> bool:
        """Whether host and device are one array (the CPU backend without ``device_copy``)."""
        return not self._device_copy and self._plain_cpu()

    @property
    def shape(self) -> tuple[int, ...]:
        """The array shape."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The NumPy dtype."""
        return self._dtype

    @property
    def size(self) -> int:
        """Number of elements."""
        return self._size

    @property
    def nbytes(self) -> int:
        """Size in bytes of one side."""
        return self._nbytes

    @property
    def state(self) -> BufferState:
        """The current ``BufferState``."""
        return self._state

    @property
    def is_allocated(self) -> bool:
        """Whether any side is allocated (``False`` before ``allocate()`` and after ``free()``)."""
        return self._state is not BufferState.UNINITIALIZED

    @property
    def pinned(self) -> bool:
        """Whether the host side is page-locked memory (only ever on CUDA)."""
        return self._pinned

    @property
    def backend(self) -> Backend:
        """The device backend (resolved on first use)."""
        if self._backend is None:
            self._backend = _resolve_backend(self._backend_spec)
        return self._backend

    @property
    def transfer_stats(self) -> TransferStats:
        """Copies made so far."""
        return TransferStats(
            host_to_device=self._h2d,
            device_to_host=self._d2h,
            bytes_host_to_device=self._bytes_h2d,
            bytes_device_to_host=self._bytes_d2h,
            host_to_metal=self._h2m,
            metal_to_host=self._m2h,
        )

    def reset_transfer_stats(self) -> None:
        """Zero the transfer counters."""
        with self._lock:
            self._h2d = self._d2h = self._h2m = self._m2h = 0
            self._bytes_h2d = self._bytes_d2h = 0

    def _describe(self) -> str:
        return f"UnifiedBuffer {self._dtype} {self._shape}"

    # --- allocation ------------------------------------------------------------------------

    def allocate(self, *, host: bool = True, device: bool = True) -> UnifiedBuffer:
        """Allocate zero-filled memory on the requested sides; returns ``self``.

        On an allocated buffer this adds the missing sides (copying the current data to them).

        Raises:
            InvalidConfigurationError: neither side requested.
            BackendNotAvailableError: ``device=True`` and the backend is unusable.
        """
        if not host and not device:
            raise InvalidConfigurationError("allocate() needs host=True, device=True or both")
        with self._lock:
            if self._state is BufferState.UNINITIALIZED and self.shares_memory:
                self.backend.require()
                self._host = self._device = self._new_host(zero=True)
                self._freed = False
                self._state = BufferState.SYNCHRONIZED
                return self
            if self._state is BufferState.UNINITIALIZED:
                if device:
                    self.backend.require()
                    self._device = self._new_device(zero=True)
                if host:
                    self._host = self._new_host(zero=True)
                self._freed = False
                self._state = (
                    BufferState.SYNCHRONIZED
                    if host and device
                    else BufferState.HOST_ONLY
                    if host
                    else BufferState.DEVICE_ONLY
                )
                return self
            if host:
                self._host_array()
            if device:
                self._device_array()
            return self

    def _new_host(self, *, zero: bool) -> np.ndarray[Any, Any]:
        arr: np.ndarray[Any, Any]
        if self._pool is not None:
            arr = self._pool.acquire(self._shape, self._dtype, location="host")
            self._pinned = False
        elif self._requested_pinned and self._backend_kind() is BackendType.CUDA:
            arr = self.backend.pinned_empty(self._shape, self._dtype)  # type: ignore[attr-defined]
            self._pinned = True
        else:
            return (
                np.zeros(self._shape, dtype=self._dtype)
                if zero
                else np.empty(self._shape, dtype=self._dtype)
            )
        if zero:
            arr[...] = 0
        return arr

    def _new_device(self, *, zero: bool) -> Any:
        if self._pool is not None and self._backend_kind() is not BackendType.METAL:
            arr = self._pool.acquire(
                self._shape, self._dtype, location="device", backend=self.backend
            )
            return self.backend.fill(arr, 0) if zero else arr
        if zero:
            return self.backend.allocate(self._shape, self._dtype)
        return self.backend.empty(self._shape, self._dtype)

    def _backend_kind(self) -> BackendType:
        if self._kind is None:
            self._kind = self.backend.backend_type
        return self._kind

    def free(self) -> None:
        """Release both sides (back to the pool, if any); the buffer becomes UNINITIALIZED.

        Using it afterwards raises ``BufferNotAllocatedError`` until ``allocate()`` is called
        again. Freeing twice is harmless.
        """
        with self._lock:
            if self._pool is not None:
                if self._host is not None:
                    self._pool.release(self._host)
                device = self._device
                if (
                    device is not None
                    and device is not self._host
                    and self._backend_kind() is not BackendType.METAL
                ):
                    self._pool.release(device)
            elif self._device is not None and self._backend is not None:
                self._backend.free(self._device)
            was_allocated = self._state is not BufferState.UNINITIALIZED
            self._host = self._device = self._metal = None
            self._metal_valid = False
            self._pinned = False
            self._state = BufferState.UNINITIALIZED
            self._freed = self._freed or was_allocated

    def _allocate_if_new(self) -> None:
        """0.2 allocated a never-allocated buffer on first write; a freed one still raises."""
        if self._state is BufferState.UNINITIALIZED and not self._freed:
            self.allocate()

    def _check_alive(self) -> None:
        if self._state is BufferState.UNINITIALIZED:
            if self._freed:
                raise BufferNotAllocatedError(
                    f"{self._describe()} was freed; call allocate() again or create a new buffer"
                )
            raise BufferNotAllocatedError(
                f"{self._describe()} is not allocated; call allocate() first"
            )

    # --- transfers -------------------------------------------------------------------------

    def _copy_h2d(self) -> None:
        host = self._host
        assert host is not None
        device = self._device
        if device is host:  # one shared array: nothing to copy
            return
        if device is None:
            device = self._device = self._new_device(zero=False)
        if self._plain_cpu():  # our own two arrays: same shape and dtype by construction
            np.copyto(device, host)
        else:
            backend = self.backend
            backend.require()
            self._device = backend.copy_to_device(host, out=device)
            if self._backend_kind() is BackendType.METAL:
                self._metal_valid = False
        self._h2d += 1
        self._bytes_h2d += self._nbytes

    def _copy_d2h(self) -> None:
        host = self._host
        if host is not None and host is self._device:  # one shared array: nothing to copy
            return
        if host is None:
            host = self._host = self._new_host(zero=False)
        if self._plain_cpu() and type(self._device) is np.ndarray:
            np.copyto(host, self._device)
        else:
            self.backend.copy_to_host(self._device, out=host)
        self._metal_valid = False
        self._d2h += 1
        self._bytes_d2h += self._nbytes

    def _plain_cpu(self) -> bool:
        """True when the device side is a NumPy array of the plain CPU backend (copies are
        then one ``np.copyto``, not a trip through the backend's checks)."""
        plain = self._cpu_copy
        if plain is None:
            from ..backends.cpu import CPUBackend

            plain = self._cpu_copy = type(self.backend) is CPUBackend
        return plain

    def _host_array(self) -> np.ndarray[Any, Any]:
        with self._lock:
            state = self._state
            if state is not _SYNC and state is not _H_DIRTY and state is not _H_ONLY:
                self._check_alive()
                self._copy_d2h()
                self._state = _SYNC
            return self._host  # type: ignore[return-value]  # set by allocate or the copy

    def _device_array(self) -> Any:
        with self._lock:
            state = self._state
            if state is not _SYNC and state is not _D_DIRTY and state is not _D_ONLY:
                self._check_alive()
                self._copy_h2d()
                self._state = _SYNC
            return self._device

    @property
    def host(self) -> np.ndarray[Any, Any]:
        """The host NumPy array, copied from the device first if the device side is newer.

        Writing through it is not tracked: call ``mark_host_dirty()`` afterwards (or assign
        through ``buf[...] = value``, which does).

        Raises:
            BufferNotAllocatedError: not allocated, or freed.
        """
        return self._host_array()

    @property
    def device(self) -> Any:
        """The device array (CuPy on CUDA, NumPy on the CPU, ``mx.array`` on Metal).

        Copied from the host first if the host side is newer. Call ``mark_device_dirty()``
        after a kernel writes it.

        Raises:
            BufferNotAllocatedError: not allocated, or freed.
            BackendNotAvailableError: the device backend is unusable.
        """
        return self._device_array()

    @property
    def metal(self) -> Any:
        """The data as an ``mx.array``: the device array on Metal, else an MLX mirror of host.

        The mirror is rebuilt only when the host side changed since the last access. After
        changing it in place, call ``mark_metal_dirty()``; or assign ``buf.metal = array``.

        Raises:
            BackendNotAvailableError: MLX is not installed (``pip install "pydotcompute[metal]"``).
        """
        if self._backend_kind() is BackendType.METAL:
            return self._device_array()
        with self._lock:
            host = self._host_array()
            if not self._metal_valid:
                from ..backends.metal import MetalBackend

                self._metal = MetalBackend().copy_to_device(host)
                self._metal_valid = True
                self._h2m += 1
            return self._metal

    @metal.setter
    def metal(self, value: Any) -> None:
        with self._lock:
            self._check_alive()
            check_copy_compatible(value, self, what="assign an MLX array to")
            if self._backend_kind() is BackendType.METAL:
                # A whole-array assignment: the device side becomes the truth.
                self._device = value
                self._state = (
                    BufferState.DEVICE_DIRTY if self._host is not None else BufferState.DEVICE_ONLY
                )
                return
            self._host_array()
            self._metal = value
            self._metal_valid = True
            self._pull_metal()

    def _pull_metal(self) -> None:
        if self._state is BufferState.DEVICE_DIRTY:
            raise BufferSyncError(
                f"{self._describe()}: the device side was written too; both cannot be kept. "
                "Read .host (or call synchronize()) before writing the MLX mirror"
            )
        assert self._host is not None
        np.copyto(self._host, np.asarray(self._metal))
        self._m2h += 1
        if self._state is BufferState.SYNCHRONIZED:
            self._state = BufferState.HOST_DIRTY

    # --- dirty marking ---------------------------------------------------------------------

    def mark_host_dirty(self) -> None:
        """Record that the host side was written; the next device read copies host → device.

        Raises:
            BufferNotAllocatedError: not allocated, or freed.
            BufferSyncError: ``strict_sync`` and the device side is dirty too (both were
                written); without ``strict_sync`` a ``RuntimeWarning`` and the host wins.
        """
        with self._lock:
            state = self._state
            if state is _SYNC or state is _H_DIRTY or state is _H_ONLY:
                if state is _SYNC:
                    self._state = _H_DIRTY
                self._metal_valid = False
                return
            self._check_alive()
            if state is BufferState.DEVICE_DIRTY:
                self._conflict(
                    f"{self._describe()}: mark_host_dirty() while the device side is dirty; both "
                    "sides were written and one would be lost. Read .host before writing it"
                )
                self._state = _H_DIRTY
                self._metal_valid = False
                return
            if state is BufferState.DEVICE_ONLY:
                raise BufferSyncError(
                    f"{self._describe()} has no host side to mark dirty; read .host first"
                )

    def mark_device_dirty(self) -> None:
        """Record that the device side was written; the next host read copies device → host.

        Raises:
            BufferNotAllocatedError: not allocated, or freed.
            BufferSyncError: ``strict_sync`` and the host side is dirty too (both were
                written); without ``strict_sync`` a ``RuntimeWarning`` and the device wins.
        """
        with self._lock:
            state = self._state
            if state is _SYNC or state is _D_DIRTY or state is _D_ONLY:
                if state is _SYNC:
                    self._state = _D_DIRTY
                self._metal_valid = False
                return
            self._check_alive()
            if state is BufferState.HOST_DIRTY:
                self._conflict(
                    f"{self._describe()}: mark_device_dirty() while the host side is dirty; both "
                    "sides were written and one would be lost. Read .device before writing it"
                )
                self._state = _D_DIRTY
                self._metal_valid = False
                return
            if state is BufferState.HOST_ONLY:
                raise BufferSyncError(
                    f"{self._describe()} has no device side to mark dirty; read .device first"
                )

    def _conflict(self, text: str) -> None:
        """Both sides were marked dirty: nothing is lost when they share memory; otherwise
        raise (``strict_sync``) or warn, and the caller keeps the last mark (as in 0.2)."""
        if self._host is self._device:
            return
        if self.strict_sync:
            raise BufferSyncError(text)
        warnings.warn(
            text + "; the last mark wins (pass strict_sync=True to raise instead)",
            RuntimeWarning,
            stacklevel=4,
        )

    def mark_metal_dirty(self) -> None:
        """Record that the ``.metal`` array was changed in place; host takes its data.

        On the Metal backend this is ``mark_device_dirty()``. Elsewhere the mirror is copied
        into the host side at once (MLX shares memory with the CPU) and the host becomes dirty.

        Raises:
            BufferSyncError: there is no current MLX mirror, or the device side is dirty too.
        """
        if self._backend_kind() is BackendType.METAL:
            self.mark_device_dirty()
            return
        with self._lock:
            self._check_alive()
            if self._metal is None or not self._metal_valid:
                raise BufferSyncError(
                    f"{self._describe()}: no current MLX mirror to take data from; read .metal "
                    "after the last host change, then write it"
                )
            self._pull_metal()

    def synchronize(self) -> None:
        """Make both allocated sides hold the same data, then wait for queued device work.

        A one-sided buffer (``HOST_ONLY``/``DEVICE_ONLY``) is left one-sided.
        """
        with self._lock:
            self._check_alive()
            if self._state is BufferState.HOST_DIRTY:
                self._device_array()
            elif self._state is BufferState.DEVICE_DIRTY:
                self._host_array()
            if self._device is not None:
                if ring_kernels_running():  # a device-wide wait would wait for them forever
                    self.backend.synchronize_stream()
                else:
                    self.backend.synchronize()

    async def ensure_on_device(self) -> Any:
        """Make the device side current (copying in a worker thread when large); returns it."""
        self._check_alive()
        state = self._state
        if state is _SYNC or state is _D_DIRTY or state is _D_ONLY:
            return self._device
        if self.nbytes >= ASYNC_COPY_THRESHOLD:
            return await asyncio.to_thread(self._device_array)
        return self._device_array()

    async def ensure_on_host(self) -> np.ndarray[Any, Any]:
        """Make the host side current (copying in a worker thread when large); returns it."""
        self._check_alive()
        state = self._state
        if state is _SYNC or state is _H_DIRTY or state is _H_ONLY:
            assert self._host is not None
            return self._host
        if self.nbytes >= ASYNC_COPY_THRESHOLD:
            return await asyncio.to_thread(self._host_array)
        return self._host_array()

    # --- bulk data -------------------------------------------------------------------------

    def _is_foreign_device_array(self, a: Any) -> bool:
        return not isinstance(a, np.ndarray) and self.backend.is_device_array(a)

    def copy_from(self, src: Any, *, exact: bool = False) -> UnifiedBuffer:
        """Overwrite the whole buffer with ``src`` (NumPy, a device array, or a sequence);
        returns ``self``. A never-allocated buffer is allocated first.

        A NumPy source goes to the host side (device becomes stale) with ``np.copyto``'s
        rules, as in 0.2: ``same_kind`` casting (an int64 source into a float32 buffer) and
        broadcasting. ``exact=True`` requires an equal shape and dtype. A device array goes
        to the device side without a round trip through the host (equal shape and dtype).

        Raises:
            BufferMismatchError: the source cannot be copied in (the message names both
                sides).
            BufferNotAllocatedError: the buffer was freed.
        """
        with self._lock:
            self._allocate_if_new()
            self._check_alive()
            if self._is_foreign_device_array(src):
                check_copy_compatible(src, self, what="copy_from")
                if self._device is None:
                    self._device = self._new_device(zero=False)
                self._device = self.backend.copy_device_to_device(src, self._device)
                self._state = (
                    BufferState.DEVICE_DIRTY if self._host is not None else BufferState.DEVICE_ONLY
                )
                self._metal_valid = False
                return self
            arr = src if isinstance(src, np.ndarray) else self._as_host_array(src)
            loose_ok = np.can_cast(arr.dtype, self._dtype, "same_kind") and _broadcasts(
                arr.shape, self._shape
            )
            if exact or not loose_ok:  # raises unless shape and dtype are equal
                check_copy_compatible(arr, self, what="copy_from")
            if self._host is None:
                self._host = self._new_host(zero=False)
            np.copyto(self._host, arr)
            self._state = (
                BufferState.HOST_DIRTY if self._device is not None else BufferState.HOST_ONLY
            )
            self._metal_valid = False
            return self

    def _as_host_array(self, src: Any) -> np.ndarray[Any, Any]:
        if hasattr(src, "dtype") and hasattr(src, "shape"):  # MLX and other array types
            return np.asarray(src)
        try:
            return np.asarray(src, dtype=self._dtype)
        except (TypeError, ValueError) as exc:
            raise BufferMismatchError(
                f"cannot copy {type(src).__name__} into {self._describe()}: {exc}"
            ) from None

    def copy_to(self, dst: Any) -> Any:
        """Copy the current data into ``dst`` (NumPy or a device array); returns ``dst``.

        Raises:
            BufferMismatchError: shape or dtype differ (the message names both sides).
            BufferNotAllocatedError: not allocated, or freed.
        """
        with self._lock:
            self._check_alive()
            foreign = self._is_foreign_device_array(dst)
            if not foreign and not isinstance(dst, np.ndarray):
                raise BufferMismatchError(
                    f"copy_to needs a NumPy or device array, got {type(dst).__name__}"
                )
            check_copy_compatible(self, dst, what="copy_to")
            if foreign:
                return self.backend.copy_device_to_device(self._device_array(), dst)
            np.copyto(dst, self._host_array())
            return dst

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """A NumPy copy of the current data."""
        return self._host_array().copy()

    def fill(self, value: Any) -> UnifiedBuffer:
        """Set every element, on each allocated side, to ``value`` (no transfer); returns
        ``self``. A never-allocated buffer is allocated first.

        Raises:
            BufferNotAllocatedError: the buffer was freed.
        """
        with self._lock:
            self._allocate_if_new()
            self._check_alive()
            if self._host is not None:
                self._host[...] = value
            if self._device is not None and self._device is not self._host:
                self._device = self.backend.fill(self._device, value)
            if self._host is not None and self._device is not None:
                self._state = BufferState.SYNCHRONIZED
            self._metal_valid = False
            return self

    def zeros(self) -> UnifiedBuffer:
        """``fill(0)``; returns ``self``."""
        return self.fill(0)

    # --- Python protocols ------------------------------------------------------------------

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError(f"len() of a 0-d {self._describe()}")
        return self._shape[0]

    def __getitem__(self, key: Any) -> Any:
        return self._host_array()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            self._host_array()[key] = value
            self.mark_host_dirty()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._host_array())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        host = self._host_array()
        if dtype is not None and np.dtype(dtype) != host.dtype:
            return host.astype(dtype)
        return host.copy() if copy else host

    def __enter__(self) -> UnifiedBuffer:
        if not self.is_allocated:
            self.allocate()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.free()

    def __repr__(self) -> str:
        backend = self._backend.name if self._backend is not None else "unresolved"
        return f"<{self._describe()} state={self._state.name} backend={backend}>"


def _broadcasts(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """Whether an array of shape ``src`` broadcasts onto shape ``dst`` (np.copyto's rule)."""
    if len(src) > len(dst):
        return False
    return all(a in (1, b) for a, b in zip(reversed(src), reversed(dst), strict=False))
