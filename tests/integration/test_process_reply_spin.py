"""``reply_spin_us``: the event loop polls the reply ring while a caller waits.

Real child processes. Timing is never asserted: only that every reply reaches its own
caller, whether the spin catches it or the loop parks first, that bad values (and values
above the cap) are refused at launch naming the option and the value, and that a request
against a silent actor ends by its timeout (a hang check with a generous margin).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import InvalidConfigurationError, KernelFailedError
from pydotcompute.ring_kernels import CythonKernelConfig, KernelState
from pydotcompute.ring_kernels.tiers.process.config import MAX_SPIN_US
from pydotcompute.ring_kernels.tiers.process.worker import ProcessWorker
from tests import tier_scenarios as sc

BOUND_S = sc.BOUND_S


def slow_echo(ctx: Any) -> None:
    """Echoes each job after a pause far longer than any spin."""
    while True:
        job = ctx.receive()
        time.sleep(0.002)
        ctx.send(job)


def twice_echo(ctx: Any) -> None:
    """Answers each job twice: a ``Done`` with its seq, then one with its seq negated."""
    while True:
        job = ctx.receive()
        ctx.send(sc.Done(seq=job.seq))
        ctx.send(sc.Done(seq=-job.seq))


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


# --- the inline request: a lone caller's request handed over and its reply polled at once ---


async def test_inline_requests_are_accounted_as_any_other() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", sc.echo_sync, tier="process", input_type=sc.Job, reply_spin_us=5_000)
        await rt.activate("k")
        for i in range(300):
            assert (await rt.send_and_receive("k", sc.Job(seq=i), timeout=BOUND_S)).seq == i
            assert (await rt.send_and_receive("k", sc.Job(seq=i))).seq == i  # no timeout
        telemetry = rt.get_telemetry("k")
        assert telemetry is not None
        assert telemetry.messages_received == 600
        assert telemetry.messages_processed == 600
        assert telemetry.messages_sent == 600
        kernel = rt.get_kernel("k")
        assert kernel.pending_requests == 0  # nothing left registered
        assert rt.receive_nowait("k") is None  # no reply strayed into the outbox


async def test_a_reply_polled_ahead_of_the_callers_goes_on_in_order() -> None:
    """The reply to a plain send, ahead of the request's own, is what the inline poll
    catches first: it goes to the outbox, and the caller still gets its own reply."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", sc.echo_sync, tier="process", input_type=sc.Job, reply_spin_us=5_000)
        await rt.activate("k")
        for i in range(0, 100, 2):
            await rt.send("k", sc.Job(seq=i))
            assert (await rt.send_and_receive("k", sc.Job(seq=i + 1), timeout=BOUND_S)).seq == i + 1
            assert (await rt.receive("k", timeout=BOUND_S)).seq == i
        assert rt.receive_nowait("k") is None


async def test_a_second_reply_to_an_inline_request_is_dropped_and_counted() -> None:
    """The caller gets the first reply correlated with its request; the second, written
    while the loop polled with the reply doorbell off, answers a request nobody waits for
    any more: dropped and counted once, never queued in the outbox."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", twice_echo, tier="process", input_type=sc.Job, reply_spin_us=5_000)
        await rt.activate("k")
        for i in range(1, 101):
            assert (await rt.send_and_receive("k", sc.Job(seq=i), timeout=BOUND_S)).seq == i
        telemetry = rt.get_telemetry("k")
        assert telemetry is not None
        while telemetry.messages_dropped < 100:  # the last one may still be on its way
            await asyncio.sleep(0.01)
        assert rt.receive_nowait("k") is None
        assert telemetry.drop_reasons() == {"reply_lost": 100}
        assert telemetry.messages_sent == 200


async def test_an_actor_failing_on_an_inline_request_fails_its_caller() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", sc.echo_sync, tier="process", input_type=sc.Job, reply_spin_us=5_000)
        await rt.activate("k")
        assert (await rt.send_and_receive("k", sc.Job(seq=1), timeout=BOUND_S)).seq == 1
        with pytest.raises(KernelFailedError, match="boom at 2"):
            await rt.send_and_receive("k", sc.Job(seq=2, payload="boom"), timeout=BOUND_S)
        assert rt.get_kernel_state("k") is KernelState.FAILED
        assert rt.get_kernel("k").pending_requests == 0


async def test_an_inline_request_that_times_out_is_abandoned() -> None:
    """A reply slower than both the spin and the caller's timeout: the caller gets the
    runtime's timeout error, and the late reply is counted as lost, not left in the outbox."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", slow_echo, tier="process", input_type=sc.Job, reply_spin_us=50)
        await rt.activate("k")
        with pytest.raises(TimeoutError, match="no reply from kernel 'k'"):
            await rt.send_and_receive("k", sc.Job(seq=1), timeout=0.0005)
        assert (await rt.send_and_receive("k", sc.Job(seq=2), timeout=BOUND_S)).seq == 2
        assert rt.receive_nowait("k") is None
        telemetry = rt.get_telemetry("k")
        assert telemetry is not None
        assert telemetry.messages_dropped == 1


# --- caps: no spin past MAX_SPIN_US, and none past the caller's timeout ---------------------


def silent(ctx: Any) -> None:
    """Takes every job and never answers (until the inbox closes)."""
    while True:
        ctx.receive()


def _cap_text(option: str) -> str:
    return rf"{option} of kernel 'k' must be >= 0 and at most {MAX_SPIN_US:g} microseconds"


@pytest.mark.parametrize("option", ["spin_us", "reply_spin_us"])
@pytest.mark.parametrize("bad", [MAX_SPIN_US + 1, 20e6, 1e9, 10**12])
async def test_spin_options_above_the_cap_refused(option: str, bad: float) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        with pytest.raises(InvalidConfigurationError, match=_cap_text(option)) as info:
            await rt.launch("k", sc.echo_sync, tier="process", **{option: bad})
        assert repr(bad) in str(info.value)
        assert "MAX_SPIN_US" in str(info.value)  # where the cap comes from
        assert "k" not in rt.kernel_ids


def test_spin_us_of_a_direct_kernel_above_the_cap_refused() -> None:
    with pytest.raises(InvalidConfigurationError, match=_cap_text("spin_us")):
        CythonKernelConfig("k", spin_us=1e9)
    assert CythonKernelConfig("k", spin_us=MAX_SPIN_US).spin_us == MAX_SPIN_US


async def test_spin_options_at_the_cap_are_taken() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch(
            "k",
            sc.echo_sync,
            tier="process",
            input_type=sc.Job,
            spin_us=MAX_SPIN_US,
            reply_spin_us=MAX_SPIN_US,
        )
        await rt.activate("k")
        for i in range(20):
            assert (await rt.send_and_receive("k", sc.Job(seq=i), timeout=BOUND_S)).seq == i


@pytest.mark.parametrize("typed", [True, False], ids=["inline", "general"])
async def test_a_reply_spin_at_the_cap_ends_by_the_callers_timeout(
    typed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A silent actor, the loop allowed to spin the cap per request, and a timeout far
    below it: every request fails by its timeout, and no spin was given more than what was
    left of it. With an ``input_type`` a lone request is made inline; without one it takes
    the bridge's path, which spins in the hand-over."""
    budgets: list[float] = []
    reply_within = ProcessWorker.reply_within

    def spy(self: ProcessWorker, budget_s: float) -> Any:
        budgets.append(budget_s)
        return reply_within(self, budget_s)

    monkeypatch.setattr(ProcessWorker, "reply_within", spy)
    timeout = 0.002
    typing: dict[str, Any] = {"input_type": sc.Job} if typed else {}
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", silent, tier="process", reply_spin_us=MAX_SPIN_US, **typing)
        await rt.activate("k")
        for i in range(5):
            start = time.monotonic()
            with pytest.raises(TimeoutError, match="no reply from kernel 'k'"):
                await rt.send_and_receive("k", sc.Job(seq=i), timeout=timeout)
            assert time.monotonic() - start < timeout + 1.0  # a hang check, not a timing
        assert budgets, "the loop never spun for a reply"
        assert max(budgets) <= timeout, budgets
        budgets.clear()
        await rt.send("k", sc.Job(seq=99))  # plain sends are never spun for
        assert budgets == []
