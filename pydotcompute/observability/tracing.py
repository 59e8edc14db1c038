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
  takes it (at most `MAX_IN_FLIGHT` entries; the oldest are forgotten beyond).
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

from ..ring_kernels.message import RingKernelMessage, claim_request_key, request_space
from ..ring_kernels.tiers.contract import TierWorker
from .deps import require

if TYPE_CHECKING:
    from ..ring_kernels.context import KernelContext
    from ..ring_kernels.kernel import RingKernel
    from ..ring_kernels.runtime import RingKernelRuntime

_trace = require("opentelemetry.trace", "tracing=True")
_context = require("opentelemetry.context", "tracing=True")

__all__ = ("MAX_IN_FLIGHT", "MessageTracer", "TracingWorker")

#: most messages whose trace context is remembered between send and receive
MAX_IN_FLIGHT = 65_536
_SYSTEM = "pydotcompute"


def _message_id(msg: Any) -> Any:
    return getattr(msg, "message_id", None)


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
        self._lock = threading.Lock()  # hosted bridges may call from worker threads
        self._classes: dict[type, type] = {}

    # -- the context a message carries -------------------------------------------------

    def carry(self, msg: Any, ctx: Any) -> None:
        """Remember that ``msg`` travels in trace context ``ctx``."""
        with self._lock:
            carried = self._carried
            carried[id(msg)] = (msg, ctx)
            if len(carried) > MAX_IN_FLIGHT:
                del carried[next(iter(carried))]

    def take(self, msg: Any) -> Any:
        """The context ``msg`` travels in (forgotten now), or None."""
        with self._lock:
            got = self._carried.pop(id(msg), None)
        return None if got is None or got[0] is not msg else got[1]

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
        """How many messages' contexts are remembered now."""
        return len(self._carried)

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

    def sent(self, kernel_id: str, msg: Any, parent: Any = None) -> None:
        """A ``send <kernel_id>`` span (under ``parent``, a Context; None: the current
        one), and ``msg`` carries it on."""
        span = self.tracer.start_span(
            f"send {kernel_id}",
            context=parent,
            kind=_trace.SpanKind.PRODUCER,
            attributes=self._attributes(kernel_id, msg),
        )
        self.carry(msg, _trace.set_span_in_context(span))
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
        process tiers); tier-1 kernels are traced through their context class."""
        wrap = getattr(kernel, "wrap_worker", None)
        if wrap is not None:
            wrap(lambda worker: TracingWorker(worker, self, kernel))
            return
        wire = getattr(kernel, "trace_wire", None)  # a kernel-level tier with a wire (Ray)
        if wire is not None:
            wire(self.take_ids)

    def wrap_runtime(self, runtime: RingKernelRuntime) -> None:
        """Shadow ``runtime.send`` and ``runtime.send_and_receive`` with traced ones."""
        send = runtime.send
        send_and_receive = runtime.send_and_receive
        sent = self.sent

        def traced_send(
            kernel_id: str, msg: Any, *, timeout: float | None = None
        ) -> Coroutine[Any, Any, bool]:
            coro = send(kernel_id, msg, timeout=timeout)  # unknown ids raise here, untraced
            sent(kernel_id, msg)
            return coro

        async def traced_send_and_receive(
            kernel_id: str, msg: Any, *, timeout: float | None = None
        ) -> Any:
            runtime.get_kernel(kernel_id)  # unknown ids raise before a span is made
            if isinstance(msg, RingKernelMessage):
                # the id the span names is the one the kernel's request gets: made in
                # its request space (see `RingKernel.claim_request`), not by the span
                claim_request_key(msg, request_space(kernel_id))
            sent(kernel_id, msg)
            return await send_and_receive(kernel_id, msg, timeout=timeout)

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

        def _sending(self, msg: Any) -> None:
            target = self._kernel.forwards_to
            if target is not None:
                parent = _trace.set_span_in_context(self._span)
                tracer.sent(target.kernel_id, msg, parent)

        async def send(self, msg: Any, timeout: float | None = None) -> bool:
            self._sending(msg)
            result: bool = await base_send(self, msg, timeout)
            return result

        def send_nowait(self, msg: Any) -> bool:
            self._sending(msg)
            result: bool = base_send_nowait(self, msg)
            return result

        async def send_to(self, kernel_id: str, msg: Any, timeout: float | None = None) -> bool:
            tracer.sent(kernel_id, msg, _trace.set_span_in_context(self._span))
            result: bool = await base_send_to(self, kernel_id, msg, timeout)
            return result

    TracedContext.__name__ = TracedContext.__qualname__ = f"Traced{base.__name__}"
    return TracedContext


class TracingWorker(TierWorker):
    """A `TierWorker` whose messages are traced on the runtime's side of the bridge: the
    ``process`` span runs from the hand-over to the actor's reply (see the module notes)."""

    def __init__(self, inner: TierWorker, tracer: MessageTracer, kernel: RingKernel) -> None:
        self.inner = inner
        self.ACTOR_KIND = inner.ACTOR_KIND  # type: ignore[misc]
        self.SUPPORTS_RESTART = inner.SUPPORTS_RESTART  # type: ignore[misc]
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
            span.record_exception(exc)
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
        target = self._kernel.forwards_to
        if target is None:
            return
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
        try:
            return self.inner.stop(timeout)
        finally:
            with self._lock:
                left = [*self._open.values(), *(s for _, s in self._unsent.values())]
                self._open, self._unsent, self._arrived = {}, {}, {}
            for span in left:  # no reply came for these
                span.end()

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
