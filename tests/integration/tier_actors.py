"""Actors shared by the cross-tier suite (module-level so a child process can import them)."""

from __future__ import annotations

import os
import time
from typing import Any

from pydotcompute import message


@message
class Job:
    seq: int
    payload: str = ""


@message
class Done:
    seq: int
    tier: str


async def echo_async(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = await ctx.receive()
        if job.payload == "boom":
            raise ValueError("boom requested")
        await ctx.send(Done(seq=job.seq, tier="asyncio"))


def echo_sync(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is None:
            continue
        if job.payload == "boom":
            raise ValueError("boom requested")
        if job.payload == "exit":  # the process dies without a word
            os._exit(3)
        ctx.send(Done(seq=job.seq, tier="worker"))


def paced_echo_sync(ctx: Any) -> None:
    """`echo_sync` that first sleeps the seconds a job's payload names (if any)."""
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is not None:
            if job.payload:
                time.sleep(float(job.payload))
            ctx.send(Done(seq=job.seq, tier="paced"))


async def forward_async(ctx: Any) -> None:
    """Sends on the very message it received (its own reply)."""
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


def forward_sync(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is not None:
            ctx.send(job)
