"""Trace context across the Ray tier: the driver's context reaches the actor with each
message, and goes on along a pipeline.

A Ray kernel is hosted like the thread and process tiers: the driver's ``process`` span
(the child of its ``send``) runs from the hand-over to the reply, and its context crosses
with the message. No tracer provider is configured in the Ray workers, so the actor's own
span is non-recording and keeps the ids of its parent: the actor sees the driver's
``process`` span.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("ray", reason='the Ray tier needs ray (pip install "pydotcompute[ray]")')
pytest.importorskip("opentelemetry.sdk", reason="the trace tests need opentelemetry-sdk")

from ray_test_actors import Num, SeenTrace, pass_num, report_trace

from pydotcompute import RingKernelRuntime

pytestmark = pytest.mark.ray
BOUND_S = 60.0


def send_spans(exporter: Any, kernel_id: str, verb: str = "process") -> dict[str, Any]:
    """The driver's ``<verb> <kernel_id>`` spans by message id (``process`` by default:
    the span whose context the actor sees)."""
    spans = exporter.get_finished_spans()
    name = f"{verb} {kernel_id}"
    return {s.attributes["messaging.message.id"]: s for s in spans if s.name == name}


def hex_ids(span: Any) -> tuple[str, str]:
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


async def test_a_ray_actor_sees_the_context_its_message_was_sent_in(span_exporter: Any) -> None:
    n = 5
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("b", report_trace, input_type=Num, output_type=SeenTrace, tier="ray")
        await rt.activate("b")
        nums = [Num(value=i) for i in range(n)]
        for num in nums:
            await rt.send("b", num)
        seen = {s.value: s for s in [await rt.receive("b", timeout=BOUND_S) for _ in range(n)]}
        asked = Num(value=99)  # send_and_receive, traced the same way
        answer = await rt.send_and_receive("b", asked, timeout=BOUND_S)
    sends = send_spans(span_exporter, "b")
    parents = send_spans(span_exporter, "b", "send")
    for num in nums:
        mid = str(num.message_id)
        assert sends[mid].parent.span_id == parents[mid].context.span_id
        assert (seen[num.value].trace_id, seen[num.value].span_id) == hex_ids(
            sends[str(num.message_id)]
        )
    assert (answer.trace_id, answer.span_id) == hex_ids(sends[str(asked.message_id)])
    assert len({s.trace_id for s in seen.values()}) == n  # each message its own trace


async def test_the_context_goes_on_from_actor_to_actor(span_exporter: Any) -> None:
    n = 3
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("a", pass_num, input_type=Num, output_type=Num, tier="ray")
        await rt.launch("b", report_trace, input_type=Num, output_type=SeenTrace, tier="ray")
        rt.connect("a", "b")
        for kid in "ab":
            await rt.activate(kid)
        nums = [Num(value=i) for i in range(n)]
        for num in nums:
            await rt.send("a", num)
        seen = {s.value: s for s in [await rt.receive("b", timeout=BOUND_S) for _ in range(n)]}
    heads = send_spans(span_exporter, "a")
    deadline = time.monotonic() + 5
    while len(heads) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        heads = send_spans(span_exporter, "a")
    for num in nums:
        # a's actor hands b's actor the message in its context (the edge is direct):
        # b's actor sees a's process span, one trace from the driver's send
        assert (seen[num.value].trace_id, seen[num.value].span_id) == hex_ids(
            heads[str(num.message_id)]
        )
