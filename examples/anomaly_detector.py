"""A streaming anomaly detector: one actor keeps rolling statistics for every sensor.

Each tick, every sensor reports one reading; the ``Tick`` message carries the whole vector.
The ``detector`` actor owns a ring of the last ``WINDOW`` ticks plus running sums and sums
of squares per sensor, all kept across messages, so each tick costs O(sensors) however long
the window is. A reading further than ``K_SIGMA`` standard deviations from its sensor's
rolling mean is reported in an ``Alerts`` message.

The stream carries injected faults (a spike on one sensor at one tick); at the end the
example prints how many it caught, the false alarms, the per-tick latency from the kernel's
telemetry and the sustained throughput in readings per second.

Run: ``python examples/anomaly_detector.py [--sensors S] [--ticks T]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np

from pydotcompute import KernelContext, RingKernelRuntime, message, run
from pydotcompute.exceptions import KernelStateError

WINDOW = 64
K_SIGMA = 6.0


@message
class Tick:
    t: int
    values: np.ndarray  # one float per sensor


@message
class Alerts:
    t: int
    sensors: np.ndarray  # indices of the sensors that looked anomalous
    z: np.ndarray


def make_detector(n_sensors: int) -> Callable[[KernelContext], Awaitable[None]]:
    async def detector(ctx: KernelContext) -> None:
        # Persistent state, allocated once and updated in place for every tick.
        window = np.zeros((WINDOW, n_sensors))
        total = np.zeros(n_sensors)
        total_sq = np.zeros(n_sensors)
        seen = 0
        while not ctx.should_terminate:
            tick = await ctx.receive()
            x = tick.values
            if seen >= WINDOW:
                mean = total / WINDOW
                var = np.maximum(total_sq / WINDOW - mean * mean, 1e-12)
                z = (x - mean) / np.sqrt(var)
                hits = np.flatnonzero(np.abs(z) > K_SIGMA)
                if hits.size:
                    await ctx.send(Alerts(t=tick.t, sensors=hits, z=z[hits]))
            slot = seen % WINDOW
            old = window[slot]
            total += x - old
            total_sq += x * x - old * old
            window[slot] = x
            seen += 1

    return detector


async def main(n_sensors: int = 1_000, ticks: int = 2_000, faults: int = 40) -> dict[str, float]:
    rng = np.random.default_rng(3)
    base = rng.uniform(10, 50, n_sensors)
    fault_t = rng.choice(np.arange(WINDOW + 1, ticks), faults, replace=False)
    fault_s = rng.integers(0, n_sensors, faults)
    injected = set(zip(fault_t.tolist(), fault_s.tolist(), strict=True))

    async with RingKernelRuntime() as runtime:
        await runtime.launch(
            "detector",
            make_detector(n_sensors),
            input_type=Tick,
            output_type=Alerts,
            queue_size=256,
        )
        await runtime.activate("detector")
        found: set[tuple[int, int]] = set()

        async def collect() -> None:
            # Alerts are read while the stream runs, until the outbox is closed and drained.
            while True:
                try:
                    alerts = await runtime.receive("detector")
                except KernelStateError:
                    return
                found.update((alerts.t, int(s)) for s in alerts.sensors)

        collector = asyncio.create_task(collect())
        t0 = time.perf_counter()
        for t in range(ticks):
            values = base + rng.normal(0.0, 1.0, n_sensors)
            hit = fault_s[fault_t == t]
            values[hit] += 15.0
            await runtime.send("detector", Tick(t=t, values=values))
        await runtime.terminate("detector")  # processes every queued tick first
        await collector
        elapsed = time.perf_counter() - t0
        tel = runtime.get_telemetry("detector")

    caught = len(found & injected)
    false_alarms = len(found - injected)
    readings = n_sensors * ticks
    print(
        f"{n_sensors:,} sensors x {ticks:,} ticks = {readings:,} readings, "
        f"rolling window {WINDOW}, threshold {K_SIGMA} sigma"
    )
    print(f"  caught {caught} of {len(injected)} injected faults, {false_alarms} false alarm(s)")
    print(
        f"  per tick in the actor: p50 {tel.p50_latency_ns / 1e3:.0f} us, "
        f"p99 {tel.p99_latency_ns / 1e3:.0f} us ({tel.messages_processed:,} ticks)"
    )
    print(
        f"  throughput: {readings / elapsed / 1e6:.1f} M readings/s "
        f"({ticks / elapsed:,.0f} ticks/s, including generating the data)"
    )
    return {"caught": caught, "injected": len(injected), "false_alarms": false_alarms}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sensors", type=int, default=1_000)
    ap.add_argument("--ticks", type=int, default=2_000)
    args = ap.parse_args()
    run(main(args.sensors, args.ticks))
