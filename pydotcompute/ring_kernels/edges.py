"""The control plane's view of `connect` edges, and how an edge's kind is negotiated.

The data plane leaves the event loop where it can. The loop carries *control* (lifecycle,
supervision, the accounting ledger, metrics, ``connect``/``disconnect`` decisions); the
*data* between two off-loop kernels moves directly, from the producer's actor into the
consumer's input, without a hop through the parent's loop.

Edge kinds (`EdgeKind`):
- ``"loop"``: the default, and what any edge with an asyncio or Ray end, a
  ``serialize=True`` kernel, or a pool end under a tracing runtime keeps: the producer's
  bridge collects the reply
  on the loop and accepts it into the consumer's banded inbox (runtime.py, hosted.py).
- ``"objects"``: thread -> thread, an in-process queue of objects, four priority bands,
  no serialization (`tiers/thread/edge.py`).
- ``"shm-ring"``: process -> process, a band ring per priority in shared memory, owned by
  the runtime's process (`tiers/process/edge.py`).
- ``"device-ring"``: GPU -> GPU on one device, a ring of fixed-layout records in device
  memory written by the producer's persistent kernel and polled by the consumer's
  (`tiers/gpu/edge.py`). A source worker may refine the pick with `TierWorker.edge_fit`
  ``(kind, target_worker)``: "" to accept, a reason to keep the loop path (kernels on two
  devices), or `TypeValidationError` to refuse the connect (records of another class).

An end may be a worker pool (thread or process tier): the edge is then an
`pool_edges.EdgeGroup` of one edge of the kind per replica, out of a pool one per producing
replica, into a pool one per consuming replica, which the producer spreads over (round
robin, skipping a full one). A pool's worker offers its members' kinds; into a pool, the
producer's tier must also declare it can spread over that kind (``edges_spread`` in its
`Capabilities`), else the edge stays on the loop.

Negotiation through the tier contract: a tier declares ``edges_out`` (the kinds it can
produce into) and ``edges_in`` (the kinds it can consume from) in its `Capabilities`
(``kernel.CAPABILITIES``; a pool's are its members'). `EdgeTable.connect`
picks the first kind of `PREFERENCE` both ends offer, else ``"loop"``; the consumer's
worker makes the edge (`TierWorker.open_edge`, its bound and policy are the consumer's) and
the producer's worker writes into it (`TierWorker.route_into`). The runtime keeps
``forward_to`` set either way, so ordered shutdown, the loop-path fallback and the
producer's replies still in its bridge behave as before.

How each promise holds on a direct edge:
- *Backpressure*: the edge has the consumer's ``input_queue_size`` and policy: ``block``
  blocks the producing actor's ``ctx.send``; ``reject`` and ``drop_oldest`` act at the
  edge and are counted as the consumer's drops (reason ``backpressure``).
- *Priority*: the edge keeps four bands and the consumer takes its highest band first, so
  a HIGH message overtakes every lower one queued on that edge. Between a consumer's
  inputs (its runtime inbox, fed by the bridge, and each edge) the actor takes turns: a
  message waits behind at most one message of each other input per turn, plus what the
  bridge already handed over (``bridge_queue_size``, as on the loop path).
- *Accounting*: each edge counts ``accepted``, ``taken``, ``evicted`` (drop_oldest),
  ``rejected``, ``handed_back`` and ``lost`` in the edge itself, written by the two actors and read
  by the parent without the loop on the data path; ``accepted == taken + evicted +
  handed_back + depth`` always. `EdgeTable.fold` adds them to the kernels' telemetry when
  it is read (``runtime.get_telemetry``), and the metrics export them per edge.
- *Ordered shutdown*: ``forward_to`` stays set, so `supervision.stop_waves` stops sources
  first; a consumer's actor ends only once its inbox *and* its edges are drained; what is
  left in an edge when it stops is handed back once, as the consumer's ``undelivered``.
  An edge whose consumer stopped is closed: the producer's later sends take the loop path
  (counted there as refused downstream), so nothing lands in a dead edge.
- *Failure*: a consumer that fails hands back what its edges hold (a ``shm-ring``'s
  segments belong to the runtime's process, so they outlive a crashed child; the record
  its actor held when the process died is counted ``lost``); a producer that fails leaves
  its edge readable. (Re-attaching a restarted actor is for tiers that restart: none that
  offers an edge does yet.)
- *Tracing*: a kind in `TRACED_KINDS` carries each message's trace context in its record
  header (``shm-ring``: the process tier's ``0xC1 'T'`` frame; ``objects``: the ids
  beside the message, in the consumer's `TraceCarrier`), so a tracing runtime keeps it
  direct; the consumer's actor makes that context current, and a thread consumer records
  the message's ``process`` span itself (the runtime's bridge never sees it).
- *Instruments*: a runtime with other instruments keeps loop edges: a direct edge's
  messages pass none of the hooks, so its instruments would miss them.
- *Disconnect and re-connect*: ``disconnect`` routes the producer back to its outbox; the
  edge stays attached to the consumer, which still drains it, so each message ends exactly
  once across the switch. Connecting the same pair again reuses that edge.

Design notes:
- The producer falls back to the loop path (its outbox) until the consumer's actor has
  looked at the edge once: an actor blocked in a plain ``receive`` is woken by that
  loop-path message and reads its edges from then on, so no wake-up channel into a
  blocked thread is needed and no message waits on an edge nobody reads.
- Counters are folded into telemetry when telemetry is read, not per message, and the
  folding is by difference from the last fold, so no counter is shared between threads
  for writing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from ..exceptions import TypeValidationError
from .pool_edges import EdgeGroup, replica_name

__all__ = ("PREFERENCE", "TRACED_KINDS", "EdgeInfo", "EdgeKind", "EdgeTable", "negotiate")

logger = logging.getLogger("pydotcompute")

EdgeKind = Literal["loop", "objects", "shm-ring", "device-ring"]

#: Direct kinds in the order `connect` prefers them when both ends offer several.
PREFERENCE: tuple[EdgeKind, ...] = ("objects", "shm-ring", "device-ring")
#: Direct kinds whose records carry trace context: the ones a tracing runtime may pick.
TRACED_KINDS: frozenset[str] = frozenset({"objects", "shm-ring"})


@dataclass(frozen=True)
class EdgeInfo:
    """One ``connect`` edge as ``runtime.edges()`` reports it.

    Attributes:
        source: The producing kernel's id.
        target: The consuming kernel's id.
        kind: How its messages move (`EdgeKind`): ``"loop"`` through the runtime's event
            loop, anything else directly between the two actors.
        why: For a ``"loop"`` edge, why no direct kind was picked (empty for direct ones).
        counters: The edge's own counters for a direct edge (``accepted``, ``taken``,
            ``evicted``, ``rejected``, ``handed_back``, ``lost``, ``depth``,
            ``capacity``); None for a loop edge, whose messages are counted by the two
            kernels' telemetry. For an edge with a pool end, the sums of its replica
            edges'.
        replicas: For a direct edge with a pool end (`pool_edges.py`), one `EdgeInfo`
            per replica edge, named by replica (``"p[0]" -> "b"`` out of a pool,
            ``"a" -> "p[0]"`` into one), each with its own counters; empty otherwise.
    """

    source: str
    target: str
    kind: EdgeKind
    why: str = ""
    counters: dict[str, int] | None = None
    replicas: tuple[EdgeInfo, ...] = ()


@dataclass
class _Entry:
    """What the table knows of one source's current ``connect``."""

    source: Any
    target: Any
    kind: EdgeKind
    why: str
    edge: Any = None  # the direct edge (a tier's object), None for a loop edge


class _Folded:
    """How much of a direct edge's counters is already in the kernels' telemetry."""

    __slots__ = ("dropped", "lost", "processed", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.processed = 0
        self.dropped = 0
        self.lost = 0


class EdgeTable:
    """The runtime's record of its ``connect`` edges: which kind each one got, the direct
    edges it made (kept while their consumer may still drain them), and the folding of
    their counters into telemetry. The runtime holds one; every method runs on its loop.
    """

    __slots__ = ("_current", "_direct", "_folded")

    def __init__(self) -> None:
        self._current: dict[Any, _Entry] = {}  # source kernel -> its edge now
        # (source, target) -> direct edge: kept after a disconnect (the consumer drains
        # it) and reused by a re-connect of the same pair
        self._direct: dict[tuple[Any, Any], Any] = {}
        self._folded: dict[int, _Folded] = {}  # id(edge) -> what fold already added

    def connect(
        self,
        source: Any,
        target: Any,
        *,
        tracing: bool,
        instrumented: bool = False,
        direct: bool = True,
    ) -> EdgeInfo:
        """Record that ``source`` now forwards into ``target`` (the runtime already
        called ``source.forward_to(target)``) and make the edge direct when both ends
        offer a kind (see the module notes). Returns what ``runtime.edges()`` shows."""
        self.disconnect(source)
        try:
            kind, why = negotiate(source, target, tracing=tracing, instrumented=instrumented)
        except TypeValidationError:  # the direct kind refuses the pair (`check` raised it)
            if direct:
                raise
            kind, why = "loop", "connected with direct=False"
        if not direct and kind != "loop":
            kind, why = "loop", "connected with direct=False"
        entry = _Entry(source, target, kind, why)
        if kind != "loop":
            edge = self._direct.get((source, target))
            try:
                if edge is None:
                    edge = _open(source, target, kind)
                    self._direct[(source, target)] = edge
                source.worker.route_into(edge)
            except Exception as exc:  # a tier that cannot after all: the loop path
                logger.warning(
                    "connect %r -> %r: the %s edge could not be made (%r); using the loop",
                    source.kernel_id,
                    target.kernel_id,
                    kind,
                    exc,
                )
                entry = _Entry(source, target, "loop", f"the {kind} edge failed: {exc!r}")
            else:
                entry.edge = edge
        self._current[source] = entry
        return self._info(entry)

    def check(
        self,
        source: Any,
        target: Any,
        *,
        tracing: bool,
        instrumented: bool = False,
        direct: bool = True,
    ) -> None:
        """Raise before anything changes when the direct kind ``connect`` would pick
        refuses the pair (a source worker's ``edge_fit``).

        Raises:
            TypeValidationError: e.g. a ``device-ring`` edge between different classes.
        """
        if direct:
            negotiate(source, target, tracing=tracing, instrumented=instrumented)

    def disconnect(self, source: Any) -> None:
        """``source`` no longer forwards over its edge: a direct one routes the producer
        back to its outbox (the consumer still drains what the edge holds)."""
        entry = self._current.pop(source, None)
        if entry is not None and entry.edge is not None:
            source.worker.route_into(None)

    def edges(self, kernels: Any) -> list[EdgeInfo]:
        """One `EdgeInfo` per kernel of ``kernels`` that forwards somewhere."""
        out: list[EdgeInfo] = []
        for kernel in list(kernels):
            target = kernel.forwards_to
            if target is None:
                continue
            entry = self._current.get(kernel)
            if entry is None or entry.target is not target:
                entry = _Entry(kernel, target, "loop", "forwarding set outside runtime.connect")
            out.append(self._info(entry))
        return out

    @staticmethod
    def _info(entry: _Entry) -> EdgeInfo:
        edge = entry.edge
        counters = None if edge is None else dict(edge.counters())
        source, target = entry.source.kernel_id, entry.target.kernel_id
        replicas: tuple[EdgeInfo, ...] = ()
        if isinstance(edge, EdgeGroup):
            replicas = tuple(
                EdgeInfo(src, dst, entry.kind, "", dict(part.counters()))
                for src, dst, part in edge.replica_edges(source, target)
            )
        return EdgeInfo(source, target, entry.kind, entry.why, counters, replicas)

    def fold(self, kernel: Any, tel: Any, *, timed: bool) -> None:
        """Add the direct edges' counters to ``kernel``'s telemetry ``tel`` (as
        ``runtime.get_counters`` reads it): ``messages_sent`` of a producer,
        ``messages_received`` (in full: the runtime sets it afresh each read),
        ``messages_processed`` and backpressure drops of a consumer. Differences since the
        last fold are added, so each message is counted once."""
        for (source, target), edge in self._direct.items():
            if kernel is not source and kernel is not target:
                continue
            c = edge.counters()
            done = self._folded.setdefault(id(edge), _Folded())
            if kernel is source:
                sent = c["accepted"] + c["rejected"]
                if timed:
                    tel.messages_sent += sent - done.sent
                done.sent = sent
            if kernel is target:
                tel.messages_received += c["accepted"]
                processed = c["accepted"] - c["evicted"]
                if timed:
                    tel.messages_processed += processed - done.processed
                done.processed = processed
                dropped = c["evicted"] + c["rejected"]
                if dropped > done.dropped:
                    tel.record_drop(dropped - done.dropped, "backpressure")
                done.dropped = dropped
                lost = c.get("lost", 0)  # taken by a consumer whose process died
                if lost > done.lost:
                    tel.record_drop(lost - done.lost, "lost")
                done.lost = lost

    def fold_replicas(self, kernel: Any, tels: list[Any], *, timed: bool) -> None:
        """Add the replica edges' counters of the direct edges with a pool end at
        ``kernel`` to its per-replica records ``tels`` (made afresh by each read, so the
        figures are added whole): ``messages_received`` and ``messages_processed`` of
        each consuming replica, ``messages_sent`` of each producing one. Their sums are
        what `fold` adds to the pool's own record."""
        for (source, target), edge in self._direct.items():
            if not isinstance(edge, EdgeGroup):
                continue
            into = kernel is target and edge.spread
            out_of = kernel is source and not edge.spread
            if not (into or out_of):
                continue
            for i, part in enumerate(edge.parts[: len(tels)]):
                c = part.counters()
                tel = tels[i]
                if into:
                    tel.messages_received += c["accepted"]
                    if timed:
                        tel.messages_processed += c["accepted"] - c["evicted"]
                elif timed:
                    tel.messages_sent += c["accepted"] + c["rejected"]

    def forget(self, kernel: Any) -> None:
        """Drop what the table keeps for ``kernel`` (removed from the runtime)."""
        self._current.pop(kernel, None)
        for pair in [p for p in self._direct if kernel in p]:
            self._folded.pop(id(self._direct.pop(pair)), None)


def _open(source: Any, target: Any, kind: str) -> Any:
    """The consumer's worker makes the edge; out of a pool (a source worker with
    `TierWorker.edge_replicas`), one per producing replica, as an `EdgeGroup`."""
    replicas = source.worker.edge_replicas
    if replicas <= 0:
        return target.worker.open_edge(kind, source.kernel_id)
    parts = [
        target.worker.open_edge(kind, replica_name(source.kernel_id, i)) for i in range(replicas)
    ]
    return EdgeGroup(kind, parts, spread=False)


def negotiate(
    source: Any, target: Any, *, tracing: bool, instrumented: bool = False
) -> tuple[EdgeKind, str]:
    """The kind of a ``source -> target`` edge, and why it is ``"loop"`` when it is: the
    first kind of `PREFERENCE` that the source's tier produces into (its capabilities'
    ``edges_out``) and the target's consumes from (``edges_in``); under ``tracing`` only
    `TRACED_KINDS`, and none with a pool end; with other ``instrumented`` hooks none."""
    if instrumented:  # a direct edge's messages pass no hook: the instruments see them all
        return "loop", "an instrumented runtime keeps loop edges (its hooks would miss them)"
    for kernel, role in ((source, "source"), (target, "target")):
        if kernel.worker is None:
            tier = kernel.config.tier
            return "loop", f"the {role} {kernel.kernel_id!r} runs on the {tier} tier (no worker)"
        if kernel.config.serialize:
            return "loop", f"the {role} {kernel.kernel_id!r} serializes its messages"
    offered = source.CAPABILITIES.edges_out
    taken = target.CAPABILITIES.edges_in
    pool_in = target.worker.edge_replicas > 0
    pool_out = source.worker.edge_replicas > 0
    spreads = source.CAPABILITIES.edges_spread
    for kind in PREFERENCE:
        if kind in offered and kind in taken:
            if tracing and kind not in TRACED_KINDS:
                return "loop", f"a {kind} edge carries no trace context (a tracing runtime)"
            if tracing and (pool_in or pool_out):
                return "loop", "a tracing runtime keeps an edge with a pool end on the loop"
            if pool_in and kind not in spreads:
                return "loop", (
                    f"the source {source.kernel_id!r} ({source.config.tier} tier) cannot "
                    f"spread {kind} messages over the replicas of the pool "
                    f"{target.kernel_id!r}"
                )
            why = source.worker.edge_fit(kind, target.worker)
            return (kind, "") if not why else ("loop", why)
    return "loop", (
        f"no direct kind both ends offer ({source.config.tier} produces into "
        f"{sorted(offered) or 'none'}, {target.config.tier} consumes from "
        f"{sorted(taken) or 'none'})"
    )
