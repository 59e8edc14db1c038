"""OpenTelemetry traces of messages: ``RingKernelRuntime(tracing=True)``.

Spans follow the messaging semantic conventions: ``send <kernel>`` (PRODUCER) when a
message is sent into a kernel (``runtime.send``, ``send_and_receive``, a pipeline's
forward, ``ctx.send_to``), ``process <kernel>`` (CONSUMER) while its actor handles it, with
``messaging.system="pydotcompute"``, ``messaging.destination.name`` (the kernel) and
``messaging.message.id``. Each ``process`` span is the child of the ``send`` that
delivered the message and the parent of the sends its actor makes, so one message through
a pipeline is one trace. Spans go to the global tracer provider (``opentelemetry-api``;
configure an SDK and exporter as usual).

Design notes:
- The tracer is an `Instrument` (``ring_kernels/instruments.py``): the runtime and the
  bridge call its hooks where their policy lives (a send, an actor taking a message, a
  reply collected, a drop, a failure). Off (the default), the runtime has no instrument
  and nothing on the message path changes; nothing of a live object is replaced.
- In one process a message carries its trace context by identity: the tracer maps the
  message object to the context of the span that sent it, from the send until an actor
  takes it (at most `MAX_IN_FLIGHT` entries; the oldest are forgotten beyond). Into a
  ``serialize=True`` kernel, whose inbox keeps bytes and hands its actor a decoded copy,
  the key is the message's id instead (and the message itself is not held).
- That entry holds the message, so it is let go the moment the message ends without an
  actor (`Instrument.message_dropped`: a full ``drop_oldest`` inbox evicts it, terminate
  hands it back, a full ``reject`` kernel downstream refuses a reply; or its send raises:
  a full ``reject`` inbox, a wrong type, a stopped kernel), a ``send_and_receive`` ends,
  or it is a reply that goes to its caller rather than down the pipeline (never carried).
  Weak references were rejected: msgspec Structs (and plain values) take none.
- A failure is recorded where it happens, with OpenTelemetry's conventions
  (`record_failure`: status ERROR, the exception as an event): on the ``send`` span of a
  send the kernel refused, and on the ``process`` span of the message its actor raised
  on (`Instrument.actor_failed`: asyncio, before a restart; thread, process and GPU, when
  the bridge stops the failed worker, with `TierWorker.failed_on`).
- Asyncio tier: `Instrument.message_taken` runs in the actor's own task, so the
  ``process`` span is made current there (a context variable of that task, until the
  actor asks for its next message) and spans the actor makes nest under it; its sends
  into other kernels (``connect``, ``ctx.send_to``) are children of it.
- Thread, process and GPU tiers: the bridge's side records the ``process`` span from
  the hand-over to the actor's reply (`Instrument.reply_collected`), which it matches
  through the reply's ``correlation_id`` (stamped with the request's id on every tier,
  and carried on the wire) or, for an actor that sends on the message it received, its
  ``message_id``. The span starts when the tier's wire asks for the message's context
  (`RingKernel.carry_trace`, `TierWorker.trace_wire`), or at the hand-over for a tier
  without one (GPU); when the tier is full, it waits with the message for its next offer.
- The ``process`` span's context reaches the actor through `TierWorker.trace_wire` (the
  thread and process tiers, and pools of them): across a process boundary in the frame
  (the process tier prefixes each record with its W3C ids, the ``0xC1 'T'`` header), on
  the thread tier beside the message in memory. The actor's side makes it current while
  the actor handles the message (until its next receive), and what the actor sends comes
  back with the current context there, which parents the next hop's ``send`` (the
  ``process`` span matched by correlation when a reply has none). A child process records
  no spans itself unless its actor's module configures a tracer provider; a thread
  actor's spans go to this process's provider.
- Inside a Ray actor the kernel runs on the actor's own runtime, traced when the driver's
  is; a message crosses with its ``send`` span's context (`take_ids`, `carry_remote`).
- Direct edges (``objects``, ``shm-ring``) stay direct under tracing: the producer's
  current context rides in each record's header and the consumer's actor makes it current
  (a thread consumer records the ``process`` span itself). A producer routed into a
  direct edge sends nothing back (`Instrument.edge_routed`), so its ``process`` span
  ends at the hand-over instead of at a reply that never comes.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from ..ring_kernels.instruments import Instrument
from ..ring_kernels.message import (
    RingKernelMessage,
    claim_request_key,
    frame_header,
    reply_key,
    request_key,
    request_space,
)
from .deps import require

_trace = require("opentelemetry.trace", "tracing=True")
_context = require("opentelemetry.context", "tracing=True")

__all__ = ("MAX_IN_FLIGHT", "MessageTracer", "record_failure")

#: most messages whose trace context is remembered between send and receive
MAX_IN_FLIGHT = 65_536
_SYSTEM = "pydotcompute"


def _message_id(msg: Any) -> Any:
    return getattr(msg, "message_id", None)


def record_failure(span: Any, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc`` as OpenTelemetry's conventions ask: status ERROR
    with a description naming the exception, and the exception recorded as an event
    (``exception.type``, ``exception.message``, the stack trace)."""
    span.record_exception(exc)
    span.set_status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")


def remote_context(trace_id: int, span_id: int, flags: int) -> Any:
    """The Context of a span in another process, from its W3C ids."""
    remote = _trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=_trace.TraceFlags(flags)
    )
    return _trace.set_span_in_context(_trace.NonRecordingSpan(remote))


class MessageTracer(Instrument):
    """The tracing instrument of one runtime (``RingKernelRuntime(tracing=True)`` installs
    it as ``runtime.tracer``): spans, and each in-flight message's context."""

    def __init__(self) -> None:
        self.tracer = _trace.get_tracer("pydotcompute")
        self._carried: dict[int, tuple[Any, Any]] = {}  # id(msg) -> (msg, Context)
        # into a serialize=True kernel: the message id's bytes -> Context
        self._by_id: dict[bytes, Any] = {}
        self._lock = threading.Lock()  # a thread actor reports what it sends from its thread
        # kernels whose inbox serializes: their actors take copies, found by id
        self._serializing: set[str] = set()
        # the hosted kernels' spans (thread, process, GPU), by kernel id
        self._bridges: dict[str, _Bridge] = {}
        # sends under way: id(msg) -> [(msg, its send span, the Context it carries)]
        self._sends: dict[int, list[tuple[Any, Any, Any]]] = {}
        # requests under way: id(msg) -> [(msg, the Context it carries)]
        self._requests: dict[int, list[tuple[Any, Any]]] = {}
        # an asyncio actor's message in hand: (kernel, process span, attach token), per
        # actor task (the hooks run in it)
        self._current: contextvars.ContextVar[tuple[Any, Any, Any] | None] = contextvars.ContextVar(
            "pydotcompute_process_span", default=None
        )

    # -- the context a message carries -------------------------------------------------

    def carry(self, msg: Any, ctx: Any) -> None:
        """Remember that ``msg`` travels in trace context ``ctx``."""
        with self._lock:
            carried = self._carried
            carried[id(msg)] = (msg, ctx)
            if len(carried) > MAX_IN_FLIGHT:
                del carried[next(iter(carried))]

    def carry_by_id(self, msg: RingKernelMessage, ctx: Any) -> None:
        """Remember ``ctx`` for whichever copy of ``msg`` (decoded from its bytes) an actor
        takes, by the message's id."""
        with self._lock:
            by_id = self._by_id
            by_id[request_key(msg)] = ctx
            if len(by_id) > MAX_IN_FLIGHT:
                del by_id[next(iter(by_id))]

    def release(self, msg: Any, ctx: Any = None) -> None:
        """Forget the context ``msg`` travels in: it ended without reaching an actor
        (dropped, refused; the bytes of a message a serializing inbox dropped do too).
        With ``ctx``, only while that is still the context it carries (a later send of
        the same object carries its own)."""
        key = id(msg)
        with self._lock:
            got = self._carried.get(key)
            if got is not None and got[0] is msg and (ctx is None or got[1] is ctx):
                del self._carried[key]
                return
            if not self._by_id:
                return
        if isinstance(msg, RingKernelMessage):
            mid = request_key(msg)
        elif type(msg) is bytes:
            try:
                head = frame_header(msg).message_id
            except Exception:  # not a frame: it carried nothing
                return
            mid = None if head is None else head.bytes
        else:
            return
        with self._lock:
            if mid is not None and (ctx is None or self._by_id.get(mid) is ctx):
                self._by_id.pop(mid, None)

    def take(self, msg: Any) -> Any:
        """The context ``msg`` travels in (forgotten now), or None."""
        with self._lock:
            got = self._carried.pop(id(msg), None)
            if got is not None and got[0] is msg:
                return got[1]
            if not self._by_id or not isinstance(msg, RingKernelMessage):
                return None
        key = request_key(msg)
        with self._lock:
            return self._by_id.pop(key, None)

    def take_ids(self, msg: Any) -> tuple[int, int, int] | None:
        """The context ``msg`` travels in (forgotten now) as W3C ids ``(trace id, span
        id, trace flags)``, for a wire; None when it has none."""
        ctx = self.take(msg)
        if ctx is None:
            return None
        sc = _trace.get_current_span(ctx).get_span_context()
        return (sc.trace_id, sc.span_id, sc.trace_flags) if sc.is_valid else None

    def carry_remote(self, msg: Any, trace_id: int, span_id: int, flags: int) -> None:
        """Remember that ``msg`` arrived over a wire in the context of those W3C ids."""
        self.carry(msg, remote_context(trace_id, span_id, flags))

    def in_flight(self) -> int:
        """How many messages' contexts are remembered now: messages sent and not yet taken
        by an actor (each entry holds its message, or into a ``serialize=True`` kernel
        its id)."""
        return len(self._carried) + len(self._by_id)

    # -- spans -------------------------------------------------------------------------

    def _attributes(self, kernel_id: str, msg: Any) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "messaging.system": _SYSTEM,
            "messaging.destination.name": kernel_id,
        }
        mid = _message_id(msg)
        if mid is not None:
            attrs["messaging.message.id"] = str(mid)
        return attrs

    def start_send(self, kernel_id: str, msg: Any, parent: Any = None) -> tuple[Any, Any]:
        """Start a ``send <kernel_id>`` span (under ``parent``, a Context; None: the
        current one) and have ``msg`` carry it on. Returns the span (the caller ends it,
        once the kernel took the message or refused it) and the Context ``msg`` carries."""
        span = self.tracer.start_span(
            f"send {kernel_id}",
            context=parent,
            kind=_trace.SpanKind.PRODUCER,
            attributes=self._attributes(kernel_id, msg),
        )
        ctx = _trace.set_span_in_context(span)
        if kernel_id in self._serializing and isinstance(msg, RingKernelMessage):
            self.carry_by_id(msg, ctx)
        else:
            self.carry(msg, ctx)
        return span, ctx

    def sent(self, kernel_id: str, msg: Any, parent: Any = None) -> Any:
        """A ``send <kernel_id>`` span, ended at once (`start_send`); returns the Context
        ``msg`` carries."""
        span, ctx = self.start_send(kernel_id, msg, parent)
        span.end()
        return ctx

    def start_process(self, kernel_id: str, msg: Any) -> Any:
        """Start the ``process <kernel_id>`` span of ``msg`` (under the send that carried
        it); the caller ends it."""
        return self.tracer.start_span(
            f"process {kernel_id}",
            context=self.take(msg),
            kind=_trace.SpanKind.CONSUMER,
            attributes=self._attributes(kernel_id, msg),
        )

    # -- the instrument's hooks ----------------------------------------------------------

    def kernel_launched(self, kernel: Any) -> None:
        """Note how ``kernel`` takes its messages (copies decoded from bytes, or the objects
        sent) and, for one whose actor runs off the loop, ask its tier to carry each
        message's context to the actor (`RingKernel.carry_trace`)."""
        kid = kernel.kernel_id
        if kernel.config.serialize:
            self._serializing.add(kid)
        else:
            self._serializing.discard(kid)
        if kernel.worker is None:  # an asyncio actor: its context reports (`message_taken`)
            self._bridges.pop(kid, None)
            return
        bridge = self._bridges[kid] = _Bridge(self, kid)
        kernel.carry_trace(bridge.header, bridge.received)

    def message_sending(self, kernel: Any, msg: Any) -> None:
        span, ctx = self.start_send(kernel.kernel_id, msg)  # under the current context
        with self._lock:
            self._sends.setdefault(id(msg), []).append((msg, span, ctx))

    def message_sent(self, kernel: Any, msg: Any, error: BaseException | None) -> None:
        got = _pop(self._sends, msg, self._lock)
        if got is None:
            return
        span, ctx = got[1], got[2]
        if error is not None:  # refused: the message goes no further, nor its context
            self.release(msg, ctx)
            if isinstance(error, Exception):
                record_failure(span, error)
        span.end()

    def request_started(self, kernel: Any, msg: Any) -> None:
        kid = kernel.kernel_id
        if isinstance(msg, RingKernelMessage):
            # the id the span names is the one the kernel's request gets: made in its
            # request space (see `RingKernel.claim_request`), not by the span
            claim_request_key(msg, request_space(kid))
        ctx = self.sent(kid, msg)
        with self._lock:
            self._requests.setdefault(id(msg), []).append((msg, ctx))

    def request_finished(self, kernel: Any, msg: Any, error: BaseException | None) -> None:
        got = _pop(self._requests, msg, self._lock)
        if got is not None:  # taken by now, refused, given up on, or sent as a copy
            self.release(msg, got[1])

    def message_taken(self, kernel: Any, msg: Any) -> None:
        if kernel.worker is not None:
            bridge = self._bridges.get(kernel.kernel_id)
            if bridge is not None:
                bridge.taken(msg)
            return
        # an asyncio actor, in its own task: the span is current until its next receive
        self._end_current(kernel)
        span = self.start_process(kernel.kernel_id, msg)
        token = _context.attach(_trace.set_span_in_context(span))
        self._current.set((kernel, span, token))

    def edge_routed(self, kernel: Any, direct: bool) -> None:
        """A producer routed into a direct edge gets no reply back: its ``process`` spans
        end at the hand-over."""
        bridge = self._bridges.get(kernel.kernel_id)
        if bridge is not None:
            bridge.routed(direct)

    def message_finished(self, kernel: Any, msg: Any) -> None:
        self._end_current(kernel)

    def actor_failed(self, kernel: Any, msg: Any, error: BaseException) -> None:
        if kernel.worker is not None:
            bridge = self._bridges.get(kernel.kernel_id)
            if bridge is not None:
                bridge.failed(msg, error)
            return
        self._end_current(kernel, error)

    def reply_collected(self, kernel: Any, reply: Any) -> None:
        bridge = self._bridges.get(kernel.kernel_id)
        if bridge is not None:
            bridge.replied(kernel, reply)

    def worker_stopped(self, kernel: Any) -> None:
        bridge = self._bridges.get(kernel.kernel_id)
        if bridge is not None:
            bridge.stopped()

    def message_dropped(
        self, kernel: Any, msg: Any, reason: str, error: BaseException | None = None
    ) -> None:
        self.release(msg)
        bridge = self._bridges.get(kernel.kernel_id)
        if bridge is not None:
            bridge.dropped(msg, error)

    def _end_current(self, kernel: Any, error: BaseException | None = None) -> None:
        """End the ``process`` span of the message ``kernel``'s actor holds in this task
        (failed by ``error`` when given), and stop it being the current one."""
        current = self._current.get()
        if current is None or current[0] is not kernel:
            return
        self._current.set(None)
        _, span, token = current
        _context.detach(token)
        if error is not None and isinstance(error, Exception):
            record_failure(span, error)
        span.end()


def _pop(table: dict[int, list[Any]], msg: Any, lock: threading.Lock) -> Any:
    """The latest entry ``table`` holds for ``msg`` (forgotten now), or None."""
    with lock:
        entries = table.get(id(msg))
        if not entries:
            return None
        for i in range(len(entries) - 1, -1, -1):
            if entries[i][0] is msg:
                got = entries.pop(i)
                if not entries:
                    del table[id(msg)]
                return got
        return None


class _Bridge:
    """The ``process`` spans of one kernel whose actor runs off the loop: each from the
    hand-over to the actor's reply (see the module notes)."""

    def __init__(self, tracer: MessageTracer, kernel_id: str) -> None:
        self._routed = False  # the actor sends into a direct edge: no reply comes back
        self._tracer = tracer
        self._kernel_id = kernel_id
        self._lock = threading.Lock()
        # request key (its message_id) -> its process span, until the reply
        self._open: dict[Any, Any] = {}
        # id(msg) -> (msg, its process span) before the tier took it (it may come again)
        self._unsent: dict[int, tuple[Any, Any]] = {}
        # id(reply) -> (reply, the Context it arrived with), until `replied` takes it
        self._arrived: dict[int, tuple[Any, Any]] = {}

    # -- the context on the tier's wire ------------------------------------------------------

    def header(self, msg: Any) -> tuple[int, int, int] | None:
        """The context ``msg`` goes to the actor in: its ``process`` span's, started now
        (or kept from an offer the tier refused)."""
        sc = self._span_of(msg).get_span_context()
        return (sc.trace_id, sc.span_id, sc.trace_flags)

    def received(self, reply: Any, trace_id: int, span_id: int, flags: int) -> None:
        """A reply arrived in trace context (maybe on the actor's thread): it parents the
        reply's next hop."""
        ctx = remote_context(trace_id, span_id, flags)
        with self._lock:
            arrived = self._arrived
            arrived[id(reply)] = (reply, ctx)
            if len(arrived) > MAX_IN_FLIGHT:
                del arrived[next(iter(arrived))]

    def _span_of(self, msg: Any) -> Any:
        with self._lock:
            held = self._unsent.get(id(msg))
        if held is not None and held[0] is msg:
            return held[1]
        span = self._tracer.start_process(self._kernel_id, msg)
        with self._lock:
            unsent = self._unsent
            unsent[id(msg)] = (msg, span)
            if len(unsent) > MAX_IN_FLIGHT:
                unsent.pop(next(iter(unsent)))[1].end()
        return span

    # -- the bridge's events -------------------------------------------------------------------

    def taken(self, msg: Any) -> None:
        """The tier took ``msg``: its span waits for the reply (a plain value, which no
        reply can be matched to, ends at once)."""
        span = self._span_of(msg)
        with self._lock:
            self._unsent.pop(id(msg), None)
        key = _message_id(msg)
        if key is None or self._routed:  # a plain value, or its reply goes into an edge
            span.end()
            return
        with self._lock:
            self._open[key] = span
            if len(self._open) > MAX_IN_FLIGHT:
                self._open.pop(next(iter(self._open))).end()

    def replied(self, kernel: Any, reply: Any) -> None:
        """The actor's ``reply`` came back: the span of the message it answers ends, and a
        reply that goes on down a pipeline gets its ``send`` span under it."""
        cid = getattr(reply, "correlation_id", None)
        with self._lock:
            span = self._open.pop(cid, None) if cid is not None else None
            if span is None:
                span = self._open.pop(_message_id(reply), None)
            got = self._arrived.pop(id(reply), None) if self._arrived else None
        if span is not None:
            span.end()
        target = kernel.forwards_to
        if target is None or (cid is not None and reply_key(reply) in kernel.reply_waiters):
            return  # it goes to the outbox, or to its caller: no next hop
        tracer = self._tracer
        if got is not None and got[0] is reply:  # the context it came back in
            tracer.sent(target.kernel_id, reply, got[1])
        elif span is not None:
            tracer.sent(target.kernel_id, reply, _trace.set_span_in_context(span))

    def failed(self, msg: Any, error: BaseException) -> None:
        """The actor failed on ``msg`` (None: unknown): its span says so."""
        key = None if msg is None else _message_id(msg)
        with self._lock:
            span = self._open.pop(key, None) if key is not None else None
        if span is not None:
            if isinstance(error, Exception):
                record_failure(span, error)
            span.end()

    def dropped(self, msg: Any, error: BaseException | None) -> None:
        """``msg`` ended before the tier took it (``error``: why, when it could not)."""
        with self._lock:
            held = self._unsent.pop(id(msg), None)
        if held is not None and held[0] is msg:
            if isinstance(error, Exception):
                record_failure(held[1], error)
            held[1].end()

    def routed(self, direct: bool) -> None:
        """The actor's output goes into a direct edge (``direct``) or back to the bridge."""
        self._routed = direct

    def stopped(self) -> None:
        """The worker stopped: no reply comes for what it still had."""
        with self._lock:
            left = [*self._open.values(), *(s for _, s in self._unsent.values())]
            self._open, self._unsent, self._arrived = {}, {}, {}
        for span in left:
            span.end()
