"""The hosting bridge's width: 64 messages the actor has not taken, widened for a quick actor.

Without a ``bridge_queue_size`` of the user's, a worker whose room can change (the thread
and process tiers') starts at 64 and is widened while the actor is measured to take more within the
bridge's window; a slow actor keeps 64, a size the user gives is kept as given, and an
urgent message still overtakes everything the bridge has not handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import KernelStateError
from pydotcompute.ring_kernels import hosted

from .tier_actors import Done, Job, echo_sync, paced_echo_sync

BOUND_S = 30.0


TIERS = pytest.mark.parametrize("tier", ["thread", "process"])


async def _launch(rt: RingKernelRuntime, tier: str, actor: Any = echo_sync, **opts: Any) -> Any:
    """Launch and activate kernel ``k`` (Job in, Done out); returns the kernel."""
    await rt.launch("k", actor, input_type=Job, output_type=Done, tier=tier, **opts)
    await rt.activate("k")
    return rt.get_kernel("k")


async def _pipeline(
    rt: RingKernelRuntime, n: int, base: int = 0, payload: str = ""
) -> tuple[list[int], int]:
    """Send ``n`` jobs from a producer task while reading ``n`` replies; returns the seqs
    read and the widest bridge seen, checking at each reply that the worker holds no more
    than the bridge allows."""
    kernel: Any = rt.get_kernel("k")
    widest = kernel.bridge_room

    async def produce() -> None:
        for i in range(base, base + n):
            await rt.send("k", Job(seq=i, payload=payload))

    producer = asyncio.ensure_future(produce())
    got = []
    for _ in range(n):
        got.append((await rt.receive("k", timeout=BOUND_S)).seq)
        room = kernel.bridge_room
        assert kernel.worker.pending_input <= max(room, widest), (room, widest)
        widest = max(widest, room)
    await producer
    return got, widest


@pytest.fixture
def wide_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 20 ms: any echo actor takes more than 64 messages in it, on any machine
    (the default 0.5 ms holds a quick actor's few hundred on a quiet one)."""
    monkeypatch.setattr(hosted, "BRIDGE_WINDOW_S", 0.02)
    monkeypatch.setattr(hosted, "BRIDGE_WINDOW_URGENT_LANE_S", 0.02)  # (the thread tier's)


@TIERS
async def test_a_quick_actor_gets_a_wider_bridge_and_order_holds(
    tier: str, wide_window: None
) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        kernel: Any = await _launch(rt, tier)
        assert kernel.bridge_room == 64
        got, widest = await _pipeline(rt, 20_000)
        assert got == list(range(20_000))
        assert 64 < widest <= 1024, widest
        # an urgent message sent behind a backlog overtakes all the bridge did not hand over
        for i in range(100_000, 103_000):
            await rt.send("k", Job(seq=i, priority=10))
        room = kernel.bridge_room
        await rt.send("k", Job(seq=999_999, priority=250))
        order = [(await rt.receive("k", timeout=BOUND_S)).seq for _ in range(3001)]
        # ahead of it: what the worker held, the one in the actor's hands and the pump's
        assert order.index(999_999) <= max(room, kernel.bridge_room) + 2, order.index(999_999)
        order.remove(999_999)
        assert order == list(range(100_000, 103_000)), "the order of a band changed"
        tel = rt.get_telemetry("k")
        assert tel.messages_dropped == 0


@TIERS
async def test_a_slow_actor_keeps_the_narrow_bridge(tier: str) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch(rt, tier, paced_echo_sync)
        got, widest = await _pipeline(rt, 400, payload="0.001")
        assert got == list(range(400))
        assert widest == 64  # 64 ms of work held already: never widened


@TIERS
async def test_an_actor_turning_slow_gets_the_narrow_bridge_back(
    tier: str, wide_window: None
) -> None:
    """Measured on the messages it took lately: after a quick stretch, a slow one narrows
    the bridge to 64 again once too few were taken over four windows."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        kernel: Any = await _launch(rt, tier, paced_echo_sync)
        _, widest = await _pipeline(rt, 20_000)
        assert widest > 64
        n = kernel.bridge_room + 300  # more than the widened bridge holds
        got, _ = await _pipeline(rt, n, base=100_000, payload="0.0005")
        assert got == list(range(100_000, 100_000 + n))
        assert kernel.bridge_room == 64


@TIERS
async def test_a_size_the_user_gives_is_kept(tier: str, wide_window: None) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch(rt, tier, bridge_queue_size=32)
        got, widest = await _pipeline(rt, 5_000)
        assert got == list(range(5_000))
        assert widest == 32, widest


async def test_a_pool_keeps_its_members_share(wide_window: None) -> None:
    """A pool's members share the bridge (``ceil(64 / N)`` each): it is not widened."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch(rt, "thread", replicas=2)
        got, widest = await _pipeline(rt, 5_000)
        assert sorted(got) == list(range(5_000))
        assert widest == 64, widest


@TIERS
async def test_terminate_in_a_widened_bridge_accounts_for_every_message(
    tier: str, wide_window: None
) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        kernel: Any = await _launch(rt, tier)
        _, widest = await _pipeline(rt, 10_000)
        assert widest > 64
        accepted = list(range(50_000, 54_000))
        for i in accepted:
            await rt.send("k", Job(seq=i))
        read = [(await rt.receive("k", timeout=BOUND_S)).seq for _ in range(50)]
        left = await rt.terminate("k", timeout=0.01)
        with contextlib.suppress(KernelStateError):  # raised once the outbox is drained
            while (reply := rt.receive_nowait("k")) is not None:
                read.append(reply.seq)
        undelivered = [m.seq for m in left]
        dropped = rt.get_telemetry("k").messages_dropped
        assert read == sorted(read)
        assert sorted(read + undelivered) == accepted, (len(read), len(undelivered), dropped)
        # handed back is counted as dropped, and nothing else is: how many the actor got
        # through before the 0.01 s grace ended depends on the machine's speed and load
        assert dropped == len(undelivered), (dropped, len(undelivered))
        assert kernel.bridge_room <= 1024


async def test_the_process_tier_keeps_sent_messages_by_its_bridge_not_its_ring() -> None:
    """The parent keeps each message sent until the child finished it, pruned lazily past
    the hand-over bound: with the ring built for the widest bridge, a narrow bridge still
    keeps about 2 x 65 of them, not 2 x 1,025 (large messages would add up)."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        kernel: Any = await _launch(rt, "process", paced_echo_sync)
        kept = 0

        async def produce() -> None:
            for i in range(1_500):
                await rt.send("k", Job(seq=i, payload="0.0001"))

        producer = asyncio.ensure_future(produce())
        for _ in range(1_500):
            await rt.receive("k", timeout=BOUND_S)
            kept = max(kept, kernel.worker.statistics()["in_flight"])
        await producer
        assert kernel.bridge_room == 64
        assert kept <= 2 * (64 + 1), kept


async def test_a_widened_process_bridge_keeps_at_most_64_finished_messages(
    wide_window: None,
) -> None:
    """Kept messages are pruned every 64 sends, not at twice the in-flight window: a
    bridge widened to 1,024 keeps its unfinished ones and at most 64 finished, not up to
    2,050 in all."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        kernel: Any = await _launch(rt, "process")
        kept = widest = 0

        async def produce() -> None:
            for i in range(20_000):
                await rt.send("k", Job(seq=i))

        producer = asyncio.ensure_future(produce())
        for _ in range(20_000):
            await rt.receive("k", timeout=BOUND_S)
            widest = max(widest, kernel.bridge_room)
            kept = max(kept, kernel.worker.statistics()["in_flight"])
        await producer
        assert widest > 64
        assert kept <= widest + 1 + 64, (kept, widest)
