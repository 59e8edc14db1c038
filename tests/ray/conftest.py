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


def shipped() -> dict[str, Any]:
    """What the workers need: the package and the test actors, shipped as a user ships
    code (a fresh dict each time: ``ray.init`` rewrites the one it is given into the URIs
    of one cluster's storage)."""
    return {"py_modules": [pydotcompute, ray_test_actors, tests]}


def start_local_ray() -> None:
    """``ray.init`` of the suite's local instance (retried once: a loaded machine can miss
    Ray's startup deadline)."""
    options: dict[str, Any] = {
        "num_cpus": 2,
        "include_dashboard": False,
        "resources": {"pdc_slot": 2},
        "runtime_env": shipped(),
        "logging_level": "ERROR",
        "log_to_driver": False,
    }
    try:
        ray.init(**options)
    except Exception:
        ray.shutdown()
        ray.init(**options)


@pytest.fixture(scope="session", autouse=True)
def ray_session() -> Iterator[Any]:
    """Start the local Ray instance once; shut it down after the last Ray test (a module
    that needs a cluster of its own, `test_ray_multinode.py`, stops it and starts it
    again when it is done)."""
    started = not ray.is_initialized()
    if started:
        start_local_ray()
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
