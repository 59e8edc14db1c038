"""How tier-1 cost grows with the number of actors on one event loop.

What it measures:

- aggregate throughput of 1, 10, 100 and 1,000 echo actors: the caller sends a window of
  messages spread round-robin over the actors, then collects every reply, repeatedly. Beside
  it, the floor: the same flow (the same number of messages, the same send and receive
  calls in the same order) with bare ``asyncio`` tasks echoing through two ``asyncio.Queue``
  objects each. The two run in one process, interleaved in rounds (the order alternating,
  the heap collected before each), and the ratio is ours / floor per round, its median
  reported (target for 1,000 actors: >= 1.0). The ratio against our own one-actor figure
  shows what the event loop's per-task wake-ups cost as actors are added;
- 1,000 actors each with a caller of its own: every caller makes round trips (send, then
  receive the reply) with its actor, all at once, against 1,000 bare echo tasks on two
  ``asyncio.Queue`` objects each with a caller each, interleaved the same way (target
  >= 1.0). Each message wakes one task on either side, the per-task path a window of
  messages does not amortise;
- memory per idle actor: ``tracemalloc`` bytes allocated by launching and activating
  10,000 actors (queues, context, telemetry, task and coroutine), divided by 10,000
  (target <= 8 KiB);
- the wall time to launch and activate those 10,000 actors (target <= 0.5 s), beside the
  time to create 10,000 bare ``asyncio`` tasks parked on a queue (the floor). Both start
  from a collected heap (``gc.collect()``), so neither pays for an earlier phase's garbage.

Run ``python benchmarks/actor_scaling_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import loop_factories, print_table, run_on, save_json
from _suite import summary_row

from pydotcompute import RingKernelRuntime, message


@message
class Tick:
    value: int


async def echo(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(msg)


async def throughput(n_actors: int, total: int) -> float:
    async with RingKernelRuntime() as rt:
        ids = [f"a{i}" for i in range(n_actors)]
        for kid in ids:
            await rt.launch(kid, echo, input_type=Tick, queue_size=4096)
            await rt.activate(kid)
        window = max(n_actors, 1024)
        sent = 0
        t0 = time.perf_counter()
        while sent < total:
            batch = min(window, total - sent)
            for i in range(batch):
                await rt.send(ids[(sent + i) % n_actors], Tick(value=i))
            for i in range(batch):
                await rt.receive(ids[(sent + i) % n_actors])
            sent += batch
        dt = time.perf_counter() - t0
    return total / dt


async def floor_throughput(n_tasks: int, total: int) -> float:
    """``throughput`` with bare tasks and ``asyncio.Queue`` pairs in place of actors."""
    inboxes: list[asyncio.Queue[Any]] = [asyncio.Queue(4096) for _ in range(n_tasks)]
    outboxes: list[asyncio.Queue[Any]] = [asyncio.Queue(4096) for _ in range(n_tasks)]

    async def echo_task(q_in: asyncio.Queue[Any], q_out: asyncio.Queue[Any]) -> None:
        while True:
            await q_out.put(await q_in.get())

    tasks = [asyncio.create_task(echo_task(i, o)) for i, o in zip(inboxes, outboxes, strict=True)]
    await asyncio.sleep(0)
    window = max(n_tasks, 1024)
    sent = 0
    t0 = time.perf_counter()
    while sent < total:
        batch = min(window, total - sent)
        for i in range(batch):
            await inboxes[(sent + i) % n_tasks].put(Tick(value=i))
        for i in range(batch):
            await outboxes[(sent + i) % n_tasks].get()
        sent += batch
    dt = time.perf_counter() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return total / dt


async def pairs_throughput(n_actors: int, total: int) -> float:
    """Every actor has a caller of its own making round trips (send, then receive the
    reply), all callers at once: aggregate round trips per second. Each message wakes one
    task on each side, so this is the per-task wake-up path a window does not amortise."""
    per = max(total // n_actors, 1)
    async with RingKernelRuntime() as rt:
        ids = [f"p{i}" for i in range(n_actors)]
        for kid in ids:
            await rt.launch(kid, echo, input_type=Tick, queue_size=4096)
            await rt.activate(kid)

        async def caller(kid: str) -> None:
            send, receive = rt.send, rt.receive
            for i in range(per):
                await send(kid, Tick(value=i))
                await receive(kid)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(kid) for kid in ids))
        dt = time.perf_counter() - t0
    return n_actors * per / dt


async def floor_pairs_throughput(n_tasks: int, total: int) -> float:
    """``pairs_throughput`` with a bare task echoing through two ``asyncio.Queue`` objects in
    place of each actor."""
    per = max(total // n_tasks, 1)
    pairs: list[tuple[asyncio.Queue[Any], asyncio.Queue[Any]]] = [
        (asyncio.Queue(4096), asyncio.Queue(4096)) for _ in range(n_tasks)
    ]

    async def echo_task(q_in: asyncio.Queue[Any], q_out: asyncio.Queue[Any]) -> None:
        while True:
            await q_out.put(await q_in.get())

    async def caller(q_in: asyncio.Queue[Any], q_out: asyncio.Queue[Any]) -> None:
        for i in range(per):
            await q_in.put(Tick(value=i))
            await q_out.get()

    tasks = [asyncio.create_task(echo_task(i, o)) for i, o in pairs]
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    await asyncio.gather(*(caller(i, o) for i, o in pairs))
    dt = time.perf_counter() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return n_tasks * per / dt


async def idle_memory(n: int) -> dict[str, float]:
    async def parked(q: asyncio.Queue[Any]) -> None:
        await q.get()

    # floor: bare tasks parked on their own queue
    gc.collect()
    t0 = time.perf_counter()
    queues = [asyncio.Queue() for _ in range(n)]
    tasks = [asyncio.create_task(parked(q)) for q in queues]
    await asyncio.sleep(0)
    floor_s = time.perf_counter() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    del tasks, queues

    rt = RingKernelRuntime()
    await rt.start()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    t0 = time.perf_counter()
    for i in range(n):
        kid = f"idle{i}"
        await rt.launch(kid, echo, input_type=Tick)
        await rt.activate(kid)
    await asyncio.sleep(0)  # let every actor reach its first receive()
    elapsed = time.perf_counter() - t0
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    await rt.shutdown()
    return {
        "actors": n,
        "bytes_per_actor": grown / n,
        "launch_activate_s": elapsed,
        "bare_tasks_s": floor_s,
    }


#: actor counts measured; the summary's target row is the last
COUNTS = (1, 10, 100, 1000)


def throughput_metric(n_actors: int) -> str:
    """The summary row's name for the aggregate throughput of ``n_actors`` actors."""
    return f"{n_actors:,} actor{'' if n_actors == 1 else 's'}: aggregate throughput"


#: actors (each with a caller of its own) in the round-trip row
PAIRS = 1000
PAIRS_METRIC = f"{PAIRS:,} actors, a caller each: aggregate round trips"
IDLE_BYTES_METRIC = "bytes per idle actor"
LAUNCH_METRIC = "launch + activate 10,000 actors"


async def interleaved(
    n: int,
    total: int,
    rounds: int,
    ours_fn: Callable[[int, int], Awaitable[float]] = throughput,
    floor_fn: Callable[[int, int], Awaitable[float]] = floor_throughput,
) -> dict[str, Any]:
    """``rounds`` runs each of the actors and of the bare-task floor, alternating which goes
    first, the heap collected before each; the per-round ratios and the median rates."""
    ours: list[float] = []
    floor: list[float] = []
    for r in range(rounds):
        order = (ours_fn, floor_fn) if r % 2 == 0 else (floor_fn, ours_fn)
        for fn in order:
            gc.collect()
            rate = await fn(n, total)
            (ours if fn is ours_fn else floor).append(rate)
    ratios = [a / b for a, b in zip(ours, floor, strict=True)]
    return {
        "msgs_per_s": statistics.median(ours),
        "floor_msgs_per_s": statistics.median(floor),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


async def _measure(quick: bool) -> dict[str, Any]:
    total = 50_000 if quick else 200_000
    rounds = 3 if quick else 5
    await throughput(10, 5_000)  # warm up both paths
    await floor_throughput(10, 5_000)
    scaling = {n: await interleaved(n, total, rounds) for n in COUNTS}
    await pairs_throughput(10, 1_000)  # warm up both paths
    await floor_pairs_throughput(10, 1_000)
    pairs = await interleaved(PAIRS, total // 2, rounds, pairs_throughput, floor_pairs_throughput)
    # timing without tracemalloc (it slows allocation), then memory with it
    mem = await idle_memory(10_000)
    rt = RingKernelRuntime()
    await rt.start()
    gc.collect()  # as before the floor: the previous phase's actors are garbage by now
    t0 = time.perf_counter()
    for i in range(10_000):
        await rt.launch(f"t{i}", echo, input_type=Tick)
        await rt.activate(f"t{i}")
    await asyncio.sleep(0)
    launch_s = time.perf_counter() - t0
    await rt.shutdown()
    mem["launch_activate_s"] = launch_s
    return {
        "throughput": {n: s["msgs_per_s"] for n, s in scaling.items()},
        "floor_throughput": {n: s["floor_msgs_per_s"] for n, s in scaling.items()},
        "scaling": scaling,
        "pairs": pairs,
        "rounds": rounds,
        "messages_per_run": total,
        "idle": mem,
    }


def summary(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The suite's summary rows: every count against its bare-task floor (the ratio is the
    median of the same-round ratios), then the idle actor's memory and start time."""
    rows = []
    for n, s in r["scaling"].items():
        row = summary_row(
            throughput_metric(int(n)),
            s["msgs_per_s"],
            "msg/s",
            higher_is_better=True,
            baseline=s["floor_msgs_per_s"],
            baseline_name=f"{int(n):,} bare tasks on asyncio.Queue, same flow",
            note=f"median of {r['rounds']} interleaved rounds; "
            f"ratio range {s['ratio_min']:.2f}-{s['ratio_max']:.2f}",
        )
        row["ratio"] = s["ratio"]  # the median same-round ratio, not a ratio of medians
        rows.append(row)
    pairs = r.get("pairs")
    if pairs is not None:
        row = summary_row(
            PAIRS_METRIC,
            pairs["msgs_per_s"],
            "round trips/s",
            higher_is_better=True,
            baseline=pairs["floor_msgs_per_s"],
            baseline_name=f"{PAIRS:,} bare tasks on asyncio.Queue, a caller each",
            note=f"median of {r['rounds']} interleaved rounds; "
            f"ratio range {pairs['ratio_min']:.2f}-{pairs['ratio_max']:.2f}",
        )
        row["ratio"] = pairs["ratio"]
        rows.append(row)
    idle = r["idle"]
    rows.append(
        summary_row(IDLE_BYTES_METRIC, idle["bytes_per_actor"], "B", higher_is_better=False)
    )
    rows.append(
        summary_row(
            LAUNCH_METRIC,
            idle["launch_activate_s"],
            "s",
            higher_is_better=False,
            baseline=idle.get("bare_tasks_s"),
            baseline_name="bare tasks",
        )
    )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    name, factory = loop_factories()[0]
    r = run_on(factory, _measure(args.quick))
    one = r["throughput"][1]
    print_table(
        f"Aggregate throughput by actor count ({name}); ratio = ours / bare tasks on "
        "asyncio.Queue, same flow (median of interleaved rounds; target >= 1.0 at 1,000); "
        "vs one = msg/s / our one-actor figure",
        [
            {
                "actors": n,
                "msg/s": s["msgs_per_s"],
                "floor msg/s": s["floor_msgs_per_s"],
                "ratio": s["ratio"],
                "ratio min-max": f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f}",
                "vs one": s["msgs_per_s"] / one,
            }
            for n, s in r["scaling"].items()
        ],
        ["actors", "msg/s", "floor msg/s", "ratio", "ratio min-max", "vs one"],
    )
    p = r["pairs"]
    print_table(
        f"{PAIRS:,} actors, each with a caller of its own making round trips, all at once "
        f"({name}); floor: {PAIRS:,} bare echo tasks on asyncio.Queue, a caller each "
        "(target >= 1.0)",
        [
            {
                "round trips/s": p["msgs_per_s"],
                "floor round trips/s": p["floor_msgs_per_s"],
                "ratio": p["ratio"],
                "ratio min-max": f"{p['ratio_min']:.2f}-{p['ratio_max']:.2f}",
            }
        ],
        ["round trips/s", "floor round trips/s", "ratio", "ratio min-max"],
    )
    m = r["idle"]
    print_table(
        "10,000 idle actors (launched + active)",
        [
            {"what": "bytes per actor (target <= 8192)", "value": m["bytes_per_actor"]},
            {
                "what": "launch + activate 10,000 actors, s (target <= 0.5)",
                "value": m["launch_activate_s"],
            },
            {"what": "floor: 10,000 bare tasks on asyncio.Queue, s", "value": m["bare_tasks_s"]},
            {
                "what": "ratio launch / floor",
                "value": m["launch_activate_s"] / max(m["bare_tasks_s"], 1e-9),
            },
        ],
        ["what", "value"],
    )
    save_json("actor_scaling", {"loop": name, **r, "summary": summary(r)}, args.json)
    return r


if __name__ == "__main__":
    main()
