"""The hardware check of the GPU tier: one bounded command for a short window of GPU time.

Made for a bare GPU machine image that has Python 3.12 with CuPy, numba + numba-cuda,
NumPy, pytest and Cython but lacks msgspec and pytest-asyncio, and has no network: what is
missing travels as wheels in ``.whl/`` (``make gpu-wheels`` fills it on a machine with a
network). From the repository root::

    make gpu-check GPU_CHECK_OUT="$OUT"            # or:
    python3 tests/gpu/gpu_check.py --out "$OUT" --budget 420 --wheels .whl

What it does, in order, every step inside the total budget (``--budget`` seconds):

1. ``install``: the wheels whose distributions the interpreter lacks go into a private
   folder (``pip install --no-index --no-deps --target``); a wheel of a distribution the
   image already has (pytest, pluggy, pytest-timeout, ...) is left out, so nothing of the
   image is shadowed. Unmet requirements of the installed wheels are reported.
2. ``build``: ``setup_cython.py build_ext --inplace`` offline; a failed build leaves the
   pure-Python twins in use, and says so.
3. The environment of every later step: ``CUDA_MODULE_LOADING=EAGER`` and, when the probe
   finds NVVM in a toolkit folder and ``CUDA_HOME`` is unset, ``CUDA_HOME`` (no step has
   touched CUDA before this).
4. GPU steps, each in a child process under ``timeout`` and a watchdog inside the child
   (``faulthandler``: a hang prints every thread's stack, then ends the step): ``smoke``
   (versions and a kernel bounded to 10 s), ``suite`` (the hardware tests, a per-test
   timeout, one line per test in ``tests.log``), ``probe`` (actors started and stopped
   beside a running one, ``--probe-seconds``), ``bench`` (ring round trip against a launch
   per message, batched throughput), ``edge`` (two GPU kernels joined by a ``device-ring``
   edge against the same pair over the loop: round trip, throughput, exactly once),
   ``pagerank`` (PageRank on the GPU at ``--pagerank-nodes``)
   and ``soak`` (``--soak-messages`` through one actor, only with time left).

A step that no longer fits the budget is skipped with the reason. ``summary.json`` is
rewritten after every step (and when one starts), so a kill from outside still leaves one;
the output folder gets at most four files (``summary.json``, ``check.log``, ``tests.log``,
``bench.json``). Without a GPU every GPU step fails within seconds, saying why.

Test hook: ``PYDOTCOMPUTE_GPU_CHECK_HANG_STEP=<step>`` makes that step hang (the check must
cut it at its limit and go on).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HANG_ENV = "PYDOTCOMPUTE_GPU_CHECK_HANG_STEP"
#: Per interpreter: wheels installed for one Python (cp312 on the GPU image) must never shadow
#: another's packages when the check later runs under a different interpreter.
SITE_DEFAULT = f"/tmp/pydotcompute-check-site-cp{sys.version_info[0]}{sys.version_info[1]}"

#: name -> (longest limit s, shortest useful limit s, needs a GPU, optional, what it does).
#: A healthy run on an H100 takes far less than the longest limits (docs/guides/gpu-actors.md).
STEPS: dict[str, tuple[int, int, bool, bool, str]] = {
    "install": (60, 5, False, False, "install the wheels the image lacks into a private folder"),
    "build": (150, 10, False, False, "build the Cython extensions in place (offline)"),
    "smoke": (60, 8, True, False, "versions, NVVM, and one kernel bounded to 10 s"),
    "suite": (200, 30, True, False, "the hardware tests (tests/gpu, no soak), per-test timeout"),
    "probe": (0, 15, True, False, "actors started and stopped beside a running one"),
    "bench": (100, 30, True, False, "ring round trip vs launch per message; batched throughput"),
    "edge": (60, 15, True, False, "GPU -> GPU: a device-ring edge vs the loop path"),
    "pagerank": (80, 25, True, False, "PageRank on the GPU at 1M nodes"),
    "soak": (90, 20, True, True, "a soak through one actor: nothing lost"),
}

#: Packages whose versions the summary reports.
DISTRIBUTIONS = (
    *("numpy", "numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "cuda-python"),
    *("cuda-bindings", "cuda-core", "cuda-pathfinder", "nvidia-ml-py", "msgspec", "msgpack"),
    *("uvloop", "Cython", "setuptools", "pytest", "pluggy", "pytest-asyncio", "pytest-timeout"),
    "scipy",
)

#: Seconds kept free at the end of the budget for the last summary.
FINAL_MARGIN = 2.0
#: Seconds a smoke kernel (compile, launch, synchronize) may take.
SMOKE_KERNEL_S = 10.0
#: Files this check writes into the output folder (at most 8 come back from a device call).
OUTPUT_FILES = ("summary.json", "check.log", "tests.log", "bench.json")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- the summary -----------------------------------------------------------------------------


class Summary:
    """``summary.json``: rewritten whole (write, then rename) after every change."""

    def __init__(self, out: Path, budget: float, steps: list[str], argv: list[str]) -> None:
        self.path = out / "summary.json"
        self.t0 = time.monotonic()
        self.data: dict[str, Any] = {
            "check": "pydotcompute gpu-check",
            "status": "running",
            "started": _now(),
            "budget_s": budget,
            "elapsed_s": 0.0,
            "argv": argv,
            "environment": {},
            "steps": [
                {"name": s, "status": "pending", "seconds": None, "reason": None, "figures": {}}
                for s in steps
            ],
        }
        self.write()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def step(self, name: str) -> dict[str, Any]:
        return next(s for s in self.data["steps"] if s["name"] == name)

    def write(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.path.with_name(".summary.json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)


class Log:
    """``check.log``: the parent's lines, with every child's output in between."""

    def __init__(self, path: Path, t0: float) -> None:
        self.path = path
        self.t0 = t0
        path.write_text(f"pydotcompute gpu-check, {_now()}\n")

    def __call__(self, line: str, echo: bool = True) -> None:
        text = f"[{time.monotonic() - self.t0:6.1f}s] {line}"
        with self.path.open("a") as f:
            f.write(text + "\n")
        if echo:
            print(text, flush=True)


# --- install: only what the image lacks ---------------------------------------------------------


def wheel_distribution(path: Path) -> tuple[str, str]:
    """(normalized name, version) of a wheel, from its file name."""
    parts = path.name[: -len(".whl")].split("-")
    return _norm(parts[0]), parts[1] if len(parts) > 1 else "?"


def image_version(name: str, site: Path) -> str | None:
    """The version of ``name`` this interpreter has, not counting the private folder."""
    import importlib.metadata as md

    keep = [p for p in sys.path if p and Path(p).resolve() != site.resolve()]
    for dist in md.distributions(path=keep):
        if _norm(dist.metadata["Name"] or "") == name:
            return dist.version
    return None


def _requirements(path: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel (raises ``zipfile.BadZipFile`` for a non-wheel)."""
    with zipfile.ZipFile(path) as wheel:
        meta = next((n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = wheel.read(meta).decode() if meta else ""
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def unmet_requirements(
    wheels: list[Path], have: dict[str, str | None], log: Callable[[str], None]
) -> list[str]:
    """Requirements of ``wheels`` neither the image nor another wheel meets (best effort:
    versions are compared only where ``packaging`` is importable)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        log("packaging is not importable: requirements not checked")
        return []
    carried = dict(wheel_distribution(w) for w in wheels)
    problems: list[str] = []
    for wheel in wheels:
        for text in _requirements(wheel):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = _norm(req.name)
            version = carried.get(name) or have.get(name)
            if version is None:
                problems.append(f"{wheel.name} needs {text}: neither the image nor .whl has it")
            elif req.specifier and not req.specifier.contains(version, prereleases=True):
                problems.append(f"{wheel.name} needs {text}: found {name} {version}")
    return problems


def step_install(
    wheels_dir: Path, site: Path, log: Callable[[str], None]
) -> tuple[str, dict[str, Any], str | None]:
    """Install the wheels the image lacks into ``site``; (status, figures, reason)."""
    found = sorted(wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
    figures: dict[str, Any] = {"wheels_dir": str(wheels_dir), "site": str(site)}
    if not found:
        figures["installed"] = []
        return "passed", figures, f"no wheels in {wheels_dir}: nothing to install"
    have: dict[str, str | None] = {}
    missing: list[Path] = []
    present: dict[str, str] = {}
    for wheel in found:
        name, _ = wheel_distribution(wheel)
        version = image_version(name, site)
        have[name] = version
        if version is None:
            missing.append(wheel)
        else:
            present[wheel.name] = f"the image has {name} {version}: left out"
    for dep in ("pytest", "pluggy", "typing-extensions", "numpy", "packaging"):
        have.setdefault(dep, image_version(dep, site))
    figures["left_out"] = present
    figures["installed"] = [w.name for w in missing]
    problems = unmet_requirements(missing, have, log)
    if problems:
        figures["unmet_requirements"] = problems
    if not missing:
        return "passed", figures, "the image has every carried distribution"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site)]
    cmd += [str(w) for w in missing]
    log("$ " + " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=STEPS["install"][0])
    if out.stdout.strip() or out.stderr.strip():
        log((out.stdout + out.stderr).strip(), echo=False)
    if out.returncode != 0 and "No module named pip" in out.stderr:
        site.mkdir(parents=True, exist_ok=True)  # no pip: a wheel is a zip archive
        for wheel in missing:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site)
        figures["method"] = "unzipped (no pip)"
    elif out.returncode != 0:
        return "failed", figures, f"pip install failed (rc {out.returncode}): see check.log"
    reason = "; ".join(problems) if problems else None
    return "passed", figures, reason


#: Distributions the GPU machine image already has (its package list, read there in 2026-11;
#: the ones the project or its carried wheels could ask for). Carrying one would shadow it.
IMAGE_HAS = frozenset(
    {
        *("attrs", "cloudpickle", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cython"),
        *("cupy-cuda13x", "hypothesis", "iniconfig", "llvmlite", "msgpack", "networkx"),
        *("numba", "numba-cuda", "numpy", "nvidia-ml-py", "packaging", "pip", "pluggy"),
        *("psutil", "pygments", "pytest", "pytest-timeout", "pytest-xdist", "pyyaml", "scipy"),
        *("setuptools", "sortedcontainers", "typing-extensions", "uvloop", "wheel"),
    }
)
#: The most the carried wheels may weigh together (they travel with the working tree).
WHEELS_MAX_MIB = 60


def _applies_on_image(requirement: str) -> bool:
    """Whether a ``Requires-Dist`` line applies on the image (CPython 3.12, Linux x86-64,
    no extra)."""
    if ";" not in requirement:
        return True
    marker = requirement.split(";", 1)[1]
    try:
        from packaging.markers import Marker
    except ImportError:  # rough: extras and markers for older Pythons do not apply
        return "extra" not in marker and "< '3.1" not in marker.replace('"', "'")
    where = {"python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}
    where |= {"sys_platform": "linux", "platform_system": "Linux"}
    where |= {"platform_machine": "x86_64", "implementation_name": "cpython"}
    return bool(Marker(marker).evaluate(where))


def check_wheels(folder: Path) -> list[str]:
    """What is wrong with a folder of wheels meant for the GPU image (empty: nothing)."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return [f"no wheels in {folder}: run `make gpu-wheels` where pip reaches an index"]
    problems: list[str] = []
    seen: dict[str, str] = {}
    total = 0
    for wheel in wheels:
        name, version = wheel_distribution(wheel)
        total += wheel.stat().st_size
        tags = wheel.name[: -len(".whl")].split("-")[-3:]
        py, _abi, plat = tags if len(tags) == 3 else ("?", "?", "?")
        if not ({"cp312", "py3", "py312"} & set(py.split("."))):
            problems.append(f"{wheel.name}: built for {py}, the image runs CPython 3.12")
        if plat != "any" and not all(
            p.endswith("x86_64") and ("manylinux" in p or p == "linux_x86_64")
            for p in plat.split(".")
        ):
            problems.append(f"{wheel.name}: platform {plat}, the image is manylinux x86-64")
        if name in seen:
            problems.append(f"two versions of {name} ({seen[name]}, {version}): keep one")
        seen[name] = version
        if name in IMAGE_HAS:
            problems.append(f"{wheel.name}: the image has {name} already (it would shadow it)")
    for wheel in wheels:
        try:
            requirements = _requirements(wheel)
        except zipfile.BadZipFile:
            problems.append(f"{wheel.name}: not a wheel (not a zip archive)")
            continue
        for text in requirements:
            if not _applies_on_image(text):
                continue
            req = re.split(r"[\s;<>=!~\[(]", text, maxsplit=1)[0]
            if _norm(req) not in IMAGE_HAS and _norm(req) not in seen:
                problems.append(f"{wheel.name} needs {text}: neither the image nor .whl has it")
    if total > WHEELS_MAX_MIB * 2**20:
        problems.append(f"the wheels weigh {total / 2**20:.1f} MiB, over {WHEELS_MAX_MIB} MiB")
    print(f"{len(wheels)} wheel(s), {total / 2**20:.2f} MiB in {folder}:")
    for wheel in wheels:
        print(f"  {wheel.name}")
    return problems


# --- build: the Cython extensions, offline ------------------------------------------------------


def extensions_built() -> list[str]:
    folder = ROOT / "pydotcompute" / "ring_kernels" / "_native"
    return sorted(p.name.split(".")[0] for p in folder.glob("*.so"))


def build_command() -> list[str]:
    jobs = str(max(1, min(8, os.cpu_count() or 1)))
    return [sys.executable, "setup_cython.py", "build_ext", "--inplace", "-j", jobs]


# --- the environment of the GPU steps -----------------------------------------------------------


def load_cuda_toolkit_probe() -> Any:
    """``pydotcompute/backends/cuda_toolkit.py`` by path (stdlib only; no package import)."""
    path = ROOT / "pydotcompute" / "backends" / "cuda_toolkit.py"
    spec = importlib.util.spec_from_file_location("_pydotcompute_cuda_toolkit", path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def gpu_environment(
    site: Path, log: Callable[[str], None]
) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment every child runs in, decided before any process touches CUDA."""
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    paths = [str(site), str(ROOT)]
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["CUDA_MODULE_LOADING"] = "EAGER"  # before any child's first CUDA call
    probe = load_cuda_toolkit_probe().probe_nvvm(env, [site, *sys.path])
    if probe.cuda_home and not env.get("CUDA_HOME"):
        env["CUDA_HOME"] = probe.cuda_home
    log(f"NVVM: {probe.message}")
    info = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "CUDA_MODULE_LOADING": env["CUDA_MODULE_LOADING"],
        "CUDA_HOME": env.get("CUDA_HOME"),
        "libnvvm": probe.libnvvm,
        "nvvm": probe.message,
        "PYTHONPATH": env["PYTHONPATH"],
    }
    return env, info


# --- running a step under its limit -------------------------------------------------------------


def plan_limit(
    name: str, remaining: float, later: list[str], opts: argparse.Namespace
) -> float | None:
    """The limit a step gets now, or None when it no longer fits.

    A step gets its longest limit unless that would eat the shortest limits of the required
    steps after it; it still gets what is left (down to its own shortest useful limit)."""
    longest, shortest = step_limits(name, opts)
    reserve = sum(step_limits(s, opts)[1] for s in later if not STEPS[s][3])
    room = remaining - FINAL_MARGIN
    limit = min(longest, room - reserve)
    if limit < shortest:
        limit = min(longest, room)
    return limit if limit >= shortest else None


def step_limits(name: str, opts: argparse.Namespace) -> tuple[float, float]:
    longest, shortest = STEPS[name][0], STEPS[name][1]
    if name == "probe":
        longest = int(opts.probe_seconds) + 45
        shortest = min(longest, shortest + opts.probe_seconds / 2)
    return float(longest), float(shortest)


def run_child(
    name: str, limit: float, env: dict[str, str], log: Log, opts: argparse.Namespace
) -> tuple[str, dict[str, Any], str | None, float]:
    """One GPU step in its own process under ``timeout``; (status, figures, reason, seconds)."""
    with tempfile.TemporaryDirectory(prefix="pydotcompute-check-") as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name]
        cmd += ["--limit", f"{limit:.1f}", "--result", str(result_path), "--out", str(opts.out)]
        cmd += ["--probe-seconds", str(opts.probe_seconds)]
        cmd += ["--pagerank-nodes", str(opts.pagerank_nodes)]
        cmd += ["--soak-messages", str(opts.soak_messages)]
        cmd += ["--test-timeout", str(opts.test_timeout)]
        timeout_bin = shutil.which("timeout")
        hard = max(1, int(limit + 0.999))
        full = ["timeout", "-k", "5", str(hard), *cmd] if timeout_bin else cmd
        log(f"{name}: limit {limit:.0f}s: {STEPS[name][4]}")
        log("$ " + " ".join(full), echo=False)
        t0 = time.monotonic()
        with log.path.open("a") as sink:
            proc = subprocess.Popen(
                full,
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=hard + 10)  # `timeout` (or the watchdog) ends it first
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            if proc.pid:  # what the step started and left behind
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        seconds = time.monotonic() - t0
        result: dict[str, Any] = {}
        if result_path.exists():
            try:
                result = json.loads(result_path.read_text())
            except ValueError as exc:
                result = {"reason": f"unreadable result file: {exc}"}
    figures = result.get("figures", {})
    cut = rc in (124, 137, -9) or (rc != 0 and seconds >= watchdog_at(limit) - 0.5)
    if cut:
        where = result.get("running")
        reason = (
            f"cut at its limit of {limit:.0f}s (rc {rc}); every thread's stack is in check.log"
            + (f"; it was running {where}" if where else "")
        )
        return "timeout", figures, reason, seconds
    if rc == 0:
        return "passed", figures, result.get("reason"), seconds
    reason = result.get("reason") or f"exited with rc {rc}: see check.log"
    return "failed", figures, reason, seconds


def watchdog_at(limit: float) -> float:
    """When the child's own watchdog dumps stacks and exits: before ``timeout`` kills it."""
    return max(1.0, limit - min(15.0, max(1.0, 0.1 * limit)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("GPU_CHECK_OUT") or "gpu-check-out")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET", 420)))
    ap.add_argument("--wheels", default=".whl", help="folder of carried wheels")
    ap.add_argument("--site", default=os.environ.get("PYDOTCOMPUTE_CHECK_SITE", SITE_DEFAULT))
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated subset")
    ap.add_argument("--no-build", action="store_true", help="skip the Cython build")
    ap.add_argument("--probe-seconds", type=float, default=20.0)
    ap.add_argument("--pagerank-nodes", type=int, default=1_000_000)
    ap.add_argument("--soak-messages", type=int, default=100_000)
    ap.add_argument("--test-timeout", type=int, default=60, help="seconds per hardware test")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    ap.add_argument("--check-wheels", default=None, help="check a folder of wheels; run nothing")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.child:
        return child_main(opts)
    if opts.check_wheels:
        problems = check_wheels(Path(opts.check_wheels))
        for problem in problems:
            print(f"PROBLEM: {problem}")
        print("the wheels fit the GPU image" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    steps = parse_steps(opts.steps)
    if opts.no_build and "build" in steps:
        steps.remove("build")
    if opts.dry_run:
        plan = [
            {
                "step": s,
                "limit_s": step_limits(s, opts)[0],
                "min_s": step_limits(s, opts)[1],
                "gpu": STEPS[s][2],
                "optional": STEPS[s][3],
                "what": STEPS[s][4],
            }
            for s in steps
        ]
        print(json.dumps({"budget_s": opts.budget, "steps": plan}, indent=2))
        return 0
    out = Path(opts.out).resolve()
    opts.out = out
    out.mkdir(parents=True, exist_ok=True)
    for stale in OUTPUT_FILES:
        (out / stale).unlink(missing_ok=True)
    summary = Summary(out, opts.budget, steps, sys.argv[1:] if argv is None else argv)
    log = Log(out / "check.log", summary.t0)
    (out / "tests.log").write_text("")
    site = Path(opts.site).resolve()
    env: dict[str, str] | None = None
    failed = 0

    def record(
        name: str,
        status: str,
        seconds: float,
        reason: str | None,
        figures: dict[str, Any],
        limit: float | None,
    ) -> None:
        entry = summary.step(name)
        entry.update(
            status=status,
            seconds=round(seconds, 1),
            reason=reason,
            figures=figures,
            limit_s=None if limit is None else round(limit, 1),
        )
        summary.write()
        log(f"{name}: {status.upper()} in {seconds:.1f}s" + (f": {reason}" if reason else ""))

    for i, name in enumerate(steps):
        remaining = opts.budget - summary.elapsed()
        limit = plan_limit(name, remaining, steps[i + 1 :], opts)
        if limit is None:
            need = step_limits(name, opts)[1]
            record(
                name,
                "skipped",
                0.0,
                f"{remaining:.0f}s of the {opts.budget:.0f}s budget left, the step needs "
                f"at least {need:.0f}s",
                {},
                None,
            )
            continue
        if env is None and STEPS[name][2]:  # before the first process that may touch CUDA
            env, summary.data["environment"] = gpu_environment(site, log)
        entry = summary.step(name)
        entry.update(
            status="running", limit_s=round(limit, 1), started_at_s=round(summary.elapsed(), 1)
        )
        summary.write()
        t0 = time.monotonic()
        if name == "install":
            try:
                status, figures, reason = step_install(Path(opts.wheels), site, log)
            except Exception as exc:
                status, figures, reason = "failed", {}, f"{type(exc).__name__}: {exc}"
            figures["image"] = {d: image_version(_norm(d), site) for d in DISTRIBUTIONS}
            record(name, status, time.monotonic() - t0, reason, figures, limit)
        elif name == "build":
            status, figures, reason, seconds = run_build(limit, site, log)
            record(name, status, seconds, reason, figures, limit)
        else:
            assert env is not None
            status, figures, reason, seconds = run_child(name, limit, env, log, opts)
            record(name, status, seconds, reason, figures, limit)
        failed += status in ("failed", "timeout")
    if env is None:
        env, summary.data["environment"] = gpu_environment(site, log)
    statuses = [s["status"] for s in summary.data["steps"]]
    summary.data["status"] = "failed" if failed else "passed"
    summary.data["counts"] = {k: statuses.count(k) for k in sorted(set(statuses))}
    summary.data["finished"] = _now()
    summary.write()
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    log(f"done in {summary.elapsed():.1f}s: {summary.data['counts']}; files: {files}")
    return 1 if failed else 0


def run_build(
    limit: float, site: Path, log: Callable[[str], None]
) -> tuple[str, dict[str, Any], str | None, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")])
    cmd = build_command()
    if os.environ.get(HANG_ENV) == "build":
        cmd = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
    log("$ " + " ".join(cmd), echo=False)
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - t0
        return (
            "timeout",
            {"built": extensions_built()},
            f"cut at its limit of {limit:.0f}s; the pure-Python twins are used",
            seconds,
        )
    seconds = time.monotonic() - t0
    text = (out.stdout + out.stderr).strip()
    if text:
        log(text[-4000:], echo=False)
    built = extensions_built()
    figures = {"built": built, "rc": out.returncode}
    if out.returncode == 0 and len(built) >= 4:
        return "passed", figures, None, seconds
    return (
        "passed",
        figures,
        f"built {len(built)} of 4 extensions (rc {out.returncode}): the pure-Python twins "
        "stand in for the rest (see check.log)",
        seconds,
    )


def parse_steps(text: str) -> list[str]:
    steps: list[str] = []
    for part in text.replace(",", " ").split():
        if part == "all":
            steps += [s for s in STEPS if s not in steps]
        elif part in STEPS:
            if part not in steps:
                steps.append(part)
        else:
            raise SystemExit(f"unknown step {part!r}: choose from {', '.join(STEPS)} or 'all'")
    return [s for s in STEPS if s in steps]  # always in the order of STEPS


# --- child: one GPU step under a watchdog --------------------------------------------------------


_RESULT: dict[str, Any] = {"figures": {}}
_RESULT_PATH: Path | None = None


def flush_result(result: dict[str, Any] | None = None) -> None:
    """Write what the step found so far (a watchdog exit skips the final write)."""
    if _RESULT_PATH is not None:
        tmp = _RESULT_PATH.with_suffix(".tmp")
        tmp.write_text(json.dumps(_RESULT, indent=2, default=str))
        os.replace(tmp, _RESULT_PATH)


class StepFailed(Exception):
    """The step cannot go on; the message is its reason in the summary."""


def child_main(opts: argparse.Namespace) -> int:
    global _RESULT_PATH
    _RESULT_PATH = Path(opts.result) if opts.result else None
    step = opts.child
    faulthandler.enable()
    # a hang prints every thread's stack and ends the step before `timeout` kills it
    faulthandler.dump_traceback_later(watchdog_at(opts.limit), exit=True)
    print(f"== {step} (pid {os.getpid()}, limit {opts.limit:.0f}s)", flush=True)
    figures: dict[str, Any] = _RESULT["figures"]
    rc = 1
    try:
        if os.environ.get(HANG_ENV) == step:
            _hang()
        rc = CHILD_STEPS[step](figures, opts)
    except StepFailed as exc:
        _RESULT["reason"] = str(exc)
    except BaseException as exc:
        _RESULT["reason"] = f"{type(exc).__name__}: {exc}"
        import traceback

        traceback.print_exc()
    finally:
        flush_result()
        faulthandler.cancel_dump_traceback_later()
    print(f"== {step}: rc {rc}: {_RESULT.get('reason') or 'ok'}", flush=True)
    sys.stdout.flush()
    os._exit(rc)  # no finalizer of a CUDA object runs after the step's verdict


def _hang() -> None:
    """The test hook: a step that never ends, deaf to SIGTERM."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _RESULT["running"] = "the hang hook"
    flush_result()
    while True:
        time.sleep(0.05)


def gpu_reason() -> str | None:
    """Why no GPU step can run here (None: a CUDA GPU is usable through Numba)."""
    try:
        from pydotcompute.backends import numba_compat
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        return f"pydotcompute does not import ({why}); were the wheels installed?"
    try:
        cuda = numba_compat.import_numba_cuda()
    except Exception as exc:
        return f"numba-cuda does not import ({type(exc).__name__}: {exc})"
    try:
        if not cuda.is_available():
            why = " ".join(
                str(getattr(cuda.cudadrv.driver.driver, "initialization_error", "")).split()
            )
            return f"no CUDA GPU: Numba sees none ({why or 'is a driver loaded? nvidia-smi?'})"
        cc = tuple(cuda.get_current_device().compute_capability)
    except Exception as exc:
        return f"CUDA is not usable ({type(exc).__name__}: {exc})"
    if cc < (7, 0):
        return f"the GPU has compute capability {cc}; the GPU tier needs 7.0+"
    return None


def _require_gpu(figures: dict[str, Any]) -> None:
    reason = gpu_reason()
    if reason is not None:
        raise StepFailed(reason)


def step_smoke(figures: dict[str, Any], opts: argparse.Namespace) -> int:
    import importlib.metadata as md

    figures["python"] = sys.version.split()[0]
    versions: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    figures["packages"] = versions
    figures["env"] = {k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "CUDA_HOME")}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "name,driver_version,memory.total,power.draw,utilization.gpu"
        try:
            figures["nvidia_smi"] = subprocess.run(
                [smi, f"--query-gpu={q}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except Exception as exc:
            figures["nvidia_smi"] = f"unavailable: {type(exc).__name__}"
    try:
        from pydotcompute.ring_kernels import _native

        figures["cython_extensions"] = _native.extension_import_error() or "loaded"
    except Exception as exc:
        raise StepFailed(f"pydotcompute does not import ({type(exc).__name__}: {exc})") from exc
    flush_result()
    _require_gpu(figures)
    from pydotcompute.backends import numba_compat

    cuda = numba_compat.import_numba_cuda()
    dev = cuda.get_current_device()
    figures["gpu"] = {"name": str(dev.name), "cc": list(dev.compute_capability)}
    try:
        figures["driver"] = cuda.cudadrv.driver.driver.get_version()
        figures["runtime"] = cuda.runtime.get_version()
    except Exception as exc:
        figures["driver"] = f"unavailable: {type(exc).__name__}: {exc}"
    flush_result()
    box: dict[str, Any] = {}

    def kernel() -> None:
        try:
            import numpy as np

            t0 = time.perf_counter()

            @cuda.jit
            def add_one(a: Any) -> None:
                i = cuda.grid(1)
                if i < a.size:
                    a[i] += 1

            a = cuda.to_device(np.zeros(1024, np.int32))
            add_one[4, 256](a)
            cuda.synchronize()
            box["ok"] = bool((a.copy_to_host() == 1).all())
            box["seconds"] = round(time.perf_counter() - t0, 3)
        except BaseException as exc:
            box["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=kernel, name="smoke-kernel", daemon=True)
    t.start()
    t.join(SMOKE_KERNEL_S)
    if t.is_alive():
        raise StepFailed(
            f"the smoke kernel (compile, launch, synchronize) took over {SMOKE_KERNEL_S:.0f}s"
        )
    figures["smoke_kernel"] = box
    if "error" in box:
        raise StepFailed(f"the smoke kernel failed: {box['error']}")
    if not box.get("ok"):
        raise StepFailed("the smoke kernel ran but wrote wrong values")
    return 0


class TestLog:
    """A pytest plugin: one line per test in ``tests.log``; the running test in the result."""

    def __init__(self, path: Path, figures: dict[str, Any]) -> None:
        self.path = path
        self.figures = figures
        self.counts: dict[str, int] = {}
        self.failed: list[str] = []
        self.slowest: list[tuple[float, str]] = []

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        _RESULT["running"] = nodeid
        flush_result()

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and report.outcome == "passed":
            return
        if report.when == "teardown" and report.outcome == "skipped":
            return
        outcome = report.outcome if report.when == "call" else f"{report.outcome}-{report.when}"
        self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1
        note = ""
        if report.outcome != "passed":
            text = str(report.longrepr or "").strip().splitlines()
            note = " | " + (text[-1][:300] if text else "")
        if report.outcome == "failed":
            self.failed.append(f"{report.nodeid} ({report.when}){note}")
        self.slowest.append((report.duration, report.nodeid))
        with self.path.open("a") as f:
            f.write(f"{outcome:16} {report.duration:7.2f}s {report.nodeid}{note}\n")
        self.figures.update(
            counts=self.counts,
            failed=self.failed[:20],
            slowest=[f"{d:.1f}s {n}" for d, n in sorted(self.slowest, reverse=True)[:5]],
        )
        _RESULT.pop("running", None)
        flush_result()


def _pytest(figures: dict[str, Any], opts: argparse.Namespace, args: list[str]) -> int:
    import pytest

    extra = ["-p", "no:cacheprovider", "-W", "always::pytest.PytestUnraisableExceptionWarning"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        extra += [f"--timeout={opts.test_timeout}"]
    else:
        figures["note"] = "pytest-timeout is not installed: no per-test timeout"
    if importlib.util.find_spec("pytest_asyncio") is None:
        raise StepFailed("pytest-asyncio is not importable: carry its wheel in .whl/")
    plugin = TestLog(Path(opts.out) / "tests.log", figures)
    rc = int(pytest.main([*extra, *args], plugins=[plugin]))
    figures["pytest_rc"] = rc
    if rc == 0 and not plugin.counts.get("passed"):
        raise StepFailed("no test passed: every test was skipped (see tests.log)")
    if rc != 0:
        raise StepFailed(f"pytest rc {rc}: {plugin.counts} (see tests.log)")
    return 0


def step_suite(figures: dict[str, Any], opts: argparse.Namespace) -> int:
    _require_gpu(figures)
    return _pytest(figures, opts, ["-q", "-rfEs", "tests/gpu", "-m", "cuda", "-k", "not soak"])


def step_soak(figures: dict[str, Any], opts: argparse.Namespace) -> int:
    _require_gpu(figures)
    os.environ["PYDOTCOMPUTE_SOAK_MESSAGES"] = str(opts.soak_messages)
    figures["messages"] = opts.soak_messages
    args = ["-q", "-rfEs", "tests/gpu/test_gpu_ring_kernel_hw.py", "-m", "cuda", "-k", "soak"]
    return _pytest(figures, opts, args)


def step_probe(figures: dict[str, Any], opts: argparse.Namespace) -> int:
    _require_gpu(figures)
    result: dict[str, Any] = figures
    asyncio.run(probe(opts.probe_seconds, result))
    if not result["ok"]:
        raise StepFailed(f"the probe failed: {result.get('pinger_error') or 'a reply was wrong'}")
    return 0


async def probe(seconds: float, result: dict[str, Any]) -> None:
    """Keep actor ``a`` busy with round trips while other actors start, answer and stop.

    First half, the way the GPU guide says to do it: handlers loaded with
    `prepare_gpu_kernel` and `UnifiedBuffer` states allocated before ``a`` starts. Second
    half, what a careless program does: a handler never seen before (a compile and a module
    load beside the running kernel) and a `UnifiedBuffer` allocated meanwhile. A device
    synchronization on either path stalls ``a``'s round trips (or hangs: the watchdog then
    prints where, and the launches so far are already in the result file).
    """
    import numpy as np

    from pydotcompute import RingKernelRuntime
    from pydotcompute.core import UnifiedBuffer
    from pydotcompute.ring_kernels.tiers.gpu import prepare_gpu_kernel
    from tests import gpu_ring_kernel_suite as suite

    def copy_of_handler(name: str) -> Any:  # a new function: its own compile and module
        h = suite.add_handler
        return types.FunctionType(h.__code__, h.__globals__, name)

    prepared = [copy_of_handler(f"prepared_{k}") for k in range(4)]
    for h in prepared:
        prepare_gpu_kernel(h, suite.Add, suite.Sum, state=np.zeros(1, np.int64))
    buffers = [UnifiedBuffer((1,), np.int64, backend="cuda").allocate() for _ in range(4)]
    rt = RingKernelRuntime()
    await rt.start()
    await suite.launch_gpu(rt, "a", suite.add_handler, suite.Add, suite.Sum)
    lat: list[float] = []
    stop = asyncio.Event()

    async def ping() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await rt.send_and_receive("a", suite.Add(a=1.0, b=2.0), timeout=30)
            lat.append(time.perf_counter() - t0)

    pinger = asyncio.create_task(ping())
    launches: list[dict[str, Any]] = []
    result.update(ok=False, seconds=seconds, launches=launches)
    start = time.monotonic()
    i = 0
    try:
        while time.monotonic() < start + seconds and not pinger.done() and i < 500:
            phase = "prepared" if time.monotonic() < start + seconds / 2 else "careless"
            kid = f"b{i}"
            before = len(lat)
            t0 = time.perf_counter()
            state: Any
            if phase == "prepared":
                if i % 2:
                    h, state = suite.add_handler, buffers[(i // 2) % len(buffers)]
                else:
                    h, state = prepared[(i // 2) % len(prepared)], np.zeros(1, np.int64)
            elif i % 2:
                h, state = suite.add_handler, UnifiedBuffer((1,), np.int64, backend="cuda")
                state.allocate()
            else:
                h, state = copy_of_handler(f"fresh_{i}"), np.zeros(1, np.int64)
            await asyncio.wait_for(
                suite.launch_gpu(rt, kid, h, suite.Add, suite.Sum, state=state), 120
            )
            t1 = time.perf_counter()
            reply = await rt.send_and_receive(kid, suite.Add(a=float(i), b=1.0), timeout=30)
            await asyncio.wait_for(rt.terminate(kid), 30)
            t2 = time.perf_counter()
            launches.append(
                {
                    "actor": kid,
                    "phase": phase,
                    "handler": h.__name__,
                    "state": type(state).__name__,
                    "launch_s": round(t1 - t0, 4),
                    "reply_ok": reply.total == i + 1.0,
                    "total_s": round(t2 - t0, 4),
                    "a_round_trips_meanwhile": len(lat) - before,
                    "a_max_round_trip_ms_meanwhile": round(1e3 * max(lat[before:], default=0), 3),
                }
            )
            print(launches[-1], flush=True)
            flush_result(result)  # a hang later still leaves these
            i += 1
    finally:
        stop.set()
        await asyncio.wait({pinger}, timeout=30)
        await rt.shutdown(timeout=30)
    lat_us = sorted(x * 1e6 for x in lat)
    error = pinger.exception() if pinger.done() and not pinger.cancelled() else None
    ok = bool(launches) and all(x["reply_ok"] for x in launches) and error is None
    if len(launches) > 12:  # keep the summary short: the first and last few
        result["launches"] = launches[:6] + launches[-6:]
    result.update(
        ok=ok,
        launches_total=len(launches),
        a_round_trips=len(lat),
        a_p50_us=lat_us[len(lat_us) // 2] if lat_us else None,
        a_max_us=lat_us[-1] if lat_us else None,
        pinger_error=None if error is None else repr(error),
    )


def _import_benchmark(name: str) -> Any:
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def step_bench(figures: dict[str, Any], opts: argparse.Namespace) -> int:
    _require_gpu(figures)
    bench = _import_benchmark("gpu_ring_kernel_benchmark")
    out = Path(opts.out) / "bench.json"
    r = bench.main(["--quick", "--json", str(out), "--spin-timeout", "10"])
    if r is None:
        raise StepFailed("the benchmark found no GPU (see check.log)")
    rows = {row["variant"]: row for row in r["round_trip"]}
    tput = {row["variant"]: row["msg/s"] for row in r["throughput"]}
    ring = rows.get("ring, raw", {})
    launch = rows.get("launch per message, CuPy") or rows.get("launch per message, Numba") or {}
    figures.update(
        ring_raw_p50_us=ring.get("p50_us"),
        ring_raw_p99_us=ring.get("p99_us"),
        ring_runtime_p50_us=rows.get("ring, runtime", {}).get("p50_us"),
        ring_cuda_c_p50_us=rows.get("ring, CUDA C", {}).get("p50_us"),
        launch_per_message_p50_us=launch.get("p50_us"),
        launch_over_ring=(launch["p50_us"] / ring["p50_us"])
        if launch and ring.get("p50_us")
        else None,
        records_msg_per_s=tput.get("ring, records"),
        objects_msg_per_s=tput.get("ring, objects"),
        state_ok=r.get("ring_state_ok"),
        errors={k: v for k, v in r.items() if k.endswith("_error")},
    )
    if not r.get("ring_state_ok"):
        raise StepFailed("the ring actor's state did not count every message exactly once")
    return 0


def step_edge(figures: dict[str, Any], opts: argparse.Namespace) -> int:
    _require_gpu(figures)
    bench = _import_benchmark("gpu_edge_benchmark")
    r = bench.main(["--quick"])
    if r is None:
        raise StepFailed("the edge benchmark found no GPU (see check.log)")
    rows = {row["kind"]: row for row in r["rows"]}
    dev, loop = rows["device-ring"], rows["loop"]
    figures.update(
        device_ring_rtt_p50_us=dev["rtt_p50_us"],
        device_ring_rtt_p99_us=dev["rtt_p99_us"],
        device_ring_msg_per_s=dev["msg_per_s"],
        loop_rtt_p50_us=loop["rtt_p50_us"],
        loop_msg_per_s=loop["msg_per_s"],
        rtt_loop_over_device=r["rtt_loop_over_device"],
        tput_device_over_loop=r["tput_device_over_loop"],
        device_ring_counters=dev["counters"],
        exactly_once_in_order=r["exactly_once_in_order"],
    )
    if not r["exactly_once_in_order"]:
        raise StepFailed("a GPU -> GPU pipeline lost, repeated or reordered a message")
    return 0


def step_pagerank(figures: dict[str, Any], opts: argparse.Namespace) -> int:
    try:
        import cupy as cp
        import numpy as np

        if cp.cuda.runtime.getDeviceCount() < 1:
            raise StepFailed("no CUDA GPU: CuPy sees none")
    except StepFailed:
        raise
    except Exception as exc:
        raise StepFailed(f"no usable CuPy/GPU ({type(exc).__name__}: {exc})") from exc
    pr = _import_benchmark("pagerank_benchmark")
    n = opts.pagerank_nodes
    t0 = time.perf_counter()
    src, dst = pr.power_law_graph(n)
    a, dangling = pr.link_matrix(n, src, dst)
    figures.update(nodes=n, edges=int(a.nnz), graph_s=round(time.perf_counter() - t0, 2))
    flush_result()
    step = pr.gpu_step(a, dangling)
    cpu = pr.cpu_sparse_step(a, dangling)
    x = cp.full(n, 1.0 / n)
    for _ in range(3):  # warm-up: kernels compiled and loaded
        x = step(x)
    cp.cuda.Device().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(20):
        start.record()
        x = step(x)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    per = sorted(times)[len(times) // 2]
    xc = np.full(n, 1.0 / n)
    xg = cp.full(n, 1.0 / n)
    for _ in range(5):
        xc = cpu(xc).copy()
        xg = step(xg)
    l1 = float(np.abs(cp.asnumpy(xg) - xc).sum())
    figures.update(
        ms_per_iteration=round(per * 1e3, 3),
        edges_per_s=a.nnz / per,
        g_edges_per_s=round(a.nnz / per / 1e9, 3),
        l1_vs_cpu_after_5=l1,
        target="≥ 1 G edges/s",
    )
    if l1 > 1e-6:
        raise StepFailed(f"GPU and CPU PageRank disagree after 5 iterations (L1 {l1:.2e})")
    return 0


CHILD_STEPS: dict[str, Callable[[dict[str, Any], argparse.Namespace], int]] = {
    "smoke": step_smoke,
    "suite": step_suite,
    "probe": step_probe,
    "bench": step_bench,
    "edge": step_edge,
    "pagerank": step_pagerank,
    "soak": step_soak,
}


if __name__ == "__main__":
    sys.exit(main())
