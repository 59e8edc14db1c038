"""A sensor pipeline app interrupted mid-stream: source -> detector pool -> sink.

Readings go into an asyncio ``source`` stage, through a 2-replica process-tier ``detect``
pool (each replica in a child process) and into an asyncio ``sink`` that counts results.
The app is interrupted while it streams (its main task cancelled, as Ctrl-C does under
``asyncio.run``), so leaving ``async with RingKernelRuntime()`` shuts the pipeline down
with messages everywhere in flight. The figures it returns say whether anything was lost.

Run by hand (``python -m tests.integration.pipeline_trial 200000``) it prints
``streaming`` once a third of the results are counted: press Ctrl-C (or send SIGINT to its
process group) and the figures are printed as one JSON line. Actors are module-level so
the process tier's children can import them.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import QueueClosedError


@message
class Reading:
    seq: int
    value: float


@message
class Result:
    seq: int
    anomaly: bool


def detect(ctx: Any) -> None:
    """The detector: a plain function, one per child process."""
    while not ctx.should_terminate:
        try:
            reading = ctx.receive(timeout=0.05)
        except QueueClosedError:
            return
        if reading is None:
            continue
        ctx.send(Result(seq=reading.seq, anomaly=reading.value > 0.99))


def _ours() -> list[int]:
    """The pids of this process's children that run pydotcompute actors (multiprocessing
    names them ``pydotcompute-<kernel id>``)."""
    return sorted(
        p.pid
        for p in multiprocessing.active_children()
        if p.pid is not None and p.name.startswith("pydotcompute")
    )


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _segments_of(pid: int) -> list[str]:
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"pdc_{pid}_"))
    except OSError:
        return []


async def run_app(count: int, figures: dict[str, Any], *, streaming: asyncio.Event) -> None:
    """Stream ``count`` readings; ``figures`` is filled in as it goes and after shutdown
    (also when the task running this is cancelled). ``streaming`` is set once a third of
    the results have been counted."""
    seen = bytearray(count)
    figures.update(sent=0, produced=0, counted=0, duplicates=0)

    async def source(ctx: Any) -> None:
        while not ctx.should_terminate:
            reading = await ctx.receive()
            figures["produced"] += 1
            await ctx.send(reading)

    async def sink(ctx: Any) -> None:
        third = max(1, count // 3)
        while not ctx.should_terminate:
            result = await ctx.receive()
            if seen[result.seq]:
                figures["duplicates"] += 1
            seen[result.seq] = 1
            figures["counted"] += 1
            if figures["counted"] >= third:
                streaming.set()

    rt = RingKernelRuntime()
    started = time.perf_counter()
    try:
        async with rt:
            await rt.launch("sink", sink, input_type=Result, queue_size=1024)
            await rt.launch(
                "detect",
                detect,
                input_type=Reading,
                output_type=Result,
                tier="process",
                replicas=2,
                queue_size=1024,
            )
            await rt.launch(
                "source", source, input_type=Reading, output_type=Reading, queue_size=1024
            )
            rt.connect("source", "detect")
            rt.connect("detect", "sink")
            for kid in ("sink", "detect", "source"):
                await rt.activate(kid)
            figures["children"] = _ours()
            for i in range(count):
                await rt.send("source", Reading(seq=i, value=(i * 7919 % 1000) / 1000))
                figures["sent"] += 1
    finally:
        figures["seconds"] = round(time.perf_counter() - started, 3)
        # launched kernels: running ones, and terminated ones (out of kernel_ids, readable)
        launched = set(rt.kernel_ids) | set(rt.terminated_ids)
        kernels = [k for k in ("source", "detect", "sink") if k in launched]
        figures["undelivered"] = sum(len(rt.get_kernel(k).undelivered) for k in kernels)
        figures["dropped"] = sum(rt.get_telemetry(k).messages_dropped for k in kernels)
        figures["states"] = sorted({rt.get_kernel(k).state.name for k in kernels})
        children = set(figures.get("children", ())) | set(_ours())
        figures["children_left"] = sorted(pid for pid in children if _alive(pid))
        figures["segments_left"] = _segments_of(os.getpid())


async def _main(count: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    streaming = asyncio.Event()

    async def announce() -> None:
        await streaming.wait()
        print("streaming", flush=True)  # interrupt now (Ctrl-C, SIGINT)

    announcer = asyncio.create_task(announce())
    try:
        await run_app(count, figures, streaming=streaming)
        await asyncio.Event().wait()  # every reading sent: only an interrupt ends the app
    finally:
        announcer.cancel()
        print(json.dumps(figures), flush=True)
    return figures


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 200_000
    try:
        asyncio.run(_main(count))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main(sys.argv[1:]))
