"""The child process of the process tier: its entry point and the actor's context.

This is the code a ``spawn`` (or ``forkserver``) child imports to run an actor, so it
imports only the wire (`framing`), the waiting helpers (`waiting`) and the rings, never
the parent side. ``multiprocessing`` pickles `child_main` and `ChildSpec` by reference:
their import path, ``pydotcompute.ring_kernels.tiers.process.child``, must import in a
fresh interpreter. See `worker` for the design (transport, parking, liveness, shutdown).

Design notes:
- The two blocking receives (the child's here, the parent's in `worker`) inline
  `read_wait`'s spin and call `read_parked` on a miss: a call per message is 5 % of a trip.
- Nothing the child reports is a pickle: the status pipe carries MessagePack lists, and
  an exception in the actor crosses as plain data (`framing.exception_data`).
- Trace context: a child of a tracing runtime (`ChildSpec.traced`) builds its actor a
  `TracedProcessKernelContext` from the start (opentelemetry is imported then), which
  attaches each ``0xC1 'T'`` record's context while the actor handles it and prefixes
  what the actor sends with the current one. An untraced child builds the plain context:
  it imports nothing more and checks nothing more per message; no context changes class.
  A context with direct edges becomes its traced edge form
  (`edge_child.TracedEdgeProcessKernelContext`): the records of its edges carry the
  header too, and nothing else about them changes.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ....exceptions import (
    InvalidConfigurationError,
    MessageDeserializationError,
    QueueClosedError,
)
from ... import _native
from ..._native import SharedByteRing
from ..._native.spsc_py import SharedSegment
from ...message import RingKernelMessage, message_decoder, stamp_reply
from ...telemetry import LatencyRecorder, SharedLatencyBlock
from .framing import (
    FRAME_TAG,
    TRACE_FRAME,
    decode_value,
    encoder_for,
    error_frame,
    exception_data,
    frame_id,
    no_encoder,
    pack_report,
    split_trace,
    too_large,
    trace_header,
)
from .waiting import (
    SLICE_S,
    WRITE_OK,
    WRITE_WAKE,
    Waiter,
    read_parked,
    read_wait,
    ring_bell,
    write_wait,
)

__all__ = ("ChildSpec", "ProcessKernelContext", "TracedProcessKernelContext", "child_main")

FLUSH_EVERY = 256  # a timing child hands its latencies over at least this often (messages)
_REJECTED = object()  # `_take`: the record was reported back, read the next one
REJECTED = _REJECTED  # (under its public name, for the direct edges' context)
_monotonic = time.monotonic


@dataclass
class ChildSpec:
    """Everything the child needs; pickled into it by multiprocessing."""

    kernel_id: str
    func: bytes
    output_type: type | None
    check_fields: bool  # ``ctx.send`` checks field values (`framing.encoder_for`)
    in_name: str
    out_name: str
    spin_s: float
    adaptive: bool
    in_data: Any  # Connection: read end, the parent rings it when the inbox has data
    in_space: Any  # write end: we ring it when we freed inbox space
    out_data: Any  # write end: we ring it when the outbox has data
    out_space: Any  # read end: the parent rings it when it freed outbox space
    status: Any  # write end: ready/error reports (MessagePack bytes)
    stderr: Any = None  # the parent's stderr: ours is a file the parent reads while we start
    lat_name: str | None = None  # a SharedLatencyBlock segment: time each message into it
    # direct edges (`edge_child`): the runtime's control segment, and the function that
    # readies the context for them before the actor runs (module-level: pickled by name)
    ctl_name: str | None = None
    setup: Any = None
    traced: bool = False  # records carry trace context: the actor gets a traced context


class ProcessKernelContext:
    """What a process actor sees, inside the child process.

    Same methods as `ThreadedKernelContext`;
    call them from the actor's own thread. A message is *finished* once the actor asks for
    its next one (``receive``/``receive_nowait``) or returns; the parent keeps it until then
    and hands it back (``take_undelivered``) if the child ends before.
    """

    __slots__ = (
        "_check_fields",
        "_codec",
        "_current",
        "_decode",
        "_edges",  # an `edge_child.ChildEdges` once the runtime gave it edges, else None
        "_gone",
        "_in",
        "_in_space_fd",
        "_lat",
        "_out",
        "_out_data_fd",
        "_out_max",
        "_output_type",
        "_read_waiter",
        "_rec",
        "_spin_s",
        "_timed",
        "_trace_token",
        "_write_waiter",
        "kernel_id",
    )

    def __init__(self, spec: ChildSpec, in_ring: Any, out_ring: Any) -> None:
        self.kernel_id = spec.kernel_id
        self._in = in_ring
        self._out = out_ring
        self._spin_s = spec.spin_s
        self._output_type = spec.output_type
        self._check_fields = spec.check_fields
        self._in_space_fd = spec.in_space.fileno()
        self._out_data_fd = spec.out_data.fileno()
        self._read_waiter = Waiter(spec.in_data.fileno(), None, spec.spin_s, spec.adaptive)
        self._write_waiter = Waiter(spec.out_space.fileno(), None, spec.spin_s, spec.adaptive)
        self._gone = False
        # (type, encoder, is a message) of the last type sent, replaced as one object
        self._codec: tuple[type | None, Callable[[Any], bytes], bool] = (None, no_encoder, False)
        self._out_max: int = out_ring.max_record_size
        self._current: Any = None  # the last message received: replies are correlated to it
        self._decode = message_decoder()  # the inbox's stream: its type's fast path
        # message timing (when the parent asked for it): a recorder, flushed into the
        # shared block every FLUSH_EVERY messages and whenever the actor is about to park
        self._lat: SharedLatencyBlock | None = None
        self._rec: Any = None
        self._timed = 0
        self._trace_token: Any = None  # the attached context of the message in hand (traced)
        self._edges: Any = None

    def time_into(self, block: SharedLatencyBlock) -> None:
        """Time every message from now on into ``block`` (the parent reads it)."""
        self._lat = block
        self._rec = LatencyRecorder()

    def flush_timing(self) -> None:
        """Hand what was timed to the parent (the shared block)."""
        self._timed = 0
        part = self._rec.drain()
        if part is not None and self._lat is not None:
            self._lat.add(part)

    def end_timing(self, finished: bool) -> None:
        """The actor ended: its running message is finished (``finished``) or not timed."""
        rec = self._rec
        if rec is None:
            return
        if finished:
            rec.idle()
        else:
            rec.cancel()
        self.flush_timing()

    @property
    def parent_gone(self) -> bool:
        """True once the parent process was seen to have gone."""
        return self._gone

    def _parent_gone(self, value: bool = False) -> bool:
        if value:
            self._gone = True
        return self._gone

    @property
    def should_terminate(self) -> bool:
        """True once a stop was requested *and* the inbox is drained (or the parent died)."""
        return self._gone or (self._in.writer_closed and not self._in.readable())

    @property
    def is_active(self) -> bool:
        """True until a stop is requested."""
        return not (self._gone or self._in.writer_closed)

    @property
    def using_cython(self) -> bool:
        """True when the compiled ring is in use in this process."""
        return _native.is_cython_available()

    def _closed(self) -> QueueClosedError:
        if self._gone:
            return QueueClosedError(f"the parent process of kernel {self.kernel_id!r} has gone")
        return QueueClosedError(f"kernel {self.kernel_id!r} is stopping and its inbox is drained")

    def receive(self, timeout: float | None = None) -> Any:
        """The next message, waiting up to ``timeout`` seconds (None = until one arrives).

        Asking for the next message marks the previous one finished. A record that does not
        decode (a field of the wrong type, for example) is not handed to the actor: it goes
        back to the parent as that message's error and the wait goes on (the timeout
        starts again).

        Returns:
            The message (a ``@message`` instance or a plain value), or None when the
            timeout expired.

        Raises:
            QueueClosedError: the kernel is stopping and the inbox is drained, or the parent
                process died (letting it escape ends the actor cleanly).
        """
        ring = self._in
        waiter = self._read_waiter
        wake = self._in_space_fd  # the reads ring it when they free space for a parked parent
        rec = self._rec
        if rec is not None:  # asking for the next message finishes the previous one
            rec.idle()
            self._timed += 1
            if self._timed >= FLUSH_EVERY:
                self.flush_timing()
        out = self._out
        while True:
            ring.mark_done(out, wake)  # (with the replies written so far: see `worker`)
            if timeout is None:  # read_wait inlined: this is every message's path
                data = ring.spin_read(waiter.spin_s, wake)
                if data is None:
                    if rec is not None:
                        self.flush_timing()
                    data = read_parked(ring, waiter, None, self._parent_gone, wake)
                elif waiter.misses and waiter.spin_s > 0:
                    waiter.hit()
            else:
                if rec is not None and not ring.readable():
                    self.flush_timing()
                data = read_wait(ring, waiter, timeout, self._parent_gone, wake)
            if data is None:
                if self._gone or ring.writer_closed:
                    raise self._closed()
                return None
            if data[0] != FRAME_TAG:
                try:
                    msg = self._current = self._decode(data)
                except MessageDeserializationError as exc:
                    self._reject(data, exc)
                    continue
                if rec is not None:
                    rec.took()
                return msg
            msg = self._take(data)
            if msg is not _REJECTED:
                if rec is not None:
                    rec.took()
                return msg

    def receive_nowait(self) -> Any:
        """The next message or None, without waiting (marks the previous one finished)."""
        ring = self._in
        rec = self._rec
        if rec is not None:
            rec.idle()
        while True:
            ring.mark_done(self._out, self._in_space_fd)
            data = ring.spin_read(0, self._in_space_fd)  # rings a parked parent
            if data is None:
                if rec is not None:
                    self.flush_timing()
                if ring.writer_closed and not ring.readable():
                    raise self._closed()
                return None
            msg = self._take(data)
            if msg is not _REJECTED:
                if rec is not None:
                    rec.took()
                return msg

    def _take(self, data: bytes) -> Any:
        """One record read from the inbox: the message it holds (now in the actor's hands),
        or `_REJECTED` once an undecodable record was reported back as its message's error.
        (`receive` decodes a ``@message`` record itself, the same way.)"""
        try:
            if data[0] != FRAME_TAG:
                msg = self._current = self._decode(data)
                return msg
            self._current = None
            return decode_value(self.kernel_id, data)
        except MessageDeserializationError as exc:
            self._reject(data, exc)
            return _REJECTED

    def _encoder_for(self, msg: Any) -> Callable[[Any], bytes]:
        """The encoder of ``msg``'s type (checked against ``output_type``; once per type)."""
        return encoder_for(
            self.kernel_id, msg, self._output_type, "must send", fields=self._check_fields
        )

    def _reject(self, data: bytes, exc: BaseException) -> None:
        """Report an undecodable record to the parent as its message's error."""
        self._current = None
        cid = frame_id(data) if data[0] != FRAME_TAG else None
        frame = error_frame(cid, exc, self._out_max)
        self._write_rest(frame, self._out.try_write(frame), None)

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Encode ``msg`` into the outbox, waiting while it is full.

        ``msg`` is a ``@message`` (a reply without a ``correlation_id`` is correlated to
        the message being handled) or any MessagePack-able value.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            TypeValidationError: ``msg`` is not the ``output_type``, or a field holds a
                value of another type than its annotation (unless the kernel checks none).
            MessageSerializationError: ``msg`` cannot be encoded, or its encoding can never
                fit the outbox ring.
            QueueClosedError: the parent process has gone.
        """
        codec = self._codec
        if type(msg) is not codec[0]:  # validate each new type once
            encode = self._encoder_for(msg)
            codec = self._codec = (type(msg), encode, isinstance(msg, RingKernelMessage))
        if codec[2]:
            stamp_reply(msg, self._current)
        data = codec[1](msg)
        try:
            result = self._out.try_write(data)
        except InvalidConfigurationError:  # the ring says it can never hold the record
            raise too_large(self.kernel_id, msg, len(data), self._out_max, "outbox") from None
        if result == WRITE_OK:
            return True
        return self._write_rest(data, result, timeout)

    def _write_rest(self, data: bytes, result: int, timeout: float | None) -> bool:
        """Finish a write that `try_write` answered with ``result``: wait for room when it
        was full, ring the parent's doorbell when it is parked."""
        ring = self._out
        if not result:
            result = write_wait(ring, data, self._write_waiter, timeout, self._parent_gone)
            if not result:
                if self._gone:
                    raise self._closed()
                return False
        if result == WRITE_WAKE:
            ring_bell(self._out_data_fd)
        return True

    def send_nowait(self, msg: Any) -> bool:
        """Encode ``msg`` into the outbox if there is room; False when full."""
        return self.send(msg, 0)

    def actor_ended(self, status: Any) -> None:
        """The actor returned (``status`` None) or raised (``status``: the report pipe):
        a context with direct edges finishes, or reports back, the record in hand."""

    def wait_shutdown(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (or the parent dies); False on timeout."""
        deadline = None if timeout is None else _monotonic() + timeout
        while not (self._gone or self._in.writer_closed):
            remaining = None if deadline is None else deadline - _monotonic()
            if remaining is not None and remaining <= 0:
                return False
            time.sleep(min(SLICE_S, remaining if remaining is not None else SLICE_S))
        return True


class TracedProcessKernelContext(ProcessKernelContext):
    """A `ProcessKernelContext` under a tracing runtime (see the module notes).

    While the actor handles a message that arrived with a trace context, that context is
    the current one (a remote, non-recording span: the runtime records the ``process``
    span), so spans the actor makes with a tracer provider of its own nest under it.
    What the actor sends carries the current context back to the runtime.
    """

    __slots__ = ()
    #: ``(opentelemetry.trace, opentelemetry.context)``, imported by `load`
    otel: ClassVar[tuple[Any, Any] | None] = None

    def __init__(self, *args: Any) -> None:
        """As `ProcessKernelContext` (opentelemetry is imported now: a traced child only)."""
        cls = type(self)
        if cls.otel is None:
            from opentelemetry import context, trace

            cls.otel = (trace, context)
        super().__init__(*args)

    def _detach(self) -> None:
        token = self._trace_token
        if token is not None:
            self._trace_token = None
            assert self.otel is not None
            self.otel[1].detach(token)

    def receive(self, timeout: float | None = None) -> Any:
        self._detach()  # the previous message is finished, and its context with it
        return super().receive(timeout)

    def receive_nowait(self) -> Any:
        self._detach()
        return super().receive_nowait()

    def _take(self, data: bytes) -> Any:
        if data[:2] != TRACE_FRAME:
            return super()._take(data)
        try:
            trace_id, span_id, flags, record = split_trace(self.kernel_id, data)
        except MessageDeserializationError as exc:
            self._reject(data, exc)
            return _REJECTED
        msg = super()._take(record)
        if msg is not _REJECTED:
            assert self.otel is not None
            trace, context = self.otel
            remote = trace.SpanContext(
                trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags)
            )
            span = trace.NonRecordingSpan(remote)
            self._trace_token = context.attach(trace.set_span_in_context(span))
        return msg

    def _encoder_for(self, msg: Any) -> Callable[[Any], bytes]:
        encode = super()._encoder_for(msg)
        assert self.otel is not None
        current = self.otel[0].get_current_span

        def traced(value: Any) -> bytes:
            ctx = current().get_span_context()
            if not ctx.is_valid:
                return encode(value)
            return trace_header(ctx.trace_id, ctx.span_id, ctx.trace_flags) + encode(value)

        return traced


def child_main(spec: ChildSpec) -> None:
    """Entry point of the child process (module level so ``spawn`` can import it).

    Reports ``["ready", pid]`` once the actor is loaded and the rings attached, or
    ``["error", phase, module, qualname, text, args, traceback]`` (phase ``"load"``: the
    actor could not be unpickled, ``"start"``: the rings could not be attached, ``"run"``:
    the actor raised).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    if spec.stderr is not None:  # started: stderr back to where the parent's goes
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.dup2(spec.stderr.fileno(), 2)
        spec.stderr.close()
    for conn in (spec.in_data, spec.in_space, spec.out_data, spec.out_space):
        os.set_blocking(conn.fileno(), False)
    status = spec.status
    in_ring = out_ring = None
    ctx: ProcessKernelContext | None = None
    lat_seg: SharedSegment | None = None
    lat: SharedLatencyBlock | None = None
    finished = False
    exit_code = 0
    phase = "load"
    try:
        func = pickle.loads(spec.func)
        phase = "start"
        in_ring = SharedByteRing.attach(spec.in_name)
        out_ring = SharedByteRing.attach(spec.out_name)
        context_class = TracedProcessKernelContext if spec.traced else ProcessKernelContext
        ctx = context_class(spec, in_ring, out_ring)
        if spec.setup is not None:  # direct edges (a traced context gets the traced edge form)
            spec.setup(ctx, spec)
        if spec.lat_name is not None:
            lat_seg = SharedSegment(spec.lat_name, create=False)
            lat = SharedLatencyBlock(lat_seg.buf)
            ctx.time_into(lat)
        status.send_bytes(pack_report("ready", os.getpid()))
        phase = "run"
        try:
            func(ctx)
        except QueueClosedError:
            if not (ctx.parent_gone or in_ring.writer_closed):
                raise
        in_ring.mark_done()  # the actor ended cleanly: what it took is finished
        ctx.actor_ended(None)
        finished = True
    except BaseException as exc:  # reported to the parent, which raises it to callers
        try:
            if ctx is not None and phase == "run":
                ctx.actor_ended(status)
            status.send_bytes(pack_report("error", phase, *exception_data(exc)))
        except OSError:
            pass  # the parent is gone
        exit_code = 1
    finally:
        if ctx is not None:
            ctx.end_timing(finished)
        if lat is not None:
            lat.release()
        if lat_seg is not None:
            lat_seg.close()
        if out_ring is not None:
            out_ring.close_writer()
            ring_bell(spec.out_data.fileno())
            out_ring.close()
        if in_ring is not None:
            in_ring.close_reader()
            ring_bell(spec.in_space.fileno())
            in_ring.close()
        for conn in (spec.in_data, spec.in_space, spec.out_data, spec.out_space, status):
            conn.close()
    if exit_code:
        sys.exit(exit_code)


# the names these had before they were public (kept for code that imported them)
