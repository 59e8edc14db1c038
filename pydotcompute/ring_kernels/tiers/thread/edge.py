"""The thread tier's direct edges (kind ``"objects"``): thread -> thread without the loop.

`ObjectEdge` is one edge: an in-process queue of objects in four priority bands, written
by the producing actor's thread (``ctx.send``) and read by the consuming actor's thread
(``ctx.receive``), with the consumer's bound and backpressure policy and its own counters.
`EdgeInputs` is what a consumer with edges reads: its worker's inbox (fed by the
runtime's bridge) and each incoming edge, by turns, each edge highest band first.
`EdgeOutput` is what a producer routed into an edge sends through. `EdgeEnds` ties them
to one `HostedThreadWorker`. The control plane (`ring_kernels/edges.py`) decides when.
A ``shm-ring`` edge to or from a process actor is read and written here too, through the
ends the process tier provides by name (`tiers.edge_provider`); `EdgeInputs` reads them
like an `ObjectEdge` and announces its sleep to them (``arm``). While the kernel is
deactivated (`EdgeEnds.pause`) its actor takes nothing from its edges.

Design notes:
- One lock per edge, taken by the producer's ``put`` and by ``close``: a put either lands
  before the close (and is handed back by it) or sees the edge closed and takes the loop
  path; nothing is ever left in a closed edge. The consumer takes without the lock
  (``deque.popleft`` is atomic under the GIL); ``drop_oldest``'s eviction races it the same
  way, and whichever side pops a message owns it.
- The counters are plain integers, each written by one side (``accepted``, ``evicted``,
  ``rejected`` by the producer under the lock; ``taken`` by the consumer; ``handed_back``
  by ``close``), so the parent reads them from any thread and ``depth`` is their balance.
- Waking: the consumer announces it waits (``EdgeInputs.waiting``) and then looks at its
  inputs again; a producer appends and then reads the flag (Dekker's argument under the
  GIL, as `SPSCQueue` parks). The worker's inbox rings the same bell through a burst
  waker. A blocked producer parks the same way on ``ObjectEdge``'s own flag.
- A consumer reads its plain inbox until its first edge is opened; then its context reads
  an `EdgeInputs` from the next ``receive`` on. An edge is *live* once the consumer's
  `EdgeInputs` has seen it; before that the producer's sends take the loop path (see
  `ring_kernels/edges.py`), so a consumer blocked in a plain ``receive`` is woken by them.
- Trace context (a tracing runtime only): an edge into a traced actor holds its
  `TraceCarrier` (``carrier``), and a traced producer's `EdgeOutput.put_traced` puts the
  ids there before the object goes in, as the traced bridge does for the inbox. The
  untraced ``put`` and ``take`` do not look at it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ....exceptions import QueueClosedError
from ...pool_edges import CLOSED, FULL, ROOM, WAITING, EdgeGroup, Spread
from .. import edge_provider
from .context import ThreadedKernelContext, wrong_type
from .sync_queue import SPSCQueue, SyncQueue

__all__ = ("KIND", "EdgeEnds", "EdgeInputs", "EdgeOutput", "ObjectEdge")

#: the edge kind this module provides (`ring_kernels.edges.EdgeKind`)
KIND = "objects"
#: the kind a process actor's edges have: one to or from a thread actor is read or
#: written here, in-process (`edge_provider` makes its ends)
SHM_KIND = "shm-ring"
_monotonic = time.monotonic
_POLICIES = ("block", "reject", "drop_oldest")


def _band(msg: Any) -> int:
    """0 (SYSTEM) .. 3 (LOW) from ``msg.priority``; NORMAL for anything without one."""
    p = getattr(msg, "priority", 128)
    if type(p) is not int:
        return 2
    return 0 if p >= 224 else 1 if p >= 160 else 2 if p >= 64 else 3


class _Bell:
    """A flag and a lock used as a saturating binary semaphore: one thread sleeps on it,
    any thread rings it."""

    __slots__ = ("signal", "waiting")

    def __init__(self) -> None:
        self.waiting = False
        self.signal = threading.Lock()
        self.signal.acquire()

    def ring(self) -> None:
        if self.waiting:
            self.waiting = False
            try:
                self.signal.release()
            except RuntimeError:
                pass  # already released: a wake-up is pending

    def sleep(self, remaining: float) -> None:
        self.signal.acquire(True, remaining)
        self.waiting = False


class ObjectEdge:
    """One thread -> thread edge: four priority bands of objects, bounded.

    Args:
        name: For errors and ``repr`` (``"edge 'a' -> 'b'"``).
        capacity: The consumer's ``input_queue_size``.
        policy: The consumer's backpressure: ``block``, ``reject`` or ``drop_oldest``.
        input_type: The consumer's ``input_type`` (None: any).
        consumer: The bell of the consumer's `EdgeInputs`.
    """

    kind = KIND

    __slots__ = (
        "_bands",
        "_closed",
        "_lock",
        "_space",
        "accepted",
        "capacity",
        "carrier",
        "consumer",
        "evicted",
        "handed_back",
        "input_type",
        "live",
        "name",
        "policy",
        "rejected",
        "taken",
    )

    def __init__(
        self, name: str, capacity: int, policy: str, input_type: type | None, consumer: _Bell
    ) -> None:
        self.name = name
        self.capacity = max(1, int(capacity))
        self.policy = policy if policy in _POLICIES else "block"
        self.input_type = input_type
        self.consumer = consumer
        #: the consumer's `TraceCarrier` under a tracing runtime (None: untraced)
        self.carrier: Any = None
        self._bands: tuple[deque[Any], ...] = (deque(), deque(), deque(), deque())
        self._lock = threading.Lock()
        self._space = _Bell()  # the producer waits here for room (``block``)
        self._closed = False
        #: the consumer's `EdgeInputs` has seen this edge: puts may land in it
        self.live = False
        self.accepted = 0
        self.taken = 0
        self.evicted = 0
        self.rejected = 0
        self.handed_back = 0

    def __len__(self) -> int:
        return self.accepted - self.taken - self.evicted - self.handed_back

    @property
    def closed(self) -> bool:
        """True once the consumer stopped: puts take the loop path."""
        return self._closed

    def counters(self) -> dict[str, int]:
        """The edge's counters, read from any thread (see `edges.EdgeInfo`)."""
        return {
            "accepted": self.accepted,
            "taken": self.taken,
            "evicted": self.evicted,
            "rejected": self.rejected,
            "handed_back": self.handed_back,
            "lost": 0,  # a thread consumer never loses the message it holds
            "depth": len(self),
            "capacity": self.capacity,
        }

    # -- producer -----------------------------------------------------------------------

    def put(self, msg: Any, timeout: float | None = None) -> bool | None:
        """Queue ``msg`` under the consumer's policy (the producer's thread).

        Returns:
            True: queued, or refused and counted (``reject``); False: ``block`` and
            ``timeout`` passed with the edge full (nothing queued); None: the edge is not
            live or is closed, nothing done: the caller takes the loop path.
        """
        band = _band(msg)
        deadline: float | None = None
        while True:
            with self._lock:
                if self._closed or not self.live:
                    return None
                if len(self) < self.capacity:
                    self._bands[band].append(msg)
                    self.accepted += 1
                    break
                policy = self.policy
                if policy == "reject":
                    self.rejected += 1
                    return True
                if policy == "drop_oldest" and self._evict():
                    self._bands[band].append(msg)
                    self.accepted += 1
                    break
            # block (or an eviction that lost every race to the consumer): wait for room
            if timeout is not None:
                if deadline is None:
                    deadline = _monotonic() + timeout
                remaining = deadline - _monotonic()
                if remaining <= 0:
                    return False
            else:
                remaining = -1.0
            space = self._space
            space.waiting = True
            if len(self) < self.capacity or self._closed:  # looked at again
                space.waiting = False
                continue
            space.sleep(remaining)
        self.consumer.ring()
        return True

    def _evict(self) -> bool:
        """Drop the oldest message of the lowest band (under the lock; the consumer may
        take it first, then the next is tried)."""
        for d in reversed(self._bands):
            while d:
                try:
                    gone = d.popleft()
                except IndexError:
                    break
                self.evicted += 1
                if self.carrier is not None:  # (traced) its context goes with it
                    self.carrier.forget(gone)
                return True
        return False

    # -- consumer -----------------------------------------------------------------------

    def take(self) -> Any:
        """The oldest message of the highest band, or None (the consumer's thread)."""
        for d in self._bands:
            if d:
                try:
                    msg = d.popleft()
                except IndexError:  # evicted meanwhile
                    continue
                self.taken += 1
                self._space.ring()
                return msg
        return None

    def arm(self, waiting: bool) -> None:
        """Nothing to announce: a put rings the consumer's bell itself."""

    def close(self) -> list[Any]:
        """Refuse further puts (they take the loop path) and return what is left, highest
        band first, each once (counted ``handed_back``)."""
        with self._lock:
            self._closed = True
            left: list[Any] = []
            for d in self._bands:
                while d:
                    try:
                        left.append(d.popleft())
                    except IndexError:
                        break
            self.handed_back += len(left)
        self._space.ring()
        return left

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<ObjectEdge {self.name} {len(self)}/{self.capacity}{state}>"


class EdgeInputs:
    """What a consumer with edges reads: its worker's inbox and its edges, by turns.

    Offers what `ThreadedKernelContext` asks of its inbox (``get``, ``len``, truth).
    """

    __slots__ = ("_bell", "_edges", "_inbox", "_seen", "_turn", "paused")

    def __init__(self, inbox: SPSCQueue[Any] | SyncQueue[Any]) -> None:
        self._inbox = inbox
        self._edges: tuple[Any, ...] = ()  # `ObjectEdge`s and `shm_edge.ShmInput`s
        self._seen: tuple[Any, ...] = ()
        self._turn = 0
        self._bell = _Bell()
        #: the kernel is deactivated: its edges are not read (its inbox is held back by
        #: the runtime's bridge)
        self.paused = False
        inbox.add_burst_waker(self._bell.ring)

    @property
    def bell(self) -> _Bell:
        """What an edge rings after a put."""
        return self._bell

    @property
    def edges(self) -> tuple[Any, ...]:
        """The incoming edges (kept until the consumer stops)."""
        return self._edges

    def pause(self, paused: bool) -> None:
        """Stop (or resume) taking from the edges; a resumed consumer looks again."""
        self.paused = paused
        if not paused:
            self._bell.waiting = True
            self._bell.ring()

    def add(self, edge: Any) -> None:
        """Read ``edge`` too, from the consumer's next look on (any thread)."""
        self._edges = (*self._edges, edge)
        self._bell.waiting = True  # a consumer asleep now wakes and sees it
        self._bell.ring()

    def mark_live(self) -> None:
        """Let puts land in every edge now (the consumer reads them from its next look)."""
        edges = self._edges
        for e in edges:
            e.live = True
        self._seen = edges

    def __len__(self) -> int:
        return len(self._inbox) + sum(len(e) for e in self._edges)

    def __bool__(self) -> bool:
        return len(self) > 0

    def _poll(self, settle: bool = True) -> Any:
        """One message by turns (None: none now). Raises the inbox's closed error when it
        is closed and drained and every edge is empty. Without ``settle`` an empty inbox
        is skipped, not asked (asking arms its wake-up and looks for its close: the look
        before sleeping does both)."""
        edges = self._edges
        if edges is not self._seen:
            self.mark_live()
        if self.paused:
            edges = ()
        n = len(edges) + 1
        turn = self._turn
        closed: BaseException | None = None
        inbox = self._inbox
        for i in range(n):
            at = (turn + i) % n
            if at == 0:
                if not settle and not len(inbox):
                    continue
                try:
                    msg = inbox.get(0)
                except QueueClosedError as exc:
                    closed = exc
                    continue
                except BaseException as exc:  # a failure reason given to shutdown
                    closed = exc
                    continue
            else:
                msg = edges[at - 1].take()
            if msg is not None:
                self._turn = (at + 1) % n
                return msg
        if closed is not None and not any(len(e) for e in self._edges):
            raise closed
        return None

    def get(self, timeout: float | None = None) -> Any:
        """The next message, waiting up to ``timeout`` seconds (None: until one comes).

        Raises:
            QueueClosedError: the inbox is shut down and drained and every edge is empty.
        """
        msg = self._poll(settle=False)
        if msg is not None:
            return msg
        if timeout == 0:
            return self._poll()
        deadline = None if timeout is None else _monotonic() + timeout
        bell = self._bell
        while True:
            bell.waiting = True
            edges = self._edges
            for e in edges:  # a shared-memory edge's producer rings only if announced
                e.arm(True)
            try:
                msg = self._poll()  # looked at again after announcing
                if msg is not None:
                    bell.waiting = False
                    return msg
                if deadline is None:
                    remaining = -1.0
                else:
                    remaining = deadline - _monotonic()
                    if remaining <= 0:
                        bell.waiting = False
                        return None
                bell.sleep(remaining)
            finally:
                for e in edges:
                    e.arm(False)

    def close(self) -> list[Any]:
        """Close every edge; what they held, each once (the consumer stopped)."""
        out: list[Any] = []
        for e in self._edges:
            out += e.close()
        return out


class EdgeOutput:
    """What a producer routed into an edge sends through (its context's outbox): the edge,
    and the worker's outbox (the loop path) when the edge cannot take a message."""

    __slots__ = ("edge", "outbox")

    def __init__(self, edge: ObjectEdge, outbox: SPSCQueue[Any] | SyncQueue[Any]) -> None:
        self.edge = edge
        self.outbox = outbox

    def put(self, msg: Any, timeout: float | None = None) -> bool:
        edge = self.edge
        in_t = edge.input_type
        if in_t is not None and not isinstance(msg, in_t):
            raise wrong_type(edge.name, msg, in_t, "expects")
        done = edge.put(msg, timeout)
        if done is None:
            return self.outbox.put(msg, timeout)
        return done

    def put_traced(
        self,
        msg: Any,
        timeout: float | None,
        ids: tuple[int, int, int],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """`put` in the trace context ``ids``: it goes beside ``msg`` into the consumer's
        carrier, or, when ``msg`` takes the loop path, to ``received`` (the runtime)."""
        edge = self.edge
        in_t = edge.input_type
        if in_t is not None and not isinstance(msg, in_t):
            raise wrong_type(edge.name, msg, in_t, "expects")
        carrier = edge.carrier
        if carrier is not None:
            carrier.carry(msg, ids, True)  # before the consumer can take it
        done = edge.put(msg, timeout)
        if done is None:
            if carrier is not None:
                carrier.forget(msg)
            received(msg, *ids)
            return bool(self.outbox.put(msg, timeout))
        if not done and carrier is not None:
            carrier.forget(msg)
        return done

    def state(self) -> int:
        """What a put would find now (`pool_edges.ROOM`, ``FULL``, ``WAITING``,
        ``CLOSED``): how a `pool_edges.Spread` picks among a pool's replica edges."""
        edge = self.edge
        if edge.closed:
            return CLOSED
        if not edge.live:
            return WAITING
        return ROOM if len(edge) < edge.capacity else FULL

    def __len__(self) -> int:
        return len(self.outbox)


class EdgeEnds:
    """A `HostedThreadWorker`'s direct edges: those into it (read by its actor) and the
    one it sends into.

    Args:
        kernel_id: The worker's kernel.
        inbox: The worker's inbox (read beside the edges).
        outbox: The worker's outbox (the loop path).
        capacity: Each incoming edge's bound (the kernel's ``input_queue_size``).
        policy: Its backpressure policy.
        input_type: What the kernel accepts.
    """

    __slots__ = (
        "_capacity",
        "_carrier",
        "_ctx",
        "_inbox",
        "_input_type",
        "_inputs",
        "_kernel_id",
        "_left",
        "_lock",
        "_outbox",
        "_output",
        "_output_type",
        "_paused",
        "_policy",
    )

    def __init__(
        self,
        kernel_id: str,
        inbox: SPSCQueue[Any] | SyncQueue[Any],
        outbox: SPSCQueue[Any] | SyncQueue[Any],
        *,
        capacity: int,
        policy: str,
        input_type: type | None,
        output_type: type | None = None,
    ) -> None:
        self._kernel_id = kernel_id
        self._outbox = outbox
        self._output_type = output_type
        self._paused = False
        self._capacity = capacity
        self._policy = policy
        self._input_type = input_type
        self._inputs: EdgeInputs | None = None
        self._output: Any = None  # an `EdgeOutput`, or a shared-memory edge's end
        self._ctx: ThreadedKernelContext | None = None
        self._lock = threading.Lock()  # the loop routes while the actor thread starts
        self._inbox = inbox
        self._left: list[Any] = []  # closed edges' leftovers not yet taken
        self._carrier: Any = None  # the actor's `TraceCarrier` (a tracing runtime)

    def trace_into(self, carrier: Any) -> None:
        """Have the edges into this actor carry trace context to ``carrier`` (a tracing
        runtime, before any edge is opened)."""
        self._carrier = carrier

    def adopt(self, ctx: ThreadedKernelContext) -> None:
        """The actor's context, on its thread before the actor runs: routes set before
        the start apply now."""
        with self._lock:
            self._ctx = ctx
            if self._inputs is not None:
                ctx.read_from(self._inputs)
                # its first receive reads the edges: they are live from the start
                self._inputs.mark_live()
            if self._output is not None:
                ctx.send_into(self._output)

    def open(self, source_id: str, kind: str = KIND) -> Any:
        """A new edge of ``kind`` (``objects`` or ``shm-ring``) into this worker from
        ``source_id``."""
        with self._lock:
            inputs = self._inputs
            if inputs is None:
                inputs = self._inputs = EdgeInputs(self._inbox)
                inputs.paused = self._paused
            edge: Any
            if kind == SHM_KIND:
                edge, end = edge_provider(kind).make_input(
                    source_id,
                    self._kernel_id,
                    capacity=self._capacity,
                    policy=self._policy,
                    ring=inputs.bell.ring,
                    carrier=self._carrier,
                )
                inputs.add(end)
            else:
                edge = ObjectEdge(
                    f"edge {source_id!r} -> {self._kernel_id!r}",
                    self._capacity,
                    self._policy,
                    self._input_type,
                    inputs.bell,
                )
                edge.carrier = self._carrier
                inputs.add(edge)
            if self._ctx is not None:
                self._ctx.read_from(inputs)
        return edge

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading the incoming edges (the kernel is deactivated)."""
        with self._lock:
            self._paused = paused
            if self._inputs is not None:
                self._inputs.pause(paused)

    def route(self, edge: Any) -> None:
        """Send into ``edge`` (an `ObjectEdge`, a ``shm-ring`` edge, or the group of
        edges into a pool's replicas, spread over; None: the outbox again)."""
        with self._lock:
            if isinstance(edge, EdgeGroup):  # into a pool: one edge per replica
                self._output = Spread([self._end(p) for p in edge.parts], self._outbox)
            else:
                self._output = None if edge is None else self._end(edge)
            ctx = self._ctx
            if ctx is not None:
                ctx.send_into(self._outbox if self._output is None else self._output)

    def _end(self, edge: Any) -> Any:
        """This producer's end of one edge (an `ObjectEdge` or a ``shm-ring`` edge)."""
        if edge.kind == SHM_KIND:
            return edge_provider(SHM_KIND).make_output(
                edge, self._outbox, self._kernel_id, self._output_type
            )
        return EdgeOutput(edge, self._outbox)

    def share_bound(self, replicas: int) -> None:
        """This worker is one of ``replicas`` of a pool: each edge into it holds its share
        of the pool's bound (rounded up), as the bridge shares its slots."""
        self._capacity = max(1, -(-self._capacity // max(1, replicas)))

    @property
    def queued(self) -> int:
        """Messages waiting in the incoming edges."""
        inputs = self._inputs
        return 0 if inputs is None else sum(len(e) for e in inputs.edges)

    @property
    def routed_in(self) -> bool:
        """True when any edge comes into this worker."""
        inputs = self._inputs
        return inputs is not None and bool(inputs.edges)

    def close(self) -> None:
        """Close the incoming edges (the actor stopped, or its grace period ran out);
        `take_left` returns what they held."""
        inputs = self._inputs
        if inputs is not None:
            left = inputs.close()
            carrier = self._carrier
            if carrier is not None:  # (traced) handed back: their contexts are let go
                for msg in left:
                    carrier.forget(msg)
            self._left += left

    def take_left(self) -> list[Any]:
        """What closing the edges left, each message once (closing them first)."""
        self.close()
        left: list[Any] = self._left
        self._left = []
        return left
