"""One local Ray instance for the whole Ray suite, and a fresh runtime per test.

Ray starts slowly (seconds), so the session starts it once:
``ray.init(num_cpus=2, include_dashboard=False)`` plus a custom resource ``pdc_slot`` the
resource tests ask for. The workers import the test kernels from ``ray_test_actors`` (a
module next to this file) and the package itself: both travel with
``runtime_env={"py_modules": [...]}``, exactly as a user ships code to a cluster, so the
suite does not depend on how the package was installed or on PYTHONPATH.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import ray_test_actors  # noqa: E402  (tests/ray is on sys.path: no __init__.py here)

import pydotcompute  # noqa: E402
import tests  # noqa: E402  (the shared tier scenarios: tests/tier_scenarios.py)
from pydotcompute.distributed.ray import RayRingKernelRuntime  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def ray_session() -> Iterator[Any]:
    """Start the local Ray instance once; shut it down after the last Ray test."""
    started = not ray.is_initialized()
    if started:
        options: dict[str, Any] = {
            "num_cpus": 2,
            "include_dashboard": False,
            "resources": {"pdc_slot": 2},
            "runtime_env": {"py_modules": [pydotcompute, ray_test_actors, tests]},
            "logging_level": "ERROR",
            "log_to_driver": False,
        }
        try:
            ray.init(**options)
        except Exception:  # a loaded machine can miss Ray's startup deadline; once more
            ray.shutdown()
            ray.init(**options)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
async def ray_runtime() -> AsyncIterator[RayRingKernelRuntime]:
    """A started :class:`RayRingKernelRuntime`; shut down (every actor killed) after the test."""
    runtime = RayRingKernelRuntime()
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.shutdown(timeout=5.0)
