"""``device-ring`` edges between GPU kernels on the Numba CUDA simulator.

Run alone (the simulator must be on before Numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest -p no:cacheprovider \
        tests/cudasim/test_gpu_device_edges.py

The producer's persistent kernel writes its replies into a ring in (simulated) device
memory; the consumer's kernel polls it beside its inbox; the host only reads counters.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import TypeValidationError
from pydotcompute.ring_kernels.tiers.gpu import GPURingKernel
from tests.gpu_ring_kernel_suite import SIM, Seq, launch_gpu, wait_for

cuda = pytest.importorskip("numba.cuda")


def _device_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pydotcompute-gpu")]


@pytest.fixture
async def rt() -> AsyncIterator[RingKernelRuntime]:
    """A runtime shut down after the test; no simulated device thread may outlive it."""
    before = set(_device_threads())
    runtime = RingKernelRuntime()
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.shutdown(timeout=10.0)
        deadline = time.monotonic() + 5.0
        while set(_device_threads()) - before and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        leaked = set(_device_threads()) - before
        assert not leaked, f"simulated device threads outlived the test: {leaked}"


@message
class Hop:
    seq: int
    hops: int


@message
class HopPlus(Hop):
    extra: int


def hop_handler(inp: Any, out: Any, state: Any) -> int:
    state[0] += 1
    out.seq = inp.seq
    out.hops = inp.hops + 1
    return 0


def to_seq_handler(inp: Any, out: Any, state: Any) -> int:
    out.seq = inp.seq
    return 0


async def _drain(rt: RingKernelRuntime, kid: str) -> list[Any]:
    """What ``kid``'s outbox still holds (it may be terminated)."""
    out: list[Any] = []
    while True:
        try:
            out.append(await rt.receive(kid, timeout=0.05))
        except Exception:
            return out


def _edge(rt: RingKernelRuntime, source: str) -> Any:
    (edge,) = [e for e in rt.edges() if e.source == source]
    return edge


async def _pair(rt: RingKernelRuntime, *, ring: int | None = None, activate: bool = True) -> None:
    opts: dict[str, Any] = {} if ring is None else {"ring_size": ring}
    await launch_gpu(rt, "a", hop_handler, Hop, Hop, state=np.zeros(1, np.int64), activate=activate)
    await launch_gpu(
        rt, "b", hop_handler, Hop, Hop, state=np.zeros(1, np.int64), activate=activate, **opts
    )


async def test_pipeline_exactly_once_in_order(rt: RingKernelRuntime) -> None:
    """A few hundred messages through a -> b arrive once each, in order, each handled by
    both kernels; the edge's own counters account for every one."""
    await _pair(rt)
    rt.connect("a", "b")
    assert _edge(rt, "a").kind == "device-ring", rt.edges()
    n = SIM.many
    for i in range(n):
        await rt.send("a", Hop(seq=i, hops=0))
    got = [await rt.receive("b", timeout=30) for _ in range(n)]
    assert [g.seq for g in got] == list(range(n))
    assert {g.hops for g in got} == {2}
    c = _edge(rt, "a").counters
    assert c is not None
    assert c["accepted"] == c["taken"] == n, c
    assert c["depth"] == 0, c
    assert c["handed_back"] == 0, c
    a, b = rt.get_kernel("a"), rt.get_kernel("b")
    assert isinstance(a, GPURingKernel)
    assert isinstance(b, GPURingKernel)
    # the producer's replies never reached its host side: the kernel wrote them into the edge
    assert a.statistics().replies_received == 0
    assert a.statistics().processed == b.statistics().processed == n
    assert rt.get_counters("b").messages_received >= n


async def test_edge_and_inbox_both_feed_the_consumer(rt: RingKernelRuntime) -> None:
    """The consumer takes its inbox and its edge by turns: both arrive, each in order."""
    await launch_gpu(rt, "a", hop_handler, Hop, Hop, state=np.zeros(1, np.int64))
    await launch_gpu(rt, "b", hop_handler, Hop, Hop, state=np.zeros(1, np.int64))
    rt.connect("a", "b")
    for i in range(60):
        await rt.send("a", Hop(seq=i, hops=0))
        await rt.send("b", Hop(seq=1000 + i, hops=10))
    got = [await rt.receive("b", timeout=30) for _ in range(120)]
    via_edge = [g.seq for g in got if g.hops == 2]
    direct = [g.seq for g in got if g.hops == 11]
    assert via_edge == list(range(60))
    assert direct == [1000 + i for i in range(60)]


async def test_small_edge_ring_holds_backpressure(rt: RingKernelRuntime) -> None:
    """A deactivated consumer takes nothing: the producer's kernel fills the 4-slot edge
    and waits (never overwrites); after reactivate everything arrives once, in order."""
    await _pair(rt, ring=4)
    rt.connect("a", "b")
    await rt.deactivate("b")
    n = 40
    for i in range(n):
        await rt.send("a", Hop(seq=i, hops=0))
    await wait_for(lambda: (_edge(rt, "a").counters or {}).get("accepted") == 4)
    await asyncio.sleep(SIM.settle)
    c = _edge(rt, "a").counters
    assert c is not None
    assert c["accepted"] == c["depth"] == c["capacity"] == 4, c
    assert c["full_events"] >= 1, c
    await rt.reactivate("b")
    got = [await rt.receive("b", timeout=30) for _ in range(n)]
    assert [g.seq for g in got] == list(range(n))
    c = _edge(rt, "a").counters
    assert c is not None
    assert c["accepted"] == c["taken"] == n, c


async def test_terminate_hands_back_what_the_edge_holds(rt: RingKernelRuntime) -> None:
    """Records left in the edge when the consumer stops are handed back once, decoded,
    and counted; with what the producer never took and what arrived, every message ends
    exactly once."""
    await _pair(rt, ring=4)
    rt.connect("a", "b")
    await rt.deactivate("b")
    n = 12
    for i in range(n):
        await rt.send("a", Hop(seq=i, hops=0))
    await wait_for(lambda: (_edge(rt, "a").counters or {}).get("accepted") == 4)
    left_a = await rt.terminate("a", timeout=0.2)
    left_b = await rt.terminate("b", timeout=0.0)
    arrived = await _drain(rt, "b")
    assert all(isinstance(m, Hop) for m in [*left_a, *left_b, *arrived])
    seqs = sorted([m.seq for m in left_a] + [m.seq for m in left_b] + [m.seq for m in arrived])
    assert seqs == list(range(n)), (left_a, left_b, arrived)
    c = _edge(rt, "a").counters
    assert c is not None
    assert c["accepted"] == c["taken"] + c["handed_back"], c
    assert c["handed_back"] == len([m for m in left_b if m.hops == 1]), (c, left_b)
    assert c["depth"] == 0, c


async def test_edges_reports_kind_and_why(rt: RingKernelRuntime) -> None:
    """``edges()`` says ``device-ring`` for two GPU kernels on one device, and why the
    loop path stays for a GPU -> host edge, for kernels on two devices, and direct=False."""
    await _pair(rt)
    await launch_gpu(rt, "c", hop_handler, Hop, Hop, device_id=1)

    async def host(ctx: Any) -> None:
        while True:
            await ctx.send(await ctx.receive())

    await rt.launch("h", host, input_type=Hop, output_type=Hop)
    rt.connect("a", "b")
    rt.connect("b", "h")
    rt.connect("c", "a")
    edges = {(e.source, e.target): e for e in rt.edges()}
    assert edges[("a", "b")].kind == "device-ring"
    assert edges[("a", "b")].counters is not None
    assert edges[("b", "h")].kind == "loop"
    assert "asyncio" in edges[("b", "h")].why
    assert edges[("c", "a")].kind == "loop"
    assert "different devices" in edges[("c", "a")].why, edges[("c", "a")]
    rt.connect("a", "b", direct=False)
    assert _edge(rt, "a").kind == "loop"
    assert "direct=False" in _edge(rt, "a").why
    # a message on each still arrives (the c -> a loop path crosses devices)
    await rt.activate("h")
    await rt.send("c", Hop(seq=7, hops=0))
    got = await rt.receive("h", timeout=30)
    assert (got.seq, got.hops) == (7, 3)


async def test_mismatched_classes_refused(rt: RingKernelRuntime) -> None:
    """A device edge copies records as they are: a subclass with another layout (which the
    loop path would accept) is refused at connect, naming both classes and the fix; an
    unrelated class is refused as on any tier; nothing is connected after either."""
    await launch_gpu(rt, "a", hop_handler, HopPlus, HopPlus)
    await launch_gpu(rt, "b", hop_handler, Hop, Hop)
    await launch_gpu(rt, "s", to_seq_handler, Hop, Seq)
    with pytest.raises(TypeValidationError, match=r"writes HopPlus records but 'b' reads Hop"):
        rt.connect("a", "b")
    assert rt.edges() == []
    with pytest.raises(TypeValidationError, match="sends Seq but 'b' expects Hop"):
        rt.connect("s", "b")
    assert rt.edges() == []
    rt.connect("a", "b", direct=False)  # the loop path converts nothing, and accepts it
    assert _edge(rt, "a").kind == "loop"


async def test_disconnect_and_reconnect_keep_exactly_once(rt: RingKernelRuntime) -> None:
    """Disconnect routes the producer back to its outbox; the consumer drains the edge; a
    re-connect reuses the edge and its counters."""
    await _pair(rt)
    rt.connect("a", "b")
    for i in range(30):
        await rt.send("a", Hop(seq=i, hops=0))
    rt.disconnect("a")
    for i in range(30, 40):
        await rt.send("a", Hop(seq=i, hops=0))
    from_a = [await rt.receive("a", timeout=30) for _ in range(10)]
    assert [m.seq for m in from_a] == list(range(30, 40))
    from_b = [await rt.receive("b", timeout=30) for _ in range(30)]
    assert [m.seq for m in from_b] == list(range(30))
    rt.connect("a", "b")
    for i in range(40, 50):
        await rt.send("a", Hop(seq=i, hops=0))
    again = [await rt.receive("b", timeout=30) for _ in range(10)]
    assert [m.seq for m in again] == list(range(40, 50))
    c = _edge(rt, "a").counters
    assert c is not None
    assert c["accepted"] == c["taken"] == 40, c


async def test_consumer_stopped_first_closes_the_edge(rt: RingKernelRuntime) -> None:
    """Terminating the consumer while the producer runs closes the edge: the producer's
    kernel is routed back to its outbox (acknowledged before the edge is read back), what
    the edge held comes back once, and the counters balance; a later send takes the loop
    path, never the closed edge."""
    await _pair(rt, ring=8)
    rt.connect("a", "b")
    await rt.deactivate("b")
    for i in range(20):
        await rt.send("a", Hop(seq=i, hops=0))
    await wait_for(lambda: (_edge(rt, "a").counters or {}).get("accepted") == 8)
    await rt.deactivate("a")  # holds the other 12 in a's inbox ring
    left_b = await rt.terminate("b", timeout=0.0)
    arrived = await _drain(rt, "b")
    c = _edge(rt, "a").counters
    assert c is not None
    assert c["accepted"] == 8, c
    assert c["accepted"] == c["taken"] + c["handed_back"], c
    assert sorted([m.seq for m in left_b] + [m.seq for m in arrived]) == list(range(8))
    await rt.reactivate("a")  # a's kernel now writes into its outbox, not the closed edge
    await asyncio.sleep(SIM.settle)
    assert _edge(rt, "a").counters == c
    a = rt.get_kernel("a")
    assert isinstance(a, GPURingKernel)
    assert a.statistics().processed == 20


async def test_benchmark_pipeline_runs_on_the_simulator() -> None:
    """The hardware check's edge step (``benchmarks/gpu_edge_benchmark.py``) at a small
    size: both kinds deliver every message once, in order, through both kernels."""
    import importlib
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "benchmarks"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    bench = importlib.import_module("gpu_edge_benchmark")
    r = await bench.measure(n_rtt=10, n_tput=60, timeout=30.0)
    assert r["exactly_once_in_order"], r
    kinds = [row["kind"] for row in r["rows"]]
    assert kinds == ["device-ring", "loop"]
    assert r["rows"][0]["counters"]["accepted"] == 70


def _scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()


async def test_device_edge_exported_as_metrics(rt: RingKernelRuntime) -> None:
    """``pydotcompute_edge_info`` names the edge with kind ``device-ring`` and
    ``pydotcompute_edge_messages`` carries its counters, scraped over HTTP."""
    from prometheus_client.parser import text_string_to_metric_families

    await _pair(rt)
    rt.connect("a", "b")
    n = 25
    for i in range(n):
        await rt.send("a", Hop(seq=i, hops=0))
    assert [(await rt.receive("b", timeout=30)).seq for _ in range(n)] == list(range(n))
    host, port = rt.serve_metrics(port=0)
    text = await asyncio.to_thread(_scrape, f"http://{host}:{port}/metrics")
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    info = [s.labels for s in samples if s.name == "pydotcompute_edge_info" and s.value == 1.0]
    assert info == [{"source": "a", "target": "b", "kind": "device-ring"}], info
    counts = {
        s.labels["outcome"]: s.value
        for s in samples
        if s.name.startswith("pydotcompute_edge_messages") and s.labels.get("kind") == "device-ring"
    }
    assert counts["accepted"] == counts["taken"] == n, counts


def picky_hop_handler(inp: Any, out: Any, state: Any) -> int:
    if inp.seq % 4 == 3:
        return 5
    out.seq = inp.seq
    out.hops = inp.hops + 1
    return 0


async def test_rejections_into_an_edge_are_counted(rt: RingKernelRuntime) -> None:
    """A message the producer's handler rejects puts nothing into the edge and is counted
    as the producer's drop (reason ``rejected``), as on the loop path."""
    await launch_gpu(rt, "a", picky_hop_handler, Hop, Hop)
    await launch_gpu(rt, "b", hop_handler, Hop, Hop, state=np.zeros(1, np.int64))
    rt.connect("a", "b")
    n = 40
    for i in range(n):
        await rt.send("a", Hop(seq=i, hops=0))
    kept = [i for i in range(n) if i % 4 != 3]
    got = [await rt.receive("b", timeout=30) for _ in kept]
    assert [g.seq for g in got] == kept
    c = _edge(rt, "a").counters
    assert c is not None
    assert c["accepted"] == len(kept), c
    tel = rt.get_counters("a")
    assert (tel.drops_by_reason or {}).get("rejected") == n - len(kept), tel.drops_by_reason
