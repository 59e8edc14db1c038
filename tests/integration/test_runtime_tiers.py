"""One behavioural suite through ``RingKernelRuntime`` on every CPU execution tier.

The same messages, ordering, priority, shutdown and failure expectations hold whether the
actor is an asyncio task (tier 1), a thread (tier 2) or a child process (tier 3).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import KernelState

from .tier_actors import Done, Job, echo_async, echo_sync, forward_async, forward_sync


def _process_tier_available() -> bool:
    return importlib.util.find_spec("pydotcompute.ring_kernels.tiers.process") is not None


TIERS = [
    pytest.param(("asyncio", echo_async), id="asyncio"),
    pytest.param(("thread", echo_sync), id="thread"),
    pytest.param(
        ("process", echo_sync),
        id="process",
        marks=pytest.mark.skipif(
            not _process_tier_available(), reason="the process tier is missing"
        ),
    ),
]


@pytest.fixture(params=TIERS)
def tier(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param  # type: ignore[no-any-return]


async def _launch(rt: RingKernelRuntime, tier: tuple[str, Any], kid: str = "k") -> None:
    name, fn = tier
    await rt.launch(kid, fn, input_type=Job, output_type=Done, tier=name, queue_size=1024)
    await rt.activate(kid)


async def test_replies_arrive_in_order(tier: tuple[str, Any]) -> None:
    async with RingKernelRuntime() as rt:
        await _launch(rt, tier)
        for i in range(300):
            await rt.send("k", Job(seq=i))
        got = [(await rt.receive("k", timeout=10)).seq for _ in range(300)]
        assert got == list(range(300))


async def test_priority_bands_are_served_first(tier: tuple[str, Any]) -> None:
    async with RingKernelRuntime() as rt:
        await _launch(rt, tier)
        await rt.deactivate("k")  # everything waits in the banded inbox
        for i in range(10):
            await rt.send("k", Job(seq=i, priority=10))  # LOW
        for i in range(10, 20):
            await rt.send("k", Job(seq=i, priority=250))  # SYSTEM
        await rt.reactivate("k")
        got = [(await rt.receive("k", timeout=10)).seq for _ in range(20)]
        assert got == list(range(10, 20)) + list(range(10))


async def test_graceful_terminate_loses_nothing(tier: tuple[str, Any]) -> None:
    async with RingKernelRuntime() as rt:
        await _launch(rt, tier)
        for i in range(200):
            await rt.send("k", Job(seq=i))
        left = await rt.terminate("k", timeout=10)
        assert left == []
        got = [(await rt.receive("k")).seq for _ in range(200)]
        assert got == list(range(200))
        with pytest.raises(KernelStateError, match="terminated and its outbox is drained"):
            await rt.receive("k")
        assert rt.get_kernel_state("k") is KernelState.TERMINATED


async def test_bad_input_gets_clear_errors(tier: tuple[str, Any]) -> None:
    async with RingKernelRuntime() as rt:
        await _launch(rt, tier)
        with pytest.raises(TypeValidationError, match="kernel 'k' expects Job, got dict"):
            await rt.send("k", {"seq": 1})
        with pytest.raises(KernelNotFoundError, match=r"unknown kernel id 'nope'.*'k'"):
            await rt.send("nope", Job(seq=1))
        await rt.terminate("k")
        with pytest.raises(KernelStateError, match="cannot send to kernel 'k'"):
            await rt.send("k", Job(seq=1))


async def test_actor_failure_is_reported(tier: tuple[str, Any]) -> None:
    async with RingKernelRuntime() as rt:
        await _launch(rt, tier)
        await rt.send("k", Job(seq=1))
        assert (await rt.receive("k", timeout=10)).seq == 1
        await rt.send("k", Job(seq=2, payload="boom"))
        with pytest.raises(KernelFailedError, match="boom requested"):
            await rt.receive("k", timeout=10)
        assert rt.get_kernel_state("k") is KernelState.FAILED
        with pytest.raises(KernelFailedError):
            await rt.send("k", Job(seq=3))


async def test_pipeline_between_tiers(tier: tuple[str, Any]) -> None:
    async def relay(ctx: Any) -> None:
        while not ctx.should_terminate:
            done = await ctx.receive()
            await ctx.send(done)

    async with RingKernelRuntime() as rt:
        await _launch(rt, tier, "first")
        await rt.launch("second", relay, input_type=Done, output_type=Done)
        await rt.activate("second")
        rt.connect("first", "second")
        for i in range(50):
            await rt.send("first", Job(seq=i))
        got = [(await rt.receive("second", timeout=10)).seq for _ in range(50)]
        assert got == list(range(50))


async def test_send_and_receive_is_correlated(tier: tuple[str, Any]) -> None:
    """Replies without a correlation_id are stamped with the request being handled."""
    async with RingKernelRuntime() as rt:
        await _launch(rt, tier)
        for i in range(20):
            reply = await rt.send_and_receive("k", Job(seq=i), timeout=10)
            assert reply.seq == i
        job = Job(seq=99)
        await rt.send("k", job)
        reply = await rt.receive("k", timeout=10)
        assert reply.correlation_id == job.message_id


async def test_wait_until_idle_sees_a_threaded_actor_finish() -> None:
    from pydotcompute.testing import wait_until_idle

    async with RingKernelRuntime() as rt:
        await _launch(rt, ("thread", echo_sync))
        for i in range(100):
            await rt.send("k", Job(seq=i))
        await wait_until_idle(rt, timeout=10)
        assert len(rt.get_kernel("k").outbox) == 100  # type: ignore[arg-type]
        assert rt.get_kernel("k").is_idle


# --- untyped actors sending plain values ---------------------------------------------------


async def chatty_async(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = await ctx.receive()
        await ctx.send({"note": "progress", "seq": job.seq})  # an untyped side output
        await ctx.send(Done(seq=job.seq, tier="asyncio"))


def chatty_sync(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is not None:
            ctx.send({"note": "progress", "seq": job.seq})
            ctx.send(Done(seq=job.seq, tier="worker"))


@pytest.mark.parametrize(
    ("name", "fn"), [("asyncio", chatty_async), ("thread", chatty_sync)], ids=["asyncio", "thread"]
)
async def test_plain_side_outputs_of_an_untyped_actor_reach_the_outbox(name: str, fn: Any) -> None:
    """A plain value cannot be correlated: it goes to the outbox, and a correlated caller
    still gets the message reply that follows it."""
    async with RingKernelRuntime() as rt:
        await rt.launch("k", fn, tier=name)
        await rt.activate("k")
        for i in range(3):
            reply = await rt.send_and_receive("k", Job(seq=i), timeout=10)
            assert isinstance(reply, Done)
            assert reply.seq == i
        notes = [await rt.receive("k", timeout=10) for _ in range(3)]
        assert notes == [{"note": "progress", "seq": i} for i in range(3)]
        assert rt.get_kernel("k").state is KernelState.ACTIVE


@pytest.mark.parametrize(
    ("name", "fn"),
    [("asyncio", forward_async), ("thread", forward_sync), ("process", forward_sync)],
    ids=["asyncio", "thread", "process"],
)
async def test_a_message_sent_on_as_its_own_reply_is_freed(name: str, fn: Any) -> None:
    """An actor that sends on the message it handles answers it with itself: the message
    is correlated to its own id, holds no reference to itself, and is freed."""
    if name == "process" and not _process_tier_available():
        pytest.skip("the process tier is missing")
    async with RingKernelRuntime() as rt:
        await rt.launch("k", fn, input_type=Job, output_type=Job, tier=name)
        await rt.activate("k")
        first = Job(seq=1)
        echoed = await rt.send_and_receive("k", first, timeout=10)  # matched by its own id
        assert echoed.correlation_id == echoed.message_id == first.message_id
        del first, echoed
        await rt.send("k", Job(seq=2))
        got = await rt.receive("k", timeout=10)
        await rt.send("k", Job(seq=3))  # the actor lets go of the second as it takes this
        assert (await rt.receive("k", timeout=10)).seq == 3
        # nothing read its correlation yet (reading resolves it): it must not be itself
        assert sys.getrefcount(got) == 2  # the name and the call's argument
        assert got.correlation_id == got.message_id


async def replies_with_an_int(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.receive()
        await ctx.send(42)


def replies_with_an_int_sync(ctx: Any) -> None:
    while not ctx.should_terminate:
        if ctx.receive(timeout=0.05) is not None:
            ctx.send(42)


@pytest.mark.parametrize(
    ("name", "fn"),
    [("asyncio", replies_with_an_int), ("thread", replies_with_an_int_sync)],
    ids=["asyncio", "thread"],
)
async def test_a_serializing_kernel_refuses_plain_values_with_a_clear_error(
    name: str, fn: Any
) -> None:
    async with RingKernelRuntime() as rt:
        k = await rt.launch("wire", fn, tier=name, serialize=True)
        await rt.activate("wire")
        with pytest.raises(TypeValidationError, match=r"kernel 'wire'.*serialize=True.*got str"):
            await rt.send("wire", "hello")
        # the int reply cannot be serialized: the kernel fails and the caller is told why
        with pytest.raises(KernelFailedError, match="the actor raised TypeValidationError"):
            await rt.send_and_receive("wire", Job(seq=1), timeout=10)
        assert isinstance(k.error, TypeValidationError)
        assert "kernel 'wire'" in str(k.error)
        assert "got int" in str(k.error)


def slow_int_replier(ctx: Any) -> None:
    while not ctx.should_terminate:
        if ctx.receive(timeout=0.05) is not None:
            time.sleep(0.1)  # still handling it when terminate starts
            ctx.send(42)


async def test_a_reply_that_fails_while_terminating_is_counted_not_lost() -> None:
    async with RingKernelRuntime() as rt:
        k = await rt.launch("wire", slow_int_replier, tier="thread", serialize=True)
        await rt.activate("wire")
        await rt.send("wire", Job(seq=1))
        while k.telemetry.messages_processed < 1:  # handed to the worker
            await asyncio.sleep(0.005)
        assert await rt.terminate("wire", timeout=10) == []
        assert k.state is KernelState.TERMINATED
        assert isinstance(k.error, TypeValidationError)
        assert k.outbox.statistics().total_dropped == 1  # type: ignore[union-attr]
        assert k.telemetry.messages_dropped == 1


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not _process_tier_available(), reason="the process tier is missing")
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count fds")
async def test_the_loop_watches_process_replies_and_lets_go_of_what_it_watched() -> None:
    before = _open_fds()
    async with RingKernelRuntime() as rt:
        k = await rt.launch("k", echo_sync, input_type=Job, output_type=Done, tier="process")
        await rt.activate("k")
        assert k._unwatch is not None  # the loop itself watches the doorbell
        assert not k.worker.statistics()["wakers"]["readable"]  # no waker thread hop per reply
        for i in range(50):
            await rt.send("k", Job(seq=i))
            assert (await rt.receive("k", timeout=10)).seq == i
        await rt.terminate("k")
        assert k._unwatch is None
    assert _open_fds() <= before  # the duplicated descriptors are closed again


@pytest.mark.skipif(not _process_tier_available(), reason="the process tier is missing")
async def test_a_process_actor_that_dies_fails_its_kernel() -> None:
    async with RingKernelRuntime() as rt:
        await _launch(rt, ("process", echo_sync))
        await rt.send("k", Job(seq=1))
        assert (await rt.receive("k", timeout=10)).seq == 1
        await rt.send("k", Job(seq=2, payload="exit"))
        with pytest.raises(KernelFailedError, match="exit"):
            await rt.receive("k", timeout=10)
        assert rt.get_kernel_state("k") is KernelState.FAILED
        assert rt.get_kernel("k")._unwatch is None


@pytest.mark.skipif(not _process_tier_available(), reason="the process tier is missing")
async def test_the_hosted_process_tier_spins_longer_by_default_and_takes_spin_us() -> None:
    from pydotcompute.ring_kernels.extend import ProcessHostedKernel

    async with RingKernelRuntime() as rt:
        k = await rt.launch("a", echo_sync, input_type=Job, output_type=Done, tier="process")
        assert k.worker.config.spin_us == ProcessHostedKernel.HOSTED_SPIN_US
        k = await rt.launch("b", echo_sync, tier="process", spin_us=20)
        assert k.worker.config.spin_us == 20
        await rt.activate("b")
        await rt.send("b", Job(seq=7))
        assert (await rt.receive("b", timeout=10)).seq == 7
        with pytest.raises(InvalidConfigurationError, match="spin_us of kernel 'c' must be >= 0"):
            await rt.launch("c", echo_sync, tier="process", spin_us=-1)


@pytest.mark.parametrize(
    "name",
    [
        "thread",
        pytest.param(
            "process",
            marks=pytest.mark.skipif(
                not _process_tier_available(), reason="the process tier (cython_kernel) is missing"
            ),
        ),
    ],
)
async def test_a_reply_refused_by_a_full_block_kernel_says_what_applies(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Replies still on their way when a kernel stops are delivered without waiting; the
    warning for one that a full ``block`` kernel downstream refuses gives advice that
    policy leaves (not "choose backpressure='block'")."""
    async with RingKernelRuntime() as rt:
        await rt.launch("a", echo_sync, input_type=Job, output_type=Done, tier=name)
        sink = await rt.launch("b", echo_async, input_type=Done, queue_size=1)
        rt.connect("a", "b")  # b is never activated: the first reply fills it
        await rt.activate("a")
        for i in range(3):
            await rt.send("a", Job(seq=i))
        deadline = time.monotonic() + 10
        while sink.inbox is None or len(sink.inbox) < 1:
            assert time.monotonic() < deadline, "the first reply never reached b"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the other two wait to be forwarded
        with caplog.at_level("WARNING", logger="pydotcompute"):
            await rt.terminate("a", timeout=0.5)
        refused = [r.getMessage() for r in caplog.records if "forwarded to 'b'" in r.getMessage()]
        assert refused, caplog.text
        assert refused[0] == (
            "kernel 'a': a reply forwarded to 'b' was dropped: queue of kernel 'b' is full "
            "(1/1 messages); its backpressure is 'block', but this hand-over cannot wait for "
            "room (send_nowait, or a reply delivered while its sender stops): receive faster, "
            "raise queue_size, or choose backpressure='drop_oldest' to make room by dropping "
            "the oldest message"
        )
        assert "choose backpressure='block'" not in caplog.text
