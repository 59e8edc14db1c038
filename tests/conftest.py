"""The project's tests use the same pytest plugin downstream projects get.

Installed (``pip install -e .``), the plugin arrives through the ``pytest11`` entry point;
from a bare checkout it is loaded here. Every test runs under the leak guard: no kernel
task, thread, child process or shared-memory segment may outlive it.

`make test-main` runs the suite on several pytest-xdist workers: most of its time is spent
waiting on child processes, Ray actors and timeouts, not computing. Every test that starts
or uses Ray goes to one worker (`pytest_xdist_make_scheduler`): they share one local Ray
instance, and a second ``ray.init`` on the machine would join the first one's cluster (or
refuse its options). Each worker is its own process, so the leak guard's checks stay per
process.
"""

from __future__ import annotations

import functools
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


#: Test modules whose module-scoped fixtures take long (building wheels and installing them):
#: run on one worker, they build them once.
SHARED_SETUP = frozenset(
    {"tests/integration/test_distribution.py", "tests/integration/test_downstream_plugin.py"}
)


@functools.cache
def _ray_blocks() -> frozenset[str]:
    """Node ids of the docs blocks that start Ray (`test_docs_examples.py`)."""
    from tests.integration.test_docs_examples import BLOCKS

    return frozenset(
        f"tests/integration/test_docs_examples.py::test_block_runs[{b.id}]"
        for b in BLOCKS
        if "ray" in b.requires
    )


def shared_scope(nodeid: str) -> str:
    """The unit of work a test goes to a worker in: ``"ray"`` for every test that starts or
    uses Ray, the module for `SHARED_SETUP`, else the test alone."""
    path = nodeid.partition("::")[0]
    if path.startswith("tests/ray/") or nodeid in _ray_blocks():
        return "ray"
    if path in SHARED_SETUP:
        return path
    return nodeid


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scope scheduling with the suite's own scopes (`shared_scope`): the
    largest unit (the Ray tests) starts first, then the rest a test at a time. (xdist's own
    ``loadgroup`` marks are not used: with pytest 9.2 its worker cannot rename a test, so the
    groups never form.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shared_scope(nodeid)

    return SharedScopes(config, log)
