"""Ring kernels on Ray: round trip and throughput against plain Ray calls, same run.

What it measures (all on one local Ray instance started here, or the cluster named by
``--address``):

* Round trip, one message at a time (p50 / p99 over interleaved rounds, so drift on a
  busy machine hits every row alike):
    - ``plain actor call``: ``await actor.echo.remote(bytes)`` on a plain synchronous Ray
      actor (the baseline the ratio column divides by);
    - ``plain async actor call``: the same on an ``async def`` Ray actor (what an actor
      with an event loop of its own costs in Ray; a ring kernel needs one, and its host
      runs it in a thread of a threaded actor instead, which is cheaper per call);
    - ``compiled graph``: ``ray.dag`` ``experimental_compile()`` of the same echo actor
      (skipped with the reason when it fails here);
    - ``send_and_receive``: a ``@message`` request through ``RayRingKernelRuntime`` to a
      ring kernel in a Ray actor and its correlated reply (one Ray call);
    - ``send + receive``: ``await send()`` then ``await receive()`` (two Ray calls).
* Throughput, messages through the kernel and back per second, against the plain actor's
  calls per second (sequential, and pipelined with 64 calls in flight):
    - unbatched ``send``/``receive`` from 64 concurrent senders (automatic coalescing);
    - ``send_batch``/``receive_batch`` at several batch sizes (the batch size trade-off:
      per-batch latency against messages per second).

Targets: unbatched round trip <= 1.2x the plain actor call; batched throughput >= 20x the
plain actor's calls per second (the pipelined figure, the stronger baseline).

Run ``python benchmarks/ray_benchmark.py [--quick] [--address auto]``; JSON goes to
``benchmarks/results/ray.json``. Kernels and messages live in this file, which the Ray
workers import through ``runtime_env={"py_modules": [...]}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pydotcompute import message, ring_kernel  # noqa: E402


@message
class Ping:
    value: int
    payload: bytes = b""


@message
class Pong:
    value: int
    payload: bytes = b""


@ring_kernel(kernel_id="bench_echo", input_type=Ping, output_type=Pong, queue_size=65536)
async def bench_echo(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Pong(value=msg.value, payload=msg.payload))


class PlainEcho:
    def echo(self, x: Any) -> Any:
        return x


class PlainAsyncEcho:
    async def echo(self, x: Any) -> Any:
        return x


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q / 100 * len(s)))] if s else float("nan")


async def _round_trips(
    runtime: Any, plain: Any, plain_async: Any, cdag: Any, rounds: int, per_round: int
) -> dict[str, list[float]]:
    import ray

    payload = b"x" * 64
    samples: dict[str, list[float]] = {
        "plain actor call": [],
        "plain async actor call": [],
        "send_and_receive": [],
        "send + receive": [],
    }
    if cdag is not None:
        samples["compiled graph"] = []
    pc = time.perf_counter
    for _ in range(rounds):
        for name in list(samples):
            out = samples[name]
            for i in range(per_round):
                if name == "plain actor call":
                    t0 = pc()
                    await plain.echo.remote(payload)
                elif name == "plain async actor call":
                    t0 = pc()
                    await plain_async.echo.remote(payload)
                elif name == "compiled graph":
                    t0 = pc()
                    ray.get(cdag.execute(payload))
                elif name == "send_and_receive":
                    t0 = pc()
                    await runtime.send_and_receive("bench_echo", Ping(value=i, payload=payload))
                else:
                    t0 = pc()
                    await runtime.send("bench_echo", Ping(value=i, payload=payload))
                    await runtime.receive("bench_echo")
                out.append((pc() - t0) * 1e6)
    return samples


async def _plain_rate(plain: Any, n: int, in_flight: int) -> float:
    payload = b"x" * 64
    t0 = time.perf_counter()
    if in_flight <= 1:
        for _ in range(n):
            await plain.echo.remote(payload)
    else:
        pending: list[Any] = []
        for _ in range(n):
            pending.append(plain.echo.remote(payload))
            if len(pending) >= in_flight:
                await pending.pop(0)
        for ref in pending:
            await ref
    return n / (time.perf_counter() - t0)


def _compiled_rate(cdag: Any, n: int, in_flight: int) -> float:
    import ray

    payload = b"x" * 64
    t0 = time.perf_counter()
    pending: list[Any] = []
    for _ in range(n):
        pending.append(cdag.execute(payload))
        if len(pending) >= in_flight:
            ray.get(pending.pop(0))
    for ref in pending:
        ray.get(ref)
    return n / (time.perf_counter() - t0)


async def _batched_rate(runtime: Any, n: int, batch: int) -> tuple[float, float]:
    """Messages/s through the kernel and back with send_batch/receive_batch of ``batch``;
    also the p50 time of one batch's send+receive when run alone."""
    kid = "bench_echo"
    payload = b"x" * 64
    msgs = [Ping(value=i, payload=payload) for i in range(batch)]
    # latency of one batch, alone
    lat: list[float] = []
    for _ in range(5):
        t0 = time.perf_counter()
        await runtime.get_kernel(kid).send_batch(msgs)
        got = 0
        while got < batch:
            got += len(await runtime.get_kernel(kid).receive_batch(batch))
        lat.append((time.perf_counter() - t0) * 1e6)
    # throughput: a producer and a consumer running together
    total = max(batch, (n // batch) * batch)

    async def produce() -> None:
        for _ in range(total // batch):
            await runtime.get_kernel(kid).send_batch(msgs)

    async def consume() -> None:
        got = 0
        while got < total:
            got += len(await runtime.get_kernel(kid).receive_batch(max(batch, 1024)))

    t0 = time.perf_counter()
    await asyncio.gather(produce(), consume())
    return total / (time.perf_counter() - t0), statistics.median(lat)


async def _coalesced_rate(runtime: Any, n: int, senders: int) -> float:
    """Unbatched API (one message per send), many concurrent senders: coalescing."""
    kid = "bench_echo"
    payload = b"x" * 64
    per = max(1, n // senders)

    async def sender(s: int) -> None:
        for i in range(per):
            await runtime.send(kid, Ping(value=s * per + i, payload=payload))

    async def consume() -> None:
        got = 0
        while got < per * senders:
            got += len(await runtime.get_kernel(kid).receive_batch(4096))

    t0 = time.perf_counter()
    await asyncio.gather(consume(), *(sender(s) for s in range(senders)))
    return per * senders / (time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from pydotcompute.distributed.ray import RayRingKernelRuntime

    if not ray.is_initialized():
        init: dict[str, Any] = {
            "include_dashboard": False,
            "runtime_env": {"py_modules": [sys.modules[__name__]]},
        }
        if args.address:
            init["address"] = args.address
        else:
            init["num_cpus"] = args.num_cpus
        ray.init(**init)
    quick = args.quick
    rounds, per_round = (6, 25) if quick else (20, 50)
    n_plain = 600 if quick else 3000
    n_tp = 20_000 if quick else 100_000
    batch_sizes = [1, 16, 128, 1024] if quick else [1, 16, 128, 1024, 4096]

    plain = ray.remote(PlainEcho).remote()
    plain_async = ray.remote(PlainAsyncEcho).remote()
    await plain.echo.remote(b"")
    await plain_async.echo.remote(b"")
    cdag = None
    cg_skip = None
    try:
        from ray.dag import InputNode

        cg_actor = ray.remote(PlainEcho).remote()
        ray.get(cg_actor.echo.remote(b""))
        with InputNode() as inp:
            dag = cg_actor.echo.bind(inp)
        cdag = dag.experimental_compile()
        ray.get(cdag.execute(b"warm"))
    except Exception as exc:  # compiled graphs are experimental; report why
        cg_skip = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        cdag = None

    results: dict[str, Any] = {
        "benchmark": "ray",
        "quick": quick,
        "python": platform.python_version(),
        "ray": ray.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cluster_resources": {k: v for k, v in ray.cluster_resources().items() if "node" not in k},
    }
    async with RayRingKernelRuntime() as runtime:
        await runtime.launch("bench_echo")
        await runtime.activate("bench_echo")
        for i in range(50):  # warm both paths
            await runtime.send_and_receive("bench_echo", Ping(value=i))
            await plain.echo.remote(b"")

        samples = await _round_trips(runtime, plain, plain_async, cdag, rounds, per_round)
        base = statistics.median(samples["plain actor call"])
        base_async = statistics.median(samples["plain async actor call"])
        rt_rows = []
        for name, s in samples.items():
            p50 = statistics.median(s)
            rt_rows.append(
                {
                    "path": name,
                    "p50_us": p50,
                    "p99_us": _pct(s, 99),
                    "n": len(s),
                    "ratio_vs_plain_call": p50 / base,
                    "ratio_vs_plain_async_call": p50 / base_async,
                }
            )
        if cdag is None:
            rt_rows.append({"path": "compiled graph", "skipped": cg_skip})
        results["round_trip"] = rt_rows

        plain_seq = await _plain_rate(plain, n_plain // 2, 1)
        plain_pipe = await _plain_rate(plain, n_plain, 64)
        tp_rows: list[dict[str, Any]] = [
            {"path": "plain actor call, sequential", "msgs_per_s": plain_seq},
            {"path": "plain actor call, 64 in flight", "msgs_per_s": plain_pipe},
        ]
        if cdag is not None:
            tp_rows.append(
                {
                    "path": "compiled graph, 8 in flight",
                    "msgs_per_s": _compiled_rate(cdag, n_plain, 8),
                }
            )
        tp_rows.append(
            {
                "path": "send/receive, 64 concurrent senders (coalesced)",
                "msgs_per_s": await _coalesced_rate(runtime, n_tp // 4, 64),
            }
        )
        for b in batch_sizes:
            n = n_tp if b >= 16 else n_plain
            rate, lat = await _batched_rate(runtime, n, b)
            tp_rows.append(
                {
                    "path": f"send_batch/receive_batch, batch {b}",
                    "batch": b,
                    "msgs_per_s": rate,
                    "batch_round_trip_us": lat,
                }
            )
        for row in tp_rows:
            row["ratio_vs_plain_sequential"] = row["msgs_per_s"] / plain_seq
            row["ratio_vs_plain_pipelined"] = row["msgs_per_s"] / plain_pipe
        results["throughput"] = tp_rows

    if cdag is not None:
        cdag.teardown()
    sr = next(r for r in rt_rows if r["path"] == "send_and_receive")
    best = max(r["msgs_per_s"] for r in tp_rows if "batch" in r)
    results["targets"] = {
        "unbatched_round_trip_ratio": sr["ratio_vs_plain_call"],
        "unbatched_round_trip_ratio_vs_async_actor": sr["ratio_vs_plain_async_call"],
        "unbatched_round_trip_target": 1.2,
        "unbatched_round_trip_met": sr["ratio_vs_plain_call"] <= 1.2,
        "batched_throughput_ratio_vs_pipelined_plain": best / plain_pipe,
        "batched_throughput_ratio_vs_sequential_plain": best / plain_seq,
        "batched_throughput_target": 20.0,
        "batched_throughput_met": best / plain_pipe >= 20.0,
    }
    return results


def _print(results: dict[str, Any]) -> None:
    print(f"\nRay {results['ray']}, Python {results['python']}, {results['cpus']} CPUs")
    print(
        "\nround trip (one message)            p50 us    p99 us   x plain call  x plain async call"
    )
    for r in results["round_trip"]:
        if "skipped" in r:
            print(f"  {r['path']:<32}  skipped: {r['skipped']}")
            continue
        print(
            f"  {r['path']:<32} {r['p50_us']:8.0f} {r['p99_us']:9.0f}   {r['ratio_vs_plain_call']:9.2f}"
            f"   {r['ratio_vs_plain_async_call']:12.2f}"
        )
    print(
        "\nthroughput                                           msgs/s  batch rt us  x seq  x pipelined"
    )
    for r in results["throughput"]:
        lat = f"{r['batch_round_trip_us']:11.0f}" if "batch_round_trip_us" in r else " " * 11
        print(
            f"  {r['path']:<48} {r['msgs_per_s']:9.0f}  {lat}  {r['ratio_vs_plain_sequential']:5.1f}"
            f"  {r['ratio_vs_plain_pipelined']:6.1f}"
        )
    t = results["targets"]
    print(
        f"\ntargets: round trip {t['unbatched_round_trip_ratio']:.2f}x a plain actor call (<= 1.2: "
        f"{'met' if t['unbatched_round_trip_met'] else 'NOT met'}; "
        f"{t['unbatched_round_trip_ratio_vs_async_actor']:.2f}x a plain async actor call); batched "
        f"{t['batched_throughput_ratio_vs_pipelined_plain']:.0f}x pipelined plain calls/s "
        f"({t['batched_throughput_ratio_vs_sequential_plain']:.0f}x sequential; >= 20: "
        f"{'met' if t['batched_throughput_met'] else 'NOT met'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and messages")
    parser.add_argument("--address", default=None, help="join an existing cluster (ray.init)")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local instance")
    parser.add_argument("--out", default=str(HERE / "results" / "ray.json"))
    args = parser.parse_args()
    results = asyncio.run(run(args))
    _print(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    import ray

    ray.shutdown()


if __name__ == "__main__":
    # Run as the importable module ``ray_benchmark`` so that Ray ships the kernel and the
    # message classes by reference (workers import this file through py_modules).
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import importlib

    importlib.import_module("ray_benchmark").main()
