"""@kernel and @gpu_kernel: compiled on first use through the shared compiler."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pydotcompute.backends import CUDABackend
from pydotcompute.backends.cuda import cuda_simulator_enabled
from pydotcompute.compilation import KernelCache, KernelCompiler
from pydotcompute.compilation import compiler as compiler_mod
from pydotcompute.decorators.kernel import (
    GPUKernel,
    KernelFunction,
    get_kernel_meta,
    gpu_kernel,
    is_kernel,
    kernel,
)
from pydotcompute.exceptions import BackendNotAvailableError, InvalidConfigurationError

HAS_GPU = CUDABackend().is_available
needs_ptx = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None or cuda_simulator_enabled(),
    reason="needs numba-cuda and a process without the CUDA simulator",
)


@pytest.fixture(autouse=True)
def private_compiler(tmp_path: Path) -> Iterator[KernelCompiler]:
    saved = compiler_mod._compiler
    compiler_mod._compiler = KernelCompiler(cache=KernelCache(tmp_path))
    try:
        yield compiler_mod._compiler
    finally:
        compiler_mod._compiler = saved


@kernel
def double_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = 2 * x[i]


def test_bare_kernel_runs_on_cpu(private_compiler: KernelCompiler) -> None:
    assert isinstance(double_into, KernelFunction)
    assert double_into.__name__ == "double_into"
    assert double_into.resolved_device == "cpu"
    x = np.arange(4.0)
    out = np.empty(4)
    double_into(x, out)
    double_into(x, out)
    np.testing.assert_array_equal(out, 2 * x)
    s = private_compiler.get_stats()
    assert (s.misses, s.hits) == (1, 1)  # compiled once


def test_called_kernel_with_options() -> None:
    @kernel(name="scaled", device="cpu", fastmath=False, cache=False)
    def scale(x: np.ndarray) -> Any:
        return x * 3

    assert scale.name == "scaled"
    assert scale.metadata == {
        "name": "scaled",
        "device": "cpu",
        "fastmath": False,
        "cache": False,
        "gpu": False,
    }
    np.testing.assert_array_equal(scale(np.ones(2)), [3, 3])
    assert is_kernel(scale)
    assert get_kernel_meta(scale)["name"] == "scaled"  # type: ignore[index]
    assert get_kernel_meta(len) is None
    assert not is_kernel(len)


def test_kernel_rejects_bad_arguments() -> None:
    with pytest.raises(
        InvalidConfigurationError, match="device must be one of auto, cpu, cuda, metal"
    ):
        kernel(device="gpu")(lambda: None)
    with pytest.raises(InvalidConfigurationError, match="@kernel needs a function, got int"):
        KernelFunction(3)  # type: ignore[arg-type]


def test_cuda_kernel_needs_launch_config() -> None:
    @kernel(device="cuda")
    def k(x: Any) -> None:
        pass

    with pytest.raises(
        InvalidConfigurationError, match=r"targets CUDA; launch it as k\[grid, block\]"
    ):
        k(np.zeros(1))
    with pytest.raises(InvalidConfigurationError, match=r"launch with kernel\[grid, block\]"):
        k[1]


@pytest.mark.skipif(HAS_GPU, reason="checks the error shown without a GPU")
def test_launch_without_gpu_names_the_extra() -> None:
    @kernel
    def k(x: Any) -> None:
        pass

    with pytest.raises(BackendNotAvailableError, match=r'pip install "pydotcompute\[cuda\]"'):
        k[1, 32](np.zeros(1))

    @gpu_kernel
    def g(x: Any) -> None:
        pass

    assert not g.is_available
    with pytest.raises(BackendNotAvailableError, match=r'pip install "pydotcompute\[cuda\]"'):
        g[1, 32](np.zeros(1))


@pytest.mark.skipif(importlib.util.find_spec("mlx") is None, reason="MLX is not installed")
def test_metal_kernel_uses_mx_compile() -> None:
    import mlx.core as mx

    @kernel(device="metal")
    def affine(x: Any) -> Any:
        return x * 2 + 1

    assert affine.resolved_device == "metal"
    assert np.array(affine(mx.array([0.0, 1.0]))).tolist() == [1.0, 3.0]


def test_gpu_kernel_is_not_callable_plainly() -> None:
    @gpu_kernel(name="named", signature="void(float32[:])", debug=True)
    def g(x: Any) -> None:
        pass

    assert isinstance(g, GPUKernel)
    assert g.device == "cuda"
    assert g.metadata["signature"] == "void(float32[:])"
    assert g.metadata["debug"] is True
    assert "named" in repr(g)
    with pytest.raises(
        InvalidConfigurationError, match=r"needs a launch configuration: named\[grid, block\]"
    ):
        g(np.zeros(1))


def test_ptx_needs_a_signature() -> None:
    @gpu_kernel
    def g(x: Any) -> None:
        pass

    with pytest.raises(InvalidConfigurationError, match="has no signature; PTX needs one"):
        g.ptx()


@needs_ptx
def test_gpu_kernel_ptx_without_gpu(private_compiler: KernelCompiler) -> None:
    from numba import cuda

    @gpu_kernel(signature="void(float32[::1], float32)")
    def add_scalar(x: Any, v: Any) -> None:
        i = cuda.grid(1)
        if i < x.size:
            x[i] += v

    ptx = add_scalar.ptx(cc=(8, 0))
    assert ".entry" in ptx
    assert ".target sm_80" in ptx
    assert add_scalar.ptx(cc=(8, 0)) == ptx
    assert private_compiler.get_stats().ptx_compilations == 1  # the second call hit the cache


# --- the shapes code written for 0.2 calls ---------------------------------------------


def test_kernel_registry_0_2_shape() -> None:
    from pydotcompute.decorators import KernelRegistry
    from pydotcompute.exceptions import KernelAlreadyExistsError

    reg = KernelRegistry.private()
    assert reg.list() == []
    reg.register("add", np.add)
    with pytest.raises(ValueError, match="a kernel named 'add' is already registered") as info:
        reg.register("add", np.subtract)
    assert isinstance(info.value, KernelAlreadyExistsError)
    assert reg.get("add") is np.add  # the duplicate did not replace it
    reg.register("add", np.subtract, overwrite=True)
    assert reg.get("add") is np.subtract
    reg.register("mul", np.multiply)
    assert reg.list() == ["add", "mul"]
    assert reg.get("missing") is None
    assert ("mul" in reg, len(reg)) == (True, 2)
    reg.clear()
    assert reg.list() == []
    with pytest.raises(InvalidConfigurationError, match="non-empty str, got ''"):
        reg.register("", np.add)


def test_kernel_decorators_fill_the_process_wide_registry() -> None:
    from pydotcompute.decorators import get_kernel_registry

    registry = get_kernel_registry()
    assert get_kernel_registry() is registry

    @kernel(name="registry_probe_cpu", device="cpu")
    def probe(a: np.ndarray) -> np.ndarray:
        return a + 1

    @gpu_kernel(name="registry_probe_gpu")
    def probe_gpu(a: Any) -> None:
        pass

    try:
        assert registry.get("registry_probe_cpu") is probe
        assert registry.get("registry_probe_gpu") is probe_gpu
        assert {"registry_probe_cpu", "registry_probe_gpu"} <= set(registry.list())
    finally:
        registry.unregister("registry_probe_cpu")
        registry.unregister("registry_probe_gpu")


def test_cuda_source_attaches_the_source() -> None:
    from pydotcompute.decorators import cuda_source

    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'

    @cuda_source(src)
    def k(x: Any) -> None:
        pass

    assert k.__cuda_source__ == src  # type: ignore[attr-defined]

    @kernel(device="cpu")
    @cuda_source(src)
    def wrapped(a: np.ndarray) -> np.ndarray:
        return a * 2

    assert wrapped.__cuda_source__ == src  # type: ignore[attr-defined]
    assert wrapped(np.ones(2)).tolist() == [2.0, 2.0]  # still a working kernel
    with pytest.raises(InvalidConfigurationError, match="non-empty str"):
        cuda_source("")
