"""Routing beyond one actor: ctx.send_to, connect/disconnect pipelines, correlated replies."""

from __future__ import annotations

import asyncio

import pytest
from foundation_helpers import Other, Req, Resp, doubler, echo, until

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelNotFoundError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.context import KernelContext
from pydotcompute.ring_kernels.runtime import RingKernelRuntime
from pydotcompute.ring_kernels.states import KernelState

S = KernelState


async def add_one(ctx: KernelContext) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Req(x=msg.x + 1, priority=msg.priority))


async def test_send_to_delivers_into_another_inbox(rt: RingKernelRuntime) -> None:
    async def router(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await ctx.send_to("even" if msg.x % 2 == 0 else "odd", msg)

    await rt.launch("router", router, input_type=Req)
    await rt.launch("even", doubler, input_type=Req, output_type=Resp)
    await rt.launch("odd", echo, input_type=Req)
    for kid in ("router", "even", "odd"):
        await rt.activate(kid)
    for i in range(6):
        await rt.send("router", Req(x=i))
    evens = [(await rt.receive("even", timeout=5)).y for _ in range(3)]
    odds = [(await rt.receive("odd", timeout=5)).x for _ in range(3)]
    assert evens == [0, 4, 8]
    assert odds == [1, 3, 5]
    assert rt.get_telemetry("router").messages_sent == 6


async def test_send_to_validates_the_target_type(rt: RingKernelRuntime) -> None:
    async def wrong(ctx: KernelContext) -> None:
        await ctx.receive()
        await ctx.send_to("typed", Other(z="bad"))

    await rt.launch("wrong", wrong)
    await rt.launch("typed", doubler, input_type=Req)
    await rt.activate("wrong")
    await rt.activate("typed")
    await rt.send("wrong", Req(x=1))
    with pytest.raises(KernelFailedError, match="kernel 'typed' expects Req, got Other") as info:
        await rt.receive("wrong", timeout=5)
    assert isinstance(info.value.__cause__, TypeValidationError)


async def test_send_to_an_unknown_kernel_fails_the_sender_with_the_known_ids(
    rt: RingKernelRuntime,
) -> None:
    async def lost(ctx: KernelContext) -> None:
        await ctx.receive()
        await ctx.send_to("nowhere", Req(x=1))

    await rt.launch("lost", lost)
    await rt.activate("lost")
    await rt.send("lost", Req(x=1))
    with pytest.raises(
        KernelFailedError, match=r"unknown kernel id 'nowhere' in the runtime; known ids: 'lost'"
    ):
        await rt.receive("lost", timeout=5)


async def test_a_three_stage_pipeline(rt: RingKernelRuntime) -> None:
    for kid in ("a", "b", "c"):
        await rt.launch(kid, add_one, input_type=Req, output_type=Req)
    rt.connect("a", "b")
    rt.connect("b", "c")
    for kid in ("a", "b", "c"):
        await rt.activate(kid)
    for i in range(50):
        await rt.send("a", Req(x=i))
    got = [(await rt.receive("c", timeout=5)).x for _ in range(50)]
    assert got == [i + 3 for i in range(50)]
    assert rt.receive_nowait("a") is None  # forwarded, not left in a's outbox
    assert rt.receive_nowait("b") is None


async def test_connect_checks_types(rt: RingKernelRuntime) -> None:
    await rt.launch("src", doubler, input_type=Req, output_type=Resp)
    await rt.launch("dst", doubler, input_type=Req, output_type=Resp)
    with pytest.raises(
        TypeValidationError,
        match=r"cannot connect 'src' -> 'dst': 'src' sends Resp but 'dst' expects Req",
    ):
        rt.connect("src", "dst")
    with pytest.raises(InvalidConfigurationError, match="cannot connect kernel 'src' to itself"):
        rt.connect("src", "src")
    with pytest.raises(KernelNotFoundError, match="known ids: 'dst', 'src'"):
        rt.connect("src", "missing")


async def test_untyped_kernels_connect(rt: RingKernelRuntime) -> None:
    await rt.launch("x", echo)
    await rt.launch("y", doubler, input_type=Req)
    rt.connect("x", "y")
    await rt.activate("x")
    await rt.activate("y")
    await rt.send("x", Req(x=4))
    assert (await rt.receive("y", timeout=5)).y == 8


async def test_forwarding_still_validates_at_runtime(rt: RingKernelRuntime) -> None:
    async def emits_other(ctx: KernelContext) -> None:
        await ctx.receive()
        await ctx.send(Other(z="?"))

    await rt.launch("p", emits_other)
    await rt.launch("q", doubler, input_type=Req)
    rt.connect("p", "q")
    await rt.activate("p")
    await rt.activate("q")
    await rt.send("p", Req(x=1))
    await until(lambda: rt.get_kernel_state("p") is S.FAILED, "sender failed")
    assert "kernel 'q' expects Req, got Other" in str(rt.get_kernel("p").error)


async def test_disconnect_returns_output_to_the_outbox(rt: RingKernelRuntime) -> None:
    await rt.launch("a", add_one, input_type=Req, output_type=Req)
    await rt.launch("b", add_one, input_type=Req, output_type=Req)
    rt.connect("a", "b")
    await rt.activate("a")
    await rt.activate("b")
    await rt.send("a", Req(x=0))
    assert (await rt.receive("b", timeout=5)).x == 2
    rt.disconnect("a")
    await rt.send("a", Req(x=0))
    assert (await rt.receive("a", timeout=5)).x == 1


async def test_pipeline_keeps_priority_bands(rt: RingKernelRuntime) -> None:
    await rt.launch("a", add_one, input_type=Req, output_type=Req)
    await rt.launch("b", add_one, input_type=Req, output_type=Req)
    rt.connect("a", "b")
    prios = [0, 255, 100, 200, 30, 240]
    for i, p in enumerate(prios):
        await rt.send("a", Req(x=i * 10, priority=p))
    await rt.activate("a")  # a drains its inbox by band into b before b starts
    await until(lambda: len(rt.get_kernel("b").inbox) == 6, "all forwarded")  # type: ignore[arg-type]
    await rt.activate("b")
    got = [(await rt.receive("b", timeout=5)).priority for _ in range(6)]
    assert got == [255, 240, 200, 100, 0, 30]


async def test_a_failing_stage_is_reported_by_the_runtime(rt: RingKernelRuntime) -> None:
    async def fragile(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            if msg.x < 0:
                raise ValueError("stage a broke")
            await ctx.send(msg)

    await rt.launch("a", fragile, input_type=Req, output_type=Req)
    await rt.launch("b", echo, input_type=Req)
    rt.connect("a", "b")
    await rt.activate("a")
    await rt.activate("b")
    await rt.send("a", Req(x=-1))
    await until(lambda: rt.get_kernel_state("a") is S.FAILED, "a failed")
    summary = rt.get_summary()
    assert summary["failures"] == [("a", "ValueError('stage a broke')")]
    assert summary["total_errors"] == 1


async def test_send_and_receive_through_a_forwarding_kernel(rt: RingKernelRuntime) -> None:
    """A correlated request is answered by the kernel it was sent to, not forwarded on."""
    await rt.launch("front", doubler, input_type=Req, output_type=Resp)
    await rt.launch("back", echo)
    rt.connect("front", "back")
    await rt.activate("front")
    await rt.activate("back")
    replies = await asyncio.gather(
        *(rt.send_and_receive("front", Req(x=i), timeout=5) for i in range(10))
    )
    assert [r.y for r in replies] == [2 * i for i in range(10)]
    await rt.send("front", Req(x=7))
    assert (await rt.receive("back", timeout=5)).y == 14


async def test_ctx_send_nowait_into_a_connected_kernel(rt: RingKernelRuntime) -> None:
    async def burst(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            for i in range(msg.x):
                ctx.send_nowait(Req(x=i))

    await rt.launch("burst", burst, input_type=Req)
    await rt.launch("sink", echo)
    rt.connect("burst", "sink")
    await rt.activate("burst")
    await rt.activate("sink")
    await rt.send("burst", Req(x=5))
    assert [(await rt.receive("sink", timeout=5)).x for _ in range(5)] == [0, 1, 2, 3, 4]
