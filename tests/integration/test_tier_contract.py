"""The tier contract, scenario by scenario, on every CPU tier through the runtime.

Every scenario of ``tests/tier_scenarios.py`` runs here on each case below, listed by
``tests/scenario_base.py`` as it lists them for the GPU (simulator) and Ray test processes;
`SKIPS` says what a case cannot run, and why. Every tier runs on both event loops
(asyncio's and uvloop's). The process-spin case, the process tier with
``reply_spin_us``, runs on uvloop only, the loop a deployed runtime uses: it changes only
how the loop polls for a reply, and the process cases are most of this file's time. Run
this file again with ``PYDOTCOMPUTE_PUREPYTHON=1`` for the process tier on the pure-Python
ring.
"""

from __future__ import annotations

from typing import Any

import pytest

from pydotcompute.testing import all_loops
from tests import tier_scenarios as sc
from tests.scenario_base import calls, scenario_params, scenarios

#: Cases run on both event loops, and cases run on uvloop only (see the module's note).
BOTH_LOOPS = {"asyncio": sc.ASYNCIO, "thread": sc.THREAD, "process": sc.PROCESS}
UVLOOP_ONLY = {"process-spin": sc.PROCESS_SPIN}
CASES = {**BOTH_LOOPS, **UVLOOP_ONLY}

NO_BRIDGE = "the asyncio tier has no bridge: its inbox is the only bound"
NO_REQUEST = (
    "reply_spin_us changes only send_and_receive, which this scenario never calls: the "
    "process case runs the same code"
)

#: case id -> scenario -> why that case skips it (besides `scenario_base`'s rules for
#: every file: the restart policy, pools)
SKIPS: dict[str, dict[str, str]] = {
    "asyncio": {
        "bridge_bound_holds": NO_BRIDGE,
        "priority_not_starved": "the asyncio tier serves its banded inbox directly",
        "batched_hand_over_keeps_promises": "the asyncio tier has no bridge: nothing is "
        "handed over",
        "urgent_passes_what_the_actor_holds": "the asyncio tier has no bridge: its actor "
        "reads the banded inbox itself (scenario priority_not_starved)",
    },
    "process-spin": {
        name: NO_REQUEST
        for name, scenario in scenarios().items()
        if not calls(scenario, "send_and_receive")
    },
}


def _params(cases: dict[str, sc.TierCase]) -> list[Any]:
    return scenario_params(cases, {k: v for k, v in SKIPS.items() if k in cases})


@all_loops()
@pytest.mark.parametrize(("scenario", "case", "kwargs"), _params(BOTH_LOOPS))
async def test_scenario(scenario: Any, case: sc.TierCase, kwargs: dict[str, Any]) -> None:
    await scenario(case, **kwargs)


@pytest.mark.asyncio(loop_factories=["uvloop"])
@pytest.mark.parametrize(("scenario", "case", "kwargs"), _params(UVLOOP_ONLY))
async def test_spin_scenario(scenario: Any, case: sc.TierCase, kwargs: dict[str, Any]) -> None:
    await scenario(case, **kwargs)


@pytest.fixture(params=[pytest.param(c, id=i) for i, c in CASES.items()])
def case(request: pytest.FixtureRequest) -> sc.TierCase:
    """Each case, for a contract test that is not a scenario of ``tier_scenarios``."""
    return request.param  # type: ignore[no-any-return]
