"""Streaming anomaly detection: an actor with persistent device state against batch jobs.

The workload: ``sensors`` sensors report readings; a reading is anomalous when it lies more
than 8 standard deviations from its sensor's rolling mean. Rolling statistics (count, mean,
M2 per sensor; the count capped at a window so old data fades) are merged per group of
events with the parallel Welford update, so the same vectorized code serves both designs:

- ``actor``: one ring kernel owns the statistics in device memory for its whole life. Each
  message carries a micro-batch of 64 events; the actor copies those events to the device,
  updates the statistics in place and copies back only the flags.
- ``batch``: the usual load-compute-store job. Events are collected into batches of 8,192;
  each batch copies the whole statistics table and the events to the device, computes, and
  copies the table and the flags back (the state lives on the host between batches).

Events arrive in chunks of 64, each stamped with its arrival time. Two runs per design:
``unpaced`` (as fast as the design accepts: throughput) and ``paced`` at a fixed arrival
rate, open loop (latency from each event's scheduled arrival to its verdict, so waiting for
a batch to fill counts, as it would in production). The transfer share is the fraction of
processing time spent in host<->device copies, timed around the backend's ``copy_to_*``
calls (with a synchronize on a GPU). On a machine without a GPU the "device" is the CPU
backend, whose copies are plain memory copies; on a GPU they cross PCIe.

Run ``python benchmarks/realtime_anomaly_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import percentiles, print_table, save_json
from _suite import chart_path, cuda_device_reason, pyplot, save_figure, summary_row

from pydotcompute import KernelContext, RingKernelRuntime, message, run
from pydotcompute.backends import get_backend

CHUNK = 64
BATCH = 8_192
WINDOW = 256.0
K_SIGMA = 8.0
MIN_SEEN = 8  # readings a sensor needs before it can be flagged
_ns = time.perf_counter_ns


class Detector:
    """Rolling per-sensor statistics on one backend; ``process`` flags a group of events.

    With ``persistent`` the statistics stay on the device between calls (the actor);
    otherwise each call copies the host table in and out (the batch job).
    """

    def __init__(self, backend: Any, sensors: int, persistent: bool) -> None:
        self.backend = backend
        self.xp = _array_module(backend)
        self.sensors = sensors
        self.persistent = persistent
        self.host_state = np.zeros((3, sensors))  # count, mean, M2
        self.dev_state = backend.copy_to_device(self.host_state)
        self.transfer_ns = 0
        self.total_ns = 0

    def _copy_in(self, a: np.ndarray) -> Any:
        t0 = _ns()
        out = self.backend.copy_to_device(a)
        self.backend.synchronize()
        self.transfer_ns += _ns() - t0
        return out

    def _copy_out(self, a: Any) -> np.ndarray:
        t0 = _ns()
        out = self.backend.copy_to_host(a)
        self.transfer_ns += _ns() - t0
        return np.asarray(out)

    def process(self, sensor: np.ndarray, value: np.ndarray) -> np.ndarray:
        t_start = _ns()
        xp = self.xp
        state = self.dev_state if self.persistent else self._copy_in(self.host_state)
        s, v = self._copy_in(sensor), self._copy_in(value)
        # only the sensors present in this group are read and written
        u, inv = xp.unique(s, return_inverse=True)
        count, mean, m2 = state[0, u], state[1, u], state[2, u]
        # flag against the statistics before this group
        std = xp.sqrt(m2 / xp.maximum(count - 1.0, 1.0))
        z = xp.abs(v - mean[inv]) / xp.maximum(std[inv], 1e-9)
        flags = (z > K_SIGMA) & (count[inv] > MIN_SEEN)
        # merge the group into the statistics (parallel Welford), count capped at WINDOW
        n_b = xp.bincount(inv, minlength=len(u)).astype(xp.float64)
        mean_b = xp.bincount(inv, weights=v, minlength=len(u)) / n_b
        dev = v - mean_b[inv]
        m2_b = xp.bincount(inv, weights=dev * dev, minlength=len(u))
        n_a = xp.minimum(count, WINDOW)
        m2_a = m2 * (n_a / xp.maximum(count, 1.0))
        n = n_a + n_b
        delta = mean_b - mean
        state[1, u] = mean + delta * n_b / n
        state[2, u] = m2_a + m2_b + delta * delta * n_a * n_b / n
        state[0, u] = n
        out = self._copy_out(flags)
        if not self.persistent:
            self.host_state = self._copy_out(state)
        self.total_ns += _ns() - t_start
        return out


def _array_module(backend: Any) -> Any:
    if backend.backend_type.value == "cuda":
        import cupy

        return cupy
    return np


def make_stream(sensors: int, events: int, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sensor = rng.integers(0, sensors, events).astype(np.int64)
    base = rng.uniform(10.0, 50.0, sensors)
    value = base[sensor] + rng.normal(0.0, 1.0, events)
    # spikes in the last quarter of the stream, when every sensor has some history
    spikes = rng.choice(np.arange(events * 3 // 4, events), max(1, events // 10_000), replace=False)
    value[spikes] += 20.0
    return {"sensor": sensor, "value": value, "spikes": spikes}


@message
class Chunk:
    first: int  # stream index of the chunk's first event
    sensor: np.ndarray
    value: np.ndarray
    arrival_ns: np.ndarray


@message
class Flags:
    first: int
    flags: np.ndarray
    arrival_ns: np.ndarray


def detector_actor(detector: Detector) -> Any:
    async def actor(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            c = await ctx.receive()
            flags = detector.process(c.sensor, c.value)
            await ctx.send(Flags(first=c.first, flags=flags, arrival_ns=c.arrival_ns))

    return actor


async def _arrivals(stream: dict[str, np.ndarray], rate: float | None) -> Any:
    """Yield (first index, sensors, values, arrival stamps) per chunk, paced at ``rate``
    events/s when given (stamps are then the scheduled arrival times: open loop)."""
    n = len(stream["sensor"])
    t0 = _ns()
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        if rate is None:
            stamps = np.full(hi - lo, _ns(), dtype=np.int64)
        else:
            due = t0 + (np.arange(lo, hi) / rate * 1e9).astype(np.int64)
            wait = (int(due[-1]) - _ns()) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            stamps = due
        yield lo, stream["sensor"][lo:hi], stream["value"][lo:hi], stamps


class _Tally:
    def __init__(self) -> None:
        self.latencies: list[np.ndarray] = []
        self.flagged: list[np.ndarray] = []

    def add(self, first: int, flags: np.ndarray, stamps: np.ndarray) -> None:
        self.latencies.append(_ns() - stamps)
        hits = np.flatnonzero(flags)
        if hits.size:
            self.flagged.append(hits + first)


async def run_actor(
    stream: dict[str, np.ndarray], sensors: int, backend: Any, rate: float | None
) -> dict[str, Any]:
    det = Detector(backend, sensors, persistent=True)
    tally = _Tally()
    async with RingKernelRuntime() as rt:
        await rt.launch(
            "detector", detector_actor(det), input_type=Chunk, output_type=Flags, queue_size=1024
        )
        await rt.activate("detector")

        async def consume() -> None:
            for _ in range(-(-len(stream["sensor"]) // CHUNK)):
                f = await rt.receive("detector")
                tally.add(f.first, f.flags, f.arrival_ns)

        consumer = asyncio.ensure_future(consume())
        t0 = time.perf_counter()
        async for first, sensor, value, stamps in _arrivals(stream, rate):
            await rt.send(
                "detector", Chunk(first=first, sensor=sensor, value=value, arrival_ns=stamps)
            )
        await consumer
        elapsed = time.perf_counter() - t0
    return _result(tally, elapsed, det, stream)


async def run_batch(
    stream: dict[str, np.ndarray], sensors: int, backend: Any, rate: float | None
) -> dict[str, Any]:
    det = Detector(backend, sensors, persistent=False)
    tally = _Tally()
    pending: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def flush() -> None:
        sensor = np.concatenate([p[1] for p in pending])
        value = np.concatenate([p[2] for p in pending])
        stamps = np.concatenate([p[3] for p in pending])
        tally.add(pending[0][0], det.process(sensor, value), stamps)
        pending.clear()

    t0 = time.perf_counter()
    count = 0
    async for chunk in _arrivals(stream, rate):
        pending.append(chunk)
        count += len(chunk[1])
        if count >= BATCH:
            flush()
            count = 0
    if pending:
        flush()
    elapsed = time.perf_counter() - t0
    return _result(tally, elapsed, det, stream)


def _result(
    tally: _Tally, elapsed: float, det: Detector, stream: dict[str, np.ndarray]
) -> dict[str, Any]:
    events = len(stream["sensor"])
    flagged = set(np.concatenate(tally.flagged).tolist()) if tally.flagged else set()
    spikes = {int(i) for i in stream["spikes"] if i < events}
    return {
        "latency": percentiles(np.concatenate(tally.latencies).tolist()),
        "events_per_s": events / elapsed,
        "transfer_share": det.transfer_ns / max(det.total_ns, 1),
        "caught": len(flagged & spikes),
        "false_alarms": len(flagged - spikes),
        "spikes": len(spikes),
    }


def measure(quick: bool) -> dict[str, Any]:
    sensors = 5_000 if quick else 50_000
    events = 200_000 if quick else 2_000_000
    rate = 100_000.0
    paced_events = 40_000 if quick else 500_000
    reason = cuda_device_reason()
    backend = get_backend("cuda" if reason is None else "cpu")
    stream = make_stream(sensors, events)
    paced = {k: v[:paced_events] for k, v in stream.items()}
    out: dict[str, Any] = {
        "sensors": sensors,
        "events": events,
        "backend": backend.name if hasattr(backend, "name") else backend.backend_type.value,
        "rate": rate,
        "paced_events": paced_events,
    }
    for design, fn in (("actor", run_actor), ("batch", run_batch)):
        out[design] = {
            "unpaced": run(fn(stream, sensors, backend, None)),
            "paced": run(fn(paced, sensors, backend, rate)),
        }
        print(f"  {design}: done", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer events (seconds)")
    ap.add_argument("--json", default=None, help="where to save results")
    args = ap.parse_args(argv)
    print("streaming anomaly detection (progress):")
    r = measure(args.quick)
    rows = []
    for mode in ("unpaced", "paced"):
        base = r["batch"][mode]
        for design in ("batch", "actor"):
            m = r[design][mode]
            row = {
                "run": f"unpaced, {r['events']:,} events"
                if mode == "unpaced"
                else f"paced {r['rate']:,.0f} ev/s, {r['paced_events']:,} events",
                "design": design,
                "events/s": m["events_per_s"],
                "events/s ratio": m["events_per_s"] / base["events_per_s"],
                "transfer share": m["transfer_share"],
                "caught": f"{m['caught']} / {m['spikes']}",
                "false alarms": m["false_alarms"],
            }
            if mode == "paced":  # unpaced latency is only queueing: not shown
                row.update(
                    {
                        "p50 us": m["latency"]["p50_us"],
                        "p99 us": m["latency"]["p99_us"],
                        "p50 ratio": m["latency"]["p50_us"] / base["latency"]["p50_us"],
                    }
                )
            rows.append(row)
    print_table(
        f"Anomaly detection, {r['sensors']:,} sensors, backend {r['backend']}; latency = "
        "scheduled arrival -> verdict; ratios = design / batch job; caught = injected spikes "
        "flagged",
        rows,
        [
            "run",
            "design",
            "p50 us",
            "p99 us",
            "p50 ratio",
            "events/s",
            "events/s ratio",
            "transfer share",
            "caught",
            "false alarms",
        ],
    )
    a, b = r["actor"], r["batch"]
    summary = [
        summary_row(
            "actor p50 latency, paced",
            a["paced"]["latency"]["p50_us"],
            "us",
            higher_is_better=False,
            baseline=b["paced"]["latency"]["p50_us"],
            baseline_name="batch job",
        ),
        summary_row(
            "actor throughput, unpaced",
            a["unpaced"]["events_per_s"],
            "events/s",
            higher_is_better=True,
            baseline=b["unpaced"]["events_per_s"],
            baseline_name="batch job",
        ),
        summary_row(
            "actor transfer share",
            a["unpaced"]["transfer_share"],
            "share",
            higher_is_better=False,
            baseline=b["unpaced"]["transfer_share"],
            baseline_name="batch job",
        ),
    ]
    _chart(r, args.json)
    save_json("realtime_anomaly", {"quick": args.quick, **r, "summary": summary}, args.json)
    return r


def _chart(r: dict[str, Any], json_path: str | None) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    labels, p50, p99 = [], [], []
    for design in ("batch", "actor"):
        lat = r[design]["paced"]["latency"]
        labels.append(design)
        p50.append(lat["p50_us"])
        p99.append(lat["p99_us"])
    x = np.arange(len(labels))
    ax.bar(x - 0.2, p50, 0.4, label="p50")
    ax.bar(x + 0.2, p99, 0.4, label="p99")
    ax.set_xticks(x, labels)
    ax.set_yscale("log")
    ax.set_ylabel("event -> verdict latency (us, log scale)")
    ax.set_title(f"Paced at {r['rate']:,.0f} events/s")
    ax.legend()
    save_figure(fig, chart_path("realtime_anomaly", json_path))


if __name__ == "__main__":
    main()
