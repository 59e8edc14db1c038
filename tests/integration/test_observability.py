"""Prometheus metrics over HTTP, ``python -m pydotcompute top`` and tracing, end to end.

The metrics endpoint is scraped over real HTTP on 127.0.0.1 and parsed with
``prometheus_client.parser``; the pipeline runs real asyncio, process and thread tiers.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelNotFoundError,
    KernelStateError,
    MessageSerializationError,
    QueueFullError,
)
from pydotcompute.observability import collector, serve_metrics

from .tier_actors import Done, Job, echo_async, echo_sync, forward_async, forward_sync

BOUND_S = 30.0
ROOT = Path(__file__).resolve().parents[2]
PIPELINE = (("a", "asyncio"), ("b", "process"), ("c", "thread"))

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()


async def scrape(host: str, port: int) -> Samples:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    text = await asyncio.to_thread(_scrape, f"http://{host}:{port}/metrics")
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    labels.setdefault("replica", "")
    return samples.get((name, tuple(sorted(labels.items()))))


async def launch_pipeline(rt: RingKernelRuntime, *, direct: bool = True, **c_options: Any) -> None:
    """a (asyncio) -> b (process) -> c (thread), all forwarding what they receive (b -> c
    over a direct edge unless ``direct`` is False)."""
    await rt.launch("a", forward_async, input_type=Job, output_type=Job)
    await rt.launch("b", forward_sync, input_type=Job, output_type=Job, tier="process")
    await rt.launch("c", forward_sync, input_type=Job, output_type=Job, tier="thread", **c_options)
    for kid, _ in PIPELINE:
        await rt.activate(kid)
    rt.connect("a", "b")
    rt.connect("b", "c", direct=direct)


async def run_through(rt: RingKernelRuntime, n: int) -> None:
    for i in range(n):
        await rt.send("a", Job(seq=i))
    got = sorted([(await rt.receive("c", timeout=BOUND_S)).seq for _ in range(n)])
    assert got == list(range(n))


async def scrape_until(host: str, port: int, done: Any) -> Samples:
    """Scrape until ``done(samples)`` (the actors hand their last timing over when they
    ask for their next message, a moment after the reply went out)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        samples = await scrape(host, port)
        if done(samples) or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.05)


async def test_pipeline_metrics_over_http() -> None:
    n = 1000
    async with asyncio.timeout(BOUND_S * 3), RingKernelRuntime() as rt:
        await launch_pipeline(rt)
        host, port = rt.serve_metrics(port=0)
        assert host == "127.0.0.1"
        assert port > 0
        await run_through(rt, n)

        def all_timed(s: Samples) -> bool:
            return all(
                value(s, "pydotcompute_message_latency_seconds_count", kernel=k, tier=t) == n
                for k, t in PIPELINE
            )

        samples = await scrape_until(host, port, all_timed)
        for kid, tier in PIPELINE:
            labels = {"kernel": kid, "tier": tier}
            assert value(samples, "pydotcompute_messages_processed_total", **labels) == n
            assert value(samples, "pydotcompute_messages_received_total", **labels) == n
            assert value(samples, "pydotcompute_messages_sent_total", **labels) == n
            assert value(samples, "pydotcompute_message_latency_seconds_count", **labels) == n
            inf = value(samples, "pydotcompute_message_latency_seconds_bucket", le="+Inf", **labels)
            assert inf == n
            # buckets are cumulative, from 1 us to 1 s
            les = ["1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1", "1.0"]
            counts = [
                value(samples, "pydotcompute_message_latency_seconds_bucket", le=le, **labels)
                for le in les
            ]
            assert None not in counts
            assert counts == sorted(counts)  # type: ignore[type-var]
            total_s = value(samples, "pydotcompute_message_latency_seconds_sum", **labels)
            assert total_s is not None
            assert total_s > 0
            assert value(samples, "pydotcompute_inbox_depth", **labels) == 0
            assert value(samples, "pydotcompute_kernel_state", state="active", **labels) == 1
            assert value(samples, "pydotcompute_kernel_state", state="failed", **labels) == 0
            assert value(samples, "pydotcompute_kernel_restarts_total", **labels) == 0
            assert value(samples, "pydotcompute_kernel_errors_total", **labels) == 0


async def test_inbox_depth_and_drop_reasons_are_scraped() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        # not activated: what is sent waits in the inbox, and drop_oldest drops the rest
        await rt.launch(
            "slow", forward_async, input_type=Job, queue_size=4, backpressure="drop_oldest"
        )
        host, port = rt.serve_metrics(port=0)
        for i in range(10):
            await rt.send("slow", Job(seq=i))
        samples = await scrape(host, port)
        labels = {"kernel": "slow", "tier": "asyncio"}
        assert value(samples, "pydotcompute_inbox_depth", **labels) == 4
        assert value(samples, "pydotcompute_messages_received_total", **labels) == 10
        dropped = value(
            samples, "pydotcompute_messages_dropped_total", reason="backpressure", **labels
        )
        assert dropped == 6
        assert value(samples, "pydotcompute_kernel_state", state="launched", **labels) == 1


async def test_pool_reports_each_replica_and_the_sum() -> None:
    n = 200
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime() as rt:
        await launch_pipeline(rt, replicas=2)
        host, port = rt.serve_metrics(port=0)
        await run_through(rt, n)

        def timed(s: Samples) -> bool:
            name = "pydotcompute_message_latency_seconds_count"
            return value(s, name, kernel="c", tier="thread") == n

        samples = await scrape_until(host, port, timed)
        name = "pydotcompute_messages_processed_total"
        whole = value(samples, name, kernel="c", tier="thread")
        parts = [value(samples, name, kernel="c", tier="thread", replica=r) for r in "01"]
        assert whole == n
        assert None not in parts
        assert sum(parts) == n
        lat = "pydotcompute_message_latency_seconds_count"
        per = [value(samples, lat, kernel="c", tier="thread", replica=r) for r in "01"]
        assert sum(per) == n  # type: ignore[arg-type]


async def test_serving_twice_shutdown_and_errors() -> None:
    rt = RingKernelRuntime()
    async with rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        host, port = rt.serve_metrics(port=0)
        # the same address again (or port 0) returns it; another one is refused
        assert rt.serve_metrics(port=0) == (host, port)
        assert rt.serve_metrics(port=port) == (host, port)
        with pytest.raises(InvalidConfigurationError, match="already served"):
            rt.serve_metrics(port=port + 1 if port < 65535 else port - 1)
        samples = await scrape(host, port)
        assert value(samples, "pydotcompute_kernel_state", kernel="a", tier="asyncio",
                     state="launched") == 1  # fmt: skip
    # shutdown stopped the server and joined its thread
    assert not [t for t in __import__("threading").enumerate() if t.name == "pydotcompute-metrics"]
    with pytest.raises(urllib.error.URLError):
        _scrape(f"http://{host}:{port}/metrics")
    with pytest.raises(KernelStateError, match="SHUT DOWN"):
        rt.serve_metrics(port=0)


async def test_bad_port_and_address_in_use() -> None:
    async with RingKernelRuntime() as rt, RingKernelRuntime() as other:
        with pytest.raises(InvalidConfigurationError, match="0 to 65535"):
            rt.serve_metrics(port=70000)
        _, port = rt.serve_metrics(port=0)
        with pytest.raises(InvalidConfigurationError, match="cannot serve metrics"):
            other.serve_metrics(port=port)


async def test_collector_in_a_registry_of_your_own() -> None:
    async with RingKernelRuntime() as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        await rt.activate("a")
        for i in range(5):
            await rt.send("a", Job(seq=i))
            await rt.receive("a", timeout=BOUND_S)
        registry = CollectorRegistry()
        registry.register(collector(rt))
        # on the loop's own thread the snapshot is taken directly
        text = generate_latest(registry).decode()
        assert 'pydotcompute_messages_processed_total{kernel="a",replica="",tier="asyncio"}' in (
            text
        )
        # from another thread it is taken on the loop
        text = await asyncio.to_thread(lambda: generate_latest(registry).decode())
        assert "pydotcompute_message_latency_seconds_bucket" in text


def test_without_the_extra_the_error_names_it() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "import asyncio\n"
        "from pydotcompute import RingKernelRuntime\n"
        "from pydotcompute.exceptions import BackendNotAvailableError\n"
        "async def main():\n"
        "    async with RingKernelRuntime() as rt:\n"
        "        try:\n"
        "            rt.serve_metrics(port=0)\n"
        "        except BackendNotAvailableError as exc:\n"
        "            print(exc)\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert 'pip install "pydotcompute[observability]"' in proc.stdout


# --- python -m pydotcompute top ---


async def test_top_once_lists_every_kernel() -> None:
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime() as rt:
        await launch_pipeline(rt)
        await rt.launch("idle_one", forward_async, input_type=Job)  # launched, never active
        host, port = rt.serve_metrics(port=0)
        await run_through(rt, 100)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pydotcompute",
            "top",
            "--once",
            "--url",
            f"http://{host}:{port}/metrics",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        rows = {ln.split()[0]: ln for ln in lines[1:] if ln.strip()}  # kernel id first
        for kid, tier in (*PIPELINE, ("idle_one", "asyncio")):
            assert kid in rows, out.decode()
            assert tier in rows[kid]
        assert "launched" in rows["idle_one"]
        assert " 100 " in rows["b"]  # processed


def test_top_reports_an_unreachable_url() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pydotcompute", "top", "--once", "--url", "http://127.0.0.1:1/x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 1
    assert "cannot read http://127.0.0.1:1/x: connection refused" in proc.stderr
    assert proc.stdout == ""


def test_top_parses_rates_and_percentiles() -> None:
    from pydotcompute.observability.top import parse_metrics, with_rates

    def text(processed: int) -> str:
        lab = 'kernel="k",replica="",tier="thread"'
        rep = 'kernel="k",replica="0",tier="thread"'
        return (
            "# TYPE pydotcompute_messages_processed counter\n"
            f"pydotcompute_messages_processed_total{{{lab}}} {processed}\n"
            f"pydotcompute_messages_processed_total{{{rep}}} 1\n"
            "# TYPE pydotcompute_message_latency_seconds histogram\n"
            f'pydotcompute_message_latency_seconds_bucket{{{lab},le="1e-06"}} 0\n'
            f'pydotcompute_message_latency_seconds_bucket{{{lab},le="1e-05"}} 50\n'
            f'pydotcompute_message_latency_seconds_bucket{{{lab},le="0.0001"}} 100\n'
            f'pydotcompute_message_latency_seconds_bucket{{{lab},le="+Inf"}} 100\n'
            f"pydotcompute_message_latency_seconds_count{{{lab}}} 100\n"
            f"pydotcompute_message_latency_seconds_sum{{{lab}}} 0.001\n"
            "# TYPE pydotcompute_kernel_state gauge\n"
            f'pydotcompute_kernel_state{{{lab},state="active"}} 1\n'
            f'pydotcompute_kernel_state{{{lab},state="failed"}} 0\n'
        )

    before = parse_metrics(text(100))
    now = with_rates(parse_metrics(text(300)), before, 2.0)
    k = now["k"]
    assert (k.tier, k.state, k.processed, k.rate) == ("thread", "active", 300, 100.0)
    assert k.quantile(0.5) == pytest.approx(1e-5)  # the top of the bucket holding the 50th
    assert 1e-5 < k.quantile(0.99) <= 1e-4  # type: ignore[operator]


# --- OpenTelemetry tracing ---


def ancestors(span: Any, by_id: dict[int, Any]) -> list[Any]:
    """The recorded spans above ``span``, nearest first."""
    out = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        out.append(span)
    return out


async def test_one_trace_per_message_through_every_tier(span_exporter: Any) -> None:
    n = 10
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        # the loop path: a ``send`` span on every hop (b -> c direct would carry the
        # context in its records instead, with no ``send c``: test_trace_context.py)
        await launch_pipeline(rt, direct=False)
        await run_through(rt, n)

        def traces() -> dict[int, list[Any]]:
            out: dict[int, list[Any]] = {}
            for span in span_exporter.get_finished_spans():
                out.setdefault(span.context.trace_id, []).append(span)
            return out

        def complete(spans: list[Any]) -> bool:
            names = {s.name for s in spans}
            return {"process a", "process b", "process c"} <= names

        deadline = time.monotonic() + BOUND_S
        while sum(complete(t) for t in traces().values()) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert rt.tracer is not None
        assert rt.tracer.in_flight() == 0  # every carried context was taken
    got = traces()
    full = [t for t in got.values() if complete(t)]
    assert len(full) == n, {tid: sorted(s.name for s in t) for tid, t in got.items()}
    assert len(got) == n  # no span strayed into a trace of its own
    for spans in full:
        by_name = {s.name: s for s in spans}
        assert set(by_name) == {"send a", "process a", "send b", "process b", "send c",
                                "process c"}  # fmt: skip
        # a chain: send a -> process a -> send b -> process b -> send c -> process c
        chain = ["send a", "process a", "send b", "process b", "send c", "process c"]
        for parent, child in itertools.pairwise(chain):
            assert by_name[child].parent.span_id == by_name[parent].context.span_id
        # the process -> thread hop: the reply's frame header carried b's context back
        by_id = {s.context.span_id: s for s in spans}
        for name in ("send c", "process c"):
            assert by_name["process b"] in ancestors(by_name[name], by_id)
        ids = {s.attributes["messaging.message.id"] for s in spans}
        assert len(ids) == 1  # the actors send on the message they received
        for s in spans:
            assert s.attributes["messaging.system"] == "pydotcompute"
            kid = s.name.split()[1]
            assert s.attributes["messaging.destination.name"] == kid
            kind = "PRODUCER" if s.name.startswith("send") else "CONSUMER"
            assert s.kind.name == kind


async def test_tracing_off_makes_no_spans(span_exporter: Any) -> None:
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        assert rt.tracer is None
        await launch_pipeline(rt)
        await run_through(rt, 5)
    assert span_exporter.get_finished_spans() == ()


async def test_a_new_reply_continues_the_trace_across_the_process_tier(span_exporter: Any) -> None:
    """b (process) answers each Job with a new Done: matched by its correlation id."""
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        await rt.launch("b", echo_sync, input_type=Job, output_type=Done, tier="process")
        await rt.launch("c", forward_sync, input_type=Done, output_type=Done, tier="thread")
        for kid in "abc":
            await rt.activate(kid)
        rt.connect("a", "b")
        rt.connect("b", "c", direct=False)  # the loop path: a ``send c`` on every hop
        for i in range(3):
            await rt.send("a", Job(seq=i))
        for _ in range(3):
            await rt.receive("c", timeout=BOUND_S)
        deadline = time.monotonic() + BOUND_S
        while len(span_exporter.get_finished_spans()) < 18 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    traces: dict[int, set[str]] = {}
    for span in span_exporter.get_finished_spans():
        traces.setdefault(span.context.trace_id, set()).add(span.name)
    want = {"send a", "process a", "send b", "process b", "send c", "process c"}
    assert list(traces.values()) == [want] * 3


def test_tracing_without_the_extra_names_it() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from pydotcompute import RingKernelRuntime\n"
        "from pydotcompute.exceptions import BackendNotAvailableError\n"
        "try:\n"
        "    RingKernelRuntime(tracing=True)\n"
        "except BackendNotAvailableError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "tracing=True needs the 'opentelemetry' package" in proc.stdout
    assert 'pip install "pydotcompute[observability]"' in proc.stdout


# --- round 4: the metrics server under slow clients, idle connections, a blocked loop ---


class SlowClient:
    """A slowloris: a request line, then one header line every ``period`` s, never the
    blank line that ends the request. Notes when the server closes the connection."""

    def __init__(self, host: str, port: int, period: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=BOUND_S)
        self.sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n")
        self.period = period
        self.received = b""
        self.closed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        n = 0
        while not self._stop.is_set():
            readable, _, _ = select.select([self.sock], [], [], self.period)
            if readable:
                try:
                    data = self.sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    self.closed.set()
                    return
                self.received += data
                continue
            try:
                self.sock.sendall(f"X-Slow-{n}: 1\r\n".encode())
            except OSError:
                self.closed.set()
                return
            n += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(BOUND_S)
        self.sock.close()


def still_open(sock: socket.socket) -> bool:
    """True when the peer has neither closed ``sock`` nor written to it."""
    sock.setblocking(False)
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)
    return False


def closed_by_server(sock: socket.socket) -> bool:
    """Wait (up to BOUND_S) for the server to close ``sock``; what it wrote first is read."""
    sock.settimeout(BOUND_S)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True  # reset: closed too
    return True


def parse(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metrics_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pydotcompute-metrics")]


async def test_a_slow_client_is_cut_at_the_request_deadline_and_holds_no_scrape() -> None:
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime() as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        server = serve_metrics(rt, port=0, request_deadline=1.0)
        host, port = server.address
        slow = [SlowClient(host, port, period=0.2) for _ in range(3)]
        try:
            # served while three clients trickle headers at it
            samples = await scrape(host, port)
            assert value(samples, "pydotcompute_kernel_state", kernel="a", tier="asyncio",
                         state="launched") == 1  # fmt: skip
            assert not any(s.closed.is_set() for s in slow)  # the deadline is not up yet
            # each is cut at the whole request's deadline, though it never paused 1 s
            for s in slow:
                assert await asyncio.to_thread(s.closed.wait, BOUND_S)
            assert all(s.received.startswith(b"HTTP/1.1 408") for s in slow if s.received)
            samples = await scrape(host, port)
            errors = samples.get(("pydotcompute_metrics_client_errors_total",
                                  (("reason", "timeout"),)))  # fmt: skip
            assert errors == 3
        finally:
            for s in slow:
                s.close()
            assert server.stop(BOUND_S)


async def test_shutdown_ends_within_its_timeout_whatever_clients_do() -> None:
    rt = RingKernelRuntime()
    await rt.start()
    await rt.launch("a", forward_async, input_type=Job, output_type=Job)
    host, port = rt.serve_metrics(port=0)  # the default deadline, 5 s: longer than 2 s
    slow = [SlowClient(host, port, period=0.2) for _ in range(3)]
    idle = [socket.create_connection((host, port), timeout=BOUND_S) for _ in range(3)]
    try:
        await asyncio.sleep(0.3)  # accepted, and being read
        async with asyncio.timeout(2.0 + 3.0):  # the timeout, and a margin for a busy machine
            await rt.shutdown(timeout=2.0)
        assert not metrics_threads()  # every connection's thread ended
        for s in slow:  # closed by the shutdown, long before their deadline
            assert s.closed.is_set() or await asyncio.to_thread(s.closed.wait, 1.0)
        for sock in idle:
            assert await asyncio.to_thread(closed_by_server, sock)
        with pytest.raises(urllib.error.URLError):
            _scrape(f"http://{host}:{port}/metrics")
    finally:
        for s in slow:
            s.close()
        for sock in idle:
            sock.close()


async def test_idle_connections_neither_delay_scrapes_nor_print_tracebacks(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pydotcompute")
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime() as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        server = serve_metrics(rt, port=0, request_deadline=2.0)
        host, port = server.address
        idle = [socket.create_connection((host, port), timeout=BOUND_S) for _ in range(3)]
        try:
            await asyncio.sleep(0.2)  # accepted: each holds a connection of the server
            samples = await scrape(host, port)
            assert value(samples, "pydotcompute_inbox_depth", kernel="a", tier="asyncio") == 0
            # the scrape did not wait for them: all three are still held open
            assert all(still_open(sock) for sock in idle)
            for sock in idle:  # then the deadline closes them
                assert await asyncio.to_thread(closed_by_server, sock)
            samples = await scrape(host, port)
            key = ("pydotcompute_metrics_client_errors_total", (("reason", "timeout"),))
            assert samples.get(key) == 3
        finally:
            for sock in idle:
                sock.close()
            assert server.stop(BOUND_S)
    assert "Traceback" not in capfd.readouterr().err
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(logged) == 1, [r.getMessage() for r in logged]  # once, not per connection
    line = logged[0].getMessage()
    assert "\n" not in line
    assert logged[0].exc_info is None
    assert f"127.0.0.1:{port}" in line
    assert "sent no complete request within 2 s" in line


async def test_a_scrape_while_the_loop_is_blocked_serves_figures_and_the_lag() -> None:
    n = 5
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime() as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        await rt.activate("a")
        for i in range(n):
            await rt.send("a", Job(seq=i))
            await rt.receive("a", timeout=BOUND_S)
        host, port = rt.serve_metrics(port=0)
        url = f"http://{host}:{port}/metrics"
        got: dict[str, Any] = {}

        def scrape_during_the_block() -> None:
            time.sleep(0.5)  # the loop is asleep by now
            try:
                got["text"] = _scrape(url)
            except Exception as exc:
                got["error"] = exc
            got["at"] = time.monotonic()

        scraper = threading.Thread(target=scrape_during_the_block)
        scraper.start()
        time.sleep(4.0)  # the loop is blocked: no callback runs for 4 s
        woke = time.monotonic()
        await asyncio.to_thread(scraper.join, BOUND_S)
        assert "error" not in got, got["error"]
        assert got["at"] < woke  # answered without the loop
        samples = parse(got["text"])
        labels = {"kernel": "a", "tier": "asyncio"}
        assert value(samples, "pydotcompute_messages_processed_total", **labels) == n
        assert value(samples, "pydotcompute_kernel_state", state="active", **labels) == 1
        lag = samples[("pydotcompute_loop_lag_seconds", ())]
        assert lag > 0.5  # blocked at least since the scrape began (0.5 s in)
        assert samples[("pydotcompute_metrics_age_seconds", ())] == 0  # read directly
        # the loop runs again: once its heartbeat has run on time (every 0.25 s), the lag
        # falls back (the first beat after the block reports how late it ran: 4 s)
        await asyncio.sleep(0.6)
        after = await scrape(host, port)
        assert after[("pydotcompute_loop_lag_seconds", ())] < lag


async def test_a_failed_direct_read_serves_the_last_figures_with_their_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydotcompute.observability import metrics

    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        registry = CollectorRegistry()
        figures = collector(rt, snapshot_wait=0.1)
        registry.register(figures)
        try:
            generate_latest(registry)  # on the loop: figures read, and kept

            def broken(runtime: RingKernelRuntime) -> list[Any]:
                raise RuntimeError("a record changed under the reader")

            monkeypatch.setattr(metrics, "_read_direct", broken)
            got: dict[str, Any] = {}
            scraper = threading.Thread(
                target=lambda: got.update(text=generate_latest(registry).decode())
            )
            scraper.start()
            time.sleep(1.0)  # blocked: the scrape can neither ask the loop nor read
            await asyncio.to_thread(scraper.join, BOUND_S)
            samples = parse(got["text"])
            assert value(samples, "pydotcompute_kernel_state", kernel="a", tier="asyncio",
                         state="launched") == 1  # fmt: skip
            assert samples[("pydotcompute_metrics_age_seconds", ())] > 0.05
        finally:
            figures.close()


async def test_connections_over_the_limit_are_refused_at_once() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        server = serve_metrics(rt, port=0, request_deadline=3.0, max_connections=2)
        host, port = server.address
        idle = [socket.create_connection((host, port), timeout=BOUND_S) for _ in range(2)]
        try:
            await asyncio.sleep(0.2)
            with pytest.raises(urllib.error.HTTPError) as info:
                await scrape(host, port)
            assert info.value.code == 503
            for sock in idle:
                assert await asyncio.to_thread(closed_by_server, sock)
            samples = await scrape(host, port)  # a slot is free again
            key = ("pydotcompute_metrics_client_errors_total", (("reason", "over_limit"),))
            assert samples.get(key) == 1
        finally:
            for sock in idle:
                sock.close()
            assert server.stop(BOUND_S)


def test_server_options_are_checked() -> None:
    rt = RingKernelRuntime()
    with pytest.raises(InvalidConfigurationError, match="request_deadline must be"):
        serve_metrics(rt, port=0, request_deadline=0)
    with pytest.raises(InvalidConfigurationError, match="max_connections must be"):
        serve_metrics(rt, port=0, max_connections=0)
    with pytest.raises(InvalidConfigurationError, match="snapshot_wait must be"):
        serve_metrics(rt, port=0, snapshot_wait=float("nan"))


async def test_requests_are_parsed_as_prometheus_sends_them_and_garbage_is_refused() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("a", forward_async, input_type=Job, output_type=Job)
        host, port = rt.serve_metrics(port=0)

        def ask(raw: bytes) -> bytes:
            with socket.create_connection((host, port), timeout=BOUND_S) as sock:
                sock.sendall(raw)
                out = b""
                while chunk := sock.recv(65536):
                    out += chunk
            return out

        # Prometheus asks for OpenMetrics and gzip; name[] picks families
        got = await asyncio.to_thread(
            ask,
            b"GET /metrics?name[]=pydotcompute_inbox_depth HTTP/1.1\r\nHost: x\r\n"
            b"Accept: application/openmetrics-text; version=1.0.0\r\n"
            b"Accept-Encoding: gzip\r\n\r\n",
        )
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"Content-Type: application/openmetrics-text" in head
        assert b"Content-Encoding: gzip" in head
        text = gzip.decompress(body).decode()
        assert 'pydotcompute_inbox_depth{kernel="a",replica="",tier="asyncio"} 0' in text
        assert "pydotcompute_messages_received" not in text
        assert text.endswith("# EOF\n")
        bad = await asyncio.to_thread(ask, b"NONSENSE\r\n\r\n")
        assert bad.startswith(b"HTTP/1.1 400 Bad Request")
        samples = await scrape(host, port)
        key = ("pydotcompute_metrics_client_errors_total", (("reason", "bad_request"),))
        assert samples.get(key) == 1


# --- round 4: the tracer lets go of what no actor takes; failures show on spans ---

TIERS = ("asyncio", "thread", "process")


def echo_of(tier: str) -> Any:
    return echo_async if tier == "asyncio" else echo_sync


def big_rings(tier: str) -> dict[str, Any]:
    """Rings that carry the 100 KB messages below (the process tier's default is smaller)."""
    return {"ring_bytes": 1 << 20} if tier == "process" else {}


def named(exporter: Any, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def exception_types(span: Any) -> list[str]:
    return [e.attributes["exception.type"] for e in span.events if e.name == "exception"]


def type_name(cls: type) -> str:
    """How OpenTelemetry's SDK names an exception type (builtins unqualified)."""
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


@pytest.mark.parametrize("policy", ["drop_oldest", "reject"])
@pytest.mark.parametrize("tier", TIERS)
async def test_a_full_inbox_leaves_the_tracer_only_what_it_queued(
    span_exporter: Any, tier: str, policy: str
) -> None:
    """3,000 sends of 100 KB into a full inbox: the tracer holds the contexts of the four
    messages the inbox kept, not of the 2,996 it dropped or refused; a refused send's
    span says why."""
    from opentelemetry.trace import StatusCode

    n, room = 3000, 4
    span_exporter.clear()
    payload = "x" * 100_000
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch(
            "k", echo_of(tier), input_type=Job, output_type=Done, tier=tier,
            queue_size=room, backpressure=policy, **big_rings(tier),
        )  # fmt: skip
        refused = 0
        for i in range(n):
            try:
                await rt.send("k", Job(seq=i, payload=payload))
            except QueueFullError:
                refused += 1
        assert refused == (n - room if policy == "reject" else 0)
        assert rt.tracer.in_flight() == room
        await rt.activate("k")
        got = sorted([(await rt.receive("k", timeout=BOUND_S)).seq for _ in range(room)])
        assert got == (list(range(n - room, n)) if policy == "drop_oldest" else list(range(room)))
        assert rt.tracer.in_flight() == 0
    sends = named(span_exporter, "send k")
    assert len(sends) == n
    failed = [s for s in sends if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == refused
    assert all(exception_types(s) == [type_name(QueueFullError)] for s in failed)
    assert all(s.status.description.startswith("QueueFullError: ") for s in failed)


@pytest.mark.parametrize("tier", TIERS)
async def test_a_send_that_raises_leaves_nothing_behind(span_exporter: Any, tier: str) -> None:
    """A wrong type, a message too large for the tier, a kernel that stopped taking
    messages: the send raises, the tracer keeps no context, and the span says why."""
    from opentelemetry.trace import StatusCode

    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("k", echo_of(tier), input_type=Job, output_type=Done, tier=tier)
        await rt.activate("k")
        errors: list[type[Exception]] = []
        with pytest.raises(Exception) as wrong:
            await rt.send("k", Done(seq=1, tier="x"))
        errors.append(type(wrong.value))
        if tier == "process":
            with pytest.raises(MessageSerializationError):
                await rt.send("k", Job(seq=2, payload="x" * (1 << 22)))
            errors.append(MessageSerializationError)
        assert rt.tracer.in_flight() == 0
        assert (await rt.send_and_receive("k", Job(seq=3), timeout=BOUND_S)).seq == 3
        await rt.terminate("k")
        with pytest.raises((KernelStateError, KernelNotFoundError)):
            await rt.send_and_receive("k", Job(seq=4), timeout=BOUND_S)
        assert rt.tracer.in_flight() == 0
    failed = [s for s in named(span_exporter, "send k") if s.status.status_code is StatusCode.ERROR]
    assert [exception_types(s) for s in failed] == [[type_name(e)] for e in errors]


@pytest.mark.parametrize("tier", TIERS)
async def test_send_and_receive_lets_go_of_its_request(span_exporter: Any, tier: str) -> None:
    """A request refused by a full ``reject`` inbox, or given up on, leaves no context."""
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("n", echo_of(tier), input_type=Job, output_type=Done, tier=tier)
        with pytest.raises(KernelStateError):  # never activated: no reply can come
            await rt.send_and_receive("n", Job(seq=-1), timeout=BOUND_S)
        assert rt.tracer.in_flight() == 0
        await rt.launch(
            "k", echo_of(tier), input_type=Job, output_type=Done, tier=tier,
            queue_size=2, backpressure="reject",
        )  # fmt: skip
        await rt.activate("k")
        await rt.deactivate("k")  # what is sent now waits
        with pytest.raises(TimeoutError):  # queued, then given up on
            await rt.send_and_receive("k", Job(seq=11), timeout=0.05)
        assert rt.tracer.in_flight() == 0
        accepted = 0
        try:
            for i in range(10):
                await rt.send("k", Job(seq=i))
                accepted += 1
        except QueueFullError:
            pass
        assert accepted < 10
        held = rt.tracer.in_flight()
        with pytest.raises(QueueFullError):
            await rt.send_and_receive("k", Job(seq=10), timeout=BOUND_S)
        assert rt.tracer.in_flight() == held
        await rt.reactivate("k")
        for _ in range(accepted):
            await rt.receive("k", timeout=BOUND_S)
        assert (await rt.send_and_receive("k", Job(seq=12), timeout=BOUND_S)).seq == 12
        assert rt.tracer.in_flight() == 0


@pytest.mark.parametrize("tier", TIERS)
async def test_a_reply_to_a_caller_carries_nothing_down_the_pipeline(
    span_exporter: Any, tier: str
) -> None:
    """k forwards into d, but the reply to a ``send_and_receive`` caller goes to that
    caller: no ``send d`` span, no context kept for d."""
    span_exporter.clear()
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch("k", echo_of(tier), input_type=Job, output_type=Done, tier=tier)
        await rt.launch("d", forward_async, input_type=Done, output_type=Done)
        for kid in "kd":
            await rt.activate(kid)
        rt.connect("k", "d")
        for i in range(5):
            assert (await rt.send_and_receive("k", Job(seq=i), timeout=BOUND_S)).seq == i
        assert rt.tracer.in_flight() == 0
        await rt.send("k", Job(seq=9))  # a plain send's reply goes on to d
        assert (await rt.receive("d", timeout=BOUND_S)).seq == 9
        assert rt.tracer.in_flight() == 0
    assert len(named(span_exporter, "send d")) == 1


@pytest.mark.parametrize("tier", TIERS)
async def test_the_failing_message_of_a_pool_has_the_failed_span(
    span_exporter: Any, tier: str
) -> None:
    """Two replicas; the asyncio pool restarts the replica that raised (3 of 30 raise), a
    hosted pool fails as one kernel on the first. Only the spans of the messages an actor
    raised on are ERROR, with the exception recorded."""
    from opentelemetry.trace import StatusCode

    span_exporter.clear()
    restarts = tier == "asyncio"
    n = 30 if restarts else 8
    booms = {4, 14, 24} if restarts else {4}
    opts: dict[str, Any] = {"restart": "on_failure", "max_restarts": None} if restarts else {}
    jobs = [Job(seq=i, payload="boom" if i in booms else "") for i in range(n)]
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch(
            "k", echo_of(tier), input_type=Job, output_type=Done, tier=tier, replicas=2, **opts
        )
        await rt.activate("k")
        for job in jobs:
            await rt.send("k", job)
        if restarts:
            for _ in range(n - len(booms)):
                await rt.receive("k", timeout=BOUND_S)
        else:
            deadline = time.monotonic() + BOUND_S
            while rt.get_kernel_state("k").value != "failed" and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
    ids = {str(job.message_id): job.seq for job in jobs}
    spans = named(span_exporter, "process k")
    failed = {
        ids[s.attributes["messaging.message.id"]]
        for s in spans
        if s.status.status_code is StatusCode.ERROR
    }
    assert failed == booms
    for s in spans:
        seq = ids[s.attributes["messaging.message.id"]]
        assert exception_types(s) == (["ValueError"] if seq in booms else [])


@pytest.mark.parametrize("tier", TIERS)
async def test_a_serializing_kernel_continues_the_trace_and_lets_go(
    span_exporter: Any, tier: str
) -> None:
    """``serialize=True``: the actor takes a copy decoded from the bytes in the inbox; its
    ``process`` span still hangs under the message's ``send``, and the tracer keeps
    nothing once the copy is taken, nor for the frames a full ``drop_oldest`` inbox
    drops."""
    span_exporter.clear()
    room, n = 4, 10
    async with asyncio.timeout(BOUND_S * 2), RingKernelRuntime(tracing=True) as rt:
        await rt.launch(
            "k", echo_of(tier), input_type=Job, output_type=Done, tier=tier,
            serialize=True, queue_size=room, backpressure="drop_oldest",
        )  # fmt: skip
        for i in range(n):  # not active: all but the last four are dropped
            await rt.send("k", Job(seq=i))
        assert rt.tracer.in_flight() == room
        await rt.activate("k")
        got = sorted([(await rt.receive("k", timeout=BOUND_S)).seq for _ in range(room)])
        assert got == list(range(n - room, n))
        assert rt.tracer.in_flight() == 0
        deadline = time.monotonic() + BOUND_S
        while len(named(span_exporter, "process k")) < room and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    sends = {s.attributes["messaging.message.id"]: s for s in named(span_exporter, "send k")}
    processes = named(span_exporter, "process k")
    assert len(processes) == room
    for span in processes:
        send = sends[span.attributes["messaging.message.id"]]
        assert span.parent is not None
        assert span.parent.span_id == send.context.span_id
