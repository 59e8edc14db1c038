"""Persistent GPU ring kernel against launching a kernel per message, and the tier-1 actor.

Every variant does the same work on the same message: ``Work`` carries 16 float32 values and
a scale; the reply ``Result`` carries their scaled sum and a counter kept in the actor's
state. What is measured, in one run:

Round trip (one message in flight; p50/p99 in microseconds):

- ``ring, raw``: the GPU actor launched once; the host writes one record into the mapped
  inbox, publishes the tail, spins on the outbox tail and takes the reply (no asyncio).
  This is the device path plus the NumPy work of one publish and one take.
- ``ring, runtime``: ``await runtime.send_and_receive(...)`` with a message built per trip,
  through the kernel's pump task: what an application sees.
- ``ring, CUDA C``: the raw round trip of the same actor written as a CUDA C handler.
- ``launch per message, CuPy``: a CUDA C kernel doing the work, launched per message with
  ``RawKernel`` on the same mapped memory, then ``stream.synchronize()``.
- ``launch per message, Numba``: the same handler compiled as a Numba kernel, launched per
  message on the same mapped memory, then synchronized.
- ``tier 1``: an asyncio actor doing the work in NumPy, ``send_and_receive`` per message.

Throughput (messages per second, many in flight):

- ``ring, records``: ``send_records`` / ``receive_records`` of N structured records (no
  message objects; one tail store per free run of slots, up to 64 messages per device-side
  publication);
- ``ring, objects``: ``send_batch`` / ``receive_batch`` of message objects;
- ``launch per message, CuPy``: back-to-back launches, one synchronize at the end;
- ``tier 1``: pipelined sends and receives of message objects.

Ratios: launch-per-message p50 over ring p50 (target >= 4 on an H100); ring raw p50
(target <= 5 us on an H100); records throughput (target >= 1 M msg/s). Without a GPU the
script says why, writes a JSON saying so and exits 0. ``--simulator`` runs the code paths on
the Numba CUDA simulator as a smoke test: the figures mean nothing and are not saved unless
``--json`` is given.

Run ``python benchmarks/gpu_ring_kernel_benchmark.py [--quick] [--json PATH] [--simulator]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import percentiles, print_table, save_json
from _suite import summary_row

from pydotcompute import RingKernelRuntime
from pydotcompute.ring_kernels.message import message

VEC = 16


@message
class Work:
    values: Annotated[np.ndarray, (VEC,), np.float32]
    scale: np.float32


@message
class Result:
    total: float
    count: int


def work_handler(inp: Any, out: Any, state: Any) -> int:
    """The actor's work on the device: a scaled sum and a message counter in the state."""
    acc = 0.0
    for i in range(VEC):
        acc += inp.values[i] * inp.scale
    state[0] += 1
    out.total = acc
    out.count = state[0]
    return 0


WORK_C_HANDLER = r"""
__device__ int handle(const Work* in, Result* out, pdc_state_t* state) {
    double acc = 0.0;
    for (int i = 0; i < 16; ++i) acc += in->values[i] * in->scale;
    state[0] += 1;
    out->total = acc;
    out->count = state[0];
    return 0;
}
"""


def per_message_c_source() -> str:
    """The launch-per-message baseline in CUDA C (one thread does the work)."""
    from pydotcompute.ring_kernels.tiers.gpu.cuda_c import c_struct

    return "\n".join(
        [
            c_struct("Work", Work.dtype),
            c_struct("Result", Result.dtype),
            r"""
extern "C" __global__ void per_message(const Work* in, Result* out, long long* state) {
    double acc = 0.0;
    for (int i = 0; i < 16; ++i) acc += in->values[i] * in->scale;
    state[0] += 1;
    out->total = acc;
    out->count = state[0];
}
""",
        ]
    )


def make_per_message_kernel(handler: Any) -> Any:
    """The launch-per-message baseline in Numba: the same handler, one message per launch."""

    def per_message(inbox: Any, outbox: Any, state: Any) -> None:
        handler(inbox[0], outbox[0], state)

    return per_message


def compile_check(cc: tuple[int, int]) -> dict[str, str]:
    """PTX of every kernel this benchmark launches, compiled without a GPU (for CI)."""
    from numba import cuda
    from numba.np.numpy_support import from_dtype

    from pydotcompute.ring_kernels.tiers.gpu import (
        build,
        compile_gpu_kernel_cuda_c,
        compile_gpu_kernel_ptx,
        cuda_c,
    )

    state = np.zeros(1, np.int64)
    out = {
        "ring (Numba)": compile_gpu_kernel_ptx(work_handler, Work, Result, state=state, cc=cc),
        "ring (CUDA C)": compile_gpu_kernel_cuda_c(
            WORK_C_HANDLER, Work, Result, state=state, cc=cc
        )[1],
        "per message (CUDA C)": cuda_c.ptx(per_message_c_source(), cc),
    }
    dev = build._device_function(work_handler)
    rin, rout = from_dtype(Work.dtype), from_dtype(Result.dtype)
    st = build.types.int64[::1]
    build._precompile_handler(dev, (rin, rout, st), cc)
    ptx, _ = cuda.compile_ptx(make_per_message_kernel(dev), (rin[::1], rout[::1], st), cc=cc)
    out["per message (Numba)"] = ptx
    return out


# --- measurements ------------------------------------------------------------------------------


def _work(i: int) -> Work:
    return Work(values=np.full(VEC, 1.0 + (i % 7), np.float32), scale=np.float32(0.5))


#: Seconds one raw round trip may spin before the benchmark gives up (``--spin-timeout``).
SPIN_TIMEOUT_S = 10.0


def ring_raw_rtt(kernel: Any, n: int, warm: int, spin_timeout: float | None = None) -> list[int]:
    """Publish one record, spin on the outbox tail, take the reply; no event loop involved.

    Raises:
        TimeoutError: a reply did not arrive within ``spin_timeout`` seconds (the kernel
            hung, or never saw the message): the spin would otherwise never end.
    """
    r = kernel.rings
    rec = Work.to_records([_work(1)])
    clock = time.perf_counter_ns
    limit_ns = int(1e9 * (SPIN_TIMEOUT_S if spin_timeout is None else spin_timeout))
    lat: list[int] = []
    for i in range(warm + n):
        t0 = clock()
        r.publish(rec)
        spins = 0
        while r.ready() == 0:
            spins += 1
            if spins & 1023 == 0 and clock() - t0 > limit_ns:
                raise TimeoutError(
                    f"raw round trip {i}: no reply within {limit_ns / 1e9:g}s (processed "
                    f"{kernel.statistics().processed}); the kernel is stuck or missed the message"
                )
        r.take(1)
        if i >= warm:
            lat.append(clock() - t0)
    return lat


async def ring_runtime_rtt(rt: RingKernelRuntime, kid: str, n: int, warm: int) -> list[int]:
    clock = time.perf_counter_ns
    lat: list[int] = []
    for i in range(warm + n):
        t0 = clock()
        await rt.send_and_receive(kid, _work(i), timeout=30)
        if i >= warm:
            lat.append(clock() - t0)
    return lat


async def ring_records_throughput(kernel: Any, n: int) -> float:
    recs = Work.to_records([_work(i) for i in range(min(n, 4096))])
    recs = np.resize(recs, n)
    t0 = time.perf_counter()
    sender = asyncio.ensure_future(kernel.send_records(recs, timeout=120))
    got = 0
    while got < n:
        got += len(await kernel.receive_records(1 << 16, timeout=60))
    await sender
    return n / (time.perf_counter() - t0)


async def ring_objects_throughput(kernel: Any, n: int) -> float:
    msgs = [_work(i) for i in range(n)]
    t0 = time.perf_counter()
    sender = asyncio.ensure_future(kernel.send_batch(msgs, timeout=120))
    got = 0
    while got < n:
        got += len(await kernel.receive_batch(4096, timeout=60))
    await sender
    return n / (time.perf_counter() - t0)


def cupy_launch_rtt(n: int, warm: int, mapped: dict[str, Any]) -> tuple[list[int], float]:
    """Launch the CUDA C kernel per message on mapped memory and synchronize each time."""
    import cupy

    mod = cupy.RawModule(code=per_message_c_source(), options=("-std=c++17",))
    fn = mod.get_function("per_message")
    stream = cupy.cuda.Stream(non_blocking=True)
    ptr = {k: np.uint64(v.__cuda_array_interface__["data"][0]) for k, v in mapped.items()}
    args = (ptr["inbox"], ptr["outbox"], ptr["state"])
    mapped["inbox"][:] = Work.to_records([_work(1)])
    clock = time.perf_counter_ns
    lat: list[int] = []
    for i in range(warm + n):
        t0 = clock()
        fn((1,), (1,), args, stream=stream)
        stream.synchronize()
        if i >= warm:
            lat.append(clock() - t0)
    m = max(n, 1000)
    t0f = time.perf_counter()
    for _ in range(m):
        fn((1,), (1,), args, stream=stream)
    stream.synchronize()
    return lat, m / (time.perf_counter() - t0f)


def numba_launch_rtt(n: int, warm: int, mapped: dict[str, Any]) -> list[int]:
    """Launch the Numba kernel per message on mapped memory and synchronize each time."""
    from numba import cuda

    from pydotcompute.ring_kernels.tiers.gpu import build

    kern = cuda.jit(make_per_message_kernel(build._device_function(work_handler)))
    stream = cuda.stream()
    mapped["inbox"][:] = Work.to_records([_work(1)])
    args = (mapped["inbox"], mapped["outbox"], mapped["state"])
    clock = time.perf_counter_ns
    lat: list[int] = []
    for i in range(warm + n):
        t0 = clock()
        kern[1, 1, stream](*args)
        stream.synchronize()
        if i >= warm:
            lat.append(clock() - t0)
    return lat


async def tier1(n: int, warm: int, many: int) -> tuple[list[int], float]:
    async def actor(ctx: Any) -> None:
        count = 0
        while True:
            msg = await ctx.receive()
            count += 1
            await ctx.send(Result(total=float((msg.values * msg.scale).sum()), count=count))

    async with RingKernelRuntime() as rt:
        await rt.launch("host", actor, input_type=Work, output_type=Result, queue_size=1 << 16)
        await rt.activate("host")
        clock = time.perf_counter_ns
        lat: list[int] = []
        for i in range(warm + n):
            t0 = clock()
            await rt.send_and_receive("host", _work(i), timeout=30)
            if i >= warm:
                lat.append(clock() - t0)
        msgs = [_work(i) for i in range(many)]
        t0f = time.perf_counter()

        async def send_all() -> None:
            for m in msgs:
                await rt.send("host", m)

        sender = asyncio.ensure_future(send_all())
        for _ in range(many):
            await rt.receive("host", timeout=60)
        await sender
        return lat, many / (time.perf_counter() - t0f)


def _mapped(simulator: bool) -> dict[str, Any]:
    if simulator:
        return {
            "inbox": np.zeros(1, Work.dtype),
            "outbox": np.zeros(1, Result.dtype),
            "state": np.zeros(1, np.int64),
        }
    from numba import cuda

    return {
        "inbox": cuda.mapped_array(1, dtype=Work.dtype),
        "outbox": cuda.mapped_array(1, dtype=Result.dtype),
        "state": cuda.mapped_array(1, dtype=np.int64),
    }


def gpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        from pydotcompute.ring_kernels.telemetry import get_gpu_monitor

        g = get_gpu_monitor().get_gpu_info(0)
        if g is not None:
            info.update(gpu=g.name, driver=g.driver_version, memory_bytes=g.total_memory)
    except Exception as exc:
        info["nvml"] = f"unavailable ({type(exc).__name__})"
    try:
        import cupy

        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        info["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        info["cupy"] = cupy.__version__
        props = cupy.cuda.runtime.getDeviceProperties(0)
        info.setdefault("gpu", props["name"].decode())
    except Exception as exc:
        info["cupy_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import numba

        info["numba"] = numba.__version__
    except ImportError:
        pass
    return info


def unavailable_reason(simulator: bool) -> str | None:
    if simulator:
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "NUMBA_ENABLE_CUDASIM is set; pass --simulator for a smoke run, or unset it"
    try:
        from numba import cuda
    except ImportError as exc:
        return f"numba-cuda is not installed ({exc}); pip install 'pydotcompute[cuda]'"
    try:
        if not cuda.is_available():
            return "no CUDA GPU is visible to Numba"
    except Exception as exc:
        return f"CUDA is not usable ({type(exc).__name__}: {exc})"
    return None


async def measure(
    quick: bool, simulator: bool, spin_timeout: float = SPIN_TIMEOUT_S
) -> dict[str, Any]:
    n = 200 if simulator else (2_000 if quick else 20_000)
    warm = 20 if simulator else 200
    many = 2_000 if simulator else (200_000 if quick else 2_000_000)
    objects = 500 if simulator else (20_000 if quick else 100_000)
    state = np.zeros(1, np.int64)
    rows: list[dict[str, Any]] = []
    tput: list[dict[str, Any]] = []
    r: dict[str, Any] = {"sizes": {"round_trips": n, "records": many, "objects": objects}}

    async with RingKernelRuntime() as rt:
        k = await rt.launch(
            "ring",
            work_handler,
            input_type=Work,
            output_type=Result,
            tier="gpu",
            state=state,
            queue_size=1 << 16,
            ring_size=4096,
        )
        await rt.activate("ring")
        lat = ring_raw_rtt(k, n, warm, spin_timeout)
        rows.append({"variant": "ring, raw", **percentiles(lat)})
        lat = await ring_runtime_rtt(rt, "ring", n // 2, warm)
        rows.append({"variant": "ring, runtime", **percentiles(lat)})
        tput.append({"variant": "ring, records", "msg/s": await ring_records_throughput(k, many)})
        tput.append(
            {"variant": "ring, objects", "msg/s": await ring_objects_throughput(k, objects)}
        )
        r["ring_statistics"] = k.statistics().__dict__
        await rt.terminate("ring")
        expected = warm + n + warm + n // 2 + many + objects
        r["ring_state_ok"] = int(k.final_state[0]) == expected  # every message counted once
        if not simulator:
            try:
                kc = await rt.launch(
                    "ring_c",
                    work_handler,
                    input_type=Work,
                    output_type=Result,
                    tier="gpu",
                    state=state,
                    cuda_source=WORK_C_HANDLER,
                )
                await rt.activate("ring_c")
                lat_c = ring_raw_rtt(kc, n, warm, spin_timeout)
                rows.append({"variant": "ring, CUDA C", **percentiles(lat_c)})
                await rt.terminate("ring_c")
            except Exception as exc:
                r["ring_c_error"] = f"{type(exc).__name__}: {exc}"

    mapped = _mapped(simulator)
    if not simulator:
        try:
            lat, rate = cupy_launch_rtt(n, warm, mapped)
            rows.append({"variant": "launch per message, CuPy", **percentiles(lat)})
            tput.append({"variant": "launch per message, CuPy (no sync)", "msg/s": rate})
        except Exception as exc:
            r["cupy_error"] = f"{type(exc).__name__}: {exc}"
    lat = numba_launch_rtt(n // 4 if simulator else n, warm, mapped)
    rows.append({"variant": "launch per message, Numba", **percentiles(lat)})
    lat, rate = await tier1(n, warm, many // 4 if not simulator else many)
    rows.append({"variant": "tier 1 (asyncio, host)", **percentiles(lat)})
    tput.append({"variant": "tier 1 (asyncio, host)", "msg/s": rate})

    ring_p50 = rows[0]["p50_us"]
    for row in rows:
        row["ratio vs ring raw"] = row["p50_us"] / ring_p50 if ring_p50 else None
    r["round_trip"] = rows
    r["throughput"] = tput
    return r


def _summary(r: dict[str, Any] | None, reason: str | None) -> list[dict[str, Any]]:
    if r is None:
        note = f"not available: {reason}"
        return [
            summary_row("ring round trip p50", None, "us", higher_is_better=False, note=note),
            summary_row("ring records throughput", None, "msg/s", higher_is_better=True, note=note),
        ]
    by = {row["variant"]: row for row in r["round_trip"]}
    ring = by["ring, raw"]["p50_us"]
    launch = by.get("launch per message, CuPy", by.get("launch per message, Numba", {}))
    tp = {row["variant"]: row["msg/s"] for row in r["throughput"]}
    return [
        summary_row(
            "ring round trip p50",
            ring,
            "us",
            higher_is_better=False,
            baseline=launch.get("p50_us"),
            baseline_name="launch per message + synchronize",
            target="<= 5 us on an H100; ratio <= 0.25",
        ),
        summary_row(
            "ring round trip p50 via runtime",
            by["ring, runtime"]["p50_us"],
            "us",
            higher_is_better=False,
            baseline=by["tier 1 (asyncio, host)"]["p50_us"],
            baseline_name="tier-1 actor send_and_receive",
        ),
        summary_row(
            "ring records throughput",
            tp["ring, records"],
            "msg/s",
            higher_is_better=True,
            baseline=tp.get("tier 1 (asyncio, host)"),
            baseline_name="tier-1 actor pipelined",
            target=">= 1 M msg/s",
        ),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--json", default=None, help="where to save results")
    ap.add_argument(
        "--simulator", action="store_true", help="smoke-run on the CUDA simulator (no figures)"
    )
    ap.add_argument(
        "--spin-timeout",
        type=float,
        default=SPIN_TIMEOUT_S,
        help="seconds one raw round trip may wait for its reply before the run fails",
    )
    args = ap.parse_args(argv)
    if args.simulator:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before Numba is imported
    reason = unavailable_reason(args.simulator)
    if reason is not None:
        print(f"GPU ring kernel benchmark skipped: {reason}")
        save_json(
            "gpu_ring_kernel",
            {
                "quick": args.quick,
                "available": False,
                "reason": reason,
                "summary": _summary(None, reason),
            },
            args.json,
        )
        return None
    r = asyncio.run(measure(args.quick, args.simulator, args.spin_timeout))
    where = "the CUDA SIMULATOR (smoke run, figures meaningless)" if args.simulator else "GPU"
    info = {} if args.simulator else gpu_info()
    print(f"\nGPU ring kernel on {where}: {info.get('gpu', '')} driver {info.get('driver', '')}")
    print_table(
        "Round trip, one message in flight (us); ratio = p50 / ring raw p50",
        r["round_trip"],
        ["variant", "p50_us", "p95_us", "p99_us", "max_us", "ratio vs ring raw"],
    )
    print_table("Throughput, many in flight", r["throughput"], ["variant", "msg/s"])
    print(f"\nstate counted every message exactly once: {r['ring_state_ok']}")
    if args.simulator and args.json is None:
        return r
    save_json(
        "gpu_ring_kernel",
        {
            "quick": args.quick,
            "available": True,
            "simulator": args.simulator,
            "device": info,
            **r,
            "summary": _summary(r, None),
        },
        args.json,
    )
    return r


if __name__ == "__main__":
    main()
