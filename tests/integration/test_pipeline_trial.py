"""An app interrupted mid-stream loses nothing: source -> 2-replica process pool -> sink.

Leaving ``async with RingKernelRuntime()`` because the main task was cancelled (what
Ctrl-C does under ``asyncio.run``) shuts the pipeline down head to tail: every reading the
source produced is detected and counted by the sink exactly once, nothing is handed back
or dropped, and no child process or ``/dev/shm`` segment is left. Once in-process (the
task cancelled) and once as a real program interrupted by SIGINT sent to its whole
process group, as a terminal's Ctrl-C is.

``PYDOTCOMPUTE_TRIAL_READINGS`` sets how many readings are streamed (the full trial is
200,000: run ``python -m tests.integration.pipeline_trial 200000`` and press Ctrl-C).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.pipeline_trial import run_app

READINGS = int(os.environ.get("PYDOTCOMPUTE_TRIAL_READINGS", "12000"))
BOUND_S = 90.0
ROOT = Path(__file__).resolve().parents[2]


def check_nothing_lost(figures: dict[str, Any], count: int) -> None:
    assert 0 < figures["sent"] < count, f"not interrupted mid-stream: {figures}"
    assert figures["produced"] >= figures["sent"], figures
    assert figures["counted"] == figures["produced"], figures
    assert figures["duplicates"] == 0, figures
    assert figures["undelivered"] == 0, figures
    assert figures["dropped"] == 0, figures
    assert figures["states"] == ["TERMINATED"], figures
    assert len(figures["children"]) == 2, figures  # the detector's two replicas
    assert figures["children_left"] == [], figures
    assert figures["segments_left"] == [], figures


async def test_cancelled_mid_stream_loses_nothing() -> None:
    figures: dict[str, Any] = {}
    streaming = asyncio.Event()
    app = asyncio.create_task(run_app(READINGS, figures, streaming=streaming))
    async with asyncio.timeout(BOUND_S):
        await asyncio.wait(
            [app, asyncio.create_task(streaming.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        app.cancel()  # as Ctrl-C cancels the main task
        with pytest.raises(asyncio.CancelledError):
            await app
    check_nothing_lost(figures, READINGS)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and /dev/shm")
def test_sigint_to_the_process_group_mid_stream_loses_nothing() -> None:
    count = max(READINGS, 20_000)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.pipeline_trial", str(count)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: Ctrl-C reaches the children too
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "streaming", line + proc.stderr.read()  # type: ignore[union-attr]
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    figures = json.loads(out.strip().splitlines()[-1])
    check_nothing_lost(figures, count)
    assert not [pid for pid in figures["children"] if _alive(pid)]
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"pdc_{proc.pid}_")]
    assert "Traceback" not in err, err[-2000:]
