"""Ctrl-C, once or more, on a real program whose pipeline is backed up: nothing unaccounted.

``tests/integration/interrupt_trial.py`` fills a head -> tail pipeline until every bound is
reached (nobody reads the tail) and waits. SIGINT is sent to its process group, as a
terminal's Ctrl-C is: the first one starts the shutdown (which cannot drain: it takes each
stage's ``drain_timeout``), the later ones land while it runs. Whatever their number, every
message the program sent must end once, as a reply still readable after the shutdown, a
message handed back or a counted drop; the shutdown's report must count every loss and
every unread reply, and say whether it was interrupted; the program exits with 130. On
uvloop (the default when installed) and on the standard loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

BOUND_S = 90.0
ROOT = Path(__file__).resolve().parents[2]


def _interrupt(tier: str, signals: int, loop: str) -> tuple[int, dict[str, Any], str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYDOTCOMPUTE_NO_UVLOOP", None)
    if loop == "asyncio":
        env["PYDOTCOMPUTE_NO_UVLOOP"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.interrupt_trial", tier],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "backed up", line + proc.stderr.read()  # type: ignore[union-attr]
        os.killpg(proc.pid, signal.SIGINT)
        line = proc.stdout.readline()
        assert line.strip() == "shutting down", line + proc.stderr.read()  # type: ignore[union-attr]
        if signals > 1:
            time.sleep(0.3)  # the shutdown takes each stage's drain_timeout (3 s): still on
        for _ in range(signals - 1):  # back to back: each lands before the program ends
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT to a process group")
@pytest.mark.parametrize(
    ("tier", "signals", "loop"),
    [
        ("asyncio", 1, "default"),
        ("asyncio", 2, "default"),
        ("asyncio", 2, "asyncio"),
        ("thread", 3, "default"),
        ("process", 2, "default"),
    ],
    ids=[
        "asyncio-once",
        "asyncio-twice",
        "asyncio-twice-plain-loop",
        "thread-three-times",
        "process-twice",
    ],
)
def test_every_message_is_accounted_for_whatever_the_number_of_interrupts(
    tier: str, signals: int, loop: str
) -> None:
    code, figures, err = _interrupt(tier, signals, loop)
    assert code == 130, (code, err[-2000:])
    sent, readable, dropped = figures["sent"], figures["readable"], figures["dropped"]
    assert sent > 0, figures
    assert figures["states"] == ["TERMINATED"], figures
    # every message ends once: a reply read after the shutdown, or a counted drop (which
    # counts the handed-back ones too)
    assert readable + dropped == sent, figures
    # ... and the report says so: every loss, and every reply left unread
    report, unread = figures["report"], figures["unread"]
    # (on the thread tier the message in a cut-off thread's hands is counted when the
    # thread finishes it, which may be after the report, and even before the script
    # reads its figures: at most one for each of its two kernels, docs/concepts/tiers.md)
    late = 2 if tier == "thread" else 0
    assert dropped - late <= sum(report.values()) <= dropped, figures
    assert sum(unread.values()) == readable, figures
    assert figures["interrupted"] is (signals > 1), figures
    assert "left unread at shutdown" in err, err[-2000:]
    if signals > 1:
        assert "shutdown interrupted (Ctrl-C)" in err, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
