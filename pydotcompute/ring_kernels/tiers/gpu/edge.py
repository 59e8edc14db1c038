"""Device-ring edges: GPU -> GPU on one device, without the host on the data path.

A ``device-ring`` edge is a ring of fixed-layout records in device memory that the
producing kernel's persistent loop writes its replies into and the consuming kernel's loop
polls beside its inbox ring (``device.py``). Its header (head, tail and counters) sits in
mapped memory, so the runtime reads the counters with plain loads while both kernels run:
no driver call, no event-loop hop, nothing per message on the host.

```text
 host: runtime.send ─► inbox ring a ─► kernel a ─► edge slots (device memory) ─► kernel b
                                          │  tail (release)      head (release) │
                                          └──► edge header (mapped memory) ◄────┘
                                                     ▲ counters read by the runtime
```

Where the memory comes from: a persistent kernel's arguments are fixed at launch, and
memory may not be allocated while kernels run (``slab.py``), so every GPU actor of a device
is launched with the same *edge arena*: ``EDGE_ARENA_BYTES`` of device memory for slots
and ``EDGE_SLOTS`` headers of mapped memory, carved from the slabs when the device's first
GPU actor starts. An edge takes a range of it when its producer is first routed into it
and gives it back when it is closed; an edge that does not fit keeps the loop path (its
``why`` says so).

How the host changes an edge (`GPUWorker.route_into`, `GPUWorker.stop`): it writes the
edge's parameters into a kernel's control block, then ``EDGE_ROUTE``, and waits for the
kernel's ``EDGE_ROUTE_ACK`` (read between batches and every 16th idle poll), so a route
turns on or off between two batches, never inside one. The consumer's kernel reads the
edge from its first batch after the ack; the producer writes into it from its first batch
after its own ack. Closing (the consumer stopped): the producer's route is turned off and
acknowledged first, so whatever the host then reads back between head and tail is final.

Design notes:
- One edge into a GPU kernel at a time (one input beside its inbox) and one out of it
  (``connect`` has one target): each kernel polls at most one more word per poll.
- No bands: the GPU's rings are FIFO (a record's priority rides in its header), so an
  edge delivers in the order its producer handled the messages; between the inbox and the
  edge the consumer takes turns, a batch (up to ``layout.BATCH`` records) each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import layout as L
from .slab import Arena, Carve, MemorySlabs, default_chunk_bytes

__all__ = ("EDGE_ARENA_BYTES", "EDGE_SLOTS", "DeviceEdge", "EdgeArena", "edge_arena")

#: Device memory for the slots of every device-ring edge of one device.
EDGE_ARENA_BYTES = 4 << 20
#: How many device-ring edges one device can hold at a time (their headers).
EDGE_SLOTS = 64

_arenas: dict[tuple[bool, int], EdgeArena] = {}
_arenas_lock = threading.Lock()


class EdgeArena:
    """One device's edge memory: slot bytes (device memory) and headers (mapped memory).

    Args:
        data: The slot bytes, as the kernel gets them (a device array; NumPy simulated).
        hdr_host, hdr_device: The header words: the host's and the kernel's views.
        carves: The slab carves that hold them (kept for the life of the process).
    """

    def __init__(self, data: Any, hdr_host: np.ndarray[Any, Any], hdr_device: Any) -> None:
        self.data = data
        self.hdr = hdr_host
        self.hdr_device = hdr_device
        self._bytes = Arena(len(data))
        self._slots = list(range(EDGE_SLOTS - 1, -1, -1))
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[int, int] | None:
        """A free range of ``nbytes`` and a free header (offset, header index), or None."""
        with self._lock:
            if not self._slots:
                return None
            off = self._bytes.alloc(nbytes)
            if off is None:
                return None
            hdr = self._slots.pop() * L.EDGE_WORDS
            self.hdr[hdr : hdr + L.EDGE_WORDS] = 0
            return off, hdr

    def give(self, offset: int, hdr: int) -> None:
        """Give a range and its header back (both kernels are done with them)."""
        with self._lock:
            self._bytes.release(offset)
            self._slots.append(hdr // L.EDGE_WORDS)

    def read(self, offset: int, nbytes: int) -> np.ndarray[Any, Any]:
        """A host copy of ``nbytes`` slot bytes (a device-to-host copy on a GPU: made
        once, when an edge is closed)."""
        view = self.data[offset : offset + nbytes]
        if isinstance(view, np.ndarray):
            return np.array(view, copy=True)
        return view.copy_to_host()  # type: ignore[no-any-return]


def edge_arena(device_id: int, slabs: MemorySlabs, *, may_grow: bool) -> EdgeArena | None:
    """The edge arena of ``device_id`` (made from ``slabs`` on first use), or None when
    the slabs have no room for it and may not grow (GPU actors run)."""
    key = (slabs.mapped.simulator, device_id)
    with _arenas_lock:
        arena = _arenas.get(key)
        if arena is not None:
            return arena
        carves: list[Carve] = []
        try:
            chunk = default_chunk_bytes()
            data = slabs.device.take(
                EDGE_ARENA_BYTES, np.dtype(np.uint8), may_grow=may_grow, chunk_bytes=chunk
            )
            carves.append(data)
            words = EDGE_SLOTS * L.EDGE_WORDS
            hdr = slabs.mapped.take(
                words * 8, np.dtype(np.int64), may_grow=may_grow, chunk_bytes=chunk
            )
            carves.append(hdr)
        except Exception:  # no room: GPU actors of this device run without edges
            for c in carves:
                c.release()
            return None
        assert hdr.host is not None
        arena = _arenas[key] = EdgeArena(data.device, hdr.host, hdr.device)
        return arena


class DeviceEdge:
    """One ``device-ring`` edge: its place in the arena, its counters and its read-back.

    Made by the consumer's `GPUWorker.open_edge`; takes its memory when its producer is
    first routed into it (`place`); closed when its consumer stops (`read_back`).

    Args:
        consumer: The consuming `GPUWorker`.
        source_id: The producing kernel's id.
        capacity: Slots (the consumer's ring size).
        dtype: The record layout (the consumer's input layout).
        decode: Records -> message objects (the input class's ``from_records``).
    """

    kind = "device-ring"

    def __init__(
        self,
        consumer: Any,
        source_id: str,
        capacity: int,
        dtype: np.dtype[Any],
        decode: Callable[[np.ndarray[Any, Any]], list[Any]],
    ) -> None:
        self.consumer = consumer
        self.source_id = source_id
        self.capacity = capacity
        self.dtype = dtype
        self._decode = decode
        self.arena: EdgeArena | None = None
        self.base = 0
        self.hdr = 0
        self.producer: Any = None  # the GPUWorker routed into it now
        self.closed = False
        self._final: dict[str, int] | None = None

    def __repr__(self) -> str:
        return f"<DeviceEdge {self.source_id!r} -> {self.consumer!r} {self.counters()}>"

    @property
    def placed(self) -> bool:
        return self.arena is not None

    def place(self, arena: EdgeArena) -> bool:
        """Take a range of ``arena`` (first routing); False when it has no room."""
        if self.arena is not None:
            return True
        got = arena.take(self.capacity * self.dtype.itemsize)
        if got is None:
            return False
        self.base, self.hdr = got
        self.arena = arena
        return True

    def word(self, index: int) -> int:
        """One header word (``layout.EH_*``), read live from mapped memory."""
        arena = self.arena
        return 0 if arena is None else int(arena.hdr[self.hdr + index])

    @property
    def depth(self) -> int:
        """Records in the edge now (published, not taken, not handed back)."""
        if self._final is not None or self.arena is None:
            return 0
        return self.word(L.EH_TAIL) - self.word(L.EH_HEAD) - self.word(L.EH_HANDED)

    def counters(self) -> dict[str, int]:
        """``accepted``, ``taken``, ``evicted``, ``rejected``, ``handed_back``, ``lost``,
        ``depth``, ``capacity`` and ``full_events`` (times the producer waited for room),
        read from the header without the loop on the data path."""
        if self._final is not None:
            return dict(self._final)
        accepted, taken = self.word(L.EH_TAIL), self.word(L.EH_HEAD)
        handed = self.word(L.EH_HANDED)
        return {
            "accepted": accepted,
            "taken": taken,
            "evicted": 0,
            "rejected": 0,
            "handed_back": handed,
            "lost": 0,
            "depth": max(0, accepted - taken - handed),
            "capacity": self.capacity,
            "full_events": self.word(L.EH_FULL),
        }

    def read_back(self) -> list[Any]:
        """Close the edge (no kernel writes or reads it any more: the caller made sure)
        and return what it still holds, decoded, oldest first; once."""
        if self.closed:
            return []
        self.closed = True
        arena = self.arena
        if arena is None:
            self._final = self.counters()
            return []
        head, tail = self.word(L.EH_HEAD), self.word(L.EH_TAIL)
        n = tail - head
        out: list[Any] = []
        if n > 0:
            isz = self.dtype.itemsize
            raw = arena.read(self.base, self.capacity * isz).view(self.dtype)
            idx = [(head + k) % self.capacity for k in range(n)]
            out = self._decode(raw[idx])
            arena.hdr[self.hdr + L.EH_HANDED] = n
        arena.hdr[self.hdr + L.EH_CLOSED] = 1
        self._final = self.counters()
        self.arena = None
        arena.give(self.base, self.hdr)
        return out
