"""Direct edges through shared memory (kind ``"shm-ring"``): records from one actor to
another without the event loop, between two child processes, or a child and a thread.

One edge is a small header segment and four `SharedByteRing` segments, one per priority
band (SYSTEM, HIGH, NORMAL, LOW), plus two named pipes used as doorbells. The runtime's
process creates them all (`ShmEdge`, kept by the consumer's worker): they outlive either
actor's process, and what is left in them when the consumer stops is read back here and
handed back. The producing end (`EdgeWriter`: a child's ``ctx.send``, or a thread
actor's) writes encoded records, the consuming end (`EdgeReader`) takes them highest
band first. The control plane (`ring_kernels/edges.py`) decides when an edge is made.

Header layout (native ``uint64`` words, one 64-byte line per writer)::

    line 0  magic, capacity, policy                       the runtime, once
    line 1  rejected, claims, returned                    the producer
    line 2  evicted, finished, live                       the consumer
    line 3  closed, collected, handed_back, lost          the runtime, at close

The counters of `edges.EdgeInfo` come from this header and the rings' own counts, so the
runtime reads them from any thread without touching the data path: ``accepted`` is the
records written less ``returned``, ``taken`` the records read less evictions, leftovers
read at close and ``returned``, ``evicted`` is ``claims``.

Design notes:
- One ring per band, not one ring and a reordering buffer in the consumer: a record the
  consumer's actor has not taken never leaves shared memory, so a consumer that dies
  (``kill -9``) loses at most the one record in its actor's hands (counted ``lost``) and
  everything else is handed back. Pages of a band that is never used are never touched.
- The bound counts messages (the consumer's ``queue_size``), the rings only bytes. The
  producer keeps its own count of records written and of evictions claimed, and reads
  the consumer's counts only when its estimate says the edge is full (a cached bound, as
  `ProcessWorker` keeps its hand-over bound).
- ``drop_oldest`` cannot pop a ring from the writing side (single producer, single
  consumer), so the producer *claims* an eviction (``claims``, before it publishes the
  record) and the consumer performs it, oldest record of the lowest band, before its
  next take. ``depth`` (records in the rings less pending evictions) so never exceeds the
  bound, and a claim made while the consumer emptied the edge evicts the next record.
- Closing without a lock across processes: the runtime announces itself as a parked
  reader on every ring, closes them (``close_reader``), reads what is left and then sets
  ``collected``. A producer's write that raced the close sees the flag on its way out
  (``try_write`` returns WRITE_WAKE after publishing, behind a full fence: Dekker's
  argument, as for parking), finds the ring closed, waits for ``collected`` and reads back
  whatever the runtime did not collect (``returned``), to send it on its loop path. So no
  record is ever left in a closed edge, and no write pays a lock.
- ``block``: the producer waits for room on its own doorbell, having raised band 0's
  ``writer_waiting`` flag (free here: edges never pass a ``wake_fd`` to the ring's reads);
  the consumer looks at that flag after each take. The consumer parks with every band's
  ``reader_waiting`` raised, so a write rings its doorbell only while it sleeps.
- Names: the rings and header are unlinked once the edge is closed (a producer that
  attaches later finds none and takes the loop path); the runtime's own mappings stay
  until the edge object goes, so its counters stay readable.
- Length: a little past the house limit on purpose: the layout, both ends and the
  runtime's side share the header words and the close protocol, read best together. The
  child's side is `edge_child`, the parent worker's `edge_worker`, a thread's `edge_local`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

from ....exceptions import InvalidConfigurationError, QueueClosedError
from ..._native import SharedByteRing
from ..._native.spsc_py import SharedSegment
from .waiting import SLICE_S, WRITE_WAKE, drain_bell, ring_bell

__all__ = (
    "BANDS",
    "KIND",
    "POLICIES",
    "EdgeReader",
    "EdgeSpec",
    "EdgeWriter",
    "ShmEdge",
    "band_of",
)

#: the edge kind this module provides (`ring_kernels.edges.EdgeKind`)
KIND = "shm-ring"
BANDS = 4
POLICIES = ("block", "reject", "drop_oldest")
_BLOCK, _REJECT, _DROP_OLDEST = 0, 1, 2
_MAGIC = 0x3145474445434450  # b"PDCEDGE1" little-endian
_HEADER_BYTES = 256
H_MAGIC, H_CAPACITY, H_POLICY = 0, 1, 2
H_REJECTED, H_CLAIMS, H_RETURNED = 8, 9, 10
H_EVICTED, H_FINISHED, H_LIVE = 16, 17, 18
H_CLOSED, H_COLLECTED, H_HANDED_BACK, H_LOST = 24, 25, 26, 27
_COLLECT_WAIT_S = 5.0  # a producer waits this long for the runtime's collection at most
_COUNTER_TRIES = 4  # `counters` reads a consistent pair within this many tries, or reads low
_perf = time.perf_counter

#: What an end needs to attach: ``(base name, data doorbell path, space doorbell path,
#: the edge's name for messages)``; plain data, so it crosses to a child as MessagePack.
EdgeSpec = tuple[str, str, str, str]


def band_of(msg: Any) -> int:
    """0 (SYSTEM) .. 3 (LOW) from ``msg.priority``; NORMAL for anything without one."""
    p = getattr(msg, "priority", 128)
    if type(p) is not int:
        return 2
    return 0 if p >= 224 else 1 if p >= 160 else 2 if p >= 64 else 3


def _new_base() -> str:
    # short: macOS limits POSIX shm names to 31 characters (a ring adds one digit)
    return f"pdce_{os.getpid()}_{secrets.token_hex(4)}"


def _header(segment: SharedSegment) -> memoryview:
    return segment.buf[:_HEADER_BYTES].cast("Q")


class _Mapped:
    """An edge's header and band rings mapped into this process (an end's attachment)."""

    __slots__ = ("_seg", "name", "q", "rings")

    def __init__(self, spec: EdgeSpec) -> None:
        base = spec[0]
        self.name = spec[3]
        self._seg = SharedSegment(base, create=False)  # FileNotFoundError: closed already
        self.q = _header(self._seg)
        if self.q[H_MAGIC] != _MAGIC:
            self.q.release()
            self._seg.close()
            raise InvalidConfigurationError(f"segment {base!r} is not a pydotcompute edge")
        rings: list[Any] = []
        try:
            rings.extend(SharedByteRing.attach(f"{base}{i}") for i in range(BANDS))
        except BaseException:
            for ring in rings:
                ring.close()
            self.q.release()
            self._seg.close()
            raise
        self.rings: tuple[Any, ...] = tuple(rings)

    def detach(self) -> None:
        """Unmap this end (idempotent)."""
        if self.rings:
            for ring in self.rings:
                ring.close()
            self.rings = ()
            self.q.release()
            self._seg.close()


def _open_fifo(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


class EdgeReader:
    """The consuming end of one edge, in the consumer's process (a child, or the thread
    of a thread actor). One thread takes from it.

    Args:
        spec: The edge's `EdgeSpec` (`ShmEdge.spec`).

    Raises:
        FileNotFoundError: the edge was closed and its names are gone.
    """

    __slots__ = (
        "_evicted",
        "_evicting",
        "_m",
        "_rings",
        "_space_fd",
        "_taken",
        "base",
        "capacity",
        "data_fd",
        "name",
    )

    def __init__(self, spec: EdgeSpec) -> None:
        self._m = m = _Mapped(spec)
        q = m.q
        self.base = spec[0]
        self.name = spec[3]
        self.capacity = int(q[H_CAPACITY])
        self._evicting = q[H_POLICY] == _DROP_OLDEST
        self._rings = m.rings
        self._evicted = int(q[H_EVICTED])
        self._taken = int(q[H_FINISHED])
        self.data_fd = _open_fifo(spec[1], os.O_RDONLY)  # this end sleeps on it
        self._space_fd = _open_fifo(spec[2], os.O_WRONLY)  # rung for a producer waiting

    def mark_live(self) -> None:
        """Let the producer write into the edge (this end reads it from now on)."""
        self._m.q[H_LIVE] = 1

    def take(self) -> bytes | None:
        """The oldest record of the highest band, or None; claimed evictions first."""
        if self._evicting:
            self._evict()
        for ring in self._rings:
            data: bytes | None = ring.try_read()
            if data is not None:
                self._taken += 1
                if self._rings[0].writer_waiting:
                    ring_bell(self._space_fd)
                return data
        return None

    def _evict(self) -> None:
        """Drop the oldest record of the lowest band once per eviction the producer
        claimed (``drop_oldest``); one claimed while the edge was empty waits."""
        q = self._m.q
        claims = q[H_CLAIMS]
        done = self._evicted
        while done < claims:
            for ring in reversed(self._rings):
                if ring.try_read() is not None:
                    done += 1
                    break
            else:
                break
        if done != self._evicted:
            self._evicted = done
            q[H_EVICTED] = done
            if self._rings[0].writer_waiting:
                ring_bell(self._space_fd)

    def finish(self) -> None:
        """Every record taken so far is finished with (its actor asked for the next)."""
        self._m.q[H_FINISHED] = self._taken

    def arm(self, waiting: bool) -> None:
        """Announce (or withdraw) that this end sleeps: writes then ring `data_fd`."""
        for ring in self._rings:
            ring.set_reader_waiting(waiting)

    def readable(self) -> bool:
        """True when a record waits (evictions not counted)."""
        return any(ring.readable() for ring in self._rings)

    def drain_bell(self) -> None:
        """Empty the doorbell after waking on it."""
        drain_bell(self.data_fd)

    def detach(self) -> None:
        """Unmap this end and close its doorbells (idempotent)."""
        if self.data_fd >= 0:
            os.close(self.data_fd)
            os.close(self._space_fd)
            self.data_fd = self._space_fd = -1
            self._m.detach()
            self._rings = ()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.detach()


class EdgeWriter:
    """The producing end of one edge, in the producer's process. One thread writes.

    Args:
        spec: The edge's `EdgeSpec`.
        spin_s: How long a full edge is polled before the writer parks (``block``).

    Raises:
        FileNotFoundError: the edge was closed and its names are gone.
    """

    __slots__ = (
        "_claims",
        "_closed",
        "_data_fd",
        "_live",
        "_m",
        "_out",
        "_poller",
        "_rings",
        "_space_fd",
        "_spin_s",
        "_written",
        "base",
        "capacity",
        "max_record_size",
        "name",
        "policy",
    )

    def __init__(self, spec: EdgeSpec, spin_s: float = 50e-6) -> None:
        self._m = m = _Mapped(spec)
        q = m.q
        self.base = spec[0]
        self.name = spec[3]
        self.capacity = int(q[H_CAPACITY])
        self.policy = int(q[H_POLICY])
        self._rings = m.rings
        self.max_record_size = min(r.max_record_size for r in m.rings)
        self._written = sum(r.records_written for r in m.rings) - int(q[H_RETURNED])
        self._claims = int(q[H_CLAIMS])
        self._out = self._consumed()
        self._live = bool(q[H_LIVE])
        self._closed = bool(q[H_CLOSED])
        self._spin_s = spin_s
        self._data_fd = _open_fifo(spec[1], os.O_WRONLY)  # rung for a sleeping consumer
        self._space_fd = _open_fifo(spec[2], os.O_RDONLY)  # this end sleeps on it
        self._poller = select.poll()
        self._poller.register(self._space_fd, select.POLLIN)

    @property
    def usable(self) -> bool:
        """False once the edge is known closed: sends take the loop path."""
        return not self._closed

    def state(self) -> int:
        """0: room for a record; 1: full (a put applies the policy); 2: not live yet;
        3: closed (a put returns the record for the loop path). The values are
        `pool_edges.ROOM` .. ``CLOSED``: a spread over a pool's replica edges picks by it."""
        if self._closed or self._rings[0].reader_closed:
            return 3
        if not self._live:
            if not self._m.q[H_LIVE]:
                return 2
            self._live = True
        return 1 if self._full() else 0

    def _consumed(self) -> int:
        """Records the consumer took or evicted (evictions are claimed already)."""
        read = int(sum(r.records_read for r in self._rings))
        return read - int(self._m.q[H_EVICTED])

    def _full(self) -> bool:
        if self._written - self._claims - self._out < self.capacity:
            return False
        self._out = self._consumed()
        return bool(self._written - self._claims - self._out >= self.capacity)

    def put(
        self,
        data: bytes,
        band: int,
        timeout: float | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> bool | list[bytes]:
        """Write one record under the consumer's bound and policy.

        Returns:
            True: written, or refused and counted (``reject``); False: ``block`` and
            ``timeout`` passed with the edge full (nothing written); a list: the edge
            cannot take it (not live yet, or closed): these records, ``data`` or what a
            close left behind, are the caller's to send on its loop path, in order.

        Raises:
            InvalidConfigurationError: ``data`` can never fit the edge's rings.
        """
        if not self._live:
            if not self._m.q[H_LIVE]:
                return [data]  # the consumer has not looked at it yet: the loop wakes it
            self._live = True
        if self._closed:
            return [data]
        ring = self._rings[band]
        deadline: float | None = None
        while True:
            if self._full():
                policy = self.policy
                if policy == _REJECT:
                    self._m.q[H_REJECTED] += 1
                    return True
                if policy == _DROP_OLDEST and ring.writable(len(data)):
                    self._claims += 1
                    self._m.q[H_CLAIMS] = self._claims  # before the record: see the notes
                else:
                    if deadline is None and timeout is not None:
                        deadline = _perf() + timeout
                    waited = self._wait_room(deadline, gone)
                    if waited is not None:
                        return [data] if waited else False
                    continue
            try:
                result = ring.try_write(data)
            except QueueClosedError:  # closed before this write began
                self._closed = True
                return [data]
            if not result:  # out of bytes, not of messages
                if self.policy == _REJECT:
                    self._m.q[H_REJECTED] += 1
                    return True
                if deadline is None and timeout is not None:
                    deadline = _perf() + timeout
                waited = self._wait_room(deadline, gone, band, len(data))
                if waited is not None:
                    return [data] if waited else False
                continue
            self._written += 1
            if result == WRITE_WAKE:
                if ring.reader_closed:  # a close raced this write: see the notes
                    return self._read_back()
                ring_bell(self._data_fd)
            return True

    def _wait_room(
        self,
        deadline: float | None,
        gone: Callable[[], bool] | None,
        band: int = -1,
        size: int = 0,
    ) -> bool | None:
        """Wait until the edge has room (None), is closed (True) or ``deadline`` passed
        (False): spin, then sleep on the space doorbell with band 0's flag raised."""

        def room() -> bool:
            if band >= 0:
                return bool(self._rings[band].writable(size))
            return not self._full()

        flag = self._rings[0]
        spin_end = _perf() + self._spin_s
        while True:
            if flag.reader_closed:
                self._closed = True
                return True
            if room():
                return None
            now = _perf()
            if deadline is not None and now >= deadline:
                return False
            if now < spin_end:
                continue
            if gone is not None and gone():
                self._closed = True
                return True
            flag.set_writer_waiting(True)
            try:
                if room() or flag.reader_closed:
                    continue
                remaining = SLICE_S if deadline is None else min(SLICE_S, deadline - now)
                for _fd, events in self._poller.poll(max(int(remaining * 1000 + 0.999), 0)):
                    drain_bell(self._space_fd)
                    if events & (select.POLLHUP | select.POLLERR):
                        self._closed = True
                        return True
            finally:
                flag.set_writer_waiting(False)

    def _read_back(self) -> list[bytes]:
        """The edge was closed under a write: once the runtime has collected, read back
        what it left (this end is the rings' only reader from then on)."""
        self._closed = True
        q = self._m.q
        end = _perf() + _COLLECT_WAIT_S
        while not q[H_COLLECTED] and _perf() < end:
            time.sleep(0.0005)
        if not q[H_COLLECTED]:
            return []  # the runtime is gone: nothing can be delivered anyway
        back: list[bytes] = []
        for ring in self._rings:
            back += ring.read_all()
        if back:
            q[H_RETURNED] = int(q[H_RETURNED]) + len(back)
        return back

    def detach(self) -> None:
        """Unmap this end and close its doorbells (idempotent)."""
        if self._data_fd >= 0:
            self._poller.unregister(self._space_fd)
            os.close(self._data_fd)
            os.close(self._space_fd)
            self._data_fd = self._space_fd = -1
            self._m.detach()
            self._rings = ()
            self._closed = True

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.detach()


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class ShmEdge:
    """One ``shm-ring`` edge as the runtime's process owns it: it creates the segments
    and doorbells, reads the counters, and collects what is left at close.

    Args:
        source_id: The producing kernel.
        target_id: The consuming kernel.
        capacity: The consumer's ``queue_size`` (messages).
        policy: The consumer's backpressure: ``block``, ``reject`` or ``drop_oldest``.
        ring_bytes: Each band ring's capacity in bytes (the largest record is 8 less).
    """

    kind = KIND

    def __init__(
        self, source_id: str, target_id: str, *, capacity: int, policy: str, ring_bytes: int
    ) -> None:
        self.name = f"edge {source_id!r} -> {target_id!r}"
        self.capacity = max(1, int(capacity))
        base = _new_base()
        self._closed = False
        self._lost = 0
        self._seg = SharedSegment(base, _HEADER_BYTES)
        self._rings: list[Any] = []
        self._dir = tempfile.mkdtemp(prefix="pdc_edge_")
        self._fds: list[int] = []
        try:
            q = self._q = _header(self._seg)
            q[H_CAPACITY] = self.capacity
            q[H_POLICY] = POLICIES.index(policy) if policy in POLICIES else _BLOCK
            for i in range(BANDS):
                self._rings.append(SharedByteRing(ring_bytes, name=f"{base}{i}"))
            paths = []
            for doorbell in ("data", "space"):
                path = os.path.join(self._dir, doorbell)
                os.mkfifo(path, 0o600)
                # held open both ways: an end's open never blocks or fails, its writes
                # never break, whoever comes and goes
                self._fds.append(_open_fifo(path, os.O_RDWR))
                paths.append(path)
            q[H_MAGIC] = _MAGIC
        except BaseException:
            self._release()
            raise
        self.spec: EdgeSpec = (base, paths[0], paths[1], self.name)
        self._finalizer = weakref.finalize(self, _remove, self._dir)

    @property
    def closed(self) -> bool:
        """True once the consumer stopped: the producer's sends take the loop path."""
        return self._closed

    def counters(self) -> dict[str, int]:
        """The edge's counters (see `edges.EdgeInfo`), read from any thread."""
        q = self._q
        if not self._rings:
            return dict(self._final)
        rings = self._rings
        # the consumer's count, the producer's, then the consumer's again: when the two
        # consumer reads agree, the depth below is one the edge had at the moment the
        # producer's count was read (read once each, a take and a write between them
        # would show one record more than the edge ever held)
        read = sum(r.records_read for r in rings)
        for _ in range(_COUNTER_TRIES):
            evicted_done = int(q[H_EVICTED])
            back = int(q[H_HANDED_BACK])
            returned = int(q[H_RETURNED])
            written = sum(r.records_written for r in rings)
            claims = int(q[H_CLAIMS])
            again = sum(r.records_read for r in rings)
            if again == read:
                break
            read = again  # (busy edge: a later pair, or at worst a depth read low)
        accepted = written - returned
        taken = read - evicted_done - back - returned
        return {
            "accepted": accepted,
            "taken": taken,
            "evicted": claims,
            "rejected": int(q[H_REJECTED]),
            "handed_back": back,
            "lost": int(q[H_LOST]),
            "depth": max(accepted - taken - claims - back, 0),
            "capacity": self.capacity,
        }

    def unfinished(self) -> int:
        """Records the consumer took and did not finish (0 or 1: the one in its actor's
        hands), before `close`; meaningful once the consumer's process has ended."""
        q = self._q
        if not self._rings:
            return 0
        read = int(sum(r.records_read for r in self._rings))
        return max(0, read - int(q[H_EVICTED]) - int(q[H_FINISHED]))

    def close(self, lost: int = 0) -> list[bytes]:
        """Nobody reads the edge any more (its consumer stopped): refuse further writes
        and return what is left, highest band first, each record once (counted
        ``handed_back``); ``lost`` records the consumer took with it are counted too.
        Idempotent (later calls return ``[]``). The caller makes sure no consumer reads."""
        if self._closed or not self._rings:
            return []
        self._closed = True
        q = self._q
        q[H_CLOSED] = 1
        for ring in self._rings:
            ring.set_reader_waiting(True)  # a racing write sees it: see the notes
            ring.close_reader()
        left: list[bytes] = []
        for ring in self._rings:
            left += ring.read_all()
        q[H_HANDED_BACK] = int(q[H_HANDED_BACK]) + len(left)
        q[H_LOST] = int(q[H_LOST]) + lost
        q[H_COLLECTED] = 1
        ring_bell(self._fds[1])  # a producer waiting for room sees the close
        with contextlib.suppress(OSError):
            self._seg.unlink()
        for ring in self._rings:
            with contextlib.suppress(OSError):
                ring.unlink()
        self._finalizer()  # the doorbells' names (the open ones live on)
        return left

    _final: dict[str, int]

    def release(self) -> None:
        """Unmap the edge here and close its doorbells, keeping the last counters
        (idempotent). Nothing may use the edge in this process afterwards."""
        if self._rings:
            self._final = self.counters()
            self._release()

    def _release(self) -> None:
        for ring in self._rings:
            with contextlib.suppress(OSError):
                ring.unlink()
            ring.close()
        self._rings = []
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        q = getattr(self, "_q", None)
        if q is not None:
            q.release()
        with contextlib.suppress(OSError):
            self._seg.unlink()
        self._seg.close()
        _remove(self._dir)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<ShmEdge {self.name}{state}>"
