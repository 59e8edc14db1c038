"""`KernelContext`: what a tier-1 actor function receives (its inbox, outbox and flags).

The context holds what ``ctx.receive``/``ctx.send`` read on every message in its own
slots, so that each costs one call on the hot path and reads no attribute of the kernel:
the queues, the reply waiters and the runtime's lookup are bound at construction; the
deactivation gate, the forward target, the stopping flag and whether the kernel answers
``send_and_receive`` requests are pushed to it by the kernel when they change
(`KernelContext.kernel_changed`). The kernel reads back the
message in hand through `take_unfinished`, `message_done` and `forget_current`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..decorators.validators import check_message
from ..exceptions import (
    KernelStateError,
    MessageDeserializationError,
    QueueFullError,
)
from .config import RingKernelConfig
from .fast_queue import FastMessageQueue
from .message import RingKernelMessage, check_fields, fields_check, stamp_reply
from .states import KernelState
from .telemetry import RingKernelTelemetry

__all__ = ("SEND_YIELD_EVERY", "ActorHost", "KernelContext", "Peer")

logger = logging.getLogger("pydotcompute")

#: An actor's ``ctx.send`` / ``ctx.send_to`` lets the event loop run other tasks at least
#: once every this many messages, even when every send finds room at once.
SEND_YIELD_EVERY = 64


class Peer(Protocol):
    """A kernel an actor sends into (`RingKernel` is one): its intake."""

    kernel_id: str

    async def accept(self, msg: Any, timeout: float | None = None) -> None: ...

    def accept_nowait(self, msg: Any) -> None: ...


class ActorHost(Protocol):
    """What an actor's context uses of its kernel (`RingKernel` is one). A protocol rather
    than the class: the kernel imports this module to make its contexts, and a module that
    imported the kernel back, even for its types, would tie the two into a cycle."""

    kernel_id: str
    output_type: type | None
    telemetry: RingKernelTelemetry
    config: RingKernelConfig

    @property
    def inbox(self) -> FastMessageQueue[Any] | None: ...

    @property
    def outbox(self) -> FastMessageQueue[Any] | None: ...

    @property
    def state(self) -> KernelState: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def answers_requests(self) -> bool: ...

    @property
    def telemetry_enabled(self) -> bool: ...

    @property
    def reply_waiters(self) -> dict[Any, Any]: ...

    @property
    def lookup(self) -> Callable[[str], Peer] | None: ...

    @property
    def forwards_to(self) -> Peer | None: ...

    def hand_to_caller(self, reply: Any) -> bool: ...

    def reply_kept(self, target: Any, exc: BaseException) -> None: ...

    def count_lost_reply(self) -> None: ...


class KernelContext:
    """What the actor function receives: its inbox, outbox and lifecycle flags.

    Every method runs on the runtime's event loop, in the actor's task.
    """

    __slots__ = (
        "_answers",
        "_current",
        "_forward",
        "_gate",
        "_handling",
        "_inbox",
        "_kernel",
        "_lookup",
        "_outbox",
        "_rec",
        "_reply_for",
        "_reply_ok",
        "_reply_t",
        "_sends_left",
        "_stopping",
        "_tel",
        "_waiters",
        "kernel_id",
    )

    def __init__(self, kernel: ActorHost, telemetry: RingKernelTelemetry | None = None) -> None:
        """Bind the context to its (launched) ``kernel``; ``telemetry``: the record this
        actor counts into (a pool replica's own), by default the kernel's."""
        self._kernel = kernel
        self.kernel_id = kernel.kernel_id
        self._inbox: FastMessageQueue[Any] = kernel.inbox  # type: ignore[assignment]
        self._outbox: FastMessageQueue[Any] = kernel.outbox  # type: ignore[assignment]
        self._lookup = kernel.lookup
        self._waiters = kernel.reply_waiters  # the kernel's own dict (emptied in place)
        self._gate: asyncio.Future[None] | None = None
        self._forward: Peer | None = kernel.forwards_to
        self._stopping = kernel.stopping
        # a kernel that had a send_and_receive request: each reply goes by `hand_to_caller`
        # even with no caller waiting, so one whose caller gave up is dropped, not queued
        self._answers = kernel.answers_requests
        tel = kernel.telemetry if telemetry is None else telemetry
        self._tel: RingKernelTelemetry | None = tel if kernel.telemetry_enabled else None
        # times each message, from ``receive`` taking it to the next ``receive``
        self._rec = None if self._tel is None else self._tel.latency_recorder
        self._current: Any = None
        # True from the moment a message is taken until the actor asks for the next one:
        # a message cut off by terminate's grace period is reported, not processed
        self._handling = False
        # the last reply class that passed validation against output type ``_reply_for``
        # and whose correlation slot can be written directly (see ``_prepare_reply``)
        self._reply_t: Any = None  # a class (Any: ``type(msg) is`` must not narrow msg)
        self._reply_for: Any = None
        # ... and the cheap field check of that class (None: fields are not checked)
        self._reply_ok: Any = None
        # sends until the next forced turn of the loop (``SEND_YIELD_EVERY``)
        self._sends_left = SEND_YIELD_EVERY

    @property
    def should_terminate(self) -> bool:
        """True once termination was requested and the inbox is drained."""
        return self._stopping and not self._inbox.qsize

    @property
    def is_active(self) -> bool:
        """True while messages are being delivered (not deactivated, not stopping)."""
        return self._kernel.state is KernelState.ACTIVE

    @property
    def state(self) -> KernelState:
        return self._kernel.state

    @property
    def handling(self) -> bool:
        """The actor took a message and has not finished it (see `take_unfinished`)."""
        return self._handling and self._current is not None

    @property
    def current_message(self) -> Any:
        """The message most recently returned by `receive`."""
        return self._current

    async def wait_active(self) -> None:
        """Wait until the kernel is active (returns at once if it is, or if stopping)."""
        gate = self._gate
        if gate is not None:
            await asyncio.shield(gate)

    async def receive(self, timeout: float | None = None) -> Any:
        """The next message, by priority band then FIFO.

        On a ``serialize=True`` kernel a message that does not decode (a field of the wrong
        type, say) is counted as dropped, its error recorded in telemetry, and skipped: one
        bad message never stops the actor.

        Raises:
            QueueTimeoutError: nothing arrived within ``timeout`` seconds (a TimeoutError).
            QueueClosedError: the kernel is terminating and its inbox is drained; let it
                propagate (or check ``should_terminate``) to end the actor cleanly.
        """
        rec = self._rec
        self._handling = False
        if self._gate is not None:
            if rec is not None:  # the previous message's time ends before any wait
                rec.idle()
            await self.wait_active()
        inbox = self._inbox
        while True:
            try:
                if inbox.qsize:
                    msg = inbox.take()
                else:
                    if rec is not None:
                        rec.idle()
                    if timeout is not None:
                        msg = await inbox.take_within(timeout)
                    else:
                        while True:  # ``inbox.get()`` inlined: one frame less to resume
                            fut = inbox.park_getter()
                            try:
                                await fut
                            except BaseException:
                                inbox.unpark_getter(fut)
                                raise
                            if inbox.qsize:
                                msg = inbox.take()
                                break
                break
            except MessageDeserializationError as exc:  # only a serialize=True inbox decodes
                self._skip(exc)
        if self._gate is not None:  # deactivated while we waited: hold the message
            if rec is not None:
                rec.idle()
            await self.wait_active()
        self._current = msg
        self._handling = True
        if rec is not None:
            rec.took()  # one clock read: ends the previous message's time, starts this one
            self._tel.messages_processed += 1  # type: ignore[union-attr]
        return msg

    def _skip(self, exc: MessageDeserializationError) -> None:
        """A frame of a ``serialize=True`` inbox that does not decode: counted as dropped,
        its error recorded, and the actor goes on with the next message."""
        k = self._kernel
        k.telemetry.record_error(exc)
        k.telemetry.record_drop(reason="undecodable")
        self._inbox.count_dropped(1)
        logger.warning("kernel %r: dropped a message that does not decode: %s", k.kernel_id, exc)

    def receive_nowait(self) -> Any:
        """The next message or None; never waits (ignores deactivation)."""
        self._handling = False
        msg = self._inbox.get_nowait()
        if msg is not None:
            self._current = msg
            self._handling = True
            if self._tel is not None:
                self._tel.messages_processed += 1
        return msg

    def _prepare_reply(self, msg: Any) -> Any:
        """Validate a reply against ``output_type`` and stamp its correlation.

        A reply without ``correlation_id`` is stamped by `stamp_reply`: with the current
        request itself (resolved to its ``message_id`` on first read, so no id is made
        unless someone looks), or with its id where holding it could close a loop. Once a
        message class has passed, later replies of that class take the short path in
        `send`.
        """
        k = self._kernel
        out_t = k.output_type
        t = type(msg)
        if out_t is not None and t is not out_t and not isinstance(msg, out_t):
            check_message(msg, out_t, k.kernel_id, "must send")
        checked = k.config.check_fields
        if checked:
            check_fields(msg, k.kernel_id, "must send")
        stamp_reply(msg, self._current)
        if self._tel is not None:
            self._tel.messages_sent += 1
        if t is not self._reply_t and issubclass(t, RingKernelMessage):
            self._reply_t = t
            self._reply_for = out_t
            self._reply_ok = fields_check(t) if checked else None
        return msg

    async def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Send a reply: to a waiting ``send_and_receive`` caller, a connected kernel, or
        the outbox (waiting for space under ``block`` backpressure). A connected kernel
        that stopped taking messages leaves the reply in this kernel's outbox, readable;
        a full ``reject`` one raises ``QueueFullError`` (the reply counted as dropped).

        A reply without ``correlation_id`` is stamped with the current request's id.
        Every `SEND_YIELD_EVERY` calls this lets the loop run other tasks first, so an
        actor that sends many messages into queues with room never starves them.
        """
        self._sends_left -= 1
        if not self._sends_left:
            self._sends_left = SEND_YIELD_EVERY
            await asyncio.sleep(0)
        k = self._kernel
        ok = self._reply_ok
        if (
            type(msg) is self._reply_t
            and k.output_type is self._reply_for
            and (ok is None or ok(msg))
        ):
            # a class already validated, fields that pass: only the correlation is left
            stamp_reply(msg, self._current)
            tel = self._tel
            if tel is not None:
                tel.messages_sent += 1
        else:
            msg = self._prepare_reply(msg)
        if self._answers and k.hand_to_caller(msg):  # a caller's reply
            self._handling = False  # answered: the message in hand is finished
            return True
        target = self._forward
        if target is not None:
            try:
                await target.accept(msg, timeout)
            except QueueFullError:
                # a reject-policy kernel downstream refused it: the reply is counted as
                # dropped and the actor told
                self._handling = False
                self._count_lost_reply()
                raise
            except KernelStateError as exc:
                # the kernel downstream stopped: the reply stays here, readable (below)
                k.reply_kept(target, exc)
                if self._stopping:  # draining: never wait for room any more
                    self._outbox.put_overflow(msg)
                    return True
            except asyncio.CancelledError:
                if self.state in (KernelState.TERMINATING, KernelState.FAILED):
                    # cut off while the kernel downstream was full: the reply never got
                    # anywhere, so the message in hand is not finished; terminate (or the
                    # failure) hands it back first
                    if self._tel is not None:
                        self._tel.messages_sent -= 1
                    raise
                self._handling = False  # the message ended: its reply is counted
                self._count_lost_reply()
                raise
            else:
                self._handling = False
                return True
        out = self._outbox
        if out.offer(msg):  # open, with room: appended
            self._handling = False
            return True
        try:
            put = await out.put(msg, timeout=timeout)
        except asyncio.CancelledError:
            if self._stopping and not out.closed:
                # terminate's grace period ran out while the outbox was full: the reply
                # exists, so it stays readable (beyond the bound) and the message it
                # answers counts as handled, not as undelivered as well
                out.put_overflow(msg)
                self._handling = False
            else:
                self._count_lost_reply()
            raise
        if put:
            self._handling = False
        return put

    def _count_lost_reply(self) -> None:
        """A reply that got nowhere (nobody waits for it any more, a reject-policy kernel
        downstream refused it, or its send was cancelled): counted as dropped."""
        self._kernel.count_lost_reply()

    def send_nowait(self, msg: Any) -> bool:
        """Like `send` but raises ``QueueFullError`` instead of waiting."""
        msg = self._prepare_reply(msg)
        if self._answers and self._kernel.hand_to_caller(msg):
            self._handling = False
            return True
        target = self._forward
        if target is not None:
            try:
                target.accept_nowait(msg)
                self._handling = False
                return True
            except KernelStateError as exc:  # stopped downstream: kept here, as in `send`
                self._kernel.reply_kept(target, exc)
                if self._stopping:
                    self._outbox.put_overflow(msg)
                    self._handling = False
                    return True
        put = self._outbox.put_nowait(msg)
        if put:
            self._handling = False
        return put

    async def send_to(self, kernel_id: str, msg: Any, timeout: float | None = None) -> bool:
        """Send ``msg`` straight into another kernel's inbox (same runtime); yields to the
        loop as `send` does."""
        self._sends_left -= 1
        if not self._sends_left:
            self._sends_left = SEND_YIELD_EVERY
            await asyncio.sleep(0)
        lookup = self._lookup
        if lookup is None:
            raise KernelStateError(
                self.kernel_id,
                self._kernel.state,
                "send_to",
                "the kernel is not managed by a RingKernelRuntime",
            )
        if self._tel is not None:
            self._tel.messages_sent += 1
        await lookup(kernel_id).accept(msg, timeout)
        self._handling = False
        return True

    # -- the kernel's side (called by the kernel, not by actors) --------------------------

    def kernel_changed(
        self,
        gate: asyncio.Future[None] | None,
        forward: Peer | None,
        stopping: bool,
        answers: bool = False,
    ) -> None:
        """Take the kernel's new deactivation gate, forward target, stopping flag and
        `RingKernel.answers_requests`."""
        self._gate = gate
        self._forward = forward
        self._stopping = stopping
        self._answers = answers

    def take_unfinished(self) -> list[Any]:
        """The message the actor was handling (taken, not answered, and it has not asked
        for the next one) as a one-item list, else ``[]``; it stops counting as processed.
        Used when the actor was cancelled or raised on it."""
        if not self._handling or self._current is None:
            return []
        self._handling = False
        if self._tel is not None:
            self._tel.messages_processed -= 1
        return [self._current]

    def message_done(self) -> None:
        """The actor finished the message in hand (it returned, or asked for the next)."""
        self._handling = False

    def actor_raised(self, exc: BaseException) -> None:
        """The actor raised ``exc`` (the message in hand, if any, unfinished). Nothing to
        do here: a tracing runtime's context records it on that message's span."""

    def forget_current(self) -> None:
        """The actor restarts: no message in hand, and the one it raised on is not timed."""
        self._current = None
        self._handling = False
        if self._rec is not None:
            self._rec.cancel()


class DecodingContext(KernelContext):
    """The context of a ``serialize=True`` kernel: a message that does not decode is
    counted as dropped and skipped instead of failing the actor (no poison pill)."""

    __slots__ = ()

    def receive_nowait(self) -> Any:
        while True:
            try:
                return KernelContext.receive_nowait(self)
            except MessageDeserializationError as exc:
                self._skip(exc)
