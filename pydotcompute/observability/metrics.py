"""Prometheus metrics of a `RingKernelRuntime`, read from its telemetry at scrape time.

``collector(runtime)`` is a ``prometheus_client`` collector for a registry of your own;
``serve_metrics(runtime, port, host)`` (``runtime.serve_metrics``) serves one over HTTP.

Design notes:
- Nothing is counted per message for Prometheus: each scrape reads the counters, inbox
  statistics and latency histograms the runtime keeps anyway. Latency buckets (1 us to
  1 s) come from the telemetry's log-linear histogram (`LatencyHistogram.cumulative_counts`);
  the client's default buckets start at 5 ms, too coarse for actors.
- A scrape runs on the server's thread but kernels belong to the event loop, so the
  snapshot is taken on the loop (``call_soon_threadsafe``) and waited for; with no running
  loop (or on the loop's own thread) it is taken directly.
- Every series has the labels ``kernel``, ``tier`` and ``replica``: ``replica=""`` is the
  kernel as a whole, a pool adds one series per replica (``replica="0"``, ...). Sum over
  ``{replica=""}`` for totals: the replica series add up to it.
- The server is a single-threaded WSGI server on a thread named ``pydotcompute-metrics``
  (one scrape at a time, no thread per request), stopped and joined on runtime shutdown.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..exceptions import InvalidConfigurationError, KernelNotFoundError
from ..ring_kernels.states import KernelState
from ..ring_kernels.telemetry import RingKernelTelemetry, get_gpu_monitor
from ..ring_kernels.tiers import canonical_tier
from .deps import require

if TYPE_CHECKING:
    from ..ring_kernels.runtime import RingKernelRuntime

_prom = require("prometheus_client", "Prometheus metrics")
from prometheus_client.core import (  # noqa: E402  (after the check that names the extra)
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402

__all__ = (
    "LATENCY_BUCKETS_S",
    "MetricsServer",
    "RuntimeCollector",
    "collector",
    "serve_metrics",
)

#: upper bounds (seconds) of the latency histogram's buckets, 1 us to 1 s
LATENCY_BUCKETS_S: tuple[float, ...] = (
    1e-6, 2.5e-6, 5e-6,
    1e-5, 2.5e-5, 5e-5,
    1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3,
    1e-2, 2.5e-2, 5e-2,
    0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
_BOUNDS_NS = [round(b * 1e9) for b in LATENCY_BUCKETS_S]
_LE: list[str] = [floatToGoString(b) for b in LATENCY_BUCKETS_S]  # type: ignore[no-untyped-call]
_LABELS = ["kernel", "tier", "replica"]
_STATES = [s.name.lower() for s in KernelState]
#: how long a scrape waits for the event loop to take its snapshot
SNAPSHOT_TIMEOUT_S = 5.0


@dataclass
class _Row:
    """What one kernel (or one replica of a pool) reports in a scrape."""

    labels: list[str]
    tel: RingKernelTelemetry
    state: str | None = None
    buckets: list[int] = field(default_factory=list)
    count: int = 0
    sum_s: float = 0.0


def _row(labels: list[str], tel: RingKernelTelemetry, state: str | None) -> _Row:
    hist = tel.histogram  # folded: exact now
    return _Row(
        labels,
        tel,
        state,
        hist.cumulative_counts(_BOUNDS_NS),
        hist.count,
        tel.total_latency_ns / 1e9,
    )


def _snapshot(runtime: RingKernelRuntime) -> list[_Row]:
    """Every kernel's figures, read now (on the runtime's loop when it runs one)."""
    rows: list[_Row] = []
    for kid in runtime.kernel_ids:
        try:
            kernel = runtime.get_kernel(kid)
            tel = runtime.get_counters(kid)
        except KernelNotFoundError:  # removed meanwhile
            continue
        tier = canonical_tier(str(kernel.config.tier))
        rows.append(_row([kid, tier, ""], tel, kernel.state.name.lower()))
        per: Callable[[], list[RingKernelTelemetry]] | None = getattr(
            kernel, "replica_telemetry", None
        )
        if per is not None:
            for i, rep in enumerate(per()):
                rows.append(_row([kid, tier, str(i)], rep, None))
    return rows


def _families(rows: list[_Row], gpu: bool) -> Iterator[Metric]:
    def counter(name: str, doc: str, value: Callable[[RingKernelTelemetry], int]) -> Metric:
        fam = CounterMetricFamily(name, doc, labels=_LABELS)
        for r in rows:
            fam.add_metric(r.labels, value(r.tel))
        return fam

    def gauge(name: str, doc: str, value: Callable[[RingKernelTelemetry], float]) -> Metric:
        fam = GaugeMetricFamily(name, doc, labels=_LABELS)
        for r in rows:
            fam.add_metric(r.labels, value(r.tel))
        return fam

    yield counter(
        "pydotcompute_messages_received",
        "Messages that arrived in the kernel's inbox.",
        lambda t: t.messages_received,
    )
    yield counter(
        "pydotcompute_messages_processed",
        "Messages the kernel's actor finished.",
        lambda t: t.messages_processed,
    )
    yield counter(
        "pydotcompute_messages_sent",
        "Messages the kernel's actor sent (replies and forwards).",
        lambda t: t.messages_sent,
    )
    dropped = CounterMetricFamily(
        "pydotcompute_messages_dropped",
        "Messages dropped, by reason (backpressure, undelivered, actor_failed, "
        "undecodable, reply_lost, other).",
        labels=[*_LABELS, "reason"],
    )
    for r in rows:
        for reason, n in sorted(r.tel.drop_reasons().items()):
            dropped.add_metric([*r.labels, reason], n)
    yield dropped
    yield gauge(
        "pydotcompute_inbox_depth",
        "Messages waiting in the kernel's inbox.",
        lambda t: t.queue_depth,
    )
    hist = HistogramMetricFamily(
        "pydotcompute_message_latency_seconds",
        "Time the actor spent on a message (taking it to asking for the next).",
        labels=_LABELS,
    )
    for r in rows:
        buckets = [(le, float(c)) for le, c in zip(_LE, r.buckets, strict=True)]
        buckets.append(("+Inf", float(r.count)))
        hist.add_metric(r.labels, buckets, r.sum_s)
    yield hist
    state = GaugeMetricFamily(
        "pydotcompute_kernel_state",
        "1 for the kernel's current lifecycle state, 0 for the others.",
        labels=[*_LABELS, "state"],
    )
    for r in rows:
        if r.state is not None:
            for s in _STATES:
                state.add_metric([*r.labels, s], 1.0 if s == r.state else 0.0)
    yield state
    yield counter(
        "pydotcompute_kernel_restarts",
        "Times the runtime restarted the kernel's actor.",
        lambda t: t.restarts,
    )
    yield counter(
        "pydotcompute_kernel_errors",
        "Exceptions the kernel's actor raised.",
        lambda t: t.error_count,
    )
    if gpu:
        yield from _gpu_families()


def _utilization(info: Any) -> float:
    return float(info.utilization_gpu)  # already a fraction


def _gpu_families() -> Iterator[Metric]:
    mon = get_gpu_monitor()
    if not mon.is_available:
        return
    infos = mon.get_all_gpu_info()
    specs: list[tuple[str, str, Callable[[Any], float | None]]] = [
        ("pydotcompute_gpu_utilization_ratio", "GPU busy fraction.", _utilization),
        ("pydotcompute_gpu_memory_used_bytes", "GPU memory in use.", lambda i: i.memory_used),
        ("pydotcompute_gpu_memory_total_bytes", "GPU memory in all.", lambda i: i.memory_total),
        ("pydotcompute_gpu_temperature_celsius", "GPU temperature.", lambda i: i.temperature),
        ("pydotcompute_gpu_power_watts", "GPU power draw.", lambda i: i.power_usage),
    ]  # fmt: skip
    for name, doc, value in specs:
        fam = GaugeMetricFamily(name, doc, labels=["gpu", "name"])
        for info in infos:
            v = value(info)
            if v is not None:
                fam.add_metric([str(info.index), info.name], float(v))
        yield fam


class RuntimeCollector(Collector):
    """A ``prometheus_client`` collector of one runtime's kernels (see the module notes).

    Args:
        runtime: The runtime to report.
        loop: The loop the runtime runs on: scrapes from other threads take their snapshot
            there. Default: the loop running where the collector is made, if any.
        gpu: Add the NVML GPU gauges (when NVML is available).
    """

    def __init__(
        self,
        runtime: RingKernelRuntime,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        gpu: bool = True,
    ) -> None:
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self.runtime = runtime
        self.loop = loop
        self.gpu = gpu

    def describe(self) -> Iterable[Metric]:
        # the families without samples: registering does not take a snapshot
        return list(_families([], gpu=False))

    def collect(self) -> Iterable[Metric]:
        return list(_families(self.snapshot(), self.gpu))

    def snapshot(self) -> list[_Row]:
        """The kernels' figures now, taken on the runtime's loop when another thread asks."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running() or _on_loop(loop):
            return _snapshot(self.runtime)
        done: concurrent.futures.Future[list[_Row]] = concurrent.futures.Future()

        def take() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(_snapshot(self.runtime))
                except BaseException as exc:  # handed to the scraping thread
                    done.set_exception(exc)

        try:
            loop.call_soon_threadsafe(take)
        except RuntimeError:  # the loop closed meanwhile
            return _snapshot(self.runtime)
        try:
            return done.result(SNAPSHOT_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            done.cancel()
            raise TimeoutError(
                f"the event loop of the runtime did not take a metrics snapshot within "
                f"{SNAPSHOT_TIMEOUT_S} s (is it blocked?)"
            ) from None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def collector(
    runtime: RingKernelRuntime,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    gpu: bool = True,
) -> RuntimeCollector:
    """A Prometheus collector of ``runtime``'s kernels: ``registry.register(collector(rt))``.

    Raises:
        BackendNotAvailableError: ``prometheus-client`` is not installed.
    """
    return RuntimeCollector(runtime, loop=loop, gpu=gpu)


class _QuietHandler(WSGIRequestHandler):
    timeout = 10.0  # a client that stops talking cannot hold the server

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class _Server6(WSGIServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """An HTTP server of one registry's metrics on a thread of its own; `stop` joins it."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        app = _prom.make_wsgi_app(registry)
        server_class = _Server6 if ":" in host else WSGIServer
        try:
            self._httpd = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        except OSError as exc:
            raise InvalidConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc}; choose another port "
                "(port=0 picks a free one)"
            ) from exc
        self.requested = (host, port)
        self.address: tuple[str, int] = (host, int(self._httpd.server_address[1]))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="pydotcompute-metrics",
            daemon=True,
        )
        self._thread.start()
        self._stopped = False
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The metrics URL (``http://host:port/metrics``)."""
        host, port = self.address
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent; blocks up to a scrape's length)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def serve_metrics(
    runtime: RingKernelRuntime,
    port: int = 9464,
    host: str = "127.0.0.1",
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    gpu: bool = True,
) -> MetricsServer:
    """Serve ``runtime``'s metrics at ``http://host:port/metrics`` (port 0: a free one).

    Prefer ``runtime.serve_metrics``, which also stops the server on shutdown; this one
    returns the `MetricsServer`, and stopping it is the caller's.

    Raises:
        BackendNotAvailableError: ``prometheus-client`` is not installed.
        InvalidConfigurationError: the address cannot be bound (in use, say).
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise InvalidConfigurationError(
            f"metrics port must be an int from 0 to 65535 (0: a free one), got {port!r}"
        )
    registry = CollectorRegistry(auto_describe=True)
    registry.register(RuntimeCollector(runtime, loop=loop, gpu=gpu))
    return MetricsServer(registry, host, port)
