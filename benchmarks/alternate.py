"""Before/after: one benchmark script run on two checkouts in alternating rounds.

``python benchmarks/alternate.py bridge --old ../old-checkout --rounds 5 -- --quick``
runs ``benchmarks/bridge_benchmark.py`` (each checkout's own copy, with that checkout first
on ``PYTHONPATH``) old, new, new, old, old, new... so that machine drift falls on both alike,
collects every summary row of every run and prints, per row, the median value of each side,
the median same-run ratio of each side (against the floor the script measured in that same
run), each side's median floor itself (marked SLOW where the script says its floor waited on
slow wake-ups) and new/old in the better direction (above 1 is better). ``--markdown FILE`` writes the
table for docs/benchmarks.md; the raw runs are saved as JSON.

Design notes:
- Each run is a fresh interpreter of the checkout under test, so nothing of one side's code
  is loaded in the other's process; the order alternates (ABBA) so neither side always runs
  first after the other warmed the caches.
- Rows are matched by name. A row only one side has (a new benchmark, a renamed metric) is
  shown with the other side empty rather than dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import print_table, save_json  # noqa: E402
from _suite import adapt_summary, json_flag, slow_floor  # noqa: E402


def run_once(
    checkout: Path, script: str, args: list[str], timeout: float, script_root: Path | None = None
) -> list[dict[str, Any]]:
    """Run ``benchmarks/<script>_benchmark.py`` against ``checkout``; its summary rows.

    The script is the checkout's own copy, or ``script_root``'s when given (one script for
    both sides, for a checkout older than the script).
    """
    path = (script_root or checkout) / "benchmarks" / f"{script}_benchmark.py"
    if not path.exists():
        raise SystemExit(f"{path} does not exist (is {checkout} a pydotcompute checkout?)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(path), json_flag(path), str(out), *args]
        env = {
            **os.environ,
            "PYTHONPATH": str(checkout),
            "PYDOTCOMPUTE_BENCH_NO_CHARTS": "1",
        }
        proc = subprocess.run(
            cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise SystemExit(
                f"{' '.join(cmd)} failed (exit {proc.returncode}):\n" + "\n".join(tail)
            )
        data = json.loads(out.read_text())
    rows: list[dict[str, Any]] = data.get("summary") or adapt_summary(script, data)
    return rows


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def combine(runs: dict[str, list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per row name: each side's median value and ratio, and new/old (above 1 is better)."""
    names: list[str] = []
    by_side: dict[str, dict[str, list[dict[str, Any]]]] = {"old": {}, "new": {}}
    for side in ("old", "new"):
        for run in runs[side]:
            for row in run:
                if row["name"] not in names:
                    names.append(row["name"])
                by_side[side].setdefault(row["name"], []).append(row)
    table = []
    for name in names:
        old_rows = by_side["old"].get(name, [])
        new_rows = by_side["new"].get(name, [])
        sample = (new_rows or old_rows)[0]
        higher = bool(sample.get("higher_is_better"))
        old_v = _median([r.get("value") for r in old_rows])
        new_v = _median([r.get("value") for r in new_rows])
        old_r = _median([r.get("ratio") for r in old_rows])
        new_r = _median([r.get("ratio") for r in new_rows])
        old_f = _median([r.get("baseline") for r in old_rows])
        new_f = _median([r.get("baseline") for r in new_rows])
        limit = sample.get("slow_baseline")
        gain = None
        if old_v and new_v:
            gain = new_v / old_v if higher else old_v / new_v
        table.append(
            {
                "row": name,
                "unit": sample.get("unit"),
                "old": old_v,
                "old ratio": old_r,
                "old floor": _floor(old_f, limit, higher),
                "new": new_v,
                "new ratio": new_r,
                "new floor": _floor(new_f, limit, higher),
                "new/old (>1 better)": gain,
                "baseline": sample.get("baseline_name"),
                "runs": f"{len(old_rows)}+{len(new_rows)}",
            }
        )
    return table


def _floor(value: float | None, limit: float | None, higher: bool) -> Any:
    """A side's median floor, marked when it is slow (see `_suite.slow_floor`)."""
    if value is None:
        return None
    if slow_floor(value, limit, higher_is_better=higher):
        return f"{_fmt(value)} (SLOW)"
    return value


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def markdown(table: list[dict[str, Any]], title: str) -> str:
    cols = [
        "row",
        "unit",
        "old",
        "old ratio",
        "old floor",
        "new",
        "new ratio",
        "new floor",
        "new/old (>1 better)",
    ]
    lines = [f"#### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in table:
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", help="benchmark name: bridge, queue_latency, actor_scaling...")
    parser.add_argument("--old", required=True, type=Path, help="the 'before' checkout")
    parser.add_argument("--new", default=HERE.parent, type=Path, help="the 'after' checkout")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument(
        "--script-from",
        type=Path,
        help="a checkout whose copy of the script runs on both sides (default: each its own)",
    )
    parser.add_argument("--markdown", type=Path, help="write the table as Markdown")
    parser.add_argument("--json", help="where to save the runs (default benchmarks/results)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    ns = parser.parse_args(argv[:cut])
    extra = argv[cut + 1 :]  # after "--": the script's own options
    sides = {"old": ns.old.resolve(), "new": ns.new.resolve()}
    runs: dict[str, list[list[dict[str, Any]]]] = {"old": [], "new": []}
    order = ["old", "new", "new", "old"]
    t0 = time.perf_counter()
    for i in range(2 * ns.rounds):
        side = order[i % 4]
        print(
            f"[{time.perf_counter() - t0:6.0f} s] {ns.script}: {side} ({sides[side]})", flush=True
        )
        root = ns.script_from.resolve() if ns.script_from else None
        runs[side].append(run_once(sides[side], ns.script, extra, ns.timeout, root))
    table = combine(runs)
    title = f"{ns.script}: {ns.rounds} alternated runs per side"
    print_table(title, table, list(table[0]) if table else ["row"])
    if ns.markdown:
        ns.markdown.write_text(markdown(table, title))
        print(f"markdown {ns.markdown}")
    save_json(
        f"alternate_{ns.script}",
        {"old": str(sides["old"]), "new": str(sides["new"]), "runs": runs, "table": table},
        ns.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
