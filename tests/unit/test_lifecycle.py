"""The ring-kernel lifecycle: states, legal and illegal transitions, drain, failure, restart."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from foundation_helpers import Other, Req, Resp, crash_on_negative, doubler, echo, until

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    QueueClosedError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.config import RingKernelConfig
from pydotcompute.ring_kernels.context import KernelContext
from pydotcompute.ring_kernels.fast_queue import FastMessageQueue
from pydotcompute.ring_kernels.kernel import RingKernel, managed_kernel
from pydotcompute.ring_kernels.queue import MessageQueue
from pydotcompute.ring_kernels.states import KernelState

S = KernelState
_ids = itertools.count()


def make(func: Any = doubler, **kw: Any) -> RingKernel:
    kw.setdefault("input_type", Req)
    return RingKernel(f"k{next(_ids)}", func, **kw)


@pytest.fixture
async def kernels() -> AsyncIterator[list[RingKernel]]:
    """Kernels a test creates; any still running are terminated afterwards."""
    made: list[RingKernel] = []
    yield made
    for k in made:
        if k.state not in (S.TERMINATED, S.TERMINATING, S.CREATED):
            await k.terminate(timeout=1.0)
        assert k._task is None or k._task.done()


_GATES: dict[str, asyncio.Event] = {}
_TERMINATING: dict[str, asyncio.Future[Any]] = {}


async def slow_drain(ctx: KernelContext) -> None:
    """Waits on an event per message, so a test can hold the kernel in TERMINATING."""
    gate = _GATES[ctx.kernel_id]
    while not ctx.should_terminate:
        await ctx.receive()
        await gate.wait()


async def in_state(state: KernelState, made: list[RingKernel]) -> RingKernel:
    """A standalone kernel brought into ``state``."""
    if state is S.FAILED:
        k = make(crash_on_negative)
    elif state is S.TERMINATING:
        k = RingKernel(f"k{next(_ids)}", slow_drain)
        _GATES[k.kernel_id] = asyncio.Event()
    else:
        k = make()
    made.append(k)
    if state is S.CREATED:
        return k
    await k.launch()
    if state is S.LAUNCHED:
        return k
    await k.activate()
    if state is S.DEACTIVATED:
        await k.deactivate()
    elif state is S.TERMINATED:
        await k.terminate()
    elif state is S.FAILED:
        await k.send(Req(x=-1))
        await until(lambda: k.state is S.FAILED, "kernel failed")
    elif state is S.TERMINATING:
        await k.send(Req(x=1))
        await k.send(Req(x=2))
        task = asyncio.ensure_future(k.terminate(timeout=5.0))
        await until(lambda: k.state is S.TERMINATING, "terminating")
        _TERMINATING[k.kernel_id] = task
    return k


async def release(k: RingKernel) -> None:
    task = _TERMINATING.pop(k.kernel_id, None)
    if task is not None:
        _GATES.pop(k.kernel_id).set()
        await task


ALLOWED = {
    "launch": {S.CREATED},
    "activate": {S.LAUNCHED},
    "deactivate": {S.ACTIVE},
    "reactivate": {S.DEACTIVATED},
    "terminate": {S.CREATED, S.LAUNCHED, S.ACTIVE, S.DEACTIVATED, S.FAILED},
}
ILLEGAL = [(op, st) for op, ok in ALLOWED.items() for st in KernelState if st not in ok]


@pytest.mark.parametrize(("op", "state"), ILLEGAL, ids=[f"{o}-{s.name}" for o, s in ILLEGAL])
async def test_every_illegal_transition_raises_kernel_state_error(
    op: str, state: KernelState, kernels: list[RingKernel]
) -> None:
    k = await in_state(state, kernels)
    assert k.state is state
    try:
        with pytest.raises(
            KernelStateError, match=rf"^cannot {op} kernel '{k.kernel_id}': it is {state.name}"
        ) as info:
            await getattr(k, op)()
        assert info.value.kernel_id == k.kernel_id
        assert info.value.state is state
        assert info.value.operation == op
        assert k.state is state  # nothing changed
    finally:
        await release(k)


@pytest.mark.parametrize(
    ("op", "state", "hint"),
    [
        ("activate", S.CREATED, "launch it first"),
        ("activate", S.DEACTIVATED, "use reactivate"),
        ("deactivate", S.LAUNCHED, "activate it first"),
        ("terminate", S.TERMINATED, "already terminated"),
        ("launch", S.LAUNCHED, "already launched"),
    ],
)
async def test_illegal_transitions_say_how_to_fix_them(
    op: str, state: KernelState, hint: str, kernels: list[RingKernel]
) -> None:
    k = await in_state(state, kernels)
    with pytest.raises(KernelStateError, match=hint):
        await getattr(k, op)()


async def test_the_legal_path(kernels: list[RingKernel]) -> None:
    k = make()
    kernels.append(k)
    assert k.state is S.CREATED
    assert k.inbox is None
    await k.launch()
    assert k.state is S.LAUNCHED
    assert isinstance(k.inbox, FastMessageQueue)
    await k.activate()
    assert k.state is S.ACTIVE
    assert k.is_active
    await k.deactivate()
    assert k.state is S.DEACTIVATED
    await k.reactivate()
    assert k.state is S.ACTIVE
    assert await k.terminate() == []
    assert k.state is S.TERMINATED
    assert "TERMINATED" in repr(k)


async def test_terminate_from_created_and_launched(kernels: list[RingKernel]) -> None:
    created, launched = make(), make()
    kernels += [created, launched]
    await launched.launch()
    await launched.send(Req(x=1))
    assert await created.terminate() == []
    left = await launched.terminate()
    assert [m.x for m in left] == [1]  # never activated: returned, not lost
    assert launched.undelivered == left
    assert launched.telemetry.messages_dropped == 1
    assert created.state is launched.state is S.TERMINATED


# --- configuration ---------------------------------------------------------------------


def test_config_defaults_match_the_api() -> None:
    cfg = RingKernelConfig("k")
    assert (cfg.grid_size, cfg.block_size) == (1, 256)
    assert (cfg.input_queue_size, cfg.output_queue_size) == (4096, 4096)
    assert cfg.backpressure_strategy == "block"
    assert cfg.use_fast_queue is True
    assert (cfg.restart, cfg.max_restarts) == ("never", 3)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("input_queue_size", 0, r"input_queue_size must be an int in 1\.\."),
        ("output_queue_size", -5, r"output_queue_size must be an int in 1\.\."),
        ("block_size", 2048, r"block_size must be an int in 1\.\.1024, got 2048"),
        ("grid_size", 0, r"grid_size must be an int >= 1, got 0"),
        ("backpressure_strategy", "maybe", r"unknown backpressure strategy 'maybe'"),
        ("restart", "always", r"restart must be one of \('never', 'on_failure'\), got 'always'"),
        ("max_restarts", -1, r"max_restarts must be an int >= 0, got -1"),
    ],
)
def test_bad_config_is_refused_at_construction(field: str, value: Any, match: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=match):
        RingKernelConfig("k", **{field: value})
    cfg = RingKernelConfig("k")
    setattr(cfg, field, value)  # assigned after construction: the kernel refuses it
    with pytest.raises(InvalidConfigurationError, match=match):
        RingKernel("k", doubler, config=cfg)


def test_kernel_func_must_be_callable() -> None:
    with pytest.raises(TypeValidationError, match="kernel_func must be an async function"):
        RingKernel("k", 42)  # type: ignore[arg-type]


def test_config_kernel_id_follows_the_kernel() -> None:
    k = RingKernel("real", doubler, config=RingKernelConfig("other"))
    assert k.config.kernel_id == "real"


async def test_exact_priority_queues_when_not_fast(kernels: list[RingKernel]) -> None:
    k = RingKernel("k", echo, config=RingKernelConfig("k", use_fast_queue=False))
    kernels.append(k)
    await k.launch()
    assert isinstance(k.inbox, MessageQueue)
    await k.send(Req(x=1, priority=100))
    await k.send(Req(x=2, priority=101))
    await k.activate()
    assert [(await k.receive(timeout=5)).x for _ in range(2)] == [2, 1]


# --- messaging through a standalone kernel ---------------------------------------------


async def test_messages_sent_before_activation_wait_in_the_inbox(
    kernels: list[RingKernel],
) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    for i in range(3):
        await k.send(Req(x=i))
    assert len(k.inbox) == 3  # type: ignore[arg-type]
    await k.activate()
    assert [(await k.receive(timeout=5)).y for _ in range(3)] == [0, 2, 4]


async def test_send_before_launch_says_launch_it_first(kernels: list[RingKernel]) -> None:
    k = make()
    with pytest.raises(
        KernelStateError, match=r"cannot send to kernel '.*': it is CREATED; launch"
    ):
        await k.send(Req(x=1))
    with pytest.raises(KernelStateError, match="it is CREATED; launch it first"):
        await k.receive()


async def test_wrong_message_type_names_expected_and_received(
    kernels: list[RingKernel],
) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    with pytest.raises(
        TypeValidationError, match=rf"^kernel '{k.kernel_id}' expects Req, got Other$"
    ):
        await k.send(Other(z="no"))
    with pytest.raises(TypeValidationError, match=r"expects Req, got dict \(\{'x': 1\}\)"):
        k.send_nowait({"x": 1})
    assert len(k.inbox) == 0  # type: ignore[arg-type]


async def test_actor_sending_the_wrong_type_fails_the_kernel(kernels: list[RingKernel]) -> None:
    async def liar(ctx: KernelContext) -> None:
        await ctx.receive()
        await ctx.send(Other(z="not a Resp"))

    k = make(liar, output_type=Resp)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    with pytest.raises(KernelFailedError, match=r"TypeValidationError: kernel '.*' must send Resp"):
        await k.receive(timeout=5)
    assert k.state is S.FAILED
    assert isinstance(k.error, TypeValidationError)


async def test_receive_timeout_is_a_timeout_error(kernels: list[RingKernel]) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    await k.activate()
    with pytest.raises(QueueTimeoutError, match=r"no message arrived within 0\.01s"):
        await k.receive(timeout=0.01)
    with pytest.raises(TimeoutError):
        await k.receive(timeout=0)


async def test_ctx_receive_timeout(kernels: list[RingKernel]) -> None:
    seen: list[str] = []

    async def ticker(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            try:
                msg = await ctx.receive(timeout=0.001)
            except TimeoutError as exc:
                seen.append(type(exc).__name__)
                continue
            await ctx.send(Resp(y=msg.x))

    k = make(ticker)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await until(lambda: len(seen) >= 2, "two receive timeouts")
    await k.send(Req(x=5))
    assert (await k.receive(timeout=5)).y == 5
    assert seen[0] == "QueueTimeoutError"


async def test_backpressure_reject_on_the_inbox(kernels: list[RingKernel]) -> None:
    cfg = RingKernelConfig("r", input_queue_size=2, backpressure_strategy="reject")
    k = RingKernel("r", doubler, config=cfg, input_type=Req)
    kernels.append(k)
    await k.launch()
    await k.send(Req(x=0))
    k.send_nowait(Req(x=1))
    with pytest.raises(QueueFullError, match=r"queue of kernel 'r' is full \(2/2"):
        await k.send(Req(x=2))
    with pytest.raises(QueueFullError):
        k.send_nowait(Req(x=2))


async def test_block_backpressure_send_times_out(kernels: list[RingKernel]) -> None:
    k = RingKernel("b", doubler, config=RingKernelConfig("b", input_queue_size=1))
    kernels.append(k)
    await k.launch()
    await k.send(Req(x=0))
    with pytest.raises(QueueTimeoutError, match="waiting for space in queue of kernel 'b'"):
        await k.send(Req(x=1), timeout=0.01)


# --- the context -----------------------------------------------------------------------


async def test_context_flags_and_current_message(kernels: list[RingKernel]) -> None:
    log: list[Any] = []

    async def observer(ctx: KernelContext) -> None:
        log.append((ctx.kernel_id, ctx.is_active, ctx.state, ctx.should_terminate))
        msg = await ctx.receive()
        log.append(ctx.current_message is msg)
        await ctx.send(Resp(y=msg.x))
        while not ctx.should_terminate:
            try:
                await ctx.receive()
            except QueueClosedError:
                log.append(("closed", ctx.should_terminate, ctx.state))
                raise

    k = make(observer)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    reply = await k.receive(timeout=5)
    await k.terminate()
    assert log[0] == (k.kernel_id, True, S.ACTIVE, False)
    assert log[1] is True
    assert log[2] == ("closed", True, S.TERMINATING)
    assert reply.y == 1


async def test_replies_are_stamped_with_the_request_id(kernels: list[RingKernel]) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    await k.activate()
    req = Req(x=4)
    await k.send(req)
    reply = await k.receive(timeout=5)
    assert reply.correlation_id == req.message_id


async def test_an_explicit_correlation_is_kept(kernels: list[RingKernel]) -> None:
    marker = Req(x=0)

    async def explicit(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()
            await ctx.send(marker.reply(Resp, y=1))

    k = make(explicit)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    assert (await k.receive(timeout=5)).correlation_id == marker.message_id


async def test_ctx_receive_nowait_and_send_nowait(kernels: list[RingKernel]) -> None:
    async def batcher(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            first = await ctx.receive()
            total = first.x
            while (more := ctx.receive_nowait()) is not None:
                total += more.x
            ctx.send_nowait(Resp(y=total))

    k = make(batcher)
    kernels.append(k)
    await k.launch()
    for i in range(1, 5):
        await k.send(Req(x=i))
    await k.activate()
    assert (await k.receive(timeout=5)).y == 10
    assert k.telemetry.messages_processed == 4


async def test_ctx_send_nowait_raises_when_the_outbox_is_full(kernels: list[RingKernel]) -> None:
    errors: list[BaseException] = []

    async def flood(ctx: KernelContext) -> None:
        await ctx.receive()
        try:
            for i in range(5):
                ctx.send_nowait(Resp(y=i))
        except QueueFullError as exc:
            errors.append(exc)
        await ctx.receive()

    k = RingKernel("f", flood, config=RingKernelConfig("f", output_queue_size=2))
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=0))
    await until(lambda: errors, "outbox full")
    assert "is full (2/2 messages)" in str(errors[0])


async def test_send_to_needs_a_runtime(kernels: list[RingKernel]) -> None:
    errors: list[BaseException] = []

    async def forward(ctx: KernelContext) -> None:
        await ctx.receive()
        try:
            await ctx.send_to("elsewhere", Req(x=1))
        except KernelStateError as exc:
            errors.append(exc)
        await ctx.receive()

    k = make(forward)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=0))
    await until(lambda: errors, "send_to refused")
    assert "the kernel is not managed by a RingKernelRuntime" in str(errors[0])


# --- deactivate / reactivate -----------------------------------------------------------


async def test_deactivate_keeps_queued_messages(kernels: list[RingKernel]) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=0))
    assert (await k.receive(timeout=5)).y == 0
    await k.deactivate()
    for i in range(1, 6):
        await k.send(Req(x=i))
    for _ in range(50):
        await asyncio.sleep(0)
    assert k.outbox is not None
    assert len(k.outbox) == 0  # nothing processed while deactivated
    queued = len(k.inbox)  # type: ignore[arg-type]
    assert queued >= 4  # at most one taken and held by the parked actor
    await k.reactivate()
    assert [(await k.receive(timeout=5)).y for _ in range(5)] == [2, 4, 6, 8, 10]


async def test_wait_active_blocks_until_reactivated(kernels: list[RingKernel]) -> None:
    marks: list[str] = []

    async def waiter(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()
            await ctx.wait_active()
            marks.append("active")

    k = make(waiter)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.deactivate()
    await k.send(Req(x=1))
    for _ in range(50):
        await asyncio.sleep(0)
    assert marks == []
    await k.reactivate()
    await until(lambda: marks == ["active"], "reactivated")


async def test_terminate_while_deactivated_still_drains(kernels: list[RingKernel]) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.deactivate()
    for i in range(3):
        await k.send(Req(x=i))
    assert await k.terminate() == []
    assert [m.y for m in k.outbox.drain()] == [0, 2, 4]  # type: ignore[union-attr]


# --- terminate -------------------------------------------------------------------------


async def test_terminate_wakes_an_actor_blocked_in_receive_without_timeout(
    kernels: list[RingKernel],
) -> None:
    ended: list[str] = []

    async def parked(ctx: KernelContext) -> None:
        try:
            await ctx.receive()  # no timeout, nothing ever arrives
        finally:
            ended.append("ended")

    k = make(parked)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await until(lambda: k.is_idle if hasattr(k, "is_idle") else True, "parked")
    for _ in range(10):
        await asyncio.sleep(0)
    assert await k.terminate(timeout=30.0) == []
    assert ended == ["ended"]
    assert k.state is S.TERMINATED
    assert k._task is not None
    assert k._task.done()
    assert not k._task.cancelled()  # woken by the closed inbox, not cancelled
    assert k.error is None


async def test_terminate_drains_the_inbox_gracefully(kernels: list[RingKernel]) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    for i in range(100):
        await k.send(Req(x=i))
    await k.activate()
    assert await k.terminate() == []
    out = k.outbox.drain()  # type: ignore[union-attr]
    assert [m.y for m in out] == [2 * i for i in range(100)]
    assert k.telemetry.messages_processed == 100
    assert k.telemetry.messages_dropped == 0


async def test_terminate_refuses_new_sends_and_fails_receivers_after_drain(
    kernels: list[RingKernel],
) -> None:
    k = make()
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    await k.terminate()
    with pytest.raises(
        KernelStateError, match=rf"cannot send to kernel '{k.kernel_id}': it is TERMINATED"
    ):
        await k.send(Req(x=2))
    with pytest.raises(KernelStateError, match="it is TERMINATED"):
        k.send_nowait(Req(x=2))
    assert (await k.receive(timeout=5)).y == 2  # the outbox stays readable
    with pytest.raises(
        KernelStateError,
        match=r"cannot receive from kernel '.*': it is TERMINATED; it was terminated and its "
        r"outbox is drained",
    ):
        await k.receive()


async def test_terminate_past_the_grace_period_cancels_and_counts(
    kernels: list[RingKernel],
) -> None:
    hold = asyncio.Event()

    async def stuck(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()
            await hold.wait()  # never set

    k = make(stuck)
    kernels.append(k)
    await k.launch()
    for i in range(5):
        await k.send(Req(x=i))
    await k.activate()
    await until(lambda: len(k.inbox) == 4, "first message taken")  # type: ignore[arg-type]
    left = await k.terminate(timeout=0.01)
    # the message the actor was handling when it was cancelled comes first: never finished
    assert [m.x for m in left] == [0, 1, 2, 3, 4]
    assert k.undelivered == left
    assert k.telemetry.messages_dropped == 5
    assert k.inbox.statistics().total_dropped == 5  # type: ignore[union-attr]
    # every message is accounted for: processed (handled to the end) or undelivered
    assert k.telemetry.messages_processed == 0
    assert k.telemetry.messages_processed + len(k.undelivered) == 5
    assert k._task is not None
    assert k._task.done()
    assert k.state is S.TERMINATED


@pytest.mark.parametrize("forwarding", [False, True], ids=["outbox", "connected"])
async def test_a_reply_cut_off_by_the_grace_period_is_counted(
    kernels: list[RingKernel], forwarding: bool
) -> None:
    cfg = RingKernelConfig("full", output_queue_size=1, drain_timeout=0.01)
    k = RingKernel("full", echo, config=cfg)
    kernels.append(k)
    await k.launch()
    if forwarding:  # a connected kernel whose inbox is full and never drained
        target = RingKernel("target", echo, config=RingKernelConfig("target", input_queue_size=1))
        kernels.append(target)
        await target.launch()
        k.forward_to(target)
    await k.activate()
    for i in range(3):
        await k.send(Req(x=i))
    # the first reply fills the space; the actor then blocks sending the second
    await until(lambda: k.telemetry.messages_processed == 2, "actor blocked sending")
    left = await k.terminate(timeout=0.01)
    if forwarding:
        # the reply never got into the full connected kernel: the request it answers was
        # never finished, so it comes back first, and no longer counts as processed
        assert [m.x for m in left] == [1, 2]
        assert k.telemetry.messages_processed == 1
        assert k.outbox.statistics().total_dropped == 0  # type: ignore[union-attr]
        assert k.telemetry.messages_dropped == len(left)
        return
    # the request whose reply was cut off has a reply: it counts as handled, once, and
    # only the message never taken comes back
    assert [m.x for m in left] == [2]
    assert k.telemetry.messages_processed == 2
    # the reply stays readable, beyond the outbox's bound
    assert [(await k.receive(timeout=1)).x for _ in range(2)] == [0, 1]
    assert k.outbox.statistics().total_dropped == 0  # type: ignore[union-attr]
    assert k.telemetry.messages_dropped == len(left)


@pytest.mark.parametrize("telemetry", [True, False], ids=["timed", "untimed"])
async def test_a_message_cut_off_mid_handling_is_dropped_not_processed(
    kernels: list[RingKernel], telemetry: bool
) -> None:
    hold = asyncio.Event()

    async def stuck(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()
            await hold.wait()  # never set: handling never finishes

    k = make(stuck, enable_telemetry=telemetry)
    kernels.append(k)
    await k.launch()
    await k.activate()
    sent = Req(x=7)
    await k.send(sent)
    await until(lambda: k._ctx is not None and k._ctx.current_message is sent, "message taken")
    left = await k.terminate(timeout=0.01)
    assert left == [sent]
    assert k.undelivered == [sent]
    assert k.telemetry.messages_processed == 0
    assert k.telemetry.messages_dropped == 1
    stats = k.inbox.statistics()  # type: ignore[union-attr]
    assert (stats.total_dequeued, stats.total_dropped) == (1, 1)


async def test_a_message_handled_to_the_end_is_not_reported(
    kernels: list[RingKernel],
) -> None:
    """Only the message being handled counts: one whose handling ended (the actor asked
    for the next) is processed, even when the actor is cancelled later."""
    hold = asyncio.Event()

    async def one_then_stuck(ctx: KernelContext) -> None:
        msg = await ctx.receive()
        await ctx.send(Resp(y=msg.x))
        try:
            await ctx.receive(timeout=0.001)
        except QueueTimeoutError:
            pass
        await hold.wait()  # busy with something else, past the grace period

    k = make(one_then_stuck)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    assert (await k.receive(timeout=5)).y == 1
    await until(lambda: not k._ctx._handling, "asked for the next message")  # type: ignore[union-attr]
    assert await k.terminate(timeout=0.01) == []
    assert k.undelivered == []
    assert k.telemetry.messages_processed == 1
    assert k.telemetry.messages_dropped == 0


async def test_terminate_fails_pending_send_and_receive(kernels: list[RingKernel]) -> None:
    async def silent(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()  # never replies

    k = make(silent)
    kernels.append(k)
    await k.launch()
    await k.activate()
    caller = asyncio.ensure_future(k.send_and_receive(Req(x=1)))
    receiver = asyncio.ensure_future(k.receive())
    await until(lambda: k.telemetry.messages_processed == 1, "request taken")
    await k.terminate()
    with pytest.raises(KernelStateError, match="it was terminated"):
        await asyncio.wait_for(caller, 5)
    with pytest.raises(KernelStateError, match="outbox is drained"):
        await asyncio.wait_for(receiver, 5)


async def test_an_actor_cannot_terminate_itself(kernels: list[RingKernel]) -> None:
    errors: list[BaseException] = []
    box: list[RingKernel] = []

    async def suicidal(ctx: KernelContext) -> None:
        await ctx.receive()
        try:
            await box[0].terminate()
        except KernelStateError as exc:
            errors.append(exc)
        while not ctx.should_terminate:
            await ctx.receive()

    k = make(suicidal)
    box.append(k)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    await until(lambda: errors, "self-terminate refused")
    assert "an actor cannot await its own termination" in str(errors[0])
    assert k.state is S.ACTIVE  # the refusal changed nothing
    await k.send(Req(x=2))
    assert await k.terminate() == []
    assert k.state is S.TERMINATED
    assert k.telemetry.messages_processed == 2


async def test_actor_returning_on_its_own_terminates_the_kernel(
    kernels: list[RingKernel],
) -> None:
    async def one_shot(ctx: KernelContext) -> None:
        msg = await ctx.receive()
        await ctx.send(Resp(y=msg.x))

    k = make(one_shot)
    kernels.append(k)
    await k.launch()
    await k.send(Req(x=1))
    await k.send(Req(x=2))
    await k.activate()
    assert (await k.receive(timeout=5)).y == 1
    await until(lambda: k.state is S.TERMINATED, "kernel terminated")
    assert [m.x for m in k.undelivered] == [2]  # counted, not lost
    assert k.telemetry.messages_dropped == 1
    with pytest.raises(KernelStateError, match=r"cannot send to kernel '.*': it is TERMINATED"):
        await k.send(Req(x=3))
    with pytest.raises(KernelStateError, match="its actor function returned"):
        await k.receive()


# --- failure and restart ---------------------------------------------------------------


async def test_an_actor_that_raises_fails_the_kernel(kernels: list[RingKernel]) -> None:
    k = make(crash_on_negative, output_type=Resp)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    await k.send(Req(x=-1))
    await k.send(Req(x=2))
    assert (await k.receive(timeout=5)).y == 2  # replies made before the failure stay readable
    with pytest.raises(
        KernelFailedError,
        match=rf"cannot use kernel '{k.kernel_id}': it is FAILED; the actor raised "
        r"ValueError: negative input -1",
    ) as info:
        await k.receive(timeout=5)
    assert isinstance(info.value.__cause__, ValueError)
    assert k.state is S.FAILED
    assert isinstance(k.error, ValueError)
    assert k.telemetry.error_count == 1
    assert k.telemetry.last_error == "ValueError: negative input -1"
    # the message it raised on comes back first, then the one it never took
    assert [m.x for m in k.undelivered] == [-1, 2]
    with pytest.raises(KernelFailedError, match="negative input -1"):
        await k.send(Req(x=3))
    assert await k.terminate() == []
    assert k.state is S.TERMINATED


async def test_failure_reaches_a_blocked_receiver(kernels: list[RingKernel]) -> None:
    k = make(crash_on_negative)
    kernels.append(k)
    await k.launch()
    await k.activate()
    receiver = asyncio.ensure_future(k.receive())
    await asyncio.sleep(0)
    await k.send(Req(x=-7))
    with pytest.raises(KernelFailedError, match="negative input -7"):
        await asyncio.wait_for(receiver, 5)


async def test_failure_reaches_send_and_receive_callers(kernels: list[RingKernel]) -> None:
    k = make(crash_on_negative)
    kernels.append(k)
    await k.launch()
    await k.activate()
    with pytest.raises(KernelFailedError, match="negative input -2") as info:
        await k.send_and_receive(Req(x=-2), timeout=5)
    assert isinstance(info.value.__cause__, ValueError)


async def test_restart_on_failure_keeps_serving(kernels: list[RingKernel]) -> None:
    cfg = RingKernelConfig("r", restart="on_failure", max_restarts=2)
    k = RingKernel("r", crash_on_negative, config=cfg, input_type=Req)
    kernels.append(k)
    await k.launch()
    await k.activate()
    for x in (-1, 1, -2, 2):
        await k.send(Req(x=x))
    assert [(await k.receive(timeout=5)).y for _ in range(2)] == [2, 4]
    assert k.state is S.ACTIVE
    assert k.telemetry.restarts == 2
    assert k.telemetry.error_count == 2
    # the third failure is one more than max_restarts allows
    await k.send(Req(x=-3))
    with pytest.raises(KernelFailedError, match="negative input -3"):
        await k.receive(timeout=5)
    assert k.state is S.FAILED
    assert k.telemetry.restarts == 2


async def test_restart_with_zero_max_restarts_fails_at_once(kernels: list[RingKernel]) -> None:
    cfg = RingKernelConfig("z", restart="on_failure", max_restarts=0)
    k = RingKernel("z", crash_on_negative, config=cfg)
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=-1))
    await until(lambda: k.state is S.FAILED, "failed")
    assert k.telemetry.restarts == 0


async def test_restarted_request_fails_its_caller_instead_of_hanging(
    kernels: list[RingKernel],
) -> None:
    cfg = RingKernelConfig("h", restart="on_failure", max_restarts=3)
    k = RingKernel("h", crash_on_negative, config=cfg, input_type=Req)
    kernels.append(k)
    await k.launch()
    await k.activate()
    with pytest.raises(
        KernelFailedError,
        match=r"the actor raised ValueError: negative input -5 while handling this request "
        r"and was restarted \(restart 1 of 3 within 5s\); it goes on with the next message",
    ) as info:
        await asyncio.wait_for(k.send_and_receive(Req(x=-5)), 5)  # no timeout of its own
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.state is S.ACTIVE
    assert k.state is S.ACTIVE
    assert (await k.send_and_receive(Req(x=5), timeout=5)).y == 10


async def test_restart_resumes_with_the_next_queued_message(kernels: list[RingKernel]) -> None:
    cfg = RingKernelConfig("q", restart="on_failure", max_restarts=1)
    k = RingKernel("q", crash_on_negative, config=cfg)
    kernels.append(k)
    await k.launch()
    for x in (1, -1, 2, 3):
        await k.send(Req(x=x))
    await k.activate()
    assert [(await k.receive(timeout=5)).y for _ in range(3)] == [2, 4, 6]
    # the message it raised on ends as a counted drop, not as processed
    assert k.telemetry.messages_processed == 3
    assert k.telemetry.messages_dropped == 1


# --- concurrency -----------------------------------------------------------------------


async def test_send_and_receive_with_100_concurrent_callers(kernels: list[RingKernel]) -> None:
    async def jittery(ctx: KernelContext) -> None:
        n = 0
        while not ctx.should_terminate:
            msg = await ctx.receive()
            n += 1
            for _ in range(n % 3):
                await asyncio.sleep(0)
            await ctx.send(Resp(y=msg.x * msg.x))

    k = make(jittery)
    kernels.append(k)
    await k.launch()
    await k.activate()
    results = await asyncio.gather(*(k.send_and_receive(Req(x=i), timeout=10) for i in range(100)))
    assert [r.y for r in results] == [i * i for i in range(100)]
    assert len(k.outbox) == 0  # type: ignore[arg-type]  # nothing leaked to the outbox
    assert k._waiters == {}


async def test_send_and_receive_timeout(kernels: list[RingKernel]) -> None:
    async def mute(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()

    k = make(mute)
    kernels.append(k)
    await k.launch()
    await k.activate()
    with pytest.raises(QueueTimeoutError, match=rf"no reply from kernel '{k.kernel_id}' within"):
        await k.send_and_receive(Req(x=1), timeout=0.01)
    # the request stays registered as abandoned: a late reply is dropped and counted
    assert [f.cancelled() for f in k._waiters.values()] == [True]


async def test_send_and_receive_times_out_waiting_for_room(kernels: list[RingKernel]) -> None:
    """The time limit covers the wait for room in a full inbox as well as the reply."""
    release = asyncio.Event()

    async def stalled(ctx: KernelContext) -> None:
        await release.wait()
        while not ctx.should_terminate:
            await ctx.receive()

    k = RingKernel(
        "full", stalled, input_type=Req, config=RingKernelConfig("full", input_queue_size=1)
    )
    kernels.append(k)
    await k.launch()
    await k.activate()
    await k.send(Req(x=0))  # the inbox's one slot
    with pytest.raises(QueueTimeoutError, match=r"no reply from kernel 'full' within 0\.05s"):
        await k.send_and_receive(Req(x=1), timeout=0.05)
    assert k._waiters == {}  # never accepted: nothing stays registered
    assert k.messages_received() == 1
    release.set()


async def test_a_reply_for_a_cancelled_caller_is_dropped_and_counted(
    kernels: list[RingKernel],
) -> None:
    release = asyncio.Event()

    async def held(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await release.wait()
            await ctx.send(Resp(y=msg.x))

    k = make(held)
    kernels.append(k)
    await k.launch()
    await k.activate()
    caller = asyncio.ensure_future(k.send_and_receive(Req(x=9)))
    await until(lambda: k.telemetry.messages_processed == 1, "request taken")
    release.set()  # the actor replies first...
    caller.cancel()  # ...to a caller that has just been cancelled
    with pytest.raises(asyncio.CancelledError):
        await caller
    # nobody waits for the reply any more: it is dropped and counted, never left to fill
    # the outbox
    await until(lambda: k.telemetry.messages_dropped == 1, "late reply counted")
    assert k.receive_nowait() is None
    assert k._waiters == {}


async def test_send_and_receive_refuses_a_non_message(kernels: list[RingKernel]) -> None:
    k = RingKernel("any", echo)
    kernels.append(k)
    await k.launch()
    await k.activate()
    with pytest.raises(TypeValidationError, match=r"send_and_receive.*got dict"):
        await k.send_and_receive({"x": 1}, timeout=1)  # type: ignore[arg-type]


async def test_plain_object_replies_do_not_break_correlated_callers(
    kernels: list[RingKernel],
) -> None:
    async def chatty(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await ctx.send({"note": "progress"})  # an untyped side output
            await ctx.send(Resp(y=msg.x))

    k = RingKernel("chatty", chatty)
    kernels.append(k)
    await k.launch()
    await k.activate()
    reply = await k.send_and_receive(Req(x=3), timeout=5)
    assert reply.y == 3
    assert await k.receive(timeout=5) == {"note": "progress"}


# --- managed_kernel --------------------------------------------------------------------


async def test_managed_kernel_launches_activates_and_terminates() -> None:
    async with managed_kernel("m", doubler, input_type=Req, output_type=Resp) as k:
        assert k.state is S.ACTIVE
        await k.send(Req(x=21))
        assert (await k.receive(timeout=5)).y == 42
        assert (await k.send_and_receive(Req(x=2), timeout=5)).y == 4
    assert k.state is S.TERMINATED
    assert k._task is not None
    assert k._task.done()


async def test_managed_kernel_terminates_on_error() -> None:
    with pytest.raises(RuntimeError, match="inside"):
        async with managed_kernel("m2", doubler) as k:
            raise RuntimeError("inside")
    assert k.state is S.TERMINATED


async def test_managed_kernel_passes_config() -> None:
    cfg = RingKernelConfig("m3", input_queue_size=7)
    async with managed_kernel("m3", doubler, config=cfg) as k:
        assert k.inbox is not None
        assert k.inbox.maxsize == 7


def _refuse_tasks(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
    raise RuntimeError("this loop's task factory refuses")


async def test_an_activate_whose_task_cannot_be_made_leaves_the_kernel_launched(
    kernels: list[RingKernel],
) -> None:
    k = RingKernel("k", doubler)
    kernels.append(k)
    await k.launch()
    loop = asyncio.get_running_loop()
    old = loop.get_task_factory()
    loop.set_task_factory(_refuse_tasks)
    try:
        with pytest.raises(RuntimeError, match="refuses"):
            await k.activate()
    finally:
        loop.set_task_factory(old)
    assert k.state is S.LAUNCHED  # not ACTIVE with no actor behind it
    await k.activate()
    await k.send(Req(x=4))
    assert (await k.receive(timeout=5)).y == 8


async def test_a_hosted_activate_whose_tasks_cannot_be_made_fails_and_stops_its_worker() -> None:
    from pydotcompute import RingKernelRuntime

    async with RingKernelRuntime() as rt:
        k = await rt.launch("t", _sync_echo, tier="thread")
        loop = asyncio.get_running_loop()
        old = loop.get_task_factory()
        loop.set_task_factory(_refuse_tasks)
        try:
            with pytest.raises(RuntimeError, match="refuses"):
                await rt.activate("t")
        finally:
            loop.set_task_factory(old)
        assert k.state is S.FAILED  # the worker thread had started: it is not LAUNCHED
        await rt.terminate("t")
        assert k.state is S.TERMINATED
        assert not k.worker.thread.is_alive()  # type: ignore[union-attr]


def _sync_echo(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.05)
        if msg is not None:
            ctx.send(msg)


# --- replies nobody waits for ------------------------------------------------------------


async def test_a_correlated_reply_nobody_waits_for_is_dropped_logged_once_not_queued(
    kernels: list[RingKernel], caplog: pytest.LogCaptureFixture
) -> None:
    """A second reply to a request already answered has no caller left: dropped and
    counted, never queued, and logged in one line for all five; the replies to a plain
    send still reach the outbox."""

    async def twice(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await ctx.send(Resp(y=msg.x))
            await ctx.send(Resp(y=-msg.x))

    k = RingKernel("twice", twice, input_type=Req, output_type=Resp)
    kernels.append(k)
    await k.launch()
    await k.activate()
    with caplog.at_level("WARNING", logger="pydotcompute"):
        for i in range(1, 6):
            assert (await k.send_and_receive(Req(x=i), timeout=5)).y == i
        await k.send(Req(x=7))  # a plain send: both replies are the outbox's
        assert [(await k.receive(timeout=5)).y for _ in range(2)] == [7, -7]
    assert k.receive_nowait() is None
    assert k.telemetry.drop_reasons() == {"reply_lost": 5}
    lines = [r.getMessage() for r in caplog.records if "nobody waits" in r.getMessage()]
    assert lines == [
        "kernel 'twice': dropped a reply nobody waits for: it answers a send_and_receive "
        "request whose caller timed out, was cancelled or has its reply already (counted "
        "in telemetry as dropped, reason 'reply_lost')"
    ]
    assert k.pending_requests == 0
