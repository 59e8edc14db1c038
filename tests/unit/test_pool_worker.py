"""`PoolWorker`, the hosted tiers' pool, against scripted member workers.

The members here are plain objects following the `TierWorker` contract, so every choice
the pool makes (which member gets a message, when the runtime is woken to refill, what is
handed back in which order) is checked exactly, without threads or processes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    MessageRejectedError,
)
from pydotcompute.ring_kernels import pool as pool_module
from pydotcompute.ring_kernels.pool import PoolWorker, check_replicas
from pydotcompute.ring_kernels.tiers.contract import TierWorker


class Member(TierWorker):
    """A member whose actor is driven by the test: `take()` moves one message from its
    inbox into its hands, `reply()` finishes it."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.inbox: deque[Any] = deque()
        self.hand: list[Any] = []
        self.replies: deque[Any] = deque()
        self.offers = 0  # calls to offer, accepted or not
        self.armed = 0  # offers refused (each arms the member's writable wake-up)
        self.writable: list[Callable[[], None]] = []
        self.error: BaseException | None = None
        self.stopped = False

    @property
    def pending_input(self) -> int:
        return len(self.inbox)

    def start(self) -> None:
        pass

    def stop(self, timeout: float) -> bool:
        self.stopped = True
        return True

    def offer(self, msg: Any) -> bool:
        self.offers += 1
        if len(self.inbox) >= self.room:
            self.armed += 1
            return False
        self.inbox.append(msg)
        return True

    def on_writable(self, callback: Callable[[], None]) -> None:
        self.writable.append(callback)

    def poll_reply(self) -> Any:
        if self.replies:
            return self.replies.popleft()
        if self.error is not None:
            raise KernelFailedError("m", self.error)
        if self.stopped:
            raise KernelStateError("m", "STOPPED", "receive from", "")
        return None

    def poll_replies(self, max_count: int) -> list[Any]:
        n = min(max_count, len(self.replies))
        if not n:
            reply = self.poll_reply()
            return [] if reply is None else [reply]
        return [self.replies.popleft() for _ in range(n)]

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        return lambda: None

    def drain_replies(self) -> list[Any]:
        out = list(self.replies)
        self.replies.clear()
        return out

    def take_undelivered(self) -> list[Any]:
        out = self.hand + list(self.inbox)
        self.hand, self.inbox = [], deque()
        return out

    @property
    def failure(self) -> BaseException | None:
        return self.error

    # -- the test drives the actor --

    def take(self) -> None:
        self.hand.append(self.inbox.popleft())

    def reply(self) -> None:
        self.replies.append(("done", self.hand.pop(0)))


def _pool(n: int = 2, room: int = 4) -> tuple[PoolWorker, list[Member], list[int]]:
    members = [Member(room) for _ in range(n)]
    pool = PoolWorker("p", list(members), room=room)
    woken: list[int] = []
    pool.on_writable(lambda: woken.append(1))
    return pool, members, woken


def test_offers_go_to_the_member_with_the_fewest_untaken() -> None:
    pool, (a, b), _ = _pool()
    assert pool.offer(0)
    assert pool.offer(1)
    assert len(a.inbox) == 1
    assert len(b.inbox) == 1
    a.take()  # a took its message: it has fewer untaken
    assert pool.offer(2)
    assert list(a.inbox) == [2]
    # equal untaken: the one with fewer messages still without a reply
    b.take()
    a.take()
    a.reply()
    assert pool.poll_reply() == ("done", 0)
    assert pool.offer(3)
    assert list(a.inbox) == [3]


def test_a_full_pool_waits_for_a_half_empty_member_while_replies_flow() -> None:
    pool, members, woken = _pool(room=4)
    for i in range(8):
        assert pool.offer(i)
    offers = [m.offers for m in members]
    assert not pool.offer(8)
    assert [m.offers for m in members] == offers  # no member armed
    a = members[0]
    a.take()
    a.reply()
    assert pool.poll_reply() is not None
    assert woken == []  # 3 of 4 untaken: not half empty yet
    a.take()
    a.reply()
    assert pool.poll_reply() is not None
    assert woken == [1]  # 2 of 4: refill
    assert pool.offer(8)
    assert pool.offer(9)
    assert len(a.inbox) == 4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_wait_with_no_reply_for_long_arms_the_members(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(pool_module, "_monotonic", clock)
    pool, members, woken = _pool(room=2)
    for i in range(4):
        assert pool.offer(i)
    assert not pool.offer(4)  # not armed: a reply is expected to wake the runtime
    clock.now += pool_module.NO_REPLY_S / 2
    assert not pool.offer(4)  # an early wake-up: still waiting for a reply
    assert sum(m.armed for m in members) == 0
    members[0].take()  # the actor takes one and never replies (a sink)
    # the runtime's safety-net poll calls offer again: no reply came for that long, so
    # from now on refused offers arm the members, as for one kernel
    clock.now += pool_module.NO_REPLY_S
    assert pool.offer(4)
    assert not pool.offer(5)
    assert sum(m.armed for m in members) == 2
    assert woken == []


def test_replies_keep_the_pool_reply_driven(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(pool_module, "_monotonic", clock)
    pool, (a, b), _ = _pool(room=2)
    for i in range(4):
        pool.offer(i)
    assert not pool.offer(4)
    a.take()
    a.reply()
    assert pool.poll_reply() is not None
    clock.now += 10 * pool_module.NO_REPLY_S  # long, but a reply came meanwhile
    assert pool.offer(4)
    assert not pool.offer(5)
    assert a.armed + b.armed == 0


def _fail_one_while_the_other_replies(pool: Any, a: Any, b: Any) -> None:
    """Hand each member one more message: ``a`` fails on its own, ``b`` answers 11."""
    pool.offer(10)
    pool.offer(11)
    a.take()
    a.error = ValueError("boom")
    b.take()
    b.reply()


def test_poll_reply_takes_turns_and_reports_a_failure_after_the_others() -> None:
    pool, (a, b), _ = _pool()
    for i in range(4):
        pool.offer(i)
    for m in (a, b):
        m.take()
        m.take()
        m.reply()
        m.reply()
    got = [pool.poll_reply() for _ in range(4)]
    assert [g[1] for g in got] == [0, 1, 2, 3]  # a, b, a, b
    assert pool.poll_reply() is None
    _fail_one_while_the_other_replies(pool, a, b)
    assert pool.poll_reply() == ("done", 11)  # the healthy member's reply first
    with pytest.raises(KernelFailedError):
        pool.poll_reply()
    assert pool.failure is a.error


def test_poll_replies_takes_one_members_batch_in_turn() -> None:
    pool, (a, b), _ = _pool()
    for i in range(6):
        pool.offer(i)  # a: 0, 2, 4; b: 1, 3, 5
    for m in (a, b):
        for _ in range(3):
            m.take()
            m.reply()
    assert [g[1] for g in pool.poll_replies(2)] == [0, 2]  # a's, up to the budget
    assert [g[1] for g in pool.poll_replies(8)] == [1, 3, 5]  # then b's whole batch
    assert [g[1] for g in pool.poll_replies(8)] == [4]
    assert pool.poll_replies(8) == []
    assert pool.replied == [3, 3]
    _fail_one_while_the_other_replies(pool, a, b)
    assert pool.poll_replies(8) == [("done", 11)]  # the healthy member's first
    with pytest.raises(KernelFailedError):
        pool.poll_replies(8)


def test_take_undelivered_puts_the_failed_member_first() -> None:
    pool, (_, b), _ = _pool()
    for i in range(6):
        pool.offer(i)
    b.take()
    b.error = ValueError("boom")
    with pytest.raises(KernelFailedError):
        pool.poll_reply()
    pool.stop(1.0)
    left = pool.take_undelivered()
    assert left[:3] == [1, 3, 5]  # b's: the one in its hands first
    assert sorted(left) == list(range(6))
    assert pool.take_undelivered() == []
    tel = pool.member_telemetry("p")
    assert [t.messages_processed for t in tel] == [0, 0]
    assert tel[1].error_count == 1


def test_rejected_messages_are_counted_per_member() -> None:
    pool, (a, _), _ = _pool()
    pool.offer(0)

    def reject() -> Any:
        raise MessageRejectedError("p", None, "bad")

    a.poll_reply = reject  # type: ignore[method-assign]
    with pytest.raises(MessageRejectedError):
        pool.poll_reply()
    assert pool.member_telemetry("p")[0].messages_dropped == 1


def test_stopped_members_stop_the_pool() -> None:
    pool, _, _ = _pool()
    pool.stop(1.0)
    with pytest.raises(KernelStateError):
        pool.poll_reply()


@pytest.mark.parametrize("bad", [0, -3, 2.0, "2", False])
def test_check_replicas_names_what_arrived(bad: Any) -> None:
    with pytest.raises(InvalidConfigurationError, match=rf"replicas must be .*got {bad!r}"):
        check_replicas("k", bad)
