"""What is particular to the `"ray"` tier of `RingKernelRuntime`: placement options,
resources, pipelines between Ray kernels and with kernels of other tiers, telemetry read
without waiting for the actor.

The shared scenarios of the tier contract run in `test_ray_tier_contract.py`.
"""

from __future__ import annotations

import asyncio

import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import InvalidConfigurationError
from pydotcompute.ring_kernels import KernelState
from tests import tier_scenarios as sc

pytestmark = pytest.mark.ray


async def test_pipeline_exactly_once() -> None:
    case = sc.TierCase("ray", sc.echo_async, sc.plain_def_actor)
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("a", case.echo, input_type=sc.Job, output_type=sc.Done, tier="ray")
        await rt.launch("b", sc.echo_async, input_type=sc.Done, output_type=sc.Done, tier="ray")
        rt.connect("a", "b")
        await rt.activate("a")
        await rt.activate("b")
        for i in range(50):
            await rt.send("a", sc.Job(seq=i))
        got = sorted([(await rt.receive("b", timeout=10)).seq for _ in range(50)])
        assert got == list(range(50))


async def test_placement_option_reaches_ray_and_id_is_reusable() -> None:
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        kernel = await rt.launch(
            "k", sc.echo_async, input_type=sc.Job, tier="ray", num_cpus=0, resources={"pdc_slot": 1}
        )
        assert kernel.ray_options["resources"] == {"pdc_slot": 1}
        await rt.activate("k")
        assert (await rt.send_and_receive("k", sc.Job(seq=7), timeout=10)).seq == 7
        await rt.terminate("k")
        rt.remove("k")
        await rt.launch("k", sc.echo_async, input_type=sc.Job, tier="ray", num_cpus=0)
        assert rt.get_kernel_state("k") is KernelState.LAUNCHED


async def test_resources_the_cluster_lacks_are_refused() -> None:
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        with pytest.raises(InvalidConfigurationError, match=r"asks Ray for 64 GPU"):
            await rt.launch("k", sc.echo_async, tier="ray", num_gpus=64)
        assert "k" not in rt


async def test_mixed_pipeline_in_order_exactly_once() -> None:
    """asyncio -> ray -> asyncio: the Ray kernel takes from and forwards to kernels of
    another tier, in order, each message once."""
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("a", sc.relay_async, input_type=sc.Done, output_type=sc.Done)
        await rt.launch("b", sc.relay_async, input_type=sc.Done, output_type=sc.Done, tier="ray")
        await rt.launch("c", sc.relay_async, input_type=sc.Done, output_type=sc.Done)
        rt.connect("a", "b")
        rt.connect("b", "c")
        for kid in "abc":
            await rt.activate(kid)
        for i in range(500):
            await rt.send("a", sc.Done(seq=i))
        got = [(await rt.receive("c", timeout=10)).seq for _ in range(500)]
        assert got == list(range(500))
        assert rt.get_telemetry("b").messages_dropped == 0


async def test_reading_telemetry_does_not_wait_for_a_busy_actor() -> None:
    """``get_telemetry`` answers at once, with what the actor last reported, while the
    actor is too busy to answer a Ray call (its loop blocked for 3 s)."""
    from ray_test_actors import Num, hogs_its_loop

    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("busy", hogs_its_loop, input_type=Num, tier="ray")
        await rt.activate("busy")
        assert (await rt.send_and_receive("busy", Num(value=1), timeout=10)).value == 2
        await rt.send("busy", Num(value=3000))
        await asyncio.sleep(0.3)  # it holds its loop now
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(3):
            tel = rt.get_telemetry("busy")
        waited = loop.time() - started
        assert waited < 0.5, f"reading telemetry waited {waited:.2f}s for the actor"
        assert tel.messages_processed == 2
        assert (await rt.receive("busy", timeout=10)).value == 6000
