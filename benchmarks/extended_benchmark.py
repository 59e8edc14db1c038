"""Every execution tier's round trip and throughput beside its floor, as one table.

What it measures (one echo actor per tier; a message is built per trip):

- tier 1, asyncio: ``runtime.send`` -> actor -> ``runtime.receive`` against one task
  answering another through two ``asyncio.Queue`` objects (the measurement functions of
  ``queue_latency_benchmark.py``, reused);
- tier 2, a thread: ``ThreadedRingKernel.send``/``receive`` and the same actor hosted in the
  runtime (``tier="thread"``), against two threads playing ping-pong over
  ``queue.SimpleQueue`` (the floor);
- tier 3, a process: ``CythonRingKernel`` (messages serialized over a shared-memory ring)
  and the runtime-hosted ``tier="process"``, against two processes busy-polling shared
  memory with MessagePack encoding both ways (the floor: the least a serialized
  cross-process round trip can cost from Python);
- GPU: taken from ``gpu_ring_kernel_benchmark.py`` when a CUDA device is present;
- cluster (Ray): taken from ``ray_benchmark.py`` in full runs (Ray takes seconds to start).

Round trips are p50 / p95 / p99 of per-trip ``perf_counter_ns``; throughput is pipelined (a
producer keeps the actor busy while the caller collects replies). Ratios are ours / floor:
for latency lower is better, for throughput higher is better. A tier that cannot run here
gets a row saying why. The round-trip floors of tiers 2 and 3 are measured by the functions
of ``tier_latency_benchmark.py`` when it is present (its SimpleQueue ping-pong and its raw
shared-memory ring with MessagePack); ``thread_floor_round_trip`` and
``process_floor_round_trip`` below are the fallbacks.

Run ``python benchmarks/extended_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec
from _common import loop_factories, percentiles, print_table, run_on, save_json
from _suite import (
    adapt_summary,
    chart_path,
    cuda_device_reason,
    json_flag,
    pyplot,
    save_figure,
    sibling,
    summary_row,
)
from queue_latency_benchmark import (
    Ping,
    Pong,
    actor_pipeline,
    actor_round_trip,
    floor_pipeline,
    floor_round_trip,
)

from pydotcompute import RingKernelRuntime

_ns = time.perf_counter_ns
HERE = Path(__file__).resolve().parent


# --- actors for tiers 2 and 3 (module level: the process tier imports them by name) ---------


def echo_sync(ctx: Any) -> None:
    """Tier 2/3 echo actor: plain function, blocking receive."""
    while not ctx.should_terminate:
        msg = ctx.receive()
        if msg is None:
            continue
        ctx.send(Pong(value=msg.value))


# --- tier 2 floors and measurements -----------------------------------------------------------


def thread_floor_round_trip(n: int) -> list[int]:
    """Two threads, two ``SimpleQueue`` objects: the least a thread round trip costs."""
    q_in: queue.SimpleQueue[Any] = queue.SimpleQueue()
    q_out: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def server() -> None:
        while (item := q_in.get()) is not None:
            q_out.put(item)

    t = threading.Thread(target=server, daemon=True)
    t.start()
    samples = []
    for i in range(n):
        t0 = _ns()
        q_in.put(("ping", i))
        q_out.get()
        samples.append(_ns() - t0)
    q_in.put(None)
    t.join()
    return samples


def thread_floor_pipeline(n: int) -> float:
    q_in: queue.SimpleQueue[Any] = queue.SimpleQueue()
    q_out: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def server() -> None:
        while (item := q_in.get()) is not None:
            q_out.put(item)

    t = threading.Thread(target=server, daemon=True)
    t.start()
    t0 = time.perf_counter()
    for i in range(n):
        q_in.put(("ping", i))
    for _ in range(n):
        q_out.get()
    dt = time.perf_counter() - t0
    q_in.put(None)
    t.join()
    return n / dt


def _sync_round_trip(kernel: Any, n: int) -> list[int]:
    send, receive = kernel.send, kernel.receive
    samples = []
    for i in range(n):
        t0 = _ns()
        send(Ping(value=i))
        receive(timeout=10.0)
        samples.append(_ns() - t0)
    return samples


def _sync_pipeline(kernel: Any, n: int) -> float:
    def producer() -> None:
        for i in range(n):
            kernel.send(Ping(value=i), timeout=30.0)

    t0 = time.perf_counter()
    t = threading.Thread(target=producer, daemon=True)
    t.start()
    for _ in range(n):
        kernel.receive(timeout=30.0)
    dt = time.perf_counter() - t0
    t.join()
    return n / dt


# --- tier 3 floor and measurements ------------------------------------------------------------

# The floor's child is a bare interpreter (``python -c``) importing only msgspec, mapping a
# small file in /dev/shm: one slot each way, busy-polled by both sides.
_FLOOR_CHILD = r"""
import mmap, sys
import msgspec
with open(sys.argv[1], "r+b") as f:
    mm = mmap.mmap(f.fileno(), 4096)
ctl = memoryview(mm)[:32].cast("q")
enc, dec = msgspec.msgpack.encode, msgspec.msgpack.decode
last = 0
while True:
    seq = ctl[0]
    if seq == last:
        continue
    if seq < 0:
        break
    n = ctl[1]
    (value,) = dec(mm[64:64 + n])
    out = enc((value,))
    mm[320:320 + len(out)] = out
    ctl[3] = len(out)
    ctl[2] = seq
    last = seq
ctl.release()
mm.close()
"""


def process_floor_round_trip(n: int) -> list[int]:
    """Two processes busy-polling a shared-memory slot, msgspec encode+decode both ways."""
    import mmap

    shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.NamedTemporaryFile(dir=shm_dir, prefix="pdc-floor-") as f:
        f.write(bytes(4096))
        f.flush()
        mm = mmap.mmap(f.fileno(), 4096)
        ctl = memoryview(mm)[:32].cast("q")
        child = subprocess.Popen([sys.executable, "-c", _FLOOR_CHILD, f.name])
        enc, dec = msgspec.msgpack.encode, msgspec.msgpack.decode
        samples = []
        try:
            for i in range(1, n + 201):
                t0 = _ns()
                out = enc((i,))
                mm[64 : 64 + len(out)] = out
                ctl[1] = len(out)
                ctl[0] = i
                deadline = time.monotonic() + 10
                while ctl[2] != i:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the floor's child process stopped answering")
                m = ctl[3]
                dec(mm[320 : 320 + m])
                if i > 200:  # the first trips warm up the child
                    samples.append(_ns() - t0)
        finally:
            ctl[0] = -1
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            ctl.release()
            mm.close()
    return samples


def sync_kernel_measure(tier: str, n_rt: int, n_tp: int) -> tuple[list[int], float]:
    """Round-trip samples and pipelined msg/s of a ThreadedRingKernel or CythonRingKernel."""
    from pydotcompute.ring_kernels import CythonRingKernel, ThreadedRingKernel

    cls = ThreadedRingKernel if tier == "thread" else CythonRingKernel
    with cls(f"bench-{tier}", echo_sync) as kernel:
        _sync_round_trip(kernel, min(n_rt, 200))
        samples = _sync_round_trip(kernel, n_rt)
        rate = _sync_pipeline(kernel, n_tp)
    return samples, rate


# --- hosted tiers through the runtime ---------------------------------------------------------


async def hosted_measure(tier: str, n_rt: int, n_tp: int) -> tuple[list[int], float]:
    """The same echo actor launched in the runtime with ``tier=``: round trip, then msg/s."""
    import asyncio

    async with RingKernelRuntime() as rt:
        await rt.launch("echo", echo_sync, input_type=Ping, output_type=Pong, tier=tier)
        await rt.activate("echo")
        samples = []
        for i in range(n_rt + 100):
            t0 = _ns()
            await rt.send("echo", Ping(value=i))
            await rt.receive("echo", timeout=10.0)
            if i >= 100:
                samples.append(_ns() - t0)

        async def producer() -> None:
            for i in range(n_tp):
                await rt.send("echo", Ping(value=i))

        t0 = time.perf_counter()
        prod = asyncio.ensure_future(producer())
        for _ in range(n_tp):
            await rt.receive("echo", timeout=30.0)
        rate = n_tp / (time.perf_counter() - t0)
        await prod
    return samples, rate


# --- measuring everything ---------------------------------------------------------------------


def _tier_latency() -> Any:
    """tier_latency_benchmark.py as a module, or None when it is absent or cannot load."""
    try:
        return sibling("tier_latency_benchmark")
    except Exception:
        return None


def tier2_floor(n: int) -> tuple[list[int], str]:
    """SimpleQueue ping-pong samples: tier_latency_benchmark's measurement when present."""
    fn = getattr(_tier_latency(), "_thread_ping_pong", None)
    if callable(fn):
        return fn(queue.SimpleQueue, n, min(500, n // 10)), "tier_latency_benchmark"
    return thread_floor_round_trip(n), "extended_benchmark"


def tier3_floor(n: int) -> tuple[list[int], str]:
    """Two processes busy-polling shared memory, MessagePack both ways: the raw shared-memory
    ring of tier_latency_benchmark when present, else a one-slot mapping of our own."""
    fn = getattr(_tier_latency(), "_raw_ring_rt", None)
    if callable(fn):
        return fn(n, min(500, n // 10), True), "tier_latency_benchmark"
    return process_floor_round_trip(n), "extended_benchmark"


def _row(
    tier: str,
    path: str,
    samples: list[int] | None,
    floor: dict[str, Any] | None,
    rate: float | None,
    note: str | None = None,
) -> dict[str, Any]:
    row: dict[str, Any] = {"tier": tier, "path": path, "note": note}
    if samples:
        p = percentiles(samples)
        row.update(
            {
                "p50 us": p["p50_us"],
                "p95 us": p["p95_us"],
                "p99 us": p["p99_us"],
                "max us": p["max_us"],
                "trips": len(samples),
            }
        )
        base = floor if floor is not None else row
        if base.get("p50 us"):
            row["p50 ratio"] = p["p50_us"] / base["p50 us"]
            row["p99 ratio"] = p["p99_us"] / base["p99 us"]
    if rate is not None:
        row["msg/s"] = rate
        base_rate = (floor if floor is not None else row).get("msg/s")
        if base_rate:
            row["msg/s ratio"] = rate / base_rate
    return row


def _from_sibling(script: str, quick: bool, unit: str = "us") -> tuple[list[dict[str, Any]], str]:
    """Run another benchmark script and return its summary rows in ``unit``."""
    path = HERE / f"{script}.py"
    if not path.exists():
        return [], f"not available: benchmarks/{script}.py is not in this tree"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        args = [sys.executable, str(path), json_flag(path), str(out)]
        args += ["--quick"] if quick else []
        proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return [], f"not available: {script} exited {proc.returncode}: {tail[0]}"[:160]
        data = json.loads(out.read_text())
    summary = data.get("summary") or adapt_summary(script.removesuffix("_benchmark"), data)
    rows = [r for r in summary if r.get("unit") == unit]
    return rows, "" if rows else f"not available: {script} reported no round-trip rows"


def measure(quick: bool) -> dict[str, Any]:
    n_rt = 2_000 if quick else 20_000
    n_tp = 20_000 if quick else 200_000
    n_proc = 1_000 if quick else 10_000
    loop_name, factory = loop_factories()[0]
    rows: list[dict[str, Any]] = []
    samples: dict[str, list[int]] = {}

    def add(tier: str, path: str, floor_path: str | None, fn: Callable[[], Any]) -> None:
        """Run ``fn`` -> (samples | None, msg/s | None) and add its row (or why it failed)."""
        try:
            trips, rate = fn()
            note = None
        except Exception as exc:  # a tier that cannot run here becomes a 'not available' row
            trips, rate = None, None
            note = f"not available: {type(exc).__name__}: {exc}"[:160]
        floor = next((r for r in rows if r["tier"] == tier and r["path"] == floor_path), None)
        rows.append(_row(tier, path, trips, floor, rate, note))
        if trips:
            samples[f"{tier}: {path}"] = trips

    # tier 1: the functions of queue_latency_benchmark.py
    async def tier1_floor() -> tuple[list[int], float]:
        await floor_round_trip(300)
        return await floor_round_trip(n_rt), await floor_pipeline(n_tp)

    async def tier1_actor() -> tuple[list[int], float]:
        await actor_round_trip(300)
        return await actor_round_trip(n_rt), await actor_pipeline(n_tp)

    t1_floor = f"floor: asyncio.Queue ({loop_name})"
    add("1 asyncio", t1_floor, None, lambda: run_on(factory, tier1_floor()))
    add("1 asyncio", "RingKernelRuntime actor", t1_floor, lambda: run_on(factory, tier1_actor()))

    # tier 2
    t2_floor = "floor: SimpleQueue ping-pong"
    sources: dict[str, str] = {}

    def t2() -> tuple[list[int], float]:
        trips, sources["tier 2 floor"] = tier2_floor(n_rt)
        return trips, thread_floor_pipeline(n_tp)

    add("2 thread", t2_floor, None, t2)
    add(
        "2 thread",
        "ThreadedRingKernel",
        t2_floor,
        lambda: sync_kernel_measure("thread", n_rt, n_tp // 2),
    )
    add(
        "2 thread",
        "runtime, tier='thread'",
        t2_floor,
        lambda: run_on(factory, hosted_measure("thread", n_rt, n_tp // 4)),
    )

    # tier 3
    t3_floor = "floor: shared-memory busy poll + MessagePack"

    def t3() -> tuple[list[int], None]:
        trips, sources["tier 3 floor"] = tier3_floor(n_proc)
        return trips, None

    add("3 process", t3_floor, None, t3)
    add(
        "3 process",
        "CythonRingKernel",
        t3_floor,
        lambda: sync_kernel_measure("process", n_proc, n_tp // 2),
    )
    if quick:
        rows.append(
            _row(
                "3 process",
                "runtime, tier='process'",
                None,
                None,
                None,
                "skipped in --quick (another process start)",
            )
        )
    else:
        add(
            "3 process",
            "runtime, tier='process'",
            t3_floor,
            lambda: run_on(factory, hosted_measure("process", n_proc, n_tp // 4)),
        )

    # GPU and cluster: rows reported by their own scripts
    reason = cuda_device_reason()
    if reason is not None:
        rows.append(
            _row("GPU", "persistent CUDA kernel", None, None, None, f"not available: {reason}")
        )
    else:
        rows.extend(
            _rows_from_sibling("GPU", "persistent CUDA kernel", "gpu_ring_kernel_benchmark", quick)
        )
    if quick:
        rows.append(
            _row(
                "cluster",
                "Ray actors",
                None,
                None,
                None,
                "skipped in --quick (Ray takes seconds to start)",
            )
        )
    else:
        rows.extend(_rows_from_sibling("cluster", "Ray actors", "ray_benchmark", quick))
    return {"loop": loop_name, "rows": rows, "samples": samples, "floor_sources": sources}


def _rows_from_sibling(tier: str, path: str, script: str, quick: bool) -> list[dict[str, Any]]:
    found, why = _from_sibling(script, quick)
    rows = [
        {
            "tier": tier,
            "path": r["name"],
            "p50 us": r["value"],
            "p50 ratio": r.get("ratio"),
            "note": r.get("note"),
        }
        for r in found
    ]
    return rows or [_row(tier, path, None, None, None, why)]


_TARGETS = {
    ("1 asyncio", "RingKernelRuntime actor", "us"): "ratio <= 1.0",
    ("1 asyncio", "RingKernelRuntime actor", "msg/s"): "ratio >= 0.9",
    ("2 thread", "ThreadedRingKernel", "us"): "ratio <= 1.5",
    ("3 process", "CythonRingKernel", "us"): "<= 2.0 us",
}


#: A floor is a lower bound: one more than this many times slower than the fastest path it
#: bounds did not measure the mechanism (a quick run's child still sharing the parent's
#: core, say). Its ratios would be meaningless (0.0014 once), so the summary drops it.
UNSETTLED_FLOOR_FACTOR = 5.0


def _settled_floors(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The floor row of each tier, leaving out floors that are clearly unsettled (returned
    as tier -> why)."""
    floors: dict[str, dict[str, Any]] = {}
    fastest: dict[str, float] = {}
    for r in rows:
        if r["path"].startswith("floor"):
            floors[r["tier"]] = r
        elif r.get("p50 us"):
            fastest[r["tier"]] = min(fastest.get(r["tier"], float("inf")), r["p50 us"])
    dropped: dict[str, str] = {}
    for tier, floor in list(floors.items()):
        p50 = floor.get("p50 us")
        if p50 and tier in fastest and p50 > UNSETTLED_FLOOR_FACTOR * fastest[tier]:
            del floors[tier]
            dropped[tier] = (
                f"floor dropped: it read {p50:,.0f} us, over {UNSETTLED_FLOOR_FACTOR:g}x what "
                "it bounds (its child had not settled on a core)"
            )
    return floors, dropped


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    floors, dropped = _settled_floors(rows)
    for r in rows:
        if r["path"].startswith("floor"):
            continue
        floor = floors.get(r["tier"], {})
        vs = str(floor.get("path", "")).removeprefix("floor: ") or None
        if r["tier"] in dropped:
            r = {**r, "note": "; ".join(filter(None, [r.get("note"), dropped[r["tier"]]]))}
        key = f"tier {r['tier']}: {r['path']}"
        if r.get("p50 us") is None and r.get("msg/s") is None:  # could not run here
            out.append(summary_row(key, None, "us", higher_is_better=False, note=r.get("note")))
            continue
        out.append(
            summary_row(
                key if key.endswith("round trip p50") else f"{key}, round trip p50",
                r.get("p50 us"),
                "us",
                higher_is_better=False,
                baseline=floor.get("p50 us"),
                baseline_name=vs,
                target=_TARGETS.get((r["tier"], r["path"], "us")),
                note=r.get("note"),
            )
        )
        if r.get("msg/s") is not None:
            out.append(
                summary_row(
                    f"{key}, throughput",
                    r.get("msg/s"),
                    "msg/s",
                    higher_is_better=True,
                    baseline=floor.get("msg/s"),
                    baseline_name=vs,
                    target=_TARGETS.get((r["tier"], r["path"], "msg/s")),
                )
            )
    return out


def _chart(result: dict[str, Any], json_path: str | None) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, samples in result["samples"].items():
        if samples:
            us = sorted(x / 1000 for x in samples)
            ax.plot(us, [i / len(us) for i in range(len(us))], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("round trip (us, log scale)")
    ax.set_ylabel("fraction of trips")
    ax.set_title("Round-trip latency distribution by tier")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, chart_path("extended", json_path))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (seconds, not minutes)")
    ap.add_argument("--json", default=None, help="where to save results")
    args = ap.parse_args(argv)

    result = measure(args.quick)
    print_table(
        f"Round trip and pipelined throughput per tier ({result['loop']}); "
        "ratios = ours / floor of the same tier (latency: lower is better; msg/s: higher)",
        result["rows"],
        [
            "tier",
            "path",
            "p50 us",
            "p95 us",
            "p99 us",
            "p50 ratio",
            "p99 ratio",
            "msg/s",
            "msg/s ratio",
            "note",
        ],
    )
    _chart(result, args.json)
    save_json(
        "extended",
        {
            "quick": args.quick,
            "loop": result["loop"],
            "rows": result["rows"],
            "floor_sources": result["floor_sources"],
            "summary": _summary(result["rows"]),
        },
        args.json,
    )
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
