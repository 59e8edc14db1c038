"""How tier-1 cost grows with the number of actors on one event loop.

What it measures:

- aggregate throughput of 1, 10, 100 and 1,000 echo actors: the caller sends a window of
  messages spread round-robin over the actors, then collects every reply, repeatedly; the
  ratio column is aggregate msg/s over the one-actor figure of the same run (target for
  1,000 actors: >= 0.8). Beside it, the floor: the same shape with bare ``asyncio`` tasks
  echoing through two ``asyncio.Queue`` objects each, and its own ratio (what the event
  loop's per-task wake-ups cost without any of our code);
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
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import loop_factories, print_table, run_on, save_json

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


async def _measure(quick: bool) -> dict[str, Any]:
    total = 20_000 if quick else 200_000
    rows = {}
    floor_rows = {}
    for n in (1, 10, 100, 1000):
        rows[n] = await throughput(n, total)
        floor_rows[n] = await floor_throughput(n, total)
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
    return {"throughput": rows, "floor_throughput": floor_rows, "idle": mem}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    name, factory = loop_factories()[0]
    r = run_on(factory, _measure(args.quick))
    one = r["throughput"][1]
    floor = r["floor_throughput"]
    print_table(
        f"Aggregate throughput by actor count ({name}); ratio = msg/s / one actor's "
        "(target >= 0.8 at 1,000); floor = bare tasks on asyncio.Queue, same shape",
        [
            {
                "actors": n,
                "msg/s": v,
                "ratio": v / one,
                "floor msg/s": floor[n],
                "floor ratio": floor[n] / floor[1],
            }
            for n, v in r["throughput"].items()
        ],
        ["actors", "msg/s", "ratio", "floor msg/s", "floor ratio"],
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
    save_json("actor_scaling", {"loop": name, **r}, args.json)
    return r


if __name__ == "__main__":
    main()
