"""Direct edges with a worker-pool end (`launch(..., replicas=N)`): one edge per replica.

A direct edge is single-producer single-consumer, so an edge with a pool end is a group of
ordinary edges of one kind, one per replica pair, and `EdgeGroup` is what the control plane
(`edges.EdgeTable`) keeps for it:

- *out of a pool* (``pool -> b``): the consumer opens one edge per producing replica
  (``"p[0]" -> "b"``, ``"p[1]" -> "b"``, ...) and each replica sends into its own; the
  consumer reads them by turns beside its inbox, as it reads any edges.
- *into a pool* (``a -> pool``): the pool opens one edge per consuming replica, each into
  that replica's actor, and the producer *spreads*: each message goes to the next replica's
  edge in turn (round robin), skipping a full one (`Spread`); when every replica's edge is
  full, the consumer's policy acts at the one in turn (``block`` waits for its room,
  ``reject`` and ``drop_oldest`` refuse or evict there, counted as the pool's drops).
- *pool to pool*: each producing replica spreads over its own group of edges, one into
  each consuming replica (N x M edges).

Every promise of a direct edge holds per replica edge (its counters, its four priority
bands, the hand-back when its replica stops), and a group's counters are the sums of its
edges', so `runtime.edges()`, telemetry and the metrics see one edge whose `EdgeInfo`
lists its ``replicas``.

Design notes:
- A replica edge whose consumer has not looked at its edges yet (not *live*) is not
  skipped: the message in turn takes the loop path, where the pool's bridge hands it to a
  replica and so wakes one blocked in a plain ``receive``; skipping it would leave that
  replica asleep and the spread one-sided. A closed replica edge (its replica ended) is
  skipped for good.
- Each edge into a pool's replica has the pool's ``input_queue_size`` divided among the
  replicas (rounded up), as the bridge divides its slots, so an edge into the pool as a
  whole holds about one pool's bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ("CLOSED", "FULL", "ROOM", "WAITING", "EdgeGroup", "Spread", "replica_name")

#: `state()` of a producer's end: room for a message now
ROOM = 0
#: full: a put applies the consumer's policy
FULL = 1
#: not live yet: a put takes the loop path (which wakes the consumer)
WAITING = 2
#: closed: its consumer stopped; a put takes the loop path
CLOSED = 3

_COUNTERS = ("accepted", "taken", "evicted", "rejected", "handed_back", "lost", "depth", "capacity")


def replica_name(kernel_id: str, index: int) -> str:
    """The name of replica ``index`` of pool ``kernel_id`` (as `replica_telemetry`)."""
    return f"{kernel_id}[{index}]"


class EdgeGroup:
    """The edges of one ``connect`` with a pool end, one per replica (see the module notes).

    Args:
        kind: The edges' kind (each part's).
        parts: One edge per replica (a part may be a group itself: pool to pool).
        spread: True for the edges into a pool's replicas (the producer spreads over
            them); False for those out of a pool's replicas (one per producing replica).
    """

    __slots__ = ("kind", "parts", "spread")

    def __init__(self, kind: str, parts: Sequence[Any], *, spread: bool) -> None:
        self.kind = kind
        self.parts = tuple(parts)
        self.spread = spread

    @property
    def closed(self) -> bool:
        """True once every part is closed."""
        return all(getattr(p, "closed", False) for p in self.parts)

    def counters(self) -> dict[str, int]:
        """The sums of the parts' counters (see `edges.EdgeInfo`)."""
        total = dict.fromkeys(_COUNTERS, 0)
        for part in self.parts:
            for key, value in part.counters().items():
                total[key] = total.get(key, 0) + int(value)
        return total

    def replica_edges(self, source: str, target: str) -> list[tuple[str, str, Any]]:
        """``(source, target, edge)`` for each single edge of the group, named by replica
        (``"p[1]"``)."""
        out: list[tuple[str, str, Any]] = []
        for i, part in enumerate(self.parts):
            src, dst = (
                (source, replica_name(target, i))
                if self.spread
                else (
                    replica_name(source, i),
                    target,
                )
            )
            if isinstance(part, EdgeGroup):
                out += part.replica_edges(src, dst)
            else:
                out.append((src, dst, part))
        return out

    def __repr__(self) -> str:
        way = "into" if self.spread else "out of"
        return f"<EdgeGroup {self.kind} {way} a pool, {len(self.parts)} edges>"


class Spread:
    """A producer's end of the edges into a pool's replicas: round robin, skipping a full
    one (see the module notes). Used by one producing thread, as each end is.

    Args:
        ends: The producer's end of each replica edge. Each offers ``put(msg, timeout)``
            (as a context's outbox does, taking the loop path itself when its edge cannot
            take the message) and ``state()`` (`ROOM`, `FULL`, `WAITING` or `CLOSED`).
        outbox: The producer's outbox (the loop path), for ``len``.
    """

    __slots__ = ("_ends", "_next", "outbox")

    def __init__(self, ends: Sequence[Any], outbox: Any) -> None:
        if not ends:
            raise ValueError("a spread needs at least one edge")
        self._ends = tuple(ends)
        self._next = 0
        self.outbox = outbox

    def put(self, msg: Any, timeout: float | None = None) -> bool:
        """Send ``msg`` into the next replica edge in turn that has room (or is not live
        yet, see the notes); when all are full, into the first full one in turn, where
        the consumer's policy acts; when all are closed, on the loop path."""
        return bool(self._pick().put(msg, timeout))

    def put_traced(
        self,
        msg: Any,
        timeout: float | None,
        ids: tuple[int, int, int],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """`put` in the trace context ``ids``, through the chosen end's ``put_traced``
        (an end of a thread-side producer offers it)."""
        return bool(self._pick().put_traced(msg, timeout, ids, received))

    def _pick(self) -> Any:
        """The end the next message goes into (see `put`), the turn moved past it."""
        ends = self._ends
        n = len(ends)
        start = self._next
        full = -1
        pick = -1
        for k in range(n):
            i = start + k
            if i >= n:
                i -= n
            state = ends[i].state()
            if state in (ROOM, WAITING):
                pick = i
                break
            if state == FULL and full < 0:
                full = i
        if pick < 0:
            pick = full if full >= 0 else start
        nxt = pick + 1
        self._next = 0 if nxt >= n else nxt
        return ends[pick]

    def __len__(self) -> int:
        return len(self.outbox)
