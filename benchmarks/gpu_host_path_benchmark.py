"""Host-side cost per message of a GPU actor's rings, measured without a GPU.

The GPU round trip target (<= 5 us) leaves little room for Python on the host: every publish
and every take is NumPy slicing over mapped memory plus a fence. This script drives the
host half (`HostRings`) over plain NumPy arrays, with a stand-in for the device that moves
requests to replies in one vectorized step (not measured), and counts for each way of
sending what the host thread executes per message:

- Python bytecode instructions (`sys.settrace` with opcode events: deterministic, and
  what a batch API saves shows up directly), and
- nanoseconds (a separate, untraced run),

for one message per publish (the `send`/`receive` path, the same-run baseline), batches of
64 and 4096 records (`send_records`/`receive_records`), and the conversions between message
objects and records that the object APIs add. The hardware figure (the device side and
PCIe) is left to `gpu_ring_kernel_benchmark.py` on a GPU.

Run ``python benchmarks/gpu_host_path_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, save_json

from pydotcompute.ring_kernels.message import message
from pydotcompute.ring_kernels.tiers.gpu import layout as L
from pydotcompute.ring_kernels.tiers.gpu.host import HostRings


@message
class Req:
    seq: int
    x: float


@message
class Rep:
    seq: int
    y: float


CAP = 4096


def make_rings() -> HostRings:
    return HostRings(
        {
            "inbox": np.zeros(CAP, Req.dtype),  # type: ignore[attr-defined]
            "outbox": np.zeros(CAP + 1, Rep.dtype),  # type: ignore[attr-defined]
            "ostat": np.zeros(CAP + 1, np.int64),
            "lat": np.zeros(CAP, np.int64),
            "ctl": np.zeros(L.CTL_WORDS, np.int64),
        }
    )


def device_step(r: HostRings) -> None:
    """What the kernel would do for everything published: reply, advance both counters."""
    ctl = r.ctl
    head, tail = int(ctl[L.IN_HEAD]), int(ctl[L.DOORBELL]) >> L.DOORBELL_SHIFT
    n = tail - head
    if n <= 0:
        return
    src = np.arange(head, tail) % CAP
    out_tail = int(ctl[L.OUT_TAIL])
    dst = np.arange(out_tail, out_tail + n) % CAP
    r.outbox["seq"][dst] = r.inbox["seq"][src]
    r.outbox["y"][dst] = r.inbox["x"][src] * 2
    ctl[L.IN_HEAD] = tail
    ctl[L.OUT_TAIL] = out_tail + n


class OpcodeCounter:
    """Counts bytecode instructions run on this thread while enabled."""

    def __init__(self) -> None:
        self.count = 0
        self.enabled = False

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode" and self.enabled:
            self.count += 1
        return self._trace

    def __enter__(self) -> OpcodeCounter:
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


def run_path(batch: int, total: int, objects: bool, counter: OpcodeCounter | None) -> int:
    """Send ``total`` requests in publishes of ``batch`` and take the replies; returns ns
    spent on the host side (the device step excluded)."""
    r = make_rings()
    recs = np.zeros(batch, Req.dtype)  # type: ignore[attr-defined]
    recs["seq"] = np.arange(batch)
    msgs = [Req(seq=i, x=float(i)) for i in range(batch)]
    host_ns = 0
    clock = time.perf_counter_ns
    for _ in range(total // batch):
        t0 = clock()
        if counter is not None:
            counter.enabled = True
        batch_recs = Req.to_records(msgs) if objects else recs  # type: ignore[attr-defined]
        r.publish(batch_recs)
        if counter is not None:
            counter.enabled = False
        t1 = clock()
        device_step(r)
        t2 = clock()
        if counter is not None:
            counter.enabled = True
        got, _ = r.take(r.ready())
        if objects:
            Rep.from_records(got)  # type: ignore[attr-defined]
        if counter is not None:
            counter.enabled = False
        host_ns += (t1 - t0) + (clock() - t2)
    return host_ns


def measure(quick: bool) -> list[dict[str, Any]]:
    total = 8192 if quick else 65536
    variants: list[tuple[str, int, bool]] = [
        ("1 per publish, records (send/receive path)", 1, False),
        ("64 per publish, records", 64, False),
        ("4096 per publish, records (send_records)", 4096, False),
        ("1 per publish, message objects", 1, True),
        ("4096 per publish, message objects (send_batch)", 4096, True),
    ]
    rows: list[dict[str, Any]] = []
    for name, batch, objects in variants:
        n = total if batch > 1 else total // 8  # one at a time is slow under the tracer
        with OpcodeCounter() as counter:
            run_path(batch, max(n, batch), objects, counter)
        ops = counter.count / max(n, batch)
        ns = min(run_path(batch, total, objects, None) for _ in range(3)) / total
        rows.append({"variant": name, "opcodes/msg": ops, "ns/msg": ns})
    base = rows[0]
    for row in rows:
        row["opcodes ratio"] = row["opcodes/msg"] / base["opcodes/msg"]
        row["ns ratio"] = row["ns/msg"] / base["ns/msg"]
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages")
    ap.add_argument("--json", default=None, help="where to save results")
    args = ap.parse_args(argv)
    rows = measure(args.quick)
    print_table(
        "GPU actor host path per message (no device; baseline: one message per publish)",
        rows,
        ["variant", "opcodes/msg", "ns/msg", "opcodes ratio", "ns ratio"],
    )
    save_json("gpu_host_path", {"quick": args.quick, "rows": rows}, args.json)
    return rows


if __name__ == "__main__":
    main()
