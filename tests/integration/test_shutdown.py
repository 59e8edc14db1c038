"""Shutdown while producers, consumers and actors are blocked: no hang, nothing unaccounted.

Each scenario runs on plain asyncio (the reference) and on uvloop. Hangs are guarded by a
generous ``asyncio.wait_for`` (a hang fails the test; nothing here measures time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from pydotcompute import KernelContext, RingKernelRuntime, message
from pydotcompute.exceptions import KernelFailedError, KernelStateError, QueueClosedError
from pydotcompute.ring_kernels.kernel import RingKernel
from pydotcompute.ring_kernels.states import KernelState
from pydotcompute.testing import event_loop_kinds, loop_factory

GUARD = 60.0  # seconds before a blocked call counts as a hang


@message
class Job:
    n: int


def run_on(kind: str, coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(coro)


loops = pytest.mark.parametrize("loop_kind", event_loop_kinds())


async def echo(ctx: KernelContext) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


async def crash(ctx: KernelContext) -> None:
    await ctx.receive()
    raise RuntimeError("actor crashed")


async def settle(steps: int = 50) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)


def accounted(kernel: RingKernel) -> bool:
    """Every message the inbox accepted was taken by the actor or handed back as undelivered."""
    # arrivals as the kernel counts them: a message handed straight to an idle worker
    # never passes through the inbox's own counters
    received = kernel.messages_received()
    return received == kernel.telemetry.messages_processed + len(kernel.undelivered)


async def _everything_blocked() -> dict[str, Any]:
    rt = RingKernelRuntime()
    await rt.start()
    # an actor blocked sending into its full outbox, producers blocked on its full inbox
    busy = await rt.launch("busy", echo, queue_size=2, drain_timeout=0.05)
    # an actor parked in receive() with no timeout, consumers blocked on its empty outbox
    starved = await rt.launch("starved", echo)
    # deactivated with messages queued
    paused = await rt.launch("paused", echo)
    # failed, with a consumer that already saw the failure
    failed = await rt.launch("failed", crash)
    # launched but never activated, with messages queued
    launched = await rt.launch("launched", echo)
    for kid in ("busy", "starved", "paused", "failed"):
        await rt.activate(kid)

    producers = [asyncio.ensure_future(rt.send("busy", Job(n=i))) for i in range(12)]
    consumers = [asyncio.ensure_future(rt.receive("starved")) for _ in range(3)]
    await rt.deactivate("paused")
    for i in range(3):
        await rt.send("paused", Job(n=i))
        await rt.send("launched", Job(n=i))
    await rt.send("failed", Job(n=0))
    await settle()
    assert failed.state is KernelState.FAILED
    assert sum(p.done() for p in producers) < len(producers)  # some are really blocked
    assert not any(c.done() for c in consumers)

    report = await asyncio.wait_for(rt.shutdown(timeout=0.5), GUARD)
    produced = await asyncio.wait_for(asyncio.gather(*producers, return_exceptions=True), GUARD)
    consumed = await asyncio.wait_for(asyncio.gather(*consumers, return_exceptions=True), GUARD)
    return {
        "rt": rt,
        "report": report,
        "kernels": {k.kernel_id: k for k in (busy, starved, paused, failed, launched)},
        "produced": produced,
        "consumed": consumed,
    }


@loops
def test_shutdown_while_producers_consumers_and_actors_are_blocked(
    loop_kind: str,
) -> None:
    out = run_on(loop_kind, _everything_blocked())
    kernels: dict[str, RingKernel] = out["kernels"]
    rt: RingKernelRuntime = out["rt"]
    assert not rt.is_active
    for kid, k in kernels.items():
        assert k.state is KernelState.TERMINATED, kid
        assert k._task is None or k._task.done(), kid
        assert accounted(k), kid

    # producers: either their message got in, or they were told the kernel stopped
    for res in out["produced"]:
        assert res is True or (
            isinstance(res, KernelStateError) and "cannot send to kernel 'busy'" in str(res)
        ), res
    # consumers: woken with a clear error once the outbox was closed and empty
    for res in out["consumed"]:
        assert isinstance(res, KernelStateError), res
        assert "cannot receive from kernel 'starved': it is TERMINATED" in str(res)

    # a deactivated kernel drains gracefully: everything processed, nothing lost
    paused = kernels["paused"]
    assert paused.undelivered == []
    assert [m.n for m in paused.outbox.drain()] == [0, 1, 2]  # type: ignore[union-attr]
    # never activated: handed back and counted
    assert [m.n for m in kernels["launched"].undelivered] == [0, 1, 2]
    # the busy kernel could not drain within its grace period: the rest is counted
    busy = kernels["busy"]
    accepted = sum(res is True for res in out["produced"])
    assert busy.inbox.statistics().total_enqueued == accepted  # type: ignore[union-attr]
    expected = {kid: len(k.undelivered) for kid, k in kernels.items() if k.undelivered}
    assert out["report"] == expected
    assert out["report"]["launched"] == 3
    # the reply the busy actor was blocked sending when it was cancelled stays readable,
    # beyond the outbox's bound of 2
    assert busy.outbox.statistics().total_dropped == 0  # type: ignore[union-attr]
    assert len(busy.outbox) == 3  # type: ignore[arg-type]
    for kid, k in kernels.items():
        lost_replies = k.outbox.statistics().total_dropped  # type: ignore[union-attr]
        assert k.telemetry.messages_dropped == len(k.undelivered) + lost_replies, kid


async def _pending_requests_at_exit() -> list[Any]:
    async def mute(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()  # never answers

    calls: list[asyncio.Future[Any]] = []
    async with RingKernelRuntime() as rt:
        await rt.launch("mute", mute)
        await rt.activate("mute")
        calls = [asyncio.ensure_future(rt.send_and_receive("mute", Job(n=i))) for i in range(5)]
        await settle()
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), GUARD)


@loops
def test_pending_send_and_receive_callers_learn_of_the_shutdown(
    loop_kind: str,
) -> None:
    results = run_on(loop_kind, _pending_requests_at_exit())
    assert len(results) == 5
    for res in results:
        assert isinstance(res, KernelStateError), res
        assert "cannot send to kernel 'mute': it is TERMINATED; it was terminated" in str(res)


async def _hammered() -> dict[str, Any]:
    rt = RingKernelRuntime()
    await rt.start()
    kernel = await rt.launch("sink", echo, queue_size=8, drain_timeout=5.0)
    await rt.activate("sink")
    sent = [0] * 4
    received = 0

    async def producer(i: int) -> BaseException:
        while True:
            try:
                await rt.send("sink", Job(n=i))
            except KernelStateError as exc:
                return exc
            sent[i] += 1

    async def consumer() -> BaseException:
        nonlocal received
        while True:
            try:
                await rt.receive("sink")
            except KernelStateError as exc:
                return exc
            received += 1

    tasks = [asyncio.ensure_future(producer(i)) for i in range(4)]
    drain = asyncio.ensure_future(consumer())
    while sum(sent) < 500:
        await asyncio.sleep(0)
    report = await asyncio.wait_for(rt.shutdown(timeout=5.0), GUARD)
    endings = await asyncio.wait_for(asyncio.gather(*tasks, drain), GUARD)
    return {
        "kernel": kernel,
        "sent": sum(sent),
        "received": received,
        "report": report,
        "endings": endings,
    }


@loops
def test_shutdown_under_load_loses_nothing(
    loop_kind: str,
) -> None:
    out = run_on(loop_kind, _hammered())
    kernel: RingKernel = out["kernel"]
    assert kernel.state is KernelState.TERMINATED
    assert all(isinstance(e, KernelStateError) for e in out["endings"])
    # graceful drain: every accepted message was processed and its reply received
    assert out["report"] == {}
    assert kernel.undelivered == []
    assert kernel.telemetry.messages_processed == out["sent"]
    assert out["received"] == out["sent"]
    assert accounted(kernel)


async def _failed_then_shutdown() -> dict[str, Any]:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch("bad", crash)
        await rt.activate("bad")
        waiting = asyncio.ensure_future(rt.receive("bad"))
        await rt.send("bad", Job(n=1))
        first = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), GUARD)
        for i in range(3):
            try:
                await rt.send("bad", Job(n=i))
            except KernelFailedError:
                pass
    return {"kernel": kernel, "first": first[0], "summary": rt.get_summary()}


@loops
def test_a_failed_kernel_shuts_down_cleanly(
    loop_kind: str,
) -> None:
    out = run_on(loop_kind, _failed_then_shutdown())
    assert isinstance(out["first"], KernelFailedError)
    assert "the actor raised RuntimeError: actor crashed" in str(out["first"])
    assert out["kernel"].state is KernelState.TERMINATED
    assert out["summary"]["failures"] == [("bad", "RuntimeError('actor crashed')")]
    assert accounted(out["kernel"])


def slow_worker(ctx: Any) -> None:
    """A thread-tier actor that takes half a second per message."""
    while not ctx.should_terminate:
        try:
            job = ctx.receive(timeout=0.05)
        except QueueClosedError:
            break
        if job is not None:
            time.sleep(0.5)
            ctx.send(job)


async def _thread_tier_cut_off() -> dict[str, Any]:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch("slow", slow_worker, tier="thread", bridge_queue_size=1)
        await rt.activate("slow")
        for i in range(6):
            await rt.send("slow", Job(n=i))
        # the worker handles 0, 1 waits on the one-slot bridge, the pump holds 2
        while kernel.telemetry.messages_processed < 3:
            await asyncio.sleep(0.005)
        left = await asyncio.wait_for(rt.terminate("slow", timeout=0.05), GUARD)
        worker = kernel.worker  # type: ignore[attr-defined]
        await asyncio.to_thread(worker.join, GUARD)  # the thread ends after message 0
    return {"kernel": kernel, "left": left}


@contextlib.contextmanager
def _warnings_of(name: str) -> Iterator[list[logging.LogRecord]]:
    """Collect the WARNING records of logger ``name`` emitted inside the block."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@loops
def test_a_thread_tier_kernel_cut_off_by_its_grace_period_accounts_for_everything(
    loop_kind: str,
) -> None:
    out = run_on(loop_kind, _thread_tier_cut_off())
    kernel: RingKernel = out["kernel"]
    # 0 was being handled in the thread (it finishes: a thread cannot be interrupted); the
    # one on the bridge, the one the pump held and the queued ones are handed back
    assert sorted(m.n for m in out["left"]) == [1, 2, 3, 4, 5]
    assert kernel.undelivered == out["left"]
    assert kernel.telemetry.messages_processed == 1
    # the five handed back, and the reply to 0, which came after terminate gave up
    assert kernel.telemetry.messages_dropped == 6
    assert accounted(kernel)


def very_slow_worker(ctx: Any) -> None:
    """A thread-tier actor that answers its one message after a second."""
    job = ctx.receive()
    time.sleep(1.0)
    ctx.send(job)


async def _thread_tier_late_reply() -> dict[str, Any]:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch("late", very_slow_worker, tier="thread")
        await rt.activate("late")
        await rt.send("late", Job(n=0))
        while kernel.telemetry.messages_processed < 1:
            await asyncio.sleep(0.005)
        # terminate gives up on the thread (and stops collecting) long before it answers
        left = await asyncio.wait_for(rt.terminate("late", timeout=0.05), GUARD)
        worker = kernel.worker  # type: ignore[attr-defined]
        with _warnings_of("pydotcompute") as seen:
            await asyncio.to_thread(worker.join, GUARD)
    late = [r.getMessage() for r in seen if "after terminate" in r.getMessage()]
    return {"kernel": kernel, "left": left, "late": late}


@loops
def test_a_reply_a_thread_sends_after_terminate_gave_up_is_counted_as_dropped(
    loop_kind: str,
) -> None:
    out = run_on(loop_kind, _thread_tier_late_reply())
    kernel: RingKernel = out["kernel"]
    assert out["left"] == []  # the thread had taken the message and finishes it
    assert kernel.telemetry.messages_processed == 1
    assert kernel.telemetry.messages_dropped == 1  # its reply, which had nowhere to go
    assert out["late"] == [
        "kernel 'late': 1 reply sent after terminate stopped collecting; dropped"
    ]


# -- Ctrl-C during an explicit shutdown ------------------------------------------------------


async def slow(ctx: KernelContext) -> None:
    while not ctx.should_terminate:
        await ctx.receive()
        await asyncio.sleep(0.5)


async def _shutdown_interrupted(figures: dict[str, Any]) -> None:
    rt = RingKernelRuntime()
    figures["rt"] = rt
    await rt.start()
    kernel = await rt.launch("slow", slow, drain_timeout=30.0)
    figures["kernel"] = kernel
    await rt.activate("slow")
    for i in range(20):  # 10 s of work: the shutdown would drain for 10 s
        await rt.send("slow", Job(n=i))
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(0.3, signal.pthread_kill, args=(main, signal.SIGINT))
    timer.start()
    figures["handler_during"] = None

    async def look() -> None:
        await asyncio.sleep(0.1)
        figures["handler_during"] = signal.getsignal(signal.SIGINT)

    looking = asyncio.ensure_future(look())
    started = time.monotonic()
    try:
        figures["report"] = await rt.shutdown()
    finally:
        figures["took"] = time.monotonic() - started
        await looking
        timer.join()
    await asyncio.sleep(0)  # the held Ctrl-C, passed on, cancelled this task: raised here
    figures["after"] = "went on"


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
@loops
def test_ctrl_c_during_a_shutdown_stops_every_kernel_then_comes_through(loop_kind: str) -> None:
    """A Ctrl-C while ``shutdown()`` drains a slow kernel (``drain_timeout=30``) does not
    break the shutdown off: it cuts the drain short, every message is handed back or
    processed and counted, and then the interrupt reaches ``asyncio.Runner`` as usual."""
    figures: dict[str, Any] = {}
    with (
        pytest.raises(KeyboardInterrupt),
        asyncio.Runner(loop_factory=loop_factory(loop_kind)) as runner,
    ):
        runner.run(_shutdown_interrupted(figures))
    assert "after" not in figures
    assert figures["handler_during"] is not signal.default_int_handler  # held by shutdown
    assert figures["took"] < 20.0, figures["took"]  # cut short, not the 30 s drain
    rt: RingKernelRuntime = figures["rt"]
    kernel: RingKernel = figures["kernel"]
    report = rt.shutdown_report
    assert report is not None
    assert report.interrupted
    assert kernel.state is KernelState.TERMINATED
    assert accounted(kernel)
    assert report == {"slow": len(kernel.undelivered)}, report
    assert len(kernel.undelivered) >= 15  # about one message a half second was handled
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@loops
def test_a_sigint_handler_of_the_programs_own_is_left_alone(loop_kind: str) -> None:
    seen: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        seen.append(signum)

    async def run() -> Any:
        async with RingKernelRuntime() as rt:
            await rt.launch("slow", slow)
            await rt.activate("slow")
            await rt.send("slow", Job(n=0))
            during = asyncio.ensure_future(asyncio.sleep(0.05))
            stopping = asyncio.ensure_future(rt.shutdown())
            await during
            handler = signal.getsignal(signal.SIGINT)
            await stopping
            return handler

    previous = signal.signal(signal.SIGINT, mine)
    try:
        assert run_on(loop_kind, run()) is mine
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)
