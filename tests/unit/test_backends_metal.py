"""MetalBackend through MLX: runs on Linux with mlx[cpu]; Metal-only parts skip with a reason."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pydotcompute.backends import BackendType, MetalBackend
from pydotcompute.backends.metal import ELEMENTWISE_OPS, elementwise_is_unary, mlx_dtype
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    BufferMismatchError,
    InvalidConfigurationError,
    MetalError,
)

mx = pytest.importorskip(
    "mlx.core", reason="MLX is not installed (pip install 'pydotcompute[metal]')"
)

NO_METAL_GPU = not MetalBackend().uses_metal_gpu


@pytest.fixture
def backend() -> MetalBackend:
    return MetalBackend()


def test_available_with_mlx(backend: MetalBackend) -> None:
    assert backend.is_available
    assert backend.device_count == 1
    assert backend.backend_type is BackendType.METAL
    assert backend.device_description in ("Metal GPU", f"MLX {mx.default_device()}")


def test_seed_usage_copy_to_device(backend: MetalBackend) -> None:
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    dev = backend.copy_to_device(host)
    assert isinstance(dev, mx.array)
    assert backend.is_device_array(dev)
    assert not backend.is_device_array(host)
    np.testing.assert_array_equal(backend.copy_to_host(dev), host)
    out = np.empty((2, 3), np.float32)
    assert backend.copy_to_host(dev, out=out) is out
    np.testing.assert_array_equal(out, host)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.uint8, np.bool_])
def test_dtypes_round_trip(backend: MetalBackend, dtype: type) -> None:
    host = (np.arange(5) % 2).astype(dtype)
    dev = backend.copy_to_device(host)
    back = backend.copy_to_host(dev)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, host)


@pytest.mark.skipif(not NO_METAL_GPU, reason="float64 exists only on MLX's CPU device")
def test_float64_kept_on_cpu_device(backend: MetalBackend) -> None:
    host = np.array([1 / 3], dtype=np.float64)
    assert backend.copy_to_host(backend.copy_to_device(host))[0] == host[0]


def test_unsupported_dtype_is_named() -> None:
    with pytest.raises(BufferMismatchError, match="MLX has no dtype matching NumPy complex256"):
        mlx_dtype(np.complex256)


def test_copy_out_mismatch(backend: MetalBackend) -> None:
    with pytest.raises(BufferMismatchError, match=r"float32 \(3,\) \(source\) into float32 \(4,\)"):
        backend.copy_to_device(np.zeros(3, np.float32), out=backend.allocate(4))


def test_allocate_fill_synchronize(backend: MetalBackend) -> None:
    a = backend.allocate((2, 2), np.int32)
    assert a.dtype == mx.int32
    filled = backend.fill(a, 7)
    np.testing.assert_array_equal(np.array(filled), np.full((2, 2), 7))
    backend.synchronize()
    assert backend.create_stream() is not None


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "int32", "uint8", "bool_"])
def test_allocate_takes_mlx_dtypes(backend: MetalBackend, name: str) -> None:
    dtype = getattr(mx, name)
    a = backend.allocate((2, 3), dtype)
    assert a.dtype == dtype
    assert a.shape == (2, 3)
    assert backend.empty(4, dtype).dtype == dtype
    assert mlx_dtype(dtype) == dtype


def test_allocate_dtype_errors_name_what_arrived(backend: MetalBackend) -> None:
    with pytest.raises(BufferMismatchError, match=r"not a NumPy or MLX dtype: 'floaty'"):
        backend.allocate(3, "floaty")
    with pytest.raises(BufferMismatchError, match=r"not a NumPy or MLX dtype: <object object"):
        backend.allocate(3, object())  # type: ignore[arg-type]


@pytest.mark.skipif(NO_METAL_GPU, reason="float64 exists on MLX's CPU device")
def test_mlx_float64_refused_on_metal(backend: MetalBackend) -> None:  # pragma: no cover
    with pytest.raises(BufferMismatchError, match="MLX on a Metal GPU has no float64"):
        backend.allocate(3, mx.float64)


def test_compile_kernel_seed_lambda(backend: MetalBackend) -> None:
    k = backend.compile_kernel(lambda x: x * 2 + 1)
    out = k(mx.array(np.arange(4, dtype=np.float32)))
    np.testing.assert_array_equal(np.array(out), [1, 3, 5, 7])


def test_vector_add_and_matmul(backend: MetalBackend) -> None:
    a = np.arange(4, dtype=np.float32)
    res = backend.execute_kernel(backend.get_vector_add_kernel(), 1, 4, a, a)
    np.testing.assert_array_equal(np.array(res.output), 2 * a)
    assert res.backend is BackendType.METAL
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    res = backend.execute_kernel(backend.get_matrix_multiply_kernel(), 1, 1, m, m.T.copy())
    np.testing.assert_allclose(np.array(res.output), m @ m.T)


@pytest.mark.parametrize("op", ELEMENTWISE_OPS)
def test_every_elementwise_op(backend: MetalBackend, op: str) -> None:
    a = np.array([0.5, 1.0, 2.0], dtype=np.float32)
    b = np.array([2.0, 0.5, 1.0], dtype=np.float32)
    k = backend.get_elementwise_kernel(op)
    args = (mx.array(a),) if elementwise_is_unary(op) else (mx.array(a), mx.array(b))
    got = np.array(k(*args))
    reference = {
        "add": a + b,
        "subtract": a - b,
        "multiply": a * b,
        "divide": a / b,
        "maximum": np.maximum(a, b),
        "minimum": np.minimum(a, b),
        "power": a**b,
        "exp": np.exp(a),
        "log": np.log(a),
        "sqrt": np.sqrt(a),
        "abs": np.abs(a),
        "negative": -a,
        "square": a * a,
        "sin": np.sin(a),
        "cos": np.cos(a),
        "tanh": np.tanh(a),
        "sigmoid": 1 / (1 + np.exp(-a)),
        "relu": np.maximum(a, 0),
    }[op]
    np.testing.assert_allclose(got, reference, rtol=1e-5)


def test_unknown_elementwise_op(backend: MetalBackend) -> None:
    with pytest.raises(InvalidConfigurationError, match="unknown elementwise op 'cube'"):
        backend.get_elementwise_kernel("cube")


def test_failing_kernel_is_a_metal_error(backend: MetalBackend) -> None:
    def bad(x: object) -> object:
        return x.no_such_method()  # type: ignore[attr-defined]

    with pytest.raises(MetalError, match="MLX kernel 'bad' failed: AttributeError"):
        backend.execute_kernel(bad, 1, 1, np.zeros(2, np.float32), on_error="raise")
    result = backend.execute_kernel(bad, 1, 1, np.zeros(2, np.float32))
    assert result.success is False
    assert isinstance(result.error, MetalError)


@pytest.mark.skipif(NO_METAL_GPU, reason="needs a Metal GPU; MLX here is the CPU build")
@pytest.mark.metal
def test_custom_metal_kernel_on_metal(backend: MetalBackend) -> None:  # pragma: no cover
    k = backend.compile_metal_kernel(
        "double_it", "uint i = thread_position_in_grid.x; out[i] = 2 * inp[i];", ["inp"], ["out"]
    )
    assert k is not None


@pytest.mark.skipif(not NO_METAL_GPU, reason="checks the message shown without a Metal GPU")
def test_custom_metal_kernel_needs_metal(backend: MetalBackend) -> None:
    with pytest.raises(BackendNotAvailableError, match="needs a Metal GPU"):
        backend.compile_metal_kernel("k", "", ["a"], ["b"])


def test_missing_mlx_never_raises_on_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlx", None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "mlx.core", None)  # type: ignore[arg-type]
    backend = MetalBackend()
    assert not backend.is_available
    assert backend.device_count == 0
    assert not backend.uses_metal_gpu
    with pytest.raises(BackendNotAvailableError, match=r'pip install "pydotcompute\[metal\]"'):
        backend.copy_to_device(np.zeros(2))


def test_stream_works_in_other_threads(backend: MetalBackend) -> None:
    from concurrent.futures import ThreadPoolExecutor

    stream = backend.create_stream()  # made here, used by worker threads

    def launch(k: int) -> list[int]:
        result = backend.execute_kernel(lambda a: a * k, 1, 3, mx.arange(3), stream=stream)
        return result.output.tolist()  # type: ignore[no-any-return]

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert list(pool.map(launch, [1, 2, 3])) == [[0, 1, 2], [0, 2, 4], [0, 3, 6]]
    backend.synchronize()


@pytest.mark.skipif(
    not hasattr(mx, "new_thread_local_stream"), reason="this MLX has no thread-bound streams"
)
def test_thread_bound_stream_in_another_thread_is_explained(backend: MetalBackend) -> None:
    import threading

    bound = mx.new_stream(mx.default_device())  # only usable in this thread
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            backend.execute_kernel(
                lambda a: a + 1, 1, 1, mx.arange(3), stream=bound, on_error="raise"
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join(timeout=30)
    [error] = errors
    assert isinstance(error, MetalError)
    assert "use MetalBackend.create_stream()" in str(error)
    assert "made by mx.new_stream() in another thread" in str(error)


def test_scheduled_lazy_inputs_can_be_used_in_a_worker_thread(backend: MetalBackend) -> None:
    import threading

    lazy = {"x": mx.arange(4) * 2}  # unevaluated, recorded on this thread's stream
    backend.schedule_inputs([lazy, 3, "not an array"])
    results: list[object] = []

    def launch() -> None:
        try:
            out = backend.execute_kernel(lambda d: d["x"] + 1, 1, 4, lazy).output
            results.append(out.tolist())
        except BaseException as exc:
            results.append(exc)

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join(timeout=30)
    assert results == [[1, 3, 5, 7]]


# --- the helpers code written for 0.2 imports ------------------------------------------


def test_module_level_helpers_the_seed_example_imports() -> None:
    from pydotcompute.backends.metal import (
        MetalBackend,
        get_elementwise_kernel,
        get_matrix_multiply_kernel,
        get_vector_add_kernel,
    )

    backend = MetalBackend()
    a = mx.array([1.0, 2.0, 3.0])
    res = backend.execute_kernel(get_vector_add_kernel(), 1, 3, a, a)
    assert np.asarray(res.output).tolist() == [2.0, 4.0, 6.0]
    m = mx.array([[1.0, 2.0], [3.0, 4.0]])
    assert np.asarray(get_matrix_multiply_kernel()(m, m)).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    assert np.asarray(get_elementwise_kernel("relu")(mx.array([-1.0, 2.0]))).tolist() == [0, 2]
    with pytest.raises(InvalidConfigurationError, match="unknown elementwise op 'nope'"):
        get_elementwise_kernel("nope")


def test_memory_info_and_clear_cache(backend: MetalBackend) -> None:
    big = mx.ones((256, 1024))
    mx.eval(big)
    info = backend.get_memory_info()
    assert set(info) == {"active_memory", "peak_memory", "cache_memory"}
    assert info["active_memory"] >= 256 * 1024 * 4  # the array above is live
    assert info["peak_memory"] >= info["active_memory"]
    del big
    backend.clear_cache()
    assert backend.get_memory_info()["cache_memory"] == 0


def test_memory_helpers_without_mlx_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlx", None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "mlx.core", None)  # type: ignore[arg-type]
    backend = MetalBackend()
    for call in (backend.get_memory_info, backend.clear_cache):
        with pytest.raises(BackendNotAvailableError, match="metal"):
            call()
