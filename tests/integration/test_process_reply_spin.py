"""``reply_spin_us``: the event loop polls the reply ring while a caller waits.

Real child processes. Timing is never asserted: only that every reply reaches its own
caller, whether the spin catches it or the loop parks first, and that bad values are
refused at launch naming the option and the value.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import InvalidConfigurationError
from tests import tier_scenarios as sc

BOUND_S = sc.BOUND_S


def slow_echo(ctx: Any) -> None:
    """Echoes each job after a pause far longer than any spin."""
    while True:
        job = ctx.receive()
        time.sleep(0.002)
        ctx.send(job)


@pytest.mark.parametrize("spin", [0, 25, 100.0, 5_000])
async def test_round_trips_with_reply_spin(spin: float) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", sc.echo_sync, tier="process", input_type=sc.Job, reply_spin_us=spin)
        await rt.activate("k")
        for i in range(200):
            assert (await rt.send_and_receive("k", sc.Job(seq=i), timeout=BOUND_S)).seq == i
        # concurrent callers each get their own reply
        replies = await asyncio.gather(
            *(rt.send_and_receive("k", sc.Job(seq=1000 + i), timeout=BOUND_S) for i in range(50))
        )
        assert [r.seq for r in replies] == [1000 + i for i in range(50)]
        # plain sends are not spun for, and their replies still reach the outbox
        await rt.send("k", sc.Job(seq=7))
        assert (await rt.receive("k", timeout=BOUND_S)).seq == 7


async def test_a_reply_slower_than_the_spin_still_arrives() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", slow_echo, tier="process", input_type=sc.Job, reply_spin_us=50)
        await rt.activate("k")
        for i in range(20):
            assert (await rt.send_and_receive("k", sc.Job(seq=i), timeout=BOUND_S)).seq == i
        telemetry = rt.get_telemetry("k")
        assert telemetry is not None
        assert telemetry.messages_sent == 20


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "100", True, None])
async def test_bad_reply_spin_refused(bad: Any) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        with pytest.raises(InvalidConfigurationError, match="reply_spin_us") as info:
            await rt.launch("k", sc.echo_sync, tier="process", reply_spin_us=bad)
        assert repr(bad) in str(info.value)
        assert "k" not in rt.kernel_ids


async def test_reply_spin_is_a_process_tier_option() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        with pytest.raises(InvalidConfigurationError, match="reply_spin_us"):
            await rt.launch("k", sc.echo_sync, tier="thread", reply_spin_us=10)
