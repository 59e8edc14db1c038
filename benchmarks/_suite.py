"""What the suite runner reads from every script: summary rows, charts, availability.

A script's JSON may carry a top-level ``"summary"``: a list of rows made by
:func:`summary_row`. ``run_all.py`` prints them as one table for the whole suite and compares
two saved runs row by row (by ``name``). A row says what was measured, its value and unit,
which direction is better, and (when the script measured one in the same run) the baseline
and the ratio against it. Rows for something that could not run (no GPU, a missing extra)
carry ``value=None`` and a ``note`` saying why.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def summary_row(
    name: str,
    value: float | None,
    unit: str,
    *,
    higher_is_better: bool,
    baseline: float | None = None,
    baseline_name: str | None = None,
    target: str | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """One line of the suite summary.

    Args:
        name: Stable, unique within the script (runs are compared by it).
        value: The figure, or None when it could not be measured (say why in ``note``).
        unit: ``us``, ``msg/s``, ``edges/s``, ``GFLOP/s``...
        higher_is_better: Direction, used for ratios and regression checks.
        baseline: The floor or reference measured in the same run, same unit.
        baseline_name: What the baseline is (``asyncio.Queue``, ``scipy SpMV``...).
        target: The goal in words, e.g. ``ratio <= 1.2``.
        note: Why a value is missing, or anything a reader must know.
    """
    ratio = None
    if value is not None and baseline:
        ratio = value / baseline
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "higher_is_better": higher_is_better,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": ratio,
        "target": target,
        "note": note,
    }


def chart_path(name: str, json_path: str | None) -> Path:
    """Where a script's PNG goes: next to its JSON file."""
    base = Path(json_path).parent if json_path else RESULTS
    base.mkdir(parents=True, exist_ok=True)
    return base / f"{name}.png"


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed), or None if missing."""
    if os.environ.get("PYDOTCOMPUTE_BENCH_NO_CHARTS"):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"chart {path}")


def cuda_device_reason() -> str | None:
    """None when a CUDA GPU can be used through CuPy; otherwise why not."""
    try:
        import cupy
    except Exception as exc:
        return f"CuPy is not installed ({type(exc).__name__}); pip install 'pydotcompute[cuda]'"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:
        return f"no usable CUDA device ({type(exc).__name__})"
    return None


def sibling(module: str) -> Any:
    """Import another benchmark script as a module (None if it does not exist)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    if not (Path(here) / f"{module}.py").exists():
        return None
    return importlib.import_module(module)
