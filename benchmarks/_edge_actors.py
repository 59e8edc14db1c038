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
