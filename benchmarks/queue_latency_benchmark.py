"""Tier-1 latency and throughput against a raw ``asyncio.Queue`` floor measured in the same run.

What it measures, on each event loop (uvloop when installed, then plain asyncio):

- round trip: ``runtime.send`` -> actor ``ctx.receive`` -> ``ctx.send`` -> ``runtime.receive``
  with a message built per trip, against the floor: one task answering another through two
  ``asyncio.Queue`` objects (p50 / p95 / p99 / worst from per-trip ``perf_counter_ns``);
- pipelined throughput: a producer sends N messages while the caller receives N replies,
  against the same shape through two ``asyncio.Queue`` objects;
- the same pipeline with ``serialize=True`` (MessagePack encode + decode on every hop);
- ``FastMessageQueue`` ``put_nowait`` + ``get_nowait`` in one task, against ``asyncio.Queue``.

The floor passes a tuple and echoes it; the actor builds a request and a reply message per
trip (``Ping(value=i)``, ``Pong(value=...)``) and times each message. Two reference rows show
what those costs are on their own: the floor carrying the same messages (built the same way,
a ``Pong`` per reply), and the actor with telemetry off. Every ratio is against the plain
floor. Ratios are ours / floor for times (lower is better) and ours / floor for rates
(higher is better). Run ``python benchmarks/queue_latency_benchmark.py [--quick] [--json
PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import loop_factories, percentiles, print_table, run_on, save_json

from pydotcompute import RingKernelRuntime, message
from pydotcompute.ring_kernels import FastMessageQueue

_ns = time.perf_counter_ns


@message
class Ping:
    value: int


@message
class Pong:
    value: int


async def echo_actor(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Pong(value=msg.value))


# --- round trip ------------------------------------------------------------------------------


async def floor_round_trip(n: int, *, messages: bool = False) -> list[int]:
    q_in: asyncio.Queue[Any] = asyncio.Queue(4096)
    q_out: asyncio.Queue[Any] = asyncio.Queue(4096)

    async def server() -> None:
        while True:
            item = await q_in.get()
            await q_out.put(Pong(value=item.value) if messages else item)

    task = asyncio.create_task(server())
    samples = []
    for i in range(n):
        t0 = _ns()
        await q_in.put(Ping(value=i) if messages else ("ping", i))
        await q_out.get()
        samples.append(_ns() - t0)
    task.cancel()
    return samples


async def actor_round_trip(n: int, *, telemetry: bool = True, serialize: bool = False) -> list[int]:
    async with RingKernelRuntime(enable_telemetry=telemetry) as rt:
        await rt.launch("echo", echo_actor, input_type=Ping, output_type=Pong, serialize=serialize)
        await rt.activate("echo")
        send, receive = rt.send, rt.receive
        samples = []
        for i in range(n):
            t0 = _ns()
            await send("echo", Ping(value=i))
            await receive("echo")
            samples.append(_ns() - t0)
    return samples


# --- pipelined throughput ----------------------------------------------------------------------


async def floor_pipeline(n: int, *, messages: bool = False) -> float:
    q_in: asyncio.Queue[Any] = asyncio.Queue(4096)
    q_out: asyncio.Queue[Any] = asyncio.Queue(4096)

    async def server() -> None:
        while True:
            item = await q_in.get()
            await q_out.put(Pong(value=item.value) if messages else item)

    async def producer() -> None:
        for i in range(n):
            await q_in.put(Ping(value=i) if messages else ("ping", i))

    srv = asyncio.create_task(server())
    t0 = time.perf_counter()
    prod = asyncio.create_task(producer())
    for _ in range(n):
        await q_out.get()
    dt = time.perf_counter() - t0
    await prod
    srv.cancel()
    return n / dt


async def actor_pipeline(n: int, *, serialize: bool = False, telemetry: bool = True) -> float:
    async with RingKernelRuntime(enable_telemetry=telemetry) as rt:
        await rt.launch("echo", echo_actor, input_type=Ping, output_type=Pong, serialize=serialize)
        await rt.activate("echo")

        async def producer() -> None:
            send = rt.send
            for i in range(n):
                await send("echo", Ping(value=i))

        t0 = time.perf_counter()
        prod = asyncio.create_task(producer())
        receive = rt.receive
        for _ in range(n):
            await receive("echo")
        dt = time.perf_counter() - t0
        await prod
    return n / dt


# --- queue put+get ---------------------------------------------------------------------------


def queue_put_get(n: int) -> dict[str, float]:
    msg = Ping(value=1)
    fq: FastMessageQueue[Any] = FastMessageQueue(4096)
    aq: asyncio.Queue[Any] = asyncio.Queue(4096)
    best_fast = best_floor = float("inf")
    for _ in range(5):
        put, get = fq.put_nowait, fq.get_nowait
        t0 = _ns()
        for _ in range(n):
            put(msg)
            get()
        best_fast = min(best_fast, (_ns() - t0) / n / 1000)
        put2, get2 = aq.put_nowait, aq.get_nowait
        t0 = _ns()
        for _ in range(n):
            put2(msg)
            get2()
        best_floor = min(best_floor, (_ns() - t0) / n / 1000)
    return {"fast_queue_us": best_fast, "asyncio_queue_us": best_floor}


# --- driver ----------------------------------------------------------------------------------


async def measure(quick: bool) -> dict[str, Any]:
    n_rt = 3_000 if quick else 20_000
    n_tp = 30_000 if quick else 200_000
    await floor_round_trip(500)  # warm up
    await actor_round_trip(500)
    floor = percentiles(await floor_round_trip(n_rt))
    floor_msg = percentiles(await floor_round_trip(n_rt, messages=True))
    ours = percentiles(await actor_round_trip(n_rt))
    ours_nt = percentiles(await actor_round_trip(n_rt, telemetry=False))
    ours_ser = percentiles(await actor_round_trip(n_rt, serialize=True))
    tp_floor = await floor_pipeline(n_tp)
    tp_floor_msg = await floor_pipeline(n_tp, messages=True)
    tp_ours = await actor_pipeline(n_tp)
    tp_ours_nt = await actor_pipeline(n_tp, telemetry=False)
    tp_ser = await actor_pipeline(n_tp, serialize=True)
    return {
        "round_trip": {
            "floor": floor,
            "floor_with_messages": floor_msg,
            "actor": ours,
            "actor_no_telemetry": ours_nt,
            "actor_serialized": ours_ser,
        },
        "throughput": {
            "floor_msgs_per_s": tp_floor,
            "floor_with_messages_msgs_per_s": tp_floor_msg,
            "actor_msgs_per_s": tp_ours,
            "actor_no_telemetry_msgs_per_s": tp_ours_nt,
            "actor_serialized_msgs_per_s": tp_ser,
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (seconds, not minutes)")
    ap.add_argument("--json", default=None, help="where to save results")
    args = ap.parse_args(argv)

    results: dict[str, Any] = {"loops": {}}
    rt_rows: list[dict[str, Any]] = []
    tp_rows: list[dict[str, Any]] = []
    for name, factory in loop_factories():
        r = run_on(factory, measure(args.quick))
        results["loops"][name] = r
        floor = r["round_trip"]["floor"]
        for label, key in (
            ("asyncio.Queue floor", "floor"),
            ("  same, with messages", "floor_with_messages"),
            ("actor", "actor"),
            ("actor, telemetry off", "actor_no_telemetry"),
            ("actor, serialize=True", "actor_serialized"),
        ):
            p = r["round_trip"][key]
            rt_rows.append(
                {
                    "loop": name,
                    "path": label,
                    "p50 us": p["p50_us"],
                    "p95 us": p["p95_us"],
                    "p99 us": p["p99_us"],
                    "max us": p["max_us"],
                    "p50 ratio": p["p50_us"] / floor["p50_us"],
                }
            )
        t = r["throughput"]
        for label, key in (
            ("asyncio.Queue floor", "floor_msgs_per_s"),
            ("  same, with messages", "floor_with_messages_msgs_per_s"),
            ("actor", "actor_msgs_per_s"),
            ("actor, telemetry off", "actor_no_telemetry_msgs_per_s"),
            ("actor, serialize=True", "actor_serialized_msgs_per_s"),
        ):
            tp_rows.append(
                {
                    "loop": name,
                    "path": label,
                    "msg/s": t[key],
                    "ratio": t[key] / t["floor_msgs_per_s"],
                }
            )
    q = queue_put_get(20_000 if args.quick else 200_000)
    results["queue_put_get"] = q

    print_table(
        "Round trip (send -> actor -> receive); ratio = ours / floor (target <= 1.0)",
        rt_rows,
        ["loop", "path", "p50 us", "p95 us", "p99 us", "max us", "p50 ratio"],
    )
    print_table(
        "Pipelined throughput; ratio = ours / floor (target >= 0.9; serialized >= 400k/s)",
        tp_rows,
        ["loop", "path", "msg/s", "ratio"],
    )
    print_table(
        "Queue put_nowait + get_nowait in one task (target <= 0.5 us)",
        [
            {
                "queue": "FastMessageQueue",
                "us": q["fast_queue_us"],
                "ratio": q["fast_queue_us"] / q["asyncio_queue_us"],
            },
            {"queue": "asyncio.Queue", "us": q["asyncio_queue_us"], "ratio": 1.0},
        ],
        ["queue", "us", "ratio"],
    )
    save_json("queue_latency", results, args.json)
    return results


if __name__ == "__main__":
    main()
