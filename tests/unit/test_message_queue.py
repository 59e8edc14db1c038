"""MessageQueue: exact priority order (or FIFO) with the three backpressure strategies."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pydotcompute.exceptions import QueueClosedError, QueueFullError, QueueTimeoutError
from pydotcompute.ring_kernels.message import array_message, get_buffer_registry, message
from pydotcompute.ring_kernels.queue import BackpressureStrategy, MessageQueue


@message
class Job:
    n: int


def job(n: int, priority: int = 128) -> Job:
    return Job(n=n, priority=priority)


def ns(items: list[Job]) -> list[int]:
    return [j.n for j in items]


def test_defaults_match_the_api() -> None:
    q: MessageQueue[Job] = MessageQueue()
    assert q.maxsize == 4096
    assert q.backpressure is BackpressureStrategy.BLOCK
    assert q.use_priority
    assert q.kernel_id == ""
    assert (q.qsize, q.empty, q.full, len(q)) == (0, True, False, 0)


def test_exact_priority_order_with_fifo_ties() -> None:
    q: MessageQueue[Job] = MessageQueue(0)
    prios = [5, 200, 5, 199, 255, 0, 200]
    q.put_batch(job(i, p) for i, p in enumerate(prios))
    assert ns(q.get_batch(10)) == [4, 1, 6, 3, 0, 2, 5]


def test_fifo_mode_ignores_priority() -> None:
    q: MessageQueue[Job] = MessageQueue(0, use_priority=False)
    q.put_batch(job(i, p) for i, p in enumerate([0, 255, 128]))
    assert ns(q.get_batch(10)) == [0, 1, 2]


def test_get_stats_keys_from_the_api() -> None:
    q: MessageQueue[Job] = MessageQueue(8)
    q.put_batch(job(i, p) for i, p in enumerate([250, 170, 100, 1]))
    q.get_nowait()
    stats = q.get_stats()
    for key in ("current_size", "max_size", "total_enqueued", "total_dequeued", "total_dropped"):
        assert key in stats
    assert (stats["current_size"], stats["max_size"]) == (3, 8)
    assert (stats["total_enqueued"], stats["total_dequeued"], stats["total_dropped"]) == (4, 1, 0)
    assert stats["band_counts"] == {"SYSTEM": 0, "HIGH": 1, "NORMAL": 1, "LOW": 1}


def test_reject() -> None:
    q: MessageQueue[Job] = MessageQueue(2, backpressure="reject", kernel_id="k")
    q.put_batch([job(0), job(1)])
    with pytest.raises(QueueFullError, match=r"queue of kernel 'k' is full \(2/2 messages\)"):
        q.put_nowait(job(2))


@pytest.mark.parametrize("use_priority", [True, False])
def test_drop_oldest_drops_the_oldest_lowest_priority(use_priority: bool) -> None:
    q: MessageQueue[Job] = MessageQueue(3, backpressure="drop_oldest", use_priority=use_priority)
    q.put_batch(job(i, p) for i, p in enumerate([5, 200, 5, 199]))
    expected = [1, 3, 2] if use_priority else [1, 2, 3]
    assert ns(q.get_batch(10)) == expected
    assert q.get_stats()["total_dropped"] == 1


async def test_block_waits_and_times_out() -> None:
    q: MessageQueue[Job] = MessageQueue(1)
    await q.put(job(0))
    with pytest.raises(QueueTimeoutError, match=r"timed out after 0\.01s waiting for space"):
        await q.put(job(1), timeout=0.01)
    putter = asyncio.ensure_future(q.put(job(2, 255)))
    await asyncio.sleep(0)
    assert (await q.get()).n == 0
    assert await asyncio.wait_for(putter, 1.0) is True
    assert (await q.get()).n == 2


async def test_get_timeout() -> None:
    q: MessageQueue[Job] = MessageQueue(1)
    with pytest.raises(QueueTimeoutError, match=r"no message arrived within 0\.01s"):
        await q.get(timeout=0.01)


async def test_get_waits_and_priority_applies_to_waiting_messages() -> None:
    q: MessageQueue[Job] = MessageQueue(0)
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.put_nowait(job(1, 1))
    q.put_nowait(job(2, 254))
    first = await asyncio.wait_for(getter, 1.0)
    # the getter woke for the first put but takes the best message present when it runs
    assert first.n == 2
    assert q.get_nowait().n == 1  # type: ignore[union-attr]


def test_clear_and_drain() -> None:
    q: MessageQueue[Job] = MessageQueue(0)
    q.put_batch(job(i, i) for i in range(5))
    assert ns(q.drain()) == [4, 3, 2, 1, 0]
    q.put_batch(job(i) for i in range(3))
    assert q.clear() == 3
    assert q.empty
    assert q.get_stats()["total_dropped"] == 3


async def test_close() -> None:
    q: MessageQueue[Job] = MessageQueue(4)
    q.put_nowait(job(0))
    q.close()
    with pytest.raises(QueueClosedError):
        q.put_nowait(job(1))
    assert (await q.get()).n == 0
    with pytest.raises(QueueClosedError):
        await q.get()


def test_bad_priority_is_refused() -> None:
    q: MessageQueue[Job] = MessageQueue(4)
    bad = job(0)
    bad.priority = 300
    with pytest.raises(ValueError, match=r"priority must be an int in 0\.\.255, got 300"):
        q.put_nowait(bad)
    assert q.empty


@array_message
class Tile:
    pixels: np.ndarray


def _refs(arr: np.ndarray) -> int:
    reg = get_buffer_registry()
    bid = reg._by_object.get(id(arr))
    return 0 if bid is None else reg.refcount(bid)


@pytest.mark.parametrize("use_priority", [True, False])
def test_dropped_and_cleared_frames_release_their_arrays(use_priority: bool) -> None:
    q: MessageQueue[bytes] = MessageQueue(2, backpressure="drop_oldest", use_priority=use_priority)
    arrays = [np.full(3, i) for i in range(3)]
    for arr in arrays:
        q.put_nowait(Tile(pixels=arr).serialize())  # frames as bytes: each pins its array
    assert [_refs(a) for a in arrays] == [0, 1, 1]  # the dropped frame let go of its array
    assert q.clear() == 2
    assert [_refs(a) for a in arrays] == [0, 0, 0]
    assert q.get_stats()["total_dropped"] == 3
