"""The hardware check (tests/gpu/gpu_check.py) without a GPU: plan, budget, hang, wheels.

The check must end by itself inside its budget whatever a step does, leave a complete
``summary.json``, and install only the wheels the machine lacks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "gpu_check.py"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_plan_fits_the_device_call_limits() -> None:
    out = _run("--dry-run", "--probe-seconds", "7")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    names = [s["step"] for s in plan["steps"]]
    assert names == [
        *("install", "build", "smoke", "suite", "probe", "bench", "edge", "pagerank", "soak")
    ]
    assert plan["budget_s"] == 420  # fits a 10-minute command with room for the start
    assert all(0 < s["min_s"] <= s["limit_s"] < 600 for s in plan["steps"])
    probe = next(s for s in plan["steps"] if s["step"] == "probe")
    assert probe["limit_s"] == 7 + 45  # the probe's duration is a parameter
    assert [s["step"] for s in plan["steps"] if s["optional"]] == ["soak"]


def test_steps_can_be_chosen_and_unknown_ones_are_refused() -> None:
    out = _run("--dry-run", "--steps", "suite,smoke")
    assert [s["step"] for s in json.loads(out.stdout)["steps"]] == ["smoke", "suite"]
    out = _run("--dry-run", "--steps", "benchmark")
    assert out.returncode != 0
    assert "unknown step 'benchmark'" in out.stderr
    assert "pagerank" in out.stderr


def test_every_gpu_step_has_a_child(check: ModuleType) -> None:
    gpu_steps = {name for name, spec in check.STEPS.items() if spec[2]}
    assert set(check.CHILD_STEPS) == gpu_steps


def test_a_step_gets_what_is_left_and_is_skipped_when_too_little_is(check: ModuleType) -> None:
    class Opts:
        probe_seconds = 20.0

    later = ["probe", "bench", "edge", "pagerank", "soak"]
    # plenty of time: the longest limit, keeping the later required steps' shortest limits
    assert check.plan_limit("suite", 400.0, later, Opts) == 200
    # little time: what is left, down to the step's own shortest useful limit
    assert check.plan_limit("suite", 40.0, later, Opts) == pytest.approx(38.0)
    assert check.plan_limit("suite", 20.0, later, Opts) is None


def _wait_for_summary(path: Path, step: str, status: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            data = json.loads(path.read_text())  # always whole: written, then renamed
            entry = next(s for s in data["steps"] if s["name"] == step)
            if entry["status"] == status:
                return data
        time.sleep(0.05)
    raise AssertionError(f"{step} never became {status}: {path.read_text()}")


def test_a_hanging_step_is_cut_at_its_limit_and_the_summary_is_complete(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    empty = tmp_path / "wheels"
    empty.mkdir()
    env = dict(os.environ, PYDOTCOMPUTE_GPU_CHECK_HANG_STEP="smoke")
    cmd = [sys.executable, str(SCRIPT), "--out", str(out_dir), "--budget", "12"]
    cmd += ["--wheels", str(empty), "--site", str(tmp_path / "site"), "--no-build"]
    cmd += ["--steps", "install,smoke,suite,soak"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        # while the step hangs, the summary on disk is whole and says what runs
        running = _wait_for_summary(out_dir / "summary.json", "smoke", "running", 30)
        assert running["status"] == "running"
        assert running["environment"]["CUDA_MODULE_LOADING"] == "EAGER"
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    wall = time.monotonic() - t0
    assert proc.returncode == 1, stdout
    assert wall < 12 + 15, f"the check outran its budget: {wall:.1f}s"
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["finished"]
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == ["install", "smoke", "suite", "soak"]
    assert steps["install"]["status"] == "passed"
    smoke = steps["smoke"]
    assert smoke["status"] == "timeout", smoke
    assert "cut at its limit" in smoke["reason"]
    assert "the hang hook" in smoke["reason"]  # what the step was doing when it was cut
    assert smoke["seconds"] <= smoke["limit_s"] + 6
    for name in ("suite", "soak"):
        assert steps[name]["status"] == "skipped"
        assert "budget left" in steps[name]["reason"]
    files = sorted(p.name for p in out_dir.iterdir())
    assert files == ["check.log", "summary.json", "tests.log"]  # at most 8 come back
    log = (out_dir / "check.log").read_text()
    assert "Timeout (" in log  # the child's watchdog printed every thread's stack
    assert "in _hang" in log


def _wheel(folder: Path, name: str, version: str, module: str) -> Path:
    """A minimal pure-Python wheel (what pip needs to install it)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}.py", "VALUE = 1\n")
        z.writestr(
            f"{dist}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        )
        z.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def test_only_the_wheels_the_image_lacks_are_installed(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "pytest", "0.0.1", "pytest_shadow")  # the image has pytest
    _wheel(wheels, "pdc-missing-dist", "1.0", "pdc_missing_dist")
    site = tmp_path / "site"
    out = _run(
        "--out", str(tmp_path / "out"), "--wheels", str(wheels), "--site", str(site),
        "--steps", "install", "--budget", "60",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    figures = summary["steps"][0]["figures"]
    assert figures["installed"] == ["pdc_missing_dist-1.0-py3-none-any.whl"]
    assert "the image has pytest" in figures["left_out"]["pytest-0.0.1-py3-none-any.whl"]
    assert (site / "pdc_missing_dist.py").exists()
    assert not (site / "pytest_shadow.py").exists()  # the image's pytest is not shadowed


def test_carried_wheels_are_checked_against_the_image(check: ModuleType, tmp_path: Path) -> None:
    _wheel(tmp_path, "pluggy", "1.0", "pluggy_copy")
    (tmp_path / "msgspec-0.22.0-cp311-cp311-macosx_11_0_arm64.whl").write_bytes(b"")
    problems = "\n".join(check.check_wheels(tmp_path))
    assert "the image has pluggy already" in problems
    assert "built for cp311" in problems
    assert "the image is manylinux x86-64" in problems
    assert check.check_wheels(tmp_path / "none")[0].startswith("no wheels")


def test_hardware_tests_touch_no_cuda_while_collected(tmp_path: Path) -> None:
    """Collecting tests/gpu must not start CUDA (EAGER loading must come first), and their
    finalizer warnings are reported, not errors."""
    pytest.importorskip("numba", reason="the probe counts Numba's CUDA driver calls")
    (tmp_path / "collect_probe.py").write_text(
        "import sys, json\n"
        "calls = []\n"
        "def pytest_configure(config):\n"
        "    from numba.cuda.cudadrv import driver\n"
        "    first = driver.Driver.ensure_initialized\n"
        "    def spy(self):  # every driver call, is_available() too, passes here\n"
        "        calls.append('driver')\n"
        "        return first(self)\n"
        "    driver.Driver.ensure_initialized = spy\n"
        "def pytest_collection_finish(session):\n"
        "    marks = [[m.args for m in i.iter_markers('filterwarnings')] for i in session.items]\n"
        "    print('PROBE ' + json.dumps({\n"
        "        'driver_calls': len(calls), 'cupy_imported': 'cupy' in sys.modules,\n"
        "        'items': len(session.items), 'marks': marks}))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "collect_probe", "-p", "no:cacheprovider",
         "--collect-only", "-q", "tests/gpu"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    line = next((x for x in out.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line is not None, out.stdout + out.stderr
    probe = json.loads(line[len("PROBE ") :])
    assert probe["items"] > 10
    assert probe["driver_calls"] == 0
    assert not probe["cupy_imported"]
    wanted = ["default::pytest.PytestUnraisableExceptionWarning"]
    assert all(wanted in [list(a) for a in marks] for marks in probe["marks"])


def test_the_benchmark_spin_gives_up_after_its_timeout() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        bench = importlib.import_module("gpu_ring_kernel_benchmark")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    class Silent:  # rings whose kernel never answers
        def publish(self, recs: Any) -> None:
            pass

        def ready(self) -> int:
            return 0

    class Kernel:
        rings = Silent()

        def statistics(self) -> Any:
            return type("S", (), {"processed": 0})()

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no reply within 0\.2s"):
        bench.ring_raw_rtt(Kernel(), 5, 0, spin_timeout=0.2)
    assert time.monotonic() - t0 < 30


def test_the_suite_step_runs_pytest_with_a_line_per_test(tmp_path: Path) -> None:
    """The suite step's pytest run (options, plugin) on a small host-only test file."""
    code = (
        "import argparse, importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('gc', {str(SCRIPT)!r})\n"
        "gc = importlib.util.module_from_spec(spec); spec.loader.exec_module(gc)\n"
        f"opts = argparse.Namespace(out={str(tmp_path)!r}, test_timeout=30)\n"
        "figures = {}\n"
        "rc = gc._pytest(figures, opts, ['-q', 'tests/unit/test_cuda_toolkit.py'])\n"
        "print('FIGURES ' + json.dumps(figures))\n"
    )
    (tmp_path / "tests.log").write_text("")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("FIGURES ")), None)
    assert line is not None, out.stdout + out.stderr
    figures = json.loads(line[len("FIGURES ") :])
    assert figures["pytest_rc"] == 0
    assert figures["counts"]["passed"] >= 4
    lines = (tmp_path / "tests.log").read_text().splitlines()
    assert len(lines) == sum(figures["counts"].values())
    assert all("tests/unit/test_cuda_toolkit.py::" in x for x in lines)
    assert lines[0].split()[0] in ("passed", "skipped")
