"""A pipeline across two Ray nodes: the runtime against the same hops written by hand.

Both run, interleaved in rounds, on one `ray.cluster_utils.Cluster` started here: a head
(resource ``near``) and a second node (resource ``far``), both raylets on 127.0.0.2 (loopback)
(pass ``--address`` to use a real cluster whose nodes offer ``near`` and ``far``).

* ``runtime``: ``asyncio -> ray (far node) -> ray (head)``: a `RingKernelRuntime` with a
  relay kernel on the asyncio tier, connected to a Ray-tier relay placed with
  ``resources={"far": 1}``, connected to a Ray-tier relay on the head (``near``): the
  edge between the two Ray kernels is direct, actor to actor; the driver sends
  N messages into the first and receives them from the last.
* ``by hand``: the same two hops written with Ray actor handles: the driver encodes the
  messages and sends batches of 64 (8 calls in flight) to an actor on the far node, which
  decodes them, encodes them again and hands each batch to an actor on the head with one
  call, which decodes them; the figure counts messages the head took.

Target (DESIGN.md section 8): runtime >= 0.5 x by hand, in the same run.

Run ``python benchmarks/ray_multinode_benchmark.py [--quick]``; JSON goes to
``benchmarks/results/ray_multinode.json``. The kernels and messages live in this file,
which the Ray workers import through ``runtime_env={"py_modules": [...]}``.
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

from pydotcompute import RingKernelRuntime, message  # noqa: E402
from pydotcompute.ring_kernels.message import deserialize_message  # noqa: E402

BATCH = 64
IN_FLIGHT = 8


@message
class Item:
    seq: int
    payload: bytes = b""


async def relay(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


class HeadStage:
    """The last hop by hand: decodes a batch, counts it."""

    def __init__(self) -> None:
        self.taken = 0

    def take(self, batch: list[bytes]) -> int:
        for data in batch:
            deserialize_message(data)
        self.taken += len(batch)
        return len(batch)


class FarStage:
    """The first hop by hand: decodes a batch, encodes it again, hands it to the head."""

    def __init__(self, head: Any) -> None:
        self.head = head

    async def take(self, batch: list[bytes]) -> int:
        out = [deserialize_message(data).serialize() for data in batch]
        n: int = await self.head.take.remote(out)
        return n


async def by_hand(far: Any, n: int, payload: bytes) -> float:
    """Messages/s through the hand-written two hops (batches of 64, 8 in flight)."""
    t0 = time.perf_counter()
    pending: set[Any] = set()
    done = 0
    for start in range(0, n, BATCH):
        batch = [Item(seq=i, payload=payload).serialize() for i in range(start, start + BATCH)]
        pending.add(asyncio.ensure_future(far.take.remote(batch)))
        if len(pending) >= IN_FLIGHT:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done += sum(f.result() for f in finished)
    for f in pending:
        done += await f
    return done / (time.perf_counter() - t0)


async def through_runtime(rt: RingKernelRuntime, n: int, payload: bytes, base: int) -> float:
    """Messages/s from ``send`` into the asyncio stage to ``receive`` from the head stage."""

    async def feed() -> None:
        for i in range(n):
            await rt.send("a", Item(seq=base + i, payload=payload))

    t0 = time.perf_counter()
    feeding = asyncio.create_task(feed())
    for i in range(n):
        got = await rt.receive("c", timeout=60)
        assert got.seq == base + i, (got.seq, base + i)
    await feeding
    return n / (time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    import pydotcompute

    cluster = None
    if args.address is None:
        from ray.cluster_utils import Cluster

        # 127.0.0.2, not 127.0.0.1: Ray rewrites an address it calls local given to
        # ray.init into the machine's outward one, where a cluster bound to loopback does
        # not answer; the rest of 127.0.0.0/8 is loopback too (Linux) and left alone
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 2,
                "resources": {"near": 4},
                "node_ip_address": "127.0.0.2",
                "include_dashboard": False,
            },
        )
        cluster.add_node(num_cpus=2, resources={"far": 4}, node_ip_address="127.0.0.2")
    ray.init(
        address=args.address or cluster.address,  # type: ignore[union-attr]
        runtime_env={"py_modules": [pydotcompute, sys.modules[__name__]]},
        logging_level="ERROR",
    )
    try:
        n = 4000 if args.quick else 20_000
        rounds = 3 if args.quick else 5
        payload = b"x" * 64
        head = ray.remote(HeadStage).options(num_cpus=0, resources={"near": 1}).remote()
        far = ray.remote(FarStage).options(num_cpus=0, resources={"far": 1}).remote(head)
        await far.take.remote([Item(seq=0).serialize()])
        rows: dict[str, list[float]] = {"runtime": [], "by hand": []}
        async with RingKernelRuntime() as rt:
            await rt.launch("a", relay, input_type=Item, output_type=Item)
            await rt.launch(
                "b", relay, input_type=Item, output_type=Item, tier="ray", resources={"far": 1}
            )
            await rt.launch(
                "c", relay, input_type=Item, output_type=Item, tier="ray", resources={"near": 1}
            )
            rt.connect("a", "b")
            rt.connect("b", "c")
            for kid in "abc":
                await rt.activate(kid)
            await through_runtime(rt, 500, payload, 0)  # warm
            await by_hand(far, 512, payload)
            for r in range(rounds):
                rows["runtime"].append(await through_runtime(rt, n, payload, (r + 1) * n))
                rows["by hand"].append(await by_hand(far, n, payload))
        med = {k: statistics.median(v) for k, v in rows.items()}
        return {
            "benchmark": "ray_multinode",
            "quick": args.quick,
            "python": platform.python_version(),
            "ray": ray.__version__,
            "cpus": os.cpu_count(),
            "messages_per_round": n,
            "rounds": rows,
            "median_msg_per_s": med,
            "ratio": med["runtime"] / med["by hand"],
            "target": ">= 0.5",
        }
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--address", default=None)
    parser.add_argument("--out", default=str(HERE / "results" / "ray_multinode.json"))
    args = parser.parse_args()
    results = asyncio.run(run(args))
    med = results["median_msg_per_s"]
    print(f"\ncross-node asyncio -> ray -> ray, {results['messages_per_round']} messages a round")
    for name, rate in med.items():
        print(
            f"  {name:<8} {rate:>10,.0f} msg/s   rounds {[round(x) for x in results['rounds'][name]]}"
        )
    print(f"  ratio    {results['ratio']:.2f} x (target {results['target']})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    # Run as the importable module ``ray_multinode_benchmark`` so that Ray ships the actors
    # and the message class by reference (workers import this file through py_modules).
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import importlib

    importlib.import_module("ray_multinode_benchmark").main()
