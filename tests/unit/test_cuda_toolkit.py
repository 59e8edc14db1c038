"""Finding NVVM (``pydotcompute.backends.cuda_toolkit``) on made-up folder layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydotcompute.backends.cuda_toolkit import probe_nvvm


def _toolkit(root: Path, nvcc: bool = True) -> Path:
    lib = root / "nvvm" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libnvvm.so.4").write_bytes(b"")
    if nvcc:
        (root / "bin").mkdir()
        exe = root / "bin" / "nvcc"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return root


def test_a_valid_cuda_home_is_kept(tmp_path: Path) -> None:
    root = _toolkit(tmp_path / "cuda")
    probe = probe_nvvm({"CUDA_HOME": str(root), "PATH": ""}, [])
    assert probe.found
    assert probe.cuda_home is None  # nothing to set
    assert probe.source == "CUDA_HOME"
    assert "nothing to set" in probe.message


def test_the_toolkit_of_nvcc_on_path_is_what_to_export(tmp_path: Path) -> None:
    root = _toolkit(tmp_path / "cuda-13.0")
    probe = probe_nvvm({"PATH": str(root / "bin")}, [])
    assert probe.cuda_home == str(root)
    assert probe.source == "nvcc on PATH"
    assert f"export CUDA_HOME={root}" in probe.message


def test_a_wrong_cuda_home_is_named_and_a_better_one_offered(tmp_path: Path) -> None:
    root = _toolkit(tmp_path / "cuda")
    probe = probe_nvvm({"CUDA_HOME": str(tmp_path / "elsewhere"), "PATH": str(root / "bin")}, [])
    assert probe.cuda_home == str(root)
    assert "has no nvvm/lib64/libnvvm.so" in probe.message


def test_nvvm_from_a_wheel_needs_nothing_set(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _toolkit(site / "nvidia" / "cuda_nvcc", nvcc=False)
    probe = probe_nvvm({"PATH": ""}, [str(site)])
    if probe.source != "wheel":
        pytest.skip(f"this machine has a system toolkit, found first: {probe.message}")
    assert probe.cuda_home is None
    assert "numba-cuda searches the wheels itself" in probe.message
    assert str(site / "nvidia" / "cuda_nvcc") in probe.message  # the fallback to export


def test_no_nvvm_anywhere_says_what_to_set(tmp_path: Path) -> None:
    probe = probe_nvvm({"PATH": ""}, [str(tmp_path)])
    if probe.found:
        pytest.skip(f"this machine has a system toolkit with NVVM: {probe.message}")
    assert "every Numba CUDA compile will fail" in probe.message
    assert "export CUDA_HOME=" in probe.message
