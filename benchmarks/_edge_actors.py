"""The message and actor of ``edges_benchmark.py``, importable by a ``spawn`` child."""

from __future__ import annotations

from typing import Any

from pydotcompute import message


@message
class Item:
    seq: int


def relay(ctx: Any) -> None:
    """Pass every message on (a light handler: the hops are what is measured)."""
    receive, send = ctx.receive, ctx.send
    while True:
        send(receive())


async def relay_async(ctx: Any) -> None:
    """Pass every message on, on the event loop (an asyncio head stage)."""
    while True:
        await ctx.send(await ctx.receive())


#: iterations of `burn`'s loop per message: about a millisecond of pure-Python work
BURN = 20000


def burn(ctx: Any) -> None:
    """A CPU-bound handler: ``BURN`` iterations of arithmetic holding the GIL, then pass
    the message on (a process pool's replicas run it on separate cores)."""
    receive, send = ctx.receive, ctx.send
    while True:
        item = receive()
        acc = 0
        for i in range(BURN):
            acc = (acc + i * i) % 1000003
        send(item)
