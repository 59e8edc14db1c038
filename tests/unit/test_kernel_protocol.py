"""The kernel's public protocol for tiers and for other kernels: the close-out helpers
(`hand_back`, `close_out`, `close_replies`), the `accept` protocol, the runtime's callables
(`lookup`, `on_failed`), the one actor-kind check, and the pool's use of the kernel's own
supervision loop."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from foundation_helpers import Req, Resp, crash_on_negative, doubler, until

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import (
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import KernelContext, KernelState, RingKernel
from pydotcompute.ring_kernels.tiers import actor_kind, check_actor_kind

# -- closing the books ----------------------------------------------------------------------


async def test_hand_back_keeps_counts_and_orders_once() -> None:
    k = RingKernel("k", doubler, input_type=Req)
    await k.launch()
    k.hand_back([Req(x=2), Req(x=3)])
    k.hand_back([Req(x=1)], at=0)  # older leftovers go first
    k.hand_back([])  # nothing: nothing counted
    assert [m.x for m in k.undelivered] == [1, 2, 3]
    assert k.telemetry.drop_reasons() == {"undelivered": 3}
    assert k.inbox.statistics().total_dropped == 3  # type: ignore[union-attr]
    await k.terminate()


async def test_close_out_hands_back_what_was_held_then_what_was_queued() -> None:
    closed: list[BaseException] = []

    class OwnReplies(RingKernel):
        """A tier with a reply channel of its own."""

        __slots__ = ()

        def close_replies(self, error: BaseException) -> None:
            closed.append(error)

    k = OwnReplies("k", doubler, input_type=Req)
    await k.launch()
    for i in (2, 3):
        await k.send(Req(x=i))
    refused = KernelStateError("k", KernelState.TERMINATED, "send to", "closed")
    left = k.close_out(refused, left=[Req(x=1)])
    assert [m.x for m in left] == [1, 2, 3]
    assert [m.x for m in k.undelivered] == [1, 2, 3]
    assert k.telemetry.messages_dropped == 3
    assert closed == [refused]  # the reply side closes once, with the send error by default
    with pytest.raises(KernelStateError):
        await k.send(Req(x=4))


async def test_terminate_and_failure_close_out_through_close_replies() -> None:
    seen: list[str] = []

    class Watching(RingKernel):
        __slots__ = ()

        def close_replies(self, error: BaseException) -> None:
            seen.append(type(error).__name__)
            super().close_replies(error)

    k = Watching("k", crash_on_negative, input_type=Req)
    await k.launch()
    await k.activate()
    await k.send(Req(x=-1))
    await until(lambda: k.state is KernelState.FAILED, "failed")
    await k.terminate()
    assert seen == ["KernelFailedError", "KernelStateError"]


# -- a tier's own steps in the shared verbs -------------------------------------------------


class _Placed(RingKernel):
    """A tier whose actor runs elsewhere: it overrides only the `_place_*` hooks, holding
    ``held`` messages of its own (as a device ring would)."""

    __slots__ = ("calls", "held", "stop_fails")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[Any] = []
        self.held: list[Any] = []
        self.stop_fails = False

    async def _place_launch(self) -> None:
        self.calls.append(("launch", self.state, self.inbox is None))

    async def _place_set_active(self, active: bool, operation: str) -> None:
        self.calls.append((operation, active, self.state))

    async def _place_stop(self, was: KernelState, grace: float) -> list[Any] | None:
        self.calls.append(("stop", was, grace, self.stopping))
        if self.stop_fails:
            self._fail(TimeoutError("the place did not stop"))
            return None
        held, self.held = self.held, []
        return held

    def _place_failed(self, exc: BaseException) -> list[Any]:
        self.calls.append(("failed", type(exc).__name__))
        held, self.held = self.held, []
        return held


async def test_verbs_call_the_tier_steps_before_changing_state() -> None:
    k = _Placed("k", doubler, input_type=Req)
    await k.launch()
    await k.activate()
    await k.deactivate()
    await k.reactivate()
    k.held = [Req(x=1)]
    await k.send(Req(x=2))
    await k.deactivate()  # the queued message stays queued until terminate
    left = await k.terminate(timeout=0.5)
    assert k.calls == [
        ("launch", KernelState.CREATED, True),  # before the queues are made
        ("activate", True, KernelState.LAUNCHED),
        ("deactivate", False, KernelState.ACTIVE),
        ("reactivate", True, KernelState.DEACTIVATED),
        ("deactivate", False, KernelState.ACTIVE),
        ("stop", KernelState.DEACTIVATED, 0.5, True),  # intake already closed
    ]
    assert [m.x for m in left] == [1]  # what the place held (the queued one was drained)
    assert [m.x for m in k.undelivered] == [1]
    assert k.telemetry.messages_dropped == 1
    assert k.state is KernelState.TERMINATED


async def test_failure_hands_back_what_the_place_held_first() -> None:
    k = _Placed("k", crash_on_negative, input_type=Req)
    await k.launch()
    for i in (-1, 2, 3):
        await k.send(Req(x=i))
    k.held = [Req(x=1)]
    await k.activate()
    await until(lambda: k.state is KernelState.FAILED, "failed")
    assert k.calls[-1] == ("failed", "ValueError")
    # the message it raised on, then what the place held, then what was queued
    assert [m.x for m in k.undelivered] == [-1, 1, 2, 3]
    assert k.inbox is not None
    assert k.inbox.statistics().total_dropped == 4
    assert k.state is KernelState.FAILED
    assert await k.terminate() == []  # handed back once, at the failure
    assert k.state is KernelState.TERMINATED


async def test_a_place_that_cannot_stop_leaves_the_kernel_failed() -> None:
    k = _Placed("k", doubler, input_type=Req)
    await k.launch()
    k.stop_fails = True
    assert await k.terminate() == []
    assert k.state is KernelState.FAILED
    assert isinstance(k.error, TimeoutError)


# -- what the kernel needs of its runtime -----------------------------------------------------


async def test_on_failed_is_called_once_with_the_kernel() -> None:
    failed: list[RingKernel] = []
    k = RingKernel("k", crash_on_negative, input_type=Req, on_failed=failed.append)
    await k.launch()
    await k.activate()
    await k.send(Req(x=-1))
    await until(lambda: k.state is KernelState.FAILED, "failed")
    assert failed == [k]
    assert isinstance(k.error, ValueError)
    await k.terminate()


async def test_send_to_uses_the_lookup_callable() -> None:
    target = RingKernel("target", doubler, input_type=Req)
    asked: list[str] = []

    def lookup(kernel_id: str) -> RingKernel:
        asked.append(kernel_id)
        if kernel_id != "target":
            raise KernelNotFoundError(kernel_id, ["target"])
        return target

    async def relay(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.send_to("target", await ctx.receive())

    k = RingKernel("k", relay, lookup=lookup)
    assert k.lookup is lookup
    for kernel in (target, k):
        await kernel.launch()
        await kernel.activate()
    await k.send(Req(x=4))
    assert (await target.receive(timeout=5)).y == 8
    assert asked == ["target"]
    for kernel in (k, target):
        await kernel.terminate()


async def test_send_to_outside_a_runtime_says_so() -> None:
    async def relay(ctx: KernelContext) -> None:
        await ctx.send_to("elsewhere", await ctx.receive())

    k = RingKernel("k", relay)
    assert k.lookup is None
    await k.launch()
    await k.activate()
    await k.send(Req(x=1))
    await until(lambda: k.state is KernelState.FAILED, "failed")
    assert "not managed by a RingKernelRuntime" in str(k.error)
    await k.terminate()


async def test_the_runtime_hands_its_kernels_lookup_and_on_failed() -> None:
    async with RingKernelRuntime() as rt:
        k = await rt.launch("k", crash_on_negative, input_type=Req)
        assert k.lookup is not None
        assert k.lookup("k") is k
        await rt.activate("k")
        await rt.send("k", Req(x=-1))
        await until(lambda: k.state is KernelState.FAILED, "failed")
        with pytest.raises(KernelFailedError):
            await rt.receive("k", timeout=5)


# -- the accept protocol ----------------------------------------------------------------------


async def test_a_subclass_overriding_the_older_name_is_reached_through_accept() -> None:
    taken: list[Any] = []

    class Older(RingKernel):
        __slots__ = ()

        async def _accept(self, msg: Any, timeout: float | None) -> None:
            taken.append(msg)

        def _accept_nowait(self, msg: Any) -> None:
            taken.append(msg)

    k = Older("k", doubler)
    await k.accept(Req(x=1))
    k.accept_nowait(Req(x=2))
    assert [m.x for m in taken] == [1, 2]


async def test_a_subclass_overriding_accept_is_reached_through_the_older_name() -> None:
    taken: list[Any] = []

    class Newer(RingKernel):
        __slots__ = ()

        async def accept(self, msg: Any, timeout: float | None = None) -> None:
            taken.append(msg)

        def accept_nowait(self, msg: Any) -> None:
            taken.append(msg)

    k = Newer("k", doubler)
    await k._accept(Req(x=1), None)
    k._accept_nowait(Req(x=2))
    assert [m.x for m in taken] == [1, 2]


async def test_a_connected_kernel_is_fed_through_its_public_accept() -> None:
    taken: list[Any] = []

    class Counting(RingKernel):
        __slots__ = ()

        async def accept(self, msg: Any, timeout: float | None = None) -> None:
            taken.append(msg)
            await super().accept(msg, timeout)

    async def forward(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.send(await ctx.receive())

    head = RingKernel("head", forward)
    tail = Counting("tail", doubler, input_type=Req)
    for kernel in (head, tail):
        await kernel.launch()
        await kernel.activate()
    head.forward_to(tail)  # after activation: the running actor's context follows
    await head.send(Req(x=3))
    assert (await tail.receive(timeout=5)).y == 6
    assert [m.x for m in taken] == [3]
    for kernel in (head, tail):
        await kernel.terminate()


# -- one actor-kind check ---------------------------------------------------------------------


async def _async_actor(ctx: Any) -> None:
    return None


async def _async_gen_actor(ctx: Any) -> Any:
    yield None


def _sync_actor(ctx: Any) -> None:
    return None


class _CallableActor:
    def __call__(self, ctx: Any) -> None:
        return None


def test_actor_kind_names_each_kind() -> None:
    assert actor_kind(_async_actor) == "async"
    assert actor_kind(_async_gen_actor) == "async"
    assert actor_kind(functools.partial(_async_actor)) == "async"
    assert actor_kind(_sync_actor) == "sync"
    assert actor_kind(functools.partial(functools.partial(_sync_actor))) == "sync"
    assert actor_kind(_CallableActor()) is None  # judged on first use


def test_check_actor_kind_says_what_the_tier_runs_and_what_to_do() -> None:
    with pytest.raises(TypeValidationError, match=r"the asyncio tier runs async functions"):
        check_actor_kind("k", "asyncio", _sync_actor, "async")
    with pytest.raises(TypeValidationError, match=r"the thread tier runs plain functions"):
        check_actor_kind("k", "thread", _async_actor, "sync")
    with pytest.raises(TypeValidationError, match=r"^kernel 'k': X runs plain, but .* is async!$"):
        check_actor_kind("k", "", _async_actor, "sync", runs="X runs plain", advice="!")
    check_actor_kind("k", "thread", _CallableActor(), "sync")
    check_actor_kind("k", "gpu", _sync_actor, None)  # not checked


# -- the pool runs on the kernel's supervision loop ------------------------------------------


async def test_a_pool_replica_restart_drops_the_message_as_actor_failed() -> None:
    async with RingKernelRuntime() as rt:
        k = await rt.launch(
            "pool",
            crash_on_negative,
            input_type=Req,
            output_type=Resp,
            replicas=2,
            restart="on_failure",
            restart_backoff=0.001,
        )
        await rt.activate("pool")
        await rt.send("pool", Req(x=-1))
        await rt.send("pool", Req(x=5))
        assert (await rt.receive("pool", timeout=5)).y == 10
        tel = rt.get_telemetry("pool")
        assert tel.restarts == 1
        assert tel.drop_reasons() == {"actor_failed": 1}
        assert sum(t.restarts for t in rt.get_replica_telemetry("pool")) == 1
        assert k.state is KernelState.ACTIVE
