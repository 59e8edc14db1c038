"""Pipelines of off-loop stages: the loop path against direct edges, and against the
slowest stage alone.

Each pipeline is ``runtime.send -> stage -> ... -> stage -> runtime.receive`` with a light
handler (pass the message on), every message in flight (a producer task sends while the
caller receives). For each pipeline the same run measures:

- ``loop``: every hop crosses the event loop (``connect(..., direct=False)``);
- ``direct``: ``connect`` picks a direct edge where both ends offer one (the kinds it got
  are printed: ``objects`` thread -> thread, ``shm-ring`` with a process end);
- ``slowest alone``: each distinct stage tier alone through the runtime; the slower one.

Contenders run in interleaved rounds (loop, direct, alone, loop, ...) and the best of each
is kept, so load from other work on the machine falls on all alike; ratios are of figures
from the same run. The loop's CPU time per message (``time.thread_time`` of the thread
running the loop, over the timed part) says how much of the data plane the loop still
carries.

A second table puts a worker pool in the middle: ``asyncio -> process (replicas=R) ->
thread``, R = 1 against R = 2 in the same run (interleaved rounds), with the light handler
and with a CPU-bound one (`_edge_actors.burn`, about a millisecond of Python per message).
Out of the pool each replica sends over its own ``shm-ring`` edge into the thread stage.

    python benchmarks/edges_benchmark.py [--quick] [--pool-only] [--json PATH]

Targets: ``process -> process -> thread`` >= 0.6 x its slowest stage alone; the 2-replica
pool >= 1.0 x the 1-replica one with the light handler, >= 1.6 x with the CPU-bound one
(on two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import print_table, save_json  # noqa: E402
from _edge_actors import Item, burn, relay, relay_async  # noqa: E402
from _suite import summary_row  # noqa: E402

from pydotcompute import RingKernelRuntime  # noqa: E402

TARGET = 0.6
#: (stages, direct) -> CPU seconds a message of the last run: this process (the loop, the
#: thread stages, the bridges' threads), the child processes summed, and how many cores
#: all of it kept busy on average
CPU_SEEN: dict[tuple[tuple[str, ...], bool], tuple[float, float, float]] = {}
PIPELINES = (("process", "process", "thread"), ("thread", "thread", "thread"))
#: the pool comparison's targets: 2 replicas over 1, per handler
POOL_TARGETS = {"light": 1.0, "cpu-bound": 1.6}


async def _pool_rate(replicas: int, handler: str, n: int) -> tuple[float, list[str]]:
    """Messages/s through ``asyncio -> process (replicas) -> thread`` and the edges'
    kinds (the pool's replica edges' too)."""
    stage = burn if handler == "cpu-bound" else relay
    async with RingKernelRuntime() as rt:
        await rt.launch("head", relay_async, input_type=Item, output_type=Item, queue_size=4096)
        await rt.launch(
            "pool", stage, input_type=Item, output_type=Item, tier="process",
            queue_size=4096, replicas=replicas,
        )  # fmt: skip
        await rt.launch(
            "tail", relay, input_type=Item, output_type=Item, tier="thread", queue_size=4096
        )
        rt.connect("head", "pool")
        rt.connect("pool", "tail")
        for kid in ("tail", "pool", "head"):
            await rt.activate(kid)

        async def produce(count: int) -> None:
            for i in range(count):
                await rt.send("head", Item(seq=i))

        warm = min(n, 200)
        for _ in range(2):
            task = asyncio.get_running_loop().create_task(produce(warm))
            for _ in range(warm):
                await rt.receive("tail", timeout=120)
            await task
        everyone = _cpu_now()
        t0 = time.perf_counter()
        task = asyncio.get_running_loop().create_task(produce(n))
        for _ in range(n):
            await rt.receive("tail", timeout=120)
        await task
        elapsed = time.perf_counter() - t0
        parent, kids = _cpu_since(everyone)
        CPU_SEEN[(("pool", handler, str(replicas)), True)] = (
            parent / n,
            kids / n,
            (parent + kids) / elapsed,
        )
        kinds = [f"{e.kind}x{max(1, len(e.replicas))}" for e in rt.edges()]
    return n / elapsed, kinds


def _pool_table(quick: bool, rounds: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pool comparison: replicas 1 and 2, interleaved, best of ``rounds`` each."""
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for handler, n in (("light", 3000 if quick else 20000), ("cpu-bound", 300 if quick else 1500)):
        best: dict[int, float] = {}
        kinds: dict[int, list[str]] = {}
        cpu: dict[int, tuple[float, float, float]] = {}
        for _ in range(rounds):
            for replicas in (1, 2):
                rate, got = asyncio.run(_pool_rate(replicas, handler, n))
                if rate > best.get(replicas, 0.0):
                    best[replicas] = rate
                    cpu[replicas] = CPU_SEEN[(("pool", handler, str(replicas)), True)]
                kinds[replicas] = got
        base = best[1]
        for replicas in (1, 2):
            parent, kids, cores = cpu[replicas]
            rows.append(
                {
                    "handler": handler,
                    "replicas": replicas,
                    "messages": n,
                    "edges": ",".join(kinds[replicas]),
                    "msg/s": best[replicas],
                    "1 replica msg/s": base,
                    "ratio": best[replicas] / base,
                    "parent CPU us/msg": parent * 1e6,
                    "children CPU us/msg": kids * 1e6,
                    "cores busy": cores,
                }
            )
        summary.append(
            summary_row(
                f"asyncio -> process x2 -> thread ({handler})",
                best[2],
                "msg/s",
                higher_is_better=True,
                baseline=base,
                baseline_name="the same pipeline with 1 replica",
                target=f"ratio >= {POOL_TARGETS[handler]}",
                note=f"edges {','.join(kinds[2])}",
            )
        )
    return rows, summary


def _cpu_now() -> tuple[float, dict[int, float]]:
    """CPU seconds used so far by this process (every thread: the loop, thread stages,
    bridges) and by each live child process (read from ``/proc``; none elsewhere)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for child in multiprocessing.active_children():
        try:
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[child.pid] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return me.ru_utime + me.ru_stime, children


def _cpu_since(before: tuple[float, dict[int, float]]) -> tuple[float, float]:
    """CPU seconds since ``before``: this process's, and its children's summed."""
    me, children = _cpu_now()
    kids = sum(c - before[1][pid] for pid, c in children.items() if pid in before[1])
    return me - before[0], kids


async def _rate(tiers: tuple[str, ...], n: int, *, direct: bool) -> tuple[float, float, list[str]]:
    """Messages/s through the stages ``tiers`` in a row, the loop thread's CPU seconds per
    message, and the kinds of the edges; the CPU of every agent goes to `CPU_SEEN`."""
    async with RingKernelRuntime() as rt:
        ids = [f"s{i}" for i in range(len(tiers))]
        for kid, tier in zip(ids, tiers, strict=True):
            await rt.launch(
                kid, relay, input_type=Item, output_type=Item, tier=tier, queue_size=4096
            )
        for src, dst in itertools.pairwise(ids):
            rt.connect(src, dst, direct=direct)
        for kid in reversed(ids):
            await rt.activate(kid)
        head, tail = ids[0], ids[-1]

        async def produce(count: int) -> None:
            for i in range(count):
                await rt.send(head, Item(seq=i))

        for _ in range(2):  # warm up: every stage has run, the bridges have sized
            task = asyncio.get_running_loop().create_task(produce(500))
            for _ in range(500):
                await rt.receive(tail, timeout=60)
            await task
        everyone = _cpu_now()
        cpu0, t0 = time.thread_time(), time.perf_counter()
        task = asyncio.get_running_loop().create_task(produce(n))
        for _ in range(n):
            await rt.receive(tail, timeout=60)
        await task
        elapsed = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
        parent, kids = _cpu_since(everyone)
        CPU_SEEN[(tiers, direct)] = (parent / n, kids / n, (parent + kids) / elapsed)
        kinds = [e.kind for e in rt.edges()]
    return n / elapsed, cpu / n, kinds


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--json", default=None, help="where to write the JSON results")
    parser.add_argument("--pool-only", action="store_true", help="only the worker-pool comparison")
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds (best of)")
    args = parser.parse_args()
    n = 3000 if args.quick else 20000
    rounds = args.rounds or (1 if args.quick else 3)
    load_before = _load()
    print(f"{n} messages a run, best of {rounds} interleaved rounds; load {load_before}")

    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for tiers in () if args.pool_only else PIPELINES:
        name = " -> ".join(tiers)
        best: dict[str, tuple[float, float, tuple[float, float, float]]] = {}
        kinds: dict[str, list[str]] = {}
        # tier -> (best rate, its loop CPU, everyone's CPU)
        alone: dict[str, tuple[float, float, tuple[float, float, float]]] = {}
        for _ in range(rounds):
            for label, direct in (("loop", False), ("direct", True)):
                rate, cpu, got = asyncio.run(_rate(tiers, n, direct=direct))
                if rate > best.get(label, (0.0,))[0]:
                    best[label] = (rate, cpu, CPU_SEEN[(tiers, direct)])
                kinds[label] = got
            for tier in sorted(set(tiers)):
                rate, cpu, _ = asyncio.run(_rate((tier,), n, direct=False))
                if rate > alone.get(tier, (0.0,))[0]:
                    alone[tier] = (rate, cpu, CPU_SEEN[((tier,), False)])
        slowest, ends_cpu, alone_cpu = min(alone.values())
        for label in ("loop", "direct"):
            rate, cpu, (parent, kids, cores) = best[label]
            rows.append(
                {
                    "pipeline": name,
                    "path": label,
                    "edges": ",".join(kinds[label]),
                    "msg/s": rate,
                    "slowest alone": slowest,
                    "ratio": rate / slowest,
                    "loop CPU us/msg": cpu * 1e6,
                    "alone: loop CPU": ends_cpu * 1e6,
                    "parent CPU us/msg": parent * 1e6,
                    "children CPU us/msg": kids * 1e6,
                    "cores busy": cores,
                    "alone: all CPU us/msg": (alone_cpu[0] + alone_cpu[1]) * 1e6,
                    "alone: cores busy": alone_cpu[2],
                }
            )
            summary.append(
                summary_row(
                    f"{name}: {label}",
                    rate,
                    "msg/s",
                    higher_is_better=True,
                    baseline=slowest,
                    baseline_name="slowest stage alone",
                    target=f"ratio >= {TARGET}" if tiers == PIPELINES[0] else None,
                    note=f"edges {','.join(kinds[label])}",
                )
            )
    pool_rows, pool_summary = _pool_table(args.quick, rounds)
    summary += pool_summary
    if rows:
        print_table(
            "light handler, every message in flight",
            rows,
            [
                "pipeline",
                "path",
                "edges",
                "msg/s",
                "slowest alone",
                "ratio",
                "loop CPU us/msg",
                "alone: loop CPU",
            ],
        )
        print_table(
            "where the CPU goes (the same best runs)",
            rows,
            [
                "pipeline",
                "path",
                "parent CPU us/msg",
                "children CPU us/msg",
                "cores busy",
                "alone: all CPU us/msg",
                "alone: cores busy",
            ],
        )
        print(
            "loop CPU: the event loop thread's CPU time per message over the timed part. A "
            "pipeline's two ends (runtime.send into the head, runtime.receive from the tail) "
            "cost the loop about what one stage alone does ('alone: loop CPU'); what a "
            "pipeline's loop CPU adds to that is what its middle hops cost the loop."
        )
        print(
            f"where the CPU goes: this process (loop, thread stages, bridges) and the child "
            f"processes, CPU time per message, and the cores all of it kept busy on average "
            f"(this machine has {os.cpu_count()}); a child spins a while for its next message "
            "before it sleeps, and that counts too."
        )
    print_table(
        "asyncio -> process (replicas=R) -> thread, every message in flight",
        pool_rows,
        [
            "handler",
            "replicas",
            "messages",
            "edges",
            "msg/s",
            "1 replica msg/s",
            "ratio",
            "parent CPU us/msg",
            "children CPU us/msg",
            "cores busy",
        ],
    )
    print(f"load average before {load_before}, after {_load()} (other work skews this)")
    save_json(
        "edges",
        {
            "quick": args.quick,
            "messages": n,
            "rows": rows,
            "pool_rows": pool_rows,
            "summary": summary,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
