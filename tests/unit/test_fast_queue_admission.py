"""Blocked senders on a full ``block`` queue are admitted by priority band, FIFO within a
band (`FastMessageQueue` and the exact-priority `MessageQueue`, which shares its waiting)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pydotcompute.exceptions import QueueTimeoutError
from pydotcompute.ring_kernels.fast_queue import FastMessageQueue
from pydotcompute.ring_kernels.message import message
from pydotcompute.ring_kernels.queue import MessageQueue

LOW, NORMAL, HIGH, SYSTEM = 10, 128, 200, 250


@message
class Item:
    name: str


QUEUES = [
    pytest.param(FastMessageQueue, id="fast"),
    pytest.param(MessageQueue, id="exact-priority"),
]


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class Senders:
    """Tasks that each put one item into ``queue``; ``admitted`` records the order their
    puts returned in."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.admitted: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, name: str, priority: int, timeout: float | None = None) -> None:
        async def put() -> None:
            await self.queue.put(Item(name=name, priority=priority), timeout=timeout)
            self.admitted.append(name)

        self.tasks.append(asyncio.create_task(put()))
        await _turns()  # parked, in this order

    async def admit_one(self) -> None:
        """Free one slot and let exactly one blocked sender in."""
        self.queue.get_nowait()
        await _turns()


async def _full(cls: Any, size: int = 2) -> Any:
    q = cls(size)
    for i in range(size):
        q.put_nowait(Item(name=f"pre{i}"))
    return q


@pytest.mark.parametrize("cls", QUEUES)
async def test_a_control_message_overtakes_blocked_normal_senders(cls: Any) -> None:
    q = await _full(cls)
    s = Senders(q)
    for i in range(5):
        await s.start(f"n{i}", NORMAL)
    await s.start("low", LOW)
    await s.start("high", HIGH)
    await s.start("system", SYSTEM)
    await s.start("high2", HIGH)
    assert s.admitted == []
    for _ in range(9):
        await s.admit_one()
    assert s.admitted == ["system", "high", "high2", "n0", "n1", "n2", "n3", "n4", "low"]
    await asyncio.gather(*s.tasks)


@pytest.mark.parametrize("cls", QUEUES)
async def test_blocked_senders_of_one_band_are_admitted_fifo(cls: Any) -> None:
    q = await _full(cls, 1)
    s = Senders(q)
    for i in range(40):
        await s.start(f"n{i}", (NORMAL, 100)[i % 2])  # two priorities of one band
    for _ in range(40):
        await s.admit_one()
    assert s.admitted == [f"n{i}" for i in range(40)]


async def test_a_woken_sender_that_loses_the_slot_keeps_its_place() -> None:
    q = await _full(FastMessageQueue, 1)
    s = Senders(q)
    for i in range(3):
        await s.start(f"n{i}", NORMAL)
    q.get_nowait()  # wakes n0 ...
    q.put_nowait(Item(name="barger"))  # ... but a put that found room takes the slot
    await _turns()
    assert s.admitted == []
    await s.start("n3", NORMAL)
    for _ in range(4):
        await s.admit_one()
    assert s.admitted == ["n0", "n1", "n2", "n3"]


async def test_a_sender_that_times_out_passes_the_slot_on_in_priority_order() -> None:
    q = await _full(FastMessageQueue, 1)
    s = Senders(q)
    await s.start("n0", NORMAL)
    await s.start("high", HIGH, timeout=0.05)
    await s.start("system", SYSTEM)
    await asyncio.sleep(0.1)  # "high" gave up
    with pytest.raises(QueueTimeoutError):
        await s.tasks[1]
    await s.admit_one()
    await s.admit_one()
    assert s.admitted == ["system", "n0"]


async def test_a_cancelled_head_sender_hands_its_wake_up_to_the_next_band() -> None:
    q = await _full(FastMessageQueue, 1)
    s = Senders(q)
    await s.start("n0", NORMAL)
    await s.start("high", HIGH)
    q.get_nowait()  # wakes "high" ...
    s.tasks[1].cancel()  # ... which is cancelled before it runs
    await _turns()
    assert s.admitted == ["n0"]
    assert q.statistics().current_size == 1


async def test_parked_bands_are_forgotten_once_senders_leave() -> None:
    q = await _full(FastMessageQueue, 1)
    s = Senders(q)
    for i in range(4):
        await s.start(f"s{i}", (LOW, HIGH)[i % 2], timeout=None if i % 2 else 0.02)
    await asyncio.sleep(0.05)
    for _ in range(2):
        await s.admit_one()
    await asyncio.gather(*s.tasks, return_exceptions=True)
    assert s.admitted == ["s1", "s3"]
    assert not q._putter_bands  # no band kept for a sender that left
