"""Messages, actors and floor children for ``tier_latency_benchmark.py``.

They live in an importable module (not the script) because the process tier and the
multiprocessing floors run them in ``spawn`` children, which import them by module path.
"""

from __future__ import annotations

import os
from typing import Any

from pydotcompute import message
from pydotcompute.ring_kernels.message import message_decoder

try:
    from pydotcompute.ring_kernels._native import SharedByteRing
except ImportError:  # a checkout older than the _native package (benchmarks/alternate.py)
    from pydotcompute.ring_kernels._cython import SharedByteRing  # type: ignore[no-redef]


@message
class Ping:
    value: int


@message
class Pong:
    value: int


def echo_actor(ctx: Any) -> None:
    """Tier 2 and 3 actor: answer every Ping with a Pong (blocking receive, no timeout)."""
    receive, send = ctx.receive, ctx.send
    while True:
        msg = receive()
        send(Pong(value=msg.value))


def raw_ring_echo(in_name: str, out_name: str, decode: bool) -> None:
    """Floor child: echo records between two shared rings with a pure busy poll.

    With ``decode`` it also decodes the Ping and encodes a Pong (the MessagePack cost
    without any kernel machinery around it, with the same per-stream decoder the kernel
    uses).
    """
    decoder = message_decoder() if decode else None
    inbox = SharedByteRing.attach(in_name)
    outbox = SharedByteRing.attach(out_name)
    try:
        while True:
            data = inbox.spin_read(1.0)
            if data is None:
                continue
            if data == b"quit":
                return
            if decoder is not None:
                data = Pong(value=decoder(data).value).serialize()  # type: ignore[attr-defined]
            while not outbox.try_write(data):
                pass
    finally:
        inbox.close()
        outbox.close()


def mp_queue_echo(q_in: Any, q_out: Any) -> None:
    """Floor child: ``multiprocessing.Queue`` echo (pickled Ping -> Pong)."""
    while True:
        msg = q_in.get()
        if msg is None:
            return
        q_out.put(Pong(value=msg.value))


def mp_pipe_echo(conn: Any) -> None:
    """Floor child: ``multiprocessing.Pipe`` echo (pickled Ping -> Pong)."""
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(Pong(value=msg.value))


def cpu_hog(seconds: float) -> None:
    """Keep one core busy (the loaded-machine condition of the spin sweep)."""
    import time

    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1
    os._exit(0)
