"""``python -m pydotcompute``: every error is one line that names the fix, never a traceback.

Each case runs the real command in a child interpreter and reads its exit status and
standard error, as a shell user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 120.0


def cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["-c", code, *args] if code else ["-m", "pydotcompute", *args]
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=BOUND_S, env=env
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# `python -m pydotcompute ARGS` with one module made unimportable, as on an installation
# without the extra that ships it
WITHOUT = (
    "import runpy, sys\n"
    "sys.modules[{module!r}] = None\n"
    "sys.argv = ['pydotcompute', *sys.argv[1:]]\n"
    "runpy.run_module('pydotcompute', run_name='__main__', alter_sys=True)\n"
)


@pytest.mark.parametrize("module", ["rich", "prometheus_client"])
def test_top_without_the_extra_is_one_line_naming_it(module: str) -> None:
    proc = cli("top", "--once", code=WITHOUT.format(module=module))
    line = one_line_error(proc)
    assert proc.returncode == 1
    assert 'pip install "pydotcompute[observability]"' in line, line
    assert module in line, line


def test_top_help_needs_no_extra() -> None:
    proc = cli("top", "--help", code=WITHOUT.format(module="rich"))
    assert proc.returncode == 0, proc.stderr
    assert "--max-body-mib" in proc.stdout


@pytest.mark.parametrize("args", [("info",), ("bench", "--list")])
def test_a_closed_pipe_ends_quietly(args: tuple[str, ...]) -> None:
    """``python -m pydotcompute info | head -2``: the reader went away before the end."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the first write: every write meets a broken pipe
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pydotcompute", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=BOUND_S,
            env=env,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141  # as a shell reports a writer stopped by SIGPIPE


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("nonesuch",), "invalid choice: 'nonesuch'"),
        (("info", "--verbose"), "unrecognized arguments: --verbose"),
        (("demo", "extra"), "unrecognized arguments: extra"),
        (("top", "--bogus"), "unrecognized arguments: --bogus"),
        (("bench", "--bogus"), "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_are_one_line(args: tuple[str, ...], expected: str) -> None:
    proc = cli(*args)
    line = one_line_error(proc)
    assert proc.returncode == 2
    assert expected in line, line
    assert "--help" in line, line
