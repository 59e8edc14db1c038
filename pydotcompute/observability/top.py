"""``python -m pydotcompute top``: a live terminal view of the kernels behind a metrics URL.

It reads a Prometheus endpoint (``runtime.serve_metrics``), so it watches any process that
serves metrics, local or remote. Each frame shows one row per kernel (tier, state, msg/s,
inbox depth, p50/p99 latency, processed, drops, restarts, errors), busiest first.

Design notes:
- msg/s is the change of ``pydotcompute_messages_processed_total`` between two scrapes;
  ``--once`` takes two scrapes ``min(interval, 0.5)`` s apart so its one frame has a rate.
  A counter that went down means the target restarted: the rate then counts from zero, as
  PromQL's ``rate`` does.
- Percentiles are interpolated inside the histogram's ``le`` buckets, as PromQL's
  ``histogram_quantile`` does: within one bucket of the true value.
- The endpoint may be anyone's, so nothing it sends is trusted: http(s) only (redirects
  too), a bounded body, one deadline per scrape from connect to last byte, and its text
  reaches the terminal as plain text with control characters escaped (never as markup).
- A scrape runs in a worker thread that the deadline abandons (after shutting its socket):
  a per-read socket timeout cannot stop a server that sends one byte a second, and a name
  lookup cannot be interrupted at all. The scrape uses ``http.client`` directly, so no
  proxy from the environment applies: a metrics endpoint is read where the URL says.
- A frame fits the console's width: columns whose numbers would not fit are left out, least
  telling first, and the frame says which; numbers are never cut, a long kernel id folds.
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import re
import socket
import ssl
import sys
import threading
import time
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._cli import OneLineParser
from ..exceptions import BackendNotAvailableError, InvalidConfigurationError, PyDotComputeError
from .deps import require

__all__ = (
    "DEFAULT_MAX_BODY",
    "DEFAULT_TIMEOUT",
    "KernelView",
    "MetricsFormatError",
    "ScrapeError",
    "check_url",
    "main",
    "parse_metrics",
    "read_metrics",
    "render",
    "with_rates",
)

_PREFIX = "pydotcompute_"
_MIB = 1 << 20
#: The largest answer read (16 MiB): a pydotcompute endpoint serves a few KiB a kernel.
DEFAULT_MAX_BODY = 16 * _MIB
#: Seconds one scrape may take, from connecting to the last byte of the answer.
DEFAULT_TIMEOUT = 5.0
_MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SCHEMES = ("http", "https")
_CHUNK = 64 * 1024
_LABEL_MAX = 200  # characters of a label shown; the rest is cut with an ellipsis
_REASON_MAX = 300  # characters of a server's words quoted in an error


class ScrapeError(PyDotComputeError):
    """A metrics endpoint could not be read, or its answer is not one ``top`` can show.

    Attributes:
        url: The endpoint (as given).
        reason: What went wrong, in one line, with the likely fix.
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = _clean(reason, _REASON_MAX)
        super().__init__(f"cannot read {_clean(url, _REASON_MAX)}: {self.reason}")


class MetricsFormatError(PyDotComputeError, ValueError):
    """A scrape's text is not the Prometheus text format of ``runtime.serve_metrics``."""


# --- text that reaches the terminal -----------------------------------------------------------


_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _clean(text: str, limit: int = _LABEL_MAX) -> str:
    """``text`` with control and format characters written as escapes, at most ``limit`` long.

    A kernel id or a server's answer may hold an escape sequence, a bell or a
    right-to-left override: shown raw they would drive the terminal, not show a name.
    """
    text = text[: limit + 1]
    out = []
    for ch in text:
        if unicodedata.category(ch)[0] == "C" or ch in "\u2028\u2029":
            code = ord(ch)
            if ch in _ESCAPES:
                out.append(_ESCAPES[ch])
            elif code < 0x100:
                out.append(f"\\x{code:02x}")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
        else:
            out.append(ch)
    cleaned = "".join(out)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


# --- reading an endpoint ----------------------------------------------------------------------


def check_url(url: str) -> urllib.parse.SplitResult:
    """``url`` split into its parts, once it is an http(s) URL naming a host.

    Raises:
        InvalidConfigurationError: another scheme (``file://``, ``ftp://``...), no host, a
            bad port, or credentials: ``top`` reads metrics over HTTP and nothing else.
    """
    shown = _clean(url, _REASON_MAX)
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # parsing the port is what checks it
    except ValueError as exc:
        raise InvalidConfigurationError(
            f"--url {shown!r} is not a URL ({exc}): give one like http://127.0.0.1:9464/metrics"
        ) from None
    if parts.scheme.lower() not in _SCHEMES:
        hint = ""
        if re.match(r"^[A-Za-z0-9.\-]+:\d+(/|$)", url):
            hint = f"; did you mean 'http://{shown}'?"
        raise InvalidConfigurationError(
            f"--url must be an http:// or https:// URL, got {shown!r}{hint} "
            "(top reads metrics over HTTP only, as runtime.serve_metrics serves them)"
        )
    if not parts.hostname:
        raise InvalidConfigurationError(
            f"--url {shown!r} names no host: give one, as in http://127.0.0.1:9464/metrics"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidConfigurationError(
            f"--url {shown!r} holds credentials, which top does not send: "
            "serve the metrics where they need none (runtime.serve_metrics binds 127.0.0.1)"
        )
    return parts


class _Fetch:
    """One GET of a metrics URL, run in a worker thread so the caller's deadline holds."""

    def __init__(self, url: str, deadline: float, max_bytes: int) -> None:
        self.url = url
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.body: bytes | None = None
        self.error: BaseException | None = None
        self._conns: list[http.client.HTTPConnection] = []

    def run(self) -> None:
        try:
            self.body = self._get()
        except BaseException as exc:  # handed to the caller's thread, which reports it
            self.error = exc

    def abort(self) -> None:
        """Shut the socket the worker waits on, so it ends now rather than at its timeout."""
        for conn in list(self._conns):
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _get(self) -> bytes:
        url = self.url
        for _ in range(_MAX_REDIRECTS + 1):
            parts = urllib.parse.urlsplit(url)
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            conn: http.client.HTTPConnection
            if parts.scheme.lower() == "https":
                conn = http.client.HTTPSConnection(
                    parts.hostname or "", parts.port, timeout=remaining
                )
            else:
                conn = http.client.HTTPConnection(
                    parts.hostname or "", parts.port, timeout=remaining
                )
            self._conns.append(conn)
            try:
                target = urllib.parse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
                if parts.query:
                    target += "?" + urllib.parse.quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
                conn.request("GET", target, headers={"Accept": "text/plain"})
                resp = conn.getresponse()
                if resp.status in _REDIRECTS:
                    url = self._follow(url, resp)
                    continue
                if resp.status != 200:
                    raise ScrapeError(
                        self.url,
                        f"HTTP {resp.status} {resp.reason} (is --url an endpoint of "
                        "runtime.serve_metrics?)",
                    )
                return self._read(resp)
            finally:
                conn.close()
        raise ScrapeError(self.url, f"more than {_MAX_REDIRECTS} redirects: give the final URL")

    def _follow(self, url: str, resp: http.client.HTTPResponse) -> str:
        location = resp.getheader("Location")
        if not location:
            raise ScrapeError(self.url, f"HTTP {resp.status} redirect without a Location")
        there = urllib.parse.urljoin(url, location)
        try:
            check_url(there)  # a redirect gets no more than --url would
        except InvalidConfigurationError:
            raise ScrapeError(
                self.url,
                f"a redirect to {there!r}, which top does not follow: it reads http:// and "
                "https:// URLs naming a host only (point --url at the metrics endpoint itself)",
            ) from None
        return there

    def _read(self, resp: http.client.HTTPResponse) -> bytes:
        too_big = (
            f"the answer is more than {self.max_bytes / _MIB:g} MiB, far beyond a pydotcompute "
            "scrape (a few KiB a kernel): check --url, or raise --max-body-mib"
        )
        declared = resp.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise ScrapeError(self.url, too_big)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = resp.read(_CHUNK)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > self.max_bytes:
                raise ScrapeError(self.url, too_big)
            chunks.append(chunk)


def _describe(exc: BaseException, timeout: float) -> str:
    """What a failed GET means, in words, with the likely fix."""
    if isinstance(exc, TimeoutError):
        return _late(timeout)
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is runtime.serve_metrics running there?)"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the server closed the connection without an answer"
    if isinstance(exc, http.client.BadStatusLine):
        return f"not an HTTP answer (it began {str(exc)[:80]})"
    if isinstance(exc, http.client.IncompleteRead):
        return "the answer was cut short: the server closed the connection mid-answer"
    if isinstance(exc, http.client.HTTPException):
        return f"a malformed HTTP answer ({type(exc).__name__}: {exc})"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc})"
    if isinstance(exc, ConnectionResetError):
        return "the server reset the connection"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


def _late(timeout: float) -> str:
    return (
        f"no complete answer within {timeout:g} s (for a slow or distant endpoint, raise --timeout)"
    )


def read_metrics(
    url: str, *, timeout: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BODY
) -> str:
    """The text of one scrape of ``url``.

    Only http(s) is read (redirects too), at most ``max_bytes`` of answer, and the whole
    scrape, from connecting to the last byte, ends within ``timeout`` seconds whatever the
    server does.

    Raises:
        InvalidConfigurationError: ``url`` is not an http(s) URL naming a host.
        ScrapeError: no answer, a late, oversized, non-200 or non-UTF-8 one.
    """
    check_url(url)
    job = _Fetch(url, time.monotonic() + timeout, max_bytes)
    worker = threading.Thread(target=job.run, name="pydotcompute-top-scrape", daemon=True)
    worker.start()
    try:
        worker.join(timeout)
    except BaseException:
        job.abort()
        raise
    if worker.is_alive():
        job.abort()  # the worker ends as soon as its socket is shut; nobody waits for it
        raise ScrapeError(url, _late(timeout))
    if isinstance(job.error, ScrapeError):
        raise job.error
    if job.error is not None:
        raise ScrapeError(url, _describe(job.error, timeout)) from job.error
    body = job.body or b""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError(
            url,
            f"the answer is not UTF-8 text (byte 0x{body[exc.start]:02x} at offset "
            f"{exc.start}): is --url an endpoint of runtime.serve_metrics?",
        ) from None


# --- the scrape's kernels ---------------------------------------------------------------------


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
    if not buckets or not all(math.isfinite(count) for _, count in buckets):
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
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


_HINT = "is this the text of runtime.serve_metrics?"


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Every sample of ``text`` as (name, labels, value).

    Raises:
        MetricsFormatError: ``text`` is not the Prometheus text format.
    """
    parser = require("prometheus_client.parser", "pydotcompute top")
    try:
        for fam in parser.text_string_to_metric_families(text):
            for s in fam.samples:
                yield s.name, s.labels, float(s.value)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        # the parser's own words, cut: it may quote a whole line of the body
        raise MetricsFormatError(
            f"not Prometheus text ({_clean(str(exc), 120)}): {_HINT}"
        ) from None


def _bound(name: str, kernel: str, labels: dict[str, str]) -> float:
    le = labels.get("le")
    if le is None:
        raise MetricsFormatError(
            f"a {name} sample of kernel {_clean(kernel, 80)!r} has no le label: {_HINT}"
        )
    try:
        bound = float(le)
    except ValueError:
        bound = math.nan
    if math.isnan(bound):
        raise MetricsFormatError(
            f"a {name} sample of kernel {_clean(kernel, 80)!r} has le={_clean(le, 80)!r}, "
            f"not a bound in seconds: {_HINT}"
        )
    return bound


def parse_metrics(text: str) -> dict[str, KernelView]:
    """The kernels in a scrape's text (the ``replica=""`` series: the kernels as wholes).

    Raises:
        MetricsFormatError: ``text`` is not Prometheus text, or a latency bucket has no
            numeric ``le`` bound.
    """
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

    for name, labels, value in _samples(text):
        if not name.startswith(_PREFIX):
            continue
        v = view(labels)
        if v is None:
            continue
        short = name[len(_PREFIX) :]
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
            v.state = labels.get("state", "?")
        elif short == "message_latency_seconds_bucket":
            v.buckets.append((_bound(name, v.kernel, labels), value))
    for v in views.values():
        v.buckets.sort()
    return views


def with_rates(
    now: dict[str, KernelView], before: dict[str, KernelView] | None, seconds: float
) -> dict[str, KernelView]:
    """Set each view's msg/s from the scrape ``seconds`` earlier (``before``); returns ``now``.

    A processed count lower than before means the kernel's process restarted: the rate then
    counts from zero, as PromQL's ``rate`` does across a counter reset.
    """
    if before is not None and seconds > 0:
        for kid, v in now.items():
            old = before.get(kid)
            if old is not None:
                delta = v.processed - old.processed
                v.rate = (v.processed if delta < 0 else delta) / seconds
    return now


# --- a frame ----------------------------------------------------------------------------------


def _count(x: float) -> str:
    """A count in at most 6 characters: ``99,999`` then ``123k``, ``1.23M``..."""
    if not math.isfinite(x):
        return str(x)
    if abs(x) < 100_000:
        return f"{x:,.0f}"
    sign, x = ("-" if x < 0 else ""), abs(x)
    for unit in ("k", "M", "G", "T", "P", "E"):
        x /= 1000
        if x < 999.5:
            digits = 2 if x < 9.995 else 1 if x < 99.95 else 0
            return f"{sign}{x:.{digits}f}{unit}"
    return f"{sign}{x * 1e18:.2g}"


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if math.isfinite(x) and abs(x) < 100 else _count(x)


def _seconds(s: float | None) -> str:
    """A latency in at most 7 characters: ``850 ns``, ``1.80 us``, ``31.0 ms``, ``2.10 s``."""
    if s is None:
        return "-"
    if not math.isfinite(s) or s < 0:
        return str(s) if not math.isfinite(s) else "-" + _seconds(-s)
    for scale, unit in ((1e-6, "ns"), (1e-3, "us"), (1.0, "ms")):
        if s < scale * 0.9995:
            v = s / scale * 1e3
            digits = 2 if v < 9.995 else 1 if v < 99.95 else 0
            return f"{v:.{digits}f} {unit}"
    return f"{s:.2f} s" if s < 9.995 else f"{s:.1f} s" if s < 99.95 else f"{_count(s)} s"


_NUMERIC = ("msg/s", "inbox", "p50", "p99", "processed", "drops", "restarts", "errors")
_COUNTERS = ("restarts", "errors", "drops")
_KERNEL_MIN = 12  # the narrowest the kernel column gets before other columns give way


def _cells(v: KernelView) -> dict[str, str]:
    return {
        "kernel": _clean(v.kernel),
        "tier": _clean(v.tier, 20),
        "state": _clean(v.state, 20),
        "msg/s": _rate(v.rate),
        "inbox": _count(v.depth),
        "p50": _seconds(v.quantile(0.5)),
        "p99": _seconds(v.quantile(0.99)),
        "processed": _count(v.processed),
        "drops": _count(v.dropped),
        "restarts": _count(v.restarts),
        "errors": _count(v.errors),
    }


def _fit(rows: list[dict[str, str]], width: int, cell_len: Callable[[str], int]) -> list[str]:
    """The columns that fit ``width`` whole; the others are left out, least telling first:
    counters that are all zero, the tier, the other counters, then p50, inbox, processed,
    state and p99. The kernel id and msg/s always stay (a long id folds)."""
    names = ["kernel", "tier", "state", *_NUMERIC]
    widths = {n: max([cell_len(n), *(cell_len(r[n]) for r in rows)]) for n in names}
    widths["kernel"] = min(widths["kernel"], _KERNEL_MIN)
    zero = [c for c in _COUNTERS if all(r[c] == "0" for r in rows)]
    order = [*zero, "tier", *(c for c in _COUNTERS if c not in zero)]
    order += ["p50", "inbox", "processed", "state", "p99"]
    shown = list(names)
    for name in order:
        if sum(widths[n] for n in shown) + 2 * (len(shown) - 1) <= width:
            break
        shown.remove(name)
    return shown


class _Frame:
    """One frame: the title, the kernels fitted to the console's width, a status line."""

    def __init__(
        self,
        views: dict[str, KernelView],
        url: str,
        status: str | None = None,
        max_rows: int | None = None,
    ) -> None:
        self.views = views
        self.url = url
        self.status = status
        self.max_rows = max_rows

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        rich_table = require("rich.table", "pydotcompute top")
        rich_text = require("rich.text", "pydotcompute top")
        rich_cells = require("rich.cells", "pydotcompute top")
        text = rich_text.Text
        yield text(f"pydotcompute top  {_clean(self.url, _REASON_MAX)}", style="bold")
        ordered = sorted(
            self.views.values(),
            key=lambda v: (-(v.rate or 0.0), -v.processed, v.kernel),
        )
        more = 0
        if self.max_rows is not None and len(ordered) > self.max_rows:
            more = len(ordered) - self.max_rows
            ordered = ordered[: self.max_rows]
        rows = [_cells(v) for v in ordered]
        shown = _fit(rows, options.max_width, rich_cells.cell_len)
        table = rich_table.Table(
            box=None, padding=(0, 1), pad_edge=False, show_edge=False, header_style="bold"
        )
        for name in shown:
            if name == "kernel":
                table.add_column(name, overflow="fold")
            elif name in _NUMERIC:
                table.add_column(name, justify="right", no_wrap=True)
            else:
                table.add_column(name, no_wrap=True)
        for r in rows:
            table.add_row(*(text(r[name]) for name in shown))
        yield table
        notes = []
        if not rows:
            notes.append("no kernels")
        if more:
            notes.append(f"{more} more kernel(s) below, not shown (busiest first)")
        hidden = [n for n in ("kernel", "tier", "state", *_NUMERIC) if n not in shown]
        if hidden and rows:
            notes.append(f"not shown at this width: {', '.join(hidden)} (widen the terminal)")
        for note in notes:
            yield text(note, style="dim")
        if self.status:
            yield text(self.status, style="yellow")


def render(
    views: dict[str, KernelView],
    url: str,
    status: str | None = None,
    max_rows: int | None = None,
) -> Any:
    """A ``rich`` renderable of the kernels, busiest first (by msg/s, then by processed).

    It fits the width of the console it is printed on; kernel ids, states and the URL are
    shown as plain text, control characters escaped.

    Args:
        views: The kernels, from `parse_metrics` (and `with_rates`).
        url: The endpoint, for the title.
        status: A line under the table (the live view's "cannot read ..., retrying").
        max_rows: Show at most this many kernels, the busiest.
    """
    return _Frame(views, url, status, max_rows)


# --- the command ------------------------------------------------------------------------------


def _number(what: str, upper: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (0 < value <= upper):  # also refuses nan
            raise argparse.ArgumentTypeError(
                f"must be {what} above 0 and at most {upper:g}, got {text!r}"
            )
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m pydotcompute top",
        description="Live view of the kernels of a process serving pydotcompute metrics.",
    )
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:9464/metrics",
        help="the metrics endpoint, http:// or https:// (runtime.serve_metrics); "
        "default %(default)s",
    )
    parser.add_argument(
        "--interval",
        type=_number("a number of seconds", 86400),
        default=1.0,
        metavar="SECONDS",
        help="seconds between frames, and between tries while the target is down (default 1)",
    )
    parser.add_argument(
        "--timeout",
        type=_number("a number of seconds", 3600),
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="seconds one scrape may take, connect to last byte (default %(default)g)",
    )
    parser.add_argument(
        "--max-body-mib",
        type=_number("a size in MiB", 4096),
        default=DEFAULT_MAX_BODY / _MIB,
        metavar="N",
        help="the largest answer read, in MiB (default %(default)g)",
    )
    parser.add_argument(
        "--once", action="store_true", help="print one frame and exit (1 if the target fails)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``top`` (the ``python -m pydotcompute top`` entry); returns the exit status.

    0 after ``--once`` or Ctrl-C; 1 when ``--once`` cannot read the target or the
    observability extra is missing; 2 for a usage error. The live view never exits on a
    failed scrape: it shows why and tries again every ``--interval``.
    """
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        check_url(args.url)
    except InvalidConfigurationError as exc:
        parser.error(str(exc))
    try:
        rich_console = require("rich.console", "pydotcompute top")
        rich_live = require("rich.live", "pydotcompute top")
        require("prometheus_client.parser", "pydotcompute top")
    except BackendNotAvailableError as exc:
        print(f"pydotcompute top: {exc}", file=sys.stderr)
        return 1
    console = rich_console.Console()
    if not console.is_terminal:  # piped (a script, a test): wide, unless COLUMNS says
        console = rich_console.Console(width=None if "COLUMNS" in os.environ else 200)
    max_bytes = int(args.max_body_mib * _MIB)

    def scrape() -> tuple[dict[str, KernelView], float]:
        text = read_metrics(args.url, timeout=args.timeout, max_bytes=max_bytes)
        try:
            return parse_metrics(text), time.monotonic()
        except MetricsFormatError as exc:
            raise ScrapeError(args.url, str(exc)) from None

    try:
        if args.once:
            try:
                before, t0 = scrape()
                time.sleep(min(args.interval, 0.5))
                now, t1 = scrape()
            except ScrapeError as exc:
                print(f"pydotcompute top: {exc}", file=sys.stderr)
                return 1
            console.print(render(with_rates(now, before, t1 - t0), args.url))
            return 0
        _live(console, rich_live.Live, args.url, args.interval, scrape)
    except KeyboardInterrupt:
        pass
    return 0


def _live(
    console: Any,
    live_cls: Any,
    url: str,
    interval: float,
    scrape: Callable[[], tuple[dict[str, KernelView], float]],
) -> None:
    """Redraw every ``interval`` until Ctrl-C; a failed scrape keeps the last kernels on
    screen under a line saying why, and the next try comes ``interval`` later."""
    prev: dict[str, KernelView] | None = None
    t_prev = 0.0
    shown: dict[str, KernelView] = {}
    last_ok: str | None = None

    def rows() -> int:
        return max(1, int(console.height) - 6)  # the title, the header, the notes, the status

    with live_cls(
        render(shown, url, "connecting...", rows()), console=console, auto_refresh=False
    ) as live:
        while True:
            try:
                now, t_now = scrape()
            except ScrapeError as exc:
                since = f"last answer at {last_ok}" if last_ok else "no answer yet"
                status = f"{exc}; retrying every {interval:g} s ({since}; Ctrl-C quits)"
                frame = render(shown, url, status, rows())
            else:
                shown = with_rates(now, prev, t_now - t_prev)
                prev, t_prev = now, t_now
                last_ok = time.strftime("%H:%M:%S")
                frame = render(shown, url, None, rows())
            live.update(frame, refresh=True)
            time.sleep(interval)
