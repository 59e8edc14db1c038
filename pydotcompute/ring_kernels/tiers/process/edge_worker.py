"""A process kernel's direct edges, on the runtime's side: `HostedProcessWorker`.

`HostedProcessWorker` is the `ProcessWorker` of ``tier="process"`` in a runtime. Through
the tier contract it makes ``shm-ring`` edges into its actor (`open_edge`: the edge's
segments belong to this process, see `edge.ShmEdge`) and routes its actor's sends into
one (`route_into`). `EdgePorts` keeps the edges and tells the child about them: it
writes them into the child's `edge_child.ControlBlock` and sends `edge_child.EDGE_SIGNAL`.

Design notes:
- The control block is created at the first edge only, so a child without edges never
  maps it (its context stays the plain one). A child that starts after an edge was made
  reads it before its actor runs; one that runs is signalled only once it reported
  ready (the handler is installed by then), under the worker's exit lock, so the signal
  never reaches a process that was reaped and its pid reused.
- What the edges into the actor hold when it stopped is collected at `take_undelivered`
  (the runtime calls it once the child has exited): the record in the actor's hands when
  it raised first (reported on the status pipe), then the inbox's leftovers, then the
  edges', highest band first. A record the child held when it was killed is counted
  ``lost`` by its edge: it never came back.
- The process tier does not restart a failed kernel (``CAPABILITIES.restart`` is False), so
  an edge is never re-attached to a new child: a tier that restarts would hand the same
  `edge.EdgeSpec` to the new child (the segments outlive the old one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import threading
from typing import Any

from ....exceptions import MessageDeserializationError
from ...pool_edges import EdgeGroup
from .edge import KIND, ShmEdge
from .edge_child import EDGE_SIGNAL, ControlBlock, setup
from .waiting import ring_bell
from .worker import ProcessWorker

__all__ = ("EdgePorts", "HostedProcessWorker")

logger = logging.getLogger("pydotcompute")


class EdgePorts:
    """The edges into one process actor and the one it sends into, and its child's
    control block. Any thread may call it (the loop connects, a thread starts).

    Args:
        kernel_id: The consuming kernel.
        capacity: Each incoming edge's bound (the kernel's ``queue_size``).
        policy: Its backpressure policy.
        ring_bytes: Each band ring's bytes (the kernel's inbox ring's).
    """

    def __init__(self, kernel_id: str, *, capacity: int, policy: str, ring_bytes: int) -> None:
        self._kernel_id = kernel_id
        self._capacity = capacity
        self._policy = policy
        self._ring_bytes = ring_bytes
        #: the child's control segment's name (`ChildSpec.ctl_name`)
        self.ctl_name = f"pdcc_{os.getpid()}_{secrets.token_hex(4)}"
        self._ctl: ControlBlock | None = None
        self._lock = threading.Lock()
        self._in: list[ShmEdge] = []
        self._out: ShmEdge | EdgeGroup | None = None
        self._paused = False
        self._closed = False
        self._left: dict[str, bytes] = {}  # edge base -> the record the actor raised on

    def open(self, source_id: str) -> ShmEdge:
        """A new edge into this actor from ``source_id`` (closed at once if the actor
        has stopped taking messages already)."""
        edge = ShmEdge(
            source_id,
            self._kernel_id,
            capacity=self._capacity,
            policy=self._policy,
            ring_bytes=self._ring_bytes,
        )
        with self._lock:
            self._in.append(edge)
            closed = self._closed
            if not closed:
                self._write()
        if closed:
            edge.close()
        return edge

    def share_bound(self, replicas: int) -> None:
        """Each edge opened from now on holds ``1 / replicas`` of the bound (rounded up)."""
        self._capacity = max(1, -(-self._capacity // max(1, replicas)))

    def route(self, edge: ShmEdge | EdgeGroup | None) -> None:
        """Send into ``edge`` (the edges into a pool's replicas: spread over them; None:
        the outbox again)."""
        with self._lock:
            self._out = edge
            self._write()

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading the incoming edges."""
        with self._lock:
            if paused != self._paused:
                self._paused = paused
                self._write()

    def _write(self) -> None:
        """Publish the edges to the child's control block (lock held)."""
        ctl = self._ctl
        if ctl is None:
            if not self._in and self._out is None:
                return
            ctl = self._ctl = ControlBlock(self.ctl_name, create=True)
        out: Any = self._out
        if isinstance(out, EdgeGroup):  # into a pool: the child spreads over these
            out = [list(p.spec) for p in out.parts]
        elif out is not None:
            out = list(out.spec)
        ctl.write([[list(e.spec) for e in self._in if not e.closed], out, self._paused])

    @property
    def configured(self) -> bool:
        """True once an edge was named to the child."""
        return self._ctl is not None

    def left_report(self, base: Any, record: Any) -> None:
        """The child reported the record its actor raised on, from edge ``base``."""
        if isinstance(base, str) and isinstance(record, bytes):
            self._left[base] = record

    def close(self, answered: bool = False) -> tuple[list[bytes], list[bytes]]:
        """The actor stopped (its process has ended): close the incoming edges, once.
        ``answered``: the record in the actor's hands had been answered (finished, not
        lost). Returns ``(the records the actor raised on, what the edges held)``."""
        with self._lock:
            if self._closed:
                return [], []
            self._closed = True
            edges = list(self._in)
        hands: list[bytes] = []
        left: list[bytes] = []
        for edge in edges:
            base = edge.spec[0]
            hand = self._left.pop(base, None)
            lost = edge.unfinished() - (hand is not None)
            if answered and lost > 0:  # its reply ends it
                lost -= 1
                answered = False
            if hand is not None:
                hands.append(hand)
            left += edge.close(lost=max(lost, 0))
        ctl, self._ctl = self._ctl, None
        if ctl is not None:
            ctl.close(unlink=True)
        return hands, left


class HostedProcessWorker(ProcessWorker):
    """The `ProcessWorker` of a runtime's process kernel: direct edges connect it
    (`open_edge`, `route_into`, `pause_edges`). Takes `ProcessWorker`'s arguments, and
    ``edge_bound``: the ``(capacity, policy)`` of each edge into it (its kernel's
    ``queue_size`` and backpressure)."""

    #: `ProcessWorker`'s, with ``shm-ring`` direct edges both ways; the child spreads over
    #: the replica edges into a pool (`edge_child.ChildEdges.pick`).
    CAPABILITIES = dataclasses.replace(
        ProcessWorker.CAPABILITIES,
        edges_out=frozenset({KIND}),
        edges_in=frozenset({KIND}),
        edges_spread=frozenset({KIND}),
    )

    def __init__(
        self,
        kernel_id: str,
        kernel_func: Any,
        *,
        edge_bound: tuple[int, str] = (4096, "block"),
        **kwargs: Any,
    ) -> None:
        super().__init__(kernel_id, kernel_func, **kwargs)
        self._ports = EdgePorts(
            kernel_id,
            capacity=edge_bound[0],
            policy=edge_bound[1],
            ring_bytes=self.config.input_ring_bytes,
        )
        self._told = False  # the child reported ready: it may be signalled

    def _edge_spec(self) -> dict[str, Any]:
        return {"ctl_name": self._ports.ctl_name, "setup": setup}

    def start(self) -> None:
        super().start()
        self._told = True
        if self._ports.configured:
            self._tell_child()  # edges named while it started

    def _tell_child(self) -> None:
        """Have the child apply its control block now: a signal, and a doorbell for a
        receive parked on its edges."""
        if not self._told:
            return
        with self._exit_lock:
            # (the bell too, under the lock: a stop on another thread closes the doorbells
            # only after it marked the child exited, which takes this lock; rung after it,
            # the descriptor could be closed, or another file's by then)
            if self._child_exited or self._pid is None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, EDGE_SIGNAL)
            ring_bell(self._in_data_fd)

    # -- the contract's direct edges ----------------------------------------------------

    def open_edge(self, kind: str, source_id: str) -> ShmEdge:
        if kind != KIND:
            return super().open_edge(kind, source_id)  # type: ignore[no-any-return]
        edge = self._ports.open(source_id)
        self._tell_child()
        return edge

    def route_into(self, edge: Any) -> None:
        if edge is not None and not isinstance(edge, ShmEdge | EdgeGroup):
            super().route_into(edge)
        self._ports.route(edge)
        self._tell_child()

    def pause_edges(self, paused: bool) -> None:
        self._ports.pause(paused)
        self._tell_child()

    def share_edge_bound(self, replicas: int) -> None:
        """One of ``replicas`` of a pool: each edge into it holds its share of the bound
        (rounded up), as the pool's bridge shares its slots."""
        self._ports.share_bound(replicas)

    def _edge_report(self, report: list[Any]) -> None:
        if len(report) == 3:
            self._ports.left_report(report[1], report[2])

    def take_undelivered(self) -> list[Any]:
        """As `ProcessWorker.take_undelivered`, with what the incoming edges still hold:
        the record the actor raised on first, then the inbox's messages, then the
        edges' (which close: later sends into them take the loop path)."""
        out = super().take_undelivered()  # (raises while the child runs)
        hands, left = self._ports.close(answered=self.answered_at_exit)
        return self._decoded(hands) + out + self._decoded(left)

    def _decoded(self, records: list[bytes]) -> list[Any]:
        msgs: list[Any] = []
        for data in records:
            try:
                msgs.append(self._decode_record(data))
            except MessageDeserializationError as exc:
                logger.error(
                    "kernel %r: a message left in a direct edge does not decode (%s); dropped",
                    self.kernel_id,
                    exc,
                )
        return msgs
