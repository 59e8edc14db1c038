"""The hosting bridge (tiers 2 and 3 through the runtime) against the floors of its mechanism.

One process, contenders interleaved in rounds (this kind of machine's wake-up latency drifts
with load, so only ratios taken within one round mean anything):

- ``thread floor``: an asyncio loop hands a message to a worker thread (``SimpleQueue``),
  which answers by ``loop.call_soon_threadsafe(fut.set_result, reply)``: the least a loop
  and a thread can do per round trip.
- ``tier="thread"``: the same echo actor launched in the runtime, ``send_and_receive``.
- ``socketpair floor``: an asyncio loop and a bare child interpreter echoing over a
  ``socketpair`` (``loop.sock_sendall`` / ``loop.sock_recv``), the message encoded and the
  reply decoded in the parent: a wake-up each way.
- ``tier="process"``: the echo actor in the runtime, ``send_and_receive``; and again with
  ``reply_spin_us=100`` (the loop polls the reply ring while the caller waits), round
  trips only, against ``CythonRingKernel`` used directly as its floor.
- ``CythonRingKernel`` and ``ThreadedRingKernel`` used directly (blocking calls, no loop).

Each round also measures pipelined throughput (a producer task sends N while the caller
receives N) through the runtime and through the direct kernels. Output: per contender the
median over rounds of its p50, and for each ratio the median and the spread (min-max)
over rounds; JSON in ``benchmarks/results/bridge.json``.

A last measurement counts the parent's descriptors (``/proc/self/fd``) with one
process-tier kernel running and again after 8 more: the growth divided by 8 is what each
kernel holds (what all kernels share, one watcher thread's wake-up pipe, is in both counts).

The summary rows (for ``run_all.py``) carry each ratio's median over rounds against its
same-run floor.

Run: ``python benchmarks/bridge_benchmark.py [--quick] [--rounds 5] [--trips 2000]
[--pipe 20000]`` (``--process-options '{"reply_spin_us": 100}'`` adds launch options for the
process tier; ``--quick``: 2 rounds of 300 trips and 3,000 pipelined messages).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import loop_factories, percentiles, print_table, save_json
from _suite import SLOW_WAKE_FLOOR_US, slow_floor, summary_row
from _tier_actors import Ping, Pong, echo_actor

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import InvalidConfigurationError

_ns = time.perf_counter_ns
#: Round trips each contender makes before it is timed. A process kernel started while the
#: previous round's child is still exiting (a third process on the cores) adapts its spin
#: down to parking and needs up to ~1,500 quiet trips to spin again: with a short warm-up
#: the direct kernel's p50 read 10-14 us instead of its steady 1.3-2 us.
WARMUP = 3000
#: Seconds to let the process settle before the first round. Importing numpy starts
#: OpenBLAS's thread pool, which spins a core for ~0.1 s; wake-ups are faster while another
#: core is busy, so the first contender (the thread floor) read 15-20 us instead of ~50 us
#: in about one run in three, and a two-round (--quick) median took it for a 2-3x ratio.
SETTLE_S = 0.5

_ECHO_CHILD = """
import os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
recv, send = s.recv, s.sendall
while True:
    data = recv(4096)
    if not data:
        break
    send(data)
"""


# --- floors -------------------------------------------------------------------------------


async def thread_floor(trips: int) -> list[int]:
    """asyncio + a worker thread answering through ``call_soon_threadsafe``."""
    loop = asyncio.get_running_loop()
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def server() -> None:
        call = loop.call_soon_threadsafe
        while (item := q.get()) is not None:
            fut, msg = item
            call(fut.set_result, Pong(value=msg.value))

    t = threading.Thread(target=server, daemon=True)
    t.start()
    samples = []
    for i in range(trips + WARMUP):
        t0 = _ns()
        fut = loop.create_future()
        q.put((fut, Ping(value=i)))
        await fut
        if i >= WARMUP:
            samples.append(_ns() - t0)
    q.put(None)
    t.join()
    return samples


async def socketpair_floor(trips: int) -> list[int]:
    """asyncio + a bare child echoing bytes over a socketpair (encode and decode here)."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    child = subprocess.Popen(  # noqa: ASYNC220 (started once, before the timed trips)
        [sys.executable, "-c", _ECHO_CHILD, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    samples = []
    try:
        for i in range(trips + WARMUP):
            t0 = _ns()
            await loop.sock_sendall(ours, Ping(value=i).serialize())
            data = await loop.sock_recv(ours, 4096)
            Ping.deserialize(data)
            if i >= WARMUP:
                samples.append(_ns() - t0)
    finally:
        ours.close()
        child.wait(5)
    return samples


# --- through the runtime ------------------------------------------------------------------


async def runtime_measure(tier: str, trips: int, pipe: int, options: dict[str, Any]) -> Any:
    """``send_and_receive`` samples, then pipelined msg/s, of the echo actor on ``tier``."""
    async with RingKernelRuntime() as rt:
        await rt.launch("echo", echo_actor, input_type=Ping, output_type=Pong, tier=tier, **options)
        await rt.activate("echo")
        samples = []
        for i in range(trips + WARMUP):
            t0 = _ns()
            await rt.send_and_receive("echo", Ping(value=i), timeout=10.0)
            if i >= WARMUP:
                samples.append(_ns() - t0)
        if not pipe:
            return samples, None

        async def producer() -> None:
            for i in range(pipe):
                await rt.send("echo", Ping(value=i))

        t0 = time.perf_counter()
        prod = asyncio.ensure_future(producer())
        for _ in range(pipe):
            await rt.receive("echo", timeout=30.0)
        rate = pipe / (time.perf_counter() - t0)
        await prod
    return samples, rate


# --- direct kernels -----------------------------------------------------------------------


def direct_measure(tier: str, trips: int, pipe: int) -> Any:
    """A ``ThreadedRingKernel`` / ``CythonRingKernel`` used directly (blocking calls)."""
    from pydotcompute.ring_kernels import CythonRingKernel, ThreadedRingKernel

    cls = ThreadedRingKernel if tier == "thread" else CythonRingKernel
    with cls(f"bench-{tier}", echo_actor) as kernel:
        send, receive = kernel.send, kernel.receive
        samples = []
        for i in range(trips + WARMUP):
            t0 = _ns()
            send(Ping(value=i))
            receive(timeout=10.0)
            if i >= WARMUP:
                samples.append(_ns() - t0)

        def producer() -> None:
            for i in range(pipe):
                send(Ping(value=i), timeout=30.0)

        t0 = time.perf_counter()
        t = threading.Thread(target=producer, daemon=True)
        t.start()
        for _ in range(pipe):
            receive(timeout=30.0)
        rate = pipe / (time.perf_counter() - t0)
        t.join()
    return samples, rate


# --- rounds -------------------------------------------------------------------------------


def one_round(
    trips: int, pipe: int, proc_opts: dict[str, Any], only: str | None = None
) -> dict[str, Any]:
    factory = loop_factories()[0][1]
    out: dict[str, Any] = {}

    def on_loop(coro: Any) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)

    if only != "process":
        out["thread floor"] = (on_loop(thread_floor(trips)), None)
        out["tier=thread"] = on_loop(runtime_measure("thread", trips, pipe, {}))
        out["ThreadedRingKernel direct"] = direct_measure("thread", trips, pipe)
    if only == "thread":
        return {k: (percentiles(s)["p50_us"], rate) for k, (s, rate) in out.items()}
    out["socketpair floor"] = (on_loop(socketpair_floor(trips)), None)
    out["tier=process"] = on_loop(runtime_measure("process", trips, pipe, proc_opts))
    spin_opts = {**proc_opts, "reply_spin_us": 100}
    try:
        out[SPIN_ROW] = on_loop(runtime_measure("process", trips, 0, spin_opts))
    except InvalidConfigurationError as exc:  # a checkout without the option
        if "reply_spin_us" not in str(exc):
            raise
    out["CythonRingKernel direct"] = direct_measure("process", trips, pipe)
    return {k: (percentiles(s)["p50_us"], rate) for k, (s, rate) in out.items()}


SPIN_ROW = "tier=process, reply_spin_us=100"

RATIOS = (
    ("thread p50 / thread floor", "tier=thread", "thread floor", "p50"),
    ("process p50 / socketpair floor", "tier=process", "socketpair floor", "p50"),
    ("process p50 / direct kernel", "tier=process", "CythonRingKernel direct", "p50"),
    ("process, reply_spin_us=100, p50 / direct kernel", SPIN_ROW, "CythonRingKernel direct", "p50"),
    ("thread pipelined / direct kernel", "tier=thread", "ThreadedRingKernel direct", "rate"),
    ("process pipelined / direct kernel", "tier=process", "CythonRingKernel direct", "rate"),
)

#: summary rows: (metric name, ours, floor, p50 or rate, the floor in words)
SUMMARY = (
    ("thread, round trip p50", "tier=thread", "thread floor", "p50", "call_soon_threadsafe"),
    ("process, round trip p50", "tier=process", "socketpair floor", "p50", "socketpair child"),
    (
        "process, reply_spin_us=100, round trip p50",
        SPIN_ROW,
        "CythonRingKernel direct",
        "p50",
        "CythonRingKernel direct",
    ),
    (
        "thread, pipelined throughput",
        "tier=thread",
        "ThreadedRingKernel direct",
        "rate",
        "ThreadedRingKernel direct",
    ),
    (
        "process, pipelined throughput",
        "tier=process",
        "CythonRingKernel direct",
        "rate",
        "CythonRingKernel direct",
    ),
)
#: the p50 (us) beyond which a floor counts as slow (see `_suite.SLOW_WAKE_FLOOR_US`)
SLOW_FLOORS = {"thread floor": SLOW_WAKE_FLOOR_US}
DESCRIPTORS_METRIC = "descriptors per process kernel"
#: how many process-tier kernels the descriptor count launches
DESCRIPTOR_KERNELS = 8


def _open_descriptors() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc (macOS, Windows)
        return None


async def descriptors_per_kernel(n: int = DESCRIPTOR_KERNELS) -> float | None:
    """The parent's descriptors per process-tier kernel: ``/proc/self/fd`` counted with one
    kernel running and after ``n`` more, divided by ``n`` (None without /proc). The first
    kernel sets up what every kernel shares, so the growth is what each one holds."""
    async with RingKernelRuntime() as rt:
        for i in range(n + 1):
            if i == 1:
                before = _open_descriptors()
                if before is None:
                    return None
            await rt.launch(f"fd{i}", echo_actor, input_type=Ping, output_type=Pong, tier="process")
            await rt.activate(f"fd{i}")
        after = _open_descriptors()
    return None if after is None else (after - before) / n


def summary(rounds: list[dict[str, Any]], fds_per_kernel: float | None) -> list[dict[str, Any]]:
    """The suite's rows: each path against its same-run floor, the ratio the median of the
    same-round ratios, then the descriptors per process-tier kernel."""
    rows = []
    for metric, ours, floor, kind, floor_name in SUMMARY:
        idx = 0 if kind == "p50" else 1
        if not all(ours in r and floor in r for r in rounds):
            continue
        vals = [r[ours][idx] / r[floor][idx] for r in rounds]
        row = summary_row(
            metric,
            statistics.median(r[ours][idx] for r in rounds),
            "us" if kind == "p50" else "msg/s",
            higher_is_better=kind != "p50",
            baseline=statistics.median(r[floor][idx] for r in rounds),
            baseline_name=floor_name,
            note=f"median of {len(rounds)} rounds; ratio range {min(vals):.2f}-{max(vals):.2f}",
            slow_baseline=SLOW_FLOORS.get(floor) if kind == "p50" else None,
        )
        row["ratio"] = statistics.median(vals)  # of the same-round ratios
        rows.append(row)
    rows.append(
        summary_row(
            DESCRIPTORS_METRIC,
            fds_per_kernel,
            "fd",
            higher_is_better=False,
            note=f"parent's /proc/self/fd, {DESCRIPTOR_KERNELS} kernels launched"
            if fds_per_kernel is not None
            else "not measured: no /proc/self/fd here",
            compare=False,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds, short runs (the suite's)")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (--quick: 2)")
    ap.add_argument("--trips", type=int, default=None, help="default 2000 (--quick: 300)")
    ap.add_argument("--pipe", type=int, default=None, help="default 20000 (--quick: 3000)")
    ap.add_argument("--process-options", default="{}", help="JSON launch options")
    ap.add_argument(
        "--only", choices=("thread", "process"), default=None, help="measure one tier's rows"
    )
    ap.add_argument(
        "--busy-core",
        action="store_true",
        help="keep one core busy (a spinning child) for the whole run: beside a busy core "
        "a woken thread does not wait for an idle core to wake up, so the thread floor "
        "reads what the wake-up itself costs",
    )
    ap.add_argument("--label", default="", help="saved in the JSON (which checkout ran)")
    ap.add_argument("--json", default=None, help="where to save (default results/bridge.json)")
    args = ap.parse_args(argv)
    quick_sizes = {"rounds": 2, "trips": 300, "pipe": 3000}
    full_sizes = {"rounds": 5, "trips": 2000, "pipe": 20000}
    for key, value in (quick_sizes if args.quick else full_sizes).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    proc_opts = json.loads(args.process_options)
    spinner = None
    if args.busy_core:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(SETTLE_S)
        rounds = [
            one_round(args.trips, args.pipe, proc_opts, args.only) for _ in range(args.rounds)
        ]
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()

    rows = []
    for name in rounds[0]:
        p50s = [r[name][0] for r in rounds]
        rates = [r[name][1] for r in rounds if r[name][1] is not None]
        rows.append(
            {
                "what": name,
                "p50_us (median)": statistics.median(p50s),
                "p50 min-max": f"{min(p50s):.1f}-{max(p50s):.1f}",
                "msg/s (median)": statistics.median(rates) if rates else None,
            }
        )
    print_table(
        f"bridge round trips, {args.rounds} rounds (pid {os.getpid()}, {args.label}"
        + (", one core kept busy)" if args.busy_core else ")"),
        rows,
        ["what", "p50_us (median)", "p50 min-max", "msg/s (median)"],
    )
    ratios = []
    for label, ours, floor, kind in RATIOS:
        idx = 0 if kind == "p50" else 1
        if not all(ours in r and floor in r for r in rounds):
            continue  # (an older checkout without reply_spin_us)
        vals = [r[ours][idx] / r[floor][idx] for r in rounds]
        floors = [r[floor][idx] for r in rounds]
        ratios.append(
            {
                "ratio": label,
                "median": statistics.median(vals),
                "min-max": f"{min(vals):.2f}-{max(vals):.2f}",
                "floor (median)": f"{statistics.median(floors):,.3g} "
                + ("us" if kind == "p50" else "msg/s"),
                "floor min-max": f"{min(floors):,.3g}-{max(floors):,.3g}",
            }
        )
    print_table(
        "same-round ratios (beside each, the floor's own value)",
        ratios,
        ["ratio", "median", "min-max", "floor (median)", "floor min-max"],
    )
    for floor, limit in SLOW_FLOORS.items():
        slow = [
            r[floor][0]
            for r in rounds
            if floor in r and slow_floor(r[floor][0], limit, higher_is_better=False)
        ]
        if slow:
            print(
                f"\nWARNING: the {floor} read {', '.join(f'{v:.1f}' for v in slow)} us in "
                f"{len(slow)} of {len(rounds)} rounds (slow: > {limit:g} us). Wake-ups are "
                "slow on this machine now; a ratio against such a floor hides what the "
                "runtime adds (trip_counts_benchmark.py counts it instead)."
            )
    fds = None
    if args.only != "thread":
        factory = loop_factories()[0][1]
        with asyncio.Runner(loop_factory=factory) as runner:
            fds = runner.run(descriptors_per_kernel())
        print(f"\n{DESCRIPTORS_METRIC}: {fds} (target <= 4)")
    save_json(
        "bridge",
        {
            "label": args.label,
            "rounds": rounds,
            "rows": rows,
            "ratios": ratios,
            "descriptors_per_process_kernel": fds,
            "args": vars(args),
            "summary": summary(rounds, fds),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
