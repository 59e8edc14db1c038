"""The ends of a ``shm-ring`` edge in the runtime's own process: thread <-> process.

A thread actor reads and writes an edge's band rings in-process, so a message between a
thread actor and a process actor crosses shared memory once and never the event loop.
`ShmInput` is a consumer's end (what the thread tier's ``EdgeInputs`` reads beside its
inbox and object edges), `ShmOutput` a producer's. Another tier reaches them through
`make_input` and `make_output`, loaded by name (``tiers.edge_provider("shm-ring")``):
tiers never import each other.

Design notes:
- Waking a thread from another process: the producer's child rings the edge's data
  doorbell (a named pipe) only while this end is *armed* (its actor sleeps), and the
  process's shared watcher thread (`watcher.WATCHER`) turns that into a ring of the
  consumer's bell, disarming the end at once so the writes until the consumer runs ring
  nothing more. A busy consumer costs the producer nothing, a sleeping one one hop.
- One lock between the consumer's takes and `ShmInput.close`: a thread actor still busy
  when its grace period ran out may take while the runtime closes the edge, and a ring
  has one reader at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ...message import message_decoder
from .edge import EdgeReader, EdgeWriter, ShmEdge, band_of
from .framing import (
    FRAME_TAG,
    TRACE_FRAME,
    decode_value,
    encoder_for,
    no_encoder,
    split_trace,
    trace_header,
)
from .watcher import WATCHER

__all__ = ("ShmInput", "ShmOutput", "make_input", "make_output")

#: each band ring's bytes of an edge into an actor of the runtime's process
RING_BYTES = 1 << 20


def make_input(
    source_id: str,
    target_id: str,
    *,
    capacity: int,
    policy: str,
    ring: Callable[[], None],
    carrier: Any = None,
) -> tuple[ShmEdge, ShmInput]:
    """A new edge into ``target_id``, an actor of this process (a thread's), with the
    end it reads; ``ring`` wakes that actor (see the notes); ``carrier`` (a tracing
    runtime's) takes the trace context of each record that has one."""
    edge = ShmEdge(source_id, target_id, capacity=capacity, policy=policy, ring_bytes=RING_BYTES)
    return edge, ShmInput(edge, target_id, ring, carrier)


def _decode_any(kernel_id: str, decode: Callable[[bytes], Any], data: bytes) -> Any:
    """A record read back from an edge, its trace header (if any) dropped."""
    if data[:2] == TRACE_FRAME:
        data = split_trace(kernel_id, data)[3]
    return decode(data) if data[0] != FRAME_TAG else decode_value(kernel_id, data)


def make_output(edge: ShmEdge, outbox: Any, kernel_id: str, output_type: type | None) -> ShmOutput:
    """What ``kernel_id``, an actor of this process, sends through into ``edge``."""
    return ShmOutput(edge, outbox, kernel_id, output_type)


class ShmInput:
    """A thread consumer's end of a ``shm-ring`` edge.

    Args:
        edge: The edge (made by the consumer's worker, in this process).
        kernel_id: The consumer, for decode errors.
        ring: What wakes the consumer (its `edge.EdgeInputs` bell's ``ring``).
        carrier: The consumer's `TraceCarrier` under a tracing runtime (None: untraced).
    """

    kind = "shm-ring"

    __slots__ = (
        "_carrier",
        "_closed",
        "_decode",
        "_edge",
        "_kernel_id",
        "_lock",
        "_reader",
        "_ring",
    )

    def __init__(
        self, edge: ShmEdge, kernel_id: str, ring: Callable[[], None], carrier: Any = None
    ) -> None:
        self._carrier = carrier
        self._edge = edge
        self._kernel_id = kernel_id
        self._reader = EdgeReader(edge.spec)
        self._decode = message_decoder()
        self._lock = threading.Lock()
        self._closed = False
        self._ring = ring
        WATCHER.set(self._reader.data_fd, self._on_data)

    @property
    def edge(self) -> ShmEdge:
        """The edge this end reads."""
        return self._edge

    def _on_data(self) -> None:
        """Watcher thread: the producer rang (this end was armed). Disarmed at once, so
        the producer's writes until the consumer runs ring nothing more (its bell is
        rung below, and it arms again before it next sleeps)."""
        with self._lock:
            if self._closed:
                return
            self._reader.arm(False)
            self._reader.drain_bell()
        self._ring()

    @property
    def live(self) -> bool:
        """Set True once the consumer looked at its edges: the producer may write."""
        return True

    @live.setter
    def live(self, value: bool) -> None:
        if value:
            self._reader.mark_live()

    def __len__(self) -> int:
        depth = self._edge.counters()["depth"]
        return max(depth, 0)

    def take(self) -> Any:
        """The next message, highest band first, or None (the consumer's thread)."""
        with self._lock:
            if self._closed:
                return None
            data = self._reader.take()
        if data is None:
            return None
        if data[0] != FRAME_TAG:
            return self._decode(data)
        if data[:2] != TRACE_FRAME:
            return decode_value(self._kernel_id, data)
        trace_id, span_id, flags, record = split_trace(self._kernel_id, data)
        msg = (
            self._decode(record)
            if record[0] != FRAME_TAG
            else decode_value(self._kernel_id, record)
        )
        carrier = self._carrier
        if carrier is not None:
            carrier.carry(msg, (trace_id, span_id, flags), True)
        return msg

    def arm(self, waiting: bool) -> None:
        """Announce (or withdraw) that the consumer sleeps: the producer then rings."""
        with self._lock:
            if not self._closed:
                self._reader.arm(waiting)

    def close(self) -> list[Any]:
        """Stop reading, close the edge and return what it held, decoded, each once."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            WATCHER.discard([self._reader.data_fd])
            self._reader.detach()
        kernel_id, decode = self._kernel_id, self._decode
        return [_decode_any(kernel_id, decode, data) for data in self._edge.close()]


class ShmOutput:
    """What a thread producer routed into a ``shm-ring`` edge sends through (its
    context's outbox): the edge, and the worker's outbox (the loop path) for what the
    edge cannot take (not live yet, or closed).

    Args:
        edge: The consumer's edge.
        outbox: The producer's outbox.
        kernel_id: The producer, for errors.
        output_type: What it may send (checked again as a message is encoded).
    """

    __slots__ = ("_codec", "_decode", "_kernel_id", "_output_type", "_writer", "edge", "outbox")

    def __init__(
        self, edge: ShmEdge, outbox: Any, kernel_id: str, output_type: type | None
    ) -> None:
        self.edge = edge
        self.outbox = outbox
        self._kernel_id = kernel_id
        self._output_type = output_type
        self._writer: EdgeWriter | None
        try:
            self._writer = EdgeWriter(edge.spec)
        except FileNotFoundError:  # closed already: the loop path
            self._writer = None
        self._codec: tuple[type | None, Callable[[Any], bytes]] = (None, no_encoder)
        self._decode = message_decoder()

    def state(self) -> int:
        """What a put would find now (`pool_edges.ROOM`, ``FULL``, ``WAITING``,
        ``CLOSED``): how a spread over a pool's replica edges picks one."""
        writer = self._writer
        return 3 if writer is None else writer.state()

    def put(self, msg: Any, timeout: float | None = None) -> bool:
        writer = self._writer
        if writer is None or not writer.usable:
            return bool(self.outbox.put(msg, timeout))
        codec = self._codec
        if type(msg) is not codec[0]:
            codec = self._codec = (
                type(msg),
                encoder_for(self._kernel_id, msg, self._output_type, "must send"),
            )
        data = codec[1](msg)
        done = writer.put(data, band_of(msg), timeout)
        if done is True or done is False:
            return done
        if len(done) == 1 and done[0] is data:
            return bool(self.outbox.put(msg, timeout))
        for record in done:  # a close raced the write: what it left, decoded again
            value = _decode_any(self._kernel_id, self._decode, record)
            if not self.outbox.put(value, timeout):
                return False
        return True

    def put_traced(
        self,
        msg: Any,
        timeout: float | None,
        ids: tuple[int, int, int],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """`put` in the trace context ``ids``: the record goes with the ``0xC1 'T'``
        header; what takes the loop path reports ``ids`` to ``received`` (the runtime)."""
        writer = self._writer
        if writer is None or not writer.usable:
            received(msg, *ids)
            return bool(self.outbox.put(msg, timeout))
        codec = self._codec
        if type(msg) is not codec[0]:
            codec = self._codec = (
                type(msg),
                encoder_for(self._kernel_id, msg, self._output_type, "must send"),
            )
        data = trace_header(*ids) + codec[1](msg)
        done = writer.put(data, band_of(msg), timeout)
        if done is True or done is False:
            return done
        if len(done) == 1 and done[0] is data:
            received(msg, *ids)
            return bool(self.outbox.put(msg, timeout))
        for record in done:  # a close raced the write: what it left, decoded again
            value = _decode_any(self._kernel_id, self._decode, record)
            if not self.outbox.put(value, timeout):
                return False
        return True

    def __len__(self) -> int:
        return len(self.outbox)
