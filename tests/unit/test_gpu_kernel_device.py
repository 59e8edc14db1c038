"""The GPU tier's device-side rules that need no GPU: liveness, typing, streams, versions.

Fakes stand in for CUDA events, CUDA-array-interface objects and the driver; the rules are
the ones DESIGN.md section 5 lists (liveness fails closed, CuPy state types through the CUDA
typing module, no blocking-stream fallback, NumPy 2.5 without `np.row_stack`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import numpy as np
import pytest

from pydotcompute.exceptions import CUDAError
from pydotcompute.ring_kernels.tiers.gpu import resources
from pydotcompute.ring_kernels.tiers.gpu.resources import KernelLiveness, is_sticky_error

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
HAS_NUMBA_CUDA = importlib.util.find_spec("numba") is not None and (
    importlib.util.find_spec("numba.cuda") is not None
)


# --- liveness fails closed ---------------------------------------------------------------------


class _CudaAPIError(Exception):
    """Shaped like Numba's driver error: ``code`` and text."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(f"[{code}] {msg}")
        self.code = code


class _CUDARuntimeError(Exception):
    """Shaped like CuPy's runtime error: ``status`` and text."""

    def __init__(self, status: int, msg: str) -> None:
        super().__init__(msg)
        self.status = status


class _NumbaEvent:
    def __init__(self, result: bool | BaseException) -> None:
        self.result = result

    def query(self) -> bool:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


class _CupyEvent:
    def __init__(self, result: bool | BaseException) -> None:
        self.result = result

    @property
    def done(self) -> bool:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


@pytest.mark.parametrize(
    "exc",
    [
        _CudaAPIError(700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        _CudaAPIError(719, "CUDA_ERROR_LAUNCH_FAILED"),
        _CUDARuntimeError(700, "cudaErrorIllegalAddress: an illegal memory access was encountered"),
        _CUDARuntimeError(710, "cudaErrorAssert: device-side assert triggered"),
        RuntimeError("unspecified launch failure"),
    ],
    ids=lambda e: str(e)[:30],
)
def test_sticky_context_errors_mean_the_kernel_is_gone(exc: BaseException) -> None:
    assert is_sticky_error(exc)
    for live in (
        KernelLiveness(_NumbaEvent(exc), "numba", "k"),
        KernelLiveness(_CupyEvent(exc), "cuda_c", "k"),
    ):
        assert live.finished()
        failure = live.failure()
        assert isinstance(failure, CUDAError)
        assert "faulted" in str(failure)
        assert failure.__cause__ is exc


@pytest.mark.parametrize(
    "exc",
    [
        _CudaAPIError(1, "CUDA_ERROR_INVALID_VALUE"),
        _CUDARuntimeError(201, "cudaErrorDeviceUninitialized: invalid device context"),
        RuntimeError("the event was queried from a thread without a context"),
        OSError("driver busy"),
    ],
    ids=lambda e: str(e)[:30],
)
def test_any_other_error_while_asking_is_not_finished(exc: BaseException) -> None:
    assert not is_sticky_error(exc)
    for live in (
        KernelLiveness(_NumbaEvent(exc), "numba", "k"),
        KernelLiveness(_CupyEvent(exc), "cuda_c", "k"),
    ):
        assert not live.finished()  # fails closed: memory stays alive
        assert live.failure() is None
        assert live.last_query_error is exc


def test_a_clean_answer_is_taken_as_is() -> None:
    assert not KernelLiveness(_NumbaEvent(False), "numba", "k").finished()
    assert KernelLiveness(_NumbaEvent(True), "numba", "k").finished()
    assert KernelLiveness(_CupyEvent(True), "cuda_c", "k").finished()
    assert KernelLiveness(_CupyEvent(True), "cuda_c", "k").failure() is None


# --- the blocking-stream fallback raises -------------------------------------------------------


def test_no_non_blocking_stream_is_an_error_not_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    class _FakeCuda:
        def stream(self) -> Any:  # what the old fallback returned
            raise AssertionError("must not fall back to a blocking stream")

    monkeypatch.setattr(resources, "_numba_cuda", _FakeCuda)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    monkeypatch.setitem(sys.modules, "numba.cuda.cudadrv.driver", None)
    with pytest.raises(CUDAError, match="non-blocking CUDA stream") as info:
        resources.nonblocking_stream([], 0)
    assert "would wait for" in str(info.value)


# --- state typed through the CUDA typing module ------------------------------------------------


class _FakeDeviceArray:
    """A device array as CuPy exports it: only ``__cuda_array_interface__``."""

    def __init__(self, n: int, dtype: Any) -> None:
        dt = np.dtype(dtype)
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": dt.str,
            "descr": dt.descr,
            "data": (0x7F0000000000, False),
            "strides": None,
            "version": 3,
            "stream": 1,
        }


@pytest.mark.skipif(SIMULATOR or not HAS_NUMBA_CUDA, reason="needs numba-cuda, simulator off")
def test_cuda_array_interface_state_is_typed_for_the_kernel() -> None:
    import numba

    from pydotcompute.ring_kernels.tiers.gpu import build

    state = _FakeDeviceArray(4, np.int64)
    with pytest.raises((TypeError, ValueError)):
        numba.typeof(state)  # why core typing cannot be used for kernel arguments
    ring = np.zeros(8, np.int64)
    types = build.argument_types((ring, state))
    assert [str(t) for t in types] == ["array(int64, 1d, C)", "array(int64, 1d, C)"]
    f32 = build.argument_types((_FakeDeviceArray(3, np.float32),))[0]
    assert str(f32) == "array(float32, 1d, C)"


# --- NumPy 2.5 without np.row_stack --------------------------------------------------------------


def test_numpy_without_row_stack_is_shimmed_for_numba_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydotcompute.backends import numba_compat

    monkeypatch.delattr(np, "row_stack", raising=False)
    assert numba_compat.ensure_numpy_compat() == ["row_stack"]
    assert np.row_stack is np.vstack  # type: ignore[attr-defined]
    assert numba_compat.ensure_numpy_compat() == []  # idempotent


def test_the_numba_cuda_floor_is_checked() -> None:
    from pydotcompute.backends import numba_compat

    assert numba_compat.MIN_NUMBA_CUDA == (0, 20)
    assert numba_compat.version_problem("0.15.2") is not None
    assert "numba.cuda.cgutils" in (numba_compat.version_problem("0.15.2") or "")
    assert numba_compat.version_problem("0.20.0") is None
    assert numba_compat.version_problem("0.30.4") is None
    assert numba_compat.version_problem(None) is None  # the simulator-only numba bundle


# --- the ptxas that matches the NVVM -------------------------------------------------------------


def _fake_ptxas(tmp_path: Any, release: str) -> str:
    path = tmp_path / f"ptxas-{release}"
    path.write_text(
        "#!/bin/sh\necho 'ptxas: NVIDIA (R) Ptx optimizing assembler'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n"
    )
    path.chmod(0o755)
    return str(path)


def test_ptx_isa_versions_map_to_cuda_releases() -> None:
    from pydotcompute.compilation.ptx_check import cuda_release_for_ptx_isa, ptx_isa_version

    assert ptx_isa_version("//\n.version 8.8\n.target sm_80\n") == (8, 8)
    assert ptx_isa_version(".target sm_80") is None
    assert cuda_release_for_ptx_isa((7, 8)) == (11, 8)
    assert cuda_release_for_ptx_isa((8, 5)) == (12, 5)
    assert cuda_release_for_ptx_isa((8, 8)) == (12, 9)
    assert cuda_release_for_ptx_isa((9, 0)) == (13, 0)


def test_ptxas_older_than_the_ptx_is_skipped(tmp_path: Any) -> None:
    from pydotcompute.compilation.ptx_check import find_ptxas, ptxas_release

    old, new = _fake_ptxas(tmp_path, "12.9"), _fake_ptxas(tmp_path, "13.0")
    assert ptxas_release(old) == (12, 9)
    ptx_129 = ".version 8.8\n.target sm_90\n"
    ptx_130 = ".version 9.0\n.target sm_90\n"
    ptx_future = ".version 9.5\n.target sm_90\n"
    assert find_ptxas(ptx_129, [old, new]) == old  # the first that is new enough
    assert find_ptxas(ptx_130, [old, new]) == new  # 12.9 would reject ISA 9.0
    assert find_ptxas(ptx_future, [old, new]) is None  # none: skip assembling, do not fail
    assert find_ptxas(None, [str(tmp_path / "missing"), old]) == old
