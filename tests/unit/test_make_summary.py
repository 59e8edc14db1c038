"""tools/run_step.py: `make test` records every step and ends with one honest summary."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "run_step.py"


@pytest.fixture(scope="module")
def step() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_step", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "===== 1200 passed, 14 skipped in 301.22s (0:05:01) =====\n",
            "1200 passed, 14 skipped in 301.22s (0:05:01)",
        ),
        (
            "=========== 1200 passed, 14 skipped in 301.22s (0:05:01) ===========\n",
            "1200 passed, 14 skipped in 301.22s (0:05:01)",
        ),
        ("301 passed, 1036 deselected in 29.67s\n", "301 passed, 1036 deselected in 29.67s"),
        ("\x1b[32m2 failed, 5 passed in 1.00s\x1b[0m\n", "2 failed, 5 passed in 1.00s"),
        ("2 passed, 1 failed in 1.00s\n", "2 passed, 1 failed in 1.00s"),
        ("All checks passed!\n", "All checks passed!"),
        ("Found 3 errors.\n", "Found 3 errors."),
        ("Would reformat: pydotcompute/x.py\n", "Would reformat: pydotcompute/x.py"),
        (
            "Success: no issues found in 63 source files\n",
            "Success: no issues found in 63 source files",
        ),
        ("docs check: no raw reST on 26 pages\n", "docs check: no raw reST on 26 pages"),
        (
            "test-versions: no Python 3.13 on this machine: skipped\n",
            "test-versions: no Python 3.13 on this machine: skipped",
        ),
        ("tests/unit/test_x.py ....\n", None),
        ("passed the message on\n", None),
    ],
)
def test_picks_the_lines_that_say_how_a_step_went(
    step: ModuleType, line: str, expected: str | None
) -> None:
    assert step.results_of(line) == expected


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_records_steps_and_summarizes_them(
    step: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "steps.jsonl"
    ok = step.run("unit", _py("print('3 passed, 1 skipped in 0.50s')"), record)
    bad = step.run("lint", _py("import sys; print('Found 2 errors.'); sys.exit(1)"), record)
    assert (ok, bad) == (0, 1)
    entries = [json.loads(ln) for ln in record.read_text().splitlines()]
    assert [(e["step"], e["rc"], e["results"]) for e in entries] == [
        ("unit", 0, ["3 passed, 1 skipped in 0.50s"]),
        ("lint", 1, ["Found 2 errors."]),
    ]
    out = capsys.readouterr().out
    assert "3 passed, 1 skipped in 0.50s" in out  # the command's own output streams through
    assert step.summary(record) == 1  # a failed step fails the whole run
    table = capsys.readouterr().out
    assert "make test: summary" in table
    assert "unit  ok" in table
    assert "lint  FAILED (exit 1)" in table
    assert "FAILED: lint (1 of 2 ok)" in table


def test_summary_passes_only_when_every_step_passed(
    step: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "steps.jsonl"
    assert step.summary(record) == 1  # nothing ran: not a pass
    step.run("types", _py("print('Success: no issues found in 1 source file')"), record)
    assert step.summary(record) == 0
    assert "all 1 steps passed" in capsys.readouterr().out


def test_a_command_that_cannot_start_is_a_failed_step(step: ModuleType, tmp_path: Path) -> None:
    record = tmp_path / "steps.jsonl"
    assert step.run("ghost", [str(tmp_path / "no-such-program")], record) == 127
    assert json.loads(record.read_text())["rc"] == 127
