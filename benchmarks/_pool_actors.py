"""Messages and actors for ``pool_benchmark.py``.

They live in an importable module (not the script) because the process tier runs the actor
in ``spawn`` children, which import it by module path.
"""

from __future__ import annotations

from typing import Any

from pydotcompute import message


@message
class Task:
    seq: int
    n: int


@message
class Result:
    seq: int
    value: int


def burn(n: int) -> int:
    """A pure-Python CPU-bound loop: ``n`` iterations (holds the GIL throughout)."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def burn_sync(ctx: Any) -> None:
    """Thread and process tiers: answer every Task after burning its ``n`` iterations."""
    receive, send = ctx.receive, ctx.send
    while True:
        task = receive()
        send(Result(seq=task.seq, value=burn(task.n)))


async def burn_async(ctx: Any) -> None:
    """The asyncio tier: the same work, on the event loop."""
    while True:
        task = await ctx.receive()
        await ctx.send(Result(seq=task.seq, value=burn(task.n)))
