"""Messages, actors and waiting helpers shared by the foundation tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydotcompute.ring_kernels.context import KernelContext
from pydotcompute.ring_kernels.message import message

ROOT = Path(__file__).resolve().parents[2]


@message
class Req:
    x: int


@message
class Resp:
    y: int


@message
class Other:
    z: str


async def doubler(ctx: KernelContext) -> None:
    """Req(x) -> Resp(2x), the quick-start loop shape."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Resp(y=msg.x * 2))


async def echo(ctx: KernelContext) -> None:
    """Sends every message on unchanged."""
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


async def crash_on_negative(ctx: KernelContext) -> None:
    """Like :func:`doubler`, but raises ``ValueError`` on a negative ``x``."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        if msg.x < 0:
            raise ValueError(f"negative input {msg.x}")
        await ctx.send(Resp(y=msg.x * 2))


async def until(predicate: Callable[[], Any], what: str, *, steps: int = 10_000) -> None:
    """Yield to the loop until ``predicate()`` is true (bounded, so a bug cannot hang)."""
    for i in range(steps):
        if predicate():
            return
        await asyncio.sleep(0 if i < 100 else 0.001)
    raise AssertionError(f"never happened: {what}")


def run_python(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a fresh interpreter that imports this checkout's package.

    ``PYDOTCOMPUTE_NO_UVLOOP`` is cleared unless given in ``env``.
    """
    full_env = {k: v for k, v in os.environ.items() if k != "PYDOTCOMPUTE_NO_UVLOOP"}
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env.update(env)
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
