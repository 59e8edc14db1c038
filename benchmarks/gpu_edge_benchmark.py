"""GPU -> GPU pipelines: a ``device-ring`` edge against the loop path.

Two GPU kernels on one device, ``a -> b``, each handler a light relay (``seq`` kept,
``hops`` counted). The same run measures both edge kinds, one fresh runtime each:

- ``device-ring``: ``connect("a", "b")``: ``a``'s persistent kernel writes its replies
  into a ring in device memory that ``b``'s kernel polls; the host sees the message twice
  (sending it into ``a``, receiving it from ``b``);
- ``loop``: ``connect("a", "b", direct=False)``: ``a``'s replies cross the event loop into
  ``b``'s inbox ring.

Figures per kind: the round trip ``send(a) -> receive(b)`` one message at a time (p50 and
p99 in microseconds) and the throughput with every message in flight (messages per
second, a sender task beside the receiver). Every run also checks that each message
arrived exactly once, in order, through both kernels, and reports the edge's counters.

    python benchmarks/gpu_edge_benchmark.py [--quick] [--json PATH] [--simulator]

Used by the hardware check (``tests/gpu/gpu_check.py``, step ``edge``) and the hardware
suite (``tests/gpu/test_gpu_ring_kernel_hw.py``).
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

from pydotcompute import RingKernelRuntime, message  # noqa: E402

KINDS = ("device-ring", "loop")


@message
class EdgeHop:
    seq: int
    hops: int


def relay_handler(inp: Any, out: Any, state: Any) -> int:
    out.seq = inp.seq
    out.hops = inp.hops + 1
    return 0


def _pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


async def _one_kind(kind: str, n_rtt: int, n_tput: int, timeout: float) -> dict[str, Any]:
    async with RingKernelRuntime() as rt:
        for kid in ("b", "a"):
            await rt.launch(kid, relay_handler, input_type=EdgeHop, output_type=EdgeHop, tier="gpu")
            await rt.activate(kid)
        rt.connect("a", "b", direct=kind != "loop")
        (edge,) = rt.edges()
        if edge.kind != kind:
            raise RuntimeError(f"asked for a {kind} edge, got {edge.kind} ({edge.why})")
        seqs: list[int] = []
        rtt: list[int] = []
        for i in range(n_rtt):
            t0 = time.perf_counter_ns()
            await rt.send("a", EdgeHop(seq=i, hops=0))
            got = await rt.receive("b", timeout=timeout)
            rtt.append(time.perf_counter_ns() - t0)
            seqs.append(got.seq)
        ok_rtt = seqs == list(range(n_rtt))

        async def sender() -> None:
            for i in range(n_tput):
                await rt.send("a", EdgeHop(seq=n_rtt + i, hops=0), timeout=timeout)

        t0 = time.perf_counter()
        task = asyncio.create_task(sender())
        got_all = [await rt.receive("b", timeout=timeout) for _ in range(n_tput)]
        await task
        wall = time.perf_counter() - t0
        ok_tput = [g.seq for g in got_all] == [n_rtt + i for i in range(n_tput)]
        ok_hops = all(g.hops == 2 for g in got_all)
        (edge,) = rt.edges()
        return {
            "kind": kind,
            "rtt_p50_us": round(_pct(rtt, 0.5), 2),
            "rtt_p99_us": round(_pct(rtt, 0.99), 2),
            "msg_per_s": round(n_tput / wall, 1),
            "exactly_once_in_order": ok_rtt and ok_tput and ok_hops,
            "counters": edge.counters,
        }


async def measure(n_rtt: int, n_tput: int, timeout: float = 30.0) -> dict[str, Any]:
    """Both kinds, one after the other; ``device_over_loop`` compares their figures."""
    rows = {kind: await _one_kind(kind, n_rtt, n_tput, timeout) for kind in KINDS}
    dev, loop = rows["device-ring"], rows["loop"]
    return {
        "rows": list(rows.values()),
        "rtt_loop_over_device": round(loop["rtt_p50_us"] / dev["rtt_p50_us"], 2)
        if dev["rtt_p50_us"]
        else None,
        "tput_device_over_loop": round(dev["msg_per_s"] / loop["msg_per_s"], 2)
        if loop["msg_per_s"]
        else None,
        "exactly_once_in_order": all(r["exactly_once_in_order"] for r in rows.values()),
    }


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--json", default=None, help="where to save results")
    ap.add_argument("--simulator", action="store_true", help="smoke-run on the CUDA simulator")
    args = ap.parse_args(argv)
    if args.simulator:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before Numba is imported
    from gpu_ring_kernel_benchmark import unavailable_reason

    reason = unavailable_reason(args.simulator)
    if reason is not None:
        print(f"GPU edge benchmark skipped: {reason}")
        save_json("gpu_edge", {"available": False, "reason": reason}, args.json)
        return None
    n_rtt, n_tput = (200, 2_000) if args.quick else (2_000, 50_000)
    if args.simulator:
        n_rtt, n_tput = 20, 100
    r = asyncio.run(measure(n_rtt, n_tput))
    print_table(
        "GPU -> GPU edge (send to a, receive from b)",
        r["rows"],
        ["kind", "rtt_p50_us", "rtt_p99_us", "msg_per_s", "exactly_once_in_order"],
    )
    save_json("gpu_edge", {"available": True, **r}, args.json)
    return r


if __name__ == "__main__":
    main()
