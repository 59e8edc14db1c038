"""Fixtures and loop parametrization for the foundation unit tests.

The runtime, lifecycle, routing and queue tests run on both event loops: plain asyncio (the
reference) and uvloop. pytest-asyncio parametrizes every async test through the
``pytest_asyncio_loop_factories`` hook below; the test id says which loop ran
(``test_x[asyncio]`` / ``test_x[uvloop]``). Async tests in other modules of this folder keep
the loop pytest-asyncio would have given them (one factory, no extra test id).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pydotcompute.ring_kernels import registry as _kernel_registry
from pydotcompute.ring_kernels.runtime import RingKernelRuntime
from pydotcompute.testing.environment import available_loop_factories

#: Modules whose async tests run on both loops.
BOTH_LOOPS = frozenset(
    {
        "test_fast_queue.py",
        "test_message_queue.py",
        "test_lifecycle.py",
        "test_runtime.py",
        "test_routing.py",
        "test_telemetry.py",
    }
)


def _policy_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_event_loop_policy().new_event_loop()


@pytest.hookimpl(tryfirst=True)
def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    if Path(str(item.path)).name in BOTH_LOOPS:
        return available_loop_factories()
    if config.pluginmanager.has_plugin("pydotcompute-loop-factories"):
        return None  # the project's pytest plugin decides for everything else
    return {"default": _policy_loop}


def _kernel_tasks() -> list[asyncio.Task[Any]]:
    return [
        t for t in asyncio.all_tasks() if t.get_name().startswith("pydotcompute:") and not t.done()
    ]


@pytest.fixture
async def rt() -> AsyncIterator[RingKernelRuntime]:
    """A started runtime, shut down afterwards; fails the test if an actor task survives.

    Unlike the plugin's ``runtime`` fixture it accepts undelivered messages: several tests
    leave some on purpose to check how they are counted. Threads, processes and
    shared-memory segments are checked by the project-wide leak guard (tests/conftest.py).
    """
    runtime = RingKernelRuntime()
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.shutdown(timeout=2.0)
        await asyncio.sleep(0)
        leftover = _kernel_tasks()
        for task in leftover:
            task.cancel()
        assert not leftover, f"actor tasks outlived the runtime: {leftover}"


@pytest.fixture
def clean_kernel_registry() -> Iterator[None]:
    """Restore the process-wide ``@ring_kernel`` registry after the test."""
    saved = dict(_kernel_registry._REGISTRY)
    try:
        yield
    finally:
        _kernel_registry._REGISTRY.clear()
        _kernel_registry._REGISTRY.update(saved)
