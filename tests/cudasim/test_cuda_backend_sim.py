"""The CUDA backend's logic on the Numba CUDA simulator: memory, copies, streams, launches,
compilation, the shipped kernels, and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pydotcompute.backends import BackendType, CUDABackend, get_backend
from pydotcompute.core import DeviceType, get_accelerator
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    BufferMismatchError,
    CUDAError,
    KernelCompilationError,
)

# Kernels refer to ``cuda`` as a module global: the simulator swaps module globals that are
# ``numba.cuda`` for its per-thread emulation (it cannot see a local import or a closure).
cuda = pytest.importorskip("numba.cuda")
float32 = pytest.importorskip("numba").float32


def square(x: Any) -> None:
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * x[i]


def out_of_bounds(x: Any) -> None:
    i = cuda.grid(1)
    x[i + 100] = 1.0


def reverse_in_block(x: Any) -> None:
    # dynamic shared memory: its size comes from the launch (shared_mem bytes)
    tmp = cuda.shared.array(0, dtype=float32)
    i = cuda.threadIdx.x
    tmp[i] = x[i]
    cuda.syncthreads()
    x[i] = tmp[cuda.blockDim.x - 1 - i]


@pytest.fixture
def backend() -> CUDABackend:
    b = CUDABackend()
    assert b.is_available, b.unavailable_reason
    return b


def test_simulator_mode(backend: CUDABackend) -> None:
    assert backend.mode == "simulator"
    assert backend.is_simulated
    assert backend.device_count == 1
    assert backend.backend_type is BackendType.CUDA
    assert backend.get_memory_info() == (0, 0)


def test_accelerator_reports_a_simulated_cuda_device() -> None:
    acc = get_accelerator()
    assert acc.cuda_available
    assert acc.cuda_simulated
    assert acc.backend_type is DeviceType.CUDA
    dev = acc.current_device
    assert dev.is_simulated
    assert dev.name == "Numba CUDA simulator"
    assert dev.warp_size == 32
    assert isinstance(get_backend(), CUDABackend)
    acc.synchronize()


def test_allocate_copy_round_trip(backend: CUDABackend) -> None:
    d = backend.allocate((3, 2), np.int32)
    assert backend.is_device_array(d)
    assert not backend.is_device_array(np.zeros(1))
    np.testing.assert_array_equal(backend.copy_to_host(d), np.zeros((3, 2)))
    host = np.arange(6, dtype=np.int32).reshape(3, 2)
    assert backend.copy_to_device(host, out=d) is d
    out = np.empty((3, 2), np.int32)
    assert backend.copy_to_host(d, out=out) is out
    np.testing.assert_array_equal(out, host)
    e = backend.empty(4, np.float64)
    backend.fill(e, 1.5)
    np.testing.assert_array_equal(backend.to_numpy(e), [1.5] * 4)
    f = backend.empty(4, np.float64)
    backend.copy_device_to_device(e, f)
    np.testing.assert_array_equal(backend.copy_to_host(f), [1.5] * 4)
    assert isinstance(backend.pinned_empty(3, np.float32), np.ndarray)


def test_copy_mismatch_names_both_sides(backend: CUDABackend) -> None:
    d = backend.allocate(4, np.float32)
    with pytest.raises(BufferMismatchError, match=r"float64 \(4,\) \(source\) into float32 \(4,\)"):
        backend.copy_to_device(np.zeros(4), out=d)
    with pytest.raises(BufferMismatchError, match=r"float32 \(4,\) \(source\) into float32 \(5,\)"):
        backend.copy_to_host(d, out=np.empty(5, np.float32))


def test_streams(backend: CUDABackend) -> None:
    stream = backend.create_stream()
    host = np.arange(8, dtype=np.float32)
    d = backend.copy_to_device(host, stream=stream)
    out = backend.vector_add(d, d, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(backend.copy_to_host(out, stream=stream), 2 * host)
    backend.synchronize()


def test_shipped_vector_add(backend: CUDABackend) -> None:
    n = 1000  # several blocks, with a partial last block
    a = np.random.default_rng(1).random(n).astype(np.float32)
    b = np.random.default_rng(2).random(n).astype(np.float32)
    out = backend.vector_add(backend.copy_to_device(a), backend.copy_to_device(b))
    np.testing.assert_allclose(backend.copy_to_host(out), a + b)


def test_shipped_tiled_matmul(backend: CUDABackend) -> None:
    rng = np.random.default_rng(3)
    a = rng.random((20, 17)).astype(np.float32)  # not multiples of the 16 x 16 tile
    b = rng.random((17, 18)).astype(np.float32)
    c = backend.matmul(backend.copy_to_device(a), backend.copy_to_device(b))
    np.testing.assert_allclose(backend.copy_to_host(c), a @ b, rtol=1e-5)
    with pytest.raises(BufferMismatchError, match=r"cannot multiply \(20, 17\) by \(20, 17\)"):
        backend.matmul(backend.copy_to_device(a), backend.copy_to_device(a))


def test_execute_kernel_result(backend: CUDABackend) -> None:
    d = backend.copy_to_device(np.ones(64, np.float32))
    out = backend.empty(64, np.float32)
    result = backend.execute_kernel(backend.get_vector_add_kernel(), 2, 32, d, d, out)
    assert result.backend is BackendType.CUDA
    assert (result.grid_size, result.block_size) == ((2,), (32,))
    assert result.kernel_name == "vector_add"
    assert result.execution_time_ms > 0
    np.testing.assert_array_equal(backend.copy_to_host(out), 2)


def test_compile_kernel_from_python(backend: CUDABackend) -> None:
    k = backend.compile_kernel(square)
    assert backend.compile_kernel(square) is k
    d = backend.copy_to_device(np.arange(5, dtype=np.float32))
    backend.execute_kernel(k, 1, 8, d)
    np.testing.assert_array_equal(backend.copy_to_host(d), [0, 1, 4, 9, 16])
    k[1, 8](d)  # CompiledKernel forwards launch configurations
    np.testing.assert_array_equal(backend.copy_to_host(d), [0, 1, 16, 81, 256])


def test_dynamic_shared_memory_through_the_orchestrator(backend: CUDABackend) -> None:
    import asyncio

    from pydotcompute.core import ComputeOrchestrator, KernelLaunchConfig

    d = backend.copy_to_device(np.arange(8, dtype=np.float32))

    async def run() -> None:
        async with ComputeOrchestrator(backend) as orch:
            cfg = KernelLaunchConfig(grid_size=1, block_size=8, shared_memory_bytes=8 * 4)
            await orch.launch_kernel(backend.compile_kernel(reverse_in_block), cfg, d)

    asyncio.run(run())
    np.testing.assert_array_equal(backend.copy_to_host(d), np.arange(8)[::-1])


def test_kernel_fault_is_a_cuda_error(backend: CUDABackend) -> None:
    d = backend.allocate(4)
    with pytest.raises(
        CUDAError, match=r"CUDA run kernel 'out_of_bounds' failed on cuda:0: IndexError"
    ):
        backend.execute_kernel(backend.compile_kernel(out_of_bounds), 1, 1, d, on_error="raise")
    result = backend.execute_kernel(backend.compile_kernel(out_of_bounds), 1, 1, d)
    assert result.success is False
    assert isinstance(result.error, CUDAError)


def test_bad_launch_sizes(backend: CUDABackend) -> None:
    from pydotcompute.exceptions import InvalidConfigurationError

    with pytest.raises(InvalidConfigurationError, match="grid_size must be a positive int"):
        backend.execute_kernel(backend.get_vector_add_kernel(), 0, 32)


def test_cuda_c_needs_cupy_mode(backend: CUDABackend) -> None:
    with pytest.raises(
        BackendNotAvailableError, match=r"needs CuPy with a CUDA GPU.*'simulator' mode"
    ):
        backend.get_raw_vector_add_kernel()


def test_compile_to_ptx_is_refused_in_the_simulator(backend: CUDABackend) -> None:
    from pydotcompute.compilation import cuda_ptx_check

    with pytest.raises(
        BackendNotAvailableError, match="PTX cannot be produced while the Numba CUDA"
    ):
        cuda_ptx_check()


def test_typing_error_in_cuda_kernel_is_a_compilation_error(backend: CUDABackend) -> None:
    # the simulator runs Python directly, so a NameError surfaces at run time as a CUDAError
    def uses_missing(x: Any) -> None:
        x[0] = missing_global  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises((KernelCompilationError, CUDAError), match="missing_global"):
        backend.execute_kernel(
            backend.compile_kernel(uses_missing), 1, 1, backend.allocate(1), on_error="raise"
        )


def test_module_level_kernel_helpers_launch(backend: CUDABackend) -> None:
    from pydotcompute.backends.cuda import get_matrix_multiply_kernel, get_vector_add_kernel

    d = backend.copy_to_device(np.arange(32, dtype=np.float32))
    out = backend.empty(32, np.float32)
    backend.execute_kernel(get_vector_add_kernel(), 1, 32, d, d, out)
    np.testing.assert_array_equal(backend.copy_to_host(out), 2 * np.arange(32))
    a = np.eye(16, dtype=np.float32) * 3
    c = backend.empty((16, 16), np.float32)
    backend.execute_kernel(
        get_matrix_multiply_kernel(),
        (1, 1),
        (16, 16),
        backend.copy_to_device(a),
        backend.copy_to_device(a),
        c,
    )
    np.testing.assert_allclose(backend.copy_to_host(c), a @ a)


def test_compiled_cuda_c_loads_through_the_cuda_backend(backend: CUDABackend) -> None:
    from pydotcompute.backends._cuda_kernels import VECTOR_ADD_CU, VECTOR_ADD_CU_NAME
    from pydotcompute.compilation import KernelCompiler

    try:
        compiled = KernelCompiler(cache=False).compile(
            VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda"
        )
    except BackendNotAvailableError as exc:
        pytest.skip(f"NVRTC is not usable here: {exc}")
    assert compiled.ptx  # NVRTC needs no GPU; loading the PTX does
    with pytest.raises(
        BackendNotAvailableError, match=r"needs CuPy with a CUDA GPU.*'simulator' mode"
    ):
        _ = compiled.kernel
