"""CPUBackend: NumPy memory with GPU-like copy semantics, kernels and Numba compilation."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pydotcompute.backends import BackendType, CPUBackend
from pydotcompute.compilation import KernelCache, KernelCompiler
from pydotcompute.compilation import compiler as compiler_mod
from pydotcompute.exceptions import BufferMismatchError, KernelCompilationError


@pytest.fixture
def backend() -> CPUBackend:
    return CPUBackend()


@pytest.fixture
def private_compiler(tmp_path: object) -> Iterator[KernelCompiler]:
    saved = compiler_mod._compiler
    compiler_mod._compiler = KernelCompiler(cache=KernelCache(str(tmp_path)))
    try:
        yield compiler_mod._compiler
    finally:
        compiler_mod._compiler = saved


def test_always_available(backend: CPUBackend) -> None:
    assert backend.is_available
    assert backend.unavailable_reason is None
    assert backend.device_count == 1
    assert backend.backend_type is BackendType.CPU
    assert backend.name == "cpu:0"
    backend.require()
    backend.synchronize()
    assert backend.create_stream() is None


def test_allocate_and_empty(backend: CPUBackend) -> None:
    a = backend.allocate((2, 3), np.int32)
    assert a.shape == (2, 3)
    assert a.dtype == np.int32
    assert not a.any()
    assert backend.empty(4).dtype == np.float32
    assert backend.is_device_array(a)


def test_copy_to_device_never_aliases(backend: CPUBackend) -> None:
    host = np.arange(5, dtype=np.float32)
    dev = backend.copy_to_device(host)
    assert not np.shares_memory(dev, host)
    host[0] = 99
    assert dev[0] == 0
    back = backend.copy_to_host(dev)
    assert not np.shares_memory(back, dev)
    np.testing.assert_array_equal(back, [0, 1, 2, 3, 4])


def test_copies_into_out_check_layout(backend: CPUBackend) -> None:
    out = np.empty(5, np.float32)
    assert backend.copy_to_device(np.ones(5, np.float32), out=out) is out
    assert out.sum() == 5
    with pytest.raises(BufferMismatchError, match=r"float64 \(5,\) \(source\) into float32"):
        backend.copy_to_device(np.ones(5), out=out)
    with pytest.raises(
        BufferMismatchError, match=r"copy to host float32 \(5,\) \(source\) into float32 \(6,\)"
    ):
        backend.copy_to_host(out, out=np.empty(6, np.float32))


def test_fill_and_device_to_device(backend: CPUBackend) -> None:
    a = backend.allocate(4)
    backend.fill(a, 2.5)
    b = backend.allocate(4)
    backend.copy_device_to_device(a, b)
    np.testing.assert_array_equal(b, [2.5] * 4)


def test_vector_add_and_matmul_helpers(backend: CPUBackend) -> None:
    a = np.arange(8, dtype=np.float32)
    out = np.empty_like(a)
    result = backend.execute_kernel(backend.get_vector_add_kernel(), 1, 8, a, a, out)
    np.testing.assert_array_equal(out, 2 * a)
    assert result.backend is BackendType.CPU
    assert result.grid_size == (1,)
    assert result.block_size == (8,)
    assert result.execution_time_ms >= 0
    assert result.kernel_name == "_vector_add"
    m = np.arange(6, dtype=np.float64).reshape(2, 3)
    prod = np.empty((2, 2))
    backend.execute_kernel(backend.get_matrix_multiply_kernel(), (1, 1), (2, 2), m, m.T, prod)
    np.testing.assert_allclose(prod, m @ m.T)


def test_execute_kernel_propagates_errors(backend: CPUBackend) -> None:
    def bad(x: np.ndarray) -> None:
        raise ZeroDivisionError("inside the kernel")

    with pytest.raises(ZeroDivisionError, match="inside the kernel"):
        backend.execute_kernel(bad, 1, 1, np.zeros(1), on_error="raise")
    result = backend.execute_kernel(bad, 1, 1, np.zeros(1))  # the 0.2 default: a result
    assert result.success is False
    assert isinstance(result.error, ZeroDivisionError)


def test_compile_kernel_with_numba_runs_and_is_cached(
    backend: CPUBackend, private_compiler: KernelCompiler
) -> None:
    def saxpy(a: float, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        for i in range(x.shape[0]):
            out[i] = a * x[i] + y[i]

    k1 = backend.compile_kernel(saxpy)
    k2 = backend.compile_kernel(saxpy)
    assert k1 is k2
    stats = private_compiler.get_stats()
    assert (stats.misses, stats.hits) == (1, 1)
    x = np.arange(4, dtype=np.float64)
    out = np.empty(4)
    backend.execute_kernel(k1, 1, 4, 2.0, x, x, out)
    np.testing.assert_array_equal(out, 3 * x)
    if backend.uses_numba:
        assert hasattr(k1.kernel, "py_func")  # a Numba dispatcher, not the plain function


@pytest.mark.skipif(not CPUBackend().uses_numba, reason="Numba is not installed")
def test_compile_error_carries_numba_message(
    backend: CPUBackend, private_compiler: KernelCompiler
) -> None:
    def broken(x: np.ndarray) -> None:
        x[0] = undefined_name  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(
        KernelCompilationError,
        match=r"(?s)Numba could not compile .broken. for signature.*undefined_name",
    ):
        backend.compile_kernel(broken, "void(float64[:])")
    lazy = backend.compile_kernel(broken)
    with pytest.raises(KernelCompilationError, match=r"kernel 'broken' for arguments \(ndarray\)"):
        lazy(np.zeros(2))


# --- the helpers code written for 0.2 imports ------------------------------------------


def test_vector_add_cpu_and_matrix_multiply_cpu() -> None:
    from pydotcompute.backends.cpu import matrix_multiply_cpu, vector_add_cpu

    a = np.arange(4, dtype=np.float32)
    out = vector_add_cpu(a, np.ones(4, dtype=np.float32))
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert out.dtype == np.float32
    assert vector_add_cpu([1, 2], [3, 4]).tolist() == [4, 6]  # lists are accepted
    m = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert matrix_multiply_cpu(m, np.eye(2)).tolist() == m.tolist()
    assert matrix_multiply_cpu(m, m).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    with pytest.raises(BufferMismatchError, match=r"cannot add shapes \(3,\) and \(4,\)"):
        vector_add_cpu(np.ones(3), np.ones(4))
    with pytest.raises(BufferMismatchError, match=r"cannot multiply \(2, 3\) by \(2, 3\)"):
        matrix_multiply_cpu(np.ones((2, 3)), np.ones((2, 3)))


def test_allocate_zeros_and_parallel_for() -> None:
    from pydotcompute.backends.cpu import parallel_for

    z = CPUBackend().allocate_zeros((2, 3), np.int32)
    assert (z.shape, z.dtype, int(z.sum())) == ((2, 3), np.int32, 0)
    seen: list[int] = []
    parallel_for(2, 6, seen.append)
    assert seen == [2, 3, 4, 5]
    parallel_for(5, 5, seen.append)  # an empty range runs nothing
    assert seen == [2, 3, 4, 5]
    with pytest.raises(TypeError, match="parallel_for needs a callable func"):
        parallel_for(0, 3, 42)  # type: ignore[arg-type]
