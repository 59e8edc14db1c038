"""Shared helpers for the benchmark scripts: timing, percentiles, tables, JSON, loops."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def percentiles(samples_ns: Sequence[int], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """Percentiles in microseconds (nearest rank) plus the worst sample."""
    if not samples_ns:
        return {f"p{int(q)}_us": float("nan") for q in qs} | {"max_us": float("nan")}
    s = sorted(samples_ns)
    out = {}
    for q in qs:
        k = min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))
        out[f"p{int(q)}_us"] = s[k] / 1000
    out["max_us"] = s[-1] / 1000
    return out


def machine_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def loop_factories() -> list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]]:
    """(name, factory) for uvloop (when installed) and plain asyncio."""
    out: list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]] = []
    try:
        import uvloop

        out.append(("uvloop", uvloop.new_event_loop))
    except ImportError:
        pass
    out.append(("asyncio", asyncio.new_event_loop))
    return out


def run_on(factory: Callable[[], asyncio.AbstractEventLoop], coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Print rows as an aligned text table."""
    print(f"\n{title}")
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:  # nan
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def save_json(name: str, payload: dict[str, Any], path: str | None = None) -> Path:
    target = Path(path) if path else RESULTS / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "machine": machine_info(), **payload}
    target.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nsaved {target}")
    return target
