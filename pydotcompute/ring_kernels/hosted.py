"""The bridge between the runtime's policy and a tier that runs the actor off the loop.

A hosted kernel keeps the tier-1 face (a banded asyncio inbox with the user's backpressure,
an asyncio outbox, correlated `send_and_receive`, `connect`) and runs the actor in a
`TierWorker`: a thread, a child process, a persistent GPU kernel.
It talks to the worker only through that contract.

Design notes:
- Two tasks bridge the worlds. The *pump* moves messages from the inbox into the worker in
  priority order, at most `bridge_queue_size` not yet taken by the actor, honouring
  deactivation; the *collector* moves replies out (to a waiting `send_and_receive` caller,
  a connected kernel, or the outbox). Neither blocks the loop: the worker calls a waker
  from its own thread, handed to the loop with `call_soon_threadsafe`, or the loop watches
  the worker's descriptors itself (`TierWorker.watch`); a slow poll (`_POLL_S`) is the
  safety net.
- Accounting is the runtime's: the pump counts a message as processed when it hands it
  over; whatever the worker gives back as undelivered (once: `take_undelivered`), and the
  message the pump still held, stop counting as processed and are handed back. Replies
  still inside the worker at terminate are delivered, not discarded: into the outbox even
  beyond its bound (it stays readable until drained), or counted as dropped when their
  destination (a full downstream kernel, a caller that gave up) cannot take them.
- A reply forwarded into a `reject`-policy kernel that is full is counted as dropped on
  the source; the source keeps running (its actor, elsewhere, cannot be handed the
  error as a tier-1 actor is). One forwarded into a kernel that stopped is kept in the
  source's outbox, as on every tier (`RingKernel.reply_kept`).
- The collector yields to the loop every `SEND_YIELD_EVERY` replies, as a tier-1 actor's
  ``ctx.send`` does: a worker that replies faster than they are delivered would
  otherwise keep it running without a break.
- The direct path: the two tasks are the slow path. A `send` that finds the inbox empty,
  nothing held by the pump and room in the worker offers straight to the worker (the
  order of a band cannot change: nothing is queued ahead of it). The callback that learns
  a reply is ready (the loop's watcher, or one ``call_soon_threadsafe`` per burst from the
  worker's thread) polls and delivers what completes without waiting: a caller's future,
  room in the outbox or in a connected kernel. The first reply that would have to wait
  (and any error) goes to ``_ready``, which the collector empties first, so order holds.
- A caller's reply can skip the worker's reply queue: a worker that takes
  `TierWorker.hand_replies_to_callers` (the thread tier) looks the reply's key up in the
  callers' registrations on its own thread and hands reply and key to the loop in one
  ``call_soon_threadsafe``; polling the queue for it cost a round trip more than the
  hop. Only an uninstrumented bridge offers it (an instrument sees every reply polled).
- The inline request (a tier that states ``CAPABILITIES.inline_request``, launched with
  ``reply_spin_us``): while a ``send_and_receive`` caller waits, the loop polls for
  the reply (`TierWorker.reply_within`) before it parks, trading the loop's time (and a
  core) for a reply without a wake-up; a request that finds the bridge idle is handed
  over, polled for and its own reply returned from the poll, with no future,
  registration or delivery (they cost more than a quick child's whole round trip). Each
  poll's budget is passed with it: what is left of the caller's timeout, never more, so
  no state carries a limit from one call to the next. Nothing else runs on the loop
  meanwhile, so a request is registered only when something else came first, and that
  reply or error goes the bridge's way, in order. Misses shrink the budget (down to
  parking at once), with a full try every `_SPIN_PROBE_EVERY` misses: a slow actor stops
  costing the loop its budget on every request.
- A worker thread wakes the loop only when the loop waits: the readable waker schedules
  one callback until that callback has run, and the writable waker fires only while the
  pump announced it waits for room (it re-offers after announcing, so no wake-up is lost).
  Where replies come through the readable waker, room rides on that same callback.
- Batches: with a backlog the pump takes what the worker has room for and hands it over
  in one `offer_many`; the callback polls up to its budget of replies in one
  `poll_replies`. What a worker does not take waits in ``_backlog``, handed over (or
  handed back) before anything newer.
- The bridge's width: without a ``bridge_queue_size`` of the user's, a worker whose room
  can change (`TierWorker.set_room`) holds 64, widened up to 1,024 while the actor is
  measured to take that many within `BRIDGE_WINDOW_S` (0.5 ms). Each batch hand-over costs
  the actor a wake-up and, in one interpreter, two hand-overs of the GIL: at 64 a quick
  actor spends more time waking than working. An urgent message still waits behind at most
  about 0.5 ms of the actor's work, or 64 messages, as far as its recent work predicts the
  next: messages that turn slow are held until four windows pass with fewer than 16 taken.
  Where the worker passes urgent messages ahead of what its actor holds
  (`Capabilities.urgent_lane`: the thread tier), the window is 2 ms
  (`BRIDGE_WINDOW_URGENT_LANE_S`): the wait it bounds is then only NORMAL and LOW
  messages', and the wider batches cost a quick actor fewer wake-ups (pipelined through
  the thread tier, 0.73x -> 0.86x the direct kernel on the 2-CPU VM, idle cores).

- Instruments (`instruments.py`): the bridge itself reports each hand-over (a message
  "taken"), each reply it collects and the worker's stop, where those steps are written;
  with none installed each site costs one truth test. An instrumented bridge hands a
  batch over one message at a time (`_offer_each`): a tier's wire reads each message's
  trace context as it is offered.

- A worker that stops before anyone asked (its actor function returned) ends the kernel
  as a returning tier-1 actor does: TERMINATED, callers told at once, leftovers handed
  back. A reply that does not decode here is one dropped reply (logged once, its caller
  told), not a failed kernel: failing would lose every other reply for one bad class.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar

from ..exceptions import (
    KernelFailedError,
    KernelStateError,
    MessageDeserializationError,
    MessageRejectedError,
    MessageSerializationError,
    QueueClosedError,
    QueueFullError,
    TypeValidationError,
)
from .context import SEND_YIELD_EVERY
from .kernel import RingKernel
from .message import id_key, reply_key, request_key
from .states import KernelState
from .supervision import BurstLog
from .tiers.contract import Capabilities, TierWorker

__all__ = ("HostedKernel",)

logger = logging.getLogger("pydotcompute")
_POLL_S = 0.05
_perf = time.perf_counter
# the bridge's width when the user gives none (see the design notes)
BRIDGE_LEAST = 64
BRIDGE_WIDEST = 1024
BRIDGE_WINDOW_S = 0.0005
# ... and where urgent messages pass what the actor holds (`Capabilities.urgent_lane`)
BRIDGE_WINDOW_URGENT_LANE_S = 0.002
_BRIDGE_TIMED = 16  # fewest messages taken between two hand-overs that are timed
_SPIN_PROBE_EVERY = 8  # a reply spin that keeps missing still tries its full budget this often
_ACTIVE = KernelState.ACTIVE  # (a module constant: an enum member read costs ~70 ns on 3.11)


class _Raised:
    """An error the reply callback met while polling, left for the collector to report."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class HostedKernel(RingKernel):
    """A ring kernel whose actor runs in a `TierWorker`; subclasses build the worker
    in `_make_worker`."""

    EXTRA_OPTIONS = frozenset({"bridge_queue_size"})
    #: The tier's worker class: its ``CAPABILITIES`` become this kernel class's (a tier
    #: states them once, on the worker). Without one: plain-function actors, no restart,
    #: pools, and the latencies a worker may time folded in when telemetry is read.
    WORKER: ClassVar[type[TierWorker] | None] = None
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(replicas=True, telemetry_refresh=True)

    __slots__ = (
        "_backlog",
        "_bridge",
        "_bridge_mark",
        "_bridge_widens",
        "_budget",
        "_collecting",
        "_collector",
        "_drop_log",
        "_encoder",
        "_handed_direct",
        "_held",
        "_held_counted",
        "_inline",
        "_inline_turn",
        "_pump",
        "_readable",
        "_ready",
        "_reply_in_hand",
        "_reply_misses",
        "_reply_spin_max",
        "_reply_spin_s",
        "_spinner",
        "_stop_reported",
        "_undecodable_seen",
        "_unwatch",
        "_want_room",
        "_worker",
        "_writable",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        worker = cls.__dict__.get("WORKER")
        if worker is not None and "CAPABILITIES" not in cls.__dict__:
            cls.CAPABILITIES = worker.CAPABILITIES  # the tier's one statement of them

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._worker: TierWorker | None = None
        self._bridge = BRIDGE_LEAST  # how many messages the worker may hold not taken
        self._bridge_widens = False  # ... sized by `_fit_bridge` (no size given)
        # when the last batch was handed over, and what the worker held then
        self._bridge_mark = (0.0, 0)
        # the message the pump took from the inbox and has not handed to the worker yet
        self._held: Any = None
        self._held_counted = False
        # taken from the inbox in a batch that the worker did not take whole: the pump
        # hands these over one by one, before anything else from the inbox
        self._backlog: collections.deque[Any] = collections.deque()
        self._reply_in_hand: list[Any] = []  # the reply the collector is delivering
        # replies (or errors, as `_Raised`) the reply callback polled but could not
        # deliver without waiting: the collector takes these before polling the worker
        self._ready: collections.deque[Any] = collections.deque()
        self._handed_direct = 0  # messages `send` offered straight to the worker
        self._want_room = False  # the pump waits for the worker to take a message
        self._collecting = True  # the collector is delivering (not parked)
        self._budget = SEND_YIELD_EVERY  # replies the callback may deliver this loop turn
        self._pump: asyncio.Task[None] | None = None
        self._collector: asyncio.Task[None] | None = None
        self._readable: asyncio.Event | None = None
        self._writable: asyncio.Event | None = None
        self._unwatch: Any = None
        self._undecodable_seen = False  # a reply that does not decode was logged
        self._stop_reported = False  # the instruments heard that the worker stopped
        # replies a full reject-policy kernel downstream refused: one line, then a count
        self._drop_log = BurstLog(
            logger,
            logging.WARNING,
            "%d more repl(ies) refused downstream since the last line (counted as dropped)",
        )
        self._encoder: TierWorker | None = None  # the worker, when it encodes at the edge
        # the inline request (see the design notes): the worker polled for a waiting
        # caller's reply, and the one a lone request is made inline with (None: not)
        self._spinner: TierWorker | None = None
        self._inline: TierWorker | None = None
        self._reply_spin_max = 0.0  # ``reply_spin_us``, in seconds
        self._reply_spin_s = 0.0  # the budget now (adaptive)
        self._reply_misses = 0
        self._inline_turn = SEND_YIELD_EVERY  # inline requests until the loop gets a turn

    # -- hooks --------------------------------------------------------------------------

    def _make_worker(self, bridge: int) -> TierWorker:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reply_spin_budget(self) -> float:
        """The tier's ``reply_spin_us`` option, checked, in seconds (0: the loop never
        polls for a reply); read at launch, used when the tier states
        ``CAPABILITIES.inline_request``.

        Raises:
            InvalidConfigurationError: the option is not a budget the tier takes.
        """
        return 0.0

    @property
    def worker(self) -> TierWorker | None:
        """The tier's worker (None before launch)."""
        return self._worker

    @property
    def bridge_room(self) -> int:
        """How many messages the worker may hold that its actor has not taken, now: the
        ``bridge_queue_size`` given at launch, else 64 widened for a quick actor (up to
        1,024, about 0.5 ms of its measured work)."""
        return self._bridge

    # -- lifecycle ----------------------------------------------------------------------

    async def launch(self) -> None:
        await super().launch()
        extra = self.config.extra
        self._bridge = int(extra.get("bridge_queue_size", BRIDGE_LEAST))
        self._reply_spin_max = self._reply_spin_s = self._reply_spin_budget()
        self._worker = self._make_worker(self._bridge)
        if (
            "bridge_queue_size" not in extra
            and self.CAPABILITIES.resize
            and self._worker.set_room(self._bridge)
        ):
            self._bridge_widens = True
        if self._worker.max_message_bytes is not None:
            self._direct = False  # every send takes the checked path: sizes are measured
        self._fit_worker()

    def carry_trace(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """As `RingKernel.carry_trace`: the worker carries it (`TierWorker.trace_wire`)
        where the tier can (``CAPABILITIES.trace_wire``). Asked after launch, before
        activate (the worker's wire is set before it starts)."""
        worker = self._worker
        if worker is None or not self.CAPABILITIES.trace_wire:
            return False
        self._check("activate")
        return worker.trace_wire(header, received)

    def _fit_worker(self) -> None:
        """Take the worker's capabilities: the edge encoding (a worker with a byte limit)
        and the reply spin (``CAPABILITIES.inline_request``). An instrumented bridge
        still spins, but takes no inline request (`send_and_receive` checks): its
        replies go the bridge's way, where the instruments hear of each one."""
        worker = self._worker
        assert worker is not None
        self._encoder = worker if worker.max_message_bytes is not None else None
        spins = bool(self._reply_spin_max) and self.CAPABILITIES.inline_request
        self._spinner = worker if spins else None
        self._inline = worker if spins else None

    def refresh_telemetry(self) -> None:
        """Fold the latencies the worker timed since the last call into `telemetry`
        (``runtime.get_telemetry`` calls it before reading)."""
        worker = self._worker
        if worker is not None and self.CAPABILITIES.telemetry_refresh:
            part = worker.drain_latencies()
            if part is not None:
                self.telemetry.merge_summary(part)

    def _check_size(self, msg: Any) -> bytes | None:
        """Refuse at once a message the tier can never carry (the runtime's edge policy).
        Returns the bytes it measured (None when it measured nothing), for a tier that can
        write them instead of encoding the message again."""
        worker = self._worker
        limit = worker.max_message_bytes if worker is not None else None
        if limit is None:
            return None
        try:
            data: bytes = msg.serialize()
        except AttributeError:  # a plain value: measured (and refused) by the worker here
            encoder = self._encoder  # when it can, not by the pump, which could only drop it
            return None if encoder is None else encoder.encode_checked(msg, True)
        size = len(data)
        if size > limit:
            raise MessageSerializationError(
                f"kernel {self.kernel_id!r} cannot carry a {type(msg).__name__} of {size} "
                f"bytes: the {self.config.tier} tier takes at most {limit} bytes a message; "
                f"raise it with launch(..., ring_bytes={size + 8}) or more, or send smaller "
                "messages"
            )
        if self._encoder is not None:
            self._encoder.keep_encoded(msg, data)  # the hand-over writes these bytes
        return data

    def try_accept(self, msg: Any, timeout: float | None = None) -> bool:
        """`accept`'s part that never waits: check and validate ``msg``, then queue it behind
        messages already in the inbox, or hand it straight to the worker; False when it
        must take the inbox's own path (empty inbox and no hand-over, or a full one).
        A caller waiting for the reply to a message handed over gets it polled for, for
        up to the reply spin's budget and never past ``timeout`` (its caller's)."""
        in_t = self.input_type
        ok = self._in_ok
        if not (
            self._direct
            and self._encoder is None
            and (in_t is None or type(msg) is in_t)
            and (ok is None or ok(msg))
        ):
            # (a direct kernel's worker measures no sizes: the exact type whose fields
            # check needs nothing more, as in `send`)
            self._admit(msg)
        inbox = self._inbox
        if inbox is not None and inbox.qsize and not self._stopping:
            return bool(inbox.offer(msg))  # behind others: the pump keeps the order
        if not self._hand_over(msg):
            if self._encoder is not None:  # the pump encodes it when it hands it over
                self._encoder.keep_encoded(msg, None)
            return False
        if self._spinner is not None and self._awaited(msg):
            self._spin_after_hand_over(self._spinner, timeout)
        return True

    def _admit(self, msg: Any) -> None:
        """Refuse at once what this kernel can never carry (`_check_size`) and what is not
        its ``input_type``: the edge checks of every message it accepts."""
        encoder = self._encoder
        # (instrumented: a traced worker's encoder reads the message's trace context, which
        # only a hand-over may do; the message is measured as it is, below)
        if encoder is not None and not self._instruments:
            try:  # type, size and the bytes kept in one call: every send comes here
                if encoder.encode_checked(msg, True) is not None:
                    return
            except Exception:  # raised below in the runtime's words (or the worker's)
                pass
        self._check_size(msg)
        self._validate_in(msg)

    async def accept(self, msg: Any, timeout: float | None = None) -> None:
        if not self.try_accept(msg, timeout):
            await super().accept(msg, timeout)

    def accept_nowait(self, msg: Any) -> None:
        if not self.try_accept(msg):
            super().accept_nowait(msg)

    async def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Put ``msg`` in the inbox, or straight into the worker when nothing is queued
        ahead of it (see `accept`)."""
        inbox = self._inbox
        in_t = self.input_type
        ok = self._in_ok
        if (
            self._direct
            and (in_t is None or type(msg) is in_t)
            and (ok is None or ok(msg))
            and inbox is not None
            and inbox.qsize  # queued ahead of it: the inbox keeps the order
            and not self._stopping
            and inbox.offer(msg)
        ):
            return True
        if not self.try_accept(msg, timeout):  # (`accept` without a coroutine of its own)
            await RingKernel.accept(self, msg, timeout)
        return True

    def _hand_over(self, msg: Any) -> bool:
        """The direct path: offer ``msg`` (validated) to the worker when the inbox is
        empty, the pump holds nothing and the kernel runs ungated; False (nothing done)
        when the message must take the inbox. Errors are left to the inbox path, whose
        pump reports them as it always did."""
        if (
            self._state is not _ACTIVE
            or self._stopping
            or self._gate is not None
            or self._held is not None
            or self._backlog
            or self.config.serialize
        ):
            return False
        inbox = self._inbox
        worker = self._worker
        if inbox is None or worker is None or inbox.qsize:
            return False
        try:
            if not worker.offer(msg):
                return False
        except Exception:
            # not swallowed: the message takes the inbox path, where the pump meets the
            # same error and reports it (a failed worker fails the kernel, a rejected
            # message is counted and its caller told)
            return False
        self._handed_direct += 1
        if self._timed:
            self.telemetry.messages_processed += 1
        if self._instruments:
            self._instruments.message_taken(self, msg)
        return True

    # the bridge's own hand-over under a second name, for a subclass that overrides
    # `_hand_over` and needs this one on a hot path (a zero-argument ``super()`` builds an
    # object per call)
    _bridge_hand_over = _hand_over

    def _hand_over_many(
        self, offer: Callable[[TierWorker], int], msgs: list[Any] | None = None
    ) -> int:
        """The direct path for a tier's own bulk send (the GPU tier's ``send_batch`` and
        ``send_records``): where `_hand_over` would offer one message straight to the
        worker, ``offer(worker)`` hands over as many as the worker takes and returns how
        many; they are counted as `_hand_over` counts one (and reported to the
        instruments as taken, when they are the first of ``msgs``). 0: nothing was done
        (the inbox goes first, or the kernel does not run ungated). Errors of ``offer``
        propagate."""
        if (
            self._state is not _ACTIVE
            or self._stopping
            or self._gate is not None
            or self._held is not None
            or self._backlog
            or self.config.serialize
        ):
            return 0
        inbox = self._inbox
        worker = self._worker
        if inbox is None or worker is None or inbox.qsize:
            return 0
        n = offer(worker)
        self._handed_direct += n
        if self._timed:
            self.telemetry.messages_processed += n
        if n and msgs is not None and self._instruments:
            for msg in msgs[:n]:
                self._instruments.message_taken(self, msg)
        return n

    async def _place_set_active(self, active: bool, operation: str) -> None:
        """`deactivate` and `reactivate`: the actor stops (resumes) taking from its
        direct edges too, as the pump stops (resumes) handing it the inbox."""
        worker = self._worker
        if worker is not None:
            worker.pause_edges(not active)

    def messages_received(self) -> int:
        """Messages accepted so far: through the inbox, and offered straight to the worker."""
        return super().messages_received() + self._handed_direct

    # -- the inline request (``CAPABILITIES.inline_request``) -------------------------------

    def send_and_receive(self, msg: Any, timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        """`RingKernel.send_and_receive`; with a reply spin (see the design notes), a
        request that finds the bridge idle is made inline: handed over, its reply polled
        for and, when the reply caught is its own, returned without a future or a
        delivery in between. (A plain method that returns the coroutine: a kernel that
        takes no inline request pays no coroutine of its own.)"""
        if (
            self._inline is not None
            and self._reply_spin_s
            and type(msg) is self.input_type
            and not self._instruments  # (an instrumented bridge reports: the general path)
        ):
            return self._request_inline(self._inline, msg, timeout)
        return RingKernel.send_and_receive(self, msg, timeout)

    async def _request_inline(self, worker: TierWorker, msg: Any, timeout: float | None) -> Any:
        """`send_and_receive` made inline where it can be (its own reply polled for on the
        loop, no future), else the general path."""
        try:
            key = self.claim_request(msg)  # (its id made in the kernel's request space)
        except TypeValidationError:
            key = None
        if key is not None and key not in self._waiters:
            try:
                data = worker.encode_checked(msg, True)  # kept: the hand-over writes these
            except Exception:  # the general path raises it, in the runtime's words
                data = None
            if data is not None:
                budget = self._reply_spin_s
                deadline = 0.0
                if timeout is not None:  # the clock starts now: the spin counts
                    deadline = asyncio.get_running_loop().time() + timeout
                    budget = min(budget, max(timeout, 0.0))
                if self._hand_over(msg):
                    reply = error = None
                    try:
                        reply = worker.reply_within(budget)
                        if reply is None or self._reply_misses:
                            self._reply_spun(reply is not None)
                    except Exception as exc:
                        error = exc
                    else:
                        try:
                            mine = reply is not None and reply_key(reply) == key
                        except AttributeError:  # a plain value: nobody's reply
                            mine = False
                        if mine:
                            if self._timed:
                                self.telemetry.messages_sent += 1
                            self._inline_turn -= 1
                            if not self._inline_turn:
                                await self._give_the_loop_a_turn()
                            return reply
                    fut = self._register_inline(msg, reply, error)
                    return await self.await_reply(msg, key, fut, timeout, deadline)
                worker.keep_encoded(msg, None)  # the pump encodes it when it hands it over
        return await RingKernel.send_and_receive(self, msg, timeout)

    async def _give_the_loop_a_turn(self) -> None:
        """An inline request never suspends: a caller looping on them would keep every
        other task off the loop, so every `SEND_YIELD_EVERY`-th yields once (as a tier-1
        actor's ``ctx.send`` does). A caller cancelled there loses the reply it was
        given: counted as lost, as a reply to a caller who gave up always is."""
        self._inline_turn = SEND_YIELD_EVERY
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.count_lost_reply()
            raise

    def _register_inline(
        self, msg: Any, polled: Any, error: Exception | None
    ) -> asyncio.Future[Any]:
        """An inline request whose own reply did not come first: register it
        (`expect_reply`), then pass on in order what was polled instead (another reply,
        an error). Nothing else ran on the loop since the hand-over, so no reply could
        have been delivered to this caller before it was registered."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.expect_reply(msg, fut)  # (the key is free: ``msg`` goes as it is)
        if error is not None:
            self._polled_error(error)
        elif polled is not None:
            self._reply_polled(polled)
        return fut

    def _awaited(self, msg: Any) -> bool:
        """Whether a caller waits for the reply to ``msg``."""
        try:
            return request_key(msg) in self._waiters
        except AttributeError:  # a plain value
            return False

    def _spin_after_hand_over(self, worker: TierWorker, limit: float | None) -> None:
        """A message a caller waits for was handed over: poll for the next reply for up
        to the budget, and no longer than ``limit`` (the most seconds its caller may still
        wait; None: no limit), then pass on in order what came (a reply, an error)."""
        spin = self._reply_spin_s
        reply = None
        if spin:
            try:
                reply = worker.reply_within(spin if limit is None else min(spin, max(limit, 0.0)))
            except Exception as exc:
                self._polled_error(exc)
                return
        self._reply_spun(reply is not None)
        if reply is not None:
            self._reply_polled(reply)

    def _reply_spun(self, caught: bool) -> None:
        """Adapt the spin's budget as the tiers' own waits do: a reply caught restores the
        full budget; a miss quarters it, down to none, and every `_SPIN_PROBE_EVERY`-th
        miss in a row tries the full budget again."""
        if caught:
            self._reply_spin_s = self._reply_spin_max
            self._reply_misses = 0
            return
        self._reply_misses += 1
        if self._reply_misses % _SPIN_PROBE_EVERY == 0:
            self._reply_spin_s = self._reply_spin_max
        else:
            quarter = self._reply_spin_s / 4
            self._reply_spin_s = quarter if quarter >= 1e-6 else 0.0

    async def activate(self) -> None:
        self._check("activate")
        loop = self._loop = asyncio.get_running_loop()
        self._deadlines = None  # (its loop's, found again on the first timed request)
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        writable = self._writable

        drain = self._drain_ready_replies
        scheduled = [False]  # a drain is queued on the loop and has not run yet
        # wake_writable rides on that drain (set once replies come through wake_readable)
        shared = [False]
        room = [False]  # ... and the drain also wakes the pump: the worker has room

        def drain_on_loop() -> None:
            scheduled[0] = False  # before polling: a reply after this schedules again
            if room[0]:
                room[0] = False
                writable.set()
            drain()

        def wake_readable() -> None:
            # one call_soon_threadsafe per burst: replies that arrive before the queued
            # drain runs are polled by it
            if scheduled[0]:
                return
            scheduled[0] = True
            try:  # (not contextlib.suppress: three calls after the wake-up, on the actor's
                # thread, holding the GIL the loop thread wakes up to take)
                loop.call_soon_threadsafe(drain_on_loop)
            except RuntimeError:  # loop closed during teardown
                pass

        loop_thread = threading.get_ident()

        def wake_writable() -> None:
            if not self._want_room:  # nobody waits for room: no wake-up
                return
            self._want_room = False
            if shared[0]:
                # flag first, then look: a drain that already ran schedules anew
                room[0] = True
                wake_readable()
                return
            if threading.get_ident() == loop_thread:  # (a worker the loop itself watches)
                writable.set()
                return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(writable.set)

        worker = self._worker
        assert worker is not None
        worker.on_writable(wake_writable)
        if not self._instruments:  # (an instrumented bridge sees every reply it polls)
            call = loop.call_soon_threadsafe
            for_caller = self._reply_for_caller

            def deliver(reply: Any, key: Any) -> None:  # from the actor's thread
                call(for_caller, reply, key)

            worker.hand_replies_to_callers(self._waiters, deliver)
        await asyncio.to_thread(worker.start)
        self._unwatch = worker.watch(loop, drain)
        if self._unwatch is None:
            self._unwatch = worker.on_readable(wake_readable)
            shared[0] = True
        self._state = KernelState.ACTIVE
        name = f"pydotcompute:{self.kernel_id}"
        for attr, make, label in (
            ("_pump", self._run_pump, "pump"),
            ("_collector", self._run_collector, "collect"),
        ):
            coro = make()
            try:
                setattr(self, attr, loop.create_task(coro, name=f"{name}:{label}"))
            except BaseException as exc:  # a task factory refused; the worker runs already
                coro.close()
                self._fail(exc)
                raise

    async def _run_pump(self) -> None:
        inbox = self._inbox
        worker = self._worker
        writable = self._writable
        assert inbox is not None
        assert worker is not None
        assert writable is not None
        loop = asyncio.get_running_loop()
        backlog = self._backlog
        batching = not self.config.serialize  # a frame that does not decode: one by one
        while True:
            if self._gate is not None:
                await asyncio.shield(self._gate)
            try:
                msg = backlog.popleft() if backlog else await inbox.get()
            except QueueClosedError:
                return
            except MessageDeserializationError as exc:  # serialize=True: one bad frame
                self.telemetry.record_error(exc)
                self._count_dropped(1, "undecodable")
                logger.warning(
                    "kernel %r: dropped a message that does not decode: %s", self.kernel_id, exc
                )
                continue
            self._held = msg
            if self._gate is not None:  # deactivated while we waited: hold it
                await asyncio.shield(self._gate)
            if self._timed:
                self.telemetry.messages_processed += 1
                self._held_counted = True
            while True:
                # the worker was built with room for ``bridge_queue_size`` messages its actor
                # has not taken: ``offer`` says False beyond that
                try:
                    ok = worker.offer(msg)
                except (KernelFailedError, KernelStateError):
                    return  # the collector reports it; the held message is handed back
                except Exception as exc:  # this one message cannot cross (too large)
                    self._take_held(backlog=False)
                    self.telemetry.record_error(exc)
                    self._count_dropped(1)
                    logger.warning("kernel %r: dropped a message: %s", self.kernel_id, exc)
                    if self._instruments:
                        self._instruments.message_dropped(self, msg, "other", exc)
                    break
                if ok:
                    if self._instruments:
                        self._instruments.message_taken(self, msg)
                    break
                if not self._want_room:
                    # announce, then offer once more: room freed in between is seen
                    # either by that offer or by the waker (which then fires)
                    writable.clear()
                    self._want_room = True
                    continue
                # the safety poll, as if room was announced (cheaper than a timeout scope)
                poll = loop.call_later(_POLL_S, writable.set)
                try:
                    await writable.wait()
                finally:
                    poll.cancel()
                self._want_room = False
            self._want_room = False
            self._held = None
            self._held_counted = False
            if batching and inbox.qsize and not backlog and self._gate is None:
                self._hand_over_batch(inbox, worker)

    def _hand_over_batch(self, inbox: Any, worker: TierWorker) -> None:
        """The inbox holds more: take as many as the worker has room for (in priority
        order) and hand them over in one call, which wakes the actor once. What the
        worker does not take (or an error) goes to ``_backlog``, handed over one by one."""
        pending = worker.pending_input
        widens = self._bridge_widens
        if widens:
            now = _perf()
            self._fit_bridge(worker, pending, now)
        room = self._bridge - pending
        if room < 2:
            return  # no batch to speak of: the per-message path
        # (a loop in C: ``take()`` as often as there are messages that fit)
        batch = list(itertools.starmap(inbox.take, itertools.repeat((), min(room, inbox.qsize))))
        try:
            n = self._offer_each(worker, batch) if self._instruments else worker.offer_many(batch)
        except Exception:  # the per-message path meets it again and reports it
            n = 0
        if n and self._timed:
            self.telemetry.messages_processed += n
        if n < len(batch):
            self._backlog.extend(batch[n:])
        if widens:
            self._bridge_mark = (now, pending + n)

    def _offer_each(self, worker: TierWorker, batch: list[Any]) -> int:
        """`TierWorker.offer_many` for an instrumented bridge: one message at a time, each
        reported as taken once the worker took it (a tier's wire reads each message's
        trace context as it is offered)."""
        instruments = self._instruments
        assert instruments is not None
        n = 0
        for msg in batch:
            try:
                if not worker.offer(msg):
                    break
            except Exception:
                if n:
                    break
                raise
            instruments.message_taken(self, msg)
            n += 1
        return n

    def _fit_bridge(self, worker: TierWorker, pending: int, now: float) -> None:
        """Size the bridge to what the actor took since the last batch: as many messages as
        it takes in `BRIDGE_WINDOW_S` (`BRIDGE_WINDOW_URGENT_LANE_S` where urgent messages
        pass what it holds), between 64 and 1,024. The time includes the
        loop's share of the interpreter, which an urgent message waits through too;
        messages handed over one by one meanwhile are not counted, so the estimate errs
        narrow. Fewer than `_BRIDGE_TIMED` taken over four windows (a slow actor, or one
        that sat idle since) narrows it back to 64. A change of less than an eighth is
        not made."""
        since, held = self._bridge_mark
        taken = held - pending
        elapsed = now - since
        window = BRIDGE_WINDOW_URGENT_LANE_S if self.CAPABILITIES.urgent_lane else BRIDGE_WINDOW_S
        if taken >= _BRIDGE_TIMED:
            fit = int(window * taken / elapsed) if elapsed > 0 else BRIDGE_WIDEST
            fit = max(BRIDGE_LEAST, min(BRIDGE_WIDEST, fit))
        elif elapsed > 4 * window:
            fit = BRIDGE_LEAST  # too few taken to time in a while (slow, or idle): narrow
        else:
            return
        width = self._bridge
        if abs(fit - width) * 8 > width and worker.set_room(fit):
            self._bridge = fit

    def _take_held(self, *, backlog: bool = True) -> list[Any]:
        """The message the pump took but never handed over, then (with ``backlog``) the
        rest of a batch it still holds (``[]`` if none)."""
        msg, self._held = self._held, None
        out = [] if msg is None else [msg]
        if msg is not None and self._held_counted:
            self._held_counted = False
            self.telemetry.messages_processed -= 1
        if backlog and self._backlog:
            out += self._backlog
            self._backlog.clear()
        return out

    def _take_undelivered(self) -> list[Any]:
        """What the worker did not finish (once): counted as processed when the pump handed
        it over, so that count is taken back."""
        worker = self._worker
        if worker is None:
            return []
        try:
            lost = worker.take_undelivered()
        except KernelStateError:  # still running: nothing to hand back yet
            return []
        if lost and self._timed:
            self.telemetry.messages_processed -= len(lost)
        return lost

    async def _run_collector(self) -> None:
        worker = self._worker
        readable = self._readable
        assert worker is not None
        assert readable is not None
        turn = SEND_YIELD_EVERY
        while True:
            turn -= 1
            if not turn:
                turn = SEND_YIELD_EVERY
                await asyncio.sleep(0)
            try:
                reply = self._next_reply(worker)
            except MessageRejectedError as exc:
                self._rejected(exc)
                continue
            except MessageDeserializationError as exc:  # one reply does not decode here
                self._undecodable_reply(exc)
                continue
            except KernelFailedError as exc:
                if not self._stopping:
                    await self._worker_failed(exc.error if exc.error is not None else exc)
                return
            except KernelStateError:
                if not self._stopping:  # the actor function returned by itself
                    await self._worker_returned()
                return  # stopped and drained
            except Exception as exc:  # a fault of the tier itself: fail clearly, never wedge
                if not self._stopping:
                    await self._worker_failed(exc)
                return
            if reply is None:
                readable.clear()
                self._collecting = False  # replies that arrive now: the callback's
                # one budget a loop turn for both: what the collector delivered since it
                # last yielded counts against the callback's (at least 1 left: it yields at 0)
                self._budget = min(self._budget, turn)
                while not readable.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_POLL_S):
                            await readable.wait()
                    if not readable.is_set():  # the safety poll: as if a wake-up came
                        self._drain_ready_replies()
                self._collecting = True
                # ... and what the callback delivered, against the collector's
                turn = min(turn, max(self._budget, 1))
                continue
            self._reply_in_hand.append(reply)
            try:
                await self._deliver(reply, final=False)
            except Exception as exc:
                # a reply that can go nowhere (a plain value for a serializing outbox, the
                # wrong type for a connected kernel): the kernel fails, as a tier-1 actor
                # whose ctx.send raised would
                self._reply_in_hand.clear()
                self.telemetry.record_error(exc)
                self._count_dropped(1)
                if not self._stopping:
                    self._fail(exc)
                    return
                self.error = exc
                logger.error("kernel %r: a reply failed while terminating: %r", self.kernel_id, exc)
            else:
                self._reply_in_hand.clear()

    def _next_reply(self, worker: TierWorker) -> Any:
        """What the reply callback left first (raising the error it met), then the
        worker's next reply (`TierWorker.poll_reply`)."""
        ready = self._ready
        if ready:
            reply = ready.popleft()
            if type(reply) is _Raised:
                raise reply.error
            return reply
        reply = worker.poll_reply()
        if reply is not None and self._instruments:
            self._instruments.reply_collected(self, reply)
        return reply

    def _drain_ready_replies(self) -> None:
        """On the loop, when a reply may be ready: deliver every reply that completes
        without waiting (a caller's future, room downstream or in the outbox). The first
        that would wait, or an error the collector must report, goes to ``_ready`` and
        the collector is woken; while anything is there, or the collector holds a reply,
        the collector alone delivers, so replies keep their order."""
        readable = self._readable
        worker = self._worker
        if self._unwatch is None or worker is None or readable is None:
            return  # not watching any more (stopped, failed): the collector finishes
        ready = self._ready
        if ready or self._reply_in_hand or self._collecting:
            readable.set()
            return
        # other tasks run between every `SEND_YIELD_EVERY` replies delivered, as a tier-1
        # actor's ``ctx.send`` yields: past the budget, `_refill` goes on next loop turn
        budget = self._budget
        if budget <= 0:
            return
        poll = worker.poll_replies
        deliver = self._deliver_now
        rearms = self.CAPABILITIES.short_poll_rearms
        try:
            while True:
                # (`_drain_batch`, inlined: one frame less on every reply's way)
                drained = False
                try:
                    replies = poll(budget)
                except Exception as exc:
                    taken = self._polled_error(exc)
                else:
                    taken = n = len(replies)
                    drained = rearms and n < budget
                    if n and self._instruments:
                        for reply in replies:
                            self._instruments.reply_collected(self, reply)
                    if n == 1 and self._answers:  # a lone reply, most likely a caller's
                        if not deliver(replies[0]):
                            ready.append(replies[0])
                            readable.set()
                            return
                    elif n:
                        taken = self._deliver_batch(replies, ready, readable)
                budget -= taken
                if budget <= 0:
                    # spent: only `_refill`, queued now, renews it, so every callback
                    # queued before this moment runs first. (Renewed whenever a drain
                    # ended instead, two wake-ups in one loop turn delivered twice as many
                    # replies before other tasks ran.)
                    (self._loop or asyncio.get_running_loop()).call_soon(self._refill)
                    return
                if ready:  # the collector delivers the rest (or reports an error)
                    return
                if not taken or drained:  # nothing more until the worker wakes us
                    return
        finally:
            self._budget = budget

    def _refill(self) -> None:
        """Next loop turn: a new budget, and the drain goes on where it stopped."""
        self._budget = SEND_YIELD_EVERY
        self._drain_ready_replies()

    def _deliver_batch(self, replies: list[Any], ready: Any, readable: asyncio.Event) -> int:
        """Deliver polled ``replies`` that need no waiting; the first that would wait and
        the rest after it go to ``ready`` (and the collector is woken). Returns how many
        were delivered."""
        n = len(replies)
        done = 0
        out = self._outbox
        if (
            out is not None
            and self._forward is None
            and not (self._answers and self.any_for_callers(replies))
        ):
            # all for the outbox: offered in a row (a loop in C that stops at the first
            # refusal); how many it took is what its size grew by
            before = out.qsize
            try:  # (not contextlib.suppress: three calls a batch on the hot path)
                all(map(out.offer, replies))
            except Exception:  # one it refuses: `_deliver` reports it
                pass
            done = out.qsize - before
            if done and self._timed:
                self.telemetry.messages_sent += done
        deliver = self._deliver_now
        while done < n:
            if not deliver(replies[done]):
                ready.extend(replies[done:])
                readable.set()
                return done
            done += 1
        return n

    def _polled_error(self, exc: Exception) -> int:
        """Report what polling the worker raised: a message the tier rejected, or a reply
        that does not decode, each one dropped message (returns 1: it took one record);
        anything else (stopped, failed, a fault of the tier) is left to the collector, in
        order after what `_ready` holds (returns 0)."""
        if isinstance(exc, MessageRejectedError):
            self._rejected(exc)
            return 1
        if isinstance(exc, MessageDeserializationError):
            self._undecodable_reply(exc)
            return 1
        self._ready.append(_Raised(exc))
        if self._readable is not None:
            self._readable.set()
        return 0

    def _reply_polled(self, reply: Any) -> None:
        """A reply polled outside the callback (an inline request's that was not its own):
        delivered in order, by the collector when anything waits before it."""
        if self._instruments:
            self._instruments.reply_collected(self, reply)
        if self._ready or self._reply_in_hand or self._collecting or not self._deliver_now(reply):
            self._ready.append(reply)
            if self._readable is not None:
                self._readable.set()

    def _reply_for_caller(self, reply: Any, key: Any) -> None:
        """A reply the worker handed over itself (`TierWorker.hand_replies_to_callers`),
        found filed under ``key``: its caller's future completed here, or, when anything
        waits before it or the caller is gone, the way a polled reply goes."""
        waiters = self._waiters
        fut = waiters.get(key)
        if (
            fut is not None
            and not fut.done()
            and not (self._ready or self._reply_in_hand or self._collecting)
        ):
            del waiters[key]
            fut.set_result(reply)
            if self._timed:
                self.telemetry.messages_sent += 1
            return
        self._reply_polled(reply)

    def _deliver_now(self, reply: Any) -> bool:
        """Deliver ``reply`` if that needs no waiting (True); False leaves it untouched
        for `_deliver`."""
        if self._answers and self.hand_to_caller(reply):
            if self._timed:
                self.telemetry.messages_sent += 1
            return True
        target = self._forward
        if target is not None:
            try:
                target.accept_nowait(reply)
            except KernelStateError:  # stopped downstream: kept in the outbox, by `_deliver`
                return False
            except Exception:  # full (wait or count per its policy), or wrong: `_deliver`
                return False
        else:
            out = self._outbox
            try:
                if out is None or not out.offer(reply):
                    return False
            except Exception:  # a value the outbox refuses: `_deliver` fails the kernel
                return False
        if self._timed:
            self.telemetry.messages_sent += 1
        return True

    def _take_ready(self) -> list[Any]:
        """The replies the callback left for the collector (errors dropped: the caller
        reporting the end reports those)."""
        ready, self._ready = self._ready, collections.deque()
        return [r for r in ready if type(r) is not _Raised]

    def _rejected(self, exc: MessageRejectedError) -> None:
        """The tier could not decode (a GPU handler: rejected) one message: counted as
        dropped, under the error's ``drop_reason`` (default ``undecodable``), its caller
        told."""
        self.telemetry.record_error(exc)
        if self._timed:
            self.telemetry.messages_processed -= 1
        self._count_dropped(1, getattr(exc, "drop_reason", "undecodable"))
        fut = self._waiters.pop(id_key(exc.correlation_id), None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        logger.warning("kernel %r: a message was rejected: %s", self.kernel_id, exc)

    def _undecodable_reply(self, exc: MessageDeserializationError) -> None:
        """A reply that does not decode in this process: counted as dropped, its error
        recorded, its caller (when the reply says which request it answers) told; logged
        the first time only, the later ones are counted (`telemetry().error_count`)."""
        self.telemetry.record_error(exc)
        self._count_dropped(1, "undecodable")
        fut = self._waiters.pop(id_key(getattr(exc, "correlation_id", None)), None)
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        if not self._undecodable_seen:
            self._undecodable_seen = True
            logger.error(
                "kernel %r: a reply was dropped: %s (later ones are counted in telemetry, "
                "not logged)",
                self.kernel_id,
                exc,
            )

    def _count_dropped(self, n: int, reason: str | None = None) -> None:
        if self._outbox is not None:
            self._outbox.count_dropped(n)
        self.telemetry.record_drop(n, reason)

    async def _deliver(self, reply: Any, *, final: bool) -> None:
        """Hand a reply to its caller, the connected kernel or the outbox.

        ``final`` (terminate, the worker stopped): never wait; the outbox takes it beyond
        its bound, a connected kernel that cannot take it now counts it as dropped.
        """
        if self._timed:
            self.telemetry.messages_sent += 1
        if self._answers and self.hand_to_caller(reply):
            return
        target = self._forward
        if target is not None:
            try:
                if final:
                    target.accept_nowait(reply)
                else:
                    await target.accept(reply, None)
                return
            except QueueFullError as exc:  # a full reject-policy kernel downstream
                self.count_lost_reply()
                if self._instruments:
                    self._instruments.message_dropped(self, reply, "reply_lost", exc)
                self._drop_log.event(
                    "kernel %r: a reply forwarded to %r was dropped: %s",
                    self.kernel_id,
                    target.kernel_id,
                    exc,
                )
                return
            except KernelStateError as exc:  # stopped downstream: kept in the outbox
                self.reply_kept(target, exc)
                final = final or self._stopping
        out = self._outbox
        assert out is not None
        if final:
            out.put_overflow(reply)
        else:
            await out.put(reply)

    @property
    def is_idle(self) -> bool:
        """Idle when nothing is queued on either side of the bridge and the worker took
        everything it was given. A worker that cannot say whether its actor is busy (a
        child process) is never reported idle: wait for a known number of replies."""
        if self._state is not KernelState.ACTIVE:
            return True
        inbox = self._inbox
        if (
            inbox is None
            or len(inbox)
            or self._held is not None
            or self._backlog
            or self._reply_in_hand
            or self._ready
        ):
            return False
        worker = self._worker
        return worker is not None and worker.is_idle

    async def terminate(self, timeout: float | None = None) -> list[Any]:
        """Drain the inbox into the worker, stop it gracefully, deliver every reply."""
        failed = self._state is KernelState.FAILED
        timeout = self._begin_terminating((), timeout)  # no actor task runs on the loop
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pump = self._pump
        if pump is not None and not pump.done() and await self.within_grace({pump}, timeout):
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        worker = self._worker
        if worker is not None:
            worker.pause_edges(False)  # a deactivated kernel drains its edges too
            grace = 0.0 if self.hurried else deadline - loop.time()
            await self._stop_worker(worker, max(0.1, grace))
        collector = self._collector
        if collector is not None and not collector.done():
            # it delivers what the worker produced; if it cannot (a full outbox nobody
            # reads), what is left is delivered below without waiting (at once, hurried)
            least = 0.05 if not failed else 1.0
            if self.hurried:
                _, pending = await asyncio.wait({collector}, timeout=least)
            else:
                pending = await self.within_grace({collector}, max(least, deadline - loop.time()))
            if pending:
                collector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await collector
        self._stop_watching()
        left = await self._final_delivery()
        refused = self._drop_log.take_pending()
        if refused:
            logger.warning(
                "kernel %r: %d more repl(ies) refused by the kernel it forwards into "
                "(counted as dropped)",
                self.kernel_id,
                refused,
            )
        return self._finish_termination(left)

    async def _final_delivery(self) -> list[Any]:
        """After the worker stopped: deliver every reply it still holds (and the one the
        collector was holding), then take back what it did not finish."""
        replies, self._reply_in_hand = self._reply_in_hand, []
        replies += self._take_ready()
        worker = self._worker
        if worker is not None:
            replies += self._drain_worker(worker)
        for reply in replies:
            await self._deliver_final(reply)
        if worker is not None:
            worker.on_late_reply(self._late_reply_counter(worker))
        # oldest first: what the worker did not finish, then what the pump still held
        return self._take_undelivered() + self._take_held()

    async def _deliver_final(self, reply: Any) -> None:
        """Deliver one reply the worker left at stop or failure, without waiting; one that
        can go nowhere is counted as dropped and its error recorded."""
        if isinstance(reply, MessageRejectedError):
            self._rejected(reply)
            return
        if isinstance(reply, MessageDeserializationError):
            self._undecodable_reply(reply)
            return
        try:
            await self._deliver(reply, final=True)
        except Exception as exc:
            self.telemetry.record_error(exc)
            self._count_dropped(1)
            if self.error is None:
                self.error = exc
            logger.error("kernel %r: a reply failed while terminating: %r", self.kernel_id, exc)

    def _late_reply_counter(self, worker: TierWorker) -> Any:
        """Count, as dropped and with a warning, replies a worker sends after terminate
        (a thread still busy when the grace period ran out finishes its message)."""
        telemetry, kernel_id = self.telemetry, self.kernel_id

        def count_late() -> None:
            n = sum(1 for r in worker.drain_replies() if not isinstance(r, MessageRejectedError))
            if n:
                telemetry.record_drop(n)
                logger.warning(
                    "kernel %r: %d repl%s sent after terminate stopped collecting; dropped",
                    kernel_id,
                    n,
                    "y" if n == 1 else "ies",
                )

        return count_late

    async def _stop_worker(self, worker: TierWorker, grace: float) -> None:
        """Stop the worker (blocking: in a thread). The instruments hear once that it
        stopped, and first how it failed, while `TierWorker.failed_on` still names the
        message in the actor's hands."""
        await asyncio.to_thread(worker.stop, grace)
        instruments = self._instruments
        if instruments and not self._stop_reported:
            self._stop_reported = True
            failure = worker.failure
            if failure is not None:
                instruments.actor_failed(self, worker.failed_on, failure)
            instruments.worker_stopped(self)

    def _drain_worker(self, worker: TierWorker) -> list[Any]:
        """Every reply the worker still holds (`TierWorker.drain_replies`), each reported
        to the instruments as collected."""
        replies = worker.drain_replies()
        if self._instruments:
            for reply in replies:
                if not isinstance(reply, BaseException):
                    self._instruments.reply_collected(self, reply)
        return replies

    def _stop_watching(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    async def _worker_failed(self, exc: BaseException) -> None:
        """The actor raised (or its process died): FAILED, and everything it held is handed
        back once."""
        mark = len(self.undelivered)  # the worker's leftovers are older than the inbox's
        self._fail(exc)
        worker = self._worker
        if worker is not None:
            await self._stop_worker(worker, 1.0)
            for reply in self._take_ready() + self._drain_worker(worker):  # before the failure
                await self._deliver_final(reply)
        self.hand_back(self._take_undelivered() + self._take_held(), at=mark)

    async def _worker_returned(self) -> None:
        """The actor function returned by itself: the kernel ends as a tier-1 kernel whose
        actor returned (TERMINATED, refusing sends, waiting callers told at once). Replies
        it sent first are delivered; what it was given and never took is handed back once,
        oldest first, before what is still queued in the inbox."""
        pump = self._pump
        if pump is not None and not pump.done():
            pump.cancel()  # it holds at most one message: taken back below
        self._stop_watching()
        worker = self._worker
        if worker is not None:
            await self._stop_worker(worker, 1.0)
            for reply in self._take_ready() + self._drain_worker(worker):  # sent before it returned
                await self._deliver_final(reply)
        self.hand_back(
            self._take_undelivered() + self._take_held(),
            log="kernel %r: its actor function returned with %d message(s) it never took "
            "(counted as dropped)",
        )
        if not self._stopping:  # (a terminate that began meanwhile closes the kernel)
            self._finished()

    def _fail(self, exc: BaseException) -> None:
        super()._fail(exc)
        self._stop_watching()
        pump = self._pump
        if pump is not None and not pump.done():
            pump.cancel()

    def _actor_tasks(self) -> list[asyncio.Task[Any]]:
        """The bridge's pump and collector: they stop when the worker's actor ends."""
        return [t for t in (self._pump, self._collector) if t is not None]


# The hosted tiers' kernel classes, by their old import path (`from
# pydotcompute.ring_kernels.hosted import ThreadHostedKernel`). They load by name, as the tier
# registry loads them: the bridge itself never imports a tier.
_TIER_CLASSES = {
    "ThreadHostedKernel": "pydotcompute.ring_kernels.tiers.thread",
    "ProcessHostedKernel": "pydotcompute.ring_kernels.tiers.process",
}


def __getattr__(name: str) -> Any:
    module = _TIER_CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
