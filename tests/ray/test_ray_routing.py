"""Kernel-to-kernel routing actor to actor, resources passed to Ray, and shutdown."""

from __future__ import annotations

import asyncio

import pytest
import ray
from ray_test_actors import Doubled, Num, double_actor, relay_to_sink

from pydotcompute import KernelState
from pydotcompute.distributed.ray import RayRingKernelRuntime
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    TypeValidationError,
)

pytestmark = pytest.mark.ray


async def _launch_all(runtime, *kernel_ids, activate=True):
    """Launch registered kernels side by side (each Ray actor start costs seconds)."""
    await asyncio.gather(*(runtime.launch(kid) for kid in kernel_ids))
    if activate:
        await asyncio.gather(*(runtime.activate(kid) for kid in kernel_ids))


async def test_connect_forwards_actor_to_actor_in_order(ray_runtime):
    await _launch_all(ray_runtime, "rt_double", "rt_inc")
    ray_runtime.connect("rt_double", "rt_inc")
    await ray_runtime.get_kernel("rt_double").send_batch([Num(value=i) for i in range(500)])
    got = []
    while len(got) < 500:
        got += await ray_runtime.get_kernel("rt_inc").receive_batch(1000, timeout=10)
    assert [m.value for m in got] == [2 * i + 1 for i in range(500)]
    # the driver carried control only: nothing of rt_double's came back to it
    assert ray_runtime.get_kernel("rt_double").direct_edge == "rt_inc"
    assert ray_runtime.get_kernel("rt_double").worker.replies_fetched == 0
    # what its actor handed on is counted as it reports it (each read asks for more)
    deadline = asyncio.get_running_loop().time() + 10
    while ray_runtime.get_telemetry("rt_double").messages_sent < 500:
        assert asyncio.get_running_loop().time() < deadline, "never reported"
        await asyncio.sleep(0.02)
    tel = ray_runtime.get_telemetry("rt_double")
    assert tel.messages_sent == 500
    assert tel.queue_depth == 0


async def test_terminating_a_pipeline_loses_nothing(ray_runtime):
    await _launch_all(ray_runtime, "rt_double", "rt_inc")
    ray_runtime.connect("rt_double", "rt_inc")
    await ray_runtime.get_kernel("rt_double").send_batch([Num(value=i) for i in range(300)])
    report = await ray_runtime.terminate_all(timeout=30)  # upstream first
    assert report == {}
    got = await ray_runtime.get_kernel("rt_inc").receive_batch(1000, timeout=5)
    assert [m.value for m in got] == [2 * i + 1 for i in range(300)]


async def test_connect_checks_message_types(ray_runtime):
    await asyncio.gather(
        ray_runtime.launch("rt_double"),
        ray_runtime.launch("other", double_actor, input_type=Num, output_type=Doubled),
    )
    with pytest.raises(
        TypeValidationError,
        match="cannot connect 'rt_double' -> 'other': 'rt_double' sends Doubled but 'other' "
        "expects Num",
    ):
        ray_runtime.connect("rt_double", "other")
    with pytest.raises(InvalidConfigurationError, match="cannot connect kernel 'other' to itself"):
        ray_runtime.connect("other", "other")


async def test_disconnect_sends_output_to_the_outbox_again(ray_runtime):
    await _launch_all(ray_runtime, "rt_double", "rt_inc")
    ray_runtime.connect("rt_double", "rt_inc")
    assert (await ray_runtime.send_and_receive("rt_double", Num(value=1))).value == 2
    await ray_runtime.send("rt_double", Num(value=2))
    assert (await ray_runtime.receive("rt_inc", timeout=10)).value == 5
    ray_runtime.disconnect("rt_double")
    await ray_runtime.send("rt_double", Num(value=3))
    assert (await ray_runtime.receive("rt_double", timeout=10)).value == 6


async def test_send_to_reaches_a_kernel_in_another_actor(ray_runtime):
    await asyncio.gather(
        ray_runtime.launch("relay", relay_to_sink, input_type=Num),
        ray_runtime.launch("sink", double_actor, input_type=Num, output_type=Doubled),
    )
    for kid in ("relay", "sink"):
        await ray_runtime.activate(kid)
    await ray_runtime.get_kernel("relay").send_batch([Num(value=i) for i in range(20)])
    got = []
    while len(got) < 20:
        got += await ray_runtime.get_kernel("sink").receive_batch(100, timeout=10)
    assert [m.value for m in got] == [2 * (i + 1000) for i in range(20)]


async def test_send_to_an_unknown_kernel_fails_the_sender(ray_runtime):
    await ray_runtime.launch("relay", relay_to_sink, input_type=Num)
    await ray_runtime.activate("relay")
    await ray_runtime.send("relay", Num(value=1))
    with pytest.raises(
        KernelFailedError, match=r"unknown kernel id 'sink' in the Ray runtime; known ids: 'relay'"
    ):
        await ray_runtime.receive("relay", timeout=20)


async def test_resource_requests_pass_through_to_ray(ray_runtime):
    # num_cpus and resources come from @ring_kernel(...); the launch call overrides one
    await ray_runtime.launch("rt_where", resources={"pdc_slot": 2})
    await ray_runtime.activate("rt_where")
    kernel = ray_runtime.get_kernel("rt_where")
    assert kernel.ray_options == {
        "num_cpus": 1,
        "resources": {"pdc_slot": 2},
        "max_concurrency": 64,
    }
    reply = await ray_runtime.send_and_receive("rt_where", Num(value=0), timeout=10)
    node, _pid, assigned = reply.text.split("|")
    assert node == ray.get_runtime_context().get_node_id()
    assert "'CPU': 1.0" in assigned
    assert "'pdc_slot': 2.0" in assigned


async def test_actor_options_are_checked(ray_runtime):
    with pytest.raises(InvalidConfigurationError, match="max_concurrency must be an int >= 4"):
        await ray_runtime.launch("rt_double", max_concurrency=1)


async def test_resources_the_cluster_lacks_are_refused_at_launch(ray_runtime):
    with pytest.raises(InvalidConfigurationError, match="asks Ray for 1 GPU but the cluster has 0"):
        await ray_runtime.launch("rt_double", num_gpus=1)
    with pytest.raises(
        InvalidConfigurationError, match="asks Ray for 5 pdc_slot but the cluster has 2"
    ):
        await ray_runtime.launch("rt_double", resources={"pdc_slot": 5})
    assert len(ray_runtime) == 0


async def test_shutdown_releases_every_actor_it_created():
    runtime = RayRingKernelRuntime()
    async with runtime:
        await _launch_all(runtime, "rt_double", "rt_inc", activate=False)
        await runtime.activate("rt_double")  # rt_inc stays launched, never activated
        await runtime.send("rt_double", Num(value=1))
        kernels = [runtime.get_kernel(k) for k in ("rt_double", "rt_inc")]
        for k in kernels:
            ray.get_actor(k.actor_name)  # exists while running
    for k in kernels:
        assert k.state is KernelState.TERMINATED
        with pytest.raises(ValueError, match="Failed to look up actor"):
            _lookup_until_gone(k.actor_name)
        with pytest.raises(ray.exceptions.RayActorError):
            await _call_until_dead(k.actor)


async def _call_until_dead(actor):
    """Call the actor until Ray says it is dead: ``ray.kill`` is asynchronous, and a call
    racing the kill can still be answered (bounded, like ``_lookup_until_gone``)."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await actor.state.remote()  # raises RayActorError once the actor is gone
        await asyncio.sleep(0.05)


def _lookup_until_gone(name):
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ray.get_actor(name)  # raises ValueError once the actor is gone
        time.sleep(0.05)
