"""A process actor's direct edges, inside its child process.

`setup` runs in the child before the actor (`ChildSpec.setup`): it installs the handler
of `EDGE_SIGNAL`, which the runtime's process sends whenever this child's edges change
(it wrote them into the `ControlBlock` first). The handler only marks the change and
turns the context into an `EdgeProcessKernelContext` (a ``__class__`` swap; a traced
context becomes `TracedEdgeProcessKernelContext`); its next ``receive`` or ``send``
applies it (`ChildEdges.apply`).
That context reads its inbox ring and each incoming edge by turns, each edge highest band
first, and sends into its outgoing edge, or its outbox where the edge cannot take the
record (not yet live, or closed): the loop path.

Design notes:
- A signal, not a check per message: a context without edges pays nothing, and the
  ``__class__`` swap gives the next call the edge-aware methods. The handler runs between
  two bytecodes of the actor's thread and touches no ring: a ``receive`` or ``send`` in
  progress finishes on the methods it started with. A receive parked on its inbox alone
  sees the change with its next message, which the producer sends on the loop path until
  the edge is live (this context marks it so once it has attached it). Edges named before
  the child started are attached, and live, before its actor runs.
- By turns: the inbox (fed by the runtime's bridge) and each edge take turns, so a
  message waits behind at most one message of each other input per turn.
- The record in the actor's hands is *finished* when it asks for its next message or
  answers it (a send that succeeded: the edge's ``finished`` count, as the inbox's
  ``mark_done``); if the actor raises before either, the
  record is reported back on the status pipe (``["left", base, record]``) and handed
  back by the runtime; if the process dies, the runtime counts it ``lost``.
"""

from __future__ import annotations

import contextlib
import select
import signal
import time
from typing import Any

import msgspec

from ....exceptions import InvalidConfigurationError
from ..._native.spsc_py import SharedSegment
from ...message import RingKernelMessage, stamp_reply
from .child import (
    FLUSH_EVERY,
    REJECTED,
    ChildSpec,
    ProcessKernelContext,
    TracedProcessKernelContext,
)
from .edge import EdgeReader, EdgeWriter, band_of
from .framing import pack_report, too_large
from .waiting import SLICE_S, WRITE_OK, drain_bell

__all__ = (
    "EDGE_SIGNAL",
    "ChildEdges",
    "ControlBlock",
    "EdgeProcessKernelContext",
    "TracedEdgeProcessKernelContext",
    "setup",
)

#: The signal the runtime's process sends a child whose edges changed.
EDGE_SIGNAL = signal.SIGUSR1
_monotonic = time.monotonic
_perf = time.perf_counter


class ControlBlock:
    """Which edges a child's actor reads and writes, told by the runtime's process: a
    small shared segment holding a MessagePack blob under a sequence lock (odd while
    written). The child reads it when signalled (see the module notes).

    Args:
        name: The segment's name.
        create: The runtime's side creates it; the child attaches.
    """

    SIZE = 1 << 16
    _DATA = 64

    def __init__(self, name: str, *, create: bool) -> None:
        self._seg = SharedSegment(name, self.SIZE if create else 0, create=create)
        self._q = self._seg.buf[: self._DATA].cast("Q")

    @property
    def name(self) -> str:
        return self._seg.name

    def write(self, value: Any) -> None:
        """Publish ``value`` (one writer)."""
        blob = msgspec.msgpack.encode(value)
        if len(blob) > self.SIZE - self._DATA:
            raise InvalidConfigurationError(
                f"too many edges for one kernel: their description takes {len(blob)} "
                f"bytes, at most {self.SIZE - self._DATA} fit"
            )
        q = self._q
        q[0] += 1  # odd: being written
        self._seg.buf[self._DATA : self._DATA + len(blob)] = blob
        q[1] = len(blob)
        q[0] += 1

    def read(self) -> tuple[int, Any]:
        """``(sequence, value)``; ``(0, None)`` when nothing was written yet."""
        q = self._q
        while True:
            seq = q[0]
            if seq & 1:
                time.sleep(0)
                continue
            n = q[1]
            blob = bytes(self._seg.buf[self._DATA : self._DATA + n]) if seq else b""
            if q[0] == seq:
                return seq, (msgspec.msgpack.decode(blob) if blob else None)

    def close(self, unlink: bool = False) -> None:
        """Unmap (and with ``unlink`` remove the name); idempotent."""
        if self._q is not None:
            self._q.release()
            self._q = None  # type: ignore[assignment]
            if unlink:
                self._seg.unlink()
            self._seg.close()


class ChildEdges:
    """The edges of one child's actor: read from the `ControlBlock` when told to."""

    __slots__ = (
        "_bell_fd",
        "_ctl",
        "_ctl_name",
        "_hand",
        "_hand_data",
        "_poller",
        "_seq",
        "_spin_s",
        "_turn",
        "_turn_out",
        "_writers",
        "paused",
        "pending",
        "readers",
        "writer",
    )

    def __init__(self, ctl_name: str, bell_fd: int, spin_s: float) -> None:
        self._ctl_name = ctl_name
        self._ctl: ControlBlock | None = None
        self._seq = 0
        self._spin_s = spin_s
        self._bell_fd = bell_fd
        self._poller = select.poll()
        self._poller.register(bell_fd, select.POLLIN)
        self._turn = 0
        self._hand: EdgeReader | None = None  # where the record in the actor's hands came from
        self._hand_data: bytes | None = None
        #: True when the runtime changed the edges since they were last applied
        self.pending = False
        self.paused = False  # the kernel is deactivated: its edges are not read
        self.readers: tuple[EdgeReader, ...] = ()
        self.writer: EdgeWriter | None = None
        # into a pool: one writer per replica edge, spread over by `pick` (round robin,
        # skipping a full one; `pool_edges.Spread` is the same rule in-process)
        self._writers: tuple[EdgeWriter, ...] = ()
        self._turn_out = 0

    def apply(self) -> None:
        """Attach what the control block names and is not attached yet (this actor's
        thread). An edge closed meanwhile (its names gone) is skipped."""
        self.pending = False
        ctl = self._ctl
        if ctl is None:
            try:
                ctl = self._ctl = ControlBlock(self._ctl_name, create=False)
            except FileNotFoundError:
                return
        seq, value = ctl.read()
        if seq == self._seq or value is None:
            return
        self._seq = seq
        ins, out, paused = value
        have = {r.base for r in self.readers}
        added = []
        for spec in ins:
            if spec[0] in have:
                continue
            try:
                reader = EdgeReader(tuple(spec))  # type: ignore[arg-type]
            except FileNotFoundError:
                continue
            reader.mark_live()
            self._poller.register(reader.data_fd, select.POLLIN)
            added.append(reader)
        self.readers = (*self.readers, *added)
        # ``out``: one edge's spec, or a list of specs (the edges into a pool's replicas)
        specs = [] if out is None else [out] if isinstance(out[0], str) else list(out)
        old = {w.base: w for w in (self._writers or ((self.writer,) if self.writer else ()))}
        writers: list[EdgeWriter] = []
        for spec in specs:
            w = old.pop(spec[0], None)
            if w is None:
                with contextlib.suppress(FileNotFoundError):
                    w = EdgeWriter(tuple(spec), self._spin_s)  # type: ignore[arg-type]
            if w is not None:
                writers.append(w)
        for w in old.values():
            w.detach()
        self.writer = writers[0] if writers else None
        self._writers = tuple(writers) if len(writers) > 1 else ()
        self._turn_out = 0
        self.paused = bool(paused)

    def pick(self) -> EdgeWriter | None:
        """The writer the next send goes to: the one edge, or (into a pool) the next
        replica edge in turn with room or not live yet, else the first full one in turn
        (its policy acts), else the one in turn (closed: the loop path)."""
        writers = self._writers
        if not writers:
            return self.writer
        n = len(writers)
        start = self._turn_out
        full = -1
        pick = -1
        for k in range(n):
            i = (start + k) % n
            state = writers[i].state()
            if state in (0, 2):  # room, or not live yet (its put takes the loop path)
                pick = i
                break
            if state == 1 and full < 0:
                full = i
        if pick < 0:
            pick = full if full >= 0 else start
        self._turn_out = (pick + 1) % n
        return writers[pick]

    def finish(self) -> None:
        """The actor asked for its next message: the edge record it held is finished."""
        hand = self._hand
        if hand is not None:
            self._hand = self._hand_data = None
            hand.finish()

    def hold(self, reader: EdgeReader | None, data: bytes) -> None:
        """The actor took ``data`` from ``reader`` (None: from the inbox)."""
        self._hand = reader
        self._hand_data = None if reader is None else data

    def report_hand(self, status: Any) -> None:
        """The actor raised: report the edge record in its hands back to the runtime."""
        hand, data = self._hand, self._hand_data
        if hand is not None and data is not None:
            self._hand = self._hand_data = None
            status.send_bytes(pack_report("left", hand.base, data))

    def poll(self, ring: Any, wake: int) -> tuple[EdgeReader | None, bytes | None]:
        """One record by turns: ``(its edge or None for the inbox, record)``."""
        readers = () if self.paused else self.readers
        n = len(readers) + 1
        turn = self._turn
        for i in range(n):
            at = (turn + i) % n
            if at == 0:
                data = ring.spin_read(0, wake)
                if data is not None:
                    self._turn = 1 % n
                    return None, data
            else:
                reader = readers[at - 1]
                data = reader.take()
                if data is not None:
                    self._turn = (at + 1) % n
                    return reader, data
        return None, None

    def queued(self) -> bool:
        """True when an edge holds a record."""
        return any(r.readable() for r in self.readers)

    def park(self, ring: Any, remaining: float | None) -> bool:
        """Sleep until the inbox or an edge may have a record, a change, or the slice
        ends; True when the parent hung up."""
        readers = () if self.paused else self.readers
        ring.set_reader_waiting(True)
        for r in readers:
            r.arm(True)
        gone = False
        try:
            if ring.readable() or self.pending or any(r.readable() for r in readers):
                return False
            if remaining is None or remaining > SLICE_S:
                ms = int(SLICE_S * 1000)
            else:
                ms = max(int(remaining * 1000 + 0.999), 0)
            for fd, events in self._poller.poll(ms):
                if fd == self._bell_fd:
                    if events & select.POLLIN:
                        drain_bell(fd)
                    if events & (select.POLLHUP | select.POLLERR):
                        gone = True
                else:
                    drain_bell(fd)
        finally:
            ring.set_reader_waiting(False)
            for r in readers:
                r.arm(False)
        return gone


class EdgeProcessKernelContext(ProcessKernelContext):
    """A `ProcessKernelContext` with direct edges (see the module notes)."""

    __slots__ = ()

    def adopt_edges(self, edges: ChildEdges) -> None:
        """Read and write through ``edges`` from the next call on."""
        self._edges = edges

    @property
    def should_terminate(self) -> bool:
        """True once a stop was requested and the inbox and every edge are drained."""
        if self._gone:
            return True
        ring = self._in
        return bool(ring.writer_closed and not ring.readable() and not self._edges.queued())

    def receive(self, timeout: float | None = None) -> Any:
        """`ProcessKernelContext.receive`, from the inbox and the edges by turns."""
        st: ChildEdges = self._edges
        rec = self._rec
        if rec is not None:
            rec.idle()
            self._timed += 1
            if self._timed >= FLUSH_EVERY:
                self.flush_timing()
        st.finish()
        ring = self._in
        wake = self._in_space_fd
        ring.mark_done(self._out, wake)
        waiter = self._read_waiter
        deadline = None if timeout is None else _monotonic() + timeout
        spin_end = 0.0
        spun = False
        while True:
            if st.pending:  # (a pause, too, takes effect before the next look)
                st.apply()
            reader, data = st.poll(ring, wake)
            if data is not None:
                msg = self._take(data)
                if msg is REJECTED:  # reported back as its message's error: finished
                    if reader is not None:
                        reader.finish()
                    continue
                st.hold(reader, data)
                if spun and waiter.misses:
                    waiter.hit()
                if rec is not None:
                    rec.took()
                return msg
            if self._gone or (ring.writer_closed and not ring.readable() and not st.queued()):
                raise self._closed()
            if timeout is not None:
                remaining: float | None = deadline - _monotonic()  # type: ignore[operator]
                if remaining <= 0:  # type: ignore[operator]
                    return None
            else:
                remaining = None
            if not spun:
                spun = True
                spin_end = _perf() + waiter.spin_s
            if _perf() < spin_end:
                continue
            waiter.miss()
            spin_end = _perf() + waiter.spin_s  # after a wake-up, spin again first
            if rec is not None:
                self.flush_timing()
            if st.park(ring, remaining):
                self._parent_gone(True)

    def receive_nowait(self) -> Any:
        """The next message from the inbox or an edge, or None, without waiting."""
        return self.receive(0)

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """`ProcessKernelContext.send`, into the outgoing edge while there is one that
        takes the record; else (and for what a close left behind) into the outbox."""
        st: ChildEdges = self._edges
        if st.pending:
            st.apply()
        writer = st.pick()
        if writer is None or not writer.usable:
            if super().send(msg, timeout):
                st.finish()  # answered: an edge record in hand is finished
                return True
            return False
        codec = self._codec
        if type(msg) is not codec[0]:  # validate each new type once
            encode = self._encoder_for(msg)
            codec = self._codec = (type(msg), encode, isinstance(msg, RingKernelMessage))
        if codec[2]:
            stamp_reply(msg, self._current)
        data = codec[1](msg)
        try:
            done = writer.put(data, band_of(msg), timeout, self._parent_gone)
        except InvalidConfigurationError:  # the edge's rings can never hold it
            raise too_large(
                self.kernel_id, msg, len(data), writer.max_record_size, "edge"
            ) from None
        if done is not True and done is not False:  # the loop path
            done = all(self._write_out(msg, record, timeout) for record in done)
        if done:
            # answered: the message in hand is finished, from an edge or the inbox (the
            # parent sees no reply in the outbox to tell it so)
            st.finish()
            self._in.mark_done(self._out)
        return done

    def _write_out(self, msg: Any, data: bytes, timeout: float | None) -> bool:
        try:
            result = self._out.try_write(data)
        except InvalidConfigurationError:
            raise too_large(self.kernel_id, msg, len(data), self._out_max, "outbox") from None
        if result == WRITE_OK:
            return True
        return self._write_rest(data, result, timeout)

    def actor_ended(self, status: Any) -> None:
        if status is None:
            self._edges.finish()
        else:
            self._edges.report_hand(status)


class TracedEdgeProcessKernelContext(TracedProcessKernelContext, EdgeProcessKernelContext):
    """An `EdgeProcessKernelContext` under a tracing runtime: the traced context's
    ``receive`` (leaving the previous record's context), ``_take`` (taking a record's
    context) and encoder (prefixing the current one) around the edge-aware methods."""

    __slots__ = ()


def setup(ctx: ProcessKernelContext, spec: ChildSpec) -> None:
    """`ChildSpec.setup`: install `EDGE_SIGNAL`'s handler, and take the edges the
    runtime named before this child started (if any: else the context stays plain)."""
    ctl_name = spec.ctl_name
    if ctl_name is None:
        return
    edges = ChildEdges(ctl_name, spec.in_data.fileno(), spec.spin_s)

    def changed(_signum: int, _frame: Any) -> None:
        edges.pending = True
        if type(ctx) is ProcessKernelContext:
            ctx.__class__ = EdgeProcessKernelContext
            ctx.adopt_edges(edges)  # type: ignore[attr-defined]
        elif type(ctx) is TracedProcessKernelContext:  # (a tracing runtime's)
            ctx.__class__ = TracedEdgeProcessKernelContext
            ctx.adopt_edges(edges)  # type: ignore[attr-defined]

    signal.signal(EDGE_SIGNAL, changed)
    try:  # edges the runtime named before this child started
        ControlBlock(ctl_name, create=False).close()
    except FileNotFoundError:
        return
    changed(EDGE_SIGNAL, None)
    edges.apply()  # live before the actor runs: its first receive reads them
