"""What observability costs a 3-stage tier-1 pipeline's throughput.

A producer sends N messages into ``a -> b -> c`` (three asyncio actors joined with
``runtime.connect``) while the caller reads N from ``c``. Variants, run in interleaved
rounds (each round runs every variant once, in rotating order, on a fresh runtime) so that
machine noise falls on all of them alike:

- ``baseline``: nothing served;
- ``scraped``: ``runtime.serve_metrics(port=0)`` with a scraper process reading the
  endpoint over HTTP every 100 ms, as Prometheus would (the cost of serving is the
  snapshots taken on the loop and the server thread's formatting, under the GIL);
- ``tracing on``: ``RingKernelRuntime(tracing=True)`` with the OpenTelemetry SDK's tracer
  provider and no exporter (only when the SDK is installed and the runtime supports it).

The median rate of each variant is reported with its ratio to the baseline (target:
``scraped`` >= 0.95). Tracing off is the baseline itself: it adds nothing to the message
path (a tracing runtime swaps in traced classes instead), which running this script on
an older checkout (baseline only) and on this one compares. Run
``python benchmarks/observability_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, save_json
from _suite import summary_row

from pydotcompute import RingKernelRuntime, message


@message
class Item:
    value: int


async def relay(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


_SCRAPE_LOOP = """
import sys, time, urllib.request
url, period = sys.argv[1], float(sys.argv[2])
n = 0
try:
    while True:
        time.sleep(period)
        with urllib.request.urlopen(url, timeout=10) as resp:
            resp.read()
        n += 1
        print(n, flush=True)
except KeyboardInterrupt:
    pass
"""


class Scraper:
    """A separate process (as Prometheus is) reading a metrics URL every ``period`` s."""

    def __init__(self, url: str, period: float = 0.1) -> None:
        self.url = url
        self.period = period
        self.scrapes = 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Scraper:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SCRAPE_LOOP, self.url, str(self.period)],
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGINT)
        out, _ = self._proc.communicate(timeout=30)
        lines = out.split()
        self.scrapes = int(lines[-1]) if lines else 0


def _supports_tracing() -> bool:
    return "tracing" in inspect.signature(RingKernelRuntime.__init__).parameters


def _install_sdk() -> bool:
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return False
    trace.set_tracer_provider(TracerProvider())
    return True


async def pipeline_rate(n: int, variant: str) -> tuple[float, int]:
    """Messages per second through a -> b -> c, and how many scrapes happened."""
    opts: dict[str, Any] = {"tracing": True} if variant == "tracing on" else {}
    async with RingKernelRuntime(**opts) as rt:
        for kid in "abc":
            await rt.launch(kid, relay, input_type=Item, output_type=Item)
            await rt.activate(kid)
        rt.connect("a", "b")
        rt.connect("b", "c")

        async def produce() -> None:
            for i in range(n):
                await rt.send("a", Item(value=i))

        async def run() -> float:
            t0 = time.perf_counter()
            producer = asyncio.create_task(produce())
            for _ in range(n):
                await rt.receive("c")
            await producer
            return n / (time.perf_counter() - t0)

        if variant != "scraped":
            return await run(), 0
        host, port = rt.serve_metrics(port=0)
        with Scraper(f"http://{host}:{port}/metrics") as scraper:
            await asyncio.sleep(0.5)  # the scraper's start-up stays out of the timing
            rate = await run()
        return rate, scraper.scrapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    parser.add_argument("--json", help="where to save the results (default benchmarks/results)")
    parser.add_argument(
        "--variants",
        default="baseline,scraped,tracing on",
        help="comma-separated subset of: baseline, scraped, tracing on (baseline always runs)",
    )
    args = parser.parse_args(argv)
    wanted = {v.strip() for v in args.variants.split(",")}
    n, rounds = (50_000, 5) if args.quick else (200_000, 9)
    variants = ["baseline"]
    # (an older checkout: baseline only)
    if "scraped" in wanted and hasattr(RingKernelRuntime, "serve_metrics"):
        variants.append("scraped")
    if "tracing on" in wanted and _supports_tracing() and _install_sdk():
        variants.append("tracing on")
    rates: dict[str, list[float]] = {v: [] for v in variants}
    scrapes: dict[str, int] = dict.fromkeys(variants, 0)
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            rate, k = asyncio.run(pipeline_rate(n, v))
            rates[v].append(rate)
            scrapes[v] += k
    base = statistics.median(rates["baseline"])
    rows = []
    for v in variants:
        med = statistics.median(rates[v])
        rows.append(
            {
                "variant": v,
                "msg/s (median)": med,
                "min": min(rates[v]),
                "max": max(rates[v]),
                "ratio": med / base,
                "scrapes": scrapes[v],
            }
        )
    print_table(
        f"3-stage tier-1 pipeline, {n:,} messages x {rounds} interleaved rounds",
        rows,
        ["variant", "msg/s (median)", "min", "max", "ratio", "scrapes"],
    )
    for r in rows:
        if r["variant"] != "baseline":
            cost = (1 - r["ratio"]) * 100
            print(f"{r['variant']}: {cost:.1f} % below the baseline (metrics target <= 5 %)")
    summary = [
        summary_row(
            "3-stage pipeline, nothing served (tracing off), throughput",
            base,
            "msg/s",
            higher_is_better=True,
        )
    ]
    for r in rows:
        if r["variant"] == "scraped":
            summary.append(
                summary_row(
                    "3-stage pipeline, metrics served and scraped every 100 ms, throughput",
                    r["msg/s (median)"],
                    "msg/s",
                    higher_is_better=True,
                    baseline=base,
                    baseline_name="same pipeline, nothing served",
                    target="ratio >= 0.95",
                )
            )
        elif r["variant"] == "tracing on":
            summary.append(
                summary_row(
                    "3-stage pipeline, tracing on (SDK, no exporter), throughput",
                    r["msg/s (median)"],
                    "msg/s",
                    higher_is_better=True,
                    baseline=base,
                    baseline_name="same pipeline, tracing off",
                )
            )
    save_json(
        "observability",
        {"messages": n, "rounds": rounds, "rows": rows, "rates": rates, "summary": summary},
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
