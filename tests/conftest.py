"""The project's tests use the same pytest plugin downstream projects get.

Installed (``pip install -e .``), the plugin arrives through the ``pytest11`` entry point;
from a bare checkout it is loaded here. Every test runs under the leak guard: no kernel
task, thread, child process or shared-memory segment may outlive it.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from pydotcompute.testing import LeakGuard

if "pydotcompute.testing.plugin" not in sys.modules:  # not loaded by the entry point
    pytest_plugins = ["pydotcompute.testing.plugin"]


@pytest.fixture(autouse=True)
def _leak_guard(pydotcompute_leak_guard: LeakGuard | None) -> LeakGuard | None:
    return pydotcompute_leak_guard


@pytest.fixture(scope="module")
def span_exporter() -> Any:
    """The OpenTelemetry SDK's in-memory exporter behind the global tracer provider (the
    provider is set once a process; each module gets an exporter of its own). Skips where
    the SDK is not installed."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter
