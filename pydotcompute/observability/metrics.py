"""Prometheus metrics of a `RingKernelRuntime`, read from its telemetry at scrape time.

``collector(runtime)`` is a ``prometheus_client`` collector for a registry of your own;
``serve_metrics(runtime, port, host)`` (``runtime.serve_metrics``) serves one over HTTP.

Design notes:
- Nothing is counted per message for Prometheus: each scrape reads the counters, inbox
  statistics and latency histograms the runtime keeps anyway. Latency buckets (1 us to
  1 s) come from the telemetry's log-linear histogram (`LatencyHistogram.cumulative_counts`);
  the client's default buckets start at 5 ms, too coarse for actors.
- A scrape runs on a server thread but kernels belong to the event loop, so the snapshot
  is taken on the loop (``call_soon_threadsafe``) and waited for up to ``snapshot_wait``
  (one request at a time, shared by concurrent scrapes); with no running loop (or on the
  loop's own thread) it is taken directly. A loop that does not answer (blocked, or busy
  for longer) gets no say: the scrape reads the records directly, without the tiers'
  refresh, and if even that fails serves the last figures read, with their age. A scrape
  must not fail exactly when an operator needs it; raising after a wait was rejected.
- How long the loop has been unresponsive is measured by a heartbeat on the loop every
  0.25 s (``pydotcompute_loop_lag_seconds``): probing it only at scrape time would miss
  every second of a block that began before the scrape.
- Every series has the labels ``kernel``, ``tier`` and ``replica``: ``replica=""`` is the
  kernel as a whole, a pool adds one series per replica (``replica="0"``, ...). Sum over
  ``{replica=""}`` for totals: the replica series add up to it.
- The HTTP server is `MetricsServer` (``metrics_server``): a thread per connection, a
  deadline per request, stopped and joined on runtime shutdown.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ..exceptions import InvalidConfigurationError, KernelNotFoundError
from ..ring_kernels.states import KernelState
from ..ring_kernels.telemetry import RingKernelTelemetry, get_gpu_monitor
from ..ring_kernels.tiers import canonical_tier
from .deps import require
from .metrics_server import MAX_CONNECTIONS, REQUEST_DEADLINE_S, MetricsServer

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
    "MAX_CONNECTIONS",
    "REQUEST_DEADLINE_S",
    "SNAPSHOT_WAIT_S",
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
#: how long a scrape waits for the event loop to take its snapshot before reading directly
SNAPSHOT_WAIT_S = 1.0
#: the period of the loop's heartbeat, which `pydotcompute_loop_lag_seconds` is read from
HEARTBEAT_S = 0.25

logger = logging.getLogger("pydotcompute")


class ObservedRuntime(Protocol):
    """What the metrics read of a runtime (`RingKernelRuntime` is one). A protocol rather
    than the class: the runtime imports this module to serve its metrics, and a module
    that imports back, even for its types, would tie the two into a cycle."""

    @property
    def kernel_ids(self) -> list[str]: ...

    def get_kernel(self, kernel_id: str) -> Any: ...

    def get_counters(self, kernel_id: str) -> RingKernelTelemetry: ...

    def get_replica_telemetry(self, kernel_id: str) -> list[RingKernelTelemetry]: ...

    def edges(self) -> list[Any]: ...


@dataclass(slots=True)
class _Row:
    """What one kernel (or one replica of a pool) reports in a scrape: a copy of its
    figures, so that figures kept for a later scrape stay as they were read."""

    labels: list[str]
    state: str | None
    received: int
    processed: int
    sent: int
    drops: dict[str, int]
    depth: int
    restarts: int
    errors: int
    buckets: list[int]
    count: int
    sum_s: float


def _row(
    labels: list[str],
    tel: RingKernelTelemetry,
    state: str | None,
    depth: int,
    received: int | None = None,
) -> _Row:
    hist = tel.histogram  # folded: exact now
    return _Row(
        labels,
        state,
        tel.messages_received if received is None else received,
        tel.messages_processed,
        tel.messages_sent,
        tel.drop_reasons(),
        depth,
        tel.restarts,
        tel.error_count,
        hist.cumulative_counts(_BOUNDS_NS),
        hist.count,
        tel.total_latency_ns / 1e9,
    )


def _snapshot(runtime: ObservedRuntime) -> list[_Row]:
    """Every kernel's figures, read now (on the runtime's loop when it runs one)."""
    rows: list[_Row] = []
    for kid in runtime.kernel_ids:
        try:
            kernel = runtime.get_kernel(kid)
            tel = runtime.get_counters(kid)  # asks the tier to fold in what it timed
            # a pool's replicas with their direct edges' share (`EdgeTable.fold_replicas`)
            reps = (
                runtime.get_replica_telemetry(kid)
                if kernel.CAPABILITIES.replica_telemetry
                else None
            )
        except KernelNotFoundError:  # removed meanwhile
            continue
        _add_rows(rows, kid, kernel, tel, tel.queue_depth, replicas=reps)
    return rows


def _read_direct(runtime: ObservedRuntime) -> list[_Row]:
    """Every kernel's figures as its records hold them, read from any thread: nothing
    asks a tier to refresh (that runs on the loop), so latencies a thread or process
    tier timed since the loop last ran wait for its next snapshot."""
    rows: list[_Row] = []
    for kid in runtime.kernel_ids:
        try:
            kernel = runtime.get_kernel(kid)
        except KernelNotFoundError:
            continue
        tel = kernel.telemetry
        inbox = kernel.inbox
        depth = len(inbox) if inbox is not None else 0
        _add_rows(rows, kid, kernel, tel, depth, kernel.messages_received())
    return rows


def _add_rows(
    rows: list[_Row],
    kid: str,
    kernel: Any,
    tel: RingKernelTelemetry,
    depth: int,
    received: int | None = None,
    *,
    replicas: list[RingKernelTelemetry] | None = None,
) -> None:
    tier = canonical_tier(str(kernel.config.tier))
    rows.append(_row([kid, tier, ""], tel, kernel.state.name.lower(), depth, received))
    if kernel.CAPABILITIES.replica_telemetry:  # a pool: a series per replica too
        if replicas is None:  # read off the loop: the records as they are
            replicas = kernel.replica_telemetry()
        for i, rep in enumerate(replicas):
            rows.append(_row([kid, tier, str(i)], rep, None, rep.queue_depth))


def _families(rows: list[_Row], gpu: bool) -> Iterator[Metric]:
    def counter(name: str, doc: str, value: Callable[[_Row], int]) -> Metric:
        fam = CounterMetricFamily(name, doc, labels=_LABELS)
        for r in rows:
            fam.add_metric(r.labels, value(r))
        return fam

    def gauge(name: str, doc: str, value: Callable[[_Row], float]) -> Metric:
        fam = GaugeMetricFamily(name, doc, labels=_LABELS)
        for r in rows:
            fam.add_metric(r.labels, value(r))
        return fam

    yield counter(
        "pydotcompute_messages_received",
        "Messages that arrived in the kernel's inbox.",
        lambda r: r.received,
    )
    yield counter(
        "pydotcompute_messages_processed",
        "Messages the kernel's actor finished.",
        lambda r: r.processed,
    )
    yield counter(
        "pydotcompute_messages_sent",
        "Messages the kernel's actor sent (replies and forwards).",
        lambda r: r.sent,
    )
    dropped = CounterMetricFamily(
        "pydotcompute_messages_dropped",
        "Messages dropped, by reason (backpressure, undelivered, actor_failed, "
        "undecodable, reply_lost, other).",
        labels=[*_LABELS, "reason"],
    )
    for r in rows:
        for reason, n in sorted(r.drops.items()):
            dropped.add_metric([*r.labels, reason], n)
    yield dropped
    yield gauge(
        "pydotcompute_inbox_depth",
        "Messages waiting in the kernel's inbox.",
        lambda r: r.depth,
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
        lambda r: r.restarts,
    )
    yield counter(
        "pydotcompute_kernel_errors",
        "Exceptions the kernel's actor raised.",
        lambda r: r.errors,
    )
    if gpu:
        yield from _gpu_families()


#: the outcomes a direct edge counts (`ring_kernels.edges`), as the ``outcome`` label
_EDGE_OUTCOMES = ("accepted", "taken", "evicted", "rejected", "handed_back", "lost")


def _read_edges(runtime: ObservedRuntime) -> list[Any]:
    """``runtime.edges()`` from any thread: the edges' counters are plain integers their
    actors write, readable without the loop; a kernel table changing meanwhile gives no
    edge rows this scrape rather than a failed one."""
    try:
        return list(runtime.edges())
    except Exception:  # the kernels changed while read (a launch on the loop)
        return []


def _edge_families(edges: list[Any]) -> Iterator[Metric]:
    labels = ["source", "target", "kind"]
    info = GaugeMetricFamily(
        "pydotcompute_edge_info",
        "1 for each connect edge, labelled with its kind (loop, objects, ...).",
        labels=labels,
    )
    count = CounterMetricFamily(
        "pydotcompute_edge_messages",
        "Messages a direct edge counted, by outcome (accepted, taken, evicted, rejected, "
        "handed_back, lost).",
        labels=[*labels, "outcome"],
    )
    depth = GaugeMetricFamily(
        "pydotcompute_edge_depth", "Messages waiting in a direct edge.", labels=labels
    )
    for edge in edges:
        names = [edge.source, edge.target, edge.kind]
        info.add_metric(names, 1.0)
        if edge.counters:
            for outcome in _EDGE_OUTCOMES:
                count.add_metric([*names, outcome], edge.counters[outcome])
            depth.add_metric(names, edge.counters["depth"])
    yield info
    yield count
    yield depth


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


class _Heartbeat:
    """A callback on the loop every `HEARTBEAT_S`: `lag` says how late the loop is."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due = time.monotonic()  # when the next beat should run
        self._late = 0.0  # how late the last one ran
        self._stopped = False
        loop.call_soon_threadsafe(self._beat)

    def _beat(self) -> None:
        if self._stopped:
            return
        now = time.monotonic()
        self._late = max(0.0, now - self._due)
        self._due = now + HEARTBEAT_S
        self._loop.call_later(HEARTBEAT_S, self._beat)

    def lag(self) -> float:
        """How overdue the next beat is now, or how late the last one ran if it is not."""
        return max(self._late, time.monotonic() - self._due)

    def stop(self) -> None:
        self._stopped = True  # the beat already scheduled returns without another


class RuntimeCollector(Collector):
    """A ``prometheus_client`` collector of one runtime's kernels (see the module notes).

    Args:
        runtime: The runtime to report.
        loop: The loop the runtime runs on: scrapes from other threads take their snapshot
            there. Default: the loop running where the collector is made, if any.
        gpu: Add the NVML GPU gauges (when NVML is available).
        snapshot_wait: Seconds a scrape from another thread waits for the loop to take
            the snapshot before reading the records directly.

    Raises:
        InvalidConfigurationError: ``snapshot_wait`` is not a finite number >= 0.
    """

    def __init__(
        self,
        runtime: ObservedRuntime,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        gpu: bool = True,
        snapshot_wait: float = SNAPSHOT_WAIT_S,
    ) -> None:
        if (
            not isinstance(snapshot_wait, int | float)
            or isinstance(snapshot_wait, bool)
            or not math.isfinite(snapshot_wait)
            or snapshot_wait < 0
        ):
            raise InvalidConfigurationError(
                f"snapshot_wait must be a finite number of seconds >= 0, got "
                f"{snapshot_wait!r} (default {SNAPSHOT_WAIT_S})"
            )
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self.runtime = runtime
        self.loop = loop
        self.gpu = gpu
        self.snapshot_wait = float(snapshot_wait)
        self._lock = threading.Lock()
        self._pending: concurrent.futures.Future[list[_Row]] | None = None
        self._asked_at = 0.0  # when `_pending` was posted to the loop
        self._last: tuple[float, list[_Row]] | None = None  # (when, figures) last read
        self._closed = False
        self._failed_once = False
        self._heartbeat: _Heartbeat | None = None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                self._heartbeat = _Heartbeat(loop)

    def describe(self) -> Iterable[Metric]:
        # the families without samples: registering does not take a snapshot
        return [*_families([], gpu=False), *_own_families(None, None), *_edge_families([])]

    def collect(self) -> Iterable[Metric]:
        rows, age = self.figures()
        return [
            *_families(rows, self.gpu),
            *_own_families(self.loop_lag(), age),
            *_edge_families(_read_edges(self.runtime)),
        ]

    def loop_lag(self) -> float | None:
        """Seconds the runtime's loop is late: how overdue its heartbeat (every 0.25 s) is,
        or how late the last beat ran; None without a running loop."""
        loop, beat = self.loop, self._heartbeat
        if beat is None or loop is None or loop.is_closed() or not loop.is_running():
            return None
        return beat.lag()

    def snapshot(self) -> list[_Row]:
        """The kernels' figures now (see `figures`)."""
        return self.figures()[0]

    def figures(self) -> tuple[list[_Row], float]:
        """The kernels' figures and their age in seconds (0: read for this call).

        Taken on the runtime's loop when another thread asks and the loop answers within
        ``snapshot_wait`` (a request already waiting is shared, and its wait too); else
        read directly (`_read_direct`); if even that fails, the last figures read, with
        their age. Never raises: a scrape must answer most when something is wrong.
        """
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running() or _on_loop(loop):
            return self._fallback(_snapshot, "taken")
        pending, wait = self._ask(loop)
        if pending is not None:
            try:
                return self._keep(pending.result(wait)), 0.0
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                pass  # the loop is busy or blocked (`loop_lag` says how long)
            except Exception as exc:
                self._failed("the event loop's snapshot", exc)
        return self._fallback(_read_direct, "read directly")

    def close(self) -> None:
        """Stop the loop's heartbeat; a scrape waiting for the loop stops waiting
        (`MetricsServer.stop` calls it for ``serve_metrics``)."""
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def _ask(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[concurrent.futures.Future[list[_Row]] | None, float]:
        """The snapshot request waiting on the loop (a new one if none) and how long
        this scrape waits for it: what is left of its ``snapshot_wait``."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return None, 0.0
            pending = self._pending
            if pending is not None and not pending.done():
                return pending, max(0.0, self._asked_at + self.snapshot_wait - now)
            pending = self._pending = concurrent.futures.Future()
            self._asked_at = now

        def take() -> None:
            if pending.set_running_or_notify_cancel():
                try:
                    rows = _snapshot(self.runtime)
                except Exception as exc:  # handed to the scraping thread
                    pending.set_exception(exc)
                else:
                    self._keep(rows)  # also when the scrape that asked has gone
                    pending.set_result(rows)

        try:
            loop.call_soon_threadsafe(take)
        except RuntimeError:  # the loop closed meanwhile
            pending.cancel()
            return None, 0.0
        return pending, self.snapshot_wait

    def _keep(self, rows: list[_Row]) -> list[_Row]:
        self._last = (time.monotonic(), rows)
        return rows

    def _fallback(
        self, read: Callable[[ObservedRuntime], list[_Row]], how: str
    ) -> tuple[list[_Row], float]:
        try:
            return self._keep(read(self.runtime)), 0.0
        except Exception as exc:
            self._failed(f"the figures {how}", exc)
        last = self._last
        if last is None:
            return [], 0.0
        return last[1], time.monotonic() - last[0]

    def _failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            first, self._failed_once = not self._failed_once, True
        log = logger.warning if first else logger.debug
        log("metrics: %s failed (%r); serving what could be read", what, exc)


def _own_families(lag: float | None, age: float | None) -> Iterator[Metric]:
    """How fresh a scrape's figures are: the loop's lag and the figures' age."""
    fam = GaugeMetricFamily(
        "pydotcompute_loop_lag_seconds",
        "How late the runtime's event loop is: how overdue its 0.25 s heartbeat is, or "
        "how late the last beat ran; grows while the loop is blocked.",
    )
    if lag is not None:
        fam.add_metric([], lag)
    yield fam
    fam = GaugeMetricFamily(
        "pydotcompute_metrics_age_seconds",
        "Age of the figures of this scrape: 0 when read for it, else how old the last "
        "figures served are (the loop did not answer and they could not be read directly).",
    )
    if age is not None:
        fam.add_metric([], age)
    yield fam


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def collector(
    runtime: ObservedRuntime,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    gpu: bool = True,
    snapshot_wait: float = SNAPSHOT_WAIT_S,
) -> RuntimeCollector:
    """A Prometheus collector of ``runtime``'s kernels: ``registry.register(collector(rt))``.

    Call its ``close()`` when done with it: it stops the loop's heartbeat (4 callbacks a
    second, which also stop with the loop).

    Raises:
        BackendNotAvailableError: ``prometheus-client`` is not installed.
        InvalidConfigurationError: ``snapshot_wait`` is not a finite number >= 0.
    """
    return RuntimeCollector(runtime, loop=loop, gpu=gpu, snapshot_wait=snapshot_wait)


def serve_metrics(
    runtime: ObservedRuntime,
    port: int = 9464,
    host: str = "127.0.0.1",
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    gpu: bool = True,
    request_deadline: float = REQUEST_DEADLINE_S,
    snapshot_wait: float = SNAPSHOT_WAIT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsServer:
    """Serve ``runtime``'s metrics at ``http://host:port/metrics`` (port 0: a free one).

    Prefer ``runtime.serve_metrics``, which also stops the server on shutdown; this one
    returns the `MetricsServer` and takes the server's options, and stopping it is the
    caller's (``server.stop(timeout)``).

    Args:
        runtime: The runtime to report.
        port: The port (0: a free one).
        host: The address to listen on; ``"0.0.0.0"`` to be scraped from other machines.
        loop: The runtime's loop (default: the running one).
        gpu: Add the NVML GPU gauges.
        request_deadline: Seconds a connection may take from accept to the end of the
            response (a client still sending its request then is answered 408).
        snapshot_wait: Seconds a scrape waits for the runtime's loop to take the snapshot
            before reading the records directly.
        max_connections: Connections served at once (one more is answered 503).

    Raises:
        BackendNotAvailableError: ``prometheus-client`` is not installed.
        InvalidConfigurationError: the address cannot be bound (in use, say), or an option
            is out of range.
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise InvalidConfigurationError(
            f"metrics port must be an int from 0 to 65535 (0: a free one), got {port!r}"
        )
    figures = RuntimeCollector(runtime, loop=loop, gpu=gpu, snapshot_wait=snapshot_wait)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(figures)
    try:
        return MetricsServer(
            registry,
            host,
            port,
            request_deadline=request_deadline,
            max_connections=max_connections,
            on_stop=figures.close,
        )
    except BaseException:
        figures.close()
        raise
