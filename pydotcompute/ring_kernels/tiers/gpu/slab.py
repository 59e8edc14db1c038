"""Ring and state memory for GPU actors, carved from slabs allocated before any kernel runs.

Allocating page-locked host memory or device memory may synchronize the device implicitly
(CUDA's implicit-synchronization rules), and a device synchronization waits for every
running persistent kernel, forever. So an actor started beside running ones must not call
`cudaHostAlloc` or `cudaMalloc`. Each process keeps two slabs: mapped pinned host memory
(rings, control blocks) and device memory (actor state). A slab grows only while no GPU
actor runs; an actor started while others run takes its memory from what is already there,
and when that is not enough the start is refused with a `CUDAError` that says how much to
reserve up front (`reserve`, or `PYDOTCOMPUTE_GPU_SLAB_MB`). Memory an actor gives back
returns to its slab (first fit, neighbours merged); slabs are never freed while the process
runs, so releasing an actor never frees CUDA memory either.

A carve is a pair of views of the same bytes: a NumPy array for the host (mapped slabs) and
a Numba device array for the kernel (`DeviceNDArray.view` and slicing, so the device pointer
is the slab's plus the offset). Under the Numba CUDA simulator both views are NumPy.
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....exceptions import CUDAError, InvalidConfigurationError

__all__ = ("ALIGN", "Arena", "Carve", "MemorySlabs", "default_chunk_bytes")

#: Every carve starts on a 256-byte boundary (CUDA's allocation alignment).
ALIGN = 256

_MIB = 1 << 20


def default_chunk_bytes() -> int:
    """Bytes a slab grows by when it must: ``PYDOTCOMPUTE_GPU_SLAB_MB`` MiB (default 64)."""
    raw = os.environ.get("PYDOTCOMPUTE_GPU_SLAB_MB", "64")
    try:
        mb = float(raw)
    except ValueError:
        raise InvalidConfigurationError(
            f"PYDOTCOMPUTE_GPU_SLAB_MB must be a number of MiB, got {raw!r}"
        ) from None
    if mb <= 0:
        raise InvalidConfigurationError(f"PYDOTCOMPUTE_GPU_SLAB_MB must be > 0, got {raw!r}")
    return int(mb * _MIB)


class Arena:
    """First-fit allocation of aligned byte ranges within ``size`` bytes (no memory itself)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free: list[tuple[int, int]] = [(0, size)]  # (offset, length), sorted by offset
        self.used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        """An offset of ``nbytes`` free bytes (rounded up to ``ALIGN``), or None."""
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for i, (off, length) in enumerate(self.free):
            if length >= need:
                if length == need:
                    del self.free[i]
                else:
                    self.free[i] = (off + need, length - need)
                self.used[off] = need
                return off
        return None

    def release(self, offset: int) -> None:
        """Give a range back, merging it with free neighbours."""
        length = self.used.pop(offset)
        free = self.free
        i = 0
        while i < len(free) and free[i][0] < offset:
            i += 1
        free.insert(i, (offset, length))
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
            free[i] = (free[i][0], free[i][1] + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

    @property
    def bytes_free(self) -> int:
        return sum(length for _, length in self.free)


@dataclass
class Carve:
    """One allocation: ``host`` (NumPy, mapped slabs only) and ``device`` views of it."""

    slab: _Slab
    chunk: int
    offset: int
    host: np.ndarray[Any, Any] | None
    device: Any

    def release(self) -> None:
        self.slab.release(self)


class _Slab:
    """Chunks of one kind of memory and their arenas."""

    def __init__(self, kind: str, simulator: bool) -> None:
        self.kind = kind  # "mapped" or "device"
        self.simulator = simulator
        self.chunks: list[tuple[Any, Any, Arena]] = []  # (backing, device view, arena)
        self.lock = threading.Lock()

    def add_chunk(self, nbytes: int) -> None:
        """Allocate one more chunk of ``nbytes`` (hold `lock`; never while GPU actors run:
        allocating may synchronize the device)."""
        if self.simulator:
            backing: Any = np.zeros(nbytes, np.uint8)
            dev: Any = backing
        else:
            cuda: Any = importlib.import_module("numba.cuda")
            if self.kind == "mapped":
                backing = cuda.mapped_array(nbytes, dtype=np.uint8)
                devicearray: Any = importlib.import_module("numba.cuda.cudadrv.devicearray")
                dev = devicearray.DeviceNDArrayBase.view(backing, np.uint8)
            else:
                backing = cuda.device_array(nbytes, dtype=np.uint8)
                dev = backing
        self.chunks.append((backing, dev, Arena(nbytes)))

    def take(self, nbytes: int, dtype: np.dtype[Any], *, may_grow: bool, chunk_bytes: int) -> Carve:
        """``nbytes`` (a whole number of ``dtype`` items) from the first chunk with room."""
        with self.lock:
            for idx, (_, _, arena) in enumerate(self.chunks):
                off = arena.alloc(nbytes)
                if off is not None:
                    return self._carve(idx, off, nbytes, dtype)
            if not may_grow:
                free = sum(a.bytes_free for _, _, a in self.chunks)
                raise CUDAError(
                    f"the GPU {self.kind} memory slab has {free} free bytes, and this actor "
                    f"needs {nbytes} more; it cannot grow while GPU actors run (allocating "
                    "may synchronize the device, which waits for them forever). Reserve more "
                    "before the first GPU actor starts: PYDOTCOMPUTE_GPU_SLAB_MB=<MiB> or "
                    "pydotcompute.ring_kernels.tiers.gpu.reserve_gpu_memory(...)"
                )
            self.add_chunk(max(chunk_bytes, -(-nbytes // ALIGN) * ALIGN))
            off = self.chunks[-1][2].alloc(nbytes)
            assert off is not None
            return self._carve(len(self.chunks) - 1, off, nbytes, dtype)

    def _carve(self, idx: int, off: int, nbytes: int, dtype: np.dtype[Any]) -> Carve:
        backing, dev, _ = self.chunks[idx]
        host: np.ndarray[Any, Any] | None = None
        if self.simulator or self.kind == "mapped":  # host-visible: zero it, keep a view
            raw = np.asarray(backing).view(np.ndarray)[off : off + nbytes]
            raw[...] = 0
            host = raw.view(dtype)
        # device memory is not zeroed here: the state copied in next covers it
        device = host if self.simulator else dev[off : off + nbytes].view(dtype)
        return Carve(self, idx, off, host if self.kind == "mapped" else None, device)

    def release(self, carve: Carve) -> None:
        with self.lock:
            self.chunks[carve.chunk][2].release(carve.offset)

    def stats(self) -> dict[str, int]:
        with self.lock:
            total = sum(a.size for _, _, a in self.chunks)
            free = sum(a.bytes_free for _, _, a in self.chunks)
        return {"chunks": len(self.chunks), "bytes": total, "bytes_free": free}


class MemorySlabs:
    """The process's mapped and device slabs (one pair per simulator mode)."""

    def __init__(self, simulator: bool) -> None:
        self.mapped = _Slab("mapped", simulator)
        self.device = _Slab("device", simulator)

    def reserve(self, mapped_bytes: int, device_bytes: int) -> None:
        """Grow each slab so at least this much is free (call before GPU actors run)."""
        for slab, want in ((self.mapped, mapped_bytes), (self.device, device_bytes)):
            have = slab.stats()["bytes_free"]
            if want > have:
                with slab.lock:
                    slab.add_chunk(-(-(want - have) // ALIGN) * ALIGN)

    def stats(self) -> dict[str, dict[str, int]]:
        return {"mapped": self.mapped.stats(), "device": self.device.stats()}
