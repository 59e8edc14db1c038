"""MessageQueue: an asyncio queue ordered by exact priority (or FIFO), with backpressure.

It shares the waiting, closing and backpressure machinery of
`FastMessageQueue` and replaces only the
storage: a heap keyed by ``(-priority, sequence)`` so that priority 200 is served before 199
(the fast queue only orders by band), or a single deque when ``use_priority=False``.
Use it when exact priorities matter; the runtime's inboxes use the O(1) band queue.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any, TypeVar

from .fast_queue import BAND_OF as _BAND_OF
from .fast_queue import BackpressureStrategy, FastMessageQueue
from .fast_queue import discard_items as _discard
from .fast_queue import priority_of as _priority_of
from .fast_queue import wake_one as _wake_one

__all__ = ("BackpressureStrategy", "MessageQueue")

T = TypeVar("T")


class MessageQueue(FastMessageQueue[T]):
    """Bounded asyncio message queue with exact priority order and three backpressure modes.

    Args:
        maxsize: Capacity; ``0`` means unbounded.
        backpressure: ``BackpressureStrategy.BLOCK`` (wait, honouring timeouts), ``REJECT``
            (raise ``QueueFullError``) or ``DROP_OLDEST`` (drop and count the oldest message
            of the lowest priority; a dropped ``ArrayMessage`` frame held as bytes releases
            the arrays it pinned in the buffer registry, as ``clear`` does).
        use_priority: Serve higher ``priority`` first (FIFO among equals); False = plain FIFO.
        kernel_id: The owning kernel, used in error messages.
    """

    __slots__ = ("_fifo", "_heap", "_seq", "_use_priority")

    def __init__(
        self,
        maxsize: int = 4096,
        *,
        backpressure: BackpressureStrategy | str = BackpressureStrategy.BLOCK,
        use_priority: bool = True,
        kernel_id: str = "",
    ) -> None:
        super().__init__(maxsize, kernel_id=kernel_id, backpressure=backpressure)
        self._use_priority = use_priority
        self._heap: list[tuple[int, int, Any]] = []
        self._fifo: deque[Any] = deque()
        self._seq = itertools.count()

    @property
    def use_priority(self) -> bool:
        return self._use_priority

    def _append(self, item: Any) -> None:
        prio = _priority_of(item)
        if self._use_priority:
            heapq.heappush(self._heap, (-prio, next(self._seq), item))
        else:
            self._fifo.append(item)
        self._count += 1
        if self._count > self._peak:
            self._peak = self._count
        if self._getters:
            _wake_one(self._getters)

    def _pop(self) -> Any:
        item = heapq.heappop(self._heap)[2] if self._use_priority else self._fifo.popleft()
        self._count -= 1
        self._dequeued += 1
        if self._putters:
            _wake_one(self._putters)
        return item

    def _drop_oldest(self) -> None:
        if self._use_priority:
            # the oldest entry among the lowest priority present
            victim = max(
                range(len(self._heap)), key=lambda i: (self._heap[i][0], -self._heap[i][1])
            )
            item = self._heap[victim][2]
            self._heap[victim] = self._heap[-1]
            self._heap.pop()
            heapq.heapify(self._heap)
        else:
            item = self._fifo.popleft()
        _discard((item,))
        self._count -= 1
        self._dropped += 1
        self._removed += 1
        if self.on_drop is not None:
            self.on_drop(1)
        if self.on_drop_item is not None:
            self.on_drop_item(item)

    def clear(self) -> int:
        n = self._count
        _discard(e[2] for e in self._heap)
        _discard(self._fifo)
        self._heap.clear()
        self._fifo.clear()
        self._count = 0
        self._dropped += n
        self._removed += n
        while self._putters:
            _wake_one(self._putters)
        return n

    def statistics(self) -> Any:
        stats = super().statistics()
        bands = [0, 0, 0, 0]
        items = (e[2] for e in self._heap) if self._use_priority else iter(self._fifo)
        for item in items:
            bands[_BAND_OF[_priority_of(item)]] += 1
        return type(stats)(
            max_size=stats.max_size,
            current_size=stats.current_size,
            peak_size=stats.peak_size,
            total_enqueued=stats.total_enqueued,
            total_dequeued=stats.total_dequeued,
            total_dropped=stats.total_dropped,
            band_counts=(bands[0], bands[1], bands[2], bands[3]),
            closed=stats.closed,
        )
