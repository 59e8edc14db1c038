"""Supervision policy: restart intensity and backoff, rate-limited logs, the stop order."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.ring_kernels import KernelState
from pydotcompute.ring_kernels.supervision import BurstLog, RestartIntensity, stop_waves

BOUND_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- stop order ------------------------------------------------------------------------------


def _waves(edges: dict[str, str | None], order: str) -> list[list[str]]:
    return stop_waves(list(order), lambda k: edges.get(k))


def test_a_chain_stops_head_to_tail() -> None:
    # launched tail first: the order still follows the edges
    assert _waves({"a": "b", "b": "c"}, "cba") == [["a"], ["b"], ["c"]]


def test_unconnected_kernels_stop_together() -> None:
    assert _waves({"a": "b"}, "abxy") == [["a", "x", "y"], ["b"]]


def test_fan_in_waits_for_every_feeder() -> None:
    edges = {"a": "m", "b": "n", "n": "m"}
    assert _waves(edges, "mnab") == [["a", "b"], ["n"], ["m"]]


def test_a_cycle_is_broken_at_the_kernel_launched_first() -> None:
    edges = {"b": "c", "c": "d", "d": "b"}
    assert _waves(edges, "cdb") == [["c"], ["d"], ["b"]]
    assert _waves(edges, "bcd") == [["b"], ["c"], ["d"]]


def test_a_tree_feeding_a_cycle_stops_its_leaves_first() -> None:
    edges = {"x": "a", "a": "b", "b": "a"}
    assert _waves(edges, "abx") == [["x"], ["a"], ["b"]]


# --- restart intensity ---------------------------------------------------------------------


def test_at_most_max_restarts_within_the_window() -> None:
    clock = Clock()
    budget = RestartIntensity(2, 1.0, clock=clock)
    assert budget.next_restart() == 0.0
    assert budget.next_restart() == 0.0
    assert budget.next_restart() is None  # a third within the second
    clock.now += 1.5  # the window has moved on
    assert budget.next_restart() == 0.0


def test_no_window_counts_the_whole_life() -> None:
    clock = Clock()
    budget = RestartIntensity(1, None, clock=clock)
    assert budget.next_restart() == 0.0
    clock.now += 1e6
    assert budget.next_restart() is None


def test_max_restarts_none_never_gives_up() -> None:
    budget = RestartIntensity(None, 0.001)
    assert all(budget.next_restart() is not None for _ in range(10_000))
    assert budget.describe() == "unlimited"


def test_backoff_doubles_in_a_crash_loop_up_to_its_cap_and_resets_on_progress() -> None:
    budget = RestartIntensity(None, None, backoff=0.01, backoff_max=0.05)
    pauses = [budget.next_restart(progressed=False) for _ in range(5)]
    assert pauses == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert budget.next_restart(progressed=True) == 0.01


# --- rate-limited log ------------------------------------------------------------------------


def test_a_burst_is_one_line_then_summaries(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = BurstLog(logging.getLogger("pydotcompute"), logging.WARNING, "%d more", 5.0, clock)
    with caplog.at_level(logging.WARNING, logger="pydotcompute"):
        for i in range(1000):
            log.event("event %d", i)
        clock.now += 6
        log.event("event %d", 1000)
        for _ in range(3):
            log.event("event")
    assert [r.getMessage() for r in caplog.records] == ["event 0", "event 1000; 999 more"]
    assert log.take_pending() == 3
    assert log.take_pending() == 0


# --- the runtime -------------------------------------------------------------------------------


@message
class Token:
    n: int


async def relay(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


async def test_a_connect_cycle_shuts_down_without_deadlock() -> None:
    async with asyncio.timeout(BOUND_S):
        rt = RingKernelRuntime()
        async with rt:
            for kid in ("b", "c"):
                await rt.launch(
                    kid, relay, input_type=Token, output_type=Token, queue_size=4, drain_timeout=1
                )
            rt.connect("b", "c")
            rt.connect("c", "b")
            for kid in ("b", "c"):
                await rt.activate(kid)
            for i in range(6):  # tokens that circulate until shutdown
                await rt.send("b", Token(i))
            await asyncio.sleep(0.05)
        assert {rt.get_kernel_state(k) for k in ("b", "c")} == {KernelState.TERMINATED}
        # terminated kernels leave kernel_ids (0.2's rule) but their telemetry stays readable;
        # what "c" could not forward into "b" (stopped first) stays readable in its outbox
        dropped = [rt.get_telemetry(k).messages_dropped for k in ("b", "c")]
        unread = [len(rt.take_unread(k)) for k in ("b", "c")]
        assert sum(dropped) + sum(unread) == 6  # each ends once
        assert rt.shutdown_report.unread == {k: n for k, n in zip("bc", unread, strict=True) if n}


async def test_unordered_shutdown_stops_everything_at_once() -> None:
    stopped: list[str] = []

    def recording(name: str) -> Any:
        async def actor(ctx: Any) -> None:
            try:
                while not ctx.should_terminate:
                    await ctx.send(await ctx.receive())
            finally:
                stopped.append(name)

        return actor

    for ordered, expected in ((True, ["a", "b"]), (False, ["b", "a"])):
        stopped.clear()
        async with asyncio.timeout(BOUND_S):
            rt = RingKernelRuntime()
            async with rt:
                await rt.launch("b", recording("b"), input_type=Token, output_type=Token)
                await rt.launch("a", recording("a"), input_type=Token, output_type=Token)
                rt.connect("a", "b")
                for kid in ("a", "b"):
                    await rt.activate(kid)
                await rt.shutdown(ordered=ordered)
        assert stopped == expected, (ordered, stopped)


async def test_shutdown_from_an_actor_task_of_its_own_works() -> None:
    """The way out the refusal names: schedule the shutdown as a task and keep going."""
    async with asyncio.timeout(BOUND_S):
        rt = RingKernelRuntime()
        tasks: list[asyncio.Task[Any]] = []

        async def stopper(ctx: Any) -> None:
            while not ctx.should_terminate:
                await ctx.receive()
                tasks.append(asyncio.get_running_loop().create_task(rt.shutdown()))

        await rt.start()
        await rt.launch("s", stopper, input_type=Token)
        await rt.activate("s")
        await rt.send("s", Token(1))
        while not tasks:
            await asyncio.sleep(0.01)
        assert await tasks[0] == {}
        assert rt.get_kernel_state("s") is KernelState.TERMINATED


async def test_restart_options_from_the_decorator_and_launch() -> None:
    from pydotcompute import ring_kernel

    @ring_kernel(
        kernel_id="supervised_relay",
        input_type=Token,
        output_type=Token,
        restart="on_failure",
        max_restarts=None,
        restart_window=2.0,
    )
    async def supervised_relay(ctx: Any) -> None:
        await relay(ctx)

    async with RingKernelRuntime() as rt:
        cfg = (await rt.launch("supervised_relay")).config  # from the registry
        assert (cfg.max_restarts, cfg.restart_window) == (None, 2.0)
        cfg = (await rt.launch("l", relay, restart="on_failure", max_restarts=None)).config
        assert cfg.max_restarts is None  # no limit, not the default 3
        cfg = (await rt.launch("w", relay, restart_window=None)).config
        assert (cfg.max_restarts, cfg.restart_window) == (3, None)
