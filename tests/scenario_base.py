"""The tier contract's one listing: which scenario runs on which tier, and why not.

The contract is every ``scenario_*`` coroutine of ``tests/tier_scenarios.py`` whose first
parameter is a `TierCase`, found by introspection in the order they are written: a
scenario added there runs on every tier the moment it exists. A tier's test file names its
cases and one table of what each case skips (with the reason) or does not pass yet (a
known gap: xfail, strict, so a gap that closes fails the run until its entry is removed),
and runs `scenario_params` through one test:

```python
pytestmark = all_loops()  # every scenario on asyncio's loop and on uvloop's

@pytest.mark.parametrize(("scenario", "case", "kwargs"), scenario_params(CASES, SKIPS))
async def test_scenario(scenario, case, kwargs):
    await scenario(case, **kwargs)
```

Two rules hold for every file and are not repeated in the tables: a scenario of the
restart policy skips on a tier that refuses ``restart="on_failure"`` (the refusal itself
is `scenario_restart_on_failure`), and a scenario of a pool skips outside
``tests/integration/test_pool.py``, which runs it on each tier's pool. Scenarios of another
case type (`EdgeCase`, run by ``tests/integration/test_direct_edges.py``) are not listed.

Design note: a table entry naming no scenario (a typo, or a scenario renamed or removed)
fails the collection, so a skip cannot outlive the scenario it excused.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from tests import tier_scenarios as sc

#: Keyword-only scenario parameters and the values each scenario runs with, as
#: ``(test id, value)``: a scenario taking one runs once per value.
VARIANTS: dict[str, tuple[tuple[str, Any], ...]] = {
    "serialize": (("objects", False), ("serialized", True)),
}

#: Scenarios of the restart policy: a tier that refuses ``restart="on_failure"`` at launch
#: has nothing to run (`scenario_restart_on_failure` pins the refusal on it).
RESTART_ONLY = frozenset(
    {
        "restart_intensity",
        "restarted_request_error_does_not_say_active",
        "restarts_account_for_every_message",
    }
)

#: Scenarios of a pool (``replicas`` > 1), and where they run.
POOL_ONLY = {
    "pool_routes_around_a_returned_replica": (
        "needs a pool whose replica returns (replicas=2): tests/integration/test_pool.py "
        "runs it on each tier's pool"
    ),
}

Scenario = Callable[..., Any]


def _is_contract_scenario(name: str, fn: Any) -> bool:
    if not name.startswith("scenario_") or not inspect.iscoroutinefunction(fn):
        return False
    first = next(iter(inspect.signature(fn).parameters.values()), None)
    return first is not None and first.annotation in ("TierCase", sc.TierCase)


def scenarios() -> dict[str, Scenario]:
    """Short name (``scenario_`` taken off) -> scenario, in the order they are written."""
    return {
        name.removeprefix("scenario_"): fn
        for name, fn in vars(sc).items()
        if _is_contract_scenario(name, fn)
    }


def _names_used(code: Any) -> set[str]:
    """The global names ``code`` and the functions nested in it refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names_used(const)
    return names


def calls(fn: Scenario, method: str) -> bool:
    """Whether scenario ``fn``, or a function of ``tier_scenarios`` it uses (and so on),
    calls ``method`` (found by name in their code)."""
    seen: set[str] = set()
    todo = [fn]
    while todo:
        code = todo.pop().__code__
        used = _names_used(code)
        if method in used:
            return True
        for name in used - seen:
            seen.add(name)
            helper = vars(sc).get(name)
            if inspect.isfunction(helper) and helper.__module__ == sc.__name__:
                todo.append(helper)
    return False


def _variants(short: str, fn: Scenario) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(id suffix, keyword arguments)`` for each run of ``fn``."""
    params = inspect.signature(fn).parameters.values()
    names = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(
            f"scenario_{short} takes keyword(s) {unknown} that tests/scenario_base.py does "
            f"not know the values of; add them to VARIANTS (known: {sorted(VARIANTS)})"
        )
    for combo in itertools.product(*(VARIANTS[n] for n in names)):
        suffix = "".join(f"-{vid}" for vid, _ in combo)
        yield suffix, {n: value for n, (_, value) in zip(names, combo, strict=True)}


def skip_reason(short: str, case: sc.TierCase, table: Mapping[str, str]) -> str | None:
    """Why ``case`` skips scenario ``short``: its file's table, then the rules of every
    file (restart policy, pools); None when it runs."""
    if short in table:
        return table[short]
    if short in RESTART_ONLY and case.name not in sc.RESTARTS:
        return f"the {case.name} tier refuses restart='on_failure' at launch"
    return POOL_ONLY.get(short)


def _check_names(what: str, table: Mapping[str, Mapping[str, str]], cases: Any) -> None:
    known = scenarios()
    for case_id, entries in table.items():
        if case_id not in cases:
            raise ValueError(f"{what} names case {case_id!r}; the cases are {sorted(cases)}")
        stale = sorted(set(entries) - set(known))
        if stale:
            raise ValueError(
                f"{what}[{case_id!r}] names no scenario of tests/tier_scenarios.py: {stale} "
                "(renamed or removed? drop or fix the entry)"
            )


def scenario_params(
    cases: Mapping[str, sc.TierCase],
    skips: Mapping[str, Mapping[str, str]] | None = None,
    gaps: Mapping[str, Mapping[str, str]] | None = None,
) -> list[Any]:
    """One ``pytest.param(scenario, case, kwargs)`` per scenario, case and variant.

    Args:
        cases: Case id -> the case (the id goes in the test id).
        skips: Case id -> short scenario name -> why the case cannot run it.
        gaps: Case id -> short scenario name -> what goes wrong (xfail, strict).

    Test ids read ``<scenario>-<case id>[-<variant>]``, e.g.
    ``bad_field_is_not_a_poison_pill-process-spin-serialized``.

    Raises:
        ValueError: a table names an unknown case or scenario, or a scenario takes a
            keyword `VARIANTS` does not list.
    """
    skips = skips or {}
    gaps = gaps or {}
    _check_names("skips", skips, cases)
    _check_names("gaps", gaps, cases)
    out = []
    for short, fn in scenarios().items():
        for case_id, case in cases.items():
            marks: list[Any] = []
            reason = skip_reason(short, case, skips.get(case_id, {}))
            if reason is not None:
                marks.append(pytest.mark.skip(reason=reason))
            gap = gaps.get(case_id, {}).get(short)
            if gap is not None:
                marks.append(pytest.mark.xfail(reason=f"known gap: {gap}", strict=True))
            for suffix, kwargs in _variants(short, fn):
                out.append(
                    pytest.param(fn, case, kwargs, id=f"{short}-{case_id}{suffix}", marks=marks)
                )
    return out
