"""Instruments: hooks the runtime calls where its policy lives (tracing, metrics, yours).

An `Instrument` is an object whose methods the runtime calls as messages move: a message
sent into a kernel, taken by an actor, answered, dropped; an actor that raised; a kernel
launched. Every method of the base class does nothing, so an instrument overrides only the
events it wants. Install instruments with ``RingKernelRuntime(instruments=[...])`` or
`RingKernelRuntime.add_instrument`; ``tracing=True`` installs the OpenTelemetry one
(`observability.tracing.MessageTracer`).

Design notes:
- trio's ``Instrument`` is the model: a base class of no-op hooks and a list on the runtime
  whose members are called in turn. Nothing of a live object is replaced (a tracing runtime
  once shadowed its own ``send`` and wrapped each hosted kernel's worker): the runtime
  and the bridge call the hooks themselves, at the points where the policy they observe is
  written, so an instrument sees exactly what the policy does.
- Cost with none installed: a truth test of the runtime's list at ``runtime.send`` and
  ``send_and_receive`` (which then return the kernel's own coroutine, as they always did)
  and at the bridge's hand-over and collection. An asyncio actor's context is chosen once,
  at launch: under an instrumented runtime it is `instrumented_context` of the plain one,
  which reports; otherwise the plain one, which checks nothing per message.
- A hook that raises is logged and its instrument removed (trio does the same): a hook
  runs inside the runtime's promises (a send, a hand-over, a terminate), and a faulty
  observer must not break them.
- Hooks run on the runtime's event loop, synchronously, in the task where the event
  happens (`Instrument.message_taken` on the asyncio tier: in the actor's own task, so a
  context variable set there is the actor's). They must not block or await.
- Off-loop tiers report what the bridge sees: a message is "taken" when the bridge hands
  it to the tier, and the tier's replies are "collected" as the bridge takes them back; the
  actor's own steps inside a thread, a child process or a device are not observed (its
  tier may carry trace context there, `TierWorker.trace_wire`).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from .context import KernelContext
from .message import reply_key, stamp_reply

__all__ = ("Instrument", "Instruments", "instrumented_context")

logger = logging.getLogger("pydotcompute")

T = TypeVar("T")


class Instrument:
    """Hooks the runtime calls as messages move; every one does nothing here.

    ``kernel`` is the `RingKernel` concerned (``kernel.kernel_id``, ``kernel.config.tier``,
    ``kernel.worker`` is None when its actor runs on the event loop). Hooks are called on
    the runtime's loop and must return quickly; one that raises is logged and its
    instrument removed.
    """

    def kernel_launched(self, kernel: Any) -> None:
        """``kernel`` was launched (its queues and worker exist; nothing runs yet)."""

    def message_sending(self, kernel: Any, msg: Any) -> None:
        """``msg`` is about to be sent into ``kernel``: by ``runtime.send`` or
        ``send_nowait``, or by an asyncio actor's ``ctx.send`` into the kernel it is
        connected to, or its ``ctx.send_to``. In the sender's task, before the kernel's
        intake (which may wait for room)."""

    def message_sent(self, kernel: Any, msg: Any, error: BaseException | None) -> None:
        """The send of `message_sending` ended: ``kernel`` took ``msg`` (``error`` None),
        or refused it, ``error`` being what the send raises (a full ``reject`` inbox, a
        wrong type, a kernel that stopped, a cancellation)."""

    def request_started(self, kernel: Any, msg: Any) -> None:
        """``runtime.send_and_receive(kernel_id, msg)`` began, in the caller's task."""

    def request_finished(self, kernel: Any, msg: Any, error: BaseException | None) -> None:
        """That request ended: answered (``error`` None) or not (``error`` is what it
        raises: refused, timed out, cancelled, the actor failed)."""

    def message_taken(self, kernel: Any, msg: Any) -> None:
        """An actor of ``kernel`` has ``msg`` now. On the asyncio tier: in the actor's own
        task, as ``ctx.receive`` returns it. On an off-loop tier: as the bridge hands it
        to the tier (a thread, a child process, a device)."""

    def message_finished(self, kernel: Any, msg: Any) -> None:
        """An asyncio actor is done with ``msg``: it asked for the next message, or
        returned. In the actor's task. (Off-loop tiers: see `reply_collected`.)"""

    def reply_collected(self, kernel: Any, reply: Any) -> None:
        """An off-loop tier's actor sent ``reply`` and the bridge took it back, before it
        goes to its caller, the connected kernel or the outbox."""

    def actor_failed(self, kernel: Any, msg: Any, error: BaseException) -> None:
        """An actor of ``kernel`` raised ``error`` while it held ``msg`` (None: it held
        none, or the tier cannot tell). On the asyncio tier, before a restart or the
        kernel's failure; on an off-loop tier, once, when the bridge stops the failed
        worker."""

    def worker_stopped(self, kernel: Any) -> None:
        """An off-loop tier's worker stopped (terminate, a failure, its actor returned):
        whatever it was handed and did not answer ends as handed back or dropped."""

    def edge_routed(self, kernel: Any, direct: bool) -> None:
        """``runtime.connect`` made ``kernel``'s output go into a direct edge (``direct``
        True: its actor's sends no longer come back through the bridge), or
        ``runtime.connect``/``disconnect`` routed it through the loop again (False)."""

    def message_dropped(
        self, kernel: Any, msg: Any, reason: str, error: BaseException | None = None
    ) -> None:
        """``msg`` ends as one of ``kernel``'s counted drops, under telemetry's ``reason``:
        ``"backpressure"`` (a full ``drop_oldest`` inbox evicted it: bytes, on a
        ``serialize=True`` kernel), ``"undelivered"`` (handed back by terminate or a
        failure), ``"reply_lost"`` (a reply a full ``reject`` kernel downstream refused),
        ``"other"`` (a message the tier could not take: ``error`` says why)."""


class Instruments(list[Instrument]):
    """The runtime's instruments, in the order installed; each hook calls every one.

    Kernels hold this very list, so an instrument added later is called from then on
    (a kernel launched before it keeps the context it got: see the module notes).
    """

    __slots__ = ()

    def _emit(self, hook: str, *args: Any) -> None:
        for inst in list(self):  # (a hook that raises removes its instrument)
            try:
                getattr(inst, hook)(*args)
            except Exception:
                logger.exception(
                    "instrument %r raised in %s; it is removed from the runtime", inst, hook
                )
                if inst in self:
                    self.remove(inst)

    # -- the hooks, fanned out --------------------------------------------------------------

    def kernel_launched(self, kernel: Any) -> None:
        self._emit("kernel_launched", kernel)

    def message_sending(self, kernel: Any, msg: Any) -> None:
        self._emit("message_sending", kernel, msg)

    def message_sent(self, kernel: Any, msg: Any, error: BaseException | None) -> None:
        self._emit("message_sent", kernel, msg, error)

    def request_started(self, kernel: Any, msg: Any) -> None:
        self._emit("request_started", kernel, msg)

    def request_finished(self, kernel: Any, msg: Any, error: BaseException | None) -> None:
        self._emit("request_finished", kernel, msg, error)

    def message_taken(self, kernel: Any, msg: Any) -> None:
        self._emit("message_taken", kernel, msg)

    def message_finished(self, kernel: Any, msg: Any) -> None:
        self._emit("message_finished", kernel, msg)

    def reply_collected(self, kernel: Any, reply: Any) -> None:
        self._emit("reply_collected", kernel, reply)

    def actor_failed(self, kernel: Any, msg: Any, error: BaseException) -> None:
        self._emit("actor_failed", kernel, msg, error)

    def worker_stopped(self, kernel: Any) -> None:
        self._emit("worker_stopped", kernel)

    def edge_routed(self, kernel: Any, direct: bool) -> None:
        self._emit("edge_routed", kernel, direct)

    def message_dropped(
        self, kernel: Any, msg: Any, reason: str, error: BaseException | None = None
    ) -> None:
        self._emit("message_dropped", kernel, msg, reason, error)

    # -- a send or a request, reported around the kernel's own coroutine -------------------

    def send(self, kernel: Any, msg: Any, timeout: float | None) -> Coroutine[Any, Any, bool]:
        """``kernel.send(msg, timeout)``, reported (`message_sending`, `message_sent`)."""
        self.message_sending(kernel, msg)
        return self.intake(kernel, msg, kernel.send(msg, timeout))

    async def intake(self, kernel: Any, msg: Any, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro``, the intake of ``msg`` by ``kernel`` that `message_sending`
        announced, and report how it ended (`message_sent`)."""
        try:
            result = await coro
        except BaseException as exc:
            self.message_sent(kernel, msg, exc)
            raise
        self.message_sent(kernel, msg, None)
        return result

    def send_nowait(self, kernel: Any, msg: Any) -> None:
        """``kernel.accept_nowait(msg)``, reported."""
        self.message_sending(kernel, msg)
        try:
            kernel.accept_nowait(msg)
        except BaseException as exc:
            self.message_sent(kernel, msg, exc)
            raise
        self.message_sent(kernel, msg, None)

    async def request(self, kernel: Any, msg: Any, timeout: float | None) -> Any:
        """``kernel.send_and_receive(msg, timeout)``, reported (`request_started`,
        `request_finished`)."""
        self.request_started(kernel, msg)
        try:
            reply = await kernel.send_and_receive(msg, timeout)
        except BaseException as exc:
            self.request_finished(kernel, msg, exc)
            raise
        self.request_finished(kernel, msg, None)
        return reply


# -- an asyncio actor's context under instruments --------------------------------------------

_INSTRUMENTED: dict[type, type] = {}
_NONE: Any = object()  # no message reported as taken and not finished


def instrumented_context(base: type[KernelContext]) -> type[KernelContext]:
    """``base`` (an asyncio actor's context class) reporting to its kernel's instruments:
    each message taken and finished, the actor raising, and its sends into other kernels.
    One class per base, made on first use; chosen at launch by an instrumented runtime's
    kernels, so a plain context checks nothing per message."""
    made = _INSTRUMENTED.get(base)
    if made is not None:
        return made
    base_receive = base.receive
    base_receive_nowait = base.receive_nowait
    base_send = base.send
    base_send_nowait = base.send_nowait
    base_send_to = base.send_to
    base_message_done = base.message_done
    base_actor_raised = base.actor_raised

    class Instrumented(base):  # type: ignore[valid-type,misc]
        __slots__ = ("_instruments", "_taken")

        def __init__(self, kernel: Any, *args: Any) -> None:
            super().__init__(kernel, *args)
            self._instruments: Instruments = kernel.instruments
            self._taken: Any = _NONE

        def _finish(self) -> None:
            msg = self._taken
            if msg is not _NONE:
                self._taken = _NONE
                self._instruments.message_finished(self._kernel, msg)

        def _take(self, msg: Any) -> Any:
            if msg is not None:
                self._taken = msg
                self._instruments.message_taken(self._kernel, msg)
            return msg

        async def receive(self, timeout: float | None = None) -> Any:
            self._finish()  # asking for the next message finishes the previous one
            return self._take(await base_receive(self, timeout))

        def receive_nowait(self) -> Any:
            self._finish()
            return self._take(base_receive_nowait(self))

        def message_done(self) -> None:
            base_message_done(self)
            self._finish()

        def actor_raised(self, exc: BaseException) -> None:
            base_actor_raised(self, exc)
            msg, self._taken = self._taken, _NONE
            self._instruments.actor_failed(self._kernel, None if msg is _NONE else msg, exc)

        def _forwarding(self, msg: Any) -> Any:
            """The kernel ``msg`` goes on to: the forward target, unless ``msg`` is the
            reply a ``send_and_receive`` caller waits for (it goes to the caller)."""
            target = self._forward
            if target is not None and self._waiters:
                stamp_reply(msg, self._current)  # (as the send does: not stamped twice)
                if reply_key(msg) in self._waiters:
                    return None
            return target

        async def send(self, msg: Any, timeout: float | None = None) -> bool:
            target = self._forwarding(msg)
            if target is None:
                result: bool = await base_send(self, msg, timeout)
                return result
            self._instruments.message_sending(target, msg)
            return await self._instruments.intake(target, msg, base_send(self, msg, timeout))

        def send_nowait(self, msg: Any) -> bool:
            target = self._forwarding(msg)
            if target is None:
                result: bool = base_send_nowait(self, msg)
                return result
            instruments = self._instruments
            instruments.message_sending(target, msg)
            try:
                result = base_send_nowait(self, msg)
            except BaseException as exc:
                instruments.message_sent(target, msg, exc)
                raise
            instruments.message_sent(target, msg, None)
            return result

        async def send_to(self, kernel_id: str, msg: Any, timeout: float | None = None) -> bool:
            lookup = self._lookup
            if lookup is None:  # (the plain send_to raises the error)
                result: bool = await base_send_to(self, kernel_id, msg, timeout)
                return result
            target = lookup(kernel_id)
            self._instruments.message_sending(target, msg)
            coro = base_send_to(self, kernel_id, msg, timeout)
            return await self._instruments.intake(target, msg, coro)

    Instrumented.__name__ = Instrumented.__qualname__ = f"Instrumented{base.__name__}"
    _INSTRUMENTED[base] = Instrumented
    return Instrumented
