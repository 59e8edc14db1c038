"""The spread over a pool's replica edges (`pool_edges.Spread`) and the group of replica
edges (`pool_edges.EdgeGroup`), with stand-in ends."""

from __future__ import annotations

from typing import Any

import pytest

from pydotcompute.ring_kernels.pool_edges import (
    CLOSED,
    FULL,
    ROOM,
    WAITING,
    EdgeGroup,
    Spread,
)


class End:
    """A producer's end whose state the test sets; records what was put into it."""

    def __init__(self, state: int = ROOM) -> None:
        self.st = state
        self.got: list[Any] = []

    def state(self) -> int:
        return self.st

    def put(self, msg: Any, timeout: float | None = None) -> bool:
        self.got.append(msg)
        return True


def test_spread_goes_round_robin() -> None:
    ends = [End(), End(), End()]
    spread = Spread(ends, outbox=[])
    for i in range(7):
        assert spread.put(i)
    assert [e.got for e in ends] == [[0, 3, 6], [1, 4], [2, 5]]


def test_spread_skips_a_full_or_closed_end() -> None:
    ends = [End(), End(FULL), End(CLOSED)]
    spread = Spread(ends, outbox=[])
    for i in range(3):
        spread.put(i)
    assert [e.got for e in ends] == [[0, 1, 2], [], []]
    ends[1].st = ROOM
    spread.put(3)
    spread.put(4)
    assert [e.got for e in ends] == [[0, 1, 2, 4], [3], []]


def test_spread_does_not_skip_an_end_not_live_yet() -> None:
    """Its put takes the loop path, which wakes that replica."""
    ends = [End(), End(WAITING)]
    spread = Spread(ends, outbox=[])
    for i in range(4):
        spread.put(i)
    assert [e.got for e in ends] == [[0, 2], [1, 3]]


def test_all_full_puts_into_the_first_full_in_turn() -> None:
    """The consumer's policy then acts there (block waits, reject refuses)."""
    ends = [End(FULL), End(CLOSED), End(FULL)]
    spread = Spread(ends, outbox=[])
    spread.put("a")
    spread.put("b")
    assert [e.got for e in ends] == [["a"], [], ["b"]]


def test_all_closed_put_in_turn_takes_the_loop_path() -> None:
    ends = [End(CLOSED), End(CLOSED)]
    spread = Spread(ends, outbox=[])
    spread.put("a")
    spread.put("b")
    assert [e.got for e in ends] == [["a"], ["b"]]


def test_a_spread_needs_an_end() -> None:
    with pytest.raises(ValueError, match="at least one edge"):
        Spread([], outbox=[])


class Edge:
    def __init__(self, **c: int) -> None:
        self.c = c

    def counters(self) -> dict[str, int]:
        return dict(self.c)


def test_group_sums_counters_and_names_replica_edges() -> None:
    inner = EdgeGroup("objects", [Edge(accepted=1), Edge(accepted=2)], spread=True)
    group = EdgeGroup("objects", [inner, Edge(accepted=4, capacity=8)], spread=False)
    assert group.counters()["accepted"] == 7
    assert group.counters()["capacity"] == 8
    assert [(s, t) for s, t, _ in group.replica_edges("a", "b")] == [
        ("a[0]", "b[0]"),
        ("a[0]", "b[1]"),
        ("a[1]", "b"),
    ]
