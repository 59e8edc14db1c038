"""Scenarios of the tier contract, shared by every tier's test run.

Each ``scenario_*`` coroutine takes a :class:`TierCase` (the tier's name and the actors it
runs) and checks one promise the runtime makes the same on every tier: accounting
(every accepted message ends exactly once), supervision, correlation, backpressure and
the edges (cancellation, not-active kernels, wrong actor kinds). The CPU tiers run them in
``tests/integration/test_tier_contract.py``; the GPU tier (under the CUDA simulator) and
the Ray tier can import this module from their own test processes.

Actors are module-level so that a child process can import them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    MessageSerializationError,
    PyDotComputeError,
    QueueClosedError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import KernelState

BOUND_S = 30.0  # no scenario waits longer than this for anything


@message
class Job:
    seq: int
    payload: str = ""


@message
class Done:
    seq: int


# --- actors ---------------------------------------------------------------------------------


def _payload(job: Any) -> str:
    return getattr(job, "payload", "")  # a relay downstream receives Done, not Job


def _pause_of(job: Any) -> float:
    payload = _payload(job)
    if payload.startswith("sleep:"):
        return float(payload[6:])
    return 0.0


async def echo_async(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = await ctx.receive()
        if _payload(job) == "boom":
            raise ValueError(f"boom at {job.seq}")
        pause = _pause_of(job)
        if pause:
            await asyncio.sleep(pause)
        try:
            await ctx.send(Done(seq=job.seq))
        except QueueFullError:
            pass  # a reject-policy kernel downstream refused it (counted as dropped)


def echo_sync(ctx: Any) -> None:
    while not ctx.should_terminate:
        try:
            job = ctx.receive(timeout=0.05)
        except QueueClosedError:
            return
        if job is None:
            continue
        if _payload(job) == "boom":
            raise ValueError(f"boom at {job.seq}")
        pause = _pause_of(job)
        if pause:
            time.sleep(pause)
        ctx.send(Done(seq=job.seq))


def plain_def_actor(ctx: Any) -> None:
    """A plain function: right for the thread and process tiers, wrong for asyncio."""
    echo_sync(ctx)


@dataclass(frozen=True)
class TierCase:
    """One tier under test: its name and an echo actor of the kind it runs."""

    name: str
    echo: Callable[..., Any]
    wrong_kind: Callable[..., Any]  # an actor of the kind this tier refuses
    options: tuple[tuple[str, Any], ...] = ()
    #: The runtime the scenario drives (the Ray tests pass ``RayRingKernelRuntime``).
    make_runtime: Callable[[], Any] = RingKernelRuntime

    def opts(self, **more: Any) -> dict[str, Any]:
        out = dict(self.options)
        out.update(more)
        return out


#: Tiers that honour ``restart="on_failure"``; the others refuse it at launch.
RESTARTS = frozenset({"asyncio"})

ASYNCIO = TierCase("asyncio", echo_async, plain_def_actor)
THREAD = TierCase("thread", echo_sync, echo_async)
PROCESS = TierCase("process", echo_sync, echo_async)


# --- helpers --------------------------------------------------------------------------------


async def _launch(
    rt: RingKernelRuntime, case: TierCase, kid: str = "k", *, activate: bool = True, **opts: Any
) -> None:
    await rt.launch(
        kid, case.echo, input_type=Job, output_type=Done, tier=case.name, **case.opts(**opts)
    )
    if activate:
        await rt.activate(kid)


def _read_all(rt: RingKernelRuntime, kid: str) -> list[int]:
    """Every reply still readable from ``kid``'s outbox (after terminate: until drained)."""
    got: list[int] = []
    while True:
        try:
            reply = rt.receive_nowait(kid)
        except (KernelStateError, QueueClosedError):
            return got
        if reply is None:
            return got
        got.append(reply.seq)


async def _dropped(rt: Any, kid: str) -> int:
    """The kernel's ``messages_dropped``, fetched afresh where the runtime caches it (Ray)."""
    refresh = getattr(rt, "refresh_telemetry", None)
    if refresh is not None:
        return int((await refresh(kid)).messages_dropped)
    return int(rt.get_telemetry(kid).messages_dropped)


def _seqs(messages: list[Any]) -> list[int]:
    return [m.seq for m in messages]


def assert_exactly_once(
    accepted: list[int], read: list[int], undelivered: list[int], dropped: int
) -> None:
    """Every accepted message ends exactly once: read, handed back, or a counted drop.

    ``dropped`` is the kernels' ``messages_dropped`` total, which counts the handed-back
    (undelivered) ones too.
    """
    ends = read + undelivered
    assert len(ends) == len(set(ends)), f"reported twice: {sorted(ends)}"
    assert set(ends) <= set(accepted), f"never sent: {sorted(set(ends) - set(accepted))}"
    assert dropped >= len(undelivered), (dropped, len(undelivered))
    assert len(read) + dropped == len(accepted), (
        f"{len(accepted)} accepted, {len(read)} read, {len(undelivered)} undelivered, "
        f"{dropped} counted dropped: {len(accepted) - len(read) - dropped} unaccounted"
    )


# --- 1: terminate hands back or keeps readable everything it holds ---------------------------


async def scenario_terminate_with_unread_replies(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, queue_size=4)
        accepted: list[int] = []

        async def sender() -> None:
            for i in range(100):
                await rt.send("k", Job(seq=i))
                accepted.append(i)

        task = asyncio.create_task(sender())
        await asyncio.sleep(0.5)  # the sender blocks on the full bounds; nothing is read
        left = await rt.terminate("k", timeout=0.5)
        with contextlib.suppress(KernelStateError, KernelFailedError):
            await task
        read = _read_all(rt, "k")
        tel = rt.get_telemetry("k")
        assert_exactly_once(accepted, read, _seqs(left), tel.messages_dropped)


async def scenario_forward_into_full_kernel_at_terminate(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, "a", queue_size=4)
        await rt.launch("b", echo_async, input_type=Done, output_type=Done, queue_size=4)
        rt.connect("a", "b")
        accepted: list[int] = []

        async def sender() -> None:
            for i in range(20):
                await rt.send("a", Job(seq=i))
                accepted.append(i)

        task = asyncio.create_task(sender())
        await asyncio.sleep(0.5)  # b was never activated: a blocks forwarding into it
        report = await rt.shutdown(timeout=0.5)
        with contextlib.suppress(KernelStateError, KernelFailedError):
            await task
        del report
        left = rt.get_kernel("a").undelivered + rt.get_kernel("b").undelivered
        dropped = rt.get_telemetry("a").messages_dropped + rt.get_telemetry("b").messages_dropped
        assert_exactly_once(accepted, _read_all(rt, "b"), _seqs(left), dropped)


# --- 2: the message in the actor's hands when the grace period ends --------------------------


async def scenario_message_in_hand_at_grace_end(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case)
        for i in range(3):
            await rt.send("k", Job(seq=i, payload="sleep:0.5"))
        await asyncio.sleep(0.1)  # the actor holds message 0
        left = await rt.terminate("k", timeout=0.2)
        # a thread cannot be interrupted: it may finish message 0 late; its reply is
        # then either readable or counted, never both and never lost
        await asyncio.sleep(0.6)
        read = _read_all(rt, "k")
        assert_exactly_once([0, 1, 2], read, _seqs(left), rt.get_telemetry("k").messages_dropped)


# --- 3: forwarding into a reject-policy kernel ---------------------------------------------------


async def scenario_forward_into_reject_inbox(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, "a", queue_size=64)
        await rt.launch(
            "b", echo_async, input_type=Done, output_type=Done, queue_size=2, backpressure="reject"
        )
        rt.connect("a", "b")  # b is not active: its inbox fills after two
        for i in range(20):
            await rt.send("a", Job(seq=i))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until a has handled all 20
            if rt.get_telemetry("a").messages_dropped + len(rt.get_kernel("b").inbox) >= 20:  # type: ignore[arg-type]
                break
            await asyncio.sleep(0.02)
        assert rt.get_kernel_state("a") is KernelState.ACTIVE, rt.get_kernel("a").error
        await rt.activate("b")
        read = [(await rt.receive("b", timeout=10)).seq for _ in range(2)]
        await rt.shutdown(timeout=2)
        dropped = rt.get_telemetry("a").messages_dropped + rt.get_telemetry("b").messages_dropped
        left = rt.get_kernel("a").undelivered + rt.get_kernel("b").undelivered
        assert_exactly_once(list(range(20)), read + _read_all(rt, "b"), _seqs(left), dropped)


# --- 4: undelivered reported once after a failure ---------------------------------------------


async def scenario_failure_reports_each_message_once(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, activate=False, queue_size=200)
        await rt.send("k", Job(seq=0, payload="boom"))
        for i in range(1, 100):
            await rt.send("k", Job(seq=i))
        await rt.activate("k")
        deadline = time.monotonic() + 10
        while rt.get_kernel_state("k") is not KernelState.FAILED:
            assert time.monotonic() < deadline, "the kernel did not fail"
            await asyncio.sleep(0.02)
        left = await rt.terminate("k")
        kernel = rt.get_kernel("k")
        seqs = _seqs(kernel.undelivered)
        assert len(seqs) == len(set(seqs)), f"reported twice: {len(seqs)} for {len(set(seqs))}"
        assert _seqs(left) == [] or set(_seqs(left)) <= set(seqs)
        # the message the actor raised on comes back first, then those it never took
        assert seqs[:1] == [0], seqs[:3]
        read = _read_all(rt, "k")
        assert_exactly_once(list(range(100)), read, seqs, rt.get_telemetry("k").messages_dropped)


# --- 5: every drop reaches telemetry ------------------------------------------------------------


async def scenario_drop_oldest_counted(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, activate=False, queue_size=8, backpressure="drop_oldest")
        for i in range(100):
            await rt.send("k", Job(seq=i))
        assert await _dropped(rt, "k") == 92
        await rt.activate("k")
        read = [(await rt.receive("k", timeout=10)).seq for _ in range(8)]
        assert read == list(range(92, 100))
        assert await _dropped(rt, "k") == 92


async def scenario_leave_scope_mid_pipeline(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S):
        rt = case.make_runtime()
        accepted: list[int] = []
        async with rt:
            await _launch(rt, case, "a", queue_size=64)
            await rt.launch("b", echo_async, input_type=Done, output_type=Done, queue_size=64)
            await rt.activate("b")
            rt.connect("a", "b")
            read: list[int] = []
            for i in range(600):  # the scope is left with up to 150 in flight
                await rt.send("a", Job(seq=i))
                accepted.append(i)
                if i >= 150:
                    read.append((await rt.receive("b", timeout=10)).seq)
        left = rt.get_kernel("a").undelivered + rt.get_kernel("b").undelivered
        dropped = rt.get_telemetry("a").messages_dropped + rt.get_telemetry("b").messages_dropped
        assert_exactly_once(accepted, read + _read_all(rt, "b"), _seqs(left), dropped)


# --- 6: replies nobody waits for are dropped and counted ---------------------------------------


async def scenario_abandoned_replies_do_not_wedge(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        # room for every request, none for more than two replies
        await _launch(rt, case, input_queue_size=64, output_queue_size=2)
        for i in range(6):
            try:
                await rt.send_and_receive("k", Job(seq=i, payload="sleep:0.02"), timeout=0.005)
            except QueueTimeoutError:
                pass
        reply = await rt.send_and_receive("k", Job(seq=99), timeout=10)
        assert reply.seq == 99
        assert rt.receive_nowait("k") is None  # no stale reply left in the outbox
        assert await _dropped(rt, "k") == 6
        assert rt.get_kernel_state("k") is KernelState.ACTIVE


# --- 7: cancelling callers that loop on send_and_receive -----------------------------------------


async def scenario_cancel_send_and_receive_loops(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case)

        async def caller(base: int) -> None:
            i = 0
            while True:
                await rt.send_and_receive("k", Job(seq=base + i), timeout=5)
                i += 1

        for _ in range(20):
            tasks = [asyncio.create_task(caller(1000 * j)) for j in range(4)]
            group = asyncio.gather(*tasks)
            await asyncio.sleep(0.01)
            group.cancel()
            _, pending = await asyncio.wait(tasks, timeout=5)
            assert not pending, "a cancelled caller kept running"
            with contextlib.suppress(asyncio.CancelledError):
                await group
        assert rt.get_kernel_state("k") is KernelState.ACTIVE


# --- 9: receive on a kernel that is not active -------------------------------------------------


async def scenario_receive_on_launched_kernel(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, activate=False)
        with pytest.raises(KernelStateError, match=r"it is LAUNCHED; activate it first"):
            await asyncio.wait_for(rt.receive("k"), 2)
        with pytest.raises(KernelStateError, match=r"it is LAUNCHED; activate it first"):
            await asyncio.wait_for(rt.receive("k", timeout=1), 2)
        with pytest.raises(KernelStateError, match=r"it is LAUNCHED; activate it first"):
            await asyncio.wait_for(rt.send_and_receive("k", Job(seq=1)), 2)
        await rt.activate("k")  # and once active, it answers
        assert (await rt.send_and_receive("k", Job(seq=2), timeout=10)).seq == 2


# --- 11: restart policy on every tier, or refused at launch ----------------------------------


async def scenario_restart_on_failure(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        if case.name not in RESTARTS:
            refusal = rf"restart='on_failure' is not supported on the {case.name} tier"
            with pytest.raises(InvalidConfigurationError, match=refusal):
                await _launch(rt, case, restart="on_failure", max_restarts=2)
            return
        await _launch(rt, case, restart="on_failure", max_restarts=2)
        await rt.send("k", Job(seq=0, payload="boom"))
        reply = await rt.send_and_receive("k", Job(seq=1), timeout=10)
        assert reply.seq == 1
        tel = rt.get_telemetry("k")
        assert tel.restarts == 1
        assert tel.error_count == 1
        assert rt.get_kernel_state("k") is KernelState.ACTIVE


# --- 12: one bad message never poisons a kernel ------------------------------------------------


async def scenario_bad_field_is_not_a_poison_pill(case: TierCase, *, serialize: bool) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        opts: dict[str, Any] = {"serialize": True} if serialize else {}
        await _launch(rt, case, **opts)
        refused = False
        try:
            await rt.send("k", Job(seq="not an int"))  # type: ignore[arg-type]
        except (TypeValidationError, PyDotComputeError, ValueError):
            refused = True
        reply = await rt.send_and_receive("k", Job(seq=1), timeout=10)
        assert reply.seq == 1
        assert rt.get_kernel_state("k") is KernelState.ACTIVE
        del refused


# --- 13: user bounds hold end to end; priority is not starved ---------------------------------


async def scenario_bridge_bound_holds(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, queue_size=8, backpressure="reject", bridge_queue_size=2)
        await rt.send("k", Job(seq=0, payload="sleep:1.0"))
        await asyncio.sleep(0.2)  # the actor holds message 0
        accepted = 1
        for i in range(1, 1000):
            try:
                await rt.send("k", Job(seq=i))
            except QueueFullError:
                await asyncio.sleep(0)  # let the pump move what it may
                continue
            accepted += 1
            await asyncio.sleep(0)
        # the inbox (8), the bridge (2), one in the pump's hands, one in the actor's
        assert accepted <= 8 + 2 + 2, accepted


async def scenario_priority_not_starved(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, queue_size=4096, bridge_queue_size=2)
        for i in range(300):
            await rt.send("k", Job(seq=i, payload="sleep:0.002", priority=10))
        await rt.send("k", Job(seq=10_000, priority=250))
        got = [(await rt.receive("k", timeout=10)).seq for _ in range(301)]
        assert got.index(10_000) <= 2 + 2 + 2, got.index(10_000)


# --- 14: the wrong kind of actor is refused at launch ---------------------------------------


async def scenario_wrong_actor_kind_refused(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        with pytest.raises(TypeValidationError, match=rf"the {case.name} tier runs .* async"):
            await rt.launch("k", case.wrong_kind, input_type=Job, tier=case.name)
        assert "k" not in rt


# --- 8: a message larger than the tier can carry is refused by send, at once ----------------


async def scenario_oversized_message(case: TierCase) -> None:
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        opts = {"ring_bytes": 4096} if case.name == "process" else {}
        await _launch(rt, case, **opts)
        big = Job(seq=1, payload="x" * 10_000)
        if case.name == "process":
            with pytest.raises(
                MessageSerializationError, match=r"launch\(\.\.\., ring_bytes=\d+\)"
            ):
                await rt.send("k", big)
            with pytest.raises(MessageSerializationError, match="at most 4088 bytes"):
                rt.send_nowait("k", big)
        else:  # no limit of its own: carried like any other
            await rt.send("k", big)
            assert (await rt.receive("k", timeout=10)).seq == 1
        # the kernel is unharmed either way
        assert (await rt.send_and_receive("k", Job(seq=2), timeout=10)).seq == 2
        assert rt.get_telemetry("k").messages_dropped == 0


# --- exactly once through a pipeline, mixed priorities and policies --------------------------


async def relay_async(ctx: Any) -> None:
    while not ctx.should_terminate:
        done = await ctx.receive()
        await ctx.send(done)


async def scenario_pipeline_exactly_once(case: TierCase) -> None:
    """a (this tier) -> b (asyncio, drop_oldest) -> c (asyncio, block), shut down mid-flow."""
    async with asyncio.timeout(BOUND_S):
        rt = case.make_runtime()
        accepted: list[int] = []
        read: list[int] = []
        async with rt:
            await _launch(rt, case, "a", queue_size=32)
            await rt.launch(
                "b",
                relay_async,
                input_type=Done,
                output_type=Done,
                queue_size=8,
                backpressure="drop_oldest",
            )
            await rt.launch("c", relay_async, input_type=Done, output_type=Done, queue_size=16)
            for kid in ("b", "c"):
                await rt.activate(kid)
            rt.connect("a", "b")
            rt.connect("b", "c")
            for i in range(400):
                await rt.send("a", Job(seq=i, priority=(10, 128, 250)[i % 3]))
                accepted.append(i)
                if i % 2:
                    with contextlib.suppress(QueueTimeoutError):
                        read.append((await rt.receive("c", timeout=0.01)).seq)
        left = [m for kid in "abc" for m in rt.get_kernel(kid).undelivered]
        dropped = sum(rt.get_telemetry(kid).messages_dropped for kid in "abc")
        assert_exactly_once(accepted, read + _read_all(rt, "c"), _seqs(left), dropped)


# --- ordered shutdown, restart intensity, launch options ---------------------------------------


class _Lines(logging.Handler):
    """Collects the pydotcompute log lines emitted while it is installed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _log_lines() -> Any:
    handler = _Lines()
    log = logging.getLogger("pydotcompute")
    log.addHandler(handler)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)


def _counting_sink(seen: list[int]) -> Callable[..., Any]:
    async def sink(ctx: Any) -> None:
        while not ctx.should_terminate:
            done = await ctx.receive()
            await asyncio.sleep(0)  # slower than the stages before it
            seen.append(done.seq)

    return sink


async def scenario_shutdown_drains_pipeline_head_to_tail(case: TierCase) -> None:
    """Leaving the runtime's scope with a full pipeline: every accepted message reaches the
    sink (sources stop first, each stage drains into the next), nothing is dropped, and at
    most one log line is written about it."""
    async with asyncio.timeout(BOUND_S):
        rt = case.make_runtime()
        seen: list[int] = []
        with _log_lines() as lines:
            async with rt:
                # the sink is launched first: a shutdown in launch order would stop it first
                await rt.launch("sink", _counting_sink(seen), input_type=Done, queue_size=64)
                await rt.launch(
                    "relay", relay_async, input_type=Done, output_type=Done, queue_size=64
                )
                await _launch(rt, case, "head", activate=False, queue_size=64)
                rt.connect("head", "relay")
                rt.connect("relay", "sink")
                for kid in ("sink", "relay", "head"):
                    await rt.activate(kid)
                for i in range(400):
                    await rt.send("head", Job(seq=i))
        dropped = sum(rt.get_telemetry(k).messages_dropped for k in ("head", "relay", "sink"))
        left = [m for k in ("head", "relay", "sink") for m in rt.get_kernel(k).undelivered]
        assert sorted(seen) == list(range(400)), (len(seen), dropped, len(left))
        assert dropped == 0
        assert left == []
        assert len([line for line in lines if "dropped" in line]) <= 1, lines


async def scenario_shutdown_from_inside_an_actor_is_refused(case: TierCase) -> None:
    """An actor that calls ``runtime.shutdown()`` (or ``terminate_all()``) while handling a
    message is refused at once, naming its kernel; the runtime keeps running."""
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        errors: list[BaseException] = []

        async def controller(ctx: Any) -> None:
            while not ctx.should_terminate:
                done = await ctx.receive()
                for stop in (rt.shutdown, rt.terminate_all):
                    try:
                        await stop()
                    except KernelStateError as exc:
                        errors.append(exc)
                await ctx.send(done)

        await _launch(rt, case, "k")
        await rt.launch("ctl", controller, input_type=Done, output_type=Done)
        await rt.activate("ctl")
        rt.connect("k", "ctl")
        await rt.send("k", Job(seq=1))
        assert (await rt.receive("ctl", timeout=10)).seq == 1
        assert len(errors) == 2, errors
        for exc in errors:
            assert "'ctl'" in str(exc)
            assert "outside" in str(exc)
        assert rt.is_active
        for kid in ("k", "ctl"):
            assert rt.get_kernel_state(kid) is KernelState.ACTIVE
        await rt.send("k", Job(seq=2))
        assert (await rt.receive("ctl", timeout=10)).seq == 2
    for kid in ("k", "ctl"):
        assert rt.get_kernel_state(kid) is KernelState.TERMINATED


BAD_FLOATS = (float("nan"), float("inf"), float("-inf"), -1.0, "5", True)


async def scenario_non_finite_float_options_refused(case: TierCase) -> None:
    """``drain_timeout`` (and the other float options) must be finite numbers >= 0: anything
    else is refused at launch, naming the option and the value; nothing is left launched."""
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        options = ["drain_timeout"]
        if case.name in RESTARTS:
            options += ["restart_window", "restart_backoff", "restart_backoff_max"]
        for option in options:
            for bad in BAD_FLOATS:
                extra = {"restart": "on_failure"} if option.startswith("restart") else {}
                with pytest.raises(InvalidConfigurationError, match=option) as info:
                    await _launch(rt, case, activate=False, **{option: bad}, **extra)
                assert repr(bad) in str(info.value), str(info.value)
                assert "k" not in rt.kernel_ids
        await _launch(rt, case, drain_timeout=0.5)
        assert (await rt.send_and_receive("k", Job(seq=1), timeout=10)).seq == 1
        assert await rt.terminate("k") == []
        for bad in (float("nan"), -1.0):
            with pytest.raises(InvalidConfigurationError, match="timeout"):
                await rt.shutdown(timeout=bad)


async def scenario_restart_intensity(case: TierCase) -> None:
    """At most ``max_restarts`` restarts within ``restart_window`` seconds: failures spread
    out are survived, a burst fails the kernel; ``max_restarts=None`` never gives up.
    Restarts are counted in telemetry and logged rate-limited."""
    if case.name not in RESTARTS:
        return  # refused at launch: scenario_restart_on_failure
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        # spread out: three failures, each after the window of the one before
        await _launch(
            rt,
            case,
            "spread",
            restart="on_failure",
            max_restarts=1,
            restart_window=0.3,
            restart_backoff=0.001,
        )
        for i in range(3):
            await rt.send("spread", Job(seq=i, payload="boom"))
            assert (
                await rt.send_and_receive("spread", Job(seq=100 + i), timeout=10)
            ).seq == 100 + i
            await asyncio.sleep(0.4)
        tel = await _telemetry(rt, "spread")
        assert (tel.restarts, tel.error_count) == (3, 3)
        assert rt.get_kernel_state("spread") is KernelState.ACTIVE

        # a burst: the second failure within the window fails the kernel
        await _launch(
            rt,
            case,
            "burst",
            restart="on_failure",
            max_restarts=1,
            restart_window=30.0,
            restart_backoff=0.001,
        )
        for i in range(2):
            await rt.send("burst", Job(seq=i, payload="boom"))
        deadline = time.monotonic() + 10
        while rt.get_kernel_state("burst") is not KernelState.FAILED:
            assert time.monotonic() < deadline, "a burst of failures did not fail the kernel"
            await asyncio.sleep(0.02)
        assert (await _telemetry(rt, "burst")).restarts == 1

        # unlimited: 60 failures in a row, the kernel still answers; few log lines
        with _log_lines() as lines:
            await _launch(
                rt,
                case,
                "sturdy",
                restart="on_failure",
                max_restarts=None,
                restart_backoff=0.0005,
                restart_backoff_max=0.002,
            )
            for i in range(60):
                await rt.send("sturdy", Job(seq=i, payload="boom"))
            assert (await rt.send_and_receive("sturdy", Job(seq=999), timeout=10)).seq == 999
            tel = await _telemetry(rt, "sturdy")
            assert (tel.restarts, tel.error_count) == (60, 60)
            await rt.terminate("sturdy")
        restart_lines = [line for line in lines if "'sturdy'" in line]
        assert 1 <= len(restart_lines) <= 5, restart_lines
        assert any("60" in line for line in restart_lines), restart_lines


async def scenario_restarted_request_error_does_not_say_active(case: TierCase) -> None:
    """The caller whose request made the actor raise learns it was restarted, without being
    told the kernel "is ACTIVE" as if it could not be used."""
    if case.name not in RESTARTS:
        return
    async with asyncio.timeout(BOUND_S), case.make_runtime() as rt:
        await _launch(rt, case, restart="on_failure", max_restarts=2)
        with pytest.raises(KernelFailedError) as info:
            await rt.send_and_receive("k", Job(seq=0, payload="boom"), timeout=10)
        text = str(info.value)
        assert "it is ACTIVE" not in text, text
        assert "cannot use" not in text, text
        assert "restarted" in text, text
        assert "boom at 0" in text, text
        assert (await rt.send_and_receive("k", Job(seq=1), timeout=10)).seq == 1


async def _telemetry(rt: Any, kid: str) -> Any:
    refresh = getattr(rt, "refresh_telemetry", None)
    if refresh is not None:
        return await refresh(kid)
    return rt.get_telemetry(kid)


async def scenario_unordered_shutdown_counts_drops_in_one_line(case: TierCase) -> None:
    """``shutdown(ordered=False)`` stops every stage at once: what the tail refuses is
    counted (exactly once overall) and logged in a few lines, not one line a message."""
    async with asyncio.timeout(BOUND_S):
        rt = case.make_runtime()
        seen: list[int] = []
        accepted: list[int] = []
        with _log_lines() as lines:
            async with rt:
                await rt.launch("sink", _counting_sink(seen), input_type=Done, queue_size=8)
                await _launch(
                    rt, case, "head", activate=False, queue_size=512, output_queue_size=512
                )
                rt.connect("head", "sink")
                for i in range(500):
                    await rt.send("head", Job(seq=i))
                    accepted.append(i)
                await rt.activate("head")
                await asyncio.sleep(0.05)
                await rt.shutdown(timeout=0.2, ordered=False)
        left = rt.get_kernel("head").undelivered + rt.get_kernel("sink").undelivered
        dropped = (
            rt.get_telemetry("head").messages_dropped + rt.get_telemetry("sink").messages_dropped
        )
        assert_exactly_once(accepted, seen, _seqs(left), dropped)
        assert dropped > 0  # the point of the scenario: some were refused
        assert len(lines) <= 6, f"{len(lines)} log lines: {lines[:8]}"


#: Tiers whose actor functions are restarted under ``restart="on_failure"``.
RESTART_TIERS = RESTARTS | {"ray"}


async def scenario_restarts_account_for_every_message(case: TierCase) -> None:
    """An actor restarted on every other message: each message ends as a reply, a message
    handed back, or a counted drop, and telemetry read after terminate shows every
    restart and error."""
    if case.name not in RESTART_TIERS:
        return
    async with asyncio.timeout(BOUND_S * 2), case.make_runtime() as rt:
        await _launch(rt, case, restart="on_failure", max_restarts=None, restart_backoff=0.001)
        for i in range(20):
            await rt.send("k", Job(seq=i, payload="boom" if i % 2 else ""))
        read: list[int] = []
        with contextlib.suppress(QueueTimeoutError):
            while len(read) < 10:
                read.append((await rt.receive("k", timeout=10)).seq)
        left = await rt.terminate("k")
        read += _read_all(rt, "k")
        assert sorted(read) == list(range(0, 20, 2)), read
        tel = await _telemetry(rt, "k")
        undelivered = _seqs(rt.get_kernel("k").undelivered)
        assert_exactly_once(list(range(20)), read, undelivered, tel.messages_dropped)
        assert _seqs(left) == []
        assert tel.messages_dropped == 10, tel.messages_dropped
        assert (tel.restarts, tel.error_count) == (10, 10)
