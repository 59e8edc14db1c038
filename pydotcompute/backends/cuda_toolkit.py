"""Where NVVM lives: find ``libnvvm`` and say what ``CUDA_HOME`` must be for Numba CUDA.

Numba compiles every CUDA kernel through NVVM. On CUDA machine images whose NVRTC comes from
wheels while the toolkit (``nvcc``, ``nvvm/``) sits in a system folder, numba-cuda may not
infer ``CUDA_HOME``, and then every compile fails with a library-not-found error far from
the cause. `probe_nvvm` looks where NVVM can be (``CUDA_HOME``/``CUDA_PATH``, the toolkit
of the ``nvcc`` on ``PATH``, ``/usr/local/cuda*``, ``/opt/cuda``, the ``nvidia`` wheels on
``sys.path``) and returns the folder to export as ``CUDA_HOME`` plus a sentence saying so.

Standard library only and no CUDA call: the hardware check loads this file by path before the
package's own requirements are installed, and before anything may touch the driver.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ("NVVMProbe", "probe_nvvm")

#: Where ``libnvvm`` sits under a toolkit root (Linux, then Windows).
_TOOLKIT_LIBS = ("nvvm/lib64/libnvvm.so*", "nvvm/lib/libnvvm.so*", "nvvm/bin/nvvm64*.dll")
#: Where it sits in the ``nvidia`` wheels, relative to a site-packages folder.
_WHEEL_LIBS = (
    "nvidia/*/nvvm/lib64/libnvvm.so*",  # nvidia-cuda-nvcc-cu12: nvidia/cuda_nvcc/nvvm/...
    "nvidia/*/lib/libnvvm.so*",  # CUDA 13 wheels: nvidia/cu13/lib/...
    "nvidia/*/lib64/libnvvm.so*",
)


@dataclass(frozen=True)
class NVVMProbe:
    """What `probe_nvvm` found.

    Attributes:
        libnvvm: The NVVM library found (None: none anywhere).
        cuda_home: The folder to export as ``CUDA_HOME`` (the one holding ``nvvm/``), or
            None when nothing needs setting (already set and valid, a wheel layout Numba
            searches itself, or nothing found).
        source: Where it was found (``CUDA_HOME``, ``nvcc on PATH``, a folder, ``wheel``).
        message: One sentence for a person: what was found and what to set.
    """

    libnvvm: str | None
    cuda_home: str | None
    source: str
    message: str

    @property
    def found(self) -> bool:
        return self.libnvvm is not None


def _lib_under(root: str, patterns: Iterable[str]) -> str | None:
    for pattern in patterns:
        hits = sorted(glob.glob(os.path.join(root, pattern)))
        if hits:
            return hits[0]
    return None


def _toolkit_roots(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(source, folder) pairs of toolkits outside the environment variables, best first."""
    roots: list[tuple[str, str]] = []
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        roots.append(("nvcc on PATH", os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))))
    roots.append(("/usr/local/cuda", "/usr/local/cuda"))
    versioned = sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    roots += [(path, path) for path in versioned]
    roots.append(("/opt/cuda", "/opt/cuda"))
    return roots


def probe_nvvm(
    env: Mapping[str, str] | None = None, search_path: Iterable[str] | None = None
) -> NVVMProbe:
    """Find NVVM and the ``CUDA_HOME`` that makes Numba find it (no CUDA call).

    Args:
        env: The environment to read (default ``os.environ``).
        search_path: Folders searched for the ``nvidia`` wheels (default ``sys.path``).

    Returns:
        What was found; ``cuda_home`` is what to export when it is not None.
    """
    env = os.environ if env is None else env
    bad: list[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = env.get(var)
        if not root:
            continue
        lib = _lib_under(root, _TOOLKIT_LIBS)
        if lib is not None:
            return NVVMProbe(lib, None, var, f"{var}={root} holds NVVM ({lib}); nothing to set")
        bad.append(f"{var}={root} has no nvvm/lib64/libnvvm.so")
    note = f" ({'; '.join(bad)}: it must name the toolkit folder holding nvvm/)" if bad else ""
    for source, root in _toolkit_roots(env):
        lib = _lib_under(root, _TOOLKIT_LIBS)
        if lib is not None:
            return NVVMProbe(
                lib,
                root,
                source,
                f"NVVM found at {lib} ({source}): export CUDA_HOME={root}{note}",
            )
    folders = list(sys.path if search_path is None else search_path)
    for folder in folders:
        if not folder or not os.path.isdir(folder):
            continue
        lib = _lib_under(folder, _WHEEL_LIBS)
        if lib is None:
            continue
        parent = os.path.dirname(lib)
        hint = ""
        for _ in range(3):  # .../cuda_nvcc/nvvm/lib64/libnvvm.so -> .../cuda_nvcc
            parent = os.path.dirname(parent)
            if os.path.isdir(os.path.join(parent, "nvvm")):
                hint = f" (should a compile still miss it: export CUDA_HOME={parent})"
                break
        return NVVMProbe(
            lib,
            None,
            "wheel",
            f"NVVM found in a wheel ({lib}); numba-cuda searches the wheels itself, nothing "
            f"to set{hint}{note}",
        )
    return NVVMProbe(
        None,
        None,
        "none",
        "no libnvvm found (looked in CUDA_HOME/CUDA_PATH, the toolkit of nvcc on PATH, "
        "/usr/local/cuda*, /opt/cuda and the nvidia wheels): every Numba CUDA compile will "
        "fail; export CUDA_HOME=<toolkit folder holding nvvm/lib64/libnvvm.so>, or install "
        f"the nvidia-cuda-nvcc-cu12 (CUDA 12) or nvidia-nvvm (CUDA 13) wheel{note}",
    )
