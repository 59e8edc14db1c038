"""What observability costs a 3-stage tier-1 pipeline's throughput.

A producer sends N messages into ``a -> b -> c`` (three asyncio actors joined with
``runtime.connect``) while the caller reads N from ``c``. Variants, run in interleaved
rounds (each round runs every variant once, in rotating order, on a fresh runtime) so that
machine noise falls on all of them alike:

- ``baseline``: nothing served;
- ``scraped``: ``runtime.serve_metrics(port=0)`` with a scraper thread reading the endpoint
  over HTTP every 100 ms (the cost of serving is the snapshots taken on the loop and the
  scraper's share of the GIL);
- ``tracing on``: ``RingKernelRuntime(tracing=True)`` with the OpenTelemetry SDK's tracer
  provider and no exporter (only when the SDK is installed and the runtime supports it).

The median rate of each variant is reported with its ratio to the baseline (target:
``scraped`` >= 0.95). Tracing off is the baseline itself: its cost is one check per hop,
compared across code versions by running this script on each. Run
``python benchmarks/observability_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, save_json

from pydotcompute import RingKernelRuntime, message


@message
class Item:
    value: int


async def relay(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


class Scraper:
    """A thread reading a metrics URL every ``period`` seconds until stopped."""

    def __init__(self, url: str, period: float = 0.1) -> None:
        self.url = url
        self.period = period
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with urllib.request.urlopen(self.url, timeout=10) as resp:
                resp.read()
            self.scrapes += 1

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


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
            rate = await run()
        return rate, scraper.scrapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    parser.add_argument("--json", help="where to save the results (default benchmarks/results)")
    args = parser.parse_args(argv)
    n, rounds = (50_000, 5) if args.quick else (200_000, 9)
    variants = ["baseline", "scraped"]
    if _supports_tracing() and _install_sdk():
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
    scraped = next(r for r in rows if r["variant"] == "scraped")
    cost = (1 - scraped["ratio"]) * 100
    print(f"\nserving metrics (scraped every 100 ms) costs {cost:.1f} % (target <= 5 %)")
    save_json(
        "observability",
        {"messages": n, "rounds": rounds, "rows": rows, "rates": rates},
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
