"""`RingKernel.add_done_callback`: how a host that runs a kernel for someone else (a Ray
actor) learns that the kernel ended, on the asyncio tier and through the hosting bridge."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import KernelStateError
from pydotcompute.ring_kernels import KernelState, RingKernel


@message
class Ping:
    n: int


async def returns_async(ctx: Any) -> None:
    while not ctx.should_terminate:
        ping = await ctx.receive()
        if ping.n < 0:
            return  # by itself
        await ctx.send(ping)


def returns_sync(ctx: Any) -> None:
    while not ctx.should_terminate:
        ping = ctx.receive(timeout=0.05)
        if ping is None:
            continue
        if ping.n < 0:
            return
        ctx.send(ping)


ACTORS = {"asyncio": returns_async, "thread": returns_sync}


async def _ended(kernel: RingKernel) -> asyncio.Future[RingKernel]:
    fut: asyncio.Future[RingKernel] = asyncio.get_running_loop().create_future()
    kernel.add_done_callback(lambda k: fut.done() or fut.set_result(k))
    return fut


async def test_refused_before_activate() -> None:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch("k", returns_async, input_type=Ping)
        with pytest.raises(KernelStateError, match="activate it first"):
            kernel.add_done_callback(lambda _k: None)


@pytest.mark.parametrize("tier", sorted(ACTORS))
async def test_called_once_the_actor_returned_with_books_closed(tier: str) -> None:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch(
            "k", ACTORS[tier], input_type=Ping, output_type=Ping, tier=tier, queue_size=64
        )
        await rt.activate("k")
        ended = await _ended(kernel)
        assert (await rt.send_and_receive("k", Ping(n=1), timeout=10)).n == 1
        await asyncio.sleep(0.05)
        assert not ended.done()
        await rt.send("k", Ping(n=-1))
        assert await asyncio.wait_for(ended, 10) is kernel
        assert kernel.state is KernelState.TERMINATED  # its books are closed by then


@pytest.mark.parametrize("tier", sorted(ACTORS))
async def test_called_after_terminate_and_soon_when_ended_already(tier: str) -> None:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch("k", ACTORS[tier], input_type=Ping, tier=tier)
        await rt.activate("k")
        ended = await _ended(kernel)
        await rt.terminate("k")
        assert await asyncio.wait_for(ended, 10) is kernel
        late: list[RingKernel] = []
        kernel.add_done_callback(late.append)
        assert late == []  # not inline
        await asyncio.sleep(0)
        assert late == [kernel]
