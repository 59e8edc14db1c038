"""Device-wide synchronizations are refused (or narrowed to a stream) while ring kernels run.

A persistent GPU ring kernel ends only when the host tells it to; a device-wide wait on the
event loop would wait for it forever. These tests register a running kernel by name through
the public guard (no GPU needed) and check every path the package has to such a wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pydotcompute.backends import device_sync
from pydotcompute.backends.base import Backend
from pydotcompute.backends.cpu import CPUBackend
from pydotcompute.backends.cuda import CUDABackend
from pydotcompute.core import MemoryPool
from pydotcompute.core.orchestrator import ComputeOrchestrator
from pydotcompute.exceptions import CUDAError


@pytest.fixture
def running() -> Iterator[str]:
    """A persistent kernel recorded as running for the duration of the test."""
    name = "pydotcompute-gpu:test-actor"
    device_sync.kernel_started(name)
    try:
        yield name
    finally:
        device_sync.kernel_stopped(name)


def test_the_registry_counts_starts_and_stops() -> None:
    assert not device_sync.ring_kernels_running()
    device_sync.kernel_started("a")
    device_sync.kernel_started("a")
    device_sync.kernel_started("b")
    assert device_sync.running_ring_kernels() == ["a", "a", "b"]
    device_sync.kernel_stopped("a")
    device_sync.kernel_stopped("b")
    assert device_sync.running_ring_kernels() == ["a"]
    device_sync.kernel_stopped("a")
    assert not device_sync.ring_kernels_running()
    device_sync.refuse_device_sync("x", "y")  # nothing runs: no error


def test_refusal_names_the_operation_the_kernels_and_the_way_out(running: str) -> None:
    with pytest.raises(CUDAError) as info:
        device_sync.refuse_device_sync("thing()", "Wait on a stream instead")
    text = str(info.value)
    assert "thing() refused" in text
    assert running in text
    assert "1 persistent GPU ring kernel(s)" in text
    assert "Wait on a stream instead" in text


def test_cuda_backend_synchronize_is_refused(running: str) -> None:
    with pytest.raises(CUDAError, match=r"CUDABackend\.synchronize\(\) refused.*test-actor"):
        CUDABackend().synchronize()


class _FakeCupyPool:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def free_all_blocks(self) -> None:
        self.log.append(self.name)


class _FakeCupy:
    def __init__(self) -> None:
        self.log: list[str] = []

    def get_default_memory_pool(self) -> _FakeCupyPool:
        return _FakeCupyPool(self.log, "device")

    def get_default_pinned_memory_pool(self) -> _FakeCupyPool:
        return _FakeCupyPool(self.log, "pinned")


def test_memory_pool_free_all_blocks_is_refused_on_a_gpu(
    running: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = MemoryPool.create()
    fake = _FakeCupy()
    monkeypatch.setattr(pool, "_cupy", lambda: fake)
    with pytest.raises(CUDAError, match=r"MemoryPool\.free_all_blocks\(\) refused"):
        pool.free_all_blocks()
    assert fake.log == []  # nothing was freed
    device_sync.kernel_stopped(running)
    pool.free_all_blocks()
    assert fake.log == ["device", "pinned"]
    device_sync.kernel_started(running)


def test_memory_pool_without_a_gpu_is_not_affected(running: str) -> None:
    pool = MemoryPool.create()
    assert pool.free_all_blocks() == 0  # no CuPy pool to free: nothing device-wide


class _RecordingBackend(CPUBackend):
    """A backend that records which kind of wait was asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def synchronize(self) -> None:
        self.calls.append("device")

    def synchronize_stream(self, stream: Any = None) -> None:
        self.calls.append("stream")


class _Stream:
    def __init__(self) -> None:
        self.synced = 0

    def synchronize(self) -> None:
        self.synced += 1


def test_orchestrator_waits_on_streams_only_while_ring_kernels_run(running: str) -> None:
    backend = _RecordingBackend()
    orch = ComputeOrchestrator(backend)
    stream = _Stream()
    orch._streams.append(stream)
    orch.synchronize()
    assert backend.calls == ["stream"]
    assert stream.synced == 1
    device_sync.kernel_stopped(running)
    orch.synchronize()
    assert backend.calls == ["stream", "device"]
    device_sync.kernel_started(running)


def test_orchestrator_shutdown_never_waits_for_the_device_while_kernels_run(running: str) -> None:
    backend = _RecordingBackend()
    orch = ComputeOrchestrator(backend)
    orch.initialize()
    orch.shutdown()
    assert backend.calls == ["stream"]


def test_base_backend_stream_wait_defaults_to_a_full_wait() -> None:
    backend = _RecordingBackend()
    Backend.synchronize_stream(backend)
    assert backend.calls == ["device"]
