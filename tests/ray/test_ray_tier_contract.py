"""The tier contract's scenarios through the compatibility class `RayRingKernelRuntime`.

The same scenarios (`tests/tier_scenarios.py`) run through `RingKernelRuntime(...,
tier="ray")` in `test_ray_tier.py`; here they pin the older entry point, with the asyncio
actors, each kernel in a Ray actor that hosts a runtime of its own.
"""

from __future__ import annotations

from pydotcompute.distributed.ray import RayRingKernelRuntime
from tests import tier_scenarios as sc

RAY = sc.TierCase("asyncio", sc.echo_async, sc.plain_def_actor, make_runtime=RayRingKernelRuntime)


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


async def test_restarts_account_for_every_message() -> None:
    await sc.scenario_restarts_account_for_every_message(RAY)
