"""The CUDA backend on a real GPU (CuPy + Numba CUDA). Skipped with a reason without one.

Run on a GPU machine with ``python -m pytest tests/gpu -m cuda``. Nothing here touches CUDA
at import or collection (see ``conftest.py``): the GPU is looked for when a test starts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pydotcompute.backends import CUDABackend

pytestmark = [pytest.mark.cuda, pytest.mark.gpu]
NEEDS = "cupy"  # conftest.py skips every test here, with the reason, without a CuPy GPU


@pytest.fixture
def backend() -> CUDABackend:
    return CUDABackend()


@pytest.fixture(autouse=True)
def private_compiler(tmp_path: Path) -> Any:
    from pydotcompute.compilation import KernelCache, KernelCompiler
    from pydotcompute.compilation import compiler as compiler_mod

    saved = compiler_mod._compiler
    compiler_mod._compiler = KernelCompiler(cache=KernelCache(tmp_path))
    yield compiler_mod._compiler
    compiler_mod._compiler = saved


def test_accelerator_sees_the_gpu() -> None:
    from pydotcompute.core import Accelerator, DeviceType

    Accelerator._reset_for_tests()
    acc = Accelerator()
    assert acc.cuda_available
    assert not acc.cuda_simulated
    dev = acc.get_device(0)
    assert dev.device_type is DeviceType.CUDA
    assert dev.compute_capability >= (3, 5)
    assert dev.total_memory > 0
    free, total = acc.get_memory_info()
    assert 0 < free <= total


def test_cupy_arrays_and_copies(backend: CUDABackend) -> None:
    import cupy

    d = backend.allocate((4, 4), np.float32)
    assert isinstance(d, cupy.ndarray)
    host = np.arange(16, dtype=np.float32).reshape(4, 4)
    backend.copy_to_device(host, out=d)
    np.testing.assert_array_equal(backend.copy_to_host(d), host)


def test_numba_and_raw_kernels(backend: CUDABackend, private_compiler: Any) -> None:
    n = 1 << 16
    a = backend.copy_to_device(np.random.default_rng(0).random(n).astype(np.float32))
    out = backend.vector_add(a, a)
    np.testing.assert_allclose(backend.copy_to_host(out), 2 * backend.copy_to_host(a))
    raw = backend.get_raw_vector_add_kernel()
    assert raw.ptx is not None
    assert private_compiler.get_stats().nvrtc_compilations == 1
    out2 = backend.empty(n, np.float32)
    res = backend.execute_kernel(raw, (n + 255) // 256, 256, a, a, out2, np.int32(n))
    assert res.execution_time_ms > 0
    np.testing.assert_allclose(backend.copy_to_host(out2), backend.copy_to_host(out))


def test_tiled_matmul_matches_cublas(backend: CUDABackend) -> None:
    import cupy

    rng = np.random.default_rng(1)
    a = cupy.asarray(rng.random((130, 70)).astype(np.float32))
    b = cupy.asarray(rng.random((70, 90)).astype(np.float32))
    np.testing.assert_allclose(
        backend.copy_to_host(backend.matmul(a, b)), cupy.asnumpy(a @ b), rtol=1e-4
    )


def test_streams_and_pinned_buffers(backend: CUDABackend) -> None:
    from pydotcompute.core import UnifiedBuffer

    buf = UnifiedBuffer((1 << 20,), np.float32, pinned=True, backend=backend).allocate()
    assert buf.pinned
    buf[:] = 1
    stream = backend.create_stream()
    out = backend.vector_add(buf.device, buf.device, stream=stream)
    stream.synchronize()
    assert float(out.sum()) == 2 * (1 << 20)


def test_unified_buffer_async_round_trip(backend: CUDABackend) -> None:
    import cupy

    from pydotcompute.core import BufferState, UnifiedBuffer

    async def run() -> None:
        buf = UnifiedBuffer((1 << 21,), np.float32, backend=backend).allocate()
        buf[:] = 3
        dev = await buf.ensure_on_device()
        assert isinstance(dev, cupy.ndarray)
        dev *= 2
        buf.mark_device_dirty()
        host = await buf.ensure_on_host()
        assert buf.state is BufferState.SYNCHRONIZED
        assert float(host[0]) == 6.0
        s = buf.transfer_stats
        assert (s.host_to_device, s.device_to_host) == (1, 1)

    asyncio.run(run())


def test_memory_pool_reports_cupy_usage(backend: CUDABackend) -> None:
    from pydotcompute.core import MemoryPool

    pool = MemoryPool(backend=backend)
    a = pool.acquire((1 << 20,), np.float32, location="device")
    stats = pool.get_stats()
    assert stats.cupy_used_bytes >= a.nbytes
    pool.release(a)
    pinned = pool.acquire(1024, np.float32, location="pinned")
    pool.release(pinned)
    assert pool.get_pinned_stats()["bytes_cached"] > 0
    assert pool.free_all_blocks() > 0


def test_orchestrator_on_gpu(backend: CUDABackend) -> None:
    from pydotcompute.core import ComputeOrchestrator, KernelLaunchConfig

    async def run() -> None:
        async with ComputeOrchestrator(backend) as orch:
            n = 4096
            a = backend.copy_to_device(np.ones(n, np.float32))
            out = backend.empty(n, np.float32)
            with orch.stream_context():
                e = await orch.launch_kernel(
                    backend.get_vector_add_kernel(), KernelLaunchConfig(n // 256, 256), a, a, out
                )
            assert e.success
            assert float(out.sum()) == 2 * n

    asyncio.run(run())
