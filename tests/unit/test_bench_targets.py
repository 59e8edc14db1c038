"""The benchmark summary says, per row, whether its target was met (benchmarks/_suite.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def suite() -> ModuleType:
    return _load("_suite")


@pytest.mark.parametrize(
    ("target", "value", "ratio", "unit", "met"),
    [
        ("ratio >= 0.7", 331_604.0, 0.48, "msg/s", False),  # 0.48 x is not ">= 0.7"
        ("ratio >= 0.75", 500_000.0, 0.76, "msg/s", True),
        ("ratio <= 1.1", 6.06, 1.22, "us", False),
        ("ratio <= 1.1", 5.0, 1.1, "us", True),  # the bound itself meets it
        ("<= 2.5 us", 28.6, 8.3, "us", False),
        ("<= 2.5 us", 2.4, None, "us", True),
        ("<= 100 ns", 0.055, None, "us", True),  # 55 ns, in another unit
        ("<= 100 ns", 0.2, None, "us", False),
        ("<= 0.5 s", 450.0, None, "ms", True),
        (">= 1 M msg/s", 999_000.0, None, "msg/s", False),
        (">= 1 M msg/s", 1_200_000.0, None, "msg/s", True),
        (">= 1 G edges/s on an H100 at 1M+ nodes", 1.5e9, None, "edges/s", True),
        ("< 1e-9", 3.7e-11, None, "L1", True),
        (">= 20x", 33.0, None, "x", True),
        ("<= 5 us on an H100; ratio <= 0.25", 4.0, 0.2, "us", True),
        ("<= 5 us on an H100; ratio <= 0.25", 4.0, 0.3, "us", False),  # every clause counts
        ("ratio <= 1.2", 10.0, None, "us", None),  # no baseline ran: cannot say
        ("<= 8192 B", None, None, "B", None),  # not measured
        ("fast enough", 1.0, 1.0, "us", None),  # not a readable target
        (None, 1.0, 1.0, "us", None),
    ],
)
def test_target_met(
    suite: ModuleType,
    target: str | None,
    value: float | None,
    ratio: float | None,
    unit: str,
    met: bool | None,
) -> None:
    assert suite.target_met(target, value, ratio, unit) is met


def test_verdict_words(suite: ModuleType) -> None:
    assert suite.verdict(True, "ratio <= 1.1", 1.0) == "met"
    assert suite.verdict(False, "ratio <= 1.1", 1.0) == "MISSED"
    assert suite.verdict(None, "ratio <= 1.1", None) == "not run"
    assert suite.verdict(None, "fast enough", 1.0) == "?"
    assert suite.verdict(None, None, 1.0) == "-"


def test_design_targets_replace_stale_script_targets(suite: ModuleType) -> None:
    rt = "tier 1 asyncio: RingKernelRuntime actor, round trip p50"
    assert suite.design_target("extended", rt) == "ratio <= 1.1"
    tp = "tier 1 asyncio: RingKernelRuntime actor, throughput"
    assert suite.design_target("extended", tp) == "ratio >= 0.75"
    assert suite.design_target("queue_latency", "uvloop: pipelined throughput") == "ratio >= 0.75"
    cy = "tier 3 process: CythonRingKernel, round trip p50"
    assert suite.design_target("extended", cy) == "<= 2.5 us"
    assert suite.design_target("metal", "MLX matmul n=512") is None


def test_summary_table_shows_met_and_missed(
    suite: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    run_all = _load("run_all")
    row = suite.summary_row
    results = {
        "quick": True,
        "machine": {"time": "t", "cpus": 2, "python": "3.11", "platform": "p"},
        "scripts": {
            "extended": {
                "status": "ok",
                "summary": [
                    row(
                        "tier 1 asyncio: RingKernelRuntime actor, throughput",
                        331_604.0,
                        "msg/s",
                        higher_is_better=True,
                        baseline=690_000.0,
                        target="ratio >= 0.7",  # a stale target in the script
                    ),
                    row(
                        "tier 2 thread: ThreadedRingKernel, round trip p50",
                        10.0,
                        "us",
                        higher_is_better=False,
                        baseline=8.0,
                    ),
                ],
            },
            "gpu_ring_kernel": {
                "status": "ok",
                "summary": [
                    row("ring round trip p50", None, "us", higher_is_better=False, note="no GPU")
                ],
            },
        },
    }
    rows = run_all.summary_rows(results)
    assert [(r["target"], r["met?"]) for r in rows] == [
        ("ratio >= 0.75", "MISSED"),  # 0.48 x against the design's 0.75 x
        ("ratio <= 1.5", "met"),
        ("<= 5 us on an H100; ratio <= 0.25", "not run"),
    ]
    run_all.print_summary(results)
    out = capsys.readouterr().out
    assert "met?" in out
    assert "1 met, 1 MISSED, 1 not measured here" in out
    assert "missed: extended: tier 1 asyncio: RingKernelRuntime actor, throughput" in out
    assert "| MISSED |" in run_all.markdown(results)
    assert "docs/benchmarks.md" in out
    assert "DESIGN.md" not in out
    assert "settled" not in out  # no tier-3 row missed: no note about it


def test_a_quick_run_that_misses_tier_3_says_why(suite: ModuleType) -> None:
    run_all = _load("run_all")
    rows = [
        {
            "benchmark": "extended",
            "metric": "tier 3 process: CythonRingKernel, round trip p50",
            "met?": "MISSED",
        }
    ]
    assert "not settled" not in run_all.target_tally(rows, quick=False)
    quick = run_all.target_tally(rows, quick=True)
    assert "missed: extended: tier 3 process: CythonRingKernel" in quick
    assert "parent's core" in quick
    assert "docs/benchmarks.md" in quick


def test_an_unsettled_floor_is_dropped_from_the_summary(suite: ModuleType) -> None:
    extended = _load("extended_benchmark")
    rows = [
        {"tier": "3 process", "path": "floor: shared-memory busy poll", "p50 us": 7997.0},
        {"tier": "3 process", "path": "CythonRingKernel", "p50 us": 11.5},
        {"tier": "2 thread", "path": "floor: SimpleQueue", "p50 us": 8.0},
        {"tier": "2 thread", "path": "ThreadedRingKernel", "p50 us": 10.0},
    ]
    by_name = {r["name"]: r for r in extended._summary(rows)}
    tier3 = by_name["tier 3 process: CythonRingKernel, round trip p50"]
    assert tier3["ratio"] is None  # not 0.00144
    assert tier3["baseline"] is None
    assert "floor dropped: it read 7,997 us" in tier3["note"]
    tier2 = by_name["tier 2 thread: ThreadedRingKernel, round trip p50"]
    assert tier2["ratio"] == pytest.approx(1.25)  # a settled floor stays


def test_every_listed_benchmark_has_a_description(capsys: pytest.CaptureFixture[str]) -> None:
    run_all = _load("run_all")
    assert run_all.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    host_path = next(line for line in lines if line.startswith("gpu_host_path"))
    assert "host-side cost per message" in host_path
    assert not any("(found in benchmarks/)" in line for line in lines)
