"""What is particular to the `"ray"` tier of `RingKernelRuntime`: placement options,
resources, pipelines between Ray kernels, mixed pipelines refused.

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


async def test_mixed_pipeline_refused_at_connect() -> None:
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("a", sc.echo_async, input_type=sc.Job, output_type=sc.Done, tier="ray")
        await rt.launch("b", sc.echo_async, input_type=sc.Done, output_type=sc.Done)
        with pytest.raises(InvalidConfigurationError, match=r"forwards only into another ray"):
            rt.connect("a", "b")
