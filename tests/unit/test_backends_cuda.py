"""CUDABackend outside a GPU: probing, clear errors, and CUDA C compilation without a device.

The backend's device logic runs under the Numba CUDA simulator in tests/cudasim and on
hardware in tests/gpu.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pydotcompute.backends import BackendType, CUDABackend
from pydotcompute.backends.cuda import cuda_simulator_enabled
from pydotcompute.exceptions import BackendNotAvailableError, InvalidConfigurationError

HAS_GPU = CUDABackend().is_available and not CUDABackend().is_simulated
needs_no_gpu = pytest.mark.skipif(HAS_GPU, reason="checks behaviour without a CUDA GPU")


def test_simulator_flag_follows_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    if "numba" in sys.modules:
        assert cuda_simulator_enabled() == bool(sys.modules["numba"].config.ENABLE_CUDASIM)
    else:
        monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
        assert cuda_simulator_enabled()
        monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
        assert not cuda_simulator_enabled()


@needs_no_gpu
def test_unavailable_without_gpu_with_reason() -> None:
    backend = CUDABackend()
    assert backend.backend_type is BackendType.CUDA
    assert not backend.is_available
    assert backend.mode is None
    assert backend.device_count == 0
    assert backend.unavailable_reason


@needs_no_gpu
@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.allocate(4),
        lambda b: b.empty(4),
        lambda b: b.copy_to_device(np.zeros(4)),
        lambda b: b.copy_to_host(np.zeros(4)),
        lambda b: b.synchronize(),
        lambda b: b.create_stream(),
        lambda b: b.get_vector_add_kernel(),
        lambda b: b.execute_kernel(print, 1, 1),
        lambda b: b.pinned_empty(4),
        lambda b: b.get_memory_info(),
    ],
)
def test_every_operation_names_the_extra(call: object) -> None:
    with pytest.raises(
        BackendNotAvailableError,
        match=r"the cuda backend is not available \(.*\); "
        r'install it with pip install "pydotcompute\[cuda\]"',
    ):
        call(CUDABackend())  # type: ignore[operator]


def test_construction_never_raises_without_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "numba", None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "numba.cuda", None)  # type: ignore[arg-type]
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    backend = CUDABackend()
    assert not backend.is_available
    assert "CuPy is not installed" in (backend.unavailable_reason or "")
    assert not backend.is_device_array(np.zeros(1))


def test_bad_device_id() -> None:
    with pytest.raises(InvalidConfigurationError, match="device_id must be a non-negative int"):
        CUDABackend(device_id=-2)
    far = CUDABackend(device_id=4096)
    assert not far.is_available


@needs_no_gpu
def test_raw_kernel_needs_cupy_and_a_gpu() -> None:
    with pytest.raises(BackendNotAvailableError, match=r"pydotcompute\[cuda\]"):
        CUDABackend().get_raw_vector_add_kernel()


# --- the helpers code written for 0.2 imports ------------------------------------------


@needs_no_gpu
@pytest.mark.parametrize("name", ["get_vector_add_kernel", "get_matrix_multiply_kernel"])
def test_module_level_kernel_helpers_name_the_extra(name: str) -> None:
    from pydotcompute.backends import cuda

    helper = getattr(cuda, name)
    if CUDABackend().is_available:  # the simulator: the shipped kernel comes back
        assert callable(helper())
        return
    with pytest.raises(BackendNotAvailableError, match=r'pip install "pydotcompute\[cuda\]"'):
        helper()
