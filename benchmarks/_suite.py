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
import re
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

# The performance targets (listed in docs/benchmarks.md), by (benchmark, metric pattern). They win
# over a target string a script writes itself, so the suite judges every run by the design's
# figures; a row no rule matches keeps its script's target. Ratios are against the floor the
# script measured in the same run (interleaved where the script says so).
DESIGN_TARGETS: tuple[tuple[str, str, str], ...] = (
    # tier 1 against two asyncio.Queue objects
    ("extended", r"^tier 1 asyncio: RingKernelRuntime actor, round trip p50$", "ratio <= 1.0"),
    ("extended", r"^tier 1 asyncio: RingKernelRuntime actor, throughput$", "ratio >= 0.9"),
    ("queue_latency", r": actor round trip p50$", "ratio <= 1.0"),
    ("queue_latency", r": pipelined throughput$", "ratio >= 0.9"),
    # tiers 2 and 3 used directly
    ("extended", r"^tier 2 thread: ThreadedRingKernel, round trip p50$", "ratio <= 1.5"),
    ("tier_latency", r"^tier 2: ThreadedRingKernel round trip p50$", "ratio <= 1.5"),
    ("extended", r"^tier 3 process: CythonRingKernel, round trip p50$", "<= 2.0 us"),
    ("tier_latency", r"^tier 3: CythonRingKernel round trip p50$", "<= 2.0 us"),
    ("tier_latency", r"^FastSPSCQueue put\+get$", "<= 100 ns"),
    # tiers 2 and 3 through the runtime, against the floors of their mechanism
    ("bridge", r"^process, round trip p50$", "ratio <= 0.6"),  # vs a socketpair child
    ("bridge", r"^process, reply_spin_us=100, round trip p50$", "ratio <= 2.0"),  # vs direct
    ("bridge", r"^thread, round trip p50$", "ratio <= 1.3"),  # vs call_soon_threadsafe
    ("bridge", r"^process, pipelined throughput$", "ratio >= 0.8"),  # vs the direct kernel
    ("bridge", r"^thread, pipelined throughput$", "ratio >= 0.9"),  # DESIGN.md: 0.9 for thread
    ("bridge", r"^descriptors per process kernel$", "<= 4 fd"),
    # many actors on one loop
    ("actor_scaling", r"^1,000 actors: aggregate throughput$", "ratio >= 1.0"),  # vs bare tasks
    ("actor_scaling", r"^1,000 actors, a caller each: aggregate round trips$", "ratio >= 1.0"),
    ("actor_scaling", r"^bytes per idle actor$", "<= 8192 B"),
    ("actor_scaling", r"^launch \+ activate 10,000 actors$", "<= 0.5 s"),
    # the codec against a like-for-like msgspec.Struct
    ("message", r"^codec: deserialize\(serialize\(\)\), one field$", "ratio <= 1.5"),
    ("gpu_ring_kernel", r"^ring round trip p50$", "<= 5 us on an H100; ratio <= 0.25"),
    ("gpu_ring_kernel", r"^ring records throughput$", ">= 1 M msg/s"),
    ("pagerank", r"^CPU sparse at ", "ratio >= 0.9"),
    ("pagerank", r"^GPU sparse at ", ">= 1 G edges/s on an H100 at 1M+ nodes"),
    ("ray", r"^send_and_receive, round trip p50$", "ratio <= 1.2"),
    ("ray", r"batch.*, throughput$", "ratio >= 20"),
)

_TARGET_CLAUSE = re.compile(
    r"^\s*(?P<ratio>ratio\s*)?(?P<op><=|>=|<|>|≤|≥)\s*(?P<num>[0-9][0-9.]*(?:[eE][+-]?\d+)?)"
    r"\s*(?P<scale>[kMG](?![a-zA-Z]))?\s*(?P<unit>[a-zA-Z\u00b5\u00d7/]+)?"
)
_SCALE = {None: 1.0, "k": 1e3, "M": 1e6, "G": 1e9}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_OPS = {
    "<=": lambda a, b: a <= b,
    "≤": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "≥": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}


#: A floor made of two threads (or a loop and a thread) handing a message to and fro waits
#: on two wake-ups a round trip: on a quiet machine it reads 8-9 us; above this it waited
#: on slow wake-ups (a loaded or throttled machine), and a ratio against it hides cost.
SLOW_WAKE_FLOOR_US = 15.0


def design_target(benchmark: str, metric: str) -> str | None:
    """The DESIGN.md target for a summary row, or None when the design sets none."""
    for bench, pattern, target in DESIGN_TARGETS:
        if bench == benchmark and re.search(pattern, metric):
            return target
    return None


def target_met(
    target: str | None, value: float | None, ratio: float | None, unit: str | None
) -> bool | None:
    """Whether a measured row meets its target; None when that cannot be said.

    `target` is a list of clauses joined by ";", each `[ratio] OP NUMBER [k|M|G] [UNIT]`
    followed by free words ("on an H100"): "ratio <= 1.1", ">= 1 M msg/s", "<= 2.5 us".
    A ratio clause compares the row's ratio (value / same-run baseline), any other clause
    its value, converted between ns, us, ms and s when the units differ. Every clause must
    hold. None: no target, nothing measured, or a clause this cannot read.
    """
    if not target or value is None:
        return None
    verdicts = []
    for clause in target.split(";"):
        m = _TARGET_CLAUSE.match(clause)
        if m is None:
            return None
        bound = float(m.group("num")) * _SCALE[m.group("scale")]
        if m.group("ratio"):
            if ratio is None:
                return None
            measured = float(ratio)
        else:
            measured = float(value)
            want = m.group("unit")
            if want in _TIME_UNITS and unit in _TIME_UNITS and want != unit:
                measured = measured * _TIME_UNITS[unit] / _TIME_UNITS[want]
        verdicts.append(_OPS[m.group("op")](measured, bound))
    return all(verdicts)


def verdict(met: bool | None, target: str | None, value: float | None) -> str:
    """The word the summary table shows for a row's target."""
    if not target:
        return "-"
    if value is None:
        return "not run"
    if met is None:
        return "?"
    return "met" if met else "MISSED"


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
    compare: bool = True,
    slow_baseline: float | None = None,
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
        compare: False for rows that are checks rather than speeds (an error bound):
            ``run_all.py --compare`` then reports them without a regression verdict.
        slow_baseline: Where the baseline counts as slow (a time above it, a rate below
            it): a floor that waits on a slow wake-up makes any ratio against it look
            better than it is, so such a row says so in its ``note`` (see `slow_floor`).
    """
    ratio = None
    if value is not None and baseline:
        ratio = value / baseline
    slow = slow_floor(baseline, slow_baseline, higher_is_better=higher_is_better, unit=unit)
    if slow:
        note = f"{note}; {slow}" if note else slow
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
        "compare": compare,
        "slow_baseline": slow_baseline,
    }


def slow_floor(
    baseline: float | None,
    limit: float | None,
    *,
    higher_is_better: bool,
    unit: str | None = None,
) -> str | None:
    """A warning when a floor measured ``baseline`` beyond ``limit`` (slower: a time above
    it, a rate below it), else None."""
    if baseline is None or limit is None:
        return None
    slow = baseline < limit if higher_is_better else baseline > limit
    if not slow:
        return None
    unit = f" {unit}" if unit else ""
    return (
        f"SLOW FLOOR: it read {baseline:,.3g}{unit} (limit {limit:,.3g}{unit}); a ratio "
        "against a slow wake-up hides what ours adds, read it with care"
    )


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


def json_flag(script: Path) -> str:
    """The option a benchmark script takes for its JSON output path."""
    text = script.read_text(errors="replace")
    return "--json" if '"--json"' in text else "--out"


def adapt_summary(name: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Summary rows for scripts whose JSON predates the ``summary`` convention."""
    rows: list[dict[str, Any]] = []
    try:
        if name == "queue_latency":
            for loop, r in data["loops"].items():
                rt, tp = r["round_trip"], r["throughput"]
                rows.append(
                    summary_row(
                        f"{loop}: actor round trip p50",
                        rt["actor"]["p50_us"],
                        "us",
                        higher_is_better=False,
                        baseline=rt["floor"]["p50_us"],
                        baseline_name="asyncio.Queue",
                        target="ratio <= 1.0",
                    )
                )
                rows.append(
                    summary_row(
                        f"{loop}: pipelined throughput",
                        tp["actor_msgs_per_s"],
                        "msg/s",
                        higher_is_better=True,
                        baseline=tp["floor_msgs_per_s"],
                        baseline_name="asyncio.Queue",
                        target="ratio >= 0.9",
                    )
                )
        elif name == "tier_latency":
            t = data["targets"]
            spsc = data["fast_spsc_queue"]
            rows.append(
                summary_row(
                    "FastSPSCQueue put+get",
                    t["fast_spsc_put_get_ns"],
                    "ns",
                    higher_is_better=False,
                    baseline=spsc[0]["ns"],
                    baseline_name="deque append+popleft",
                    target=f"<= {t['fast_spsc_target_ns']} ns",
                )
            )
            tier2 = data["tier2"]
            rows.append(
                summary_row(
                    "tier 2: ThreadedRingKernel round trip p50",
                    tier2[1]["p50_us"],
                    "us",
                    higher_is_better=False,
                    baseline=tier2[0]["p50_us"],
                    baseline_name="SimpleQueue ping-pong",
                    target=f"ratio <= {t['tier2_target_ratio']}",
                    slow_baseline=SLOW_WAKE_FLOOR_US,
                )
            )
            tier3 = {r["what"].split(" (")[0]: r for r in data["tier3"]}
            ours = next(r for r in data["tier3"] if r["what"].startswith("CythonRingKernel"))
            rows.append(
                summary_row(
                    "tier 3: CythonRingKernel round trip p50",
                    ours["p50_us"],
                    "us",
                    higher_is_better=False,
                    baseline=tier3["raw shm ring + MessagePack"]["p50_us"],
                    baseline_name="raw shm ring + MessagePack",
                    target=f"<= {t['tier3_target_us']} us",
                )
            )
            rows.append(
                summary_row(
                    "tier 3: speed-up over multiprocessing.Queue",
                    t["tier3_speedup_vs_mp_queue"],
                    "x",
                    higher_is_better=True,
                    target=f">= {t['tier3_target_speedup']}x",
                )
            )
        elif name == "actor_scaling":
            tp = data["throughput"]
            floor = data.get("floor_throughput")
            top = max(tp, key=lambda k: int(k))
            rows.append(
                summary_row(
                    f"{int(top):,} actors: aggregate throughput",
                    tp[top],
                    "msg/s",
                    higher_is_better=True,
                    baseline=floor[top] if floor else None,
                    baseline_name="bare tasks on asyncio.Queue, same flow",
                    target="ratio >= 1.0",
                )
            )
            idle = data["idle"]
            rows.append(
                summary_row(
                    "bytes per idle actor",
                    idle["bytes_per_actor"],
                    "B",
                    higher_is_better=False,
                    target="<= 8192",
                )
            )
            rows.append(
                summary_row(
                    "launch + activate 10,000 actors",
                    idle["launch_activate_s"],
                    "s",
                    higher_is_better=False,
                    baseline=idle.get("bare_tasks_s"),
                    baseline_name="bare tasks",
                    target="<= 0.5 s",
                )
            )
        elif name == "memory":
            trips = [r for r in data["round_trips"] if r["api"] == "sync"]
            big = max(trips, key=lambda r: r["bytes"])
            rows.append(
                summary_row(
                    f"UnifiedBuffer round trip, {big['size']}",
                    big["buffer_us"],
                    "us",
                    higher_is_better=False,
                    baseline=big["numpy_copies_us"],
                    baseline_name="two np.copyto",
                    target="ratio <= 1.1",
                )
            )
            pool = max((r for r in data["pool"] if "pool_fill_us" in r), key=lambda r: r["bytes"])
            rows.append(
                summary_row(
                    f"MemoryPool acquire+fill+release, {pool['size']}",
                    pool["pool_fill_us"],
                    "us",
                    higher_is_better=False,
                    baseline=pool["fresh_fill_us"],
                    baseline_name="np.empty + fill",
                )
            )
        elif name == "ray":
            for r in data["round_trip"]:
                if "p50_us" not in r:
                    continue
                plain = next(x for x in data["round_trip"] if x["path"].startswith("plain"))
                rows.append(
                    summary_row(
                        f"{r['path']}, round trip p50",
                        r["p50_us"],
                        "us",
                        higher_is_better=False,
                        baseline=plain["p50_us"],
                        baseline_name=plain["path"],
                        target="ratio <= 1.2" if r["path"] == "send_and_receive" else None,
                    )
                )
            best = max(
                (r for r in data["throughput"] if "batch" in r),
                key=lambda r: r["msgs_per_s"],
                default=None,
            )
            pipe = next(
                (
                    r
                    for r in data["throughput"]
                    if "in flight" in r["path"] and r["path"].startswith("plain")
                ),
                None,
            )
            if best is not None and pipe is not None:
                rows.append(
                    summary_row(
                        f"{best['path']}, throughput",
                        best["msgs_per_s"],
                        "msg/s",
                        higher_is_better=True,
                        baseline=pipe["msgs_per_s"],
                        baseline_name=pipe["path"],
                        target="ratio >= 20",
                    )
                )
    except (KeyError, TypeError, ValueError, StopIteration):
        return []
    return rows
