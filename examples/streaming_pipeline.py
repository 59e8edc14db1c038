"""A three-stage streaming pipeline with back-pressure and a clean shutdown.

    producer --> parse --> score --> alert --> consumer

- ``parse`` turns raw CSV lines (``"seq,sensor,value"``) into typed ``Reading`` messages;
- ``score`` keeps a running mean and variance per sensor (state that lives in the actor)
  and attaches a z-score;
- ``alert`` passes on only readings with ``|z| > 4`` and counts the rest.

The stages are joined with ``runtime.connect``, so a message goes from one actor's
``ctx.send`` straight into the next actor's inbox. Every inbox holds at most 64 messages
and uses the ``block`` back-pressure policy: when ``score`` falls behind, ``parse``'s sends
wait, then the producer's sends wait, and no queue ever grows past its bound. Shutdown
terminates the stages in order (producer side first); each ``terminate`` lets its actor
drain its inbox into the next stage, so every message is accounted for.

Run: ``python examples/streaming_pipeline.py [--events N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from typing import Any

from pydotcompute import KernelContext, RingKernelRuntime, message, run
from pydotcompute.exceptions import KernelStateError

QUEUE_SIZE = 64
Z_THRESHOLD = 4.0


@message
class RawLine:
    text: str


@message
class Reading:
    seq: int
    sensor: int
    value: float


@message
class Scored:
    seq: int
    sensor: int
    value: float
    z: float


async def parse(ctx: KernelContext) -> None:
    """Stage 1: text -> typed readings."""
    while not ctx.should_terminate:
        line = await ctx.receive()
        seq, sensor, value = line.text.split(",")
        await ctx.send(Reading(seq=int(seq), sensor=int(sensor), value=float(value)))


async def score(ctx: KernelContext) -> None:
    """Stage 2: running mean/variance per sensor (Welford), z-score of each reading."""
    stats: dict[int, tuple[int, float, float]] = {}  # sensor -> (count, mean, M2)
    while not ctx.should_terminate:
        r = await ctx.receive()
        n, mean, m2 = stats.get(r.sensor, (0, 0.0, 0.0))
        std = math.sqrt(m2 / (n - 1)) if n > 1 else 0.0
        z = (r.value - mean) / std if std > 0 else 0.0
        n += 1
        delta = r.value - mean
        mean += delta / n
        m2 += delta * (r.value - mean)
        stats[r.sensor] = (n, mean, m2)
        await ctx.send(Scored(seq=r.seq, sensor=r.sensor, value=r.value, z=z))


async def alert(ctx: KernelContext) -> None:
    """Stage 3: forward anomalies only (after a short warm-up per sensor)."""
    seen: dict[int, int] = {}
    while not ctx.should_terminate:
        s = await ctx.receive()
        seen[s.sensor] = seen.get(s.sensor, 0) + 1
        if seen[s.sensor] > 30 and abs(s.z) > Z_THRESHOLD:
            await ctx.send(s)


def make_lines(n: int, sensors: int, spikes: int, seed: int = 7) -> tuple[list[str], set[int]]:
    """``n`` CSV lines of Gaussian readings with ``spikes`` injected outliers."""
    rng = random.Random(seed)
    spike_at = set(rng.sample(range(sensors * 40, n), spikes))
    lines = []
    for i in range(n):
        sensor = i % sensors
        value = rng.gauss(20.0 + sensor, 1.0)
        if i in spike_at:
            value += rng.choice((-1, 1)) * 12.0
        lines.append(f"{i},{sensor},{value:.4f}")
    return lines, spike_at


async def main(events: int = 20_000, sensors: int = 8, spikes: int = 25) -> dict[str, Any]:
    lines, injected = make_lines(events, sensors, spikes)
    async with RingKernelRuntime() as runtime:
        for kernel_id, fn, in_t, out_t in (
            ("parse", parse, RawLine, Reading),
            ("score", score, Reading, Scored),
            ("alert", alert, Scored, Scored),
        ):
            await runtime.launch(
                kernel_id,
                fn,
                input_type=in_t,
                output_type=out_t,
                queue_size=QUEUE_SIZE,
                backpressure="block",
            )
        runtime.connect("parse", "score")
        runtime.connect("score", "alert")
        for kernel_id in ("parse", "score", "alert"):
            await runtime.activate(kernel_id)

        alerts: list[Scored] = []

        async def consume() -> None:
            # Reads until the last stage is terminated and its outbox is drained.
            while True:
                try:
                    alerts.append(await runtime.receive("alert"))
                except KernelStateError:
                    return

        consumer = asyncio.create_task(consume())
        blocked_sends = 0
        t0 = time.perf_counter()
        for text in lines:
            inbox = runtime.get_kernel("parse").inbox
            if inbox is not None and inbox.full:
                blocked_sends += 1  # this send will wait for room: back-pressure at work
            await runtime.send("parse", RawLine(text=text))

        # Clean shutdown, upstream first: each stage drains into the next.
        undelivered = {}
        for kernel_id in ("parse", "score", "alert"):
            left = await runtime.terminate(kernel_id)
            undelivered[kernel_id] = len(left)
        await consumer
        elapsed = time.perf_counter() - t0

        peaks = {}
        for kernel_id in ("parse", "score", "alert"):
            inbox = runtime.get_kernel(kernel_id).inbox
            assert inbox is not None
            peaks[kernel_id] = inbox.statistics().peak_size
        processed = {
            kernel_id: runtime.get_telemetry(kernel_id).messages_processed
            for kernel_id in ("parse", "score", "alert")
        }

    flagged = len(alerts)
    caught = len({a.seq for a in alerts} & injected)
    print(f"streamed {events:,} readings from {sensors} sensors through parse -> score -> alert")
    print(f"  {events / elapsed:,.0f} events/s end to end ({elapsed * 1e3:.0f} ms)")
    print(f"  processed per stage: {processed}")
    print(
        f"  back-pressure: inbox bound {QUEUE_SIZE}, peak depth per stage {peaks}, "
        f"{blocked_sends:,} producer sends found the first inbox full and waited"
    )
    print(f"  anomalies flagged: {flagged}, of which {caught} of the {len(injected)} injected")
    print(f"  clean shutdown: undelivered messages per stage {undelivered}")
    return {
        "events": events,
        "alerts": flagged,
        "injected": len(injected),
        "caught": caught,
        "processed": processed,
        "peaks": peaks,
        "undelivered": undelivered,
        "blocked_sends": blocked_sends,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    args = ap.parse_args()
    run(main(args.events))
