"""Stress: 1,000,000 messages with random priorities through a three-actor pipeline.

Every message must arrive exactly once, in FIFO order within its priority band (each stage
serves bands strictly and keeps FIFO within a band, so the order survives the pipeline),
with nothing dropped and every stage's counters agreeing. It runs on the plain asyncio loop,
the reference; the unit suite covers uvloop.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from pydotcompute import KernelContext, RingKernelRuntime, message
from pydotcompute.ring_kernels.fast_queue import get_priority_band

N = int(os.environ.get("PYDOTCOMPUTE_STRESS_MESSAGES", "1000000"))
SEED = int(os.environ.get("PYDOTCOMPUTE_STRESS_SEED", "20240611"))


@message
class Item:
    seq: int


async def stage(ctx: KernelContext) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


async def pipeline(n: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    priorities = bytes(rng.randrange(256) for _ in range(n))
    bands = bytes(get_priority_band(p) for p in range(256))
    seen = bytearray(n)
    last_in_band = [-1, -1, -1, -1]
    out_of_order = 0

    async with RingKernelRuntime() as rt:
        for kid in ("a", "b", "c"):
            await rt.launch(kid, stage, input_type=Item, output_type=Item, queue_size=1024)
        rt.connect("a", "b")
        rt.connect("b", "c")
        for kid in ("a", "b", "c"):
            await rt.activate(kid)

        async def produce() -> None:
            send = rt.send
            for i in range(n):
                await send("a", Item(seq=i, priority=priorities[i]))

        async def consume() -> None:
            nonlocal out_of_order
            receive = rt.receive
            for _ in range(n):
                msg = await receive("c", timeout=30.0)
                seq = msg.seq
                seen[seq] += 1
                band = bands[msg.priority]
                if seq <= last_in_band[band]:
                    out_of_order += 1
                last_in_band[band] = seq

        await asyncio.gather(produce(), consume())
        telemetry = {kid: rt.get_telemetry(kid) for kid in ("a", "b", "c")}
        leftovers = {kid: len(rt.get_kernel(kid).inbox or ()) for kid in ("a", "b", "c")}
        report = await rt.shutdown(timeout=10.0)

    return {
        "seen": seen,
        "out_of_order": out_of_order,
        "processed": {k: t.messages_processed for k, t in telemetry.items()},
        "dropped": {k: t.messages_dropped for k, t in telemetry.items()},
        "errors": {k: t.error_count for k, t in telemetry.items()},
        "leftovers": leftovers,
        "report": report,
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_million_messages_arrive_exactly_once_in_band_order() -> None:
    print(f"stress pipeline: {N} messages, seed {SEED} (PYDOTCOMPUTE_STRESS_SEED)")
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        result = runner.run(pipeline(N, SEED))
    seen = result["seen"]
    assert isinstance(seen, bytearray)
    missing = seen.count(0)
    doubled = sum(1 for c in seen if c > 1)
    assert (missing, doubled) == (0, 0), f"{missing} lost, {doubled} delivered twice"
    assert result["out_of_order"] == 0
    assert result["processed"] == {"a": N, "b": N, "c": N}
    assert result["dropped"] == {"a": 0, "b": 0, "c": 0}
    assert result["errors"] == {"a": 0, "b": 0, "c": 0}
    assert result["leftovers"] == {"a": 0, "b": 0, "c": 0}
    assert result["report"] == {}


def test_the_stress_harness_itself_on_a_small_run() -> None:
    """The same checks on 2,000 messages, so a broken harness shows up outside -m slow."""
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        result = runner.run(pipeline(2_000, SEED))
    seen = result["seen"]
    assert isinstance(seen, bytearray)
    assert seen.count(1) == 2_000
    assert result["out_of_order"] == 0
    assert result["processed"] == {"a": 2_000, "b": 2_000, "c": 2_000}
    assert result["report"] == {}
