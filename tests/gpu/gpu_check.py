"""The hardware check of the GPU tier, in short steps that fit a small window of GPU time.

Made for a fresh GPU machine that has Python 3.12 with CuPy, numba + numba-cuda and NumPy but
no msgspec, no pytest plugins and no network: what is missing travels as wheels in a folder
(`make gpu-wheels` fills `.whl/` on a machine with network). Run from the repository root::

    python3 tests/gpu/gpu_check.py --wheels .whl --out "$OUT" versions compile probe
    python3 tests/gpu/gpu_check.py --wheels .whl --out "$OUT" suite
    python3 tests/gpu/gpu_check.py --wheels .whl --out "$OUT" bench-quick bench
    python3 tests/gpu/gpu_check.py --wheels .whl --out "$OUT" soak

Steps: `versions` (driver, CUDA, NVVM, linker, packages, ptxas), `compile` (PTX and ptxas
checks at the GPU's compute capability), `probe` (60 s of starting and stopping actors
beside a running one, the case that hangs when something synchronizes the device), `suite`
(the hardware suite without the soak), `bench-quick`, `bench` (the latency benchmark) and
`soak` (a million messages). Each step runs in a child process under a watchdog
(`faulthandler.dump_traceback_later`: a hang prints every thread's stack and ends the step
instead of eating the window) and a hard time limit, and writes `<step>.log` and
`<step>.json` into the output folder. `--dry-run` prints the plan and touches no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("PYDOTCOMPUTE_CHECK_SITE", "/tmp/pydotcompute-check-site"))

#: Step name -> (limit in seconds, what it does). Each limit is under 10 minutes, and all of
#: them together about 31 (a healthy run takes far less: see docs/guides/gpu-actors.md).
STEPS: dict[str, tuple[int, str]] = {
    "versions": (90, "driver, CUDA, NVVM, linker backend, packages, ptxas"),
    "compile": (240, "PTX compile checks and ptxas at the GPU's compute capability"),
    "probe": (150, "60 s: start and stop actors beside a running one"),
    "suite": (480, "the hardware suite (tests/gpu) without the soak"),
    "bench-quick": (200, "benchmarks/gpu_ring_kernel_benchmark.py --quick"),
    "bench": (420, "benchmarks/gpu_ring_kernel_benchmark.py"),
    "soak": (300, "the soak test: a million messages through one actor"),
}

#: Packages whose versions the ``versions`` step reports.
DISTRIBUTIONS = (
    *("numpy", "numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "cuda-python"),
    *("cuda-bindings", "cuda-core", "nvidia-ml-py", "pynvjitlink", "msgspec", "msgpack"),
    *("uvloop", "Cython", "pytest", "pytest-asyncio", "pytest-timeout"),
)

#: Seconds before the step's limit at which the watchdog dumps stacks and ends the child.
WATCHDOG_MARGIN = 20


# --- parent: install, run children, write logs --------------------------------------------------


def install_wheels(wheels: Path, log: Callable[[str], None]) -> bool:
    """Install every wheel of ``wheels`` into ``SITE`` (once: a stamp records the set)."""
    found = sorted(p.name for p in wheels.glob("*.whl"))
    if not found:
        log(f"no wheels in {wheels}: nothing to install")
        return True
    stamp = SITE / ".pydotcompute-wheels"
    if stamp.exists() and stamp.read_text() == "\n".join(found):
        log(f"wheels already installed in {SITE}")
        return True
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--upgrade", "--target", str(SITE), *(str(wheels / w) for w in found)]
    log("$ " + " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    log(out.stdout + out.stderr)
    ok = out.returncode == 0
    if not ok and "No module named pip" in out.stderr:  # no pip: a wheel is a zip archive
        import zipfile

        SITE.mkdir(parents=True, exist_ok=True)
        for name in found:
            with zipfile.ZipFile(wheels / name) as wheel:
                wheel.extractall(SITE)
            log(f"extracted {name} into {SITE}")
        ok = True
    if ok:
        SITE.mkdir(parents=True, exist_ok=True)
        stamp.write_text("\n".join(found))
    return ok


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    paths = [str(SITE), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_step(step: str, out: Path, limit: int) -> dict[str, Any]:
    """Run one step in a child process; write ``<step>.log`` and ``<step>.json``."""
    log_path, json_path = out / f"{step}.log", out / f"{step}.json"
    result_path = out / f".{step}.result.json"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", step]
    cmd += ["--limit", str(limit), "--result", str(result_path)]
    t0 = time.monotonic()
    timed_out = False
    with log_path.open("w") as log:
        log.write(f"== {step}: {STEPS[step][1]} (limit {limit}s)\n$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            rc = proc.wait(timeout=limit + 15)  # the watchdog ends it first
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            rc = proc.wait()
    summary: dict[str, Any] = {
        "step": step,
        "rc": rc,
        "ok": rc == 0 and not timed_out,
        "wall_s": round(time.monotonic() - t0, 1),
        "limit_s": limit,
        "killed_after_limit": timed_out,
    }
    if result_path.exists():
        try:
            summary["result"] = json.loads(result_path.read_text())
        except ValueError as exc:
            summary["result_error"] = f"unreadable result: {exc}"
        result_path.unlink()
    json_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def plan(steps: list[str]) -> list[dict[str, Any]]:
    """What each step would run (``--dry-run``): no GPU, no child process."""
    return [{"step": s, "limit_s": STEPS[s][0], "what": STEPS[s][1]} for s in steps]


def parse_steps(names: list[str]) -> list[str]:
    steps: list[str] = []
    for name in names:
        for part in name.replace(",", " ").split():
            if part == "all":
                steps += list(STEPS)
            elif part in STEPS:
                steps.append(part)
            else:
                raise SystemExit(f"unknown step {part!r}: choose from {', '.join(STEPS)} or 'all'")
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", nargs="*", help=f"steps to run: {', '.join(STEPS)}, or all")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out")
    ap.add_argument("--wheels", default=None, help="a folder of wheels to install first")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args.child, args.limit, Path(args.result))
    steps = parse_steps(args.steps or ["versions"])
    if args.dry_run:
        print(json.dumps({"steps": plan(steps), "site": str(SITE), "root": str(ROOT)}, indent=2))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.wheels:
        with (out / "install.log").open("a") as log:
            if not install_wheels(Path(args.wheels), lambda s: print(s, file=log)):
                print(f"installing the wheels failed: see {out / 'install.log'}")
                return 2
    failed = 0
    for step in steps:
        s = run_step(step, out, STEPS[step][0])
        failed += not s["ok"]
        print(f"{step}: {'ok' if s['ok'] else 'FAILED'} rc={s['rc']} {s['wall_s']}s")
    return 1 if failed else 0


# --- child: one step under a watchdog ------------------------------------------------------------


_RESULT_PATH: Path | None = None


def flush_result(result: dict[str, Any]) -> None:
    """Write what a step found so far (a watchdog exit skips the final write)."""
    if _RESULT_PATH is not None:
        _RESULT_PATH.write_text(json.dumps(result, indent=2, default=str))


def run_child(step: str, limit: int, result_path: Path) -> int:
    global _RESULT_PATH
    _RESULT_PATH = result_path
    faulthandler.enable()
    # a hang prints every thread's stack, then ends the step, before the parent's limit
    faulthandler.dump_traceback_later(max(1, limit - WATCHDOG_MARGIN), exit=True)
    result: dict[str, Any] = {}
    try:
        rc = CHILD_STEPS[step](result)
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        faulthandler.cancel_dump_traceback_later()
        flush_result(result)
    return rc


def _try(result: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
    try:
        result[key] = fn()
    except Exception as exc:
        result[key] = f"unavailable: {type(exc).__name__}: {exc}"


def step_versions(result: dict[str, Any]) -> int:
    import importlib.metadata as md

    result["python"] = sys.version
    result["platform"] = platform.platform()
    dists = {}
    for name in DISTRIBUTIONS:
        try:
            dists[name] = md.version(name)
        except md.PackageNotFoundError:
            dists[name] = None
    result["packages"] = dists
    result["env"] = {
        k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "CUDA_HOME", "CUDA_PATH")
    }
    from pydotcompute.backends import numba_compat

    result["numpy_row_stack"] = hasattr(__import__("numpy"), "row_stack")
    result["numba_cuda_problem"] = numba_compat.version_problem(numba_compat.numba_cuda_version())
    try:
        cuda = numba_compat.import_numba_cuda()
    except ImportError as exc:
        result["numba_cuda"] = f"not importable: {exc}"
        print(json.dumps(result, indent=2, default=str))
        return 1

    def gpu() -> dict[str, Any]:
        dev = cuda.get_current_device()
        return {"name": str(dev.name), "cc": list(dev.compute_capability)}

    _try(result, "gpu", gpu)
    import importlib

    _try(
        result,
        "driver_version",
        lambda: importlib.import_module("numba.cuda.cudadrv.driver").driver.get_version(),
    )
    _try(result, "runtime_version", lambda: cuda.runtime.get_version())
    _try(
        result,
        "nvvm_version",
        lambda: importlib.import_module("numba.cuda.cudadrv.nvvm").NVVM().get_version(),
    )

    def linker() -> dict[str, Any]:
        drv = importlib.import_module("numba.cuda.cudadrv.driver")
        info: dict[str, Any] = {"classes": [n for n in dir(drv) if n.endswith("Linker")]}
        try:
            from cuda.bindings import nvjitlink

            info["nvjitlink"] = nvjitlink.version()
        except Exception as exc:
            info["nvjitlink"] = f"unavailable: {type(exc).__name__}"
        return info

    _try(result, "linker", linker)
    import numba

    result["numba_config"] = {
        k: getattr(numba.config, k)
        for k in dir(numba.config)
        if k.startswith("CUDA") and ("LINK" in k or "BINDING" in k or "NVRTC" in k)
    }

    def cupy_info() -> dict[str, Any]:
        import cupy

        rt = cupy.cuda.runtime
        return {
            "cupy": cupy.__version__,
            "driver": rt.driverGetVersion(),
            "runtime": rt.runtimeGetVersion(),
            "nvrtc": list(cupy.cuda.nvrtc.getVersion()),
        }

    _try(result, "cupy", cupy_info)

    def loading_mode() -> str:
        from cuda.bindings import driver

        driver.cuInit(0)
        status, mode = driver.cuModuleGetLoadingMode()
        return f"{mode} ({status})"

    _try(result, "module_loading_mode", loading_mode)
    from pydotcompute.compilation.ptx_check import ptxas_candidates, ptxas_release

    result["ptxas"] = {p: ptxas_release(p) for p in ptxas_candidates()}
    from pydotcompute.ring_kernels import _cython

    result["cython_extension"] = _cython.extension_import_error() or "loaded"
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "name,driver_version,memory.total,compute_mode,clocks.max.sm"
        _try(
            result,
            "nvidia_smi",
            lambda: subprocess.run(
                [smi, f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True
            ).stdout.strip(),
        )
    print(json.dumps(result, indent=2, default=str))
    return 0


def _pytest(result: dict[str, Any], args: list[str]) -> int:
    import pytest

    class Outcomes:
        def __init__(self) -> None:
            self.counts: dict[str, int] = {}
            self.failed: list[str] = []

        def pytest_runtest_logreport(self, report: Any) -> None:
            if report.when == "call" or report.outcome != "passed":
                key = report.outcome
                self.counts[key] = self.counts.get(key, 0) + 1
                if report.outcome == "failed":
                    self.failed.append(f"{report.nodeid} ({report.when})")

    seen = Outcomes()
    rc = int(pytest.main(["-p", "no:cacheprovider", *args], plugins=[seen]))
    result.update(pytest_args=args, rc=rc, outcomes=seen.counts, failed=seen.failed)
    return rc


def step_compile(result: dict[str, Any]) -> int:
    from pydotcompute.backends import numba_compat

    cuda = numba_compat.import_numba_cuda()
    try:
        cc = tuple(cuda.get_current_device().compute_capability)
    except Exception as exc:  # CUDA unusable: still check the code for an H100
        result["device_error"] = f"{type(exc).__name__}: {exc}"
        cc = (9, 0)
    result["cc"] = list(cc)
    from pydotcompute.compilation.ptx_check import check_ptx

    shipped = check_ptx(cc)  # type: ignore[arg-type]
    result["shipped_kernels"] = [
        {"name": r.name, "signature": r.signature, "ok": r.ok, "error": r.error} for r in shipped
    ]
    rc = _pytest(result, ["-q", "-rs", "tests/unit/test_gpu_kernel_ptx.py"])
    rc2 = _pytest_more(result, ["-q", "-rs", "tests/unit/test_gpu_kernel_device.py"])
    return rc or rc2 or int(not all(r.ok for r in shipped))


def _pytest_more(result: dict[str, Any], args: list[str]) -> int:
    more: dict[str, Any] = {}
    rc = _pytest(more, args)
    result["more"] = more
    return rc


def _needs_a_pass(result: dict[str, Any], rc: int) -> int:
    """A hardware step where every test skipped (no usable GPU) has not passed."""
    if rc == 0 and not result.get("outcomes", {}).get("passed"):
        result["error"] = "no test passed: every test was skipped (see the skip reasons)"
        return 1
    return rc


def step_suite(result: dict[str, Any]) -> int:
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    rc = _pytest(result, ["tests/gpu", "-m", "cuda", "-v", "-rs", "-k", "not soak"])
    return _needs_a_pass(result, rc)


def step_soak(result: dict[str, Any]) -> int:
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    args = ["tests/gpu/test_gpu_ring_kernel_hw.py", "-m", "cuda", "-v", "-rs", "-k", "soak"]
    return _needs_a_pass(result, _pytest(result, [*args, "--timeout", "270"]))


def _bench(result: dict[str, Any], quick: bool) -> int:
    import runpy

    path = ROOT / "benchmarks" / "gpu_ring_kernel_benchmark.py"
    out = ROOT / "benchmarks" / "results" / f"gpu_check_{'quick' if quick else 'full'}.json"
    sys.path.insert(0, str(path.parent))
    sys.argv = [str(path), "--json", str(out), *(["--quick"] if quick else [])]
    runpy.run_path(str(path), run_name="__main__")
    result["benchmark"] = json.loads(out.read_text()) if out.exists() else None
    return 0 if result["benchmark"] and result["benchmark"].get("available") else 1


def step_probe(result: dict[str, Any], seconds: float = 60.0) -> int:
    asyncio.run(probe(seconds, result))
    return 0 if result["ok"] else 1


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
    from pydotcompute.ring_kernels.gpu_kernel import prepare_gpu_kernel
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
    result.update(ok=False, launches=launches)
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
    result.update(
        ok=ok,
        a_round_trips=len(lat),
        a_p50_us=lat_us[len(lat_us) // 2] if lat_us else None,
        a_max_us=lat_us[-1] if lat_us else None,
        pinger_error=None if error is None else repr(error),
    )


def _hang(result: dict[str, Any]) -> int:
    """A step that never ends: shows that the watchdog prints the stacks and ends it."""
    result["hanging"] = True
    while True:
        time.sleep(0.05)


CHILD_STEPS: dict[str, Callable[[dict[str, Any]], int]] = {
    "_hang": _hang,  # not a user step: the watchdog's own check
    "versions": step_versions,
    "compile": step_compile,
    "probe": step_probe,
    "suite": step_suite,
    "bench-quick": lambda r: _bench(r, True),
    "bench": lambda r: _bench(r, False),
    "soak": step_soak,
}


if __name__ == "__main__":
    sys.exit(main())
