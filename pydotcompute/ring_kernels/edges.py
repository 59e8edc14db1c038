"""The control plane's view of `connect` edges, and how an edge's kind is negotiated.

The data plane leaves the event loop where it can. The loop carries *control* (lifecycle,
supervision, the accounting ledger, metrics, ``connect``/``disconnect`` decisions); the
*data* between two off-loop kernels moves directly, from the producer's actor into the
consumer's input, without a hop through the parent's loop.

Edge kinds (`EdgeKind`):
- ``"loop"``: the default, and what any edge with an asyncio, Ray or pool end, a tracing
  runtime or a ``serialize=True`` kernel keeps: the producer's bridge collects the reply
  on the loop and accepts it into the consumer's banded inbox (runtime.py, hosted.py).
- ``"objects"``: thread -> thread, an in-process queue of objects, four priority bands,
  no serialization (`tiers/thread/edge.py`).
- ``"shm-ring"`` (process -> process, thread <-> process) and ``"device-ring"`` (GPU -> GPU
  on one device) are the kinds the design provides for; no tier offers them yet, so such
  edges are ``"loop"`` edges today.

Negotiation through the tier contract: a `TierWorker` declares ``EDGE_OUT`` (the kinds it
can produce into) and ``EDGE_IN`` (the kinds it can consume from). `EdgeTable.connect`
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
  ``rejected`` and ``handed_back`` in the edge itself, written by the two actors and read
  by the parent without the loop on the data path; ``accepted == taken + evicted +
  handed_back + depth`` always. `EdgeTable.fold` adds them to the kernels' telemetry when
  it is read (``runtime.get_telemetry``), and the metrics export them per edge.
- *Ordered shutdown*: ``forward_to`` stays set, so `supervision.stop_waves` stops sources
  first; a consumer's actor ends only once its inbox *and* its edges are drained; what is
  left in an edge when it stops is handed back once, as the consumer's ``undelivered``.
  An edge whose consumer stopped is closed: the producer's later sends take the loop path
  (counted there as refused downstream), so nothing lands in a dead edge.
- *Failure*: a consumer that fails hands back what its edges hold; a producer that fails
  leaves its edge readable. (Re-attaching a restarted actor is for tiers that restart:
  none that offers an edge does yet.)
- *Tracing*: a tracing runtime keeps loop edges for now (its spans ride beside each
  message on the loop path); a kind that carries trace context in its record header
  declares it and is picked under tracing.
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

from dataclasses import dataclass
from typing import Literal

__all__ = ("PREFERENCE", "EdgeInfo", "EdgeKind")

EdgeKind = Literal["loop", "objects", "shm-ring", "device-ring"]

#: Direct kinds in the order `connect` prefers them when both ends offer several.
PREFERENCE: tuple[EdgeKind, ...] = ("objects", "shm-ring", "device-ring")


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
            ``evicted``, ``rejected``, ``handed_back``, ``depth``, ``capacity``); empty
            for a loop edge, whose messages are counted by the two kernels' telemetry.
    """

    source: str
    target: str
    kind: EdgeKind
    why: str = ""
    counters: dict[str, int] | None = None
