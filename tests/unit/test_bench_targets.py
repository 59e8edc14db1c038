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
    assert suite.design_target("extended", rt) == "ratio <= 1.0"
    tp = "tier 1 asyncio: RingKernelRuntime actor, throughput"
    assert suite.design_target("extended", tp) == "ratio >= 0.9"
    assert suite.design_target("queue_latency", "uvloop: pipelined throughput") == "ratio >= 0.9"
    cy = "tier 3 process: CythonRingKernel, round trip p50"
    assert suite.design_target("extended", cy) == "<= 2.0 us"
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
        ("ratio >= 0.9", "MISSED"),  # 0.48 x against the design's 0.9 x
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


# --- every target of the design's table, matched against the names the scripts emit ---------


def _bridge_rows() -> list[dict[str, object]]:
    bridge = _load("bridge_benchmark")
    one_round = {
        "thread floor": (10.0, None),
        "tier=thread": (14.0, 300_000.0),
        "ThreadedRingKernel direct": (30.0, 350_000.0),
        "socketpair floor": (30.0, None),
        "tier=process": (15.0, 330_000.0),
        "CythonRingKernel direct": (2.0, 400_000.0),
    }
    rows: list[dict[str, object]] = bridge.summary([one_round, one_round], 3.0)
    return rows


def _actor_scaling_rows() -> list[dict[str, object]]:
    scaling = _load("actor_scaling_benchmark")
    per_count = {
        "msgs_per_s": 470_000.0,
        "floor_msgs_per_s": 430_000.0,
        "ratio": 1.09,
        "ratio_min": 1.04,
        "ratio_max": 1.1,
    }
    result = {
        "scaling": dict.fromkeys(scaling.COUNTS, per_count),
        "pairs": {**per_count, "ratio": 0.95},
        "rounds": 3,
        "idle": {"bytes_per_actor": 5_700.0, "launch_activate_s": 0.3, "bare_tasks_s": 0.06},
    }
    rows: list[dict[str, object]] = scaling.summary(result)
    return rows


def _extended_names() -> list[str]:
    extended = _load("extended_benchmark")
    rows = [
        {"tier": "1 asyncio", "path": "floor: asyncio.Queue (uvloop)", "p50 us": 4.0, "msg/s": 1e6},
        {"tier": "1 asyncio", "path": "RingKernelRuntime actor", "p50 us": 3.7, "msg/s": 1.04e6},
        {"tier": "3 process", "path": "floor: shared-memory busy poll", "p50 us": 1.9},
        {"tier": "3 process", "path": "CythonRingKernel", "p50 us": 1.95},
    ]
    return [r["name"] for r in extended._summary(rows)]


def _adapted_names(suite: ModuleType) -> dict[str, list[str]]:
    p = {"p50_us": 4.0}
    queue_latency = {
        "loops": {
            "uvloop": {
                "round_trip": {"actor": p, "floor": p},
                "throughput": {"actor_msgs_per_s": 1.0, "floor_msgs_per_s": 1.0},
            }
        }
    }
    tier_latency = {
        "targets": {
            "fast_spsc_put_get_ns": 50,
            "fast_spsc_target_ns": 100,
            "tier2_target_ratio": 1.5,
            "tier3_target_us": 2.0,
            "tier3_speedup_vs_mp_queue": 80.0,
            "tier3_target_speedup": 10.0,
        },
        "fast_spsc_queue": [{"ns": 40}],
        "tier2": [{"p50_us": 10.0}, {"p50_us": 11.0}],
        "tier3": [
            {"what": "raw shm ring + MessagePack", "p50_us": 1.9},
            {"what": "CythonRingKernel (ours)", "p50_us": 1.95},
        ],
    }
    return {
        name: [r["name"] for r in suite.adapt_summary(name, data)]
        for name, data in (("queue_latency", queue_latency), ("tier_latency", tier_latency))
    }


#: The process tier's low-latency row, emitted by bridge_benchmark.py when it measures
#: ``reply_spin_us=100`` (its name is the rule's contract with that row).
SPIN_ROW = "process, reply_spin_us=100, round trip p50"


def test_every_design_target_matches_a_row_the_scripts_emit(suite: ModuleType) -> None:
    bridge = {r["name"] for r in _bridge_rows()}
    scaling = {r["name"] for r in _actor_scaling_rows()}
    codec = _load("message_benchmark").CODEC_METRIC
    extended = _extended_names()
    adapted = _adapted_names(suite)

    def one(names: object, needle: str) -> str:
        found = [n for n in names if needle in n]  # type: ignore[attr-defined]
        assert len(found) == 1, (needle, names)
        return found[0]

    want = [
        ("bridge", one(bridge, "process, round trip"), "ratio <= 0.6"),
        ("bridge", SPIN_ROW, "ratio <= 2.0"),
        ("bridge", one(bridge, "thread, round trip"), "ratio <= 1.3"),
        ("bridge", one(bridge, "process, pipelined"), "ratio >= 0.8"),
        ("bridge", one(bridge, "thread, pipelined"), "ratio >= 0.9"),
        ("bridge", one(bridge, "descriptors"), "<= 4 fd"),
        ("actor_scaling", one(scaling, "1,000 actors:"), "ratio >= 1.0"),
        ("actor_scaling", one(scaling, "a caller each"), "ratio >= 1.0"),
        ("actor_scaling", one(scaling, "idle"), "<= 8192 B"),
        ("actor_scaling", one(scaling, "10,000"), "<= 0.5 s"),
        ("message", codec, "ratio <= 1.5"),
        (
            "extended",
            one(extended, "tier 1 asyncio: RingKernelRuntime actor, round"),
            "ratio <= 1.0",
        ),
        (
            "extended",
            one(extended, "tier 1 asyncio: RingKernelRuntime actor, through"),
            "ratio >= 0.9",
        ),
        ("extended", one(extended, "tier 3 process: CythonRingKernel"), "<= 2.0 us"),
        ("queue_latency", one(adapted["queue_latency"], "round trip"), "ratio <= 1.0"),
        ("queue_latency", one(adapted["queue_latency"], "pipelined"), "ratio >= 0.9"),
        ("tier_latency", one(adapted["tier_latency"], "tier 3: CythonRingKernel"), "<= 2.0 us"),
    ]
    for bench, metric, target in want:
        assert suite.design_target(bench, metric) == target, (bench, metric)
    # the rule for the low-latency row matches it alone, not the default process row
    assert suite.design_target("bridge", "process, round trip p50") == "ratio <= 0.6"


def test_only_the_thousand_actor_row_carries_the_scaling_target(suite: ModuleType) -> None:
    names = [r["name"] for r in _actor_scaling_rows()]
    assert names[:4] == [
        "1 actor: aggregate throughput",
        "10 actors: aggregate throughput",
        "100 actors: aggregate throughput",
        "1,000 actors: aggregate throughput",
    ]
    assert [suite.design_target("actor_scaling", n) for n in names[:3]] == [None] * 3


def test_bridge_and_scaling_rows_get_verdicts(suite: ModuleType) -> None:
    run_all = _load("run_all")
    results = {
        "scripts": {
            "bridge": {"status": "ok", "summary": _bridge_rows()},
            "actor_scaling": {"status": "ok", "summary": _actor_scaling_rows()},
        }
    }
    verdicts = {r["metric"]: r["met?"] for r in run_all.summary_rows(results)}
    assert verdicts["thread, round trip p50"] == "MISSED"  # 1.4 x against 1.3
    assert verdicts["process, round trip p50"] == "met"  # 0.5 x against 0.6
    assert verdicts["process, pipelined throughput"] == "met"  # 0.825 x against 0.8
    assert verdicts["thread, pipelined throughput"] == "MISSED"  # 0.857 x against 0.9
    assert verdicts["descriptors per process kernel"] == "met"  # 3 against 4
    assert verdicts["1,000 actors: aggregate throughput"] == "met"  # the median ratio, 1.09
    assert verdicts["1,000 actors, a caller each: aggregate round trips"] == "MISSED"  # 0.95
    assert verdicts["bytes per idle actor"] == "met"


def test_the_quick_suite_runs_every_script_with_an_issue_target() -> None:
    run_all = _load("run_all")
    quick = {s.name for s in run_all.SUITE if s.quick}
    assert {"bridge", "actor_scaling", "message", "extended"} <= quick


# --- a floor that waited on slow wake-ups is said to be slow ---------------------------------


def test_a_slow_floor_is_flagged_in_the_row_note(suite: ModuleType) -> None:
    quick = suite.summary_row(
        "x", 12.0, "us", higher_is_better=False, baseline=9.0, slow_baseline=15.0
    )
    assert quick["note"] is None
    slow = suite.summary_row(
        "x", 60.0, "us", higher_is_better=False, baseline=48.0, note="5 rounds", slow_baseline=15.0
    )
    assert slow["note"].startswith("5 rounds; SLOW FLOOR: it read 48 us (limit 15 us)")
    rate = suite.summary_row(
        "y", 9.0, "msg/s", higher_is_better=True, baseline=10.0, slow_baseline=100.0
    )
    assert "SLOW FLOOR" in rate["note"]  # a rate below its limit is the slow side


def test_the_bridge_flags_a_slow_thread_floor_but_not_a_quick_one() -> None:
    bridge = _load("bridge_benchmark")
    one_round = {
        "thread floor": (48.0, None),
        "tier=thread": (60.0, 300_000.0),
        "ThreadedRingKernel direct": (30.0, 350_000.0),
        "socketpair floor": (30.0, None),
        "tier=process": (15.0, 330_000.0),
        "CythonRingKernel direct": (2.0, 400_000.0),
    }
    rows = {r["name"]: r for r in bridge.summary([one_round], 3.0)}
    assert "SLOW FLOOR" in rows["thread, round trip p50"]["note"]
    assert rows["thread, round trip p50"]["baseline"] == 48.0  # the floor, beside the ratio
    assert "SLOW FLOOR" not in rows["process, round trip p50"]["note"]
    quick = {r["name"]: r for r in _bridge_rows()}
    assert "SLOW FLOOR" not in quick["thread, round trip p50"]["note"]


def test_alternate_shows_each_sides_floor_and_marks_a_slow_one() -> None:
    alternate = _load("alternate")
    row = {
        "name": "thread, round trip p50",
        "unit": "us",
        "higher_is_better": False,
        "baseline_name": "call_soon_threadsafe",
        "slow_baseline": 15.0,
    }
    runs = {
        "old": [[{**row, "value": 90.0, "ratio": 10.5, "baseline": 8.6}]],
        "new": [[{**row, "value": 60.0, "ratio": 1.25, "baseline": 48.0}]],
    }
    (line,) = alternate.combine(runs)
    assert line["old floor"] == 8.6
    assert line["new floor"] == "48 (SLOW)"
    assert line["new/old (>1 better)"] == pytest.approx(1.5)
