"""UnifiedBuffer, MemoryPool, the orchestrator and @gpu_kernel with simulated device memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pydotcompute.backends import CUDABackend
from pydotcompute.core import (
    BufferState,
    ComputeOrchestrator,
    KernelLaunchConfig,
    MemoryPool,
    UnifiedBuffer,
)
from pydotcompute.decorators.kernel import gpu_kernel, kernel
from pydotcompute.exceptions import BufferMismatchError, BufferSyncError

cuda = pytest.importorskip("numba.cuda")  # a module global, as the simulator requires


@gpu_kernel
def negate(x: Any) -> None:
    i = cuda.grid(1)
    if i < x.size:
        x[i] = -x[i]


@kernel
def inc(x: Any) -> None:
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


def transfers(buf: UnifiedBuffer) -> tuple[int, int]:
    s = buf.transfer_stats
    return s.host_to_device, s.device_to_host


async def test_seed_workflow_on_the_simulated_gpu() -> None:
    buf = UnifiedBuffer((1000,), dtype=np.float32)  # the accelerator picks CUDA
    buf.allocate()
    assert buf.backend.backend_type.value == "cuda"
    buf.host[:] = np.arange(1000, dtype=np.float32)
    buf.mark_host_dirty()
    dev = await buf.ensure_on_device()
    assert CUDABackend().is_device_array(dev)
    assert buf.state is BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(dev.copy_to_host(), np.arange(1000))
    assert transfers(buf) == (1, 0)


async def test_kernel_writes_device_then_host_reads_once() -> None:
    backend = CUDABackend()
    buf = UnifiedBuffer((256,), np.float32).allocate()
    buf[:] = 1
    out = UnifiedBuffer((256,), np.float32).allocate(host=False)
    backend.vector_add(buf.device, buf.device, out.device)
    out.mark_device_dirty()
    assert out.state is BufferState.DEVICE_ONLY
    host = await out.ensure_on_host()
    np.testing.assert_array_equal(host, 2)
    _ = out.host
    assert transfers(out) == (0, 1)
    assert transfers(buf) == (1, 0)


def test_conflicts_and_copies_with_device_arrays() -> None:
    backend = CUDABackend()
    buf = UnifiedBuffer((4,), np.float32, strict_sync=True).allocate()
    stale = buf.device
    buf[0] = 1
    with pytest.raises(BufferSyncError, match="host side is dirty"):
        buf.mark_device_dirty()
    lax = UnifiedBuffer((4,), np.float32).allocate()  # the 0.2 default: warn, last mark wins
    lax[0] = 1
    with pytest.warns(RuntimeWarning, match="the last mark wins"):
        lax.mark_device_dirty()
    assert lax.state is BufferState.DEVICE_DIRTY
    buf.synchronize()
    src = backend.copy_to_device(np.full(4, 7, np.float32))
    buf.copy_from(src)  # device to device, no host round trip
    assert buf.state is BufferState.DEVICE_DIRTY
    before = transfers(buf)
    dst = backend.empty(4, np.float32)
    buf.copy_to(dst)
    assert transfers(buf) == before
    np.testing.assert_array_equal(backend.copy_to_host(dst), 7)
    with pytest.raises(BufferMismatchError, match=r"float64 \(4,\) \(source\) into float32 \(4,\)"):
        buf.copy_from(backend.copy_to_device(np.zeros(4)))
    assert stale is buf.device


def test_pinned_host_side_and_fill() -> None:
    buf = UnifiedBuffer((8,), np.float32, pinned=True).allocate()
    assert buf.pinned
    buf.fill(3)
    assert buf.state is BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.device.copy_to_host(), 3)
    assert transfers(buf) == (0, 0)


def test_pool_device_blocks_are_reused() -> None:
    pool = MemoryPool.create()
    a = pool.acquire((10,), np.float32, location="device")
    assert CUDABackend().is_device_array(a)
    pool.release(a)
    b = pool.acquire((12,), np.float32, location="device")
    s = pool.get_stats()
    assert (s.hits, s.misses) == (1, 1)
    assert s.bytes_by_location["device"] == 512
    pool.release(b)
    buf = UnifiedBuffer((64,), np.float32, pool=pool).allocate()
    buf[:] = 2
    np.testing.assert_array_equal(buf.device.copy_to_host(), 2)
    buf.free()
    assert pool.get_stats().blocks_in_use == 0


async def test_orchestrator_on_cuda_with_streams() -> None:
    backend = CUDABackend()
    async with ComputeOrchestrator() as orch:
        assert orch.backend.name == "cuda:0"
        orch.register_kernel("vector_add", backend.get_vector_add_kernel())
        a = backend.copy_to_device(np.arange(64, dtype=np.float32))
        out = backend.empty(64, np.float32)
        with orch.stream_context() as stream:
            assert stream is not None
            e = await orch.launch_kernel("vector_add", KernelLaunchConfig(2, 32), a, a, out)
        assert e.success
        assert e.result is not None
        assert e.result.execution_time_ms > 0
        np.testing.assert_array_equal(backend.copy_to_host(out), 2 * np.arange(64))
        orch.synchronize()


def test_gpu_kernel_decorator_launches() -> None:
    assert negate.is_available
    backend = CUDABackend()
    d = backend.copy_to_device(np.arange(4, dtype=np.float32))
    negate[1, 4](d)
    result = negate.launch(1, 4, d)
    np.testing.assert_array_equal(backend.copy_to_host(d), [0, 1, 2, 3])
    assert result.kernel_name == "negate"


def test_kernel_decorator_launch_config_uses_cuda() -> None:
    backend = CUDABackend()
    d = backend.copy_to_device(np.zeros(3, np.float32))
    inc[1, 4](d)
    np.testing.assert_array_equal(backend.copy_to_host(d), [1, 1, 1])
