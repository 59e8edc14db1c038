"""Run the benchmark suite, print one summary table, save it, compare two runs.

``python -m pydotcompute bench`` calls this script with its remaining arguments::

    python -m pydotcompute bench [--quick] [--only NAME,...] [--save FILE]
                                 [--compare OLD.json [NEW.json]] [--fail-on-regression]

Each benchmark script runs in its own interpreter (a fresh process: no state leaks from one
measurement into the next) with ``--json`` pointing into the results folder; its full
output goes to a ``.log`` file beside the JSON (``--verbose`` shows it live) and a progress
line is printed as each script finishes. The summary table gathers the ``summary`` rows the
scripts put in their JSON (see ``_suite.py``): the figure, the baseline measured in the same
run, and the ratio. ``--quick`` runs the fast subset with small sizes (well under a minute
on two cores); the full suite takes minutes.

Comparing runs: ``--compare OLD.json`` runs the suite and compares with a saved run;
``--compare OLD.json NEW.json`` compares two saved runs without running anything. Rows are
matched by benchmark and name. A row's change is new over old in the better direction (above
1 is better). By default the change is taken on the ratio against the same-run baseline
when both runs have one (robust to a busier or faster machine), else on the raw value.
``--fail-on-regression`` exits with status 1 when a row got worse by more than
``--tolerance`` (default 0.25, i.e. 25 %). ``--markdown FILE`` writes the summary as a
Markdown table, followed by the comparison table when there is one.

An error is one line on stderr that names the fix (status 2), never a traceback; output
into a pipe whose reader went away ends quietly with status 141.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _common import _fmt, machine_info, print_table  # noqa: E402
from _suite import adapt_summary, design_target, json_flag, target_met, verdict  # noqa: E402


@dataclass(frozen=True)
class Script:
    name: str
    file: str
    quick: bool  # part of the --quick suite
    question: str
    json_flag: str = "--json"


SUITE = (
    Script(
        "extended",
        "extended_benchmark.py",
        True,
        "every tier's round trip and throughput against its floor",
    ),
    Script(
        "queue_latency",
        "queue_latency_benchmark.py",
        False,
        "tier 1 in detail, on uvloop and plain asyncio",
    ),
    Script("tier_latency", "tier_latency_benchmark.py", False, "tiers 2 and 3 in detail"),
    Script(
        "message",
        "message_benchmark.py",
        True,
        "building, encoding and decoding messages against a bare msgspec.Struct",
    ),
    Script(
        "actor_scaling",
        "actor_scaling_benchmark.py",
        True,
        "1 to 1,000 actors on one loop; memory per idle actor",
    ),
    Script("memory", "memory_benchmark.py", True, "UnifiedBuffer and MemoryPool overhead"),
    Script(
        "pool",
        "pool_benchmark.py",
        False,
        "a CPU-bound handler: 2 replicas against 1, per tier",
    ),
    Script(
        "gpu_ring_kernel",
        "gpu_ring_kernel_benchmark.py",
        True,
        "persistent CUDA kernel against launch-per-message",
    ),
    Script(
        "gpu_edge",
        "gpu_edge_benchmark.py",
        False,
        "GPU -> GPU: a device-ring edge against the loop path",
    ),
    Script("pagerank", "pagerank_benchmark.py", True, "PageRank: dense, sparse, GPU and actors"),
    Script(
        "realtime_anomaly",
        "realtime_anomaly_benchmark.py",
        True,
        "streaming detection: persistent state vs batch transfers",
    ),
    Script("metal", "metal_benchmark.py", True, "MLX against NumPy"),
    Script(
        "gpu_host_path",
        "gpu_host_path_benchmark.py",
        False,
        "host-side cost per message of a GPU actor's rings (no GPU needed)",
    ),
    Script(
        "bridge",
        "bridge_benchmark.py",
        True,
        "thread and process tiers through the runtime against their floors",
    ),
    Script(
        "observability",
        "observability_benchmark.py",
        False,
        "a 3-stage pipeline with and without a metrics scraper, and with tracing",
    ),
    Script(
        "edges",
        "edges_benchmark.py",
        False,
        "pipelines of off-loop stages: loop path vs direct edges vs the slowest stage",
    ),
    Script(
        "trip_counts",
        "trip_counts_benchmark.py",
        False,
        "system calls and instructions a round trip (strace, callgrind): counts, not times",
    ),
    Script(
        "ray",
        "ray_benchmark.py",
        False,
        "ring kernels on Ray against plain Ray calls",
        json_flag="--out",
    ),
    Script(
        "ray_multinode",
        "ray_multinode_benchmark.py",
        False,
        "a cross-node asyncio -> ray -> ray pipeline against the same hops by hand",
        json_flag="--out",
    ),
)


def _discover() -> list[Script]:
    """The suite, plus any other ``*_benchmark.py`` found here (full runs only)."""
    known = {s.file for s in SUITE}
    extra = []
    for path in sorted(HERE.glob("*_benchmark.py")):
        if path.name not in known:
            flag = json_flag(path)
            extra.append(
                Script(
                    path.stem.removesuffix("_benchmark"),
                    path.name,
                    False,
                    "(found in benchmarks/)",
                    flag,
                )
            )
    return [*SUITE, *extra]


# --- running ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    info = machine_info()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        info["cpu"] = platform.processor() or platform.machine()
    info["gpu"] = _gpu_name()
    return info


def _gpu_name() -> str | None:
    from _suite import cuda_device_reason

    if cuda_device_reason() is not None:
        return None
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def run_script(
    script: Script, quick: bool, outdir: Path, verbose: bool, timeout: float
) -> dict[str, Any]:
    """Run one script; returns its record (status, seconds, summary rows, files)."""
    path = HERE / script.file
    if not path.exists():
        return {
            "status": "missing",
            "seconds": 0.0,
            "summary": [],
            "note": f"benchmarks/{script.file} is not in this tree",
        }
    json_path = outdir / f"{script.name}.json"
    log_path = outdir / f"{script.name}.log"
    json_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(path), script.json_flag, str(json_path)]
    if quick:
        cmd.append("--quick")
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    t0 = time.perf_counter()
    status = "ok"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if verbose:
                print(f"    {line}", end="", flush=True)
            if time.monotonic() > deadline:
                proc.kill()
                status = "timeout"
                break
        rc = proc.wait()
    seconds = time.perf_counter() - t0
    record: dict[str, Any] = {
        "status": status,
        "seconds": seconds,
        "log": str(log_path),
        "summary": [],
        "charts": [],
    }
    if status == "ok" and rc != 0:
        record["status"] = "failed"
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.match(r"^\w*(Error|Exception)\b", ln.strip())]
        last = (errors or lines or ["no output"])[-1].strip()
        record["note"] = f"exit code {rc}: {last}"[:200]
    if json_path.exists():
        data = json.loads(json_path.read_text())
        record["json"] = str(json_path)
        record["summary"] = data.get("summary") or adapt_summary(script.name, data)
        record["machine"] = data.get("machine")
    chart = json_path.with_suffix(".png")
    if chart.exists():
        record["charts"].append(str(chart))
    return record


# --- reporting -------------------------------------------------------------------------------


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, rec in results["scripts"].items():
        if rec["status"] != "ok" and not rec["summary"]:
            rows.append(
                {"benchmark": name, "metric": f"({rec['status']})", "note": rec.get("note")}
            )
            continue
        if not rec["summary"]:
            rows.append(
                {
                    "benchmark": name,
                    "metric": "(no summary rows)",
                    "note": f"see {rec.get('json', rec.get('log'))}",
                }
            )
        for r in rec["summary"]:
            target = design_target(name, r["name"]) or r.get("target")
            met = target_met(target, r["value"], r.get("ratio"), r.get("unit"))
            rows.append(
                {
                    "benchmark": name,
                    "metric": r["name"],
                    "value": r["value"],
                    "unit": r["unit"],
                    "baseline": r.get("baseline"),
                    "vs": r.get("baseline_name"),
                    "ratio": r.get("ratio"),
                    "target": target,
                    "met?": verdict(met, target, r["value"]),
                    "note": r.get("note"),
                }
            )
    return rows


COLUMNS = [
    "benchmark",
    "metric",
    "value",
    "unit",
    "baseline",
    "vs",
    "ratio",
    "target",
    "met?",
    "note",
]


#: Printed under a quick run's tally when it missed a tier-3 target.
QUICK_TIER3_NOTE = (
    "note: a --quick run measures a tier-3 (process) kernel right after it starts, while the "
    "operating system may still run its child on the parent's core; every round trip then "
    "parks (about 10 us instead of 2.3 us). A full run measures it settled; see "
    "docs/benchmarks.md and docs/concepts/tiers.md."
)


def target_tally(rows: list[dict[str, Any]], *, quick: bool = False) -> str:
    """How many targets were met, missed, not run here or unreadable; the missed ones; and,
    for a quick run that missed a tier-3 target, why that is expected."""
    counts: dict[str, int] = {}
    for r in rows:
        word = r.get("met?")
        if word and word != "-":
            counts[word] = counts.get(word, 0) + 1
    if not counts:
        return "targets: none in this run"
    parts = [
        f"{counts[w]} {label}"
        for w, label in (
            ("met", "met"),
            ("MISSED", "MISSED"),
            ("not run", "not measured here"),
            ("?", "not checkable"),
        )
        if counts.get(w)
    ]
    missed = [f"{r['benchmark']}: {r['metric']}" for r in rows if r.get("met?") == "MISSED"]
    line = "targets (listed in docs/benchmarks.md): " + ", ".join(parts)
    if missed:
        line += "\nmissed: " + "; ".join(missed)
    if quick and any(m.startswith(("extended: tier 3", "tier_latency: tier 3")) for m in missed):
        line += "\n" + QUICK_TIER3_NOTE
    return line


def _short(rows: list[dict[str, Any]], width: int = 48) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        r = dict(r)
        for key in ("note", "vs"):
            text = r.get(key)
            if isinstance(text, str) and len(text) > width:
                r[key] = text[: width - 3] + "..."
        out.append(r)
    return out


def print_summary(results: dict[str, Any]) -> None:
    m = results["machine"]
    print_table(
        f"Benchmark summary ({'quick' if results['quick'] else 'full'} run, {m['time']}; "
        f"{m.get('cpu', '?')}, {m['cpus']} CPUs, GPU: {m.get('gpu') or 'none'}, "
        f"Python {m['python']}); ratio = value / baseline measured in the same run",
        _short(summary_rows(results)),
        COLUMNS,
    )
    print("\n" + target_tally(summary_rows(results), quick=bool(results.get("quick"))))


def markdown(results: dict[str, Any]) -> str:
    """The summary as a Markdown table (for docs/benchmarks.md)."""
    m = results["machine"]
    lines = [
        f"Measured {m['time']} on {m.get('cpu', '?')} ({m['cpus']} CPUs), GPU: "
        f"{m.get('gpu') or 'none'}, Python {m['python']}, {m['platform']}; "
        f"{'quick' if results['quick'] else 'full'} run.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in summary_rows(results):
        cells = [_fmt(r.get(c)).replace("|", "/") for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- comparing -------------------------------------------------------------------------------


def compare(
    old: dict[str, Any], new: dict[str, Any], tolerance: float, by: str = "auto"
) -> tuple[list[dict[str, Any]], int]:
    """Rows of (benchmark, metric, old, new, change, verdict) and the number of regressions."""

    def index(res: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        return {
            (name, r["name"]): r
            for name, rec in res["scripts"].items()
            for r in rec.get("summary", [])
        }

    before, after = index(old), index(new)
    rows, regressions = [], 0
    keys = [*after, *(k for k in before if k not in after)]
    for key in keys:
        o, n = before.get(key), after.get(key)
        row: dict[str, Any] = {"benchmark": key[0], "metric": key[1]}
        if o is None or n is None:
            row["verdict"] = "only in old run" if n is None else "only in new run"
            rows.append(row)
            continue
        use_ratio = by == "ratio" or (by == "auto" and o.get("ratio") and n.get("ratio"))
        field = "ratio" if use_ratio else "value"
        ov, nv = o.get(field), n.get(field)
        row.update({"compared": field, "old": ov, "new": nv})
        if not n.get("compare", True):
            row["verdict"] = "a check, not compared (see its target)"
            rows.append(row)
            continue
        if not _number(ov) or not _number(nv) or ov == 0 or nv == 0:
            row["verdict"] = "not comparable"
            rows.append(row)
            continue
        change = nv / ov if n.get("higher_is_better", True) else ov / nv
        row["change"] = change
        if change < 1.0 - tolerance:
            row["verdict"] = "REGRESSION"
            regressions += 1
        elif change > 1.0 + tolerance:
            row["verdict"] = "better"
        else:
            row["verdict"] = "same (within tolerance)"
        rows.append(row)
    return rows, regressions


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def comparison_markdown(
    old: dict[str, Any], new: dict[str, Any], rows: list[dict[str, Any]], tolerance: float
) -> str:
    """The rows of `compare` as a Markdown table, under a line naming the two runs."""
    o, n = old.get("machine", {}), new.get("machine", {})
    columns = ["benchmark", "metric", "compared", "old", "new", "change", "verdict"]
    lines = [
        f"Comparison: old {o.get('time', '?')} ({o.get('cpu', '?')}) -> new "
        f"{n.get('time', '?')} ({n.get('cpu', '?')}); change = new / old in the better "
        f"direction (> 1 is better; tolerance {tolerance:.0%}).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)).replace("|", "/") for c in columns) + " |")
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line that points at --help (not the usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _load(path: str, ap: argparse.ArgumentParser) -> dict[str, Any]:
    """A saved run, or a one-line usage error naming the file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        ap.error(f"cannot read {path}: {exc.strerror or exc}")
    except (ValueError, UnicodeDecodeError) as exc:
        ap.error(f"{path} is not JSON ({exc}): give a file written by --save")
    if not isinstance(data, dict) or not isinstance(data.get("scripts"), dict):
        ap.error(f"{path} is not a saved run (no 'scripts'): give a file written by --save")
    return data


def _write_markdown(path: str, text: str) -> None:
    Path(path).write_text(text)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(
        prog="python -m pydotcompute bench",
        description="Run the pydotcompute benchmark suite and print one summary table.",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the fast subset with small sizes (well under a minute)",
    )
    ap.add_argument(
        "--only", default=None, help="comma-separated benchmark names to run (see --list)"
    )
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    ap.add_argument(
        "--save",
        default=None,
        metavar="FILE",
        help="also save the suite's JSON here (always saved to benchmarks/results/suite.json)",
    )
    ap.add_argument(
        "--results-dir",
        default=str(HERE / "results"),
        help="where each script's JSON, log and chart go",
    )
    ap.add_argument(
        "--compare",
        nargs="+",
        metavar="FILE",
        help="OLD.json: run, then compare with it; OLD.json NEW.json: compare "
        "two saved runs without running",
    )
    ap.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a compared row got worse by more than --tolerance",
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=0.25,
        help="relative change counted as noise when comparing (default 0.25)",
    )
    ap.add_argument(
        "--compare-by",
        choices=("auto", "ratio", "value"),
        default="auto",
        help="compare the same-run ratios (auto: when both runs have them) or the raw values",
    )
    ap.add_argument(
        "--markdown", default=None, metavar="FILE", help="write the summary as a Markdown table"
    )
    ap.add_argument(
        "--show",
        default=None,
        metavar="FILE",
        help="print the summary of a saved run (and --markdown) without running anything",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per script (default 300 with --quick, 1800 without)",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="show each script's output")
    args = ap.parse_args(argv)

    scripts = _discover()
    if args.list:
        for s in scripts:
            there = "" if (HERE / s.file).exists() else "  (not in this tree)"
            print(f"{s.name:<18} {'quick+full' if s.quick else 'full':<11} {s.question}{there}")
        return 0

    if args.show:
        saved = _load(args.show, ap)
        print_summary(saved)
        if args.markdown:
            _write_markdown(args.markdown, markdown(saved))
        return 0

    if args.compare and len(args.compare) > 2:
        ap.error("--compare takes OLD.json, or OLD.json NEW.json")
    old = _load(args.compare[0], ap) if args.compare else None
    if old is not None and len(args.compare) == 2:
        new = _load(args.compare[1], ap)
        status, rows = _report_comparison(old, new, args)
        if args.markdown:
            text = markdown(new) + "\n" + comparison_markdown(old, new, rows, args.tolerance)
            _write_markdown(args.markdown, text)
        return status

    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = wanted - {s.name for s in scripts}
        if unknown:
            ap.error(f"unknown benchmark(s) {sorted(unknown)}; known: {[s.name for s in scripts]}")
        chosen = [s for s in scripts if s.name in wanted]
    else:
        chosen = [s for s in scripts if s.quick or not args.quick]
    timeout = args.timeout or (300.0 if args.quick else 1800.0)
    outdir = Path(args.results_dir)
    outdir.mkdir(parents=True, exist_ok=True)

    results: dict[str, Any] = {
        "suite": "pydotcompute",
        "quick": args.quick,
        "machine": machine(),
        "scripts": {},
    }
    print(
        f"Running {len(chosen)} benchmark(s){' (quick)' if args.quick else ''}; output in {outdir}/"
    )
    t_all = time.perf_counter()
    failed = 0
    for i, script in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {script.name:<18} {script.question} ...", flush=True)
        rec = run_script(script, args.quick, outdir, args.verbose, timeout)
        results["scripts"][script.name] = rec
        failed += rec["status"] in ("failed", "timeout")
        extra = f" - {rec['note']}" if rec.get("note") else ""
        print(f"      {rec['status']} in {rec['seconds']:.1f} s{extra}", flush=True)
    results["seconds"] = time.perf_counter() - t_all

    print_summary(results)
    charts = [c for rec in results["scripts"].values() for c in rec.get("charts", [])]
    if charts:
        print("\ncharts: " + ", ".join(os.path.relpath(c) for c in charts))
    print(f"\nsuite finished in {results['seconds']:.1f} s")
    for target in filter(None, (str(outdir / "suite.json"), args.save)):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(results, indent=2, default=str))
        print(f"saved {target}")

    status = 1 if failed else 0
    text = markdown(results)
    if old is not None:
        compared, rows = _report_comparison(old, results, args)
        status = max(status, compared)
        text += "\n" + comparison_markdown(old, results, rows, args.tolerance)
    if args.markdown:
        _write_markdown(args.markdown, text)
    return status


def _report_comparison(
    old: dict[str, Any], new: dict[str, Any], args: Any
) -> tuple[int, list[dict[str, Any]]]:
    """Print the comparison; returns (exit status, its rows)."""
    rows, regressions = compare(old, new, args.tolerance, args.compare_by)
    if old.get("quick") != new.get("quick"):
        print("\nnote: comparing a quick run with a full run: sizes differ, rows may not match")
    o, n = old.get("machine", {}), new.get("machine", {})
    print_table(
        f"Comparison: old {o.get('time', '?')} ({o.get('cpu', '?')}) -> new {n.get('time', '?')} "
        f"({n.get('cpu', '?')}); change = new / old in the better direction "
        f"(> 1 is better; tolerance {args.tolerance:.0%})",
        rows,
        ["benchmark", "metric", "compared", "old", "new", "change", "verdict"],
    )
    if regressions:
        print(f"\n{regressions} regression(s) beyond {args.tolerance:.0%}")
        if args.fail_on_regression:
            return 1, rows
    else:
        print("\nno regressions beyond the tolerance")
    return 0, rows


def _run() -> int:
    try:
        status = main()
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return status
    except BrokenPipeError:
        # Python flushes stdout once more on the way out: point it at /dev/null first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


if __name__ == "__main__":
    sys.exit(_run())
