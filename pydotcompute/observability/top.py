"""``python -m pydotcompute top``: a live terminal view of the kernels behind a metrics URL.

It reads a Prometheus endpoint (``runtime.serve_metrics``), so it watches any process that
serves metrics, local or remote. Each frame shows one row per kernel (tier, state, msg/s,
inbox depth, p50/p99 latency, processed, drops, restarts, errors), busiest first.

Design notes:
- msg/s is the change of ``pydotcompute_messages_processed_total`` between two scrapes;
  ``--once`` takes two scrapes ``min(interval, 0.5)`` s apart so its one frame has a rate.
- Percentiles are interpolated inside the histogram's ``le`` buckets, as PromQL's
  ``histogram_quantile`` does: within one bucket of the true value.
"""

from __future__ import annotations

import argparse
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .deps import require

__all__ = ("KernelView", "main", "parse_metrics", "render", "with_rates")

_PREFIX = "pydotcompute_"


@dataclass
class KernelView:
    """One kernel's row, from one scrape."""

    kernel: str
    tier: str = ""
    state: str = "?"
    processed: float = 0.0
    received: float = 0.0
    depth: float = 0.0
    dropped: float = 0.0
    restarts: float = 0.0
    errors: float = 0.0
    #: (upper bound in seconds, cumulative count), ascending, +Inf last
    buckets: list[tuple[float, float]] = field(default_factory=list)
    rate: float | None = None  # msg/s, from the previous scrape

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) of the latency in seconds, or None without data."""
        return _quantile(q, self.buckets)


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower  # beyond the last finite bound: its bound is the best estimate
            inside = count - below
            frac = (rank - below) / inside if inside > 0 else 1.0
            return lower + (le - lower) * frac
        lower, below = le, count
    return lower


def parse_metrics(text: str) -> dict[str, KernelView]:
    """The kernels in a scrape's text (the ``replica=""`` series: the kernels as wholes)."""
    parser = require("prometheus_client.parser", "pydotcompute top")
    views: dict[str, KernelView] = {}

    def view(labels: dict[str, str]) -> KernelView | None:
        if labels.get("replica", ""):
            return None
        kid = labels.get("kernel")
        if kid is None:
            return None
        v = views.get(kid)
        if v is None:
            v = views[kid] = KernelView(kid)
        v.tier = labels.get("tier", v.tier)
        return v

    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            name: str = s.name
            if not name.startswith(_PREFIX):
                continue
            v = view(s.labels)
            if v is None:
                continue
            short = name[len(_PREFIX) :]
            value = float(s.value)
            if short == "messages_processed_total":
                v.processed = value
            elif short == "messages_received_total":
                v.received = value
            elif short == "messages_dropped_total":
                v.dropped += value
            elif short == "inbox_depth":
                v.depth = value
            elif short == "kernel_restarts_total":
                v.restarts = value
            elif short == "kernel_errors_total":
                v.errors = value
            elif short == "kernel_state" and value == 1:
                v.state = s.labels.get("state", "?")
            elif short == "message_latency_seconds_bucket":
                v.buckets.append((float(s.labels["le"]), value))
    for v in views.values():
        v.buckets.sort()
    return views


def with_rates(
    now: dict[str, KernelView], before: dict[str, KernelView] | None, seconds: float
) -> dict[str, KernelView]:
    """Set each view's msg/s from the scrape ``seconds`` earlier (``before``); returns ``now``."""
    if before is not None and seconds > 0:
        for kid, v in now.items():
            old = before.get(kid)
            if old is not None:
                v.rate = max(0.0, (v.processed - old.processed) / seconds)
    return now


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"


def _num(x: float) -> str:
    return f"{x:,.0f}"


def render(views: dict[str, KernelView], url: str) -> Any:
    """A ``rich`` table of the kernels, busiest first (by msg/s, then by processed)."""
    rich_table = require("rich.table", "pydotcompute top")
    table = rich_table.Table(title=f"pydotcompute top  {url}", title_justify="left")
    for col in ("kernel", "tier", "state"):
        table.add_column(col, no_wrap=True)
    for col in ("msg/s", "inbox", "p50", "p99", "processed", "drops", "restarts", "errors"):
        table.add_column(col, justify="right")
    rows = sorted(views.values(), key=lambda v: (-(v.rate or 0.0), -v.processed, v.kernel))
    for v in rows:
        table.add_row(
            v.kernel,
            v.tier,
            v.state,
            "-" if v.rate is None else f"{v.rate:,.1f}",
            _num(v.depth),
            _ms(v.quantile(0.5)),
            _ms(v.quantile(0.99)),
            _num(v.processed),
            _num(v.dropped),
            _num(v.restarts),
            _num(v.errors),
        )
    if not rows:
        table.caption = "no kernels"
    return table


def _fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
    return body.decode("utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``top`` (the ``python -m pydotcompute top`` entry); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m pydotcompute top",
        description="Live view of the kernels of a process serving pydotcompute metrics.",
    )
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:9464/metrics",
        help="the metrics endpoint (runtime.serve_metrics); default %(default)s",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between frames (default 1)"
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.interval <= 0:
        parser.error(f"--interval must be > 0, got {args.interval}")
    rich_console = require("rich.console", "pydotcompute top")
    console = rich_console.Console()
    if not console.is_terminal:  # piped (a script, a test): wide enough for whole names
        console = rich_console.Console(width=200)
    timeout = max(2.0, args.interval * 2)

    def scrape() -> tuple[dict[str, KernelView], float]:
        return parse_metrics(_fetch(args.url, timeout)), time.monotonic()

    try:
        if args.once:
            before, t0 = scrape()
            time.sleep(min(args.interval, 0.5))
            now, t1 = scrape()
            console.print(render(with_rates(now, before, t1 - t0), args.url))
            return 0
        rich_live = require("rich.live", "pydotcompute top")
        prev, t_prev = scrape()
        with rich_live.Live(render(prev, args.url), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                now, t_now = scrape()
                live.update(render(with_rates(now, prev, t_now - t_prev), args.url))
                live.refresh()
                prev, t_prev = now, t_now
    except (urllib.error.URLError, OSError) as exc:
        console.print(f"cannot read {args.url}: {exc} (is runtime.serve_metrics running there?)")
        return 1
    except KeyboardInterrupt:
        return 0
