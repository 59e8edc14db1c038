"""A downstream project tests its actors with nothing but the plugin.

The module builds a throwaway project in a temporary folder (its own ``pyproject.toml``, a
package with actors, a test file with no conftest), installs it with pip into a target
folder beside pydotcompute, runs pytest on it in a subprocess and checks every outcome,
including planted failures that must fail with a readable message. When pydotcompute itself
is not pip-installed (a bare checkout), the subprocess sees it through ``PYTHONPATH`` plus a
``dist-info`` carrying the same ``pytest11`` entry point ``pyproject.toml`` declares, so the
plugin is loaded exactly as an installed copy would load it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

import pydotcompute
from pydotcompute.testing import cuda_unavailable_reason, loop_unavailable_reason
from pydotcompute.testing.environment import tier_unavailable_reason

BACKEND = '''
"""A PEP 517 backend small enough to read: packs src/acme_actors into a pure-Python wheel."""
import base64
import hashlib
import pathlib
import zipfile

NAME, VERSION = "acme_actors", "0.1.0"
DIST_INFO = f"{NAME}-{VERSION}.dist-info"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    src = pathlib.Path("src", NAME)
    files = {f"{NAME}/{p.name}": p.read_bytes() for p in sorted(src.glob("*.py"))}
    files[f"{DIST_INFO}/METADATA"] = (
        f"Metadata-Version: 2.1\\nName: acme-actors\\nVersion: {VERSION}\\n"
        "Requires-Dist: pydotcompute\\n"
    ).encode()
    files[f"{DIST_INFO}/WHEEL"] = (
        b"Wheel-Version: 1.0\\nGenerator: acme\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(data)}")
    record.append(f"{DIST_INFO}/RECORD,,")
    files[f"{DIST_INFO}/RECORD"] = ("\\n".join(record) + "\\n").encode()
    wheel_name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / wheel_name, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel_name
'''

PYPROJECT = """
[build-system]
requires = []
build-backend = "_wheel_backend"
backend-path = ["."]

[project]
name = "acme-actors"
version = "0.1.0"
dependencies = ["pydotcompute"]

[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
addopts = "--strict-markers"
"""

ACTORS = '''
"""Acme's actors: what a project built on pydotcompute ships."""
from pydotcompute import message, ring_kernel


@message
class Add:
    values: list[float]


@message
class Total:
    result: float


@ring_kernel(kernel_id="summer", input_type=Add, output_type=Total, queue_size=64)
async def summer(ctx):
    total = 0.0
    while not ctx.should_terminate:
        msg = await ctx.receive()
        total += sum(msg.values)
        await ctx.send(Total(result=total))


def summer_sync(ctx):
    """The same actor for the thread and process tiers (blocking receive)."""
    total = 0.0
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.05)
        if msg is None:
            continue
        total += sum(msg.values)
        ctx.send(Total(result=total))
'''

TESTS = '''
"""Acme's tests: fixtures and helpers only, no conftest.py."""
import threading

import pytest

from acme_actors import Add, summer, summer_sync
from pydotcompute import RingKernelRuntime
from pydotcompute.testing import all_loops, current_loop_kind, run_actor


async def test_sum_with_the_runtime_fixture(runtime):
    await runtime.launch("summer")
    await runtime.activate("summer")
    await runtime.send("summer", Add(values=[1.0, 2.0, 3.0]))
    reply = await runtime.receive("summer", timeout=5)
    assert reply.result == 6.0


async def test_scripted_run():
    replies = await run_actor(summer, [Add(values=[1.0]), Add(values=[2.0])])
    assert [r.result for r in replies] == [1.0, 3.0]


@all_loops()
async def test_on_every_loop(runtime, request):
    assert f"[{current_loop_kind()}]" in request.node.name
    await runtime.launch("summer")
    await runtime.activate("summer")
    assert (await runtime.send_and_receive("summer", Add(values=[2.0]), timeout=5)).result == 2.0


async def test_on_every_tier(runtime, kernel_tier):
    actor = summer if kernel_tier == "asyncio" else summer_sync
    script = [Add(values=[1.0]), Add(values=[2.0])]
    replies = await run_actor(
        actor, script, kernel_id="s", tier=kernel_tier, runtime=runtime, replies=2, timeout=30
    )
    assert [r.result for r in replies] == [1.0, 3.0]


@pytest.mark.cuda
def test_needs_an_nvidia_gpu():
    import cupy

    assert cupy.cuda.runtime.getDeviceCount() > 0


@pytest.mark.pydotcompute(allow_undelivered=True)
async def test_undelivered_on_purpose(runtime):
    await runtime.launch("summer")
    await runtime.send("summer", Add(values=[1.0]))


# -- planted failures: each must fail, and say why --------------------------------------------


async def test_planted_wrong_total():
    (reply,) = await run_actor(summer, [Add(values=[1.0, 2.0, 3.0])])
    assert reply.result == 7.0


async def test_planted_undelivered(runtime):
    await runtime.launch("summer")  # launched but never activated
    await runtime.send("summer", Add(values=[1.0]))
    await runtime.send("summer", Add(values=[2.0]))


@pytest.mark.pydotcompute(leak_guard=True)
def test_planted_thread_leak():
    threading.Thread(
        target=threading.Event().wait, args=(30,), name="pydotcompute-forgotten", daemon=True
    ).start()


@pytest.mark.pydotcompute(leak_guard=True)
async def test_planted_kernel_task_leak():
    orphan_runtime = RingKernelRuntime()
    await orphan_runtime.launch("orphan", summer)
    await orphan_runtime.activate("orphan")
'''


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md"


def guide_blocks() -> list[str]:
    """The Python code blocks of the "Testing your actors" guide, in order."""
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


def guide_test_files() -> list[str]:
    return [b for b in guide_blocks() if re.search(r"^(async )?def test_", b, re.MULTILINE)]


@dataclass
class Outcome:
    """One test case of the downstream run, from its JUnit XML."""

    status: str  # passed, failed, error, skipped
    message: str


def _plugin_is_installed() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(ep.value == "pydotcompute.testing.plugin" for ep in eps)


def _pip_install(project: Path, target: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--disable-pip-version-check",
        "-q",
        "--target",
        str(target),
        str(project),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"


def _environment(site: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "PYTHONPATH", "NUMBA_ENABLE_CUDASIM"))
    }
    paths = [str(site)]
    if not _plugin_is_installed():
        # A bare checkout: the same entry point an install would write.
        dist = site / f"pydotcompute-{pydotcompute.__version__}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: pydotcompute\nVersion: {pydotcompute.__version__}\n"
        )
        (dist / "entry_points.txt").write_text(
            "[pytest11]\npydotcompute = pydotcompute.testing.plugin\n"
        )
        paths.append(str(Path(pydotcompute.__file__).resolve().parent.parent))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run_pytest(
    project: Path, env: dict[str, str], junit: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-rA",
        f"--junitxml={junit}",
        *(args or ("tests",)),
    ]
    return subprocess.run(
        cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _outcomes(junit: Path) -> dict[str, list[Outcome]]:
    """``module::test name`` -> outcomes (a test that errors at teardown has two)."""
    found: dict[str, list[Outcome]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        results = [
            Outcome(child.tag, f"{child.get('message', '')}\n{child.text or ''}")
            for child in case
            if child.tag in ("failure", "error", "skipped")
        ]
        found[f"{module}::{case.get('name', '')}"] = results or [Outcome("passed", "")]
    return found


@dataclass
class DownstreamRun:
    project: Path
    env: dict[str, str]
    result: subprocess.CompletedProcess[str]
    outcomes: dict[str, list[Outcome]]

    def status(self, name: str) -> list[str]:
        key = name if "::" in name else f"test_acme::{name}"
        assert key in self.outcomes, f"{key} did not run:\n{self.result.stdout[-3000:]}"
        return [o.status for o in self.outcomes[key]]

    def text(self, name: str) -> str:
        key = name if "::" in name else f"test_acme::{name}"
        return "\n".join(o.message for o in self.outcomes[key])


@pytest.fixture(scope="module")
def downstream(tmp_path_factory: pytest.TempPathFactory) -> DownstreamRun:
    root = tmp_path_factory.mktemp("downstream")
    project = root / "acme"
    (project / "src" / "acme_actors").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "_wheel_backend.py").write_text(BACKEND)
    (project / "src" / "acme_actors" / "__init__.py").write_text(textwrap.dedent(ACTORS))
    (project / "tests" / "test_acme.py").write_text(textwrap.dedent(TESTS))
    for i, block in enumerate(guide_test_files()):  # the guide's examples run here too
        (project / "tests" / f"test_guide_{i}.py").write_text(block)
    site = root / "site"
    _pip_install(project, site)
    env = _environment(site)
    junit = root / "junit.xml"
    result = _run_pytest(project, env, junit)
    return DownstreamRun(project, env, result, _outcomes(junit))


def test_the_package_is_installed_not_imported_from_its_source(
    downstream: DownstreamRun,
) -> None:
    site = Path(downstream.env["PYTHONPATH"].split(os.pathsep)[0])
    assert (site / "acme_actors" / "__init__.py").is_file()
    assert (site / "acme_actors-0.1.0.dist-info" / "RECORD").is_file()
    assert not (downstream.project / "conftest.py").exists()
    assert not (downstream.project / "tests" / "conftest.py").exists()


def test_the_plugin_is_loaded_through_its_entry_point(downstream: DownstreamRun) -> None:
    assert "pydotcompute" in downstream.result.stdout.split("plugins:")[1].splitlines()[0]


def test_fixtures_and_helpers_pass(downstream: DownstreamRun) -> None:
    for name in (
        "test_sum_with_the_runtime_fixture",
        "test_scripted_run",
        "test_on_every_tier[asyncio]",
        "test_undelivered_on_purpose",
    ):
        assert downstream.status(name) == ["passed"], downstream.text(name)


def test_every_loop_runs_or_says_why_not(downstream: DownstreamRun) -> None:
    assert downstream.status("test_on_every_loop[asyncio]") == ["passed"]
    if loop_unavailable_reason("uvloop") is None:
        assert downstream.status("test_on_every_loop[uvloop]") == ["passed"]
    else:
        assert downstream.status("test_on_every_loop[uvloop]") == ["skipped"]


@pytest.mark.parametrize("tier", ["thread", "process"])
def test_every_tier_runs_or_says_why_not(downstream: DownstreamRun, tier: str) -> None:
    name = f"test_on_every_tier[{tier}]"
    reason = tier_unavailable_reason(tier)
    if reason is None:
        assert downstream.status(name) == ["passed"], downstream.text(name)
    else:
        assert downstream.status(name) == ["skipped"]
        assert reason in downstream.text(name)


def test_hardware_marker_skips_with_the_reason(downstream: DownstreamRun) -> None:
    reason = cuda_unavailable_reason()
    if reason is None:
        assert downstream.status("test_needs_an_nvidia_gpu") == ["passed"]
    else:
        assert downstream.status("test_needs_an_nvidia_gpu") == ["skipped"]
        assert "[cuda] needs an NVIDIA GPU" in downstream.text("test_needs_an_nvidia_gpu")


def test_planted_wrong_answer_fails_with_the_values(downstream: DownstreamRun) -> None:
    assert downstream.status("test_planted_wrong_total") == ["failure"]
    assert "assert 6.0 == 7.0" in downstream.text("test_planted_wrong_total")


def test_planted_undelivered_messages_fail_the_test(downstream: DownstreamRun) -> None:
    assert "error" in downstream.status("test_planted_undelivered")
    text = downstream.text("test_planted_undelivered")
    assert "runtime shutdown left messages undelivered" in text
    assert "kernel 'summer': 2 message(s) never handled: [Add(" in text
    assert "allow_undelivered=True" in text


def test_planted_thread_leak_is_caught(downstream: DownstreamRun) -> None:
    assert "error" in downstream.status("test_planted_thread_leak")
    text = downstream.text("test_planted_thread_leak")
    assert "pydotcompute leak guard: 1 resource(s) outlived the test" in text
    assert "thread 'pydotcompute-forgotten' is still alive" in text


def test_planted_kernel_task_leak_is_caught(downstream: DownstreamRun) -> None:
    assert "error" in downstream.status("test_planted_kernel_task_leak")
    text = downstream.text("test_planted_kernel_task_leak")
    assert "kernel task 'pydotcompute:orphan' is still running" in text


def test_the_run_summary_counts_exactly_the_planted_failures(downstream: DownstreamRun) -> None:
    assert downstream.result.returncode == 1
    summary = downstream.result.stdout.strip().splitlines()[-1]
    assert "1 failed" in summary, downstream.result.stdout[-3000:]
    assert "3 errors" in summary, downstream.result.stdout[-3000:]


def test_strict_mode_gets_told_how_to_fix_it(downstream: DownstreamRun, tmp_path: Path) -> None:
    junit = tmp_path / "strict.xml"
    result = _run_pytest(
        downstream.project,
        downstream.env,
        junit,
        "-o",
        "asyncio_mode=strict",
        "tests/test_acme.py",
        "-k",
        "test_sum_with_the_runtime",
    )
    assert result.returncode == 1
    (outcome,) = _outcomes(junit)["test_acme::test_sum_with_the_runtime_fixture"]
    assert outcome.status == "error"  # refused at setup, before any fixture runs
    assert "pytest-asyncio runs in strict mode" in outcome.message
    assert 'asyncio_mode = "auto"' in outcome.message


def test_the_guides_test_examples_pass(downstream: DownstreamRun) -> None:
    ran = {k: v for k, v in downstream.outcomes.items() if k.startswith("test_guide_")}
    assert len(guide_test_files()) >= 3
    assert len(ran) >= 12
    assert "test_guide_0::test_on_every_tier[asyncio]" in ran
    for name, outcomes in ran.items():
        statuses = [o.status for o in outcomes]
        assert statuses in (["passed"], ["skipped"]), f"{name}: {downstream.text(name)}"
        if statuses == ["skipped"]:  # only for a missing tier, loop or device, saying which
            assert re.search(r"needs|not available|not installed", downstream.text(name))


@pytest.mark.parametrize(
    "index", [i for i, b in enumerate(guide_blocks()) if b not in guide_test_files()]
)
def test_the_guides_scripts_run(index: int) -> None:
    code = compile(guide_blocks()[index], f"{GUIDE.name}[{index}]", "exec")
    exec(code, {"__name__": "__main__"})
