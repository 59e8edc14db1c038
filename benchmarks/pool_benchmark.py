"""Worker pools: a CPU-bound handler with 1 and 2 replicas behind one kernel id.

The handler is a pure-Python loop calibrated to about 1 ms a message (it holds the GIL
throughout). Each tier is measured with ``replicas=1`` (the same-run baseline) and
``replicas=2``, with every message in flight at once (send all, then receive all), so the
figure is the pool's throughput. The process tier is the one a pool speeds up (a child
process per replica); the asyncio and thread tiers are shown for reference: their replicas
share one GIL, so a CPU-bound handler gains nothing there. A hand-rolled pool (two
single-replica process kernels fed round-robin by the caller) is measured in the same run
as a second reference.

    python benchmarks/pool_benchmark.py [--quick] [--json PATH]

Target: the process tier with 2 replicas >= 1.8 x one replica on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import print_table, save_json  # noqa: E402
from _pool_actors import Result, Task, burn, burn_async, burn_sync  # noqa: E402
from _suite import summary_row  # noqa: E402

from pydotcompute import RingKernelRuntime  # noqa: E402

TARGET = 1.8


def calibrate(target_s: float = 0.001) -> int:
    """Iterations of ``burn`` that take about ``target_s`` here."""
    n = 20_000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        burn(n)
        best = min(best, time.perf_counter() - t0)
    return max(1000, int(n * target_s / best))


async def _pool_rate(tier: str, replicas: int, n: int, messages: int) -> float:
    """Messages/s of one kernel with ``replicas`` replicas, every message in flight."""
    actor = burn_async if tier == "asyncio" else burn_sync
    async with RingKernelRuntime() as rt:
        await rt.launch(
            "pool",
            actor,
            input_type=Task,
            output_type=Result,
            tier=tier,
            replicas=replicas,
            queue_size=messages + 16,
        )
        await rt.activate("pool")
        for i in range(2 * replicas):  # warm up: every replica has run once
            await rt.send("pool", Task(seq=-1 - i, n=n))
        for _ in range(2 * replicas):
            await rt.receive("pool", timeout=60)
        t0 = time.perf_counter()
        for i in range(messages):
            await rt.send("pool", Task(seq=i, n=n))
        for _ in range(messages):
            await rt.receive("pool", timeout=60)
        elapsed = time.perf_counter() - t0
    return messages / elapsed


async def _hand_rolled_rate(n: int, messages: int) -> float:
    """Two single-replica process kernels fed round-robin by the caller."""
    ids = ("w0", "w1")
    async with RingKernelRuntime() as rt:
        for kid in ids:
            await rt.launch(
                kid,
                burn_sync,
                input_type=Task,
                output_type=Result,
                tier="process",
                queue_size=messages + 16,
            )
            await rt.activate(kid)
            await rt.send(kid, Task(seq=-1, n=n))
            await rt.receive(kid, timeout=60)
        t0 = time.perf_counter()
        for i in range(messages):
            await rt.send(ids[i % 2], Task(seq=i, n=n))
        for i in range(messages):
            await rt.receive(ids[i % 2], timeout=60)
        elapsed = time.perf_counter() - t0
    return messages / elapsed


def _best_pair(make_one: Any, make_two: Any, repeats: int) -> tuple[float, float]:
    """The best of ``repeats`` runs of each, interleaved (1, 2, 1, 2, ...) so that a
    change in the machine's load falls on both alike."""
    one = two = 0.0
    for _ in range(repeats):
        one = max(one, asyncio.run(make_one()))
        two = max(two, asyncio.run(make_two()))
    return one, two


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--json", default=None, help="where to write the JSON results")
    args = parser.parse_args()
    messages = 300 if args.quick else 2000
    repeats = 1 if args.quick else 3
    n = calibrate()
    cores = os.cpu_count() or 1
    load_before = _load()
    print(
        f"handler: {n} iterations (~1 ms here); {messages} messages; {cores} cores; "
        f"load average {load_before}"
    )

    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for tier in ("process", "thread", "asyncio"):
        one, two = _best_pair(
            lambda tier=tier: _pool_rate(tier, 1, n, messages),
            lambda tier=tier: _pool_rate(tier, 2, n, messages),
            repeats,
        )
        ratio = two / one
        rows.append(
            {
                "tier": tier,
                "1 replica msg/s": one,
                "2 replicas msg/s": two,
                "ratio": ratio,
                "target": f">= {TARGET}" if tier == "process" else "(reference)",
            }
        )
        summary.append(
            summary_row(
                f"{tier}: 2 replicas",
                two,
                "msg/s",
                higher_is_better=True,
                baseline=one,
                baseline_name="1 replica",
                target=f"ratio >= {TARGET}" if tier == "process" else None,
                note=None if tier == "process" else "one GIL: no gain expected",
            )
        )
    hand = max(asyncio.run(_hand_rolled_rate(n, messages)) for _ in range(repeats))
    one_process = rows[0]["1 replica msg/s"]
    rows.append(
        {
            "tier": "process, 2 kernels by hand",
            "1 replica msg/s": one_process,
            "2 replicas msg/s": hand,
            "ratio": hand / one_process,
            "target": "(reference)",
        }
    )
    summary.append(
        summary_row(
            "process: 2 kernels round-robin by hand",
            hand,
            "msg/s",
            higher_is_better=True,
            baseline=one_process,
            baseline_name="1 replica",
        )
    )
    print_table(
        "CPU-bound handler (~1 ms), every message in flight",
        rows,
        ["tier", "1 replica msg/s", "2 replicas msg/s", "ratio", "target"],
    )
    process_ratio = rows[0]["ratio"]
    verdict = "meets" if process_ratio >= TARGET else "MISSES"
    load_after = _load()
    print(f"\nprocess tier, 2 replicas: {process_ratio:.2f} x one replica ({verdict} {TARGET})")
    print(f"load average before {load_before}, after {load_after} (other work skews this)")
    save_json(
        "pool",
        {
            "quick": args.quick,
            "messages": messages,
            "handler_iterations": n,
            "cores": cores,
            "load_average": {"before": load_before, "after": load_after},
            "rows": rows,
            "summary": summary,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
