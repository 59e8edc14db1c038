"""Worker pools: one kernel id, N replicas of its actor (`launch(..., replicas=N)`).

A pool is one kernel to the runtime: one banded inbox, one outbox, one state, one
telemetry record, one entry in `kernel.undelivered`. Only the place the actor runs is
multiplied, so `send`, `send_and_receive`, `connect`, the lifecycle, the accounting and the
supervision are the single kernel's, unchanged.

- asyncio tier: N actor tasks read the one inbox; whichever is free takes the next
  message, so the least busy replica gets it by construction.
- hosted tiers (thread, process, and any `HostedKernel` tier): one bridge whose worker is
  a `PoolWorker`, a composite `TierWorker` of N member workers. `offer` goes to the member
  with the fewest messages not yet taken (then the fewest without a reply yet), among
  those with room; `poll_reply` polls the members in turn.
- other tiers (GPU, Ray): refused at launch with `InvalidConfigurationError`.

Design notes:
- Ordering: a pool does not keep FIFO across replicas. Each replica takes messages in
  the inbox's order (priority band, then FIFO), but replicas finish at their own pace, so
  replies come out in completion order. `send_and_receive` still matches each reply by
  correlation.
- Supervision is per replica where the tier restarts actors (asyncio: a replica that
  raises is restarted, `max_restarts` each); elsewhere one failing replica fails the pool
  as one kernel: `FAILED`, every other replica stopped, everything any of them held
  handed back once.
- Accounting stays the kernel's: the pool's telemetry is the whole pool. The per-replica
  figures (`replica_telemetry()`) split processed/sent/errors/restarts by replica and sum
  to the pool's.
- Each member of a hosted pool gets `ceil(bridge_queue_size / N)` slots, so the pool as a
  whole holds about `bridge_queue_size` messages its actors have not taken, as a single
  kernel does, and a late high-priority message waits behind at most that many.
- Broadcast (`runtime.broadcast`): one copy per running replica, each with a fresh
  `message_id`, enters the pool's one inbox in the message's band (all at once: the first
  copy waits for room, the others follow it beyond the bound). Copies go through the inbox,
  not a side channel, so the bounds, the band order, the drain at terminate and the
  accounting are the inbox's. A side queue per replica was rejected: it would need its
  own bound, and its own hand-back at every ending.
  - hosted tiers: each copy is addressed to one member; the pump hands it to that member
    only (waiting, if it is full, as for any message).
  - asyncio tier: replicas take from the shared inbox, so a copy goes to whichever replica
    has not had one of that broadcast; a replica that takes a copy it already had passes
    it to a replica still waiting for one (kept aside for a busy replica, which takes it
    before anything of a lower band; put back for a parked one). A replica that already
    has its copy holds back while a parked replica still waits for one, so copies are
    rarely put back.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from ..exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    MessageDeserializationError,
    MessageRejectedError,
    QueueClosedError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from .context import DecodingContext, KernelContext
from .fast_queue import BackpressureStrategy, get_priority_band
from .hosted import HostedKernel
from .instruments import instrumented_context
from .kernel import RingKernel
from .message import new_message_id
from .pool_edges import EdgeGroup
from .states import KernelState
from .telemetry import RingKernelTelemetry
from .tiers.contract import Capabilities, TierWorker

__all__ = (
    "AsyncioPoolKernel",
    "HostedPoolKernel",
    "PoolWorker",
    "check_replicas",
    "pool_class",
    "replica_telemetry",
)

logger = logging.getLogger("pydotcompute")

#: The launch option that makes a pool.
REPLICAS_OPTION = "replicas"
#: Seconds a saturated hosted pool waits for a reply before it stops relying on replies
#: to refill its members (see `PoolWorker`).
NO_REPLY_S = 0.04
_monotonic = time.monotonic


def check_replicas(kernel_id: str, value: Any) -> int:
    """`value` as a replica count, or a clear `InvalidConfigurationError`."""
    if type(value) is not int or value < 1:
        raise InvalidConfigurationError(
            f"kernel {kernel_id!r}: replicas must be an int >= 1 (how many copies of the "
            f"actor serve this id), got {value!r}"
        )
    return value


def _replicas_of(kernel: RingKernel) -> int:
    return int(kernel.config.extra.get(REPLICAS_OPTION, 1))


def _replica_name(kernel_id: str, index: int) -> str:
    return f"{kernel_id}[{index}]"


# --- broadcast: what every tier's pool shares --------------------------------------------------

#: Longest a replica that already has its copy of a broadcast holds back (seconds), while a
#: parked replica still waits for one, before it takes from the inbox anyway.
HOLD_BACK_S = 0.02


def _copies(kernel_id: str, msg: Any, n: int) -> list[Any]:
    """``n`` copies of ``msg``, each with a fresh ``message_id`` (replies correlate)."""
    if not hasattr(msg, "message_id"):
        raise TypeValidationError(
            f"kernel {kernel_id!r}: a broadcast to a pool sends each replica its own copy "
            f"with a fresh message_id; got a {type(msg).__name__}, which has none. "
            "Broadcast an @message instance"
        )
    out = []
    for _ in range(n):
        try:
            dup = copy.copy(msg)
            dup.message_id = new_message_id()
        except (AttributeError, TypeError) as exc:
            raise TypeValidationError(
                f"kernel {kernel_id!r}: a broadcast to a pool sends each replica its own copy "
                f"with a fresh message_id, and this {type(msg).__name__} cannot be copied "
                f"that way ({exc}); broadcast an @message instance"
            ) from None
        out.append(dup)
    return out


async def _enqueue_copies(kernel: RingKernel, copies: list[Any], timeout: float | None) -> None:
    """Put a broadcast's copies in ``kernel``'s inbox, all at once.

    The first copy goes through `RingKernel.accept` (type, size and state checks, the
    backpressure policy, ``timeout``); the others follow it in the same step, beyond the
    bound if need be, so no replica takes from the inbox between two copies. Under
    ``reject`` the inbox must have room for every copy, or none is put.
    """
    inbox = kernel.inbox
    n = len(copies)
    if (
        inbox is not None
        and n > 1
        and inbox.backpressure is BackpressureStrategy.REJECT
        and inbox.maxsize
        and not inbox.closed
        and not kernel.stopping
        and len(inbox) + n > inbox.maxsize
    ):
        raise QueueFullError(
            f"kernel {kernel.kernel_id!r}: a broadcast needs room for {n} copies (one per "
            f"replica) and the inbox has {max(0, inbox.maxsize - len(inbox))} free of "
            f"{inbox.maxsize} under backpressure 'reject'; nothing was sent. Broadcast once "
            "the inbox has room, raise queue_size, or choose backpressure='block'"
        )
    await kernel.accept(copies[0], timeout)
    assert inbox is not None  # accept refuses a kernel without one
    for dup in copies[1:]:
        inbox.put_overflow(dup)


def _band(msg: Any) -> int:
    priority = getattr(msg, "priority", 128)
    return int(get_priority_band(priority if type(priority) is int else 128))


# --- asyncio tier ------------------------------------------------------------------------------


class _Round:
    """One broadcast to an asyncio pool: the replicas still owed a copy, and how many of
    its copies are still in the inbox."""

    __slots__ = ("in_inbox", "owed")

    def __init__(self, owed: set[int], in_inbox: int) -> None:
        self.owed = owed
        self.in_inbox = in_inbox


_REPLICA_CONTEXTS: dict[type, type] = {}


def _replica_context_class(base: type[KernelContext]) -> type[KernelContext]:
    """``base`` (the plain or decoding context) as a pool replica's context: it takes its
    copy of each broadcast once (see `AsyncioPoolKernel`). One class per base."""
    made = _REPLICA_CONTEXTS.get(base)
    if made is not None:
        return cast("type[KernelContext]", made)
    base_receive = base.receive

    class ReplicaContext(base):  # type: ignore[valid-type,misc]
        __slots__ = ("_assigned", "_index", "_pool", "waiting")

        def __init__(
            self, kernel: AsyncioPoolKernel, telemetry: RingKernelTelemetry, index: int
        ) -> None:
            super().__init__(kernel, telemetry)
            self._pool = kernel
            self._index = index
            #: broadcast copies passed to this replica by another one, oldest first
            self._assigned: deque[Any] = deque()
            #: True while inside the inbox's receive (parked, or about to take a message)
            self.waiting = False

        async def receive(self, timeout: float | None = None) -> Any:
            pool = self._pool
            loop_time = asyncio.get_running_loop().time
            deadline = None if timeout is None else loop_time() + timeout
            patient = True  # holds back while others make progress, not longer
            while True:
                if self._assigned or pool.broadcast_pending:
                    if self.state is KernelState.DEACTIVATED:
                        await self.wait_active()  # copies are held like any message
                    first = pool.assigned_first(self._assigned)
                    if first is not None:
                        return self.deliver(first)
                    if patient and pool.must_hold_back(self._index):
                        patient = await pool.changed(HOLD_BACK_S)
                        continue
                left = None if deadline is None else max(0.0, deadline - loop_time())
                self.waiting = True
                try:
                    msg = await base_receive(self, left)
                except (QueueClosedError, QueueTimeoutError):
                    if self._assigned:  # a copy passed to it goes before the end
                        return self.deliver(self._assigned.popleft())
                    raise
                finally:
                    self.waiting = False
                    pool.notify()
                round_ = pool.took(msg)
                if round_ is None or pool.claim(round_, self._index):
                    return msg
                # a copy of a broadcast this replica already had: not its message
                self.take_unfinished()
                self.forget_current()
                if pool.pass_on(round_, msg):
                    await asyncio.sleep(0)  # a parked replica takes it back first

        def deliver(self, msg: Any) -> Any:
            """Hand the actor ``msg`` (a copy passed to it) as ``receive`` hands a message
            from the inbox: the previous one finished, this one counted and timed."""
            self.message_done()
            self._current = msg  # type: ignore[misc]
            self._handling = True  # type: ignore[misc]
            rec = self._rec
            if rec is not None:
                rec.took()
                self._tel.messages_processed += 1
            return msg

        def take_assigned(self) -> list[Any]:
            """The copies passed to it that it never took (emptied)."""
            out = list(self._assigned)
            self._assigned.clear()
            return out

        def assign(self, msg: Any) -> None:
            self._assigned.append(msg)

        @property
        def has_assigned(self) -> bool:
            return bool(self._assigned)

    ReplicaContext.__name__ = ReplicaContext.__qualname__ = f"Replica{base.__name__}"
    _REPLICA_CONTEXTS[base] = ReplicaContext
    return ReplicaContext


def _pool_capabilities(tier: Capabilities) -> Capabilities:
    """A pool's capabilities, from its tier's: a copy of a broadcast per replica, telemetry
    per replica (folded into the pool's when read), and its members' direct edge kinds
    (one edge per replica, `pool_edges.py`). Its worker polls its members in turn, so a
    short poll says nothing of a re-armed wake-up."""
    return dataclasses.replace(
        tier,
        broadcast=True,
        replica_telemetry=True,
        telemetry_refresh=True,
        resize=False,
        inline_request=False,
        short_poll_rearms=False,
    )


class AsyncioPoolKernel(RingKernel):
    """N actor tasks on the runtime's loop sharing one inbox and one outbox.

    The lifecycle, the supervision loop and the accounting are `RingKernel`'s, which runs
    one task per context: a pool only makes N contexts, counts returns, and stops the
    other replicas when one fails it.

    Telemetry: each replica's context counts into a record of its own
    (`replica_telemetry()`); the pool's `telemetry` adds them up whenever it is read
    through `runtime.get_telemetry` (or after `refresh_telemetry()`).

    Broadcast: the copies of a broadcast are interchangeable; the first replica that
    takes one without having had one of that broadcast keeps it (`claim`). One that takes
    a copy it already had passes it on (`pass_on`): kept aside for a replica that is busy
    (taken at its next receive, before anything of a lower band), put back in the inbox
    when only parked replicas are still owed one. Copies kept aside are handed back by
    every ending, as the inbox's messages are.
    """

    EXTRA_OPTIONS = frozenset({REPLICAS_OPTION})
    CAPABILITIES = _pool_capabilities(RingKernel.CAPABILITIES)
    __slots__ = ("_changed", "_copy_of", "_ended", "_replica_tels", "_returned", "_rounds")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replica_tels: list[RingKernelTelemetry] = []
        self._returned = 0
        self._ended: set[int] = set()  # replicas whose actor returned by itself
        # copies in the inbox -> their broadcast, and the broadcasts with copies there
        self._copy_of: dict[Any, _Round] = {}
        self._rounds: list[_Round] = []
        self._changed: asyncio.Future[None] | None = None  # replicas holding back wait on it

    @property
    def replicas(self) -> int:
        """How many copies of the actor serve this id."""
        return _replicas_of(self)

    def _make_contexts(self) -> list[KernelContext]:
        base: type[KernelContext] = DecodingContext if self.config.serialize else KernelContext
        ctx_class: Any = _replica_context_class(base)
        if self._instruments:  # an instrumented runtime: the context reports (`instruments`)
            ctx_class = instrumented_context(ctx_class)
        self._replica_tels = [
            RingKernelTelemetry(_replica_name(self.kernel_id, i), live=True)
            for i in range(self.replicas)
        ]
        return [ctx_class(self, tel, i) for i, tel in enumerate(self._replica_tels)]

    def _replica_telemetry(self, index: int) -> RingKernelTelemetry | None:
        return self._replica_tels[index]

    def refresh_telemetry(self) -> None:
        """Fold the replicas' counts into the pool's telemetry."""
        if not self._timed:
            return
        self.telemetry.messages_processed = sum(t.messages_processed for t in self._replica_tels)
        self.telemetry.messages_sent = sum(t.messages_sent for t in self._replica_tels)
        self.telemetry.restarts = sum(t.restarts for t in self._replica_tels)
        self.telemetry.merge_latencies(self._replica_tels)

    def replica_telemetry(self) -> list[RingKernelTelemetry]:
        """One telemetry record per replica (processed, sent, latency, errors, restarts)."""
        return list(self._replica_tels)

    def _actor_returned(self, index: int) -> None:
        self._ended.add(index)
        self._returned += 1
        if self._returned >= len(self._ctxs):
            self._finished()  # the last replica returned on its own
            return
        # its share of pending broadcasts is owed no more; copies passed to it come back
        for round_ in self._rounds:
            round_.owed.discard(index)
        ctx: Any = self._ctxs[index]
        self.hand_back(
            ctx.take_assigned(),
            log="kernel %r: a replica returned with %d broadcast cop(ies) it never took "
            "(counted as dropped)",
        )
        self.notify()

    def _fail(self, exc: BaseException) -> None:
        """One replica fails the pool as one kernel: the others stop, and what each held
        is handed back (their supervision loops see FAILED)."""
        super()._fail(exc)
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me and not task.done():
                task.cancel()

    def close_out(
        self,
        send_error: BaseException,
        receive_error: BaseException | None = None,
        left: list[Any] | None = None,
        *,
        log: str | None = None,
    ) -> list[Any]:
        """As `RingKernel.close_out`; broadcast copies kept aside for a replica that never
        took them are handed back after what the actors held."""
        out = [] if left is None else left
        for ctx in self._ctxs:
            out += cast("Any", ctx).take_assigned()
        self._copy_of.clear()
        self._rounds.clear()
        self.notify()
        return super().close_out(send_error, receive_error, out, log=log)

    @property
    def is_idle(self) -> bool:
        if any(cast("Any", ctx).has_assigned for ctx in self._ctxs):
            return False
        return super().is_idle

    # -- broadcast ----------------------------------------------------------------------

    @property
    def running_replicas(self) -> int:
        """Replicas whose actor has not returned by itself (a broadcast reaches these)."""
        return self.replicas - len(self._ended)

    async def broadcast(self, msg: Any, timeout: float | None = None) -> int:
        """Put a copy of ``msg`` for each running replica in the inbox (see
        `RingKernelRuntime.broadcast`); returns how many copies were put."""
        self._validate_in(msg)
        live = [i for i in range(self.replicas) if i not in self._ended]
        if not live or self._stopping or self._inbox is None:
            raise self._refuse("broadcast to")
        copies = _copies(self.kernel_id, msg, len(live))
        round_ = _Round(set(live), len(copies))
        copy_of = self._copy_of
        for dup in copies:
            copy_of[dup.message_id] = round_
        self._rounds.append(round_)
        try:
            await _enqueue_copies(self, copies, timeout)
        except BaseException:
            for dup in copies:
                copy_of.pop(dup.message_id, None)
            with contextlib.suppress(ValueError):
                self._rounds.remove(round_)
            raise
        return len(copies)

    @property
    def broadcast_pending(self) -> bool:
        """Whether copies of a broadcast are still in the inbox."""
        return bool(self._rounds)

    def took(self, msg: Any) -> _Round | None:
        """A replica took ``msg`` from the inbox: its broadcast if it is a copy, else None."""
        copy_of = self._copy_of
        if not copy_of:
            return None
        round_ = copy_of.pop(getattr(msg, "message_id", None), None)
        if round_ is not None:
            round_.in_inbox -= 1
            if not round_.in_inbox:
                with contextlib.suppress(ValueError):
                    self._rounds.remove(round_)
            self.notify()
        return round_

    def claim(self, round_: _Round, index: int) -> bool:
        """Replica ``index`` took a copy of ``round_``: True when it is owed one (it keeps
        it)."""
        if index in round_.owed:
            round_.owed.discard(index)
            return True
        return False

    def pass_on(self, round_: _Round, msg: Any) -> bool:
        """A copy taken by a replica that already had one goes to a replica still owed
        one: aside for a busy one, or back in the inbox when only parked ones are left
        (True: the caller lets them run first). With none owed (they ended), it is handed
        back."""
        ctxs: list[Any] = self._ctxs
        owed = sorted(round_.owed)
        if not owed:
            self.hand_back(
                [msg],
                log="kernel %r: %d broadcast cop(ies) for a replica that has ended "
                "(counted as dropped)",
            )
            return False
        inbox = self._inbox
        busy = [i for i in owed if not ctxs[i].waiting]
        if busy or inbox is None or inbox.closed:
            target = (busy or owed)[0]
            round_.owed.discard(target)
            ctxs[target].assign(msg)
            self.notify()
            return False
        self._copy_of[msg.message_id] = round_
        round_.in_inbox += 1
        if round_.in_inbox == 1:
            self._rounds.append(round_)
        inbox.put_overflow(msg)
        return True

    def assigned_first(self, assigned: deque[Any]) -> Any:
        """The head of a replica's kept-aside copies when it goes before the inbox's next
        message (its band is as high or higher), else None."""
        if not assigned:
            return None
        inbox = self._inbox
        if inbox is not None and len(inbox):
            band = _band(assigned[0])
            for higher, count in enumerate(inbox.statistics().band_counts):
                if count:
                    if higher < band:
                        return None
                    break
        return assigned.popleft()

    def must_hold_back(self, index: int) -> bool:
        """Whether replica ``index``, which has its copy of a broadcast whose copies are
        still in the inbox, should let a parked replica owed one take it first."""
        inbox = self._inbox
        ctxs: list[Any] = self._ctxs
        if inbox is None or not len(inbox):
            if not any(ctx.waiting for ctx in ctxs):
                # nothing queued and nobody holds one it took: copies counted as still in
                # the inbox were dropped by backpressure (and counted there)
                self._copy_of.clear()
                self._rounds.clear()
            return False
        for round_ in self._rounds:
            if index not in round_.owed and any(ctxs[i].waiting for i in round_.owed):
                return True
        return False

    async def changed(self, timeout: float) -> bool:
        """Wait until a replica takes a message or stops waiting; False when ``timeout``
        seconds passed first."""
        fut = self._changed
        if fut is None or fut.done():
            fut = self._changed = asyncio.get_running_loop().create_future()
        done, _ = await asyncio.wait([fut], timeout=timeout)
        return bool(done)

    def notify(self) -> None:
        fut = self._changed
        if fut is not None:
            self._changed = None
            if not fut.done():
                fut.set_result(None)


# --- hosted tiers ------------------------------------------------------------------------------


class PoolWorker(TierWorker):
    """N member workers behind one `TierWorker`: the hosted tiers' pool.

    Not thread-safe beyond the contract: `offer`, `poll_reply` and the counters are used
    from the runtime's loop; `start`/`stop` run the members' in parallel threads.
    """

    def __init__(self, kernel_id: str, members: list[TierWorker], room: int | None = None) -> None:
        if not members:
            raise InvalidConfigurationError(f"kernel {kernel_id!r}: a pool needs members")
        self.kernel_id = kernel_id
        self.members = members
        n = len(members)
        # Refilling full members: each member was built with room for `room` messages its
        # actor has not taken. When all are full, a failed `offer` would arm every member
        # to wake the runtime as soon as one slot frees (a thread wake-up per message
        # while the pool is saturated). Instead, while replies flow, the collector's own
        # wake-up refills a member once it is half empty (`poll_reply`); if no reply comes
        # for `NO_REPLY_S` while waiting (an actor that does not answer every message, or
        # a slow one), members are armed as for one kernel from then on.
        self._room = room
        self._reply_driven = room is not None
        self._blocked = False  # `offer` said False without arming any member
        self._blocked_replies = 0  # replies collected when it did
        self._blocked_since = 0.0
        self._writable: list[Callable[[], None]] = []
        self._next = 0  # the member `poll_reply` tries first
        self.offered = [0] * n
        self.replied = [0] * n
        self.rejected = [0] * n
        self.returned = [0] * n  # handed back by `take_undelivered`
        self.failed_at: int | None = None  # the first member that failed
        self._stop_lock = threading.Lock()
        # each member's latencies so far (`drain_latencies` folds them in)
        self._timings = [RingKernelTelemetry(_replica_name(kernel_id, i)) for i in range(n)]

        self._stopping = False  # `stop` was called: members end because we asked
        # members whose actor function returned by themselves, and the messages they had
        # been given but never took, waiting to go to the members still running
        self._ended: set[int] = set()
        self._backlog: deque[Any] = deque()
        # broadcast copies: message id -> the member it is for (until offered); the ids of
        # the copies each member was given lately (its leftovers are among them); copies
        # whose member ended before taking them (handed back by `take_undelivered`)
        self._addressed: dict[Any, int] = {}
        recent = (room or 64) + 2
        self._copy_ids: list[deque[Any]] = [deque(maxlen=recent) for _ in range(n)]
        self._orphans: list[Any] = []

    # -- limits -------------------------------------------------------------------------

    @property
    def max_message_bytes(self) -> int | None:
        limits = [m.max_message_bytes for m in self.members]
        known = [x for x in limits if x is not None]
        return min(known) if known else None

    def encode_checked(self, msg: Any, keep: bool = False) -> bytes | None:
        """Checked as the members check it (alike: one tier, one type); nothing kept,
        since the member that takes it is chosen later."""
        return self.members[0].encode_checked(msg)

    @property
    def pending_input(self) -> int:
        return len(self._backlog) + sum(
            m.pending_input for i, m in enumerate(self.members) if i not in self._ended
        )

    # -- lifecycle ----------------------------------------------------------------------

    def _each(self, fn: Callable[[TierWorker], Any]) -> list[Any]:
        """`fn(member)` for every member at once, in threads; results in member order.
        The first exception is raised after all finished."""
        results: list[Any] = [None] * len(self.members)
        errors: list[BaseException | None] = [None] * len(self.members)

        def run(i: int, member: TierWorker) -> None:
            try:
                results[i] = fn(member)
            except BaseException as exc:
                errors[i] = exc

        threads = [
            threading.Thread(target=run, args=(i, m), name=f"pydotcompute-{self.kernel_id}-{i}")
            for i, m in enumerate(self.members)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for exc in errors:
            if exc is not None:
                raise exc
        return results

    def start(self) -> None:
        try:
            self._each(lambda m: m.start())
        except BaseException:
            # one member could not start: stop those that did, and report it
            with contextlib.suppress(Exception):
                self._each(lambda m: m.stop(1.0))
            raise

    def stop(self, timeout: float) -> bool:
        # one stop at a time: after a failure the runtime stops the pool while a terminate
        # may already be stopping it, and a member that is still running must not be
        # stopped from two threads at once (the second waits, then finds it stopped)
        self._stopping = True
        with self._stop_lock:
            return all(self._each(lambda m: m.stop(timeout)))

    # -- messages in --------------------------------------------------------------------

    def offer(self, msg: Any) -> bool:
        members = self.members
        if self._backlog and not self._flush_backlog():
            return False  # what an ended member never took goes first
        if self._addressed:
            member = self._addressed.pop(getattr(msg, "message_id", None), None)
            if member is not None:
                return self._offer_copy(member, msg)
        if self._ended:
            return self._offer_live(msg)
        if len(members) == 1:
            ok = members[0].offer(msg)
            if ok:
                self.offered[0] += 1
            return ok
        # least busy first: fewest messages not yet taken, then fewest without a reply
        pending = [m.pending_input for m in members]
        order = sorted(range(len(members)), key=lambda i: (pending[i], self._outstanding(i)))
        room = self._room
        replied = sum(self.replied)
        if self._blocked:
            if replied != self._blocked_replies:
                self._blocked = False  # a reply came since: the wait was resolved
            elif _monotonic() - self._blocked_since >= NO_REPLY_S:
                self._reply_driven = False  # no reply for that long: arm from now on
                self._blocked = False
        if self._reply_driven and room is not None and all(p >= room for p in pending):
            if not self._blocked:  # (an early wake-up keeps the wait's start)
                self._blocked = True
                self._blocked_replies = replied
                self._blocked_since = _monotonic()
            return False  # the collector wakes the runtime (`_refill`)
        self._blocked = False
        for i in order:
            try:
                ok = members[i].offer(msg)
            except KernelFailedError:
                raise
            except KernelStateError:  # its actor returned: `poll_reply` will notice
                continue
            if ok:
                self.offered[i] += 1
                return True
        return False

    # -- broadcast ----------------------------------------------------------------------

    def live_members(self) -> list[int]:
        """The members whose actor has not ended by itself."""
        return [i for i in range(len(self.members)) if i not in self._ended]

    def address(self, msg: Any, member: int) -> None:
        """Have `offer` hand ``msg`` (a broadcast copy) to ``member`` only."""
        self._addressed[msg.message_id] = member

    def unaddress(self, msg: Any) -> None:
        """Forget the address of ``msg`` (its broadcast was not sent)."""
        self._addressed.pop(msg.message_id, None)

    def _offer_copy(self, i: int, msg: Any) -> bool:
        """`offer` of a copy addressed to member ``i``: False while that member is full.
        A copy for a member that has ended is kept for `take_undelivered`."""
        if i in self._ended:
            self._orphans.append(msg)
            return True
        try:
            ok = self.members[i].offer(msg)
        except KernelFailedError:
            self._addressed[msg.message_id] = i
            raise
        except KernelStateError:  # its actor returned: `poll_reply` will notice
            self._orphans.append(msg)
            return True
        if ok:
            self.offered[i] += 1
            self._copy_ids[i].append(msg.message_id)
            return True
        self._addressed[msg.message_id] = i
        return False

    def _offer_live(self, msg: Any) -> bool:
        """`offer` once a member has ended: to the least busy member still running.

        Raises:
            KernelStateError: every member has ended (the pool's actor has returned).
        """
        live = [i for i in range(len(self.members)) if i not in self._ended]
        live.sort(key=lambda i: (self.members[i].pending_input, self._outstanding(i)))
        refused = 0
        for i in live:
            try:
                ok = self.members[i].offer(msg)
            except KernelFailedError:
                raise
            except KernelStateError:
                refused += 1
                continue
            if ok:
                self.offered[i] += 1
                return True
        if refused == len(live):
            raise KernelStateError(self.kernel_id, "STOPPED", "send to", "every replica ended")
        return False

    def _member_ended(self, i: int) -> None:
        """Member `i`'s actor function returned by itself (not asked to by `stop`): the
        messages it was given and never took go to the other members."""
        self._ended.add(i)
        try:
            got = self.members[i].take_undelivered()
        except KernelStateError:  # not quite ended yet: handed back at stop instead
            return
        self.returned[i] += len(got)
        copies = self._copy_ids[i]
        for msg in got:  # a broadcast copy was for this member only
            if copies and getattr(msg, "message_id", None) in copies:
                self._orphans.append(msg)
            else:
                self._backlog.append(msg)
        self._flush_backlog()
        for callback in self._writable:  # the runtime may offer again
            callback()

    def _flush_backlog(self) -> bool:
        """Offer what ended members never took to the running ones; True when all went."""
        backlog = self._backlog
        while backlog:
            try:
                if not self._offer_live(backlog[0]):
                    return False
            except KernelStateError:  # nobody left: handed back by `take_undelivered`
                return False
            backlog.popleft()
        return True

    def _refill(self, i: int) -> None:
        """A reply came from member `i`: if `offer` is waiting for room and the member is
        half empty, wake the runtime to refill it."""
        room = self._room
        if room is not None and self.members[i].pending_input <= room // 2:
            for callback in self._writable:
                callback()

    def _outstanding(self, i: int) -> int:
        return self.offered[i] - self.replied[i] - self.rejected[i]

    # -- direct edges (`pool_edges.py`) -------------------------------------------------

    @property
    def edge_replicas(self) -> int:
        """How many replica edges a direct edge with this pool's end is made of."""
        return len(self.members)

    def open_edge(self, kind: str, source_id: str) -> EdgeGroup:
        """One edge of ``kind`` into each member's actor, as one group the producer
        spreads over (`pool_edges.Spread`)."""
        return EdgeGroup(kind, [m.open_edge(kind, source_id) for m in self.members], spread=True)

    def route_into(self, edge: Any) -> None:
        """Member ``i`` sends into part ``i`` of ``edge`` (an `EdgeGroup` opened once per
        member by the consumer); None routes every member back to its outbox."""
        if edge is None:
            for m in self.members:
                m.route_into(None)
            return
        parts = edge.parts if isinstance(edge, EdgeGroup) and not edge.spread else None
        if parts is None or len(parts) != len(self.members):
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: a pool sends into one edge per replica "
                f"({len(self.members)}), got {edge!r}"
            )
        for m, part in zip(self.members, parts, strict=True):
            m.route_into(part)

    def pause_edges(self, paused: bool) -> None:
        for m in self.members:
            m.pause_edges(paused)

    def on_writable(self, callback: Callable[[], None]) -> None:
        self._writable.append(callback)
        for m in self.members:
            m.on_writable(callback)

    # -- messages out -------------------------------------------------------------------

    def poll_reply(self) -> Any:
        got = self._poll(1)
        return got[0] if got else None

    def poll_replies(self, max_count: int) -> list[Any]:
        """Up to ``max_count`` replies of the first member (in turn) that has any: one
        member's batch, so an error is raised only when no reply precedes it."""
        return self._poll(max_count)

    def _poll(self, most: int) -> list[Any]:
        members = self.members
        n = len(members)
        failure: KernelFailedError | None = None
        stopped = 0
        start = self._next
        for k in range(n):
            i = (start + k) % n
            try:
                if most > 1:
                    got = members[i].poll_replies(most)
                else:
                    reply = members[i].poll_reply()
                    got = [] if reply is None else [reply]
            except MessageRejectedError:
                self.rejected[i] += 1
                self._next = (i + 1) % n
                raise
            except MessageDeserializationError:  # a reply that does not decode here
                self.replied[i] += 1
                self._next = (i + 1) % n
                raise
            except KernelFailedError as exc:
                if failure is None:
                    failure = exc
                    if self.failed_at is None:
                        self.failed_at = i
                continue
            except KernelStateError:
                stopped += 1
                if i not in self._ended and not self._stopping:
                    self._member_ended(i)
                continue
            if got:
                self.replied[i] += len(got)
                self._next = (i + 1) % n
                if self._blocked:
                    self._refill(i)
                return got
        if failure is not None:  # nothing else ready: the pool fails as one kernel
            raise failure
        if stopped == n:
            raise KernelStateError(self.kernel_id, "STOPPED", "receive from", "")
        if self._backlog:
            self._flush_backlog()
        return []

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        undos = [m.on_readable(callback) for m in self.members]

        def undo() -> None:
            for u in undos:
                u()

        return undo

    def watch(self, loop: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
        undos: list[Callable[[], None]] = []
        for m in self.members:
            undo = m.watch(loop, callback)
            if undo is None:  # one member cannot: every member uses `on_readable`
                for u in undos:
                    u()
                return None
            undos.append(undo)

        def unwatch() -> None:
            for u in undos:
                u()

        return unwatch

    def drain_replies(self) -> list[Any]:
        out: list[Any] = []
        for i, m in enumerate(self.members):
            got = m.drain_replies()
            for r in got:
                if isinstance(r, MessageRejectedError):
                    self.rejected[i] += 1
                else:
                    self.replied[i] += 1
            out += got
        return out

    @property
    def is_idle(self) -> bool:
        return not self._backlog and all(m.is_idle for m in self.members)

    def on_late_reply(self, callback: Callable[[], None]) -> None:
        for m in self.members:
            m.on_late_reply(callback)

    # -- what is left -------------------------------------------------------------------

    def take_undelivered(self) -> list[Any]:
        """The failed member's leftovers first (the message it raised on leads), then what
        members that ended by themselves never took (broadcast copies for them first),
        then the other members' in member order; each member's own order is kept."""
        order = list(range(len(self.members)))
        failed = self._failed_index()
        out: list[Any] = []
        if failed is not None:
            order.remove(failed)
            out += self._take_member(failed)
        out += self._orphans
        self._orphans.clear()
        out += self._backlog  # older than what the running members still hold
        self._backlog.clear()
        for i in order:
            out += self._take_member(i)
        return out

    def _take_member(self, i: int) -> list[Any]:
        got = self.members[i].take_undelivered()
        self.returned[i] += len(got)
        return got

    def _failed_index(self) -> int | None:
        if self.failed_at is not None:
            return self.failed_at
        for i, m in enumerate(self.members):
            if m.failure is not None:
                self.failed_at = i
                return i
        return None

    @property
    def failure(self) -> BaseException | None:
        i = self._failed_index()
        return None if i is None else self.members[i].failure

    @property
    def failed_on(self) -> Any:
        i = self._failed_index()
        return None if i is None else self.members[i].failed_on

    def trace_wire(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """Every member carries trace context on its wire (True when all of them can)."""
        carried = [m.trace_wire(header, received) for m in self.members]  # every member
        return all(carried)

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        """The members' new latencies taken together (each member's are also kept for
        `member_telemetry`)."""
        total: RingKernelTelemetry | None = None
        for m, timing in zip(self.members, self._timings, strict=True):
            part = m.drain_latencies()
            if part is None:
                continue
            timing.merge_summary(part)
            if total is None:
                total = RingKernelTelemetry(self.kernel_id)
            total.merge_summary(part)
        return None if total is None else total.latency_summary()

    def member_telemetry(self, kernel_id: str) -> list[RingKernelTelemetry]:
        """Per-member counts as telemetry records: processed (handed over, less those
        handed back or rejected), received (handed over), sent (replies collected), errors
        (a failed member), latencies (when the members time their actors)."""
        out = []
        for i, m in enumerate(self.members):
            tel = RingKernelTelemetry(_replica_name(kernel_id, i))
            tel.merge_latencies([self._timings[i]])
            tel.messages_received = self.offered[i]
            tel.messages_processed = self.offered[i] - self.returned[i] - self.rejected[i]
            tel.messages_sent = self.replied[i]
            tel.messages_dropped = self.rejected[i]
            tel.queue_depth = m.pending_input
            err = m.failure
            if err is not None:
                tel.record_error(err)
            out.append(tel)
        return out


_POOL_WORKERS: dict[type[TierWorker], type[PoolWorker]] = {}


def _pool_worker_class(member: type[TierWorker]) -> type[PoolWorker]:
    """`PoolWorker` offering the direct edge kinds of its members' class ``member``: a
    pool's edges are its members' (one per replica, `pool_edges.py`)."""
    made = _POOL_WORKERS.get(member)
    if made is None:
        made = type(
            f"{member.__name__}Pool",
            (PoolWorker,),
            {
                "CAPABILITIES": dataclasses.replace(
                    PoolWorker.CAPABILITIES,
                    edges_out=member.CAPABILITIES.edges_out,
                    edges_in=member.CAPABILITIES.edges_in,
                    edges_spread=member.CAPABILITIES.edges_spread,
                ),
                "__module__": __name__,
            },
        )
        _POOL_WORKERS[member] = made
    return made


class HostedPoolKernel(HostedKernel):
    """A hosted tier's kernel whose worker is a `PoolWorker` of `replicas` members.

    Not launched directly: `pool_class` combines it with a tier's `HostedKernel`
    subclass, whose `_make_worker` builds each member.
    """

    __slots__ = ()

    @property
    def replicas(self) -> int:
        """How many copies of the actor serve this id."""
        return _replicas_of(self)

    def _make_worker(self, bridge: int) -> TierWorker:
        n = self.replicas
        each = max(1, math.ceil(bridge / n))
        make = super()._make_worker  # (zero-argument super() fails in a comprehension)
        members = [make(each) for _ in range(n)]
        for m in members:  # each replica's edges hold a share of the pool's bound
            m.share_edge_bound(n)
        return _pool_worker_class(type(members[0]))(self.kernel_id, members, room=each)

    @property
    def running_replicas(self) -> int:
        """Replicas whose actor has not returned by itself (a broadcast reaches these)."""
        worker = cast("PoolWorker | None", self._worker)
        return self.replicas if worker is None else len(worker.live_members())

    async def broadcast(self, msg: Any, timeout: float | None = None) -> int:
        """Put a copy of ``msg`` for each running replica in the inbox, each addressed to
        its replica (see `RingKernelRuntime.broadcast`); returns how many were put."""
        self._validate_in(msg)
        worker = cast("PoolWorker | None", self._worker)
        live = [] if worker is None else worker.live_members()
        if worker is None or not live or self._stopping:
            raise self._refuse("broadcast to")
        copies = _copies(self.kernel_id, msg, len(live))
        for dup, member in zip(copies, live, strict=True):
            worker.address(dup, member)
        try:
            await _enqueue_copies(self, copies, timeout)
        except BaseException:
            for dup in copies:
                worker.unaddress(dup)
            raise
        return len(copies)

    def replica_telemetry(self) -> list[RingKernelTelemetry]:
        """One telemetry record per replica (processed, sent, errors); empty before launch.

        On these tiers the pool's own telemetry is counted at the bridge, so its
        `messages_processed` and `messages_sent` equal the replicas' sums.
        """
        worker = cast("PoolWorker | None", self._worker)
        return [] if worker is None else worker.member_telemetry(self.kernel_id)


_HOSTED_POOLS: dict[type, type] = {}


def pool_class(kernel_id: str, tier: str, cls: type[RingKernel], replicas: int) -> type[RingKernel]:
    """The kernel class that runs `replicas` copies of tier `tier`'s actor (`cls` is the
    tier's kernel class).

    Raises:
        InvalidConfigurationError: the tier cannot run a pool.
    """
    if cls is RingKernel:
        return AsyncioPoolKernel
    # (a hosted tier whose worker is one remote actor, Ray's, states ``replicas=False``)
    if cls.CAPABILITIES.replicas and issubclass(cls, HostedKernel):
        made = _HOSTED_POOLS.get(cls)
        if made is None:
            made = type(
                f"{cls.__name__}Pool",
                (HostedPoolKernel, cls),
                {
                    "__slots__": (),
                    "__module__": __name__,
                    "EXTRA_OPTIONS": cls.EXTRA_OPTIONS | {REPLICAS_OPTION},
                    "CAPABILITIES": _pool_capabilities(cls.CAPABILITIES),
                },
            )
            _HOSTED_POOLS[cls] = made
        return cast("type[RingKernel]", made)
    raise InvalidConfigurationError(
        f"kernel {kernel_id!r}: replicas={replicas} is not supported on the {tier} tier "
        "(its actor cannot be replicated behind one id); launch it with replicas=1, or run "
        "the pool on the asyncio, thread or process tier, or launch several kernels under "
        "their own ids"
    )


def replica_telemetry(kernel: RingKernel) -> list[RingKernelTelemetry]:
    """Per-replica telemetry of `kernel`: its replicas' records for a pool, else a
    one-item list holding its own telemetry."""
    return kernel.replica_telemetry()
