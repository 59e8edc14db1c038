"""The ``shm-ring`` edge's mechanism (``tiers/process/edge.py``), both ends in one
process: bands, the bound and its policies, counters, close and the read-back of a write
that raced it, the ``lost`` count. The tier scenarios (``tests/tier_scenarios.py``, round
4) run it between processes; CI runs this file with the compiled ring and, with
``PYDOTCOMPUTE_PUREPYTHON=1``, the pure-Python twin."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from pydotcompute.ring_kernels.tiers.process import edge as shm
from pydotcompute.ring_kernels.tiers.process.edge import EdgeReader, EdgeWriter, ShmEdge


@pytest.fixture
def make() -> Iterator[object]:
    made: list[tuple[ShmEdge, EdgeReader, EdgeWriter]] = []

    def build(capacity: int = 8, policy: str = "block") -> tuple[ShmEdge, EdgeReader, EdgeWriter]:
        edge = ShmEdge("a", "b", capacity=capacity, policy=policy, ring_bytes=1 << 12)
        reader = EdgeReader(edge.spec)
        writer = EdgeWriter(edge.spec, spin_s=0.0)
        made.append((edge, reader, writer))
        return edge, reader, writer

    yield build
    for edge, reader, writer in made:
        writer.detach()
        reader.detach()
        edge.close()
        edge.release()


def _balanced(edge: ShmEdge) -> dict[str, int]:
    c = edge.counters()
    assert c["accepted"] == c["taken"] + c["evicted"] + c["handed_back"] + c["depth"], c
    assert 0 <= c["depth"] <= c["capacity"], c
    return c


def test_not_live_until_the_consumer_looked(make: object) -> None:
    """Until the consumer marks the edge live a write is refused (the caller takes the
    loop path, which wakes the consumer): nothing waits in an edge nobody reads."""
    edge, reader, writer = make()  # type: ignore[operator]
    assert writer.put(b"x", 2) == [b"x"]
    reader.mark_live()
    assert writer.put(b"x", 2) is True
    assert reader.take() == b"x"
    assert _balanced(edge)["accepted"] == 1


def test_highest_band_first_fifo_within(make: object) -> None:
    edge, reader, writer = make()  # type: ignore[operator]
    reader.mark_live()
    for data, band in ((b"n1", 2), (b"low", 3), (b"n2", 2), (b"high", 1), (b"sys", 0)):
        assert writer.put(data, band) is True
    assert [reader.take() for _ in range(5)] == [b"sys", b"high", b"n1", b"n2", b"low"]
    assert reader.take() is None
    c = _balanced(edge)
    assert (c["accepted"], c["taken"], c["depth"]) == (5, 5, 0)


def test_band_of_reads_the_priority() -> None:
    class P:
        def __init__(self, priority: object) -> None:
            self.priority = priority

    assert [shm.band_of(P(p)) for p in (255, 224, 200, 160, 128, 64, 63, 0)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    assert shm.band_of(object()) == 2
    assert shm.band_of(P("high")) == 2


def test_block_waits_for_room_then_times_out(make: object) -> None:
    edge, reader, writer = make(capacity=3)  # type: ignore[operator]
    reader.mark_live()
    for i in range(3):
        assert writer.put(bytes([i]), 2) is True
    assert writer.put(b"late", 2, timeout=0.05) is False  # full: nothing written
    assert _balanced(edge)["depth"] == 3
    assert reader.take() == b"\x00"
    assert writer.put(b"late", 2, timeout=0.05) is True  # room again
    assert [reader.take() for _ in range(3)] == [b"\x01", b"\x02", b"late"]


def test_reject_counts_and_keeps_the_bound(make: object) -> None:
    edge, reader, writer = make(capacity=2, policy="reject")  # type: ignore[operator]
    reader.mark_live()
    assert [writer.put(bytes([i]), 2) for i in range(5)] == [True] * 5
    c = _balanced(edge)
    assert (c["accepted"], c["rejected"], c["depth"]) == (2, 3, 2)
    assert [reader.take() for _ in range(3)] == [b"\x00", b"\x01", None]


def test_drop_oldest_evicts_the_oldest_of_the_lowest_band(make: object) -> None:
    """The producer claims an eviction before it writes; the consumer performs it before
    its next take: the oldest record of the lowest band goes, and the bound holds."""
    edge, reader, writer = make(capacity=3, policy="drop_oldest")  # type: ignore[operator]
    reader.mark_live()
    for data, band in ((b"h", 1), (b"n1", 2), (b"n2", 2), (b"n3", 2), (b"n4", 2)):
        assert writer.put(data, band) is True
    c = _balanced(edge)
    assert (c["accepted"], c["evicted"], c["depth"]) == (5, 2, 3)
    assert [reader.take() for _ in range(4)] == [b"h", b"n3", b"n4", None]
    assert _balanced(edge)["taken"] == 3


def test_close_hands_back_once_and_refuses_later_writes(make: object) -> None:
    edge, reader, writer = make()  # type: ignore[operator]
    reader.mark_live()
    for data, band in ((b"n", 2), (b"l", 3), (b"h", 1)):
        writer.put(data, band)
    assert reader.take() == b"h"
    reader.detach()  # the consumer stopped
    assert edge.close() == [b"n", b"l"]  # highest band first
    assert edge.close() == []
    assert writer.put(b"after", 2) == [b"after"]  # the loop path
    assert not writer.usable
    c = _balanced(edge)
    assert (c["accepted"], c["taken"], c["handed_back"], c["depth"]) == (3, 1, 2, 0)


def test_a_write_racing_the_close_is_read_back(make: object) -> None:
    """The runtime's close and a producer's write in flight: the write published after
    the runtime read what was left. Simulated by a close that collected nothing (the
    runtime's steps without its read), then the producer's way out of that write: it
    finds the rings closed and reads back what nobody collected, for its loop path."""
    edge, reader, writer = make()  # type: ignore[operator]
    reader.mark_live()
    writer.put(b"one", 2)
    writer.put(b"two", 1)
    reader.detach()
    q = edge._q  # the runtime's side of the close, step by step (its internals)
    q[shm.H_CLOSED] = 1
    for ring in edge._rings:
        ring.set_reader_waiting(True)
        ring.close_reader()
    q[shm.H_COLLECTED] = 1
    assert writer._read_back() == [b"two", b"one"]  # highest band first
    assert writer.put(b"three", 2) == [b"three"]
    c = edge.counters()
    assert (c["accepted"], c["taken"], c["depth"]) == (0, 0, 0), c


def test_unfinished_and_lost(make: object) -> None:
    """A record taken and not finished (its consumer's process died holding it) is
    counted ``lost`` at close; finished ones are not."""
    edge, reader, writer = make()  # type: ignore[operator]
    reader.mark_live()
    for i in range(3):
        writer.put(bytes([i]), 2)
    reader.take()
    reader.finish()  # the actor asked for its next message
    reader.take()  # ... and died holding this one
    assert edge.unfinished() == 1
    reader.detach()
    assert edge.close(lost=edge.unfinished()) == [b"\x02"]
    c = _balanced(edge)
    assert (c["taken"], c["lost"], c["handed_back"]) == (2, 1, 1)


def test_a_closed_edge_cannot_be_attached(make: object) -> None:
    edge, reader, _writer = make()  # type: ignore[operator]
    reader.detach()
    edge.close()
    with pytest.raises(FileNotFoundError):
        EdgeWriter(edge.spec)
    assert not os.path.exists(edge.spec[1])  # the doorbells' names are gone too
