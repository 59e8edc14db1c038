"""MemoryPool: reuse host and device blocks by size class, evicting LRU under a byte limit.

Design. A request for ``shape``/``dtype`` is rounded up to a *size class* (512 B, then four
classes per power of two: 1, 1.25, 1.5, 1.75 x 2^k, so at most 25 % of a block is slack). A
block is a raw byte array of the class size; callers receive a typed view of its first bytes.
Released blocks are cached per (location, backend, class) and reused most-recently-released
first (warm in cache); one ``OrderedDict`` over every cached block gives the global LRU order.

The byte limit bounds what the pool *holds* (blocks in use plus cached). Memory in use is
never refused — the pool is a cache, not a quota — so when the total goes over the limit the
least recently used cached blocks are dropped, and a released block that does not fit is freed
at once (both counted as evictions). On CUDA, device blocks come from CuPy, whose own memory
pool then keeps the freed memory for CuPy; ``free_all_blocks()`` empties both, and
``set_limit()``, ``enable()`` and ``disable()`` also drive CuPy's pools when CuPy is in use.

Rejected: a buddy allocator over one big arena (faster to split, but one leaked view pins the
whole arena and device and host arenas would need separate code) and ``weakref`` finalizers to
auto-release (NumPy views of a block keep the block alive, so a finalizer would fire late or
never; explicit ``release``/``pooled_buffer`` is clearer).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from ..backends.base import BackendType, as_shape
from ..backends.device_sync import refuse_device_sync
from ..exceptions import BufferNotAllocatedError, InvalidConfigurationError

if TYPE_CHECKING:
    from ..backends.base import Backend

__all__ = (
    "MemoryPool",
    "PoolStatistics",
    "configure_memory_pool",
    "get_memory_pool",
    "size_class",
)

Location = Literal["host", "device", "pinned"]
_LOCATIONS = ("host", "device", "pinned")
MIN_BLOCK = 512


def size_class(nbytes: int) -> int:
    """The block size a request of ``nbytes`` is served from (at most 25 % larger)."""
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    power = 1 << (nbytes - 1).bit_length() - 1  # largest power of two below nbytes
    step = power // 4
    return power + ((nbytes - power + step - 1) // step) * step


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a pool's counters (`MemoryPool.get_stats()`).

    The first three fields are the ones older code builds and reads
    (`PoolStatistics(used_bytes, total_bytes, n_free_blocks)`): bytes handed out, bytes
    held (handed out plus cached), and blocks cached for reuse. The rest are counters
    this pool keeps as well.
    """

    used_bytes: int = 0
    total_bytes: int = 0
    n_free_blocks: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    acquires: int = 0
    releases: int = 0
    blocks_in_use: int = 0
    limit_bytes: int | None = None
    bytes_by_location: dict[str, int] = field(default_factory=dict)
    cupy_used_bytes: int = 0
    cupy_total_bytes: int = 0
    enabled: bool = True
    cupy_n_free_blocks: int = 0

    def __getitem__(self, key: str) -> Any:
        """``stats["bytes_in_use"]``: any field or property by name."""
        if not isinstance(key, str) or key.startswith("_") or not hasattr(self, key):
            raise KeyError(key)
        return getattr(self, key)

    @property
    def hit_rate(self) -> float:
        """Hits over acquires (0.0 before the first acquire)."""
        return self.hits / self.acquires if self.acquires else 0.0

    @property
    def bytes_in_use(self) -> int:
        """Bytes handed out and not yet released (the same as `used_bytes`)."""
        return self.used_bytes

    @property
    def bytes_cached(self) -> int:
        """Bytes cached for reuse (the same as `free_bytes`)."""
        return self.total_bytes - self.used_bytes

    @property
    def blocks_cached(self) -> int:
        """Blocks cached for reuse (the same as `n_free_blocks`)."""
        return self.n_free_blocks

    @property
    def free_bytes(self) -> int:
        """Bytes held but not handed out: `total_bytes - used_bytes`."""
        return self.total_bytes - self.used_bytes

    @property
    def utilization(self) -> float:
        """`used_bytes / total_bytes` (0.0 while the pool holds nothing)."""
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def used_mb(self) -> float:
        """`used_bytes` in MiB."""
        return self.used_bytes / 2**20

    @property
    def total_mb(self) -> float:
        """`total_bytes` in MiB."""
        return self.total_bytes / 2**20


@dataclass(slots=True)
class _Block:
    raw: Any
    nbytes: int
    key: tuple[str, str, int]
    reusable: bool = True  # False: released blocks are dropped, not cached (MLX arrays)


@dataclass(slots=True)
class _Lease:
    block: _Block
    view: Any


class MemoryPool:
    """Size-class pool of host, pinned and device blocks with LRU eviction.

    Args:
        initial_size_mb: MiB the pool is expected to grow to at first. The pool allocates
            on demand, so this is checked (non-negative, within `max_size_mb`) and kept
            as `initial_size_mb`, not reserved up front.
        max_size_mb: bound on what the pool holds, in MiB; `None` for no bound. The same
            as `max_bytes` in other units; give one or the other.
        max_bytes: bound on bytes held (in use + cached); `None` for no bound.
        enabled: when `False` every acquire allocates and every release frees.
        backend: device backend for `location="device"` (default: the accelerator's).

    Raises:
        InvalidConfigurationError: a negative size, `initial_size_mb` above the bound, or
            `max_size_mb` and `max_bytes` that disagree.

    `MemoryPool()` without arguments is the process-wide pool (`get_memory_pool()`), as in
    PyDotCompute 0.2; with arguments, or through `MemoryPool.create(...)`, it is a new pool
    of its own.

    Thread-safe: one lock guards the tables; allocation happens under it too, so keep blocks
    large enough that pooling is worth it (it is for anything over a few KiB).
    """

    _instance: ClassVar[MemoryPool | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> MemoryPool:
        if cls is MemoryPool and not args and not kwargs:
            return cls.shared()
        return super().__new__(cls)

    @classmethod
    def shared(cls) -> MemoryPool:
        """The process-wide pool, created on first use (no limit); ``MemoryPool()`` and
        ``get_memory_pool()`` return it too. After ``MemoryPool._instance = None`` (as in
        PyDotCompute 0.2) the next call creates a new one."""
        with _pool_lock:
            pool = cls._instance
            if pool is None:
                pool = cls.create()
                cls._instance = pool
            return pool

    @classmethod
    def create(
        cls,
        initial_size_mb: float = 0,
        max_size_mb: float | None = None,
        *,
        max_bytes: int | None = None,
        enabled: bool = True,
        backend: Backend | str | None = None,
    ) -> MemoryPool:
        """A new pool of its own (not the process-wide one), whatever the arguments."""
        pool = object.__new__(cls)
        pool.__init__(  # type: ignore[misc]
            initial_size_mb, max_size_mb, max_bytes=max_bytes, enabled=enabled, backend=backend
        )
        return pool

    def __init__(
        self,
        initial_size_mb: float = 0,
        max_size_mb: float | None = None,
        *,
        max_bytes: int | None = None,
        enabled: bool = True,
        backend: Backend | str | None = None,
    ) -> None:
        if getattr(self, "_ready", False):
            return  # MemoryPool() handed back the process-wide pool: keep its state
        self._check_limit(max_bytes)
        if max_size_mb is not None:
            if max_size_mb < 0:
                raise InvalidConfigurationError(
                    f"max_size_mb must be >= 0 or None, got {max_size_mb!r}"
                )
            from_mb = int(max_size_mb * 2**20)
            if max_bytes is not None and max_bytes != from_mb:
                raise InvalidConfigurationError(
                    f"max_size_mb={max_size_mb!r} and max_bytes={max_bytes!r} disagree; "
                    "give one of them"
                )
            max_bytes = from_mb
        if initial_size_mb < 0:
            raise InvalidConfigurationError(
                f"initial_size_mb must be >= 0, got {initial_size_mb!r}"
            )
        if max_bytes and initial_size_mb * 2**20 > max_bytes:
            raise InvalidConfigurationError(
                f"initial_size_mb={initial_size_mb!r} is above the pool's bound of "
                f"{max_bytes / 2**20:g} MiB; raise max_size_mb or lower initial_size_mb"
            )
        self.initial_size_mb = initial_size_mb
        self._limit = max_bytes or None
        self._enabled = enabled
        self._backend_spec = backend
        self._lock = threading.Lock()
        self._free: dict[tuple[str, str, int], list[_Block]] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()
        self._leases: dict[int, _Lease] = {}
        self._bytes_cached = 0
        self._bytes_in_use = 0
        self._hits = self._misses = self._evictions = self._acquires = self._releases = 0
        self._ready = True

    @staticmethod
    def _check_limit(max_bytes: int | None) -> None:
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise InvalidConfigurationError(
                f"max_bytes must be a non-negative int or None, got {max_bytes!r}"
            )

    # --- configuration ---------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether released blocks are cached for reuse."""
        return self._enabled

    @property
    def limit_bytes(self) -> int | None:
        """The byte bound, or ``None``."""
        return self._limit

    def enable(self) -> None:
        """Cache released blocks again (and route CuPy allocations through its pools)."""
        self._enabled = True
        cupy = self._cupy()
        if cupy is not None:
            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
            cupy.cuda.set_pinned_memory_allocator(cupy.get_default_pinned_memory_pool().malloc)

    def disable(self) -> None:
        """Stop caching: drop cached blocks (and make CuPy allocate directly)."""
        self._enabled = False
        self.free_all_blocks()
        cupy = self._cupy()
        if cupy is not None:
            cupy.cuda.set_allocator(None)
            cupy.cuda.set_pinned_memory_allocator(None)

    def set_limit(self, mb: float | None) -> None:
        """Bound the bytes held to ``mb`` MiB (``None`` or 0: no bound); evicts at once.

        Also sets CuPy's device pool limit when CuPy drives a GPU.

        Raises:
            InvalidConfigurationError: ``mb`` is negative.
        """
        if mb is not None and mb < 0:
            raise InvalidConfigurationError(f"limit must be >= 0 MiB or None, got {mb!r}")
        limit = int(mb * 2**20) if mb else None
        with self._lock:
            self._limit = limit
            self._evict_locked()
        cupy = self._cupy()
        if cupy is not None:
            cupy.get_default_memory_pool().set_limit(size=limit or 0)

    def set_backend(self, backend: Backend | str | None) -> None:
        """Use ``backend`` for device blocks acquired without one (``None``: the
        accelerator's backend, resolved at each acquire)."""
        self._backend_spec = backend

    def _cupy(self) -> Any:
        """CuPy, when it is already imported and drives a GPU; else ``None``."""
        if "cupy" not in sys.modules:
            return None
        backend = self._device_backend_or_none()
        if backend is None or getattr(backend, "mode", None) != "cupy":
            return None
        return sys.modules["cupy"]

    def _device_backend_or_none(self) -> Backend | None:
        try:
            return self._device_backend(None)
        except Exception:
            return None

    def _device_backend(self, backend: Backend | str | None) -> Backend:
        from ..backends import get_backend
        from ..backends.base import Backend

        spec = backend if backend is not None else self._backend_spec
        if isinstance(spec, Backend):
            return spec
        if spec is None:
            from .accelerator import get_accelerator

            return get_accelerator().get_backend()  # type: ignore[no-any-return]
        return get_backend(spec)

    # --- acquire / release -----------------------------------------------------------------

    def acquire(
        self,
        shape: int | Sequence[int],
        dtype: npt.DTypeLike = np.float32,
        *,
        location: Location = "host",
        backend: Backend | str | None = None,
    ) -> Any:
        """An uninitialised array of ``shape``/``dtype`` from the pool; give it back with
        ``release``.

        Args:
            shape: array shape.
            dtype: NumPy dtype.
            location: ``"host"`` (NumPy), ``"pinned"`` (page-locked NumPy on CUDA, plain
                NumPy elsewhere) or ``"device"`` (the backend's device array; on Metal a
                fresh ``mx.array`` each time, since MLX keeps its own buffer cache, released
                like any other block).
            backend: the device backend for ``"device"``/``"pinned"``.

        Raises:
            InvalidConfigurationError: unknown location or bad shape.
            BackendNotAvailableError: ``"device"`` on an unusable backend.
        """
        if location not in _LOCATIONS:
            raise InvalidConfigurationError(
                f"location must be one of {', '.join(_LOCATIONS)}, got {location!r}"
            )
        dims = as_shape(shape)
        np_dtype = np.dtype(dtype)
        nbytes = math.prod(dims) * np_dtype.itemsize
        dev = self._device_backend(backend) if location != "host" else None
        if dev is not None and location == "device":
            dev.require()
            if dev.backend_type is BackendType.METAL:
                # MLX arrays are immutable and MLX caches its own buffers: no views to pool,
                # but the lease is recorded so that release() and the statistics work.
                array = dev.empty(dims, np_dtype)
                lease = _Lease(_Block(None, nbytes, ("device", dev.name, nbytes), False), array)
                with self._lock:
                    self._acquires += 1
                    self._misses += 1
                    self._leases[id(array)] = lease
                    self._bytes_in_use += nbytes
                return array
        cls = size_class(nbytes)
        key = (location, dev.name if dev is not None else "host", cls)
        with self._lock:
            self._acquires += 1
            block: _Block | None = None
            stack = self._free.get(key)
            if self._enabled and stack:
                block = stack.pop()
                del self._lru[id(block)]
                self._bytes_cached -= block.nbytes
                self._hits += 1
            else:
                self._misses += 1
                block = _Block(self._allocate_raw(location, cls, dev), cls, key)
            raw = block.raw
            if type(raw) is np.ndarray:  # host and pinned blocks: one constructor call
                view = np.ndarray(dims, np_dtype, buffer=raw)
            else:
                view = raw[:nbytes].view(np_dtype).reshape(dims)
            self._leases[id(view)] = _Lease(block, view)
            self._bytes_in_use += block.nbytes
            self._evict_locked()
            return view

    @staticmethod
    def _allocate_raw(location: str, nbytes: int, dev: Backend | None) -> Any:
        if location == "host" or dev is None:
            return np.empty(nbytes, dtype=np.uint8)
        if location == "pinned":
            if dev.backend_type is BackendType.CUDA and dev.is_available:
                return dev.pinned_empty((nbytes,), np.uint8)  # type: ignore[attr-defined]
            return np.empty(nbytes, dtype=np.uint8)
        return dev.empty((nbytes,), np.uint8)

    def release(self, array: Any) -> None:
        """Give back an array from ``acquire``; do not use it afterwards.

        Raises:
            BufferNotAllocatedError: ``array`` did not come from this pool, or was released.
        """
        with self._lock:
            lease = self._leases.pop(id(array), None)
            if lease is None or lease.view is not array:
                if lease is not None:  # id reuse by an unrelated object: put it back
                    self._leases[id(array)] = lease
                raise BufferNotAllocatedError(
                    f"cannot release {type(array).__name__} "
                    f"{getattr(array, 'dtype', '')} {tuple(getattr(array, 'shape', ()))}: it "
                    "was not acquired from this pool or was already released"
                )
            self._releases += 1
            block = lease.block
            self._bytes_in_use -= block.nbytes
            if not self._enabled or not block.reusable:
                return
            self._free.setdefault(block.key, []).append(block)
            self._lru[id(block)] = block
            self._bytes_cached += block.nbytes
            self._evict_locked()

    @contextlib.contextmanager
    def pooled_buffer(
        self,
        shape: int | Sequence[int],
        dtype: npt.DTypeLike = np.float32,
        *,
        location: Location = "host",
        backend: Backend | str | None = None,
    ) -> Iterator[Any]:
        """``with pool.pooled_buffer(shape, dtype) as a:`` — acquire, then release on exit."""
        array = self.acquire(shape, dtype, location=location, backend=backend)
        try:
            yield array
        finally:
            if id(array) in self._leases:  # tolerate an explicit release inside the block
                self.release(array)

    def _evict_locked(self) -> None:
        if self._limit is None:
            return
        while self._lru and self._bytes_in_use + self._bytes_cached > self._limit:
            _, block = self._lru.popitem(last=False)
            self._free[block.key].remove(block)
            self._bytes_cached -= block.nbytes
            self._evictions += 1

    def free_all_blocks(self) -> int:
        """Drop every cached block (and CuPy's cached blocks); returns the bytes dropped.

        Raises:
            CUDAError: CuPy drives a GPU and persistent ring kernels run: freeing device
                memory may synchronize the device, which would wait for them forever.
        """
        if self._cupy() is not None:
            refuse_device_sync(
                "MemoryPool.free_all_blocks()",
                "Keep the cached blocks until the GPU actors are terminated",
            )
        with self._lock:
            dropped = self._bytes_cached
            self._free.clear()
            self._lru.clear()
            self._bytes_cached = 0
        cupy = self._cupy()
        if cupy is not None:
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
        return dropped

    # --- statistics ------------------------------------------------------------------------

    def get_stats(self) -> PoolStatistics:
        """A snapshot of the counters (plus CuPy's device pool usage when CuPy is in use)."""
        cupy_used = cupy_total = 0
        cupy = self._cupy()
        if cupy is not None:
            pool = cupy.get_default_memory_pool()
            cupy_used, cupy_total = int(pool.used_bytes()), int(pool.total_bytes())
        with self._lock:
            by_location: dict[str, int] = dict.fromkeys(_LOCATIONS, 0)
            for lease in self._leases.values():
                by_location[lease.block.key[0]] += lease.block.nbytes
            for block in self._lru.values():
                by_location[block.key[0]] += block.nbytes
            return PoolStatistics(
                used_bytes=self._bytes_in_use,
                total_bytes=self._bytes_in_use + self._bytes_cached,
                n_free_blocks=len(self._lru),
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                acquires=self._acquires,
                releases=self._releases,
                blocks_in_use=len(self._leases),
                limit_bytes=self._limit,
                bytes_by_location=by_location,
                cupy_used_bytes=cupy_used,
                cupy_total_bytes=cupy_total,
                enabled=self._enabled,
            )

    def get_pinned_stats(self) -> PoolStatistics:
        """Pinned-memory figures: ours, and CuPy's pinned pool free blocks when in use.

        ``used_bytes``/``bytes_in_use`` is pinned memory handed out, ``bytes_cached`` the
        pinned blocks kept for reuse, ``n_free_blocks`` their count (plus CuPy's
        ``cupy_n_free_blocks``). Subscripting by name works too: ``stats["bytes_in_use"]``.
        """
        with self._lock:
            cached_blocks = [b for b in self._lru.values() if b.key[0] == "pinned"]
            cached = sum(b.nbytes for b in cached_blocks)
            in_use = sum(
                lease.block.nbytes
                for lease in self._leases.values()
                if lease.block.key[0] == "pinned"
            )
            enabled = self._enabled
        cupy_free_blocks = 0
        cupy = self._cupy()
        if cupy is not None:
            cupy_free_blocks = int(cupy.get_default_pinned_memory_pool().n_free_blocks())
        return PoolStatistics(
            used_bytes=in_use,
            total_bytes=in_use + cached,
            n_free_blocks=len(cached_blocks) + cupy_free_blocks,
            enabled=enabled,
            cupy_n_free_blocks=cupy_free_blocks,
        )

    def free_all_free(self) -> int:
        """Drop the cached (unused) blocks, and CuPy's unused ones when CuPy is in use;
        returns the bytes dropped. The same as `free_all_blocks`."""
        return self.free_all_blocks()

    def reset_stats(self) -> None:
        """Zero the hit/miss/eviction counters (holdings are unchanged)."""
        with self._lock:
            self._hits = self._misses = self._evictions = self._acquires = self._releases = 0

    def __repr__(self) -> str:
        s = self.get_stats()
        limit = "none" if s.limit_bytes is None else f"{s.limit_bytes}B"
        return (
            f"MemoryPool(enabled={s.enabled}, used={s.used_mb:.2f}MB, "
            f"total={s.total_mb:.2f}MB, cuda={self._cupy() is not None}, "
            f"cached={s.bytes_cached}B, limit={limit}, hits={s.hits}, misses={s.misses}, "
            f"evictions={s.evictions})"
        )


_pool_lock = threading.Lock()


def get_memory_pool() -> MemoryPool:
    """The process-wide ``MemoryPool`` (created on first use, no limit); the same object
    as ``MemoryPool()``. Setting ``MemoryPool._instance = None`` makes the next call
    create a new one (as in PyDotCompute 0.2)."""
    return MemoryPool.shared()


def configure_memory_pool(
    initial_size_mb: float = 0,
    max_size_mb: float | None = None,
    enable: bool = True,
    *,
    limit_mb: float | None = None,
    enabled: bool | None = None,
    backend: Backend | str | None = None,
) -> MemoryPool:
    """Configure (creating if needed) the process-wide pool; returns it.

    The three positional arguments are the ones older code passes; the keyword-only ones
    say the same in this pool's terms and win when both are given.

    Args:
        initial_size_mb: checked as in `MemoryPool` (the pool allocates on demand).
        max_size_mb: byte bound in MiB (`None` leaves it unchanged, 0 removes it).
        enable: turn caching on (the default) or off.
        limit_mb: byte bound in MiB (`None` leaves it unchanged, 0 removes it).
        enabled: turn caching on or off; `None` defers to `enable`.
        backend: device backend for device blocks (`None` leaves it unchanged).

    Raises:
        InvalidConfigurationError: a negative size, or `initial_size_mb` above the bound.
    """
    limit = limit_mb if limit_mb is not None else max_size_mb
    if initial_size_mb < 0:
        raise InvalidConfigurationError(f"initial_size_mb must be >= 0, got {initial_size_mb!r}")
    if limit and initial_size_mb > limit:
        raise InvalidConfigurationError(
            f"initial_size_mb={initial_size_mb!r} is above the bound of {limit!r} MiB; "
            "raise max_size_mb or lower initial_size_mb"
        )
    pool = get_memory_pool()
    if backend is not None:
        pool.set_backend(backend)
    if initial_size_mb:
        pool.initial_size_mb = initial_size_mb
    if limit is not None:
        pool.set_limit(limit)
    if enabled if enabled is not None else enable:
        pool.enable()
    else:
        pool.disable()
    return pool


# MemoryPool.__new__ takes (*args, **kwargs) to tell "MemoryPool()" apart; show __init__'s
# parameters to inspect.signature() and help().
MemoryPool.__signature__ = inspect.signature(MemoryPool.create)  # type: ignore[attr-defined]
