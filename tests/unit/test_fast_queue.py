"""FastMessageQueue (four bands, O(1)), PriorityBand and RingBuffer."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import numpy as np
import pytest

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    MessageDeserializationError,
    QueueClosedError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.fast_queue import (
    BackpressureStrategy,
    FastMessageQueue,
    PriorityBand,
    QueueStats,
    RingBuffer,
    get_priority_band,
)
from pydotcompute.ring_kernels.message import (
    array_message,
    get_buffer_registry,
    message,
    message_tag,
)


@message
class Item:
    seq: int


def item(seq: int, priority: int = 128) -> Item:
    return Item(seq=seq, priority=priority)


def seqs(items: list[Item]) -> list[int]:
    return [i.seq for i in items]


# --- bands -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "band"),
    [
        (255, PriorityBand.SYSTEM),
        (224, PriorityBand.SYSTEM),
        (223, PriorityBand.HIGH),
        (160, PriorityBand.HIGH),
        (159, PriorityBand.NORMAL),
        (128, PriorityBand.NORMAL),
        (64, PriorityBand.NORMAL),
        (63, PriorityBand.LOW),
        (0, PriorityBand.LOW),
    ],
)
def test_priority_bands(priority: int, band: PriorityBand) -> None:
    assert get_priority_band(priority) is band


@pytest.mark.parametrize("bad", [-1, 256])
def test_priority_band_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match=r"priority must be in 0\.\.255, got"):
        get_priority_band(bad)


def test_band_enum_values() -> None:
    assert [(b.name, int(b)) for b in PriorityBand] == [
        ("SYSTEM", 0),
        ("HIGH", 1),
        ("NORMAL", 2),
        ("LOW", 3),
    ]


def test_strict_band_order_fifo_within_band() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    prios = [10, 200, 128, 250, 170, 64, 0, 230, 63, 159]
    for i, p in enumerate(prios):
        q.put_nowait(item(i, p))
    out = q.get_batch(100)
    # SYSTEM 3, 7; HIGH 1, 4; NORMAL 2, 5, 9; LOW 0, 6, 8 (each band in arrival order)
    assert seqs(out) == [3, 7, 1, 4, 2, 5, 9, 0, 6, 8]


def test_objects_without_priority_go_to_normal() -> None:
    q: FastMessageQueue[object] = FastMessageQueue(0)
    q.put_nowait("plain")
    q.put_nowait(item(1, 255))
    assert q.get_nowait().seq == 1  # type: ignore[union-attr]
    assert q.get_nowait() == "plain"
    assert q.statistics().band_counts == (0, 0, 0, 0)


@pytest.mark.parametrize("bad", [-1, 256, 1.5, "7"])
def test_put_with_out_of_range_priority_is_refused(bad: object) -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(4)
    msg = item(0)
    msg.priority = bad  # type: ignore[assignment]  # bypasses the constructor's check
    with pytest.raises(ValueError, match=r"priority must be an int in 0\.\.255"):
        q.put_nowait(msg)
    assert len(q) == 0


class _Prioritized:
    def __init__(self, priority: object) -> None:
        self.priority = priority


def test_every_priority_lands_in_its_band() -> None:
    """The queue's core (compiled, or the twin under PYDOTCOMPUTE_PUREPYTHON) picks the
    band `get_priority_band` names for each of the 256 priorities, and a bool keeps the
    band of its int value, as the table lookup gives it."""
    q: FastMessageQueue[object] = FastMessageQueue(0)
    for p in range(256):
        q.put_nowait(_Prioritized(p))
        counts = q.statistics().band_counts
        assert counts[get_priority_band(p)] == 1, p
        q.get_nowait()
    q.put_nowait(_Prioritized(True))
    assert q.statistics().band_counts == (0, 0, 0, 1)


@pytest.mark.parametrize("bad", [2**70, -(2**70), None])
def test_a_priority_beyond_a_c_long_is_refused(bad: object) -> None:
    q: FastMessageQueue[object] = FastMessageQueue(0)
    with pytest.raises(ValueError, match=r"priority must be an int in 0\.\.255"):
        q.put_nowait(_Prioritized(bad))
    assert len(q) == 0


# --- properties and statistics ---------------------------------------------------------


def test_properties() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(2, kernel_id="k")
    assert (q.maxsize, q.qsize, q.empty, q.full, len(q)) == (2, 0, True, False, 0)
    assert q.backpressure is BackpressureStrategy.BLOCK
    q.put_nowait(item(0))
    q.put_nowait(item(1))
    assert (q.qsize, q.empty, q.full, len(q)) == (2, False, True, 2)
    assert "kernel='k'" in repr(q)


def test_unbounded_queue_is_never_full() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    assert q.put_batch(item(i) for i in range(10_000)) == 10_000
    assert not q.full


@pytest.mark.parametrize("bad", [-1, 1.5, "8", None])
def test_bad_maxsize(bad: object) -> None:
    with pytest.raises(InvalidConfigurationError, match=r"queue maxsize must be an int >= 0"):
        FastMessageQueue(bad)  # type: ignore[arg-type]


def test_bad_backpressure_lists_the_choices() -> None:
    with pytest.raises(
        InvalidConfigurationError, match=r"unknown backpressure strategy 'sometimes'; choose"
    ):
        FastMessageQueue(4, backpressure="sometimes")


def test_backpressure_accepts_enum_and_any_case() -> None:
    assert FastMessageQueue(1, backpressure="REJECT").backpressure is BackpressureStrategy.REJECT
    assert (
        FastMessageQueue(1, backpressure=BackpressureStrategy.DROP_OLDEST).backpressure
        is BackpressureStrategy.DROP_OLDEST
    )


def test_statistics_count_everything() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(3, backpressure="drop_oldest")
    for i, p in enumerate([250, 200, 100, 10]):
        q.put_nowait(item(i, p))
    assert q.get_nowait().seq == 0  # type: ignore[union-attr]
    stats = q.statistics()
    assert isinstance(stats, QueueStats)
    assert stats == QueueStats(
        max_size=3,
        current_size=2,
        peak_size=3,
        total_enqueued=4,
        total_dequeued=1,
        total_dropped=1,  # the NORMAL one: the oldest of the lowest band present
        band_counts=(0, 1, 0, 1),
        closed=False,
    )
    d = q.get_stats()
    assert d["band_counts"] == {"SYSTEM": 0, "HIGH": 1, "NORMAL": 0, "LOW": 1}
    assert d["current_size"] == 2
    assert d["peak_size"] == 3
    with pytest.raises(AttributeError):
        stats.current_size = 0  # type: ignore[misc]  # frozen


# --- nowait and batch ------------------------------------------------------------------


def test_get_nowait_on_empty_returns_none() -> None:
    assert FastMessageQueue(1).get_nowait() is None


def test_put_batch_stops_at_capacity_under_block_and_reject() -> None:
    for strategy in ("block", "reject"):
        q: FastMessageQueue[Item] = FastMessageQueue(3, backpressure=strategy)
        assert q.put_batch(item(i) for i in range(5)) == 3
        assert seqs(q.get_batch(10)) == [0, 1, 2]


def test_put_batch_under_drop_oldest_keeps_the_newest() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(3, backpressure="drop_oldest")
    assert q.put_batch(item(i) for i in range(5)) == 5
    assert seqs(q.get_batch(10)) == [2, 3, 4]
    assert q.statistics().total_dropped == 2


def test_get_batch_respects_max_count_and_order() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    q.put_batch([item(0, 0), item(1, 255), item(2, 128)])
    assert seqs(q.get_batch(2)) == [1, 2]
    assert seqs(q.get_batch(0)) == []
    assert seqs(q.get_batch(5)) == [0]


def test_clear_counts_dropped() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    q.put_batch(item(i) for i in range(7))
    assert q.clear() == 7
    assert q.empty
    assert q.statistics().total_dropped == 7
    assert q.clear() == 0


def test_drain_returns_everything_in_order_without_counting_drops() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    q.put_batch([item(0, 1), item(1, 240), item(2, 1)])
    assert seqs(q.drain()) == [1, 0, 2]
    assert q.statistics().total_dropped == 0


# --- backpressure ----------------------------------------------------------------------


def test_reject_raises_queue_full_naming_the_kernel() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(2, kernel_id="ingest", backpressure="reject")
    q.put_nowait(item(0))
    q.put_nowait(item(1))
    with pytest.raises(
        QueueFullError,
        match=r"queue of kernel 'ingest' is full \(2/2 messages\) and its backpressure is "
        r"'reject'; receive faster, raise queue_size",
    ):
        q.put_nowait(item(2))
    assert len(q) == 2


async def test_reject_put_raises_at_once_even_with_a_timeout() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1, backpressure="reject")
    await q.put(item(0))
    with pytest.raises(QueueFullError, match="is full"):
        await q.put(item(1), timeout=10.0)


async def test_drop_oldest_drops_the_oldest_of_the_lowest_band() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(3, backpressure="drop_oldest")
    for i, p in enumerate([10, 200, 20]):
        await q.put(item(i, p))
    assert await q.put(item(3, 250), timeout=0.0) is True
    assert seqs(q.get_batch(10)) == [3, 1, 2]
    assert q.statistics().total_dropped == 1


def test_block_put_nowait_raises_when_full() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1)
    q.put_nowait(item(0))
    with pytest.raises(QueueFullError, match="backpressure is 'block'"):
        q.put_nowait(item(1))


async def test_block_put_times_out() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1, kernel_id="k")
    await q.put(item(0))
    with pytest.raises(
        QueueTimeoutError,
        match=r"timed out after 0\.01s waiting for space in queue of kernel 'k' \(1/1",
    ):
        await q.put(item(1), timeout=0.01)
    with pytest.raises(TimeoutError):
        await q.put(item(1), timeout=0)
    assert seqs(q.get_batch(5)) == [0]


async def test_block_put_waits_for_space() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1)
    await q.put(item(0))
    putter = asyncio.ensure_future(q.put(item(1)))
    await asyncio.sleep(0)
    assert not putter.done()
    assert q.get_nowait().seq == 0  # type: ignore[union-attr]
    assert await putter is True
    assert q.get_nowait().seq == 1  # type: ignore[union-attr]


async def test_blocked_putters_are_served_in_order() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1)
    q.put_nowait(item(0))
    putters = [asyncio.ensure_future(q.put(item(i))) for i in range(1, 5)]
    await asyncio.sleep(0)
    got = [(await q.get(timeout=1.0)).seq for _ in range(5)]
    await asyncio.gather(*putters)
    assert got == [0, 1, 2, 3, 4]


async def test_clear_wakes_blocked_putters() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1)
    q.put_nowait(item(0))
    putter = asyncio.ensure_future(q.put(item(1)))
    await asyncio.sleep(0)
    assert q.clear() == 1
    assert await asyncio.wait_for(putter, 1.0) is True
    assert seqs(q.get_batch(5)) == [1]


# --- get -------------------------------------------------------------------------------


async def test_get_times_out_with_a_timeout_error() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1, kernel_id="k")
    with pytest.raises(QueueTimeoutError, match=r"no message arrived within 0\.01s on queue of"):
        await q.get(timeout=0.01)
    with pytest.raises(TimeoutError):
        await q.get(timeout=0)


async def test_get_waits_for_a_put() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1)
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.put_nowait(item(42))
    assert (await asyncio.wait_for(getter, 1.0)).seq == 42


async def test_a_cancelled_getter_passes_its_wake_up_on() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    first = asyncio.ensure_future(q.get())
    second = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.put_nowait(item(7))  # wakes `first`...
    first.cancel()  # ...which never takes it
    assert (await asyncio.wait_for(second, 1.0)).seq == 7
    assert first.cancelled()
    assert len(q) == 0


async def test_a_timed_out_getter_does_not_swallow_a_later_message() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    with pytest.raises(QueueTimeoutError):
        await q.get(timeout=0.001)
    q.put_nowait(item(1))
    assert (await q.get(timeout=1.0)).seq == 1


async def test_wait_for_around_get_leaves_the_queue_consistent() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.get(), 0.001)
    q.put_nowait(item(3))
    assert (await q.get(timeout=1.0)).seq == 3


async def test_many_getters_each_get_one_message() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0)
    getters = [asyncio.ensure_future(q.get(timeout=5.0)) for _ in range(50)]
    await asyncio.sleep(0)
    q.put_batch(item(i) for i in range(50))
    got = await asyncio.gather(*getters)
    assert sorted(seqs(got)) == list(range(50))


def test_a_queue_belongs_to_the_loop_of_its_first_wait() -> None:
    """As with ``asyncio.Queue``: waiting from a second loop raises, it does not hang, and
    the queue stays usable from its own loop's point of view (nothing left parked)."""
    q: FastMessageQueue[Item] = FastMessageQueue(0)

    async def first() -> None:
        with pytest.raises(QueueTimeoutError):
            await q.get(timeout=0.001)
        waiter = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        q.put_nowait(item(1))
        assert (await waiter).seq == 1

    async def second() -> None:
        with pytest.raises(RuntimeError, match="different loop"):
            await asyncio.wait_for(q.get(), 5.0)
        q.put_nowait(item(2))  # no stale waiter swallows the wake-up
        assert q.get_nowait().seq == 2  # type: ignore[union-attr]

    asyncio.run(first())
    asyncio.run(second())


# --- close -----------------------------------------------------------------------------


async def test_close_refuses_puts_and_drains_to_getters() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(4, kernel_id="k")
    q.put_batch([item(0), item(1)])
    q.close()
    assert q.closed
    with pytest.raises(QueueClosedError, match="queue of kernel 'k' is closed"):
        q.put_nowait(item(2))
    with pytest.raises(QueueClosedError):
        await q.put(item(2))
    with pytest.raises(QueueClosedError):
        q.put_batch([item(2)])
    assert (await q.get()).seq == 0
    assert q.get_nowait().seq == 1  # type: ignore[union-attr]
    with pytest.raises(QueueClosedError):
        await q.get()
    with pytest.raises(QueueClosedError):
        q.get_nowait()


async def test_close_wakes_blocked_getters_and_putters_with_the_reason() -> None:
    full: FastMessageQueue[Item] = FastMessageQueue(1)
    full.put_nowait(item(0))
    empty: FastMessageQueue[Item] = FastMessageQueue(1)
    putter = asyncio.ensure_future(full.put(item(1)))
    getter = asyncio.ensure_future(empty.get())
    await asyncio.sleep(0)
    reason = RuntimeError("shutting down")
    full.close()
    empty.close(reason)
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(putter, 1.0)
    with pytest.raises(RuntimeError, match="shutting down"):
        await asyncio.wait_for(getter, 1.0)
    assert full.statistics().closed


async def test_close_is_idempotent_and_a_later_reason_wins() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(1)
    q.close()
    q.close(KeyError("later"))
    q.close()
    with pytest.raises(KeyError, match="later"):
        await q.get()


# --- serialize=True --------------------------------------------------------------------


async def test_serializing_queue_stores_bytes_and_returns_messages() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(4, serialize=True)
    a, b = item(1, 10), item(2, 250)
    q.put_nowait(a)
    await q.put(b)
    stored = [x for band in q._bands if band for x in band]
    assert all(type(x) is bytes for x in stored)
    assert q.statistics().band_counts == (1, 0, 0, 1)
    out = [await q.get(), q.get_nowait()]
    assert out == [b, a]
    assert out[0] is not b  # a decoded copy, as across a process


@message
class Counted:
    seq: int

    def serialize(self) -> bytes:
        SERIALIZED.append(self.seq)
        return super().serialize()


SERIALIZED: list[int] = []


def test_a_serializing_queue_calls_each_class_own_serialize() -> None:
    """A class that overrides ``serialize`` is served by its own method every time, also
    after a plain class took the queue's short path to the compiled one."""
    SERIALIZED.clear()
    q: FastMessageQueue[Any] = FastMessageQueue(0, serialize=True)
    for i in range(3):
        q.put_nowait(item(i))
        q.put_nowait(Counted(seq=i))
    assert SERIALIZED == [0, 1, 2]
    got = q.get_batch(6)
    assert [type(m) for m in got] == [Item, Counted] * 3
    assert [m.seq for m in got] == [0, 0, 1, 1, 2, 2]


# --- RingBuffer ------------------------------------------------------------------------


def test_ring_buffer_rounds_capacity_up_to_a_power_of_two() -> None:
    assert RingBuffer(3).capacity == 4
    assert RingBuffer(4).capacity == 4
    assert RingBuffer(1000).capacity == 1024
    assert RingBuffer().capacity == 4096
    with pytest.raises(InvalidConfigurationError, match="ring capacity must be an int > 0"):
        RingBuffer(0)


def test_ring_buffer_fifo_and_full() -> None:
    rb: RingBuffer[int] = RingBuffer(4)
    assert rb.empty
    assert [rb.put_nowait(i) for i in range(5)] == [True, True, True, True, False]
    assert rb.full
    assert (rb.size, len(rb)) == (4, 4)
    assert [rb.get_nowait() for _ in range(5)] == [0, 1, 2, 3, None]
    for i in range(10):  # wraps around
        assert rb.put_nowait(i)
        assert rb.get_nowait() == i


async def test_ring_buffer_timeouts_return_false_and_none() -> None:
    rb: RingBuffer[int] = RingBuffer(1)
    assert await rb.put(1, timeout=0.01) is True
    assert await rb.put(2, timeout=0.01) is False
    assert await rb.get(timeout=0.01) == 1
    assert await rb.get(timeout=0.01) is None


async def test_ring_buffer_wakes_waiters() -> None:
    rb: RingBuffer[int] = RingBuffer(1)
    getter = asyncio.ensure_future(rb.get(timeout=5.0))
    await asyncio.sleep(0)
    await rb.put(9)
    assert await getter == 9
    rb.put_nowait(1)
    putter = asyncio.ensure_future(rb.put(2, timeout=5.0))
    await asyncio.sleep(0)
    assert rb.get_nowait() == 1
    assert await putter is True
    assert rb.get_nowait() == 2


# --- serialize=True: by-reference frames and raw bytes -------------------------------------


@array_message
class Tile:
    pixels: np.ndarray
    seq: int = 0


def tile(seq: int, priority: int = 128) -> tuple[Tile, np.ndarray]:
    pixels = np.full(4, seq, dtype=np.int32)
    return Tile(pixels=pixels, seq=seq, priority=priority), pixels


def pinned(*arrays: np.ndarray) -> list[int]:
    """How many references the process registry holds to each array."""
    reg = get_buffer_registry()
    counts = []
    for arr in arrays:
        bid = reg._by_object.get(id(arr))
        counts.append(0 if bid is None else reg.refcount(bid))
    return counts


def test_clear_releases_the_arrays_of_by_reference_frames() -> None:
    q: FastMessageQueue[Tile] = FastMessageQueue(8, serialize=True)
    made = [tile(i) for i in range(3)]
    for msg, _ in made:
        q.put_nowait(msg)
    arrays = [arr for _, arr in made]
    assert pinned(*arrays) == [1, 1, 1]  # each frame pins its array until decoded
    assert q.clear() == 3
    assert pinned(*arrays) == [0, 0, 0]
    assert q.statistics().total_dropped == 3


def test_a_queue_collected_with_frames_in_it_releases_their_arrays() -> None:
    q: FastMessageQueue[Tile] = FastMessageQueue(8, serialize=True)
    made = [tile(i) for i in range(3)]
    for msg, _ in made:
        q.put_nowait(msg)
    arrays = [arr for _, arr in made]
    assert q.get_nowait().pixels is arrays[0]  # read: its reference was taken
    assert pinned(*arrays) == [0, 1, 1]
    del q
    gc.collect()
    assert pinned(*arrays) == [0, 0, 0]


def test_a_queue_that_failed_to_construct_is_collected_quietly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(InvalidConfigurationError):
        FastMessageQueue(-1, serialize=True)
    gc.collect()
    assert "Exception ignored" not in capsys.readouterr().err


def test_drop_oldest_releases_the_arrays_of_the_dropped_frame() -> None:
    q: FastMessageQueue[Tile] = FastMessageQueue(2, serialize=True, backpressure="drop_oldest")
    made = [tile(i) for i in range(3)]
    for msg, _ in made:
        q.put_nowait(msg)
    (_, first), (_, second), (_, third) = made
    assert pinned(first, second, third) == [0, 1, 1]  # the oldest was dropped and released
    assert q.statistics().total_dropped == 1
    out = q.get_batch(2)
    assert [m.seq for m in out] == [1, 2]
    assert out[0].pixels is second  # the kept frames still decode by reference
    assert pinned(second, third) == [0, 0]


def test_put_batch_with_drop_oldest_releases_what_it_drops() -> None:
    q: FastMessageQueue[Tile] = FastMessageQueue(1, serialize=True, backpressure="drop_oldest")
    made = [tile(i) for i in range(4)]
    assert q.put_batch(msg for msg, _ in made) == 4
    assert pinned(*(arr for _, arr in made)) == [0, 0, 0, 1]
    assert q.statistics().total_dropped == 3
    assert q.clear() == 1
    assert pinned(made[-1][1]) == [0]


def test_clearing_raw_by_reference_frames_releases_them() -> None:
    # bytes made elsewhere (a frame put as bytes) own their references just the same
    q: FastMessageQueue[Any] = FastMessageQueue(0)
    msg, arr = tile(1)
    q.put_nowait(msg.serialize())
    assert pinned(arr) == [1]
    q.clear()
    assert pinned(arr) == [0]


def test_clearing_other_bytes_leaves_the_registry_alone() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(0)
    keep, arr = tile(7)
    data = keep.serialize()  # pinned by a frame the queue never saw
    q.put_nowait(b"not a frame at all")
    q.put_nowait(item(1).serialize())
    assert q.clear() == 2
    assert pinned(arr) == [1]
    assert Tile.deserialize(data).pixels is arr


@pytest.mark.parametrize(
    ("priority", "band"),
    [
        (250, PriorityBand.SYSTEM),
        (200, PriorityBand.HIGH),
        (128, PriorityBand.NORMAL),
        (100, PriorityBand.NORMAL),
        (10, PriorityBand.LOW),
        (0, PriorityBand.LOW),
    ],
)
def test_raw_bytes_land_in_the_band_of_their_frame_priority(
    priority: int, band: PriorityBand
) -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(4, serialize=True)
    q.put_nowait(item(1, priority).serialize())
    counts = [0, 0, 0, 0]
    counts[band] = 1
    assert q.statistics().band_counts == tuple(counts)


async def test_raw_bytes_are_served_by_their_frame_priority() -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(0, serialize=True)
    q.put_nowait(item(1, 10).serialize())
    await q.put(item(2, 128).serialize())
    q.put_batch([item(3, 250).serialize(), item(4, 180)])
    assert seqs(q.get_batch(4)) == [3, 4, 2, 1]


def _frame(items: bytes, *, count: int = 5) -> bytes:
    """An ``Item`` frame: ``[tag, seq, message_id, priority, correlation_id]``."""
    tag = message_tag(Item).encode()
    return bytes((0x90 | count, 0xA0 | len(tag))) + tag + items


_MALFORMED_IDS = [
    "empty",
    "not-msgpack",
    "tag-not-str",
    "unknown-tag",
    "no-body",
    "too-few-items",
    "id-not-bytes",
    "priority-256",
    "priority-negative",
    "priority-str",
    "id-cut",
]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not a pydotcompute message"),
        (b"hello world", "not a pydotcompute message"),
        (b"\x95\x01", "the type tag is not a string"),
        (b"\x95\xa3a.b\x01\xc0\x01\xc0", "unknown message type 'a.b'"),
        (_frame(b""), "truncated"),
        (_frame(b"\x01", count=2), r"at least length \d, got 2"),
        (_frame(b"\x01\xa3abc\x80\xc0"), "at `message_id`"),
        (_frame(b"\x01\xc4\x10" + bytes(16) + b"\xcd\x01\x00\xc0"), r"<= 255 - at `priority`"),
        (_frame(b"\x01\xc4\x10" + bytes(16) + b"\xff\xc0"), r">= 0 - at `priority`"),
        (_frame(b"\x01\xc4\x10" + bytes(16) + b"\xa1x\xc0"), r"got `str` - at `priority`"),
        (_frame(b"\x01\xc4\x10" + bytes(8)), "truncated"),
    ],
    ids=_MALFORMED_IDS,
)
async def test_malformed_raw_bytes_are_refused_not_queued(data: bytes, why: str) -> None:
    q: FastMessageQueue[Item] = FastMessageQueue(4, serialize=True)
    with pytest.raises(MessageDeserializationError, match=why):
        q.put_nowait(data)  # type: ignore[arg-type]
    with pytest.raises(MessageDeserializationError, match=why):
        await q.put(data)  # type: ignore[arg-type]
    with pytest.raises(MessageDeserializationError, match=why):
        q.put_batch([data])  # type: ignore[list-item]
    assert q.empty
    assert q.statistics().total_enqueued == 0


def test_a_serializing_queue_refuses_a_non_message_with_the_kernel_id() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(4, serialize=True, kernel_id="sink")
    with pytest.raises(TypeValidationError, match=r"kernel 'sink'.*serialize=True.*got int"):
        q.put_nowait(42)
    assert q.empty


def test_drop_oldest_reports_each_drop_to_its_owner() -> None:
    seen: list[int] = []
    q: FastMessageQueue[Any] = FastMessageQueue(2, backpressure="drop_oldest")
    q.on_drop = seen.append
    for i in range(5):
        q.put_nowait(i)
    assert seen == [1, 1, 1]
    assert q.statistics().total_dropped == 3


def test_put_overflow_keeps_an_item_readable_past_the_bound_and_the_close() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(1)
    q.put_nowait("a")
    q.close()
    q.put_overflow("b")  # full and closed: still kept, never dropped
    assert [q.get_nowait(), q.get_nowait()] == ["a", "b"]
    with pytest.raises(QueueClosedError):
        q.get_nowait()


# --- the per-hop calls the actor's inlined paths make on a queue ---


def test_offer_appends_only_into_an_open_queue_with_room() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(2)
    assert q.offer("a")
    assert q.offer("b")
    assert q.qsize == 2
    assert not q.offer("c")  # full: nothing appended, nothing raised
    assert q.qsize == 2
    assert q.take() == "a"
    q.close()
    assert not q.offer("d")  # closed: refused the same way
    assert (q.qsize, q.take(), q.qsize) == (1, "b", 0)


def test_take_serves_by_band_then_fifo_and_counts_the_dequeue() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(0)
    for p in (10, 250, 100, 250):
        q.offer(_Prioritized(p))
    assert [q.take().priority for _ in range(q.qsize)] == [250, 250, 100, 10]
    stats = q.statistics()
    assert (stats.current_size, stats.total_dequeued) == (0, 4)


async def test_a_parked_getter_is_woken_by_the_next_put() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(4)
    fut = q.park_getter()
    assert q.parked_getters == 1
    assert not fut.done()
    q.put_nowait("x")
    await asyncio.wait_for(fut, 5.0)
    assert q.parked_getters == 0
    assert q.qsize == 1
    assert q.take() == "x"


async def test_an_abandoned_wait_passes_its_wake_up_to_the_next_getter() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(4)
    first, second = q.park_getter(), q.park_getter()
    assert q.parked_getters == 2
    q.put_nowait("x")  # wakes the first
    assert first.done()
    assert not second.done()
    q.unpark_getter(first)  # its owner gave up: the message must not be stranded
    assert second.done()
    assert q.parked_getters == 0


async def test_park_getter_on_a_closed_drained_queue_raises_the_close_reason() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(4)
    reason = RuntimeError("actor failed")
    q.close(reason)
    with pytest.raises(RuntimeError, match="actor failed"):
        q.park_getter()


async def test_take_within_waits_for_a_message_or_times_out() -> None:
    q: FastMessageQueue[Any] = FastMessageQueue(4)
    with pytest.raises(QueueTimeoutError):
        await q.take_within(0.01)
    assert q.parked_getters == 0  # the expired wait left nothing behind
    asyncio.get_running_loop().call_soon(q.put_nowait, "late")
    assert await q.take_within(5.0) == "late"


async def test_a_subclass_overriding_one_name_of_a_hop_is_reached_through_both() -> None:
    """`MessageQueue` replaces the core's dequeue under its older private name: the public
    `take` (what the inlined paths call) serves exact priority order too; a subclass
    written against the public name is what `get` reaches."""
    from pydotcompute.ring_kernels.queue import MessageQueue

    mq: MessageQueue[Any] = MessageQueue(0)
    for p in (199, 200, 10):
        mq.put_nowait(_Prioritized(p))
    assert [mq.take().priority for _ in range(3)] == [200, 199, 10]

    taken: list[Any] = []

    class Recording(FastMessageQueue[Any]):
        def take(self) -> Any:
            item = super().take()
            taken.append(item)
            return item

    q = Recording(4)
    q.put_nowait("a")
    q.put_nowait("b")
    assert q.get_nowait() == "a"
    assert await q.get() == "b"
    assert taken == ["a", "b"]


def test_a_full_queue_advises_what_its_own_policy_leaves() -> None:
    """A ``block`` queue refuses only a hand-over that cannot wait: its refusal does not
    tell it to choose ``block``; a ``reject`` queue's still offers both other policies."""
    blocking: FastMessageQueue[Item] = FastMessageQueue(1, kernel_id="sink")
    blocking.put_nowait(item(0))
    with pytest.raises(QueueFullError) as info:
        blocking.put_nowait(item(1))
    text = str(info.value)
    assert text == (
        "queue of kernel 'sink' is full (1/1 messages); its backpressure is 'block', but "
        "this hand-over cannot wait for room (send_nowait, or a reply delivered while its "
        "sender stops): receive faster, raise queue_size, or choose "
        "backpressure='drop_oldest' to make room by dropping the oldest message"
    )
    assert "choose backpressure='block'" not in text
    rejecting: FastMessageQueue[Item] = FastMessageQueue(1, backpressure="reject")
    rejecting.put_nowait(item(0))
    with pytest.raises(
        QueueFullError,
        match=r"backpressure is 'reject'; receive faster, raise queue_size, or choose "
        r"backpressure='block' or 'drop_oldest'$",
    ):
        rejecting.put_nowait(item(1))


# --- wait_until: one timer per loop ------------------------------------------------------


def _counting_call_at(loop: asyncio.AbstractEventLoop) -> list[float]:
    """Record every ``loop.call_at`` (a plain asyncio loop lets an instance attribute
    shadow the method)."""
    calls: list[float] = []
    plain = loop.call_at

    def call_at(when: float, *args: Any, **kwargs: Any) -> Any:
        calls.append(when)
        return plain(when, *args, **kwargs)

    loop.call_at = call_at  # type: ignore[method-assign]
    return calls


def test_waits_with_a_deadline_share_one_loop_timer() -> None:
    """A thousand answered waits with the same timeout set the loop's timer once: no
    timer is made and cancelled per wait (each cost a loop pass of its own)."""
    from pydotcompute.ring_kernels.fast_queue import _deadlines_of, wait_until

    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls = _counting_call_at(loop)
        for i in range(1000):
            fut = loop.create_future()
            loop.call_soon(fut.set_result, i)
            assert await wait_until(fut, loop.time() + 30.0, loop) == i
        assert len(calls) == 1
        deadlines = _deadlines_of(loop)
        assert deadlines is not None
        assert deadlines.waiting == {}  # every answered wait took its entry back
        assert len(deadlines.heap) <= 2 * 0 + 65  # entries of ended waits are pruned

    asyncio.run(main())


async def test_each_wait_fails_at_its_own_deadline_in_any_order() -> None:
    """Deadlines filed late but due early are honoured (the timer moves earlier), and a
    wait never fails before its deadline."""
    from pydotcompute.ring_kernels.fast_queue import wait_until

    loop = asyncio.get_running_loop()
    ended: dict[str, float] = {}

    async def wait(name: str, seconds: float) -> None:
        fut = loop.create_future()
        deadline = loop.time() + seconds
        with pytest.raises(TimeoutError):
            await wait_until(fut, deadline, loop)
        ended[name] = loop.time()
        assert loop.time() >= deadline - 0.0011  # a loop clock's resolution (uvloop: 1 ms)
        assert fut.done()

    slow = asyncio.ensure_future(wait("slow", 0.3))
    await asyncio.sleep(0)
    fast = asyncio.ensure_future(wait("fast", 0.02))
    middle = asyncio.ensure_future(wait("middle", 0.1))
    await asyncio.wait_for(asyncio.gather(slow, fast, middle), 10.0)
    assert sorted(ended, key=ended.__getitem__) == ["fast", "middle", "slow"]


async def test_a_cancelled_wait_leaves_no_deadline_behind() -> None:
    from pydotcompute.ring_kernels.fast_queue import _deadlines_of, wait_until

    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    task = asyncio.ensure_future(wait_until(fut, loop.time() + 30.0, loop))
    await asyncio.sleep(0)
    deadlines = _deadlines_of(loop)
    assert deadlines is not None
    assert list(deadlines.waiting.values()) == [fut]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fut.cancelled()
    assert deadlines.waiting == {}
    # a deadline already passed: cancelled at once, nothing filed
    late = loop.create_future()
    with pytest.raises(TimeoutError):
        await wait_until(late, loop.time() - 1.0, loop)
    assert late.cancelled()
    assert deadlines.waiting == {}


def test_a_closed_loop_and_its_deadlines_are_collected() -> None:
    """The registry refers to each loop's deadlines weakly: a loop closed with its timer
    still set is not kept alive by them."""
    import weakref

    from pydotcompute.ring_kernels.fast_queue import _deadlines_of, wait_until

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.set_result, 1)
        await wait_until(fut, loop.time() + 60.0, loop)  # leaves the timer set
        return weakref.ref(_deadlines_of(loop)), weakref.ref(loop)

    deadlines_ref, loop_ref = asyncio.run(main())
    gc.collect()
    assert loop_ref() is None
    assert deadlines_ref() is None
