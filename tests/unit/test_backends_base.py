"""Backend helpers shared by every backend: types, launch sizes, copy checks, the registry."""

from __future__ import annotations

import numpy as np
import pytest

from pydotcompute.backends import (
    Backend,
    BackendType,
    CPUBackend,
    CUDABackend,
    MetalBackend,
    available_backends,
    get_backend,
)
from pydotcompute.backends.base import (
    as_shape,
    check_copy_compatible,
    describe_array,
    error_text,
    normalize_grid,
    numpy_dtype_of,
)
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    BufferMismatchError,
    InvalidConfigurationError,
)


def test_backend_type_parse() -> None:
    assert BackendType.parse("CUDA") is BackendType.CUDA
    assert BackendType.parse(BackendType.METAL) is BackendType.METAL
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'; expected one of 'cpu'"):
        BackendType.parse("tpu")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(4, (4,)), ((2, 3), (2, 3)), ([1, 2, 3], (1, 2, 3)), (np.int64(7), (7,))],
)
def test_normalize_grid_accepts(value: object, expected: tuple[int, ...]) -> None:
    assert normalize_grid(value, "grid_size") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, (1, 0), (1, 2, 3, 4), (), (1.5,), True])
def test_normalize_grid_rejects(value: object) -> None:
    with pytest.raises(InvalidConfigurationError, match=r"block_size must be a positive int"):
        normalize_grid(value, "block_size")  # type: ignore[arg-type]


def test_as_shape() -> None:
    assert as_shape(3) == (3,)
    assert as_shape((0, 2)) == (0, 2)
    with pytest.raises(InvalidConfigurationError, match="non-negative ints, got"):
        as_shape((2, -1))


def test_copy_check_names_both_sides() -> None:
    src = np.zeros(10, np.float64)
    dst = np.zeros(1000, np.float32)
    with pytest.raises(
        BufferMismatchError,
        match=r"cannot copy float64 \(10,\) \(source\) into float32 \(1000,\) \(destination\): "
        r"shapes and dtypes differ",
    ):
        check_copy_compatible(src, dst)
    with pytest.raises(BufferMismatchError, match=r"\): dtypes differ"):
        check_copy_compatible(np.zeros(3, np.int32), np.zeros(3, np.int64))
    assert isinstance(BufferMismatchError("x"), ValueError)
    check_copy_compatible(np.zeros(3), np.ones(3))


def test_numpy_dtype_of_and_describe() -> None:
    assert numpy_dtype_of(np.zeros(1, np.int16)) == np.int16
    assert numpy_dtype_of(object()) is None
    assert describe_array(np.zeros((2, 2), np.float32)) == "float32 (2, 2) numpy.ndarray"


def test_get_backend_is_shared_and_typed() -> None:
    assert get_backend("cpu") is get_backend(BackendType.CPU)
    assert isinstance(get_backend("cuda"), CUDABackend)
    assert isinstance(get_backend("metal"), MetalBackend)
    assert isinstance(get_backend(None), Backend)
    with pytest.raises(InvalidConfigurationError, match="unknown backend"):
        get_backend("opencl")


def test_accelerator_and_get_backend_share_one_instance() -> None:
    from pydotcompute.core import get_accelerator

    acc = get_accelerator()
    assert acc.get_backend() is get_backend(acc.backend_type.value, acc.current_device_id)
    assert acc.get_backend() is get_backend(None)


def test_only_the_cuda_backend_loads_ptx() -> None:
    with pytest.raises(
        BackendNotAvailableError, match=r"the cpu backend cannot load PTX \(kernel 'k'\)"
    ):
        get_backend("cpu").load_ptx("// not ptx", "k")


def test_available_backends_never_raises_and_lists_cpu() -> None:
    names = available_backends()
    assert names[0] == "cpu"
    assert set(names) <= {"cpu", "cuda", "metal"}


def test_invalid_device_id() -> None:
    with pytest.raises(InvalidConfigurationError, match="device_id must be a non-negative int"):
        CPUBackend(-1)


def test_cpu_backend_rejects_second_device() -> None:
    backend = CPUBackend(1)
    assert not backend.is_available
    with pytest.raises(BackendNotAvailableError, match="one device"):
        backend.allocate(3)


def test_a_probe_that_raises_is_reported_as_unavailable() -> None:
    class Broken(CPUBackend):
        def _probe(self) -> str | None:
            raise OSError("libfoo.so: cannot open shared object file")

    backend = Broken()
    assert not backend.is_available
    assert "OSError: libfoo.so" in (backend.unavailable_reason or "")
    assert repr(backend).startswith("Broken(available=False, device='cpu:0', reason='OSError")


def test_error_text_strips_colour_codes() -> None:
    assert error_text(ValueError("\x1b[1mbold\x1b[0m text ")) == "bold text"


def test_error_text_says_when_numba_itself_misses_a_numpy_name() -> None:
    # numba-cuda 0.30 registers np.row_stack, which NumPy 2.5 removed: every compile fails,
    # and the message must not read as a fault in the user's kernel
    text = error_text(AttributeError("module 'numpy' has no attribute 'row_stack'"))
    assert text.startswith("module 'numpy' has no attribute 'row_stack' (raised inside Numba")
    assert 'pip install "numpy<2.5"' in text
    assert error_text(AttributeError("'Foo' object has no attribute 'x'")) == (
        "'Foo' object has no attribute 'x'"
    )
