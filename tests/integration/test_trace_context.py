"""Trace context across the process tier's wire (real child processes, real rings) and
to a thread-tier actor (in the same process).

The parent's ``process <kernel>`` span travels in each record's frame header, or beside
the message to an actor thread; the actor sees it as the current span, spans it makes
nest under it, and what it sends carries its current context as the parent of the next
hop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import MessageDeserializationError
from pydotcompute.ring_kernels.tiers.process import ProcessWorker
from pydotcompute.ring_kernels.tiers.process.framing import (
    TRACE_HEADER_BYTES,
    split_trace,
    trace_header,
)

from .tier_actors import Job, forward_async, forward_sync
from .trace_actors import Seen, idle, report_context, report_then_idle, span_of_its_own

BOUND_S = 30.0


async def finished(exporter: Any, name: str, n: int) -> list[Any]:
    """The finished spans called ``name``, once there are ``n`` of them."""
    deadline = time.monotonic() + BOUND_S
    while True:
        spans = [s for s in exporter.get_finished_spans() if s.name == name]
        if len(spans) >= n or time.monotonic() > deadline:
            return spans
        await asyncio.sleep(0.02)


def hex_ids(span: Any) -> tuple[str, str]:
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


@pytest.mark.parametrize(("tier", "replicas"), [("process", 1), ("thread", 1), ("thread", 2)])
async def test_an_actor_sees_its_process_span_as_current(
    span_exporter: Any, tier: str, replicas: int
) -> None:
    """While it handles a message, the actor (in a child process, or on its own thread)
    has the parent's ``process`` span of that message as its current span."""
    n = 5
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch(
            "b", report_context, input_type=Job, output_type=Seen, tier=tier, replicas=replicas
        )
        await rt.activate("b")
        jobs = [Job(seq=i) for i in range(n)]
        for job in jobs:
            await rt.send("b", job)
        seen = {s.seq: s for s in [await rt.receive("b", timeout=BOUND_S) for _ in range(n)]}
        spans = await finished(span_exporter, "process b", n)
    by_id = {s.attributes["messaging.message.id"]: s for s in spans}
    assert len(by_id) == n
    for job in jobs:
        span = by_id[str(job.message_id)]
        assert (seen[job.seq].trace_id, seen[job.seq].span_id) == hex_ids(span)
    assert len({s.trace_id for s in seen.values()}) == n  # each message its own trace


async def test_child_spans_nest_and_the_reply_parents_the_next_hop(span_exporter: Any) -> None:
    """b (process) makes a span of its own and answers inside it; c (thread) gets the
    answer: its ``send c`` hangs under b's child span, which came back in the frame."""
    n = 3
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("b", span_of_its_own, input_type=Job, output_type=Seen, tier="process")
        await rt.launch("c", forward_sync, input_type=Seen, output_type=Seen, tier="thread")
        for kid in "bc":
            await rt.activate(kid)
        rt.connect("b", "c", direct=False)  # the loop path: the reply's frame parents send c
        jobs = [Job(seq=i) for i in range(n)]
        for job in jobs:
            await rt.send("b", job)
        seen = {s.seq: s for s in [await rt.receive("c", timeout=BOUND_S) for _ in range(n)]}
        await finished(span_exporter, "process c", n)
    spans = span_exporter.get_finished_spans()
    process_b = {s.attributes["messaging.message.id"]: s for s in spans if s.name == "process b"}
    for job in jobs:
        got = seen[job.seq]
        b_span = process_b[str(job.message_id)]
        trace_id, b_span_id = hex_ids(b_span)
        assert got.trace_id == trace_id
        assert got.parent == b_span_id  # the child's span nests under the process span
        reply_id = str(got.message_id)
        send_c = next(
            s
            for s in spans
            if s.name == "send c" and s.attributes["messaging.message.id"] == reply_id
        )
        process_c = next(
            s
            for s in spans
            if s.name == "process c" and s.attributes["messaging.message.id"] == reply_id
        )
        assert f"{send_c.context.trace_id:032x}" == trace_id
        assert f"{send_c.parent.span_id:016x}" == got.span_id  # parented via the header
        assert process_c.parent.span_id == send_c.context.span_id


def used_bytes_after_one(worker: ProcessWorker, msg: Any) -> int:
    worker.start()
    try:
        assert worker.send(msg, timeout=BOUND_S)
        return worker.inbox.get_stats()["used_bytes"]
    finally:
        worker.stop(BOUND_S)


def record_bytes(payload: int) -> int:
    return 8 + ((payload + 7) & ~7)  # the ring's length word, then the payload padded


def test_untraced_records_are_the_message_bytes_and_traced_ones_add_the_header() -> None:
    msg = Job(seq=7, payload="x" * 13)
    size = len(msg.serialize())
    assert used_bytes_after_one(ProcessWorker("plain", idle), msg) == record_bytes(size)

    traced = ProcessWorker("traced", idle)
    assert traced.trace_wire(lambda m: (1, 2, 1), lambda *_: None)
    got = used_bytes_after_one(traced, msg)
    assert got == record_bytes(TRACE_HEADER_BYTES + size) != record_bytes(size)


def test_trace_header_round_trip_and_malformed_frames() -> None:
    trace_id, span_id = (1 << 127) | 5, (1 << 63) | 9
    record = Job(seq=1).serialize()
    frame = trace_header(trace_id, span_id, 1) + record
    assert len(frame) == TRACE_HEADER_BYTES + len(record)
    assert split_trace("k", frame) == (trace_id, span_id, 1, record)
    with pytest.raises(MessageDeserializationError, match="trace context frame needs 27"):
        split_trace("k", frame[:TRACE_HEADER_BYTES])  # no record after the header
    with pytest.raises(MessageDeserializationError, match=r"got \d+ bytes starting with b'\\x"):
        split_trace("k", record + bytes(30))


# --- the thread tier: the context beside the message, in one process ---


async def test_a_thread_actor_leaves_the_context_on_its_next_receive(
    span_exporter: Any,
) -> None:
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("t", report_then_idle, input_type=Job, output_type=Seen, tier="thread")
        await rt.activate("t")
        await rt.send("t", Job(seq=1))
        during = await rt.receive("t", timeout=BOUND_S)
        after = await rt.receive("t", timeout=BOUND_S)
    assert during.seq == 1
    assert int(during.trace_id, 16) != 0
    assert after.seq == -1
    assert int(after.trace_id, 16) == 0  # nothing current any more


async def test_spans_in_a_thread_actor_nest_and_its_sends_parent_the_next_hop(
    span_exporter: Any,
) -> None:
    """a (asyncio) forwards each Job to t (thread), which answers inside a span of its
    own; p (process) gets the answer: its ``send p`` hangs under t's span."""
    n = 3
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        await rt.launch("t", span_of_its_own, input_type=Job, output_type=Seen, tier="thread")
        await rt.launch("p", forward_sync, input_type=Seen, output_type=Seen, tier="process")
        for kid in "atp":
            await rt.activate(kid)
        rt.connect("a", "t")
        rt.connect("t", "p", direct=False)  # the loop path: t's send parents send p
        jobs = [Job(seq=i) for i in range(n)]
        for job in jobs:
            await rt.send("a", job)
        seen = {s.seq: s for s in [await rt.receive("p", timeout=BOUND_S) for _ in range(n)]}
        await finished(span_exporter, "process p", n)
    spans = span_exporter.get_finished_spans()

    def one(name: str, message_id: Any) -> Any:
        (span,) = (
            s
            for s in spans
            if s.name == name and s.attributes.get("messaging.message.id") == str(message_id)
        )
        return span

    works = {f"{s.context.span_id:016x}": s for s in spans if s.name == "work"}
    assert len(works) == n
    for job in jobs:
        got = seen[job.seq]
        send_a = one("send a", job.message_id)
        process_t = one("process t", job.message_id)  # a sends on the Job it received
        trace_id, t_span_id = hex_ids(process_t)
        assert trace_id == f"{send_a.context.trace_id:032x}"  # one trace from the start
        assert (got.trace_id, got.parent) == (trace_id, t_span_id)
        work = works[got.span_id]  # recorded here: the actor runs in this process
        assert work.parent.span_id == process_t.context.span_id
        send_p = one("send p", got.message_id)
        assert f"{send_p.context.trace_id:032x}" == trace_id
        assert send_p.parent.span_id == work.context.span_id  # the actor's current span
        assert one("process p", got.message_id).parent.span_id == send_p.context.span_id


def report_context_class(ctx: Any) -> None:
    """Answers each message with the name of its context's class."""
    while not ctx.should_terminate:
        if ctx.receive(timeout=0.05) is not None:
            ctx.send(type(ctx).__name__)


@pytest.mark.parametrize("tracing", [False, True])
async def test_only_a_tracing_runtime_gives_a_thread_actor_a_traced_context(
    tracing: bool,
) -> None:
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=tracing) as rt:
        await rt.launch("t", report_context_class, tier="thread")
        await rt.activate("t")
        await rt.send("t", 1)
        name = await rt.receive("t", timeout=BOUND_S)
    assert name == ("TracedThreadedKernelContext" if tracing else "ThreadedKernelContext")


@pytest.mark.parametrize("tier", ["thread", "process"])
async def test_a_tracing_runtime_still_widens_the_bridge(
    span_exporter: Any, tier: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracing wrapper of a worker passes `set_room` on: its bridge widens for a quick
    actor as an untraced one does (a 50 ms window, so the SDK's cost per span leaves it
    quick enough on any machine)."""
    from pydotcompute.ring_kernels import hosted

    monkeypatch.setattr(hosted, "BRIDGE_WINDOW_S", 0.05)
    monkeypatch.setattr(hosted, "BRIDGE_WINDOW_URGENT_LANE_S", 0.05)  # (the thread tier's)
    n = 3000
    async with asyncio.timeout(BOUND_S * 4), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("k", forward_sync, input_type=Job, output_type=Job, tier=tier)
        await rt.activate("k")
        kernel: Any = rt.get_kernel("k")

        async def produce() -> None:
            for i in range(n):
                await rt.send("k", Job(seq=i))

        producer = asyncio.ensure_future(produce())
        widest = 0
        got = []
        for _ in range(n):
            got.append((await rt.receive("k", timeout=BOUND_S)).seq)
            widest = max(widest, kernel.bridge_room)
        await producer
    span_exporter.clear()
    assert got == list(range(n))
    assert widest > 64, widest


# --- round 4: direct edges keep the trace ---


async def test_a_pipeline_of_direct_edges_is_one_trace(span_exporter: Any) -> None:
    """a (thread) -> b (thread) -> c (process) -> d (process), every edge direct under a
    tracing runtime: each Job is one trace from its ``send a`` to d, whose actor sees the
    context b's recorded ``process b`` span carried on (c takes it from b's record and
    writes it into d's), and nothing is lost."""
    from tests import tier_scenarios as sc

    n = 20
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        for kid, tier in (("a", "thread"), ("b", "thread"), ("c", "process")):
            await rt.launch(kid, sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier=tier)
        await rt.launch(
            "d", sc.report_trace_sync, input_type=sc.Job, output_type=sc.Job, tier="process"
        )
        for src, dst in ("ab", "bc", "cd"):
            rt.connect(src, dst)
        assert [e.kind for e in rt.edges()] == ["objects", "shm-ring", "shm-ring"]
        for kid in "dcba":
            await rt.activate(kid)
        jobs = [sc.Job(seq=i) for i in range(n)]
        for job in jobs:
            await rt.send("a", job)
        got = [await rt.receive("d", timeout=BOUND_S) for _ in range(n)]
        counters = [e.counters for e in rt.edges()]
        await finished(span_exporter, "process b", n)
    assert sorted(r.seq for r in got) == list(range(n))
    for c in counters:
        assert c is not None, counters
        assert c["accepted"] == c["taken"] == n, counters
    spans = span_exporter.get_finished_spans()
    by = {(s.name, s.attributes.get("messaging.message.id")): s for s in spans}
    seen = {r.seq: r.payload.split(":") for r in got}
    for job in jobs:
        send_a = by[("send a", str(job.message_id))]
        process_a = by[("process a", str(job.message_id))]
        process_b = by[("process b", str(job.message_id))]
        assert process_a.parent.span_id == send_a.context.span_id
        assert process_b.parent.span_id == process_a.context.span_id  # over the edge
        trace_id, span_id = seen[job.seq]
        assert trace_id == f"{send_a.context.trace_id:032x}"
        assert span_id == f"{process_b.context.span_id:016x}"  # carried through c


async def test_a_thread_consumer_fails_the_span_of_the_edge_message_it_raised_on(
    span_exporter: Any,
) -> None:
    """b (thread) takes Jobs from an ``objects`` edge and raises on one: the ``process b``
    span it recorded for that message is failed, with the actor's exception; the one
    before is not."""
    from opentelemetry.trace import StatusCode

    from tests import tier_scenarios as sc

    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("a", sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier="thread")
        await rt.launch(
            "b", sc.relay_job_sync, input_type=sc.Job, output_type=sc.Job, tier="thread"
        )
        rt.connect("a", "b")
        assert [e.kind for e in rt.edges()] == ["objects"]
        for kid in "ba":
            await rt.activate(kid)
        ok, boom = sc.Job(seq=0), sc.Job(seq=1, payload="boom")
        await rt.send("a", ok)
        assert (await rt.receive("b", timeout=BOUND_S)).seq == 0
        await rt.send("a", boom)
        spans = await finished(span_exporter, "process b", 2)
    by = {s.attributes["messaging.message.id"]: s for s in spans}
    failed = by[str(boom.message_id)]
    assert failed.status.status_code == StatusCode.ERROR
    assert "ValueError: boom at 1" in (failed.status.description or "")
    assert [e.name for e in failed.events] == ["exception"]
    assert by[str(ok.message_id)].status.status_code == StatusCode.UNSET


async def test_children_traced_before_their_edges_carry_the_context(span_exporter: Any) -> None:
    """a and b (process) handle traced messages first, then are connected: their contexts,
    traced already, take the edge on as traced ones, so what a writes into the edge still
    carries its span and b handles it inside a's trace."""
    from tests import tier_scenarios as sc

    n = 30
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch(
            "a", sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier="process"
        )
        await rt.launch(
            "b", sc.report_trace_sync, input_type=sc.Job, output_type=sc.Job, tier="process"
        )
        for kid in "ba":
            await rt.activate(kid)
        await rt.send("a", sc.Job(seq=-1))  # both children see a trace frame first
        await rt.send("b", sc.Job(seq=-2))
        assert (await rt.receive("a", timeout=BOUND_S)).seq == -1
        assert (await rt.receive("b", timeout=BOUND_S)).seq == -2
        rt.connect("a", "b")
        assert [e.kind for e in rt.edges()] == ["shm-ring"]
        # b, parked on its inbox alone, looks at its edge once a message wakes it (on the
        # loop path); then the edge is live
        await rt.send("a", sc.Job(seq=-3))
        assert (await rt.receive("b", timeout=BOUND_S)).seq == -3
        await asyncio.sleep(0.2)
        # (-3 itself may have taken the edge already, if a's child saw the route first)
        (edge,) = rt.edges()
        assert edge.counters is not None
        before = edge.counters["accepted"]
        jobs = [sc.Job(seq=i) for i in range(n)]
        for job in jobs:
            await rt.send("a", job)
        got = {r.seq: r.payload for r in [await rt.receive("b", timeout=BOUND_S) for _ in range(n)]}
        (edge,) = rt.edges()
        await finished(span_exporter, "process a", n + 2)
    assert sorted(got) == list(range(n))
    assert edge.counters is not None
    assert edge.counters["accepted"] - before == n, (before, edge.counters)
    spans = span_exporter.get_finished_spans()
    process_a = {s.attributes["messaging.message.id"]: s for s in spans if s.name == "process a"}
    for job in jobs:
        trace_id = f"{process_a[str(job.message_id)].context.trace_id:032x}"
        assert got[job.seq].split(":")[0] == trace_id, job.seq


@pytest.mark.parametrize("tier", ["thread", "process"])
async def test_tracing_replaces_no_method_of_a_worker(span_exporter: Any, tier: str) -> None:
    """A traced worker carries context through methods of its class, set before it starts:
    nothing on the live worker shadows its class's (its ``offer``, its encoder, its reply
    decoder), and the bridge talks to the tier's own worker, not a wrapper."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("k", forward_sync, input_type=Job, output_type=Job, tier=tier)
        await rt.activate("k")
        assert (await rt.send_and_receive("k", Job(seq=1), timeout=BOUND_S)).seq == 1
        worker: Any = rt.get_kernel("k").worker
        own = {k for k, v in vars(worker).items() if callable(v) and hasattr(type(worker), k)}
        assert own == set(), own
        assert type(worker).__module__.startswith("pydotcompute.ring_kernels.tiers.")
    assert await finished(span_exporter, "process k", 1)


@pytest.mark.parametrize("tier", ["thread", "process"])
async def test_a_producer_into_a_direct_edge_ends_its_process_spans(
    span_exporter: Any, tier: str
) -> None:
    """a sends everything into a direct edge, so no reply comes back to its bridge: each
    ``process a`` span ends at the hand-over (`Instrument.edge_routed`), while the runtime
    still runs, not when a stops."""
    from tests import tier_scenarios as sc

    n = 10
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("a", sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier=tier)
        await rt.launch("b", sc.pass_job_sync, input_type=sc.Job, output_type=sc.Job, tier=tier)
        rt.connect("a", "b")
        assert [e.kind for e in rt.edges()] != ["loop"]
        for kid in "ba":
            await rt.activate(kid)
        await rt.send("a", sc.Job(seq=-1))  # wakes b onto its edge (on the loop path)
        assert (await rt.receive("b", timeout=BOUND_S)).seq == -1
        await asyncio.sleep(0.2)
        for i in range(n):
            await rt.send("a", sc.Job(seq=i))
        got = sorted([(await rt.receive("b", timeout=BOUND_S)).seq for _ in range(n)])
        (edge,) = rt.edges()
        spans = await finished(span_exporter, "process a", n + 1)
        assert len(spans) == n + 1, [s.name for s in span_exporter.get_finished_spans()]
    assert got == list(range(n))
    assert edge.counters is not None
    assert edge.counters["accepted"] >= n, edge.counters  # (the first too, once live)
