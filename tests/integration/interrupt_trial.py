"""A backed-up pipeline interrupted by Ctrl-C, once or twice: head -> tail.

The program fills a two-stage pipeline until every bound is reached (nobody reads the
tail's replies, so the tail blocks on its full outbox, the head on the tail's full inbox and
the sender on the head's), prints ``backed up`` and waits for SIGINT. The first one
cancels its main task, as Ctrl-C does under ``asyncio.run``: leaving ``async with
RingKernelRuntime()`` shuts the pipeline down, which cannot drain (nothing reads the tail)
and so takes each stage's ``drain_timeout``. It prints ``shutting down`` as it leaves the
block, so a second SIGINT can be sent while the shutdown runs.

Whatever the number of signals, it then prints one JSON line of figures: how many
messages were sent, the replies still readable after the shutdown, the messages handed
back and the drops counted, and the shutdown's report. Every sent message must be one of
those. Run by hand: ``python -m tests.integration.interrupt_trial [tier]`` and press
Ctrl-C (twice, to try the second one). Actors are module-level so a child process can
import them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import QueueClosedError

#: Seconds each stage may drain at shutdown: long enough for a second Ctrl-C to land in it.
DRAIN_S = 3.0


@message
class Item:
    seq: int


async def head(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


async def tail_async(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


def tail_sync(ctx: Any) -> None:
    while not ctx.should_terminate:
        try:
            item = ctx.receive(timeout=0.05)
        except QueueClosedError:
            return
        if item is not None:
            ctx.send(item)


async def run_app(tier: str, figures: dict[str, Any]) -> None:
    rt = RingKernelRuntime()
    figures.update(sent=0)
    try:
        async with rt:
            tail: Any = tail_async if tier == "asyncio" else tail_sync
            await rt.launch(
                "tail",
                tail,
                input_type=Item,
                output_type=Item,
                tier=tier,
                queue_size=4096,
                drain_timeout=DRAIN_S,
            )
            await rt.launch(
                "head",
                head,
                input_type=Item,
                output_type=Item,
                queue_size=8192,
                drain_timeout=DRAIN_S,
            )
            rt.connect("head", "tail")
            await rt.activate("tail")
            await rt.activate("head")
            try:
                announced = False
                while True:
                    sending = asyncio.ensure_future(rt.send("head", Item(seq=figures["sent"])))
                    done, _ = await asyncio.wait({sending}, timeout=0.5)
                    if not done and not announced:
                        announced = True
                        print("backed up", flush=True)  # interrupt now
                    await sending
                    figures["sent"] += 1
            except asyncio.CancelledError:
                print("shutting down", flush=True)  # a second interrupt lands in it
                raise
    finally:
        kernels = ("head", "tail")
        # the replies the shutdown reports unread stay readable until the kernel is removed
        figures["readable"] = sum(len(rt.take_unread(k)) for k in kernels)
        report_dropped = sum(rt.get_counters(k).messages_dropped for k in kernels)
        figures["dropped_at_report"] = report_dropped
        deadline = time.monotonic() + 5
        while (
            figures["readable"] + sum(rt.get_counters(k).messages_dropped for k in kernels)
            < figures["sent"]
            and time.monotonic() < deadline
        ):  # a thread cut off mid-message finishes it late; its drop is counted then
            time.sleep(0.02)
        figures["undelivered"] = sum(len(rt.get_kernel(k).undelivered) for k in kernels)
        figures["dropped"] = sum(rt.get_counters(k).messages_dropped for k in kernels)
        figures["states"] = sorted({rt.get_kernel(k).state.name for k in kernels})
        report = rt.shutdown_report
        if report is not None:
            figures["report"] = dict(report)
            figures["unread"] = dict(report.unread)
            figures["interrupted"] = report.interrupted


def main(argv: list[str]) -> int:
    tier = argv[0] if argv else "asyncio"
    figures: dict[str, Any] = {}
    code = 0
    try:
        asyncio.run(run_app(tier, figures))
    except KeyboardInterrupt:
        code = 130
    print(json.dumps(figures), flush=True)
    return code


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main(sys.argv[1:]))
