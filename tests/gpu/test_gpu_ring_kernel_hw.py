"""GPU ring kernels on real NVIDIA hardware: the behavioural suite, CUDA C handlers, a soak.

Skipped with a reason when no GPU is usable (or when the CUDA simulator is switched on). Run::

    python -m pytest tests/gpu/test_gpu_ring_kernel_hw.py -m cuda -p no:cacheprovider

The same scenarios run on the simulator in ``tests/cudasim/test_gpu_ring_kernel.py``. Nothing
here touches CUDA at import or collection (see ``conftest.py``); ``PYDOTCOMPUTE_SOAK_MESSAGES``
sizes the soak (default a million).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import KernelError
from pydotcompute.ring_kernels.tiers.gpu.resources import live_actor_count
from tests import gpu_ring_kernel_suite as suite
from tests.gpu_ring_kernel_suite import HW, Add, Seq, SeqOut, Sum, launch_gpu

pytestmark = [pytest.mark.cuda]  # conftest.py skips every test, with the reason, without a GPU


@pytest.fixture
async def rt() -> AsyncIterator[RingKernelRuntime]:
    """A runtime shut down after the test; no persistent kernel may outlive it."""
    before = live_actor_count()
    runtime = RingKernelRuntime()
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.shutdown(timeout=30.0)
        assert live_actor_count() == before, "a persistent kernel outlived the test"


@pytest.mark.parametrize("scenario", sorted(suite.SCENARIOS))
async def test_behaviour(rt: RingKernelRuntime, scenario: str) -> None:
    await suite.SCENARIOS[scenario](rt, HW)


async def test_runs_as_a_real_kernel(rt: RingKernelRuntime) -> None:
    k = await launch_gpu(rt, "add", suite.add_handler, Add, Sum)
    assert k.flavour == "numba"
    assert live_actor_count() >= 1


C_ADD = r"""
__device__ int handle(const Add* in, Sum* out, pdc_state_t* state) {
    if (in->a < 0) return 4;
    state[0] += 1;
    out->total = in->a + in->b;
    out->count = state[0];
    return 0;
}
"""


async def test_cuda_c_handler_round_trip(rt: RingKernelRuntime) -> None:
    k = await rt.launch(
        "c_add",
        lambda *a: 0,
        input_type=Add,
        output_type=Sum,
        tier="gpu",
        cuda_source=C_ADD,
        state=np.array([5], np.int64),
    )
    await rt.activate("c_add")
    assert k.flavour == "cuda_c"
    replies = [
        await rt.send_and_receive("c_add", Add(a=float(i), b=1.0), timeout=30) for i in range(5)
    ]
    assert [r.total for r in replies] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [r.count for r in replies] == [6, 7, 8, 9, 10]
    with pytest.raises(KernelError, match="status 4"):
        await rt.send_and_receive("c_add", Add(a=-1.0, b=0.0), timeout=30)
    await rt.terminate("c_add")
    assert k.final_state.tolist() == [10]  # type: ignore[union-attr]


async def test_terminating_one_actor_leaves_the_others_running(rt: RingKernelRuntime) -> None:
    a = await launch_gpu(rt, "a", suite.seq_handler, Seq, SeqOut, state=np.zeros(1, np.int64))
    await launch_gpu(rt, "b", suite.add_handler, Add, Sum, state=np.zeros(1, np.int64))
    assert (await rt.send_and_receive("a", Seq(seq=3), timeout=30)).running == 3
    await asyncio.wait_for(rt.terminate("b"), 30)  # frees nothing while "a" runs
    assert (await rt.send_and_receive("a", Seq(seq=4), timeout=30)).running == 7
    await rt.terminate("a")
    assert a.final_state.tolist() == [7]  # type: ignore[union-attr]


async def test_device_wide_sync_is_refused_while_an_actor_runs(rt: RingKernelRuntime) -> None:
    from pydotcompute.backends import CUDABackend
    from pydotcompute.exceptions import CUDAError

    await launch_gpu(rt, "add", suite.add_handler, Add, Sum)
    backend = CUDABackend()
    with pytest.raises(CUDAError, match=r"synchronize\(\) refused"):
        backend.synchronize()  # would wait for the persistent kernel forever
    await asyncio.wait_for(asyncio.to_thread(backend.synchronize_stream), 30)
    assert (await rt.send_and_receive("add", Add(a=1.0, b=1.0), timeout=30)).total == 2.0


async def test_exit_hook_stops_a_running_kernel(rt: RingKernelRuntime) -> None:
    from pydotcompute.ring_kernels.tiers.gpu import layout, resources

    k = await launch_gpu(rt, "add", suite.add_handler, Add, Sum)
    left = await asyncio.to_thread(resources.terminate_running_kernels, 10.0)
    assert left == []
    assert k.control_word(layout.TERMINATED) == 1


@pytest.mark.slow
@pytest.mark.timeout(280)
async def test_soak_a_million_messages(rt: RingKernelRuntime) -> None:
    """A million messages (``PYDOTCOMPUTE_SOAK_MESSAGES``): nothing lost, order kept, state
    exact, clean terminate."""
    n = int(os.environ.get("PYDOTCOMPUTE_SOAK_MESSAGES", 1_000_000))
    k = await launch_gpu(
        rt, "soak", suite.seq_handler, Seq, SeqOut, state=np.zeros(1, np.int64), queue_size=1 << 16
    )
    recs = np.zeros(n, dtype=Seq.dtype)
    recs["seq"] = np.arange(n)
    sender = asyncio.ensure_future(k.send_records(recs, timeout=240))
    parts = []
    got = 0
    while got < n:
        chunk = await k.receive_records(1 << 16, timeout=60)
        parts.append(chunk["seq"].copy())
        got += len(chunk)
    assert await sender == n
    seqs = np.concatenate(parts)
    np.testing.assert_array_equal(seqs, np.arange(n))  # nothing lost, nothing reordered
    stats = k.statistics()
    assert (stats.processed, stats.errors, stats.dropped, stats.in_flight) == (n, 0, 0, 0)
    left = await rt.terminate("soak", timeout=60)
    assert left == []
    assert k.final_state.tolist() == [n * (n - 1) // 2]  # type: ignore[union-attr]
    tel = rt.get_telemetry("soak")
    assert tel.messages_processed == n
    assert tel.messages_dropped == 0


# --- device-ring edges: GPU -> GPU on one device ------------------------------------------------


def _edge_benchmark() -> Any:
    """``benchmarks/gpu_edge_benchmark.py`` (the check's ``edge`` step runs it too)."""
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("gpu_edge_benchmark")


async def test_device_ring_edge_round_trip_and_throughput() -> None:
    """Two real persistent kernels joined by a ``device-ring`` edge, and the same pair over
    the loop: every message arrives once, in order, through both; the figures (round trip
    and throughput of each kind) are printed, not asserted."""
    r = await _edge_benchmark().measure(n_rtt=100, n_tput=1_000, timeout=30.0)
    print(r)
    assert r["exactly_once_in_order"], r
    dev = next(row for row in r["rows"] if row["kind"] == "device-ring")
    c = dev["counters"]
    assert c["accepted"] == c["taken"] == 1_100, c
    assert c["depth"] == 0, c


async def test_device_ring_edge_backpressure(rt: RingKernelRuntime) -> None:
    """A 4-slot edge into a deactivated kernel: the producer's kernel fills it and waits;
    after reactivate every message arrives once, in order."""
    await launch_gpu(rt, "a", suite.double_handler, Sum, Sum)
    await launch_gpu(rt, "b", suite.double_handler, Sum, Sum, ring_size=4)
    rt.connect("a", "b")
    (edge,) = rt.edges()
    assert edge.kind == "device-ring", edge
    await rt.deactivate("b")
    n = 40
    for i in range(n):
        await rt.send("a", Sum(total=float(i), count=i))
    await suite.wait_for(lambda: (rt.edges()[0].counters or {}).get("accepted") == 4)
    await asyncio.sleep(HW.settle)
    c = rt.edges()[0].counters
    assert c is not None
    assert c["accepted"] == c["depth"] == 4, c
    await rt.reactivate("b")
    got = [await rt.receive("b", timeout=30) for _ in range(n)]
    assert [g.count for g in got] == list(range(n))
    assert [g.total for g in got] == [4.0 * i for i in range(n)]
