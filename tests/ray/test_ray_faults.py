"""Faults through RayRingKernelRuntime: a killed actor, a crashed worker, an actor that
raises, Ray's restart policy, and kernels Ray cannot start.

A lost Ray actor fails its kernel with `RayActorLostError` (its ``__cause__`` is Ray's
error); under ``restart="on_failure"`` Ray restarts it and the kernel goes on: callers
wait, they are not failed."""

from __future__ import annotations

import asyncio

import pytest
import ray
from ray_test_actors import Doubled, Num, crash_on_negative, fail_on_negative

from pydotcompute import KernelState
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
)
from pydotcompute.ring_kernels.tiers.ray.worker import RayActorLostError

pytestmark = pytest.mark.ray


async def _until(predicate, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_killed_actor_is_failed_and_waiting_callers_get_an_error(ray_runtime):
    await ray_runtime.launch("rt_double")
    await ray_runtime.activate("rt_double")
    kernel = ray_runtime.get_kernel("rt_double")
    waiting = asyncio.ensure_future(ray_runtime.receive("rt_double"))  # no timeout
    await asyncio.sleep(0.3)
    ray.kill(kernel.actor)
    with pytest.raises(KernelFailedError, match="its Ray actor died") as info:
        await asyncio.wait_for(waiting, 30)
    assert isinstance(info.value.__cause__, RayActorLostError)
    assert isinstance(info.value.__cause__.__cause__, ray.exceptions.RayActorError)
    assert "ray.kill" in str(info.value)
    await _until(lambda: kernel.state is KernelState.FAILED)
    assert isinstance(kernel.error, RayActorLostError)
    with pytest.raises(KernelFailedError, match="cannot use kernel 'rt_double': it is FAILED"):
        await ray_runtime.send("rt_double", Num(value=1))
    with pytest.raises(KernelFailedError):
        await ray_runtime.send_and_receive("rt_double", Num(value=1))
    assert ray_runtime.get_summary()["failures"][0][0] == "rt_double"
    assert await ray_runtime.terminate("rt_double") == []
    assert kernel.state is KernelState.TERMINATED


async def test_idle_killed_actor_is_noticed_without_a_call(ray_runtime):
    await ray_runtime.launch("rt_double")
    kernel = ray_runtime.get_kernel("rt_double")
    ray.kill(kernel.actor)
    await _until(lambda: kernel.state is KernelState.FAILED, timeout=30)
    assert "killed by `ray.kill`" in str(kernel.error)


async def test_crashed_worker_fails_the_pending_request(ray_runtime):
    await ray_runtime.launch("crashy", crash_on_negative, input_type=Num, output_type=Doubled)
    await ray_runtime.activate("crashy")
    assert (await ray_runtime.send_and_receive("crashy", Num(value=2))).value == 4
    with pytest.raises(KernelFailedError, match="its Ray actor died") as info:
        await asyncio.wait_for(ray_runtime.send_and_receive("crashy", Num(value=-1)), 30)
    assert isinstance(info.value.__cause__, ray.exceptions.RayActorError)
    await _until(lambda: ray_runtime.get_kernel_state("crashy") is KernelState.FAILED)


async def test_actor_that_raises_is_failed_with_its_exception(ray_runtime):
    await ray_runtime.launch("picky", fail_on_negative, input_type=Num, output_type=Doubled)
    await ray_runtime.activate("picky")
    await ray_runtime.get_kernel("picky").send_batch([Num(value=1), Num(value=2), Num(value=-3)])
    assert (await ray_runtime.receive("picky", timeout=10)).value == 2  # replies made first
    assert (await ray_runtime.receive("picky", timeout=10)).value == 4
    with pytest.raises(
        KernelFailedError, match="the actor raised ValueError: negative value -3"
    ) as info:
        await ray_runtime.receive("picky", timeout=10)
    assert isinstance(info.value.__cause__, ValueError)
    kernel = ray_runtime.get_kernel("picky")
    await _until(lambda: kernel.state is KernelState.FAILED)
    assert isinstance(kernel.error, ValueError)
    with pytest.raises(KernelFailedError, match="negative value -3"):
        await ray_runtime.send("picky", Num(value=1))


async def test_actor_restart_policy_inside_the_actor(ray_runtime):
    await ray_runtime.launch(
        "picky",
        fail_on_negative,
        input_type=Num,
        output_type=Doubled,
        restart="on_failure",
        max_restarts=2,
    )
    await ray_runtime.activate("picky")
    await ray_runtime.send("picky", Num(value=-1))  # raises once; the actor restarts it
    assert (await ray_runtime.send_and_receive("picky", Num(value=5), timeout=10)).value == 10
    tel = ray_runtime.get_telemetry("picky")
    assert tel.restarts == 1
    assert ray_runtime.get_kernel_state("picky") is KernelState.ACTIVE


async def test_ray_restarts_a_killed_actor_under_on_failure(ray_runtime):
    await ray_runtime.launch("rt_double", restart="on_failure", max_restarts=1)
    await ray_runtime.activate("rt_double")
    kernel = ray_runtime.get_kernel("rt_double")
    assert (await ray_runtime.send_and_receive("rt_double", Num(value=1))).value == 2
    waiting = asyncio.ensure_future(ray_runtime.receive("rt_double"))
    await asyncio.sleep(0.3)
    ray.kill(kernel.actor, no_restart=False)
    # nothing fails: once Ray restarted the actor, the kernel goes on
    await _until(lambda: kernel.restarts == 1, timeout=60)
    await ray_runtime.send("rt_double", Num(value=5))
    assert (await asyncio.wait_for(waiting, 60)).value == 10
    reply = await asyncio.wait_for(ray_runtime.send_and_receive("rt_double", Num(value=3)), 60)
    assert reply.value == 6
    assert kernel.restarts == 1
    assert kernel.state is KernelState.ACTIVE
    assert ray_runtime.get_telemetry("rt_double").restarts == 1
    # the restart budget is spent: the next death is final
    ray.kill(kernel.actor, no_restart=False)
    await _until(lambda: kernel.state is KernelState.FAILED, timeout=30)


async def test_function_the_workers_cannot_import_is_reported_at_launch(ray_runtime):
    # this test module is not shipped to the Ray workers (only ray_test_actors is)
    with pytest.raises(
        InvalidConfigurationError,
        match=r"its Ray actor could not start .*every Ray worker must be able to import "
        r"'test_ray_faults'",
    ):
        await ray_runtime.launch("local", _local_actor, input_type=Num, output_type=Doubled)
    assert "local" not in ray_runtime


async def _local_actor(ctx):
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Doubled(value=msg.value))


# --- round 4: a restarting target on every edge kind ---------------------------------------


async def test_restarting_target_of_a_direct_edge_holds_its_source_back(ray_runtime):
    """a (asyncio) -> s (ray) -> t (ray, restart="on_failure") -> u (asyncio): t's actor
    is killed mid-stream. s's actor waits for Ray to restart t (backpressure: every send
    succeeds, no kernel fails), what died with t is counted (reason actor_lost), and the
    stream resumes by itself, in order, nothing twice."""
    from pydotcompute import RingKernelRuntime
    from tests import tier_scenarios as sc

    n = 3000
    async with asyncio.timeout(120), RingKernelRuntime() as rt:
        await rt.launch("a", sc.relay_async, input_type=sc.Job, output_type=sc.Job, queue_size=64)
        await rt.launch("s", sc.relay_async, input_type=sc.Job, output_type=sc.Job, tier="ray")
        await rt.launch(
            "t",
            sc.echo_async,
            input_type=sc.Job,
            output_type=sc.Done,
            tier="ray",
            restart="on_failure",
            max_restarts=None,
            queue_size=256,  # s's actor holds the rest: it has messages to push after the kill
        )
        await rt.launch("u", sc.relay_async, input_type=sc.Done, output_type=sc.Done)
        for src, dst in ("as", "st", "tu"):
            rt.connect(src, dst)
        for kid in "astu":
            await rt.activate(kid)
        assert rt.get_kernel("s").direct_edge == "t"
        t = rt.get_kernel("t")

        async def feed() -> None:
            for i in range(n):
                # a millisecond each at t: t holds messages when it is killed
                await rt.send("a", sc.Job(seq=i, payload="sleep:0.001"))

        feeding = asyncio.create_task(feed())
        got = [(await rt.receive("u", timeout=30)).seq for _ in range(300)]
        ray.kill(t.actor, no_restart=False)
        await feeding  # the sends waited while t restarted; none failed
        while True:  # read until the stream is drained
            try:
                got.append((await rt.receive("u", timeout=10)).seq)
            except TimeoutError:
                break
        assert t.restarts == 1
        for kid in "astu":
            assert rt.get_kernel_state(kid) is KernelState.ACTIVE, kid
        assert got == sorted(got), "out of order"
        assert len(got) == len(set(got)), "delivered twice"
        assert got[-1] == n - 1, "the stream did not resume"
        await asyncio.sleep(0.5)
        tels = {k: rt.get_telemetry(k) for k in "astu"}  # (starts s's report, a drop)
        await asyncio.sleep(0.5)
        tels = {k: rt.get_telemetry(k) for k in "astu"}
        lost = sum(tel.drop_reasons().get("actor_lost", 0) for tel in tels.values())
        dropped = sum(tel.messages_dropped for tel in tels.values())
        assert lost > 0  # the point of the test: t held messages when it was killed
        assert dropped == lost
        # each message read once or counted once (at most once for those lost with t)
        assert len(got) + dropped == n, (len(got), dropped)
        report = await rt.shutdown()
        assert sum(report.values()) == lost, report
