"""The tier contract's scenarios on the `"ray"` tier of `RingKernelRuntime`.

The same scenarios as `test_ray_tier_contract.py` (which drives them through the
compatibility class `RayRingKernelRuntime`), launched with `tier="ray"` on the ordinary
runtime; plus what is particular to the tier: placement options, mixed pipelines.
"""

from __future__ import annotations

import asyncio

import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import InvalidConfigurationError
from pydotcompute.ring_kernels import KernelState
from tests import tier_scenarios as sc

RAY = sc.TierCase("ray", sc.echo_async, sc.plain_def_actor)


async def test_receive_on_launched_kernel() -> None:
    await sc.scenario_receive_on_launched_kernel(RAY)


async def test_abandoned_replies_do_not_wedge() -> None:
    await sc.scenario_abandoned_replies_do_not_wedge(RAY)


async def test_terminate_with_unread_replies() -> None:
    await sc.scenario_terminate_with_unread_replies(RAY)


async def test_drop_oldest_counted() -> None:
    await sc.scenario_drop_oldest_counted(RAY)


async def test_wrong_actor_kind_refused() -> None:
    await sc.scenario_wrong_actor_kind_refused(RAY)


async def test_cancel_send_and_receive_loops() -> None:
    await sc.scenario_cancel_send_and_receive_loops(RAY)


async def test_failure_reports_each_message_once() -> None:
    await sc.scenario_failure_reports_each_message_once(RAY)


async def test_message_in_hand_at_grace_end() -> None:
    await sc.scenario_message_in_hand_at_grace_end(RAY)


async def test_oversized_message() -> None:
    await sc.scenario_oversized_message(RAY)


async def test_bad_field_is_not_a_poison_pill() -> None:
    await sc.scenario_bad_field_is_not_a_poison_pill(RAY, serialize=True)


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


async def test_same_request_object_twice() -> None:
    await sc.scenario_same_request_object_twice(RAY)


async def test_restarts_account_for_every_message() -> None:
    await sc.scenario_restarts_account_for_every_message(RAY)
