"""What a thread-tier actor sees: `ThreadedKernelContext` (and, under a tracing runtime,
`TracedThreadedKernelContext`).

Design notes:
- The context is built from what a `ContextSource` exposes (the worker's queues, its stop
  signal and its latency recorder), so this module does not import the worker, and the
  worker reads the context only through public attributes (``handling``, ``current``).
- ``receive`` and ``receive_nowait`` are written out separately: they are the actor's
  per-message path.
- A reply to a runtime's waiting caller goes to the loop directly (`answer_callers`,
  armed by the bridge through `TierWorker.hand_replies_to_callers`), found by its key in
  the callers' registrations (a dict read under the GIL); every other reply is queued.
- Trace context (a tracing runtime only): `TraceCarrier` keeps each message's context from
  the hand-over to the actor's receive (by identity: no bytes to prefix in one process).
  A worker whose wire carries it builds its actor a `TracedThreadedKernelContext` from the
  start (opentelemetry is imported then), which attaches it while the actor handles the
  message and reports the current context with what the actor sends. An untraced worker
  builds the plain context, which checks nothing more; no context ever changes class.
- Direct edges under tracing: what the actor sends into an edge goes with the current
  context (`put_traced`: beside the object in the consumer's carrier, or in a
  ``shm-ring`` record's header), not reported to the runtime, which never sees it. A
  message taken from an edge has no ``process`` span yet (no bridge handed it over), so
  the consumer's context records one here, under the producer's context, while the
  actor handles it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from ....decorators.validators import wrong_message_type
from ....exceptions import TypeValidationError
from ...message import (
    check_fields,
    fields_ok,
    reply_key,
    stamp_reply,  # correlates a reply to the request being handled
)
from ...telemetry import PyLatencyRecorder
from .sync_queue import SPSCQueue, SyncQueue

__all__ = (
    "ContextSource",
    "ThreadedKernelContext",
    "TraceCarrier",
    "TracedThreadedKernelContext",
    "wrong_type",
)

#: most messages whose trace context a `TraceCarrier` keeps (the oldest are forgotten)
MAX_CARRIED = 65_536


class ContextSource(Protocol):
    """What a context is built from (a `ThreadWorker` provides it)."""

    @property
    def kernel_id(self) -> str: ...

    @property
    def inbox(self) -> SPSCQueue[Any] | SyncQueue[Any]: ...

    @property
    def outbox(self) -> SPSCQueue[Any] | SyncQueue[Any]: ...

    @property
    def output_type(self) -> type | None: ...

    @property
    def check_fields(self) -> bool: ...

    @property
    def stop_signal(self) -> threading.Event: ...

    @property
    def latency_recorder(self) -> PyLatencyRecorder | None: ...


def wrong_type(kernel_id: str, msg: object, expected: type, what: str) -> TypeValidationError:
    """The error for ``msg`` that is not an ``expected`` (``what``: "expects", "must send"),
    in the runtime's words (`wrong_message_type`)."""
    return wrong_message_type(msg, expected, kernel_id, what)


class ThreadedKernelContext:
    """What a thread-tier actor sees: its inbox, its outbox and the stop signal.

    Every method is called from the actor's own thread.
    """

    __slots__ = (
        "_callers",
        "_check_fields",
        "_current",
        "_deliver",
        "_inbox",
        "_outbox",
        "_output_type",
        "_rec",
        "_replies",
        "_stop",
        "_trace",  # a `TracedThreadedKernelContext`'s `TraceCarrier` (unset otherwise)
        "handling",
        "kernel_id",
    )

    def __init__(self, worker: ContextSource) -> None:
        self.kernel_id = worker.kernel_id
        self._inbox = worker.inbox
        self._replies = worker.outbox  # the loop path
        self._outbox: Any = self._replies  # ... or a direct edge's end (`send_into`)
        self._output_type = worker.output_type
        self._check_fields = worker.check_fields
        self._stop = worker.stop_signal
        self._current: Any = None  # the last message received: replies are correlated to it
        self._rec = worker.latency_recorder  # times each message (None: not timed)
        # a runtime's callers and where their replies go (`answer_callers`; None: none)
        self._callers: Any = None
        self._deliver: Callable[[Any, Any], None] | None = None
        #: True from the moment the actor takes a message until it asks for the next one
        #: (read by hosts to tell an idle actor from a busy one).
        self.handling = False

    @property
    def should_terminate(self) -> bool:
        """True once a stop was requested *and* the inbox is drained."""
        return self._stop.is_set() and not self._inbox

    @property
    def is_active(self) -> bool:
        """True until a stop is requested."""
        return not self._stop.is_set()

    @property
    def current(self) -> Any:
        """The message the actor took last (None before the first); replies answer it."""
        return self._current

    def receive(self, timeout: float | None = None) -> Any:
        """The next message, waiting up to ``timeout`` seconds (None = until one arrives).

        Returns:
            The message, or None when the timeout expired.

        Raises:
            QueueClosedError: the kernel is stopping and the inbox is drained (letting it
                escape ends the actor cleanly).
        """
        self.handling = False
        rec = self._rec
        if rec is not None:
            rec.idle()  # asking for the next message finishes the previous one
        msg = self._inbox.get(timeout)
        if msg is not None:
            self._current = msg
            self.handling = True
            if rec is not None:
                rec.took()
        return msg

    def receive_nowait(self) -> Any:
        """The next message or None, without waiting."""
        self.handling = False
        rec = self._rec
        if rec is not None:
            rec.idle()
        msg = self._inbox.get(0)
        if msg is not None:
            self._current = msg
            self.handling = True
            if rec is not None:
                rec.took()
        return msg

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Put a reply into the outbox, waiting while it is full.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            TypeValidationError: ``msg`` is not the kernel's ``output_type``, or a field
                holds a value of another type than its annotation (unless the kernel
                checks no fields).
        """
        if self._output_type is not None and not isinstance(msg, self._output_type):
            raise wrong_type(self.kernel_id, msg, self._output_type, "must send")
        if self._check_fields and not fields_ok(msg):
            check_fields(msg, self.kernel_id, "must send")
        stamp_reply(msg, self._current)
        waiters = self._callers
        if waiters and self._outbox is self._replies:
            key = reply_key(msg)
            if key in waiters:  # a caller's (read under the GIL: thread-safe): to the loop
                try:
                    self._deliver(msg, key)  # type: ignore[misc]
                except Exception:  # pragma: no cover - the loop closed: the usual way
                    pass
                else:
                    self.handling = False  # answered: the message in hand is finished
                    return True
        if self._outbox.put(msg, timeout):
            self.handling = False  # answered: the message in hand is finished
            return True
        return False

    def answer_callers(self, waiters: Any, deliver: Callable[[Any, Any], None]) -> None:
        """Hand a reply whose `reply_key` is in ``waiters`` (a runtime's waiting callers)
        to ``deliver`` instead of the outbox (`TierWorker.hand_replies_to_callers`). A
        reply sent into a direct edge (`send_into`) still goes there."""
        self._callers = waiters
        self._deliver = deliver

    def send_nowait(self, msg: Any) -> bool:
        """Put a reply into the outbox if there is room; False when full."""
        return self.send(msg, 0)

    def wait_shutdown(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested; True if it was, False on timeout."""
        return self._stop.wait(timeout)

    def read_from(self, inputs: Any) -> None:
        """Take messages from ``inputs`` (``get``, ``len``) instead of the inbox, from the
        next ``receive`` on: a consumer of direct edges reads its inbox and its edges
        (`edge.EdgeInputs`). Any thread may call it."""
        self._inbox = inputs

    def send_into(self, outbox: Any) -> None:
        """Send through ``outbox`` from the next ``send`` on: a producer routed into a
        direct edge (its end, `edge.EdgeOutput` or one like it: ``put(msg, timeout)`` and
        ``put_traced``), or its own outbox again. Any thread may call it."""
        self._outbox = outbox


TraceIds = tuple[int, int, int]  # W3C (trace id, span id, trace flags)


class TraceCarrier:
    """The trace context of each message on its way to a thread-tier actor, and where
    what the actor sends reports its own (`TierWorker.trace_wire`, in one process).

    Args:
        received: Called as ``received(msg, trace_id, span_id, flags)`` on the actor's
            thread for each message it sends while a valid span is current, before the
            message is queued.
    """

    __slots__ = ("_carried", "_lock", "received", "span", "token")

    def __init__(self, received: Callable[[Any, int, int, int], None]) -> None:
        self.received = received
        # id(msg) -> (msg, ids, whether it came over a direct edge)
        self._carried: dict[int, tuple[Any, TraceIds, bool]] = {}
        self._lock = threading.Lock()  # the bridge (or a producer) adds, the actor takes
        #: the attached context of the message in the actor's hands (None: none)
        self.token: Any = None
        #: the ``process`` span recorded here for a message taken from an edge (None: none)
        self.span: Any = None

    def carry(self, msg: Any, ids: TraceIds, edge: bool = False) -> None:
        """Remember that ``msg`` travels in the context of ``ids`` (``edge``: over a direct
        edge, where nobody recorded its ``process`` span)."""
        with self._lock:
            carried = self._carried
            carried[id(msg)] = (msg, ids, edge)
            if len(carried) > MAX_CARRIED:
                del carried[next(iter(carried))]

    def forget(self, msg: Any) -> None:
        """Drop what `carry` remembered for ``msg`` (its hand-over was refused)."""
        with self._lock:
            self._carried.pop(id(msg), None)

    def take(self, msg: Any) -> tuple[TraceIds, bool] | None:
        """The context ``msg`` travels in and whether it came over an edge (forgotten
        now), or None."""
        with self._lock:
            got = self._carried.pop(id(msg), None)
        return None if got is None or got[0] is not msg else (got[1], got[2])


def _process_attributes(kernel_id: str, msg: Any) -> dict[str, Any]:
    """The attributes of a ``process`` span (as `observability.tracing` sets them)."""
    attrs: dict[str, Any] = {
        "messaging.system": "pydotcompute",
        "messaging.destination.name": kernel_id,
    }
    mid = getattr(msg, "message_id", None)
    if mid is not None:
        attrs["messaging.message.id"] = str(mid)
    return attrs


class TracedThreadedKernelContext(ThreadedKernelContext):
    """A `ThreadedKernelContext` under a tracing runtime (see the module notes).

    While the actor handles a message, the message's ``process`` span context is the
    current one (a non-recording span: the runtime records the ``process`` span), so spans
    the actor makes nest under it; what the actor sends reports the current context, the
    parent of the next hop's ``send`` span.
    """

    __slots__ = ()
    #: ``(opentelemetry.trace, opentelemetry.context, the "pydotcompute" tracer)``,
    #: imported by `adopt`
    otel: ClassVar[tuple[Any, Any, Any] | None] = None

    def __init__(self, worker: ContextSource, carrier: TraceCarrier) -> None:
        """A context fed by ``carrier``: each message's trace context, and where what the
        actor sends reports its own."""
        super().__init__(worker)
        cls = type(self)
        if cls.otel is None:
            from opentelemetry import context, trace

            cls.otel = (trace, context, trace.get_tracer("pydotcompute"))
        self._trace = carrier

    def _leave(self) -> None:
        """Detach the context of the message the actor finished (if any)."""
        carrier = self._trace
        token = carrier.token
        if token is not None:
            carrier.token = None
            assert self.otel is not None
            self.otel[1].detach(token)
            span = carrier.span
            if span is not None:  # recorded here: the message came over an edge
                carrier.span = None
                span.end()

    def _enter(self, msg: Any) -> Any:
        """Attach the context ``msg`` travels in (if it has one); returns ``msg``."""
        if msg is None:
            return None
        carrier = self._trace
        got = carrier.take(msg)
        if got is not None:
            assert self.otel is not None
            trace, context, tracer = self.otel
            (trace_id, span_id, flags), edge = got
            remote = trace.SpanContext(
                trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags)
            )
            span = trace.NonRecordingSpan(remote)
            if edge:  # no bridge recorded its ``process`` span: it is recorded here
                span = carrier.span = tracer.start_span(
                    f"process {self.kernel_id}",
                    context=trace.set_span_in_context(span),
                    kind=trace.SpanKind.CONSUMER,
                    attributes=_process_attributes(self.kernel_id, msg),
                )
            carrier.token = context.attach(trace.set_span_in_context(span))
        return msg

    def finish(self, exc: BaseException | None) -> None:
        """The actor ended (it raised ``exc``, or returned: None): the message in its
        hands is finished, and a ``process`` span recorded here for it fails with
        ``exc`` (as OpenTelemetry's conventions ask)."""
        span = self._trace.span
        if exc is not None and span is not None:
            assert self.otel is not None
            span.record_exception(exc)
            span.set_status(self.otel[0].StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        self._leave()

    def receive(self, timeout: float | None = None) -> Any:
        self._leave()  # asking for the next message finishes the previous one
        return self._enter(super().receive(timeout))

    def receive_nowait(self) -> Any:
        self._leave()
        return self._enter(super().receive_nowait())

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        assert self.otel is not None
        sc = self.otel[0].get_current_span().get_span_context()
        if sc.is_valid:
            ids = (sc.trace_id, sc.span_id, sc.trace_flags)
            out = self._outbox
            if out is not self._replies:  # routed into a direct edge: the context goes along
                return self._send_traced(out.put_traced, msg, timeout, ids)
            self._trace.received(msg, *ids)
        return super().send(msg, timeout)

    def _send_traced(self, put_traced: Any, msg: Any, timeout: float | None, ids: TraceIds) -> bool:
        """`ThreadedKernelContext.send` into a direct edge's output, with ``ids``; the
        output reports them (``received``) only for a message it sends the loop way."""
        if self._output_type is not None and not isinstance(msg, self._output_type):
            raise wrong_type(self.kernel_id, msg, self._output_type, "must send")
        if self._check_fields and not fields_ok(msg):
            check_fields(msg, self.kernel_id, "must send")
        stamp_reply(msg, self._current)
        if put_traced(msg, timeout, ids, self._trace.received):
            self.handling = False
            return True
        return False

    def send_nowait(self, msg: Any) -> bool:
        return self.send(msg, 0)
