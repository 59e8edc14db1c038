"""The tier contract's scenarios (`tests/tier_scenarios.py`) on a local Ray instance.

Every scenario, as `tests/scenario_base.py` lists it for every tier, runs twice: through
`RingKernelRuntime` with ``tier="ray"`` (id ``tier``, on uvloop's event loop), and through
`RayRingKernelRuntime` (id ``ray-runtime``, on asyncio's: every kernel it launches runs on
the Ray tier, the asyncio tier inside the Ray actor). The two are one runtime (the second
only builds the first with Ray options), so each scenario meets Ray on both loops without
running twice per loop, which would double the slowest file of the suite. Both cases are
named ``ray``: the tier's actor hands its replies to the hosting bridge on the driver, so
the scenarios treat it as a tier whose actor does not itself block in ``ctx.send``. A
scenario that cannot apply to Ray skips with the reason (`SKIPS`); a known gap of the Ray
tier is marked xfail, strict, with what goes wrong (`GAPS`).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from pydotcompute.distributed.ray import RayRingKernelRuntime
from tests import tier_scenarios as sc
from tests.scenario_base import scenario_params

pytestmark = pytest.mark.ray

#: Seconds leaving a scenario's ``async with`` gives the shutdown of a runtime with Ray
#: kernels: each stop is a call to a Ray actor (`tier_scenarios.EXIT_TIMEOUT_S`).
RAY_EXIT_S = 5.0


class ScenarioRayRuntime(sc.ExitsWithin, RayRingKernelRuntime):
    """`RayRingKernelRuntime` leaving ``async with`` within `RAY_EXIT_S`."""

    exit_timeout_s = RAY_EXIT_S


RAY_TIER = sc.TierCase(
    "ray",
    sc.echo_async,
    sc.plain_def_actor,
    make_runtime=functools.partial(sc.ScenarioRuntime, exit_timeout=RAY_EXIT_S),
)
RAY_RUNTIME = sc.TierCase("ray", sc.echo_async, sc.plain_def_actor, make_runtime=ScenarioRayRuntime)

# -- scenarios that cannot apply to Ray (skipped), and known gaps (xfail) ------------------

NO_TRACING_OPTION = (
    "RayRingKernelRuntime takes no tracing option; a RingKernelRuntime(tracing=True) "
    "driver (the tier case) makes its Ray actors' runtimes trace"
)
SPANS_IN_ACTORS = (
    "a Ray kernel's process spans are recorded by the runtime inside its Ray actor (the "
    "asyncio tier's context, which the asyncio case pins), in a process whose tracer "
    "provider this test cannot read"
)


IN_ACTOR = {
    "shutdown_from_inside_an_actor_is_refused": "the actor closes over the driver's runtime "
    "object, which cannot be shipped to a Ray actor",
}
CLOSURE_SINK = (
    "the last stage counts into a list of the test process (a closure); on a "
    "RayRingKernelRuntime every stage runs in a Ray actor, in another process"
)
#: case id -> scenario -> what goes wrong on Ray
GAPS: dict[str, dict[str, str]] = {
    "ray-runtime": {
        "shutdown_of_a_cycle_keeps_what_it_cannot_forward": (
            "an actor forwards through a bridge (RemotePeer) that counts a message as sent once "
            "it takes it; a batch the stopped target refuses is known only later, and a push "
            "answer does not say which of its messages were refused by the stop (a full "
            "reject inbox skips single ones), so they are counted as lost (reply_lost, in the "
            "shutdown report) instead of kept in the sender's outbox"
        ),
    },
}
#: case id -> scenario -> reason it is skipped there
SKIPS: dict[str, dict[str, str]] = {
    "tier": {**IN_ACTOR, "failed_message_spans_say_so": SPANS_IN_ACTORS},
    "ray-runtime": {
        "shutdown_drains_pipeline_head_to_tail": CLOSURE_SINK,
        "unordered_shutdown_counts_drops_in_one_line": CLOSURE_SINK,
        "tracing_lets_go_of_dropped_and_refused_messages": NO_TRACING_OPTION,
        "failed_message_spans_say_so": NO_TRACING_OPTION,
        **IN_ACTOR,
    },
}
CASES = {"tier": RAY_TIER, "ray-runtime": RAY_RUNTIME}


async def _run(
    scenario: Any, case: sc.TierCase, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    if scenario is sc.scenario_abandoned_requests_bounded:
        # the bound is the driver's (the bridge keeps the registrations, as on every
        # hosted tier); a smaller one takes 1,500 Ray calls instead of 12,500 (about 40 s)
        from pydotcompute.ring_kernels import kernel, lifecycle

        monkeypatch.setattr(kernel, "ABANDONED_REQUESTS_KEPT", 512)
        monkeypatch.setattr(lifecycle, "ABANDONED_REQUESTS_KEPT", 512)
    await scenario(case, **kwargs)


def _params(case_id: str) -> list[Any]:
    return scenario_params(
        {case_id: CASES[case_id]},
        {case_id: SKIPS.get(case_id, {})},
        {case_id: GAPS.get(case_id, {})},
    )


@pytest.mark.asyncio(loop_factories=["uvloop"])
@pytest.mark.parametrize(("scenario", "case", "kwargs"), _params("tier"))
async def test_scenario_on_uvloop(
    scenario: Any, case: sc.TierCase, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    await _run(scenario, case, kwargs, monkeypatch)


@pytest.mark.asyncio(loop_factories=["asyncio"])
@pytest.mark.parametrize(("scenario", "case", "kwargs"), _params("ray-runtime"))
async def test_scenario_on_asyncio(
    scenario: Any, case: sc.TierCase, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    await _run(scenario, case, kwargs, monkeypatch)
