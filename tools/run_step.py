"""Run one step of `make test` and record how it went; print the summary of all steps.

`make test` runs each step (lint, types, each pytest run, docs) through
`python tools/run_step.py --record FILE --name STEP -- COMMAND...`: the command's output
streams through unchanged, and one JSON line is appended to FILE with the step's exit
status, duration and the lines that say what it found (pytest's final counts, ruff's and
mypy's verdicts, the docs check, Pythons skipped). A failing step does not stop the others.
At the end `python tools/run_step.py --summary FILE` prints one table of every step and exits
non-zero when any step failed, so make (and CI) fail too.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

# lines worth repeating in the summary, by what prints them
_RESULT_PATTERNS = (
    re.compile(r"^=+ (?P<text>.*\bin [\d.]+s.*?) =+$"),  # pytest, default verbosity
    re.compile(
        r"^(?P<text>\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b"
        r".* in [\d.]+s.*)$"
    ),  # pytest -q
    re.compile(r"^(?P<text>All checks passed!)$"),  # ruff check
    re.compile(r"^(?P<text>Found \d+ errors?.*)$"),  # ruff check / mypy
    re.compile(r"^(?P<text>\d+ files? (?:already formatted|would be reformatted).*)$"),
    re.compile(r"^(?P<text>Would reformat: .*)$"),
    re.compile(r"^(?P<text>Success: no issues found.*)$"),  # mypy
    re.compile(r"^(?P<text>docs check: .*)$"),
    re.compile(r"^(?P<text>ERROR\s+-\s+.*)$"),  # mkdocs --strict
    re.compile(r"^(?P<text>test-versions: .*)$"),
    re.compile(r"^== (?P<text>the suite on Python .*)$"),
)


def results_of(line: str) -> str | None:
    """What `line` says about the step, or None when it is ordinary output."""
    text = line.rstrip("\n")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text).strip()  # without terminal colours
    for pattern in _RESULT_PATTERNS:
        m = pattern.match(plain)
        if m:
            return m.group("text")
    return None


def run(name: str, command: list[str], record: Path) -> int:
    """Run `command`, stream its output, append the step's record; return its exit status."""
    start = time.monotonic()
    found: list[str] = []
    try:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
    except OSError as exc:
        print(f"{name}: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        rc = 127
    else:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            result = results_of(line)
            if result is not None:
                found.append(result)
        rc = proc.wait()
    entry = {
        "step": name,
        "rc": rc,
        "seconds": round(time.monotonic() - start, 1),
        "results": found,
    }
    with record.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
    return rc


def summary(record: Path) -> int:
    """Print the table of every recorded step; 1 when any failed (or none ran)."""
    entries = []
    if record.exists():
        entries = [json.loads(ln) for ln in record.read_text().splitlines() if ln.strip()]
    if not entries:
        print(f"no steps recorded in {record}", file=sys.stderr)
        return 1
    width = max(len(e["step"]) for e in entries)
    print()
    print("=" * 30 + " make test: summary " + "=" * 30)
    for e in entries:
        verdict = "ok    " if e["rc"] == 0 else f"FAILED (exit {e['rc']})"
        details = "; ".join(e["results"]) or "-"
        print(f"{e['step']:<{width}}  {verdict:<16} {e['seconds']:>7.1f}s  {details}")
    failed = [e["step"] for e in entries if e["rc"] != 0]
    total = sum(e["seconds"] for e in entries)
    if failed:
        print(f"FAILED: {', '.join(failed)} ({len(entries) - len(failed)} of {len(entries)} ok)")
    else:
        print(f"all {len(entries)} steps passed in {total:.0f}s")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, command = args[:i], args[i + 1 :]
    ap = argparse.ArgumentParser(description="Run one make-test step, or print the summary.")
    ap.add_argument("--record", type=Path, help="the JSON-lines file of the steps")
    ap.add_argument("--name", help="the step's name")
    ap.add_argument("--summary", type=Path, help="print the summary of this file")
    opts = ap.parse_args(args)
    if opts.summary is not None:
        return summary(opts.summary)
    if opts.record is None or not opts.name or not command:
        ap.error("give --record FILE --name STEP -- COMMAND..., or --summary FILE")
    return run(opts.name, command, opts.record)


if __name__ == "__main__":
    sys.exit(main())
