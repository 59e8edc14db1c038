"""``show_config()`` / ``python -m pydotcompute info``: what a bug report needs to say."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
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


def collect_config() -> dict[str, Any]:
    """Versions, loop, tiers and backends, probed without importing GPU libraries."""
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
        from .ring_kernels._cython import is_cython_available

        cython_ext: bool | None = is_cython_available()
    except ImportError:
        cython_ext = None
    from . import __version__

    return {
        "pydotcompute": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loop": get_loop_info(),
        "libraries": libs,
        "tiers": {
            "asyncio": True,
            "thread": True,
            "process": True,
            "process_ring_extension": cython_ext,
            "gpu": libs["numba_cuda"]["installed"] or libs["cupy"]["installed"],
            "ray": libs["ray"]["installed"],
        },
    }


def show_config(file: TextIO | None = None) -> None:
    """Print versions, event loop, optional libraries, tiers and backends."""
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
        w(f"  {name:<12} {status}{hint}\n")
    tiers = cfg["tiers"]
    w("tiers         : " + ", ".join(f"{k}={v}" for k, v in tiers.items()) + "\n")
    try:
        from .backends import available_backends

        w(f"backends      : {available_backends()}\n")
    except Exception as exc:  # probing must never break a bug report
        w(f"backends      : unavailable ({type(exc).__name__}: {exc})\n")
