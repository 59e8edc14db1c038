"""Direct kernel-to-kernel edges: `runtime.edges()`, the edge kinds `connect` picks, and
the shared edge scenarios (``tests/tier_scenarios.py``, section ``direct edges``) run on
each edge kind."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pydotcompute import RingKernelRuntime
from pydotcompute.ring_kernels.edges import EdgeInfo
from tests import tier_scenarios as sc


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()


async def test_edges_lists_each_connect_with_its_kind() -> None:
    """Every ``connect`` edge is listed once, with its kind and, for a loop edge, why it
    is not direct; ``disconnect`` removes it."""
    async with RingKernelRuntime() as rt:
        await rt.launch("a", sc.relay_async, input_type=sc.Done, output_type=sc.Done)
        await rt.launch("b", sc.echo_sync, input_type=sc.Job, output_type=sc.Done, tier="thread")
        await rt.launch("c", sc.relay_async, input_type=sc.Done, output_type=sc.Done)
        assert rt.edges() == []
        rt.connect("b", "c")
        rt.connect("a", "c")
        edges = {(e.source, e.target): e for e in rt.edges()}
        assert set(edges) == {("b", "c"), ("a", "c")}
        for edge in edges.values():
            assert isinstance(edge, EdgeInfo)
            assert edge.kind == "loop"
            assert edge.counters is None
        assert "'c' runs on the asyncio tier" in edges[("b", "c")].why
        assert "'a' runs on the asyncio tier" in edges[("a", "c")].why
        rt.disconnect("a")
        assert [(e.source, e.target) for e in rt.edges()] == [("b", "c")]


async def test_edges_exported_as_metrics() -> None:
    """``pydotcompute_edge_info`` names each edge with its kind, scraped over HTTP."""
    async with RingKernelRuntime() as rt:
        await rt.launch("a", sc.relay_async, input_type=sc.Done, output_type=sc.Done)
        await rt.launch("b", sc.relay_async, input_type=sc.Done, output_type=sc.Done)
        rt.connect("a", "b")
        host, port = rt.serve_metrics(port=0)
        text = await asyncio.to_thread(_scrape, f"http://{host}:{port}/metrics")
    infos = [
        s.labels
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "pydotcompute_edge_info" and s.value == 1.0
    ]
    assert infos == [{"source": "a", "target": "b", "kind": "loop"}], infos


async def test_thread_edges_are_direct_unless_asked() -> None:
    """thread -> thread is an ``objects`` edge, under a tracing runtime too (the trace
    context rides with each message); ``direct=False`` keeps the loop, and says so."""
    for tracing, direct, kind, why in (
        (False, True, "objects", ""),
        (False, False, "loop", "direct=False"),
        (True, True, "objects", ""),
        (True, False, "loop", "direct=False"),
    ):
        async with RingKernelRuntime(tracing=tracing) as rt:
            for kid in ("a", "b"):
                await rt.launch(
                    kid, sc.relay_job_sync, input_type=sc.Job, output_type=sc.Job, tier="thread"
                )
            rt.connect("a", "b", direct=direct)
            (edge,) = rt.edges()
            assert edge.kind == kind, edge
            assert why in edge.why, edge
            assert (edge.counters is None) == (kind == "loop"), edge


# --- the shared edge scenarios, on each edge kind ----------------------------------------

EDGE_CASES = [pytest.param(c, id=c.id) for c in sc.EDGE_CASES]


@pytest.fixture(params=EDGE_CASES)
def edge(request: pytest.FixtureRequest) -> sc.EdgeCase:
    return request.param  # type: ignore[no-any-return]


async def test_edge_exactly_once_in_order(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_exactly_once_in_order(edge)


async def test_edge_block_holds_the_bound(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_block_holds_the_bound(edge)


async def test_edge_reject_counts_at_receiver(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_reject_counts_at_receiver(edge)


async def test_edge_drop_oldest_counts_at_receiver(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_drop_oldest_counts_at_receiver(edge)


async def test_edge_priority_overtakes(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_priority_overtakes(edge)


async def test_edge_ordered_shutdown_drains(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_ordered_shutdown_drains(edge)


async def test_edge_leftovers_handed_back_once(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_leftovers_handed_back_once(edge)


async def test_edge_consumer_failure(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_consumer_failure(edge)


async def test_edge_disconnect_reconnect(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_disconnect_reconnect(edge)


# --- round 4: direct edges through shared memory -------------------------------------------


async def test_edge_pause_holds_edge(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_pause_holds_edge(edge)


async def test_edge_flows_while_loop_blocked(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_flows_while_loop_blocked(edge)


async def test_edge_consumer_killed(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_consumer_killed(edge)


@pytest.mark.parametrize(("source", "target"), [("process", "process"), ("thread", "process")])
async def test_shm_edges_and_their_counts_exported_as_metrics(source: str, target: str) -> None:
    """A ``shm-ring`` edge is listed with its kind, and its counters (read from the
    edge's shared header) are exported per outcome, scraped over HTTP."""
    n = 50
    async with RingKernelRuntime() as rt:
        await rt.launch("a", sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier=source)
        await rt.launch("b", sc.relay_job_sync, input_type=sc.Job, output_type=sc.Job, tier=target)
        rt.connect("a", "b")
        for kid in ("b", "a"):
            await rt.activate(kid)
        # once b's actor has taken a message it has looked at its edge: from then on a's
        # messages take it (before, they take the loop path, which wakes b)
        await rt.send("a", sc.Job(seq=-1))
        assert (await rt.receive("b", timeout=30)).seq == -1
        base = rt.edges()[0].counters or {}
        for i in range(n):
            await rt.send("a", sc.Job(seq=i))
        assert [(await rt.receive("b", timeout=30)).seq for _ in range(n)] == list(range(n))
        host, port = rt.serve_metrics(port=0)
        text = await asyncio.to_thread(_scrape, f"http://{host}:{port}/metrics")
    labels = {"source": "a", "target": "b", "kind": "shm-ring"}
    counts = {
        s.labels["outcome"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "pydotcompute_edge_messages_total"
        and {k: s.labels[k] for k in labels} == labels
    }
    assert counts["accepted"] == counts["taken"] == base["accepted"] + n, (counts, base)
    assert counts["lost"] == counts["handed_back"] == 0, counts


async def test_process_edges_are_direct_unless_asked() -> None:
    """process -> process, thread -> process and process -> thread are ``shm-ring``
    edges, under a tracing runtime too (the trace context rides in each record's
    header); ``direct=False`` keeps the loop, and says so."""
    for source, target in (("process", "process"), ("thread", "process"), ("process", "thread")):
        for tracing, direct, kind, why in (
            (False, True, "shm-ring", ""),
            (False, False, "loop", "direct=False"),
            (True, True, "shm-ring", ""),
        ):
            async with RingKernelRuntime(tracing=tracing) as rt:
                for kid, tier in (("a", source), ("b", target)):
                    await rt.launch(
                        kid, sc.relay_job_sync, input_type=sc.Job, output_type=sc.Job, tier=tier
                    )
                rt.connect("a", "b", direct=direct)
                (got,) = rt.edges()
                assert got.kind == kind, got
                assert why in got.why, got


async def test_a_process_actor_without_edges_keeps_the_plain_context() -> None:
    """Only a child given edges swaps in the edge-aware context (its receive reads its
    inputs by turns): one without pays nothing per message for edges."""
    async with RingKernelRuntime() as rt:
        for kid in ("solo", "a", "b"):
            actor = sc.pass_job_sync if kid == "a" else sc.context_class_sync
            await rt.launch(kid, actor, input_type=sc.Job, output_type=sc.Job, tier="process")
        rt.connect("a", "b")
        for kid in ("solo", "b", "a"):
            await rt.activate(kid)
        await rt.send("solo", sc.Job(seq=1))
        await rt.send("a", sc.Job(seq=2))
        solo = await rt.receive("solo", timeout=30)
        edged = await rt.receive("b", timeout=30)
    assert solo.payload == "ProcessKernelContext"
    assert edged.payload == "EdgeProcessKernelContext"


async def test_edge_answered_record_ends_once(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_answered_record_ends_once(edge)


# --- round 4: traced edges -----------------------------------------------------------------


async def test_edge_traced_links(edge: sc.EdgeCase) -> None:
    await sc.scenario_edge_traced_links(edge)


# --- round 4: direct edges with a worker-pool end ----------------------------------------

POOL_EDGE_CASES = [pytest.param(c, id=c.id) for c in sc.POOL_EDGE_CASES]


@pytest.fixture(params=POOL_EDGE_CASES)
def pool_edge(request: pytest.FixtureRequest) -> sc.PoolEdgeCase:
    case: sc.PoolEdgeCase = request.param
    return case


async def test_pool_edge_exactly_once(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_exactly_once(pool_edge)


async def test_pool_edge_block_holds_the_bound(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_block_holds_the_bound(pool_edge)


async def test_pool_edge_reject_counts_at_receiver(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_reject_counts_at_receiver(pool_edge)


async def test_pool_edge_ordered_shutdown_drains(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_ordered_shutdown_drains(pool_edge)


async def test_pool_edge_leftovers_handed_back_once(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_leftovers_handed_back_once(pool_edge)


async def test_pool_edge_pause_holds_edges(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_pause_holds_edges(pool_edge)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id)
        for c in sc.POOL_EDGE_CASES
        if c.target == "process" and c.b_replicas > 1
    ],
)
async def test_pool_edge_replica_killed(case: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_replica_killed(case)


async def test_an_edge_into_a_pool_names_each_replica_edge() -> None:
    """``runtime.edges()`` of an edge into a pool: one replica edge per replica, each
    named ``"b[i]"``, its kind and counters; the edge's counters are their sums."""
    async with RingKernelRuntime() as rt:
        await rt.launch("a", sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier="thread")
        await rt.launch(
            "b", sc.relay_job_sync, input_type=sc.Job, output_type=sc.Job, tier="thread",
            replicas=3, queue_size=9,
        )  # fmt: skip
        rt.connect("a", "b")
        (edge,) = rt.edges()
        assert edge.kind == "objects"
        assert [(r.source, r.target, r.kind) for r in edge.replicas] == [
            ("a", f"b[{i}]", "objects") for i in range(3)
        ]
        assert [r.counters["capacity"] for r in edge.replicas if r.counters] == [3, 3, 3]
        assert edge.counters is not None
        assert edge.counters["capacity"] == 9


async def test_pool_edge_consumer_failure(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_consumer_failure(pool_edge)


async def test_pool_edge_disconnect_reconnect(pool_edge: sc.PoolEdgeCase) -> None:
    await sc.scenario_pool_edge_disconnect_reconnect(pool_edge)


async def test_a_tracing_runtime_keeps_pool_edges_on_the_loop() -> None:
    """The spread over a pool's replica edges carries no trace context: under tracing an
    edge with a pool end stays on the loop path, and says so; messages still arrive."""
    pytest.importorskip("opentelemetry.sdk")
    async with RingKernelRuntime(tracing=True) as rt:
        await rt.launch(
            "a", sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier="thread", replicas=2
        )
        await rt.launch(
            "b", sc.relay_job_sync, input_type=sc.Job, output_type=sc.Job, tier="thread"
        )
        rt.connect("a", "b")
        (edge,) = rt.edges()
        assert edge.kind == "loop", edge
        assert "pool" in edge.why, edge
        for kid in ("b", "a"):
            await rt.activate(kid)
        for i in range(20):
            await rt.send("a", sc.Job(seq=i))
        got = sorted([(await rt.receive("b", timeout=30)).seq for _ in range(20)])
        assert got == list(range(20))
