"""Observability: Prometheus metrics, OpenTelemetry traces and ``python -m pydotcompute top``.

Everything here needs the ``observability`` extra (``prometheus-client``,
``opentelemetry-api``, ``rich``); importing this package does not import them, and a call
that needs one raises `BackendNotAvailableError` naming the extra when it is missing.

- `collector(runtime)`: a Prometheus collector reading the runtime's telemetry at scrape
  time, for a registry or server of your own.
- `serve_metrics(runtime, port, host)` (or ``runtime.serve_metrics``): serve them over HTTP.
"""

from __future__ import annotations

from typing import Any

from .deps import INSTALL_HINT, require

__all__ = ("INSTALL_HINT", "collector", "require", "serve_metrics")


def __getattr__(name: str) -> Any:
    # `collector` and `serve_metrics` live in `metrics`, which imports prometheus_client
    if name in ("collector", "serve_metrics"):
        from . import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
