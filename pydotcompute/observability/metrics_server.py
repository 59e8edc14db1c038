"""The HTTP server behind ``serve_metrics``: concurrent, deadline-bound, stoppable at once.

Design notes:
- One thread accepts (``pydotcompute-metrics``) and each connection is served on a short-lived
  thread of its own (``pydotcompute-metrics-client``), at most ``max_connections`` at once
  (more are answered 503 at once): an idle or slow client holds only its own thread, never
  the scrape beside it. A thread per connection costs ~0.1 ms per scrape; an asyncio loop or
  a selector state machine in one thread was rejected: the scrape itself blocks (it waits
  for the runtime's loop and formats text), so it would need a thread anyway.
- A connection has one deadline (``request_deadline``) from accept to the last byte of the
  response: each read and the write wait at most what is left of it, so a client sending a
  header line every second is cut at the deadline like an idle one (answered 408).
  wsgiref was dropped: its reads time out per line, not per request.
- ``stop`` shuts every live connection's socket down (a blocked read returns at once) and
  joins the threads within its timeout; the threads are daemons, so none can hold exit.
- Client errors (timeouts, malformed requests, resets, refusals) are counted by reason in
  ``pydotcompute_metrics_client_errors_total`` and logged as one line: the first at WARNING,
  the rest at DEBUG. A scanner or a stuck scraper never prints tracebacks into the
  application's stderr.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from ..exceptions import InvalidConfigurationError
from .deps import require

_prom = require("prometheus_client", "Prometheus metrics")
from prometheus_client.core import CounterMetricFamily, Metric  # noqa: E402
from prometheus_client.registry import Collector, CollectorRegistry  # noqa: E402

__all__ = ("MAX_CONNECTIONS", "REQUEST_DEADLINE_S", "MetricsServer")

logger = logging.getLogger("pydotcompute")

#: seconds a connection may take from accept to the last byte of its response
REQUEST_DEADLINE_S = 5.0
#: connections served at once; one more is answered 503 and closed
MAX_CONNECTIONS = 32
#: the most a request's line and headers may hold
MAX_REQUEST_HEAD = 16 * 1024
_POLL_S = 0.2  # how often the accepting thread looks for `stop`


class _ClientError(Exception):
    """What a client did wrong: counted under ``reason``, answered ``status`` if any."""

    def __init__(self, reason: str, detail: str, status: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status


class _Listener(socketserver.TCPServer):
    """Accepts and hands each connection to its `MetricsServer` (which serves it)."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], family: int, owner: MetricsServer) -> None:
        self.address_family = family
        self.owner = owner
        super().__init__(address, socketserver.BaseRequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner.accepted(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.owner.client_error("refused", client_address, "could not be served (no thread)")


class _ServerFigures(Collector):
    """The server's own figures: client errors by reason."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def collect(self) -> Iterable[Metric]:
        fam = CounterMetricFamily(
            "pydotcompute_metrics_client_errors",
            "Connections to the metrics server that ended in a client error, by reason "
            "(timeout, bad_request, disconnected, over_limit, refused).",
            labels=["reason"],
        )
        for reason, n in sorted(self.server.client_errors().items()):
            fam.add_metric([reason], n)
        return [fam]


class MetricsServer:
    """An HTTP server of one registry's metrics (see the module notes); `stop` ends it.

    Args:
        registry: What to serve; the server registers its own client-error counter in it.
        host: The address to listen on (an IPv6 one when it holds a ``:``).
        port: The port (0: a free one).
        request_deadline: Seconds a connection may take, from accept to the last byte of
            the response; a client still sending its request then is answered 408.
        max_connections: Connections served at once; one more is answered 503.
        on_stop: Called once by `stop`, before the connections are closed (the collector's
            ``close``: a scrape waiting for the runtime's loop stops waiting).

    Raises:
        InvalidConfigurationError: the address cannot be bound, or an option is out of range.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        request_deadline: float = REQUEST_DEADLINE_S,
        max_connections: int = MAX_CONNECTIONS,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        if (
            not isinstance(request_deadline, int | float)
            or isinstance(request_deadline, bool)
            or not math.isfinite(request_deadline)
            or request_deadline <= 0
        ):
            raise InvalidConfigurationError(
                f"request_deadline must be a finite number of seconds > 0, got "
                f"{request_deadline!r} (default {REQUEST_DEADLINE_S})"
            )
        if (
            not isinstance(max_connections, int)
            or isinstance(max_connections, bool)
            or max_connections < 1
        ):
            raise InvalidConfigurationError(
                f"max_connections must be an int >= 1, got {max_connections!r} "
                f"(default {MAX_CONNECTIONS})"
            )
        self.request_deadline = float(request_deadline)
        self.max_connections = max_connections
        self._app = _prom.make_wsgi_app(registry)
        self._on_stop = on_stop
        self._lock = threading.Lock()
        self._live: dict[socket.socket, threading.Thread] = {}
        self._errors: dict[str, int] = {}
        self._logged = False
        self._stopping = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = _Listener((host, port), family, self)
        except OSError as exc:
            raise InvalidConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc}; choose another port "
                "(port=0 picks a free one)"
            ) from exc
        self.requested = (host, port)
        self.address: tuple[str, int] = (host, int(self._listener.server_address[1]))
        registry.register(_ServerFigures(self))
        self._thread = threading.Thread(
            target=self._listener.serve_forever,
            kwargs={"poll_interval": _POLL_S},
            name="pydotcompute-metrics",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """The metrics URL (``http://host:port/metrics``)."""
        host, port = self.address
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def client_errors(self) -> dict[str, int]:
        """Client errors so far, by reason (what ``..._client_errors_total`` reports)."""
        with self._lock:
            return dict(self._errors)

    def live_connections(self) -> int:
        """Connections being served now."""
        with self._lock:
            return len(self._live)

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop accepting, close every live connection and join the threads.

        Idempotent. Returns within about ``timeout`` seconds whatever the clients do (the
        accepting thread notices within 0.2 s).

        Returns:
            True when every thread of the server ended within ``timeout``.
        """
        with self._lock:
            first = not self._stopping
            self._stopping = True
        if first:
            self._listener.shutdown()  # serve_forever returns within one poll
            self._listener.server_close()
            if self._on_stop is not None:
                self._on_stop()
        with self._lock:
            live = list(self._live.items())
        for sock, _ in live:
            with contextlib.suppress(OSError):  # a blocked read or write returns at once
                sock.shutdown(socket.SHUT_RDWR)
        end = time.monotonic() + max(0.0, min(timeout, 3600.0))
        for thread in [self._thread, *(t for _, t in live)]:
            thread.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in [self._thread, *(t for _, t in live)])

    # -- one connection, on the accepting thread then its own ---------------------------

    def accepted(self, sock: socket.socket, address: Any) -> None:
        """Serve ``sock`` on a thread of its own, or answer 503 when too many are served
        (the listener calls this on its thread for every connection it accepts)."""
        with self._lock:
            stopping = self._stopping
            full = len(self._live) >= self.max_connections
            if not (full or stopping):
                thread = threading.Thread(
                    target=self._serve,
                    args=(sock, address),
                    name="pydotcompute-metrics-client",
                    daemon=True,
                )
                self._live[sock] = thread
        if stopping:
            _close(sock)
            return
        if full:
            _send_quickly(sock, "503 Service Unavailable", b"too many connections\n")
            _close(sock)
            self.client_error(
                "over_limit",
                address,
                f"was refused: {self.max_connections} connections are being served "
                "(max_connections)",
            )
            return
        try:
            thread.start()
        except BaseException:
            with self._lock:
                self._live.pop(sock, None)
            _close(sock)
            raise

    def _serve(self, sock: socket.socket, address: Any) -> None:
        deadline = time.monotonic() + self.request_deadline
        try:
            environ = _parse(self._read_head(sock, deadline))
            status, headers, body = self._respond(environ)
            out = [f"HTTP/1.1 {status}"]
            out += [f"{name}: {value}" for name, value in headers]
            out += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
            head = "\r\n".join(out).encode("latin-1")
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(head + body)  # bounded by the timeout as a whole
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        except _ClientError as exc:
            if exc.status is not None:
                _send_quickly(sock, exc.status, f"{exc.detail}\n".encode())
            self.client_error(exc.reason, address, exc.detail)
        except _Probe:
            pass  # connected and closed without a byte: a TCP health check
        except TimeoutError:
            self.client_error(
                "timeout", address, f"did not read its response within {self.request_deadline:g} s"
            )
        except OSError as exc:
            if not self._stopping:
                self.client_error("disconnected", address, f"went away ({exc})")
        except Exception as exc:  # a fault of ours: one line, and the client gets a 500
            _send_quickly(sock, "500 Internal Server Error", b"metrics failed\n")
            logger.error("metrics server %s: a scrape failed: %r", self.url, exc)
        finally:
            _close(sock)
            with self._lock:
                self._live.pop(sock, None)

    def _read_head(self, sock: socket.socket, deadline: float) -> bytes:
        """The request line and headers, read by ``deadline`` (a `_ClientError` if not)."""
        buf = b""
        while True:
            for sep in (b"\r\n\r\n", b"\n\n"):
                end = buf.find(sep)
                if end >= 0:
                    return buf[:end]
            if len(buf) > MAX_REQUEST_HEAD:
                raise _ClientError(
                    "bad_request",
                    f"sent a request head over {MAX_REQUEST_HEAD} bytes",
                    "431 Request Header Fields Too Large",
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._late()
            sock.settimeout(left)
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                raise self._late() from None
            if not chunk:
                if not buf:
                    raise _Probe
                raise _ClientError("disconnected", "closed the connection inside its request")
            buf += chunk

    def _late(self) -> _ClientError:
        return _ClientError(
            "timeout",
            f"sent no complete request within {self.request_deadline:g} s (request_deadline)",
            "408 Request Timeout",
        )

    def _respond(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
        started: list[tuple[str, list[tuple[str, str]]]] = []

        def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
            started.append((status, headers))

        body = b"".join(self._app(environ, start_response))
        status, headers = started[0]
        return status, headers, body

    def client_error(self, reason: str, address: Any, detail: str) -> None:
        """Count a client error under ``reason`` and log it in one line (WARNING the first
        time, DEBUG after)."""
        with self._lock:
            self._errors[reason] = self._errors.get(reason, 0) + 1
            first, self._logged = not self._logged, True
        peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        if first:
            logger.warning(
                "metrics server %s: the client at %s %s; closed it (client errors are "
                "logged once: pydotcompute_metrics_client_errors_total counts them)",
                self.url,
                peer,
                detail,
            )
        else:
            logger.debug("metrics server %s: the client at %s %s", self.url, peer, detail)


class _Probe(Exception):
    """A connection closed before sending anything."""


def _parse(head: bytes) -> dict[str, Any]:
    """The WSGI environ of a request head (what prometheus_client's app reads)."""
    lines = head.decode("latin-1").splitlines()
    parts = lines[0].split() if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        shown = lines[0][:80] if lines else ""
        raise _ClientError(
            "bad_request", f"sent a malformed request line {shown!r}", "400 Bad Request"
        )
    method, target, _ = parts
    url = urlsplit(target)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": url.path or "/",
        "QUERY_STRING": url.query,
    }
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        key = name.strip().lower()
        if sep and key in ("accept", "accept-encoding"):
            environ["HTTP_" + key.upper().replace("-", "_")] = value.strip()
    return environ


def _send_quickly(sock: socket.socket, status: str, body: bytes) -> None:
    """Answer ``status`` if the socket takes it now (a refusal never waits on a client)."""
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(head.encode("latin-1") + body)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
