"""The benchmark suite's bookkeeping: listing, comparing saved runs, printing a saved run.

Nothing here measures time: the runs compared are written by the test itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _suite import summary_row  # noqa: E402


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pydotcompute", "bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


def suite(tmp: Path, name: str, rows: list[dict[str, Any]], quick: bool = True) -> Path:
    data = {
        "suite": "pydotcompute",
        "quick": quick,
        "machine": {
            "time": name,
            "cpu": "test cpu",
            "cpus": 2,
            "python": "3",
            "platform": "x",
            "gpu": None,
        },
        "scripts": {"demo": {"status": "ok", "seconds": 1.0, "summary": rows}},
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_list_names_every_script() -> None:
    out = bench("--list")
    assert out.returncode == 0, out.stderr
    for name in ("extended", "pagerank", "realtime_anomaly", "metal", "queue_latency"):
        assert name in out.stdout


def test_compare_flags_a_regression_on_the_same_run_ratio(tmp_path: Path) -> None:
    old = suite(
        tmp_path,
        "old",
        [
            summary_row("latency", 10.0, "us", higher_is_better=False, baseline=5.0),
            summary_row("rate", 100.0, "msg/s", higher_is_better=True, baseline=200.0),
            summary_row("error", 1e-12, "L1", higher_is_better=False, compare=False),
        ],
    )
    # latency ratio 2.0 -> 4.0: twice as slow against its floor; rate ratio 0.5 -> 0.55
    new = suite(
        tmp_path,
        "new",
        [
            summary_row("latency", 8.0, "us", higher_is_better=False, baseline=2.0),
            summary_row("rate", 110.0, "msg/s", higher_is_better=True, baseline=200.0),
            summary_row("error", 1e-9, "L1", higher_is_better=False, compare=False),
            summary_row("gpu", None, "us", higher_is_better=False, note="not available"),
        ],
    )
    out = bench("--compare", str(old), str(new))
    assert out.returncode == 0, out.stderr
    lines = {ln.split()[1]: ln for ln in out.stdout.splitlines() if ln.startswith("demo ")}
    assert "REGRESSION" in lines["latency"]
    assert "same (within tolerance)" in lines["rate"]
    assert "a check, not compared" in lines["error"]
    assert "only in new run" in lines["gpu"]
    assert "1 regression(s) beyond 25%" in out.stdout

    strict = bench("--compare", str(old), str(new), "--fail-on-regression")
    assert strict.returncode == 1
    relaxed = bench("--compare", str(old), str(new), "--fail-on-regression", "--tolerance", "0.6")
    assert relaxed.returncode == 0, relaxed.stdout


def test_compare_by_value_when_asked(tmp_path: Path) -> None:
    old = suite(
        tmp_path, "old", [summary_row("latency", 10.0, "us", higher_is_better=False, baseline=5.0)]
    )
    new = suite(
        tmp_path, "new", [summary_row("latency", 8.0, "us", higher_is_better=False, baseline=2.0)]
    )
    out = bench("--compare", str(old), str(new), "--compare-by", "value", "--fail-on-regression")
    assert out.returncode == 0, out.stdout
    assert "no regressions" in out.stdout


def test_show_prints_a_saved_run_and_writes_markdown(tmp_path: Path) -> None:
    saved = suite(
        tmp_path,
        "saved",
        [
            summary_row(
                "round trip | p50",
                7.5,
                "us",
                higher_is_better=False,
                baseline=5.0,
                baseline_name="asyncio.Queue",
                target="ratio <= 1.2",
            ),
        ],
    )
    md = tmp_path / "summary.md"
    out = bench("--show", str(saved), "--markdown", str(md))
    assert out.returncode == 0, out.stderr
    assert "asyncio.Queue" in out.stdout
    assert "1.5" in out.stdout
    text = md.read_text()
    assert "| demo | round trip / p50 | 7.5 | us | 5 | asyncio.Queue | 1.5 | ratio <= 1.2 |" in text
    assert "test cpu" in text


def test_unknown_benchmark_name_is_refused() -> None:
    out = bench("--only", "nonesuch")
    assert out.returncode == 2
    assert "unknown benchmark(s) ['nonesuch']" in out.stderr


def test_the_quick_memory_and_message_scripts_run(tmp_path: Path) -> None:
    """`make demo` runs the quick suite: its scripts must run to the end (a script that
    fails makes the demo fail). The two cheapest ones run here, for real."""
    out = bench("--quick", "--only", "memory,message", "--results-dir", str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "(failed)" not in out.stdout


def test_compare_of_two_saved_runs_writes_markdown(tmp_path: Path) -> None:
    old = suite(
        tmp_path, "old", [summary_row("latency", 10.0, "us", higher_is_better=False, baseline=5.0)]
    )
    new = suite(
        tmp_path, "new", [summary_row("latency", 8.0, "us", higher_is_better=False, baseline=2.0)]
    )
    md = tmp_path / "compare.md"
    out = bench("--compare", str(old), str(new), "--markdown", str(md))
    assert out.returncode == 0, out.stderr
    assert f"wrote {md}" in out.stdout
    text = md.read_text()
    assert "| demo | latency | 8 | us | 2 |" in text  # the new run's summary
    assert "| demo | latency | ratio | 2 | 4 | 0.5 | REGRESSION |" in text  # and the comparison


@pytest.mark.parametrize("flag", ["--show", "--compare"])
def test_an_unreadable_saved_run_is_one_line(tmp_path: Path, flag: str) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    good = suite(tmp_path, "good", [summary_row("latency", 8.0, "us", higher_is_better=False)])
    for path, expected in ((tmp_path / "missing.json", "No such file"), (broken, "not JSON")):
        args = (flag, str(path)) if flag == "--show" else (flag, str(path), str(good))
        out = bench(*args)
        assert "Traceback" not in out.stderr, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert out.returncode == 2
        assert str(path) in lines[0], lines[0]
        assert expected in lines[0], lines[0]
