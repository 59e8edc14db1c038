"""``python -m pydotcompute top`` against hostile, broken and restarting endpoints.

Every endpoint is a real server on 127.0.0.1 run by a thread of this test (an endless
body, one byte a second, garbage, a target that stops and comes back on the same port), and
``top`` runs as ``python -m pydotcompute top`` in a child process: its exit status and its
standard error (one line, no traceback) are what a user sees. Tables are rendered by rich
into a recording ``Console`` of 80 columns, as a terminal of that width shows them.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("rich")

from rich.console import Console

from pydotcompute import RingKernelRuntime
from pydotcompute.observability.top import parse_metrics, read_metrics, render, with_rates

from .tier_actors import Job, forward_async

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
BOUND_S = 60.0  # a hang check's bound: far beyond what any of these runs needs


def top(*args: str, timeout: float = BOUND_S) -> subprocess.CompletedProcess[str]:
    """``pydotcompute top`` piped, as a script runs it: no COLUMNS or LINES (a test runner
    may set them: pytest-xdist's workers do), so the table has its piped width."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return subprocess.run(
        [sys.executable, "-m", "pydotcompute", "top", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line ``top`` wrote to stderr (and nothing like a traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# --- servers ----------------------------------------------------------------------------------


class RawServer:
    """A TCP server on 127.0.0.1 answering each connection with ``handler(server, conn)``.

    It reads the request head first; ``sent`` counts the bytes handed to the kernel.
    """

    def __init__(self, handler: Callable[[RawServer, socket.socket], None]) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.stop = threading.Event()
        self.sent = 0
        self.threads: list[threading.Thread] = []
        self.listener.settimeout(0.1)
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(BOUND_S)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                self.handler(self, conn)
            except OSError:
                pass  # the client went away: what the hostile servers wait for

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for t in [self.acceptor, *self.threads]:
            t.join(timeout=10)


@contextmanager
def raw_server(handler: Callable[[RawServer, socket.socket], None]) -> Iterator[RawServer]:
    server = RawServer(handler)
    try:
        yield server
    finally:
        server.close()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n"


def endless(server: RawServer, conn: socket.socket) -> None:
    """A body that never ends (up to 64 MiB, so that an unbounded reader ends too)."""
    server.send(conn, HEAD)
    chunk = b"# an endless scrape\n" * 3277  # 64 KiB
    while server.sent < 64 * MIB and not server.stop.is_set():
        server.send(conn, chunk)


def trickle(head_done: bool) -> Callable[[RawServer, socket.socket], None]:
    """One byte every half second, in the head or in the body: never a whole answer."""

    def handler(server: RawServer, conn: socket.socket) -> None:
        if head_done:
            server.send(conn, HEAD)
        else:
            server.send(conn, b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while not server.stop.wait(0.5):
            server.send(conn, b"a" if not head_done else b"#")

    return handler


def answer(raw: bytes) -> Callable[[RawServer, socket.socket], None]:
    def handler(server: RawServer, conn: socket.socket) -> None:
        server.send(conn, raw)

    return handler


def ok(body: bytes) -> bytes:
    return HEAD.replace(b"Connection", f"Content-Length: {len(body)}\r\nConnection".encode()) + body


GOOD = (
    b"# TYPE pydotcompute_messages_processed counter\n"
    b'pydotcompute_messages_processed_total{kernel="alpha",replica="",tier="thread"} 7\n'
)


# --- size, time, scheme -----------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "limit_mib"), [((), 16), (("--max-body-mib", "1"), 1)])
def test_an_endless_body_is_cut_at_the_size_limit(flags: tuple[str, ...], limit_mib: int) -> None:
    with raw_server(endless) as server:
        proc = top("--once", "--url", server.url, "--timeout", "30", *flags)
        sent = server.sent
    line = one_line_error(proc)
    assert proc.returncode == 1
    assert f"more than {limit_mib} MiB" in line, line
    assert "--max-body-mib" in line, line
    # what top read, plus what the kernel's socket buffers held when it hung up
    assert sent < (limit_mib + 24) * MIB, sent


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_trickling_server_cannot_hold_top_past_its_timeout(where: str) -> None:
    with raw_server(trickle(head_done=where == "body")) as server:
        t0 = time.monotonic()
        proc = top("--once", "--url", server.url, "--timeout", "2", timeout=BOUND_S)
        took = time.monotonic() - t0
    line = one_line_error(proc)
    assert proc.returncode == 1
    assert "no complete answer within 2 s" in line, line
    assert "--timeout" in line, line
    assert took < 2 + 20, took  # its deadline plus a generous margin for a busy machine


BAD_BODIES = {
    "garbage": (ok(b"this is not { prometheus\n"), "not Prometheus text"),
    "html": (ok(b"<html><body>hello</body></html>\n"), "not Prometheus text"),
    "not utf-8": (ok(b"\xff\xfe\x00pydotcompute\n"), "not UTF-8"),
    "bad le": (
        ok(b'pydotcompute_message_latency_seconds_bucket{kernel="k",replica="",le="abc"} 1\n'),
        "le='abc'",
    ),
    "nan le": (
        ok(b'pydotcompute_message_latency_seconds_bucket{kernel="k",replica="",le="NaN"} 1\n'),
        "le='NaN'",
    ),
    "no le": (
        ok(b'pydotcompute_message_latency_seconds_bucket{kernel="k",replica=""} 1\n'),
        "no le label",
    ),
    "status 404": (
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot here\n",
        "HTTP 404 Not Found",
    ),
    "not http": (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP answer"),
    "hang up": (b"", "closed the connection"),
    "control chars": (ok(b"\x1b[2J\x1b]0;pwned\x07 1\n"), "not Prometheus text"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_bad_answer_ends_in_one_line(case: str) -> None:
    raw, expected = BAD_BODIES[case]
    with raw_server(answer(raw)) as server:
        proc = top("--once", "--url", server.url, "--timeout", "10")
    line = one_line_error(proc)
    assert proc.returncode == 1
    assert line.startswith(f"pydotcompute top: cannot read {server.url}: "), line
    assert expected in line, line
    assert "\x1b" not in line
    assert "\x07" not in line  # the server's bytes never reach a tty
    assert len(line) < 400


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--interval", "1e308"),
        ("--interval", "inf"),
        ("--interval", "nan"),
        ("--interval", "0"),
        ("--interval", "-1"),
        ("--timeout", "1e308"),
        ("--timeout", "nan"),
        ("--max-body-mib", "0"),
    ],
)
def test_flags_out_of_range_are_one_line_usage_errors(flag: str, value: str) -> None:
    with raw_server(answer(ok(GOOD))) as server:  # a live target: the flag is the only fault
        proc = top("--url", server.url, flag, value, timeout=30)
    line = one_line_error(proc)
    assert proc.returncode == 2
    assert flag in line, line
    assert value in line, line
    assert "--help" in line, line


@pytest.mark.parametrize(
    "url",
    [
        "file://{path}",
        "ftp://127.0.0.1/metrics",
        "data:text/plain,hello",
        "127.0.0.1:9464/metrics",
        "localhost:9464/metrics",
        "http:///metrics",
        "http://127.0.0.1:99999/metrics",
    ],
)
def test_only_http_and_https_urls_are_read(url: str, tmp_path: Path) -> None:
    secret = tmp_path / "metrics.txt"
    secret.write_text(GOOD.decode().replace("alpha", "secret_kernel"))
    proc = top("--once", "--url", url.format(path=secret))
    line = one_line_error(proc)
    assert proc.returncode == 2
    assert "secret_kernel" not in proc.stdout
    assert "--url" in line, line
    assert "http://" in line, line


def test_a_redirect_to_a_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "metrics.txt"
    secret.write_text(GOOD.decode().replace("alpha", "secret_kernel"))
    redirect = f"HTTP/1.1 302 Found\r\nLocation: file://{secret}\r\nContent-Length: 0\r\n\r\n"
    with raw_server(answer(redirect.encode())) as server:
        proc = top("--once", "--url", server.url)
    line = one_line_error(proc)
    assert proc.returncode == 1
    assert "secret_kernel" not in proc.stdout
    assert "redirect" in line, line
    assert "file://" in line, line


def test_a_redirect_within_http_is_followed() -> None:
    with raw_server(answer(ok(GOOD))) as target:
        moved = f"HTTP/1.1 301 Moved\r\nLocation: {target.url}\r\nContent-Length: 0\r\n\r\n"
        with raw_server(answer(moved.encode())) as server:
            proc = top("--once", "--url", server.url)
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[0] for ln in proc.stdout.splitlines()][-1] == "alpha", proc.stdout


# --- what reaches the terminal ----------------------------------------------------------------


def rendered(views: dict, url: str, width: int) -> str:  # type: ignore[type-arg]
    console = Console(width=width, record=True, force_terminal=False)
    console.print(render(views, url))
    return console.export_text()


HOSTILE_IDS = ("a[/]b", "x[bold]y", "c\x1b[31mred\x07", "t\tab\u202eevil")


async def test_kernel_ids_with_markup_and_control_characters_are_shown_as_they_are() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        for kid in HOSTILE_IDS:
            await rt.launch(kid, forward_async, input_type=Job)  # the runtime accepts them
        host, port = rt.serve_metrics(port=0)
        url = f"http://{host}:{port}/metrics"
        views = parse_metrics(await asyncio.to_thread(read_metrics, url))
        assert set(views) == set(HOSTILE_IDS)
        text = rendered(views, url + "?[/]", width=200)
        for shown in ("a[/]b", "x[bold]y", r"c\x1b[31mred\x07", r"t\tab\u202eevil"):
            assert shown in text, text
        for raw in ("\x1b", "\x07", "\t", "\u202e"):
            assert raw not in text

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "pydotcompute", "top", "--once", "--url", url),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "a[/]b" in out.decode()
    assert "x[bold]y" in out.decode()
    assert b"\x1b" not in out
    assert b"\x07" not in out


def big_numbers(processed: float) -> str:
    lab = 'kernel="scorer",replica="",tier="process"'
    return (
        f"pydotcompute_messages_processed_total{{{lab}}} {processed}\n"
        f'pydotcompute_messages_dropped_total{{{lab},reason="full"}} 2048\n'
        f"pydotcompute_inbox_depth{{{lab}}} 20000\n"
        f"pydotcompute_kernel_restarts_total{{{lab}}} 3\n"
        f"pydotcompute_kernel_errors_total{{{lab}}} 12\n"
        f'pydotcompute_kernel_state{{{lab},state="terminating"}} 1\n'
        f'pydotcompute_message_latency_seconds_bucket{{{lab},le="0.001"}} 0\n'
        f'pydotcompute_message_latency_seconds_bucket{{{lab},le="0.01"}} {processed}\n'
        f'pydotcompute_message_latency_seconds_bucket{{{lab},le="+Inf"}} {processed}\n'
    )


@pytest.mark.parametrize("kernel", ["scorer", "a_rather_long_kernel_name_from_a_worker_pool_x"])
def test_numbers_are_whole_at_80_columns(kernel: str) -> None:
    before = parse_metrics(big_numbers(123_000_000).replace("scorer", kernel))
    now = with_rates(parse_metrics(big_numbers(123_456_789).replace("scorer", kernel)), before, 5)
    text = rendered(now, "http://127.0.0.1:9464/metrics", width=80)
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    row = "\n".join(ln for ln in text.splitlines() if "terminating" in ln)
    for whole in ("91,358", "20,000", "5.50 ms", "9.91 ms", "123M", "2,048"):
        assert whole in row, text
    assert "not shown at this width:" in text, text  # a narrow terminal says what it left out
    wide = rendered(now, "http://127.0.0.1:9464/metrics", width=200)
    for header in ("kernel", "tier", "state", "msg/s", "inbox", "p50", "p99", "processed"):
        assert header in wide
    for header in ("drops", "restarts", "errors", kernel, "process"):
        assert header in wide
    assert "not shown" not in wide


# --- the live view ----------------------------------------------------------------------------


def metrics_server(port: int, kernel: str) -> http.server.ThreadingHTTPServer:
    body = GOOD.replace(b"alpha", kernel.encode())

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: http.server.ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def test_the_live_view_retries_a_target_that_stops_and_comes_back() -> None:
    with socket.socket() as probe:  # a free port, for a target that is not up yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    master, slave = pty.openpty()  # a terminal, as a user has: the live view draws on it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "LINES": "30"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydotcompute", "top", "--url", url, "--interval", "0.2"],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_for(text: bytes, since: int) -> int:
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            at = screen.find(text, since)
            if at >= 0:
                return at
            assert proc.poll() is None, f"top exited ({proc.returncode}): {bytes(screen)!r}"
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not shown: {bytes(screen[since:])!r}")

    server = None
    try:
        at = wait_for(b"retrying", 0)  # nothing there yet: it waits, it does not exit
        server = metrics_server(port, "alpha")
        at = wait_for(b"alpha", at)
        stop(server)
        at = wait_for(b"retrying", at)  # the target went away: the view stays
        server = metrics_server(port, "bravo")  # the same port, a new process
        wait_for(b"bravo", at)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=BOUND_S) == 0
        assert proc.stderr is not None
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server is not None:
            stop(server)
        os.close(master)
        reader.join(timeout=10)
