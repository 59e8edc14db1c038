"""Accelerator: device discovery, PYDOTCOMPUTE_BACKEND, and never raising on missing libraries."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from pydotcompute.backends import CPUBackend, CUDABackend, MetalBackend
from pydotcompute.core import (
    Accelerator,
    DeviceProperties,
    DeviceType,
    cuda_available,
    get_accelerator,
    metal_available,
)
from pydotcompute.exceptions import InvalidConfigurationError

HAS_GPU = CUDABackend().is_available and not CUDABackend().is_simulated
HAS_MLX = MetalBackend().is_available


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A clean singleton before and after the test (the environment is restored too)."""
    monkeypatch.delenv("PYDOTCOMPUTE_BACKEND", raising=False)
    Accelerator._reset_for_tests()
    yield monkeypatch
    monkeypatch.undo()
    Accelerator._reset_for_tests()


def test_singleton_and_helpers_agree(fresh: pytest.MonkeyPatch) -> None:
    acc = Accelerator()
    assert Accelerator() is acc
    assert get_accelerator() is acc
    assert cuda_available() is acc.cuda_available
    assert metal_available() is acc.metal_available


def test_cpu_device_is_always_listed(fresh: pytest.MonkeyPatch) -> None:
    acc = get_accelerator()
    cpu = acc.devices[-1]
    assert cpu.device_type is DeviceType.CPU
    assert cpu.is_available
    assert cpu.total_memory > 0
    assert cpu.multiprocessor_count >= 1
    assert cpu.compute_capability_str == "N/A"  # no compute capability off CUDA
    assert cpu.total_memory_gb == pytest.approx(cpu.total_memory / 2**30)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU fallback; a CUDA GPU is present")
def test_without_gpu_the_cpu_is_chosen_and_the_reason_recorded(fresh: pytest.MonkeyPatch) -> None:
    acc = get_accelerator()
    assert not acc.cuda_available
    assert not acc.metal_available or HAS_MLX
    assert acc.backend_type in (DeviceType.CPU, DeviceType.METAL)
    assert "cuda" in acc.unavailable_reasons
    assert acc.device_count == 1
    assert acc.current_device.device_type is acc.backend_type


def test_device_properties_are_frozen() -> None:
    props = DeviceProperties(
        device_id=0, device_type=DeviceType.CUDA, name="x", compute_capability=(9, 0)
    )
    assert props.compute_capability_str == "9.0"
    with pytest.raises(AttributeError):
        props.name = "y"  # type: ignore[misc]


def test_override_cpu(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("PYDOTCOMPUTE_BACKEND", "CPU")
    acc = get_accelerator()
    assert acc.backend_type is DeviceType.CPU
    assert acc.requested_backend == "cpu"
    assert isinstance(acc.get_backend(), CPUBackend)


@pytest.mark.skipif(HAS_GPU, reason="needs a machine without a CUDA GPU")
def test_override_cuda_without_gpu_warns_and_falls_back(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("PYDOTCOMPUTE_BACKEND", "cuda")
    acc = get_accelerator()
    with pytest.warns(RuntimeWarning, match="PYDOTCOMPUTE_BACKEND=cuda but CUDA is unavailable"):
        kind = acc.backend_type
    assert kind is DeviceType.CPU


@pytest.mark.skipif(not HAS_MLX, reason="MLX is not installed")
def test_override_metal_uses_mlx_even_without_a_metal_gpu(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("PYDOTCOMPUTE_BACKEND", "metal")
    acc = get_accelerator()
    assert acc.backend_type is DeviceType.METAL
    assert isinstance(acc.get_backend(), MetalBackend)
    if not MetalBackend().uses_metal_gpu:
        assert not acc.metal_available
        assert "no Metal GPU" in acc.current_device.name


def test_invalid_override_is_a_clear_error(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("PYDOTCOMPUTE_BACKEND", "tpu")
    with pytest.raises(InvalidConfigurationError, match=r"PYDOTCOMPUTE_BACKEND='tpu'.*auto, cpu"):
        _ = get_accelerator().backend_type
    # the module-level probes never raise
    assert cuda_available() is False


def test_get_device_out_of_range(fresh: pytest.MonkeyPatch) -> None:
    acc = get_accelerator()
    assert acc.get_device(0) == acc.current_device
    with pytest.raises(InvalidConfigurationError, match=r"valid ids are 0\.\."):
        acc.get_device(acc.device_count)
    with pytest.raises(InvalidConfigurationError):
        acc.set_device(-1)
    acc.set_device(0)
    assert acc.current_device_id == 0


def test_memory_info_and_synchronize(fresh: pytest.MonkeyPatch) -> None:
    acc = get_accelerator()
    free, total = acc.get_memory_info()
    assert 0 <= free <= total
    assert total > 0
    acc.synchronize()


def test_summary_is_plain_data(fresh: pytest.MonkeyPatch) -> None:
    summary = get_accelerator().summary()
    assert summary["backend"] in ("cpu", "cuda", "metal")
    assert summary["devices"][-1]["type"] == "cpu"
    assert isinstance(summary["unavailable"], dict)


def test_missing_libraries_never_raise(fresh: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes "import cupy" raise ImportError
    fresh.setitem(sys.modules, "cupy", None)  # type: ignore[arg-type]
    fresh.setitem(sys.modules, "mlx", None)  # type: ignore[arg-type]
    fresh.setitem(sys.modules, "mlx.core", None)  # type: ignore[arg-type]
    from pydotcompute.backends import _reset_backends

    _reset_backends()
    acc = get_accelerator()
    if not CUDABackend().is_available:
        assert acc.backend_type is DeviceType.CPU
        assert 'pip install "pydotcompute[cuda]"' in acc.unavailable_reasons["cuda"]
    assert 'pip install "pydotcompute[metal]"' in acc.unavailable_reasons["metal"]
    assert not MetalBackend().is_available
    _reset_backends()


def test_broken_driver_is_recorded_not_raised(fresh: pytest.MonkeyPatch) -> None:
    cupy = pytest.importorskip("cupy")

    def boom() -> int:
        raise RuntimeError("driver exploded")

    fresh.setattr(cupy.cuda.runtime, "getDeviceCount", boom)
    acc = get_accelerator()
    assert not acc.cuda_available
    assert "driver exploded" in acc.unavailable_reasons["cuda"]


def test_refresh_probes_again(fresh: pytest.MonkeyPatch) -> None:
    acc = get_accelerator()
    fresh.setenv("PYDOTCOMPUTE_BACKEND", "cpu")
    acc.refresh()
    assert acc.backend_type is DeviceType.CPU
    assert acc.requested_backend == "cpu"


def test_importing_the_device_layers_imports_no_heavy_library() -> None:
    code = textwrap.dedent(
        """
        import sys
        import pydotcompute.core, pydotcompute.backends, pydotcompute.compilation
        import pydotcompute.decorators.kernel
        from pydotcompute.backends import CPUBackend, CUDABackend, MetalBackend
        CPUBackend(); CUDABackend(); MetalBackend()  # constructing does not probe
        heavy = [m for m in ("cupy", "numba", "mlx", "pynvml", "ray") if m in sys.modules]
        print(heavy)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
