"""The quick start of DESIGN.md section 1, run verbatim in a fresh interpreter: it prints 6.0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Verbatim from DESIGN.md section 1 ("What users write (must work verbatim)").
QUICK_START = """\
import asyncio
from pydotcompute import RingKernelRuntime, ring_kernel, message

@message
class ComputeRequest:
    values: list[float]

@message
class ComputeResponse:
    result: float

@ring_kernel(kernel_id="compute", input_type=ComputeRequest, output_type=ComputeResponse,
             queue_size=4096)
async def compute_actor(ctx):
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(ComputeResponse(result=sum(msg.values)))

async def main():
    async with RingKernelRuntime() as runtime:
        await runtime.launch("compute")      # phase 1: allocate queues and resources
        await runtime.activate("compute")    # phase 2: start processing
        await runtime.send("compute", ComputeRequest(values=[1.0, 2.0, 3.0]))
        response = await runtime.receive("compute")
        print(response.result)               # 6.0

asyncio.run(main())
"""


def run_script(path: Path, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYDOTCOMPUTE_NO_UVLOOP"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "-W", "error", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=path.parent,  # not the repository: the package must come from the path
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "env",
    [{}, {"PYDOTCOMPUTE_NO_UVLOOP": "1"}],
    ids=["default-loop", "plain-asyncio"],
)
def test_quick_start_prints_six(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "quick_start.py"
    script.write_text(QUICK_START)
    proc = run_script(script, **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "6.0\n"
    assert proc.stderr == ""  # no warnings, no "Task was destroyed", no log noise


def test_demo_command_runs_the_quick_start_actor() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pydotcompute", "demo"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "sum([1.0, 2.0, 3.0]) computed by the actor: 6.0" in proc.stdout
    loop_line = next(line for line in proc.stdout.splitlines() if line.startswith("loop: "))
    assert loop_line.startswith(("loop: uvloop (", "loop: asyncio (")), loop_line


def test_demo_names_uvloop_by_its_module() -> None:
    from pydotcompute._demo import describe_loop

    assert describe_loop({"loop_type": "Loop", "loop_module": "uvloop"}) == "uvloop (Loop)"
    assert (
        describe_loop({"loop_type": "_UnixSelectorEventLoop", "loop_module": "asyncio.unix_events"})
        == "asyncio (_UnixSelectorEventLoop)"
    )
