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
"""

from __future__ import annotations

import asyncio
import contextlib
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
)
from .context import KernelContext
from .hosted import HostedKernel
from .kernel import RingKernel
from .telemetry import RingKernelTelemetry
from .tiers.contract import TierWorker

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


# --- asyncio tier ------------------------------------------------------------------------------


class AsyncioPoolKernel(RingKernel):
    """N actor tasks on the runtime's loop sharing one inbox and one outbox.

    The lifecycle, the supervision loop and the accounting are `RingKernel`'s, which runs
    one task per context: a pool only makes N contexts, counts returns, and stops the
    other replicas when one fails it.

    Telemetry: each replica's context counts into a record of its own
    (`replica_telemetry()`); the pool's `telemetry` adds them up whenever it is read
    through `runtime.get_telemetry` (or after `refresh_telemetry()`).
    """

    EXTRA_OPTIONS = frozenset({REPLICAS_OPTION})
    __slots__ = ("_replica_tels", "_returned")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replica_tels: list[RingKernelTelemetry] = []
        self._returned = 0

    @property
    def replicas(self) -> int:
        """How many copies of the actor serve this id."""
        return _replicas_of(self)

    def _make_contexts(self) -> list[KernelContext]:
        ctx_class = self._context_class()  # plain or decoding, as a single kernel's
        self._replica_tels = [
            RingKernelTelemetry(_replica_name(self.kernel_id, i), live=True)
            for i in range(self.replicas)
        ]
        return [ctx_class(self, tel) for tel in self._replica_tels]

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
        self._returned += 1
        if self._returned >= len(self._ctxs):
            self._finished()  # the last replica returned on its own

    def _fail(self, exc: BaseException) -> None:
        """One replica fails the pool as one kernel: the others stop, and what each held
        is handed back (their supervision loops see FAILED)."""
        super()._fail(exc)
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me and not task.done():
                task.cancel()


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

    # -- limits -------------------------------------------------------------------------

    @property
    def max_message_bytes(self) -> int | None:
        limits = [m.max_message_bytes for m in self.members]
        known = [x for x in limits if x is not None]
        return min(known) if known else None

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
        self._backlog.extend(got)
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

    def on_writable(self, callback: Callable[[], None]) -> None:
        self._writable.append(callback)
        for m in self.members:
            m.on_writable(callback)

    # -- messages out -------------------------------------------------------------------

    def poll_reply(self) -> Any:
        members = self.members
        n = len(members)
        failure: KernelFailedError | None = None
        stopped = 0
        start = self._next
        for k in range(n):
            i = (start + k) % n
            try:
                reply = members[i].poll_reply()
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
            if reply is not None:
                self.replied[i] += 1
                self._next = (i + 1) % n
                if self._blocked:
                    self._refill(i)
                return reply
        if failure is not None:  # nothing else ready: the pool fails as one kernel
            raise failure
        if stopped == n:
            raise KernelStateError(self.kernel_id, "STOPPED", "receive from", "")
        if self._backlog:
            self._flush_backlog()
        return None

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
        members that ended by themselves never took, then the other members' in member
        order; each member's own order is kept."""
        order = list(range(len(self.members)))
        failed = self._failed_index()
        out: list[Any] = []
        if failed is not None:
            order.remove(failed)
            out += self._take_member(failed)
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
        return PoolWorker(self.kernel_id, [make(each) for _ in range(n)], room=each)

    def replica_telemetry(self) -> list[RingKernelTelemetry]:
        """One telemetry record per replica (processed, sent, errors); empty before launch.

        On these tiers the pool's own telemetry is counted at the bridge, so its
        `messages_processed` and `messages_sent` equal the replicas' sums.
        """
        # a `PoolWorker`, or a wrapper of one (a tracing runtime's) that offers its methods
        members: Callable[[str], list[RingKernelTelemetry]] | None = getattr(
            self._worker, "member_telemetry", None
        )
        return [] if members is None else members(self.kernel_id)


_HOSTED_POOLS: dict[type, type] = {}


def pool_class(kernel_id: str, tier: str, cls: type[RingKernel], replicas: int) -> type[RingKernel]:
    """The kernel class that runs `replicas` copies of tier `tier`'s actor (`cls` is the
    tier's kernel class).

    Raises:
        InvalidConfigurationError: the tier cannot run a pool.
    """
    if cls is RingKernel:
        return AsyncioPoolKernel
    if isinstance(cls, type) and issubclass(cls, HostedKernel):
        made = _HOSTED_POOLS.get(cls)
        if made is None:
            made = type(
                f"{cls.__name__}Pool",
                (HostedPoolKernel, cls),
                {
                    "__slots__": (),
                    "__module__": __name__,
                    "EXTRA_OPTIONS": cls.EXTRA_OPTIONS | {REPLICAS_OPTION},
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
    per = getattr(kernel, "replica_telemetry", None)
    if per is None:
        return [kernel.telemetry]
    result: list[RingKernelTelemetry] = per()
    return result
