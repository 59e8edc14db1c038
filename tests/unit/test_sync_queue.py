"""SyncQueue and SPSCQueue: the blocking queues of the threaded tier."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    QueueClosedError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.tiers.thread.sync_queue import SPSCQueue, SyncQueue

QUEUES = [pytest.param(SyncQueue, id="sync"), pytest.param(SPSCQueue, id="spsc")]


@pytest.fixture(params=QUEUES)
def qtype(request: pytest.FixtureRequest) -> Any:
    return request.param


def _run(target: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``target`` in a thread; the list receives its result or exception."""
    out: list[Any] = []

    def body() -> None:
        try:
            out.append(target(*args))
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=body, name="test-helper")
    t.start()
    return t, out


def test_fifo_and_sizes(qtype: Any) -> None:
    q = qtype(4)
    assert q.empty
    assert not q.full
    assert len(q) == 0
    for i in range(4):
        assert q.put(i)
    assert q.full
    assert len(q) == 4
    assert [q.get() for _ in range(4)] == [0, 1, 2, 3]
    assert q.empty


def test_nowait_variants(qtype: Any) -> None:
    q = qtype(1)
    assert q.get_nowait() is None
    assert q.put_nowait("a") is True
    assert q.put_nowait("b") is False  # full: nothing queued
    assert q.get_nowait() == "a"
    assert q.get_nowait() is None


def test_timeouts_return_false_and_none(qtype: Any) -> None:
    q = qtype(1)
    t0 = time.monotonic()
    assert q.get(timeout=0.05) is None
    assert time.monotonic() - t0 >= 0.04
    q.put(1)
    assert q.put(2, timeout=0.05) is False
    assert q.get() == 1


def test_blocked_get_wakes_on_put(qtype: Any) -> None:
    q = qtype(4)
    t, out = _run(q.get, 5.0)
    time.sleep(0.05)
    q.put("x")
    t.join(5)
    assert out == ["x"]


def test_blocked_put_wakes_on_get(qtype: Any) -> None:
    q = qtype(1)
    q.put("first")
    t, out = _run(q.put, "second", 5.0)
    time.sleep(0.05)
    assert q.get() == "first"
    t.join(5)
    assert out == [True]
    assert q.get() == "second"


def test_resize_changes_what_a_put_finds_room_for(qtype: Any) -> None:
    q = qtype(2)
    assert q.put_nowait(1)
    assert q.put_nowait(2)
    assert not q.put_nowait(3)
    q.resize(4)
    assert q.capacity == 4
    assert q.put_nowait(3)
    assert q.put_nowait(4)
    assert not q.put_nowait(5)
    q.resize(1)  # what it holds beyond the new capacity stays; puts wait for it to drain
    assert len(q) == 4
    assert not q.put_nowait(5)
    assert [q.get() for _ in range(3)] == [1, 2, 3]
    assert not q.put_nowait(5)  # one still held: at capacity
    assert q.get() == 4
    assert q.put_nowait(5)
    assert q.put_many([6, 7]) == 0  # full at 1
    assert q.get() == 5


def test_resize_wakes_a_put_waiting_for_room(qtype: Any) -> None:
    q = qtype(1)
    q.put("first")
    t, out = _run(q.put, "second", 5.0)
    time.sleep(0.05)
    assert out == []  # still waiting
    q.resize(2)
    t.join(2)  # woken by the resize, well before its own timeout of 5 s
    assert out == [True]
    assert [q.get(), q.get()] == ["first", "second"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_resize_refuses_a_bad_capacity(bad: Any) -> None:
    q = SPSCQueue(2)
    with pytest.raises(InvalidConfigurationError, match="capacity"):
        q.resize(bad)
    assert q.capacity == 2
    s = SyncQueue(2)
    with pytest.raises(InvalidConfigurationError, match="maxsize"):
        s.resize(-1 if bad == 0 else bad)
    assert s.capacity == 2


def test_shutdown_lets_consumers_drain_then_raises(qtype: Any) -> None:
    q = qtype(8)
    q.put(1)
    q.put(2)
    q.shutdown()
    assert q.is_shutdown
    with pytest.raises(QueueClosedError, match="has been shut down"):
        q.put(3)
    assert [q.get(), q.get()] == [1, 2]
    with pytest.raises(QueueClosedError, match="shut down and drained"):
        q.get(timeout=1)
    with pytest.raises(QueueClosedError):
        q.get_nowait()


def test_shutdown_wakes_a_blocked_getter(qtype: Any) -> None:
    q = qtype(8)
    t, out = _run(q.get)  # no timeout: only the shutdown can end it
    time.sleep(0.05)
    q.shutdown()
    t.join(5)
    assert not t.is_alive()
    assert isinstance(out[0], QueueClosedError)


def test_shutdown_wakes_a_blocked_putter(qtype: Any) -> None:
    q = qtype(1)
    q.put(0)
    t, out = _run(q.put, 1)
    time.sleep(0.05)
    q.shutdown()
    t.join(5)
    assert isinstance(out[0], QueueClosedError)
    assert q.get() == 0  # what was queued still drains


def test_shutdown_reason_is_raised_once_drained(qtype: Any) -> None:
    q = qtype(8)
    q.put("last")
    reason = RuntimeError("the actor failed")
    q.shutdown(reason=reason)
    assert q.get() == "last"
    with pytest.raises(RuntimeError, match="the actor failed"):
        q.get()


def test_immediate_shutdown_discards_and_counts(qtype: Any) -> None:
    q = qtype(8)
    for i in range(3):
        q.put(i)
    q.shutdown(immediate=True)
    with pytest.raises(QueueClosedError):
        q.get_nowait()
    stats = q.get_stats()
    assert stats["total_dropped"] == 3
    assert stats["current_size"] == 0


def test_clear_and_drain(qtype: Any) -> None:
    q = qtype(8)
    for i in range(3):
        q.put(i)
    assert q.drain() == [0, 1, 2]
    q.put(9)
    assert q.clear() == 1
    assert q.empty


def test_stats(qtype: Any) -> None:
    q = qtype(8)
    for i in range(5):
        q.put(i)
    q.get()
    stats = q.get_stats()
    assert stats == {
        "current_size": 4,
        "max_size": 8,
        "peak_size": 5,
        "total_enqueued": 5,
        "total_dequeued": 1,
        "total_dropped": 0,
    }


def test_none_is_refused(qtype: Any) -> None:
    q = qtype(4)
    with pytest.raises(TypeValidationError, match="cannot hold None"):
        q.put(None)


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True])
def test_bad_sizes_are_refused(qtype: Any, bad: Any) -> None:
    with pytest.raises(InvalidConfigurationError, match="must be an int"):
        qtype(bad)


def test_spsc_refuses_zero_capacity() -> None:
    with pytest.raises(InvalidConfigurationError, match=r"capacity must be an int >= 1, got 0"):
        SPSCQueue(0)


def test_sync_queue_zero_means_unbounded() -> None:
    q: SyncQueue[int] = SyncQueue(0)
    for i in range(10_000):
        assert q.put_nowait(i)
    assert not q.full
    assert q.maxsize == 0
    assert len(q) == 10_000


def test_wakers_run_after_changes(qtype: Any) -> None:
    q = qtype(4)
    events: list[str] = []
    q.add_waker(lambda: events.append("readable"))
    q.add_waker(lambda: events.append("writable"), when="writable")
    q.put(1)
    assert events == ["readable"]
    q.get()
    assert events == ["readable", "writable"]
    q.shutdown()
    assert events[-2:] == ["readable", "writable"]


def test_remove_waker(qtype: Any) -> None:
    q = qtype(4)
    calls: list[int] = []

    def waker() -> None:
        calls.append(1)

    q.add_waker(waker)
    q.remove_waker(waker)
    q.put(1)
    assert calls == []
    with pytest.raises(InvalidConfigurationError, match="'readable' or 'writable'"):
        q.add_waker(waker, when="sometimes")  # type: ignore[arg-type]


def test_batches_take_what_fits_and_keep_order(qtype: Any) -> None:
    q = qtype(4)
    assert q.put_many([1, 2, 3, 4, 5, 6]) == 4  # the prefix that fits
    assert q.put_many([7]) == 0
    assert q.get_many(3) == [1, 2, 3]
    assert q.get_many(1) == [4]
    assert q.get_many(5) == []
    assert q.put_many([]) == 0
    stats = q.get_stats()
    assert (stats["total_enqueued"], stats["total_dequeued"]) == (4, 4)
    q.put_many([8, 9])
    q.shutdown()
    with pytest.raises(QueueClosedError):
        q.put_many([10])
    assert q.get_many(10) == [8, 9]  # drained after shutdown, then closed
    with pytest.raises(QueueClosedError):
        q.get_many(10)


def test_batches_run_each_waker_once(qtype: Any) -> None:
    q = qtype(8)
    events: list[str] = []
    q.add_waker(lambda: events.append("readable"))
    q.add_waker(lambda: events.append("writable"), when="writable")
    q.put_many([1, 2, 3])
    assert events == ["readable"]
    q.get_many(3)
    assert events == ["readable", "writable"]


def test_burst_wakers_run_once_a_burst_on_spsc() -> None:
    q: SPSCQueue[int] = SPSCQueue(2)
    events: list[str] = []
    q.add_burst_waker(lambda: events.append("readable"))
    q.add_burst_waker(lambda: events.append("writable"), when="writable")
    q.put(1)
    q.put(2)
    assert events == ["readable"]  # armed at first: nothing was ever found
    assert not q.put(3, timeout=0)  # found full: the next get runs the writable one
    assert q.get_many(5) == [1, 2]  # fewer than asked: it took all, and armed it
    assert events == ["readable", "writable"]
    q.put(4)
    assert events == ["readable", "writable", "readable"]
    q.put(5)
    assert events == ["readable", "writable", "readable"]  # no consumer emptied it since
    assert q.get(0) == 4
    assert q.get_many(1) == [5]  # as many as asked: not armed (the caller polls again)
    q.put(6)
    assert events == ["readable", "writable", "readable"]
    assert q.get(0) == 6
    assert q.get(0) is None  # found empty: the next put runs it again
    q.put_many([7])
    assert events == ["readable", "writable", "readable", "readable"]
    assert q.get_many(4) == [7]
    assert q.get_many(4) == []
    q.put(8)
    assert q.put_many([9, 10]) == 1  # found full: armed
    q.get(0)
    assert events[-2:] == ["readable", "writable"]
    q.shutdown()  # shutdown runs them all
    assert events[-2:] == ["readable", "writable"]


def test_burst_wakers_on_sync_queue_run_as_plain_wakers() -> None:
    q: SyncQueue[int] = SyncQueue(4)
    calls: list[int] = []

    def waker() -> None:
        calls.append(1)

    q.add_burst_waker(waker)
    q.put(1)
    q.put(2)
    assert calls == [1, 1]  # at least once a burst: here, every time
    q.remove_burst_waker(waker)
    q.put(3)
    assert calls == [1, 1]


def test_a_polling_consumer_misses_nothing_with_a_burst_waker() -> None:
    """The consumer polls until it finds nothing, then sleeps until the burst waker
    runs: every item arrives, none waits for a wake-up that never comes."""
    q: SPSCQueue[int] = SPSCQueue(64)
    n = 20_000
    woken = threading.Event()
    q.add_burst_waker(woken.set)
    got: list[int] = []

    def consume() -> None:
        while len(got) < n:
            batch = q.get_many(64)
            if batch:
                got.extend(batch)
                continue
            assert woken.wait(10), f"no wake-up after {len(got)} items"
            woken.clear()

    t = threading.Thread(target=consume, name="test-consumer")
    t.start()
    i = 0
    while i < n:
        i += q.put_many(list(range(i, min(i + 7, n))))
    t.join(30)
    assert not t.is_alive()
    assert got == list(range(n))


def test_a_consumer_that_stops_at_a_short_batch_misses_nothing() -> None:
    """A batch shorter than asked means the queue was emptied and the burst waker armed:
    a consumer that sleeps then, without polling once more to find nothing, still gets
    every item and is always woken (the runtime's reply drain works this way)."""
    q: SPSCQueue[int] = SPSCQueue(64)
    n = 3_000
    woken = threading.Event()
    q.add_burst_waker(woken.set)
    got: list[int] = []
    stalled: list[int] = []

    def consume() -> None:
        while len(got) < n:
            batch = q.get_many(16)
            got.extend(batch)
            if len(batch) == 16 or len(got) == n:
                continue
            if not woken.wait(10):
                stalled.append(len(got))
                return
            woken.clear()

    t = threading.Thread(target=consume, name="test-consumer")
    t.start()
    i = 0
    while i < n and t.is_alive():
        i += q.put_many(list(range(i, min(i + 3, n))))
        time.sleep(0.0001)  # the consumer empties the queue: short batches all along
    t.join(30)
    assert not stalled, f"no wake-up after {stalled[0]} items"
    assert not t.is_alive()
    assert got == list(range(n))


def test_spsc_threads_keep_order_without_loss() -> None:
    q: SPSCQueue[int] = SPSCQueue(16)
    n = 20_000
    got: list[int] = []

    def consume() -> None:
        for _ in range(n):
            item = q.get(timeout=10)
            assert item is not None
            got.append(item)

    t = threading.Thread(target=consume, name="test-consumer")
    t.start()
    for i in range(n):
        assert q.put(i, timeout=10)
    t.join(30)
    assert got == list(range(n))


def test_sync_queue_many_producers_and_consumers() -> None:
    q: SyncQueue[tuple[int, int]] = SyncQueue(8)
    producers, consumers, per = 4, 3, 2_000
    results: list[list[tuple[int, int]]] = [[] for _ in range(consumers)]

    def produce(p: int) -> None:
        for i in range(per):
            q.put((p, i), timeout=10)

    def consume(c: int) -> None:
        while True:
            try:
                item = q.get(timeout=10)
            except QueueClosedError:
                return
            assert item is not None
            results[c].append(item)

    cs = [threading.Thread(target=consume, args=(c,), name="test-c") for c in range(consumers)]
    ps = [threading.Thread(target=produce, args=(p,), name="test-p") for p in range(producers)]
    for t in cs + ps:
        t.start()
    for t in ps:
        t.join(30)
    q.shutdown()
    for t in cs:
        t.join(30)
    everything = [x for r in results for x in r]
    assert sorted(everything) == sorted((p, i) for p in range(producers) for i in range(per))
    for r in results:  # each producer's items reach any one consumer in order
        for p in range(producers):
            mine = [i for (pp, i) in r if pp == p]
            assert mine == sorted(mine)


def test_sync_queue_timed_out_getter_does_not_swallow_a_wakeup() -> None:
    # Two getters wait; one times out right as an item arrives. The item must not be lost.
    for _ in range(100):
        q: SyncQueue[int] = SyncQueue(4)
        t1, out1 = _run(q.get, 0.001)
        t2, out2 = _run(q.get)  # no timeout
        time.sleep(0.0005)
        q.put(7)
        t1.join(5)
        if out1 == [7]:
            q.shutdown()  # t2 must now wake with QueueClosedError
        t2.join(5)
        assert not t2.is_alive()
        got = [x for x in out1 + out2 if x == 7]
        assert got == [7]
        assert q.empty


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.one_of(st.integers(0, 1000), st.just("get")), max_size=80),
    cap=st.integers(1, 8),
    kind=st.sampled_from(["sync", "spsc"]),
)
def test_matches_a_bounded_fifo_model(ops: list[Any], cap: int, kind: str) -> None:
    q: Any = SyncQueue(cap) if kind == "sync" else SPSCQueue(cap)
    model: deque[int] = deque()
    for op in ops:
        if op == "get":
            expected = model.popleft() if model else None
            assert q.get_nowait() == expected
        else:
            accepted = q.put_nowait(op)
            assert accepted == (len(model) < cap)
            if accepted:
                model.append(op)
        assert len(q) == len(model)
    assert q.drain() == list(model)


# --- SPSCQueue's urgent lane ---


def test_urgent_lane_is_taken_first_and_keeps_its_own_order() -> None:
    q: SPSCQueue[int] = SPSCQueue(8)
    for i in range(4):
        assert q.put(i, 0)
    assert q.put_urgent(100)
    assert q.put_urgent(101)
    assert len(q) == q.size == 6
    assert not q.empty
    assert [q.get(0) for _ in range(3)] == [100, 101, 0]
    assert q.put_urgent(102)
    assert q.get_many(10) == [102, 1, 2, 3]
    assert q.get(0) is None
    assert q.empty


def test_urgent_lane_shares_the_capacity() -> None:
    q: SPSCQueue[int] = SPSCQueue(3)
    assert q.put(1, 0)
    assert q.put_urgent(2)
    assert q.put_many([3, 4]) == 1  # one place left of three
    assert q.full
    assert not q.put_urgent(5)
    assert not q.put(6, 0)
    assert q.get(0) == 2  # room again: either lane takes it
    assert q.put_urgent(7)
    assert q.drain() == [7, 1, 3]
    assert q.put_urgent(8)
    assert q.put(9, 0)
    assert q.clear() == 2
    assert q.empty


def test_urgent_put_wakes_a_blocked_getter_and_refuses_after_shutdown() -> None:
    q: SPSCQueue[int] = SPSCQueue(4)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(q.get(5.0)))
    t.start()
    time.sleep(0.05)  # (it parks; a put that does not wake it fails the join below)
    assert q.put_urgent(42)
    t.join(5.0)
    assert got == [42]
    q.shutdown()
    with pytest.raises(QueueClosedError):
        q.put_urgent(1)
    with pytest.raises(TypeValidationError):
        SPSCQueue(2).put_urgent(None)  # type: ignore[arg-type]


def test_urgent_items_taken_in_a_batch_are_not_lost_at_shutdown() -> None:
    q: SPSCQueue[int] = SPSCQueue(4)
    assert q.put_urgent(1)
    assert q.put_urgent(2)
    q.shutdown()
    assert q.get_many(10) == [1, 2]  # the last items, though the other lane is closed
    with pytest.raises(QueueClosedError):
        q.get_many(10)
