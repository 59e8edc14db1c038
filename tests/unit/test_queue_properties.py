"""Property tests for queue ordering: strict bands, FIFO within a band, nothing lost or doubled.

A hypothesis state machine drives a queue and a plain-Python model through random
interleavings of put / put_batch / get / get_batch / clear / drain under each backpressure
strategy; an async property runs concurrent producers and consumers against the same model.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pydotcompute.exceptions import QueueFullError
from pydotcompute.ring_kernels.fast_queue import FastMessageQueue, get_priority_band
from pydotcompute.ring_kernels.message import message
from pydotcompute.ring_kernels.queue import MessageQueue


@message
class Tok:
    seq: int


priorities = st.integers(min_value=0, max_value=255)
STRATEGIES = ("block", "reject", "drop_oldest")


class BandModel:
    """The reference: four FIFO bands served strictly in order."""

    def __init__(self) -> None:
        self.bands: list[deque[Tok]] = [deque() for _ in range(4)]

    def __len__(self) -> int:
        return sum(map(len, self.bands))

    def put(self, tok: Tok) -> None:
        self.bands[get_priority_band(tok.priority)].append(tok)

    def get(self) -> Tok:
        for band in self.bands:
            if band:
                return band.popleft()
        raise AssertionError("model is empty")

    def drop_oldest(self) -> None:
        for band in reversed(self.bands):
            if band:
                band.popleft()
                return

    def clear(self) -> None:
        for band in self.bands:
            band.clear()


class ExactModel:
    """The reference for MessageQueue: highest priority first, FIFO among equals."""

    def __init__(self, use_priority: bool) -> None:
        self.use_priority = use_priority
        self.items: list[tuple[int, int, Tok]] = []
        self.order = itertools.count()

    def __len__(self) -> int:
        return len(self.items)

    def put(self, tok: Tok) -> None:
        key = -tok.priority if self.use_priority else 0
        heapq.heappush(self.items, (key, next(self.order), tok))

    def get(self) -> Tok:
        return heapq.heappop(self.items)[2]

    def drop_oldest(self) -> None:
        victim = max(self.items, key=lambda e: (e[0], -e[1]))
        self.items.remove(victim)
        heapq.heapify(self.items)

    def clear(self) -> None:
        self.items.clear()


class QueueMachine(RuleBasedStateMachine):
    """Shared rules; subclasses pick the queue class and its model."""

    def make(self, maxsize: int, strategy: str) -> tuple[Any, Any]:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.seq = itertools.count()
        self.put_ok = 0
        self.got = 0
        self.dropped = 0
        self.seen: set[int] = set()

    @initialize(maxsize=st.integers(min_value=0, max_value=6), strategy=st.sampled_from(STRATEGIES))
    def setup(self, maxsize: int, strategy: str) -> None:
        self.maxsize = maxsize
        self.strategy = strategy
        self.queue, self.model = self.make(maxsize, strategy)

    def _full(self) -> bool:
        return bool(self.maxsize) and len(self.model) >= self.maxsize

    def _admit(self, tok: Tok) -> bool:
        """Apply the strategy to the model; False when the queue must refuse."""
        if self._full():
            if self.strategy != "drop_oldest":
                return False
            self.model.drop_oldest()
            self.dropped += 1
        self.model.put(tok)
        self.put_ok += 1
        return True

    def _check_got(self, tok: Tok | None) -> None:
        assert tok is not None
        expected = self.model.get()
        assert tok is expected, (tok.seq, tok.priority, expected.seq, expected.priority)
        assert tok.seq not in self.seen, "delivered twice"
        self.seen.add(tok.seq)
        self.got += 1

    @rule(priority=priorities)
    def put_nowait(self, priority: int) -> None:
        tok = Tok(seq=next(self.seq), priority=priority)
        if self._admit(tok):
            assert self.queue.put_nowait(tok) is True
        else:
            with pytest.raises(QueueFullError):
                self.queue.put_nowait(tok)

    @rule(prios=st.lists(priorities, max_size=8))
    def put_batch(self, prios: list[int]) -> None:
        toks = [Tok(seq=next(self.seq), priority=p) for p in prios]
        expected = 0
        for tok in toks:
            if not self._admit(tok):
                break
            expected += 1
        assert self.queue.put_batch(toks) == expected

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def get_nowait(self) -> None:
        self._check_got(self.queue.get_nowait())

    @precondition(lambda self: len(self.model) == 0)
    @rule()
    def get_nowait_empty(self) -> None:
        assert self.queue.get_nowait() is None

    @rule(n=st.integers(min_value=0, max_value=8))
    def get_batch(self, n: int) -> None:
        out = self.queue.get_batch(n)
        assert len(out) == min(n, len(self.model))
        for tok in out:
            self._check_got(tok)

    @rule()
    def clear(self) -> None:
        n = len(self.model)
        assert self.queue.clear() == n
        self.model.clear()
        self.dropped += n

    @rule()
    def drain(self) -> None:
        for tok in self.queue.drain():
            self._check_got(tok)
        assert len(self.model) == 0

    @invariant()
    def counters_balance(self) -> None:
        if not hasattr(self, "queue"):
            return
        stats = self.queue.statistics()
        assert stats.current_size == len(self.model) == len(self.queue)
        assert stats.total_enqueued == self.put_ok
        assert stats.total_dequeued == self.got
        assert stats.total_dropped == self.dropped
        # nothing lost, nothing invented
        assert stats.total_enqueued == stats.total_dequeued + stats.total_dropped + len(self.queue)
        assert sum(stats.band_counts) == len(self.queue)
        if self.maxsize:
            assert len(self.queue) <= self.maxsize
            assert stats.peak_size <= self.maxsize


class FastQueueMachine(QueueMachine):
    def make(self, maxsize: int, strategy: str) -> tuple[Any, Any]:
        return FastMessageQueue(maxsize, backpressure=strategy), BandModel()


class ExactQueueMachine(QueueMachine):
    @initialize(
        maxsize=st.integers(min_value=0, max_value=6),
        strategy=st.sampled_from(STRATEGIES),
        use_priority=st.booleans(),
    )
    def setup(self, maxsize: int, strategy: str, use_priority: bool = True) -> None:  # type: ignore[override]
        self.use_priority = use_priority
        super().setup(maxsize, strategy)

    def make(self, maxsize: int, strategy: str) -> tuple[Any, Any]:
        queue = MessageQueue(maxsize, backpressure=strategy, use_priority=self.use_priority)
        return queue, ExactModel(self.use_priority)


_machine_settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, print_blob=True
)
TestFastQueueInterleavings = FastQueueMachine.TestCase
TestFastQueueInterleavings.settings = _machine_settings
TestExactQueueInterleavings = ExactQueueMachine.TestCase
TestExactQueueInterleavings.settings = _machine_settings


# --- concurrent producers and consumers ------------------------------------------------


async def _run_concurrent(
    queue: Any, model: Any, producers: list[list[int]], batch_sizes: list[int]
) -> list[Tok]:
    """Producers ``await put`` (blocking); one consumer alternates get and get_batch.

    Model bookkeeping happens in the same event-loop step as the queue operation, so the
    model mirrors the queue exactly and every dequeue can be checked against it.
    """
    seq = itertools.count()
    total = sum(map(len, producers))
    received: list[Tok] = []

    async def produce(prios: list[int]) -> None:
        for p in prios:
            tok = Tok(seq=next(seq), priority=p)
            await queue.put(tok, timeout=5.0)
            model.put(tok)
            await asyncio.sleep(0)

    def check(tok: Tok) -> None:
        assert tok is model.get()
        received.append(tok)

    async def consume() -> None:
        sizes = itertools.cycle(batch_sizes or [0])
        while len(received) < total:
            n = next(sizes)
            if n:
                for tok in queue.get_batch(n):
                    check(tok)
                await asyncio.sleep(0)
            else:
                check(await queue.get(timeout=5.0))

    await asyncio.gather(consume(), *(produce(p) for p in producers))
    return received


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    producers=st.lists(st.lists(priorities, max_size=25), min_size=1, max_size=4),
    batch_sizes=st.lists(st.integers(min_value=0, max_value=5), max_size=4),
    maxsize=st.integers(min_value=1, max_value=5),
    exact=st.booleans(),
)
def test_concurrent_producers_and_consumer_keep_order_and_lose_nothing(
    producers: list[list[int]], batch_sizes: list[int], maxsize: int, exact: bool
) -> None:
    if exact:
        queue: Any = MessageQueue(maxsize)
        model: Any = ExactModel(True)
    else:
        queue = FastMessageQueue(maxsize)
        model = BandModel()
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        received = runner.run(_run_concurrent(queue, model, producers, batch_sizes))
    assert sorted(t.seq for t in received) == list(range(sum(map(len, producers))))
    stats = queue.statistics()
    assert stats.total_enqueued == stats.total_dequeued == len(received)
    assert stats.total_dropped == 0
    assert stats.peak_size <= maxsize
    assert len(queue) == 0
