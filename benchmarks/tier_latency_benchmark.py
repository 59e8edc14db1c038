"""Tiers 2 and 3 (and the in-process FastSPSCQueue) against floors measured in the same run.

What it measures:

- ``FastSPSCQueue`` ``put`` + ``get`` in one thread (compiled extension and pure-Python
  twin) against ``collections.deque`` ``append`` + ``popleft``, the cheapest pair of C
  calls Python offers. Both the raw figure and the figure minus an empty loop are shown.
- Tier 2 round trip: ``kernel.send(Ping)`` -> actor thread ``ctx.receive`` / ``ctx.send``
  -> ``kernel.receive`` with a message built per trip, against two ``queue.SimpleQueue``
  objects ping-ponging the same message between two threads (the floor), plus our own
  ``SPSCQueue`` / ``SyncQueue`` in the same ping-pong.
- Tier 3 round trip: the same through ``CythonRingKernel`` (a child process; MessagePack
  both ways through two shared-memory rings) against a raw two-process ring with a pure
  busy poll (bytes, no encoding; then with the MessagePack encode/decode added),
  ``multiprocessing.Pipe`` and ``multiprocessing.Queue`` (pickled messages).
- ``--spin-sweep``: tier-3 round trip for several spin budgets, back to back and paced
  (one message per millisecond, where the budget decides how much CPU an idle wait burns),
  on a quiet machine and with one CPU-bound process competing for the cores. This is the
  measurement behind the default ``CythonKernelConfig.spin_us``.

Each round trip is timed with ``perf_counter_ns`` around send + receive; tables give p50,
p99 and the worst trip. Ratios are ours / floor (lower is better) except "x faster", which
is the peer's p50 / ours. Run ``python benchmarks/tier_latency_benchmark.py [--quick]
[--spin-sweep] [--json PATH]``; results go to ``benchmarks/results/tiers.json``.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import queue
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import percentiles, print_table, save_json
from _suite import SLOW_WAKE_FLOOR_US
from _tier_actors import (
    Ping,
    Pong,
    cpu_hog,
    echo_actor,
    mp_pipe_echo,
    mp_queue_echo,
    raw_ring_echo,
)

from pydotcompute.ring_kernels import _native as _cython
from pydotcompute.ring_kernels._native import spsc_py as _spsc_py
from pydotcompute.ring_kernels.message import message_decoder
from pydotcompute.ring_kernels.tiers.process.kernel import CythonKernelConfig, CythonRingKernel
from pydotcompute.ring_kernels.tiers.thread import ThreadedRingKernel
from pydotcompute.ring_kernels.tiers.thread.sync_queue import SPSCQueue, SyncQueue

_ns = time.perf_counter_ns
SPAWN = multiprocessing.get_context("spawn")


def _row(name: str, samples: list[int], **extra: Any) -> dict[str, Any]:
    p = percentiles(samples, (50, 99))
    return {
        "what": name,
        "p50_us": p["p50_us"],
        "p99_us": p["p99_us"],
        "max_us": p["max_us"],
    } | extra


# --- FastSPSCQueue ---------------------------------------------------------------------------


def _per_op_ns(put: Any, get: Any, n: int) -> float:
    x = object()
    best = float("inf")
    for _ in range(5):
        t0 = _ns()
        for _ in range(n):
            put(x)
            get()
        best = min(best, (_ns() - t0) / n)
    return best


def _empty_loop_ns(n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = _ns()
        for _ in range(n):
            pass
        best = min(best, (_ns() - t0) / n)
    return best


def bench_fast_queue(n: int) -> list[dict[str, Any]]:
    loop = _empty_loop_ns(n)
    dq: collections.deque[Any] = collections.deque()
    floor = _per_op_ns(dq.append, dq.popleft, n)
    rows = [{"what": "deque append+popleft (floor)", "ns": floor, "ns_minus_loop": floor - loop}]
    impls = [("FastSPSCQueue (twin)", _spsc_py.FastSPSCQueue)]
    if _cython.CYTHON_AVAILABLE:
        impls.insert(0, ("FastSPSCQueue (Cython)", _cython.FastSPSCQueue))
    for name, cls in impls:
        q = cls(1024)
        ns = _per_op_ns(q.put, q.get, n)
        rows.append({"what": name, "ns": ns, "ns_minus_loop": ns - loop, "ratio": ns / floor})
    sq: queue.SimpleQueue[Any] = queue.SimpleQueue()
    ns = _per_op_ns(sq.put_nowait, sq.get_nowait, n)
    rows.append(
        {"what": "SimpleQueue put+get", "ns": ns, "ns_minus_loop": ns - loop, "ratio": ns / floor}
    )
    for r in rows:
        r["empty_loop_ns"] = loop
    return rows


# --- tier 2 ----------------------------------------------------------------------------------


def _thread_ping_pong(make: Any, n: int, warmup: int) -> list[int]:
    a, b = make(), make()
    put_a, get_a, put_b, get_b = a.put, a.get, b.put, b.get
    stop = object()

    def server() -> None:
        while True:
            item = get_a()
            if item is stop:
                return
            put_b(Pong(value=item.value))

    t = threading.Thread(target=server, name="bench-floor")
    t.start()
    samples = []
    for i in range(n + warmup):
        t0 = _ns()
        put_a(Ping(value=i))
        get_b()
        samples.append(_ns() - t0)
    put_a(stop)
    t.join()
    return samples[warmup:]


def _threaded_kernel_rt(n: int, warmup: int) -> list[int]:
    with ThreadedRingKernel("bench_t2", echo_actor) as kernel:
        send, receive = kernel.send, kernel.receive
        samples = []
        for i in range(n + warmup):
            t0 = _ns()
            send(Ping(value=i))
            receive()
            samples.append(_ns() - t0)
    return samples[warmup:]


def bench_tier2(n: int, warmup: int, repeats: int) -> list[dict[str, Any]]:
    floor_s: list[int] = []
    ours_s: list[int] = []
    spsc_s: list[int] = []
    sync_s: list[int] = []
    for _ in range(repeats):  # interleaved so that load changes hit every row alike
        floor_s += _thread_ping_pong(queue.SimpleQueue, n, warmup)
        ours_s += _threaded_kernel_rt(n, warmup)
        spsc_s += _thread_ping_pong(lambda: SPSCQueue(4096), n, warmup)
        sync_s += _thread_ping_pong(lambda: SyncQueue(4096), n, warmup)
    floor = _row("SimpleQueue ping-pong (floor)", floor_s)
    rows = [
        floor,
        _row("ThreadedRingKernel round trip", ours_s),
        _row("SPSCQueue ping-pong", spsc_s),
        _row("SyncQueue ping-pong", sync_s),
    ]
    for r in rows:
        r["ratio_p50"] = r["p50_us"] / floor["p50_us"]
    return rows


# --- tier 3 ----------------------------------------------------------------------------------


def _process_kernel_rt(
    n: int, warmup: int, spin_us: float = 50.0, pace_s: float = 0.0, adaptive: bool = True
) -> tuple[list[int], float, float, float]:
    """Round trips through CythonRingKernel; also (parent, child) CPU seconds and wall time."""
    cfg = CythonKernelConfig("bench_t3", spin_us=spin_us, adaptive_spin=adaptive)
    with CythonRingKernel("bench_t3", echo_actor, config=cfg) as kernel:
        send, receive = kernel.send, kernel.receive
        for i in range(warmup):
            send(Ping(value=i))
            receive()
        cpu0, child0 = _cpu_self(), _cpu_of(kernel.pid)
        wall0 = time.perf_counter()
        samples = []
        for i in range(n):
            if pace_s:
                time.sleep(pace_s)
            t0 = _ns()
            send(Ping(value=i))
            receive()
            samples.append(_ns() - t0)
        wall = time.perf_counter() - wall0
        cpu1, child1 = _cpu_self(), _cpu_of(kernel.pid)
    return samples, cpu1 - cpu0, child1 - child0, wall


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_of(pid: int | None) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _raw_ring_rt(n: int, warmup: int, decode: bool) -> list[int]:
    a = _cython.SharedByteRing(1 << 16)
    b = _cython.SharedByteRing(1 << 16)
    proc = SPAWN.Process(target=raw_ring_echo, args=(a.name, b.name, decode), name="bench-raw")
    proc.start()
    samples = []
    decode_pong = message_decoder()
    try:
        for i in range(n + warmup):
            t0 = _ns()
            if decode:
                a.try_write(Ping(value=i).serialize())
                while (data := b.spin_read(1.0)) is None:
                    pass
                decode_pong(data)
            else:
                a.try_write(b"ping-payload-of-about-forty-bytes-long..")
                while b.spin_read(1.0) is None:
                    pass
            samples.append(_ns() - t0)
        a.try_write(b"quit")
        proc.join(10)
    finally:
        for ring in (a, b):
            ring.close()
            ring.unlink()
    return samples[warmup:]


def _mp_queue_rt(n: int, warmup: int) -> list[int]:
    q_in, q_out = SPAWN.Queue(), SPAWN.Queue()
    proc = SPAWN.Process(target=mp_queue_echo, args=(q_in, q_out), name="bench-mpq")
    proc.start()
    samples = []
    for i in range(n + warmup):
        t0 = _ns()
        q_in.put(Ping(value=i))
        q_out.get()
        samples.append(_ns() - t0)
    q_in.put(None)
    proc.join(10)
    for q in (q_in, q_out):
        q.close()
        q.join_thread()
    return samples[warmup:]


def _mp_pipe_rt(n: int, warmup: int) -> list[int]:
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=mp_pipe_echo, args=(child,), name="bench-pipe")
    proc.start()
    child.close()
    samples = []
    for i in range(n + warmup):
        t0 = _ns()
        parent.send(Ping(value=i))
        parent.recv()
        samples.append(_ns() - t0)
    parent.send(None)
    proc.join(10)
    parent.close()
    return samples[warmup:]


def bench_tier3(n: int, warmup: int, repeats: int) -> list[dict[str, Any]]:
    raw: list[int] = []
    raw_mp: list[int] = []
    ours: list[int] = []
    pipe: list[int] = []
    mpq: list[int] = []
    for _ in range(repeats):
        raw += _raw_ring_rt(n, warmup, decode=False)
        raw_mp += _raw_ring_rt(n, warmup, decode=True)
        ours += _process_kernel_rt(n, warmup)[0]
        pipe += _mp_pipe_rt(max(n // 4, 200), warmup // 4)
        mpq += _mp_queue_rt(max(n // 4, 200), warmup // 4)
    floor = _row("raw shm ring, busy poll, bytes (floor)", raw)
    rows = [
        floor,
        _row("raw shm ring + MessagePack", raw_mp),
        _row(f"CythonRingKernel round trip ({_cython.IMPLEMENTATION})", ours),
        _row("multiprocessing.Pipe (pickle)", pipe),
        _row("multiprocessing.Queue (pickle)", mpq),
    ]
    ours_p50 = rows[2]["p50_us"]
    for r in rows:
        r["ratio_p50"] = r["p50_us"] / floor["p50_us"]
        r["x_slower_than_ours"] = r["p50_us"] / ours_p50
    return rows


# --- spin sweep ------------------------------------------------------------------------------


def bench_spin_sweep(
    n: int, warmup: int, budgets: list[tuple[float, bool]]
) -> list[dict[str, Any]]:
    rows = []
    for loaded in (False, True):
        hog = None
        if loaded:
            hog = SPAWN.Process(target=cpu_hog, args=(3600.0,), name="bench-hog")
            hog.start()
        try:
            for spin, adaptive in budgets:
                samples, cpu_p, cpu_c, busy_wall = _process_kernel_rt(
                    n, warmup, spin, 0.0, adaptive
                )
                paced_n = max(n // 10, 100)
                paced, pcpu_p, pcpu_c, wall = _process_kernel_rt(paced_n, 20, spin, 0.001, adaptive)
                mode = "adaptive" if adaptive else "fixed"
                r = _row(f"{mode} {spin:g} us{' + CPU hog' if loaded else ''}", samples)
                pp = percentiles(paced, (50, 99))
                rows.append(
                    r
                    | {
                        "spin_us": spin,
                        "adaptive": adaptive,
                        "loaded": loaded,
                        "paced_p50_us": pp["p50_us"],
                        "paced_p99_us": pp["p99_us"],
                        "busy_cpu_s_parent_child": (cpu_p, cpu_c, busy_wall),
                        "paced_parent_cpu_pct": 100 * pcpu_p / wall,
                        "paced_child_cpu_pct": 100 * pcpu_c / wall,
                    }
                )
        finally:
            if hog is not None:
                hog.terminate()
                hog.join(5)
    return rows


# --- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trips (a smoke run)")
    parser.add_argument("--spin-sweep", action="store_true", help="also sweep spin budgets")
    parser.add_argument("--json", default=None, help="where to write the JSON results")
    args = parser.parse_args()
    n, warmup, repeats = (2000, 200, 1) if args.quick else (20000, 2000, 3)

    print(f"extension in use: {_cython.CYTHON_AVAILABLE} ({_cython.IMPLEMENTATION})")
    fast = bench_fast_queue(200_000 if args.quick else 2_000_000)
    print_table(
        "FastSPSCQueue put+get, one thread (ns per pair)",
        fast,
        ["what", "ns", "ns_minus_loop", "ratio"],
    )
    t2 = bench_tier2(n, warmup, repeats)
    print_table(
        "Tier 2 round trip (us), message built per trip",
        t2,
        ["what", "p50_us", "p99_us", "max_us", "ratio_p50"],
    )
    t3 = bench_tier3(n, warmup, repeats)
    print_table(
        "Tier 3 round trip (us), message built per trip",
        t3,
        ["what", "p50_us", "p99_us", "max_us", "ratio_p50", "x_slower_than_ours"],
    )
    sweep: list[dict[str, Any]] = []
    if args.spin_sweep:
        budgets = [(0.0, False), (10.0, False), (50.0, False), (200.0, False), (1000.0, False)]
        budgets += [(50.0, True), (200.0, True), (1000.0, True)]
        sweep = bench_spin_sweep(n // 2 if not args.quick else n, warmup, budgets)
        print_table(
            "Tier 3 spin budget sweep (us); paced = one message per ms",
            sweep,
            [
                "what",
                "p50_us",
                "p99_us",
                "max_us",
                "paced_p50_us",
                "paced_p99_us",
                "paced_child_cpu_pct",
            ],
        )

    floor2 = t2[0]["p50_us"]
    if floor2 > SLOW_WAKE_FLOOR_US:
        print(
            f"\nWARNING: the tier-2 floor (SimpleQueue ping-pong) read {floor2:.1f} us (slow: "
            f"> {SLOW_WAKE_FLOOR_US:g} us); a ratio against it hides what the kernel adds"
        )
    ours2 = t2[1]
    ours3 = t3[2]
    mpq = t3[4]
    targets = {
        "fast_spsc_put_get_ns": fast[1]["ns"] if _cython.CYTHON_AVAILABLE else None,
        "fast_spsc_target_ns": 100,
        "tier2_p50_ratio": ours2["ratio_p50"],
        "tier2_target_ratio": 1.5,
        "tier3_p50_us": ours3["p50_us"],
        "tier3_target_us": 2.0,
        "tier3_speedup_vs_mp_queue": mpq["p50_us"] / ours3["p50_us"],
        "tier3_p50_minus_raw_ring_msgpack_us": ours3["p50_us"] - t3[1]["p50_us"],
        "tier3_target_speedup": 10.0,
    }
    print("\ntargets:")
    for k, v in targets.items():
        print(f"  {k}: {v if not isinstance(v, float) else round(v, 3)}")
    save_json(
        "tiers",
        {
            "quick": args.quick,
            "implementation": _cython.IMPLEMENTATION,
            "trips_per_repeat": n,
            "repeats": repeats,
            "fast_spsc_queue": fast,
            "tier2": t2,
            "tier3": t3,
            "spin_sweep": sweep,
            "targets": targets,
            "load_average": os.getloadavg(),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
