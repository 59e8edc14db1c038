"""The hardware check script parses and plans its steps without a GPU (``--dry-run``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_every_step_plans_under_ten_minutes() -> None:
    out = _run("--dry-run", "all")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["steps"]
    names = [s["step"] for s in plan]
    assert names == ["versions", "compile", "probe", "suite", "bench-quick", "bench", "soak"]
    assert all(0 < s["limit_s"] < 600 for s in plan)
    assert sum(s["limit_s"] for s in plan) <= 32 * 60


def test_steps_can_be_given_as_a_list() -> None:
    out = _run("--dry-run", "versions,compile", "probe")
    assert [s["step"] for s in json.loads(out.stdout)["steps"]] == ["versions", "compile", "probe"]


def test_an_unknown_step_is_refused_with_the_choices() -> None:
    out = _run("--dry-run", "benchmark")
    assert out.returncode != 0
    assert "unknown step 'benchmark'" in out.stderr
    assert "bench-quick" in out.stderr


@pytest.mark.parametrize("step", ["versions", "compile", "probe", "suite", "soak"])
def test_every_step_has_a_child(step: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert {k for k in mod.CHILD_STEPS if not k.startswith("_")} == set(mod.STEPS)
    assert callable(mod.CHILD_STEPS[step])


def test_the_watchdog_prints_where_a_step_hangs_and_ends_it(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", "_hang", "--limit", "22", "--result", str(result)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "Timeout (0:00:02)!" in out.stderr
    assert "in _hang" in out.stderr  # the stack of the hanging step
