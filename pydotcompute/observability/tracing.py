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
- Off (the default), the runtime has no tracer and nothing on the message path changes:
  a tracing runtime gives its kernels a context subclass (`traced_context_class`) and its
  hosted kernels a wrapped worker, and shadows its own ``send``, so the untraced path has
  no extra check at all.
- In one process a message carries its trace context by identity: the tracer maps the
  message object to the context of the span that sent it, from the send until an actor
  takes it (at most `MAX_IN_FLIGHT` entries; the oldest are forgotten beyond). Into a
  ``serialize=True`` kernel, whose inbox keeps bytes and hands its actor a decoded copy,
  the key is the message's id instead (and the message itself is not held).
- That entry holds the message, so it is let go the moment the message ends without an
  actor: a full ``drop_oldest`` inbox drops it (the inbox's ``on_drop_item``), its send
  raises (a full ``reject`` inbox, a wrong type, a stopped kernel: the traced send, and
  a hosted kernel's forward of a reply, `release` it), a ``send_and_receive`` ends, or
  it is a reply that goes to its caller rather than down the pipeline (never carried).
  Weak references were rejected: msgspec Structs (and plain values) take none. A kernel
  with no Python actor (a GPU kernel's device handler) takes no context: its messages
  get a ``send`` span and carry nothing.
- A failure is recorded where it happens, with OpenTelemetry's conventions
  (`record_failure`: status ERROR, the exception as an event): on the ``send`` span of a
  send the kernel refused, and on the ``process`` span of the message its actor raised
  on (asyncio: the context's `KernelContext.actor_raised`, before a restart; thread and
  process: the worker's `TierWorker.failed_on`, when the failed worker stops).
- Thread and process tiers: the runtime's side of the bridge records the ``process`` span
  from the hand-over to the actor's reply, which it matches through the reply's
  ``correlation_id`` (stamped with the request's id on every tier, and carried on the
  wire) or, for an actor that sends on the message it received, its ``message_id``.
- The ``process`` span's context reaches the actor through `TierWorker.trace_wire` (the
  thread and process tiers, and pools of them): across a process boundary in the frame
  (the process tier prefixes each record with its W3C ids, the ``0xC1 'T'`` header), on
  the thread tier beside the message in memory. The actor's side makes it current while
  the actor handles the message (until its next receive), and what the actor sends comes
  back with the current context there, which parents the next hop's ``send`` (the
  ``process`` span matched by correlation when a reply has none). A child process records
  no spans itself unless its actor's module configures a tracer provider; a thread
  actor's spans go to this process's provider.
- The Ray tier (a kernel-level tier) ships each message with its ``send`` span's context
  (`take_ids`); the actor's own runtime traces, carries it (`carry_remote`) and forwards
  actor to actor the same way. Replies read by the driver carry none (nothing there
  continues them).
- On the asyncio tier (and so in a Ray actor) the ``process`` span is the current span
  while the actor handles the message, so spans the actor makes nest under it.
- A ``process`` span starts before the hand-over (its context is in the record); when the
  tier is full, the span waits with the message and is used for its next offer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..ring_kernels.message import (
    RingKernelMessage,
    claim_request_key,
    frame_header,
    reply_key,
    request_key,
    request_space,
    stamp_reply,
)
from ..ring_kernels.tiers.contract import TierWorker
from .deps import require

if TYPE_CHECKING:
    from ..ring_kernels.context import KernelContext
    from ..ring_kernels.kernel import RingKernel
    from ..ring_kernels.runtime import RingKernelRuntime

_trace = require("opentelemetry.trace", "tracing=True")
_context = require("opentelemetry.context", "tracing=True")

__all__ = ("MAX_IN_FLIGHT", "MessageTracer", "TracingWorker", "record_failure")

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


class MessageTracer:
    """The tracing side of one runtime: spans, and each in-flight message's context."""

    def __init__(self) -> None:
        self.tracer = _trace.get_tracer("pydotcompute")
        self._carried: dict[int, tuple[Any, Any]] = {}  # id(msg) -> (msg, Context)
        # into a serialize=True kernel: the message id's bytes -> Context
        self._by_id: dict[bytes, Any] = {}
        self._lock = threading.Lock()  # hosted bridges may call from worker threads
        self._classes: dict[type, type] = {}
        # kernels with no Python actor: nothing would take a context sent to them
        self._no_taker: set[str] = set()
        # kernels whose inbox serializes: their actors take copies, found by id
        self._serializing: set[str] = set()

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
        once the kernel took the message or refused it) and the Context ``msg`` carries
        (None for a kernel whose messages no actor takes)."""
        span = self.tracer.start_span(
            f"send {kernel_id}",
            context=parent,
            kind=_trace.SpanKind.PRODUCER,
            attributes=self._attributes(kernel_id, msg),
        )
        if kernel_id in self._no_taker:
            return span, None
        ctx = _trace.set_span_in_context(span)
        if kernel_id in self._serializing and isinstance(msg, RingKernelMessage):
            self.carry_by_id(msg, ctx)
        else:
            self.carry(msg, ctx)
        return span, ctx

    def sent(self, kernel_id: str, msg: Any, parent: Any = None) -> Any:
        """A ``send <kernel_id>`` span, ended at once (`start_send`); returns the Context
        ``msg`` carries (None: none)."""
        span, ctx = self.start_send(kernel_id, msg, parent)
        span.end()
        return ctx

    async def intake(self, coro: Coroutine[Any, Any, bool], span: Any, msg: Any, ctx: Any) -> bool:
        """Await a kernel's intake of ``msg`` (``coro``) inside its ``send`` span: a
        refusal (the exception ``coro`` raises) fails the span and lets ``msg`` go."""
        try:
            return await coro
        except BaseException as exc:
            self.release(msg, ctx)
            if isinstance(exc, Exception):
                record_failure(span, exc)
            raise
        finally:
            span.end()

    def start_process(self, kernel_id: str, msg: Any) -> Any:
        """Start the ``process <kernel_id>`` span of ``msg`` (under the send that carried
        it); the caller ends it."""
        return self.tracer.start_span(
            f"process {kernel_id}",
            context=self.take(msg),
            kind=_trace.SpanKind.CONSUMER,
            attributes=self._attributes(kernel_id, msg),
        )

    # -- instrumentation ---------------------------------------------------------------

    def context_class(self, base: type[KernelContext]) -> type[KernelContext]:
        """``base`` with tracing added (one class per base, made on first use)."""
        cls = self._classes.get(base)
        if cls is None:
            cls = self._classes[base] = _traced_context_class(base, self)
        return cls

    def instrument(self, kernel: RingKernel) -> None:
        """Trace a launched kernel whose actor runs behind a `TierWorker` (thread and
        process tiers); tier-1 kernels are traced through their context class. Every
        kernel's inbox lets go of the messages it drops."""
        inbox = kernel.inbox
        if inbox is not None and hasattr(inbox, "on_drop_item"):
            inbox.on_drop_item = self.release
        kid = kernel.kernel_id
        self._no_taker.discard(kid)
        if kernel.config.serialize:
            self._serializing.add(kid)
        else:
            self._serializing.discard(kid)
        wrap = getattr(kernel, "wrap_worker", None)
        if wrap is not None:
            wrap(lambda worker: TracingWorker(worker, self, kernel))
            return
        wire = getattr(kernel, "trace_wire", None)  # a kernel-level tier with a wire (Ray)
        if wire is not None:
            wire(self.take_ids)
        elif kernel.CAPABILITIES.actor_kind is None:  # a device handler (GPU)
            self._no_taker.add(kid)

    def wrap_runtime(self, runtime: RingKernelRuntime) -> None:
        """Shadow ``runtime.send`` and ``runtime.send_and_receive`` with traced ones."""
        send = runtime.send
        send_and_receive = runtime.send_and_receive
        start_send, intake, sent, release = self.start_send, self.intake, self.sent, self.release

        def traced_send(
            kernel_id: str, msg: Any, *, timeout: float | None = None
        ) -> Coroutine[Any, Any, bool]:
            coro = send(kernel_id, msg, timeout=timeout)  # unknown ids raise here, untraced
            span, ctx = start_send(kernel_id, msg)
            return intake(coro, span, msg, ctx)

        async def traced_send_and_receive(
            kernel_id: str, msg: Any, *, timeout: float | None = None
        ) -> Any:
            runtime.get_kernel(kernel_id)  # unknown ids raise before a span is made
            if isinstance(msg, RingKernelMessage):
                # the id the span names is the one the kernel's request gets: made in
                # its request space (see `RingKernel.claim_request`), not by the span
                claim_request_key(msg, request_space(kernel_id))
            ctx = sent(kernel_id, msg)
            try:
                return await send_and_receive(kernel_id, msg, timeout=timeout)
            finally:  # taken by now, refused, given up on, or sent as a copy (a retry)
                release(msg, ctx)

        runtime.send = traced_send  # type: ignore[method-assign]
        runtime.send_and_receive = traced_send_and_receive  # type: ignore[method-assign]


def _traced_context_class(base: type[KernelContext], tracer: MessageTracer) -> type[Any]:
    """A subclass of the actor context ``base`` that records the spans of its messages."""
    base_receive = base.receive
    base_receive_nowait = base.receive_nowait
    base_send = base.send
    base_send_nowait = base.send_nowait
    base_send_to = base.send_to
    no_span = _trace.INVALID_SPAN

    attach = _context.attach
    detach = _context.detach
    in_context = _trace.set_span_in_context
    start_send, intake = tracer.start_send, tracer.intake

    class TracedContext(base):  # type: ignore[valid-type,misc]
        __slots__ = ("_span", "_token")

        def __init__(self, kernel: RingKernel, *args: Any) -> None:
            super().__init__(kernel, *args)
            self._span: Any = no_span
            self._token: Any = None

        def _end(self) -> None:
            span = self._span
            if span is not no_span:
                self._span = no_span
                detach(self._token)  # the process span was current while it was handled
                span.end()

        def _begin(self, msg: Any) -> Any:
            if msg is not None:
                span = self._span = tracer.start_process(self.kernel_id, msg)
                self._token = attach(in_context(span))
            return msg

        async def receive(self, timeout: float | None = None) -> Any:
            self._end()  # asking for the next message finishes the previous one
            return self._begin(await base_receive(self, timeout))

        def receive_nowait(self) -> Any:
            self._end()
            return self._begin(base_receive_nowait(self))

        def actor_raised(self, exc: BaseException) -> None:
            span = self._span
            if span is not no_span:  # the message in hand failed
                record_failure(span, exc)
                self._end()

        def _forwarding(self, msg: Any) -> RingKernel | None:
            """The kernel ``msg`` goes on to: the forward target, unless ``msg`` is the
            reply a ``send_and_receive`` caller waits for (it goes to the caller)."""
            target: RingKernel | None = self._kernel.forwards_to
            if target is not None and self._waiters:
                stamp_reply(msg, self._current)  # (as the send does: it is not stamped twice)
                if reply_key(msg) in self._waiters:
                    return None
            return target

        async def send(self, msg: Any, timeout: float | None = None) -> bool:
            target = self._forwarding(msg)
            if target is None:
                result: bool = await base_send(self, msg, timeout)
                return result
            span, ctx = start_send(target.kernel_id, msg, in_context(self._span))
            return await intake(base_send(self, msg, timeout), span, msg, ctx)

        def send_nowait(self, msg: Any) -> bool:
            target = self._forwarding(msg)
            if target is None:
                result: bool = base_send_nowait(self, msg)
                return result
            span, ctx = start_send(target.kernel_id, msg, in_context(self._span))
            try:
                result = base_send_nowait(self, msg)
            except BaseException as exc:
                tracer.release(msg, ctx)
                if isinstance(exc, Exception):
                    record_failure(span, exc)
                raise
            finally:
                span.end()
            return result

        async def send_to(self, kernel_id: str, msg: Any, timeout: float | None = None) -> bool:
            span, ctx = start_send(kernel_id, msg, in_context(self._span))
            return await intake(base_send_to(self, kernel_id, msg, timeout), span, msg, ctx)

    TracedContext.__name__ = TracedContext.__qualname__ = f"Traced{base.__name__}"
    return TracedContext


class TracingWorker(TierWorker):
    """A `TierWorker` whose messages are traced on the runtime's side of the bridge: the
    ``process`` span runs from the hand-over to the actor's reply (see the module notes)."""

    def __init__(self, inner: TierWorker, tracer: MessageTracer, kernel: RingKernel) -> None:
        self.inner = inner
        self._tracer = tracer
        self._kernel = kernel
        self._lock = threading.Lock()
        # request key (its message_id) -> its process span, until the reply
        self._open: dict[Any, Any] = {}
        # id(msg) -> (msg, its process span) for an offer the tier refused (it comes again)
        self._unsent: dict[int, tuple[Any, Any]] = {}
        # the message being offered and its header, for `_header` (per thread)
        self._offering = threading.local()
        # id(reply) -> (reply, the Context it arrived with), until `_replied` takes it
        self._arrived: dict[int, tuple[Any, Any]] = {}
        self._wire = inner.trace_wire(self._header, self._received)

    def __getattr__(self, name: str) -> Any:
        # what a tier's worker offers beyond the contract (a pool's member counts, ...)
        return getattr(self.inner, name)

    # -- the context on the tier's wire ----------------------------------------------------

    def _header(self, msg: Any) -> tuple[int, int, int] | None:
        """The trace context of ``msg`` while `offer` hands it over (else None)."""
        offering = self._offering
        if getattr(offering, "msg", None) is not msg:
            return None
        header: tuple[int, int, int] = offering.header
        return header

    def _received(self, reply: Any, trace_id: int, span_id: int, flags: int) -> None:
        """A reply arrived in trace context: it parents the reply's next hop."""
        ctx = remote_context(trace_id, span_id, flags)
        with self._lock:
            arrived = self._arrived
            arrived[id(reply)] = (reply, ctx)
            if len(arrived) > MAX_IN_FLIGHT:
                del arrived[next(iter(arrived))]

    # -- traced ----------------------------------------------------------------------------

    def offer(self, msg: Any) -> bool:
        with self._lock:
            held = self._unsent.pop(id(msg), None)
        if held is not None and held[0] is msg:
            span = held[1]
        else:
            span = self._tracer.start_process(self._kernel.kernel_id, msg)
        try:
            if self._wire:
                sc = span.get_span_context()
                offering = self._offering
                offering.header = (sc.trace_id, sc.span_id, sc.trace_flags)
                offering.msg = msg
                try:
                    ok = self.inner.offer(msg)
                finally:
                    offering.msg = None
            else:
                ok = self.inner.offer(msg)
        except BaseException as exc:  # refused (a wrong type, too large): no process
            if isinstance(exc, Exception):
                record_failure(span, exc)
            span.end()
            raise
        if not ok:
            with self._lock:
                unsent = self._unsent
                unsent[id(msg)] = (msg, span)
                if len(unsent) > MAX_IN_FLIGHT:
                    del unsent[next(iter(unsent))]
            return False
        key = _message_id(msg)
        if key is None:  # a plain value: nothing can match its reply
            span.end()
            return True
        with self._lock:
            self._open[key] = span
            if len(self._open) > MAX_IN_FLIGHT:
                self._open.pop(next(iter(self._open))).end()
        return True

    def _replied(self, reply: Any) -> None:
        cid = getattr(reply, "correlation_id", None)
        with self._lock:
            span = self._open.pop(cid, None) if cid is not None else None
            if span is None:
                span = self._open.pop(_message_id(reply), None)
            got = self._arrived.pop(id(reply), None) if self._arrived else None
        if span is not None:
            span.end()
        kernel = self._kernel
        target = kernel.forwards_to
        if target is None or (cid is not None and reply_key(reply) in kernel.reply_waiters):
            return  # it goes to the outbox, or to its caller: no next hop
        if got is not None and got[0] is reply:  # the context it came back in
            self._tracer.sent(target.kernel_id, reply, got[1])
        elif span is not None:
            self._tracer.sent(target.kernel_id, reply, _trace.set_span_in_context(span))

    def poll_reply(self) -> Any:
        reply = self.inner.poll_reply()
        if reply is not None:
            self._replied(reply)
        return reply

    def drain_replies(self) -> list[Any]:
        replies = self.inner.drain_replies()
        for r in replies:
            if not isinstance(r, BaseException):
                self._replied(r)
        return replies

    def stop(self, timeout: float) -> bool:
        inner = self.inner
        try:
            return inner.stop(timeout)
        finally:
            failure = inner.failure
            culprit = None
            if failure is not None:  # the span of the message the actor failed on says so
                failed_on = inner.failed_on
                culprit = None if failed_on is None else _message_id(failed_on)
            with self._lock:
                failed = self._open.pop(culprit, None) if culprit is not None else None
                left = [*self._open.values(), *(s for _, s in self._unsent.values())]
                self._open, self._unsent, self._arrived = {}, {}, {}
            if failed is not None:
                assert failure is not None
                record_failure(failed, failure)
                failed.end()
            for span in left:  # no reply came for these
                span.end()

    @property
    def failed_on(self) -> Any:
        return self.inner.failed_on

    # -- delegated -------------------------------------------------------------------------

    @property
    def max_message_bytes(self) -> int | None:
        return self.inner.max_message_bytes

    @property
    def pending_input(self) -> int:
        return self.inner.pending_input

    @property
    def is_idle(self) -> bool:
        return self.inner.is_idle

    @property
    def failure(self) -> BaseException | None:
        return self.inner.failure

    def start(self) -> None:
        self.inner.start()

    def set_room(self, n: int) -> bool:
        return self.inner.set_room(n)

    def on_writable(self, callback: Callable[[], None]) -> None:
        self.inner.on_writable(callback)

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self.inner.on_readable(callback)

    def watch(self, loop: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
        return self.inner.watch(loop, callback)

    def on_late_reply(self, callback: Callable[[], None]) -> None:
        self.inner.on_late_reply(callback)

    def take_undelivered(self) -> list[Any]:
        return self.inner.take_undelivered()

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        return self.inner.drain_latencies()
