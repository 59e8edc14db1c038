"""`show_config()` / `python -m pydotcompute info`: what a bug report needs to say.

Each execution tier is reported as whether it can run *here* and, when it cannot, why: a
missing extra (with the pip command), no NVIDIA driver, no CUDA device. The GPU probe loads
the CUDA driver library with `ctypes` and asks it for the device count, so it needs neither
CuPy nor Numba to be imported (importing them takes seconds and, without a driver, says
only "insufficient driver").

Packages are looked up with the working directory left out of ``sys.path``: ``python -m``
puts it first, and a folder there named ``ray/`` or ``mlx/`` is not an installed package.
``sys.path`` is changed only while the report is made, so ``show_config`` is not for use
while other threads import modules.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_OPTIONAL = (
    ("msgspec", "msgspec", None),
    ("numpy", "numpy", None),
    ("uvloop", "uvloop", "fast"),
    ("Cython", "Cython", "cython"),
    ("cupy", "cupy-cuda12x|cupy-cuda13x|cupy", "cuda"),
    ("numba", "numba", "cuda"),
    ("numba_cuda", "numba-cuda", "cuda"),
    ("pynvml", "nvidia-ml-py", "cuda"),
    ("mlx", "mlx", "metal"),
    ("ray", "ray", "ray"),
)


def _version(dists: str) -> str | None:
    for dist in dists.split("|"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@contextlib.contextmanager
def _installed_only() -> Iterator[None]:
    """Leave the working directory (``''`` or its path) out of ``sys.path`` for a while."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was removed: nothing can be found there
        yield
        return
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p and os.path.realpath(p) != cwd]
    try:
        yield
    finally:
        sys.path[:] = saved


def collect_config() -> dict[str, Any]:
    """Versions, loop, tiers and backends, probed without importing GPU libraries.

    What the working directory holds is not counted as installed (see the module notes).
    """
    with _installed_only():
        return _collect_config()


def _collect_config() -> dict[str, Any]:
    from .ring_kernels._loop import get_loop_info

    libs: dict[str, Any] = {}
    for module, dists, extra in _OPTIONAL:
        found = importlib.util.find_spec(module) is not None
        libs[module] = {
            "installed": found,
            "version": _version(dists) if found else None,
            "extra": extra,
        }
    try:
        from .ring_kernels._native import is_cython_available

        cython_ext: bool | None = is_cython_available()
    except ImportError:
        cython_ext = None
    from ._version import __version__

    return {
        "pydotcompute": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loop": get_loop_info(),
        "libraries": libs,
        "tiers": tier_status(libs, cython_ext),
        "compiled_extensions": bool(cython_ext),
    }


# CUDA driver API results worth naming (cuda.h `CUresult`)
_CU_ERRORS = {
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY: a stub libcuda, not the real driver",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}


def cuda_driver_devices() -> tuple[int, str]:
    """The number of CUDA devices the NVIDIA driver reports, and why 0 when it is 0.

    Loads the driver library (`libcuda.so.1`, `nvcuda.dll`) with `ctypes`; never raises.
    """
    if sys.platform == "darwin":
        return 0, "no CUDA on macOS (use the metal backend)"
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    lib = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return 0, f"no NVIDIA driver ({names[0]} not found)"
    try:
        rc = lib.cuInit(0)
        if rc != 0:
            what = _CU_ERRORS.get(rc, f"CUresult {rc}")
            if rc == 100:
                return 0, "no CUDA device (the NVIDIA driver is loaded but sees no GPU)"
            return 0, f"the NVIDIA driver did not start ({what})"
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
        if rc != 0:
            return 0, f"the NVIDIA driver could not count devices ({_CU_ERRORS.get(rc, rc)})"
    except Exception as exc:  # a broken driver library must not break a bug report
        return 0, f"the NVIDIA driver library failed ({type(exc).__name__}: {exc})"
    if count.value < 1:
        return 0, "no CUDA device"
    return count.value, ""


def _extra(name: str) -> str:
    return f'pip install "pydotcompute[{name}]"'


def tier_status(libs: dict[str, Any], cython_ext: bool | None) -> dict[str, dict[str, Any]]:
    """For each execution tier: whether it can run here (`runs`) and a word on why (`why`)."""
    pure = bool(os.environ.get("PYDOTCOMPUTE_PUREPYTHON"))
    if cython_ext and not pure:
        ring = "shared-memory ring: the compiled extension"
    elif pure:
        ring = "shared-memory ring: the pure-Python twin (PYDOTCOMPUTE_PUREPYTHON is set)"
    else:
        ring = (
            "shared-memory ring: the pure-Python twin, slower; the compiled extension is not "
            f"built (needs Cython and a C compiler: {_extra('cython')}, then reinstall)"
        )
    tiers: dict[str, dict[str, Any]] = {
        "asyncio": {"runs": True, "why": "in the event loop"},
        "thread": {"runs": True, "why": "a thread per actor"},
        "process": {"runs": True, "why": ring},
    }
    numba_ok = libs["numba_cuda"]["installed"] or libs["numba"]["installed"]
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        tiers["gpu"] = (
            {"runs": True, "why": "on the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1): slow"}
            if numba_ok
            else {"runs": False, "why": f"numba-cuda is not installed: {_extra('cuda')}"}
        )
    elif not numba_ok:
        tiers["gpu"] = {"runs": False, "why": f"numba-cuda is not installed: {_extra('cuda')}"}
    else:
        count, reason = cuda_driver_devices()
        tiers["gpu"] = (
            {"runs": True, "why": f"{count} CUDA device(s)"}
            if count
            else {"runs": False, "why": reason}
        )
    ray = libs["ray"]
    tiers["ray"] = (
        {"runs": True, "why": f"ray {ray['version']}"}
        if ray["installed"]
        else {"runs": False, "why": f"ray is not installed: {_extra('ray')}"}
    )
    return tiers


def show_config(file: TextIO | None = None) -> None:
    """Print versions, event loop, optional libraries, tiers and backends."""
    with _installed_only():
        _show_config(file)


def _show_config(file: TextIO | None) -> None:
    out = file or sys.stdout
    cfg = collect_config()
    w = out.write
    w(f"pydotcompute {cfg['pydotcompute']}  (Python {cfg['python']}, {cfg['platform']})\n")
    loop = cfg["loop"]
    w(
        f"event loop    : uvloop available={loop['uvloop_available']} "
        f"installed={loop['uvloop_installed']} version={loop['uvloop_version']}; "
        f"eager tasks supported={loop['eager_tasks_supported']}\n"
    )
    w("libraries     :\n")
    for name, info in cfg["libraries"].items():
        status = info["version"] or ("installed" if info["installed"] else "missing")
        hint = (
            f'  (pip install "pydotcompute[{info["extra"]}]")'
            if info["extra"] and not info["installed"]
            else ""
        )
        if name == "Cython" and not info["installed"] and cfg.get("compiled_extensions"):
            # a wheel ships the extensions compiled: Cython is only needed to build them
            status, hint = "not installed", "  (not needed: the extensions are compiled)"
        w(f"  {name:<12} {status}{hint}\n")
    w("tiers         : can each run here?\n")
    for name, t in cfg["tiers"].items():
        w(f"  {name:<12} {'yes' if t['runs'] else 'no '}  {t['why']}\n")
    try:
        from .backends import available_backends

        w(f"backends      : {available_backends()}\n")
        for name, why in _backend_notes():
            w(f"  {name:<12} {why}\n")
    except Exception as exc:  # probing must never break a bug report
        w(f"backends      : unavailable ({type(exc).__name__}: {exc})\n")


def _backend_notes() -> list[tuple[str, str]]:
    """A word on each compute backend that is not plainly usable (never raises)."""
    notes: list[tuple[str, str]] = []
    try:
        from .backends import CUDABackend, MetalBackend

        cuda = CUDABackend()
        if not cuda.is_available:
            count, reason = cuda_driver_devices()  # says "no driver" plainer than CuPy does
            notes.append(
                ("cuda", f"not usable: {reason if not count else cuda.unavailable_reason}")
            )
        metal = MetalBackend()
        if metal.is_available and not metal.uses_metal_gpu:
            notes.append(("metal", "MLX runs on the CPU here (no Metal GPU)"))
        elif not metal.is_available:
            notes.append(("metal", f"not usable: {metal.unavailable_reason}"))
    except Exception as exc:  # probing must never break a bug report
        notes.append(("?", f"probe failed ({type(exc).__name__}: {exc})"))
    return notes
