"""What numba-cuda needs from its surroundings, checked (and patched) before it is imported.

Two facts of typical CUDA machine images:

- NumPy 2.5 removed `np.row_stack`; numba-cuda 0.30 and earlier still register an overload
  for it while their NumPy support loads, so every CUDA compile fails with an
  `AttributeError`. `ensure_numpy_compat` puts the alias back (`np.row_stack` was always
  `np.vstack`) when it is missing, before numba-cuda is imported. It only adds a name that
  NumPy itself shipped for years; nothing that exists is replaced.
- numba-cuda before 0.20 lacks `numba.cuda.cgutils`, which the GPU tier's device code
  imports; `version_problem` says so in words instead of a bare `ModuleNotFoundError`.

Call `import_numba_cuda` instead of `import numba.cuda` where the GPU tier needs it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

import numpy as np

__all__ = (
    "MIN_NUMBA_CUDA",
    "ensure_numpy_compat",
    "import_numba_cuda",
    "numba_cuda_version",
    "version_problem",
)

#: The oldest numba-cuda whose device-code helpers (`numba.cuda.cgutils`) the GPU tier uses.
MIN_NUMBA_CUDA = (0, 20)

_ALIASES = {"row_stack": "vstack"}


def ensure_numpy_compat() -> list[str]:
    """Restore NumPy names numba-cuda still registers; returns the names it added."""
    added = []
    for name, target in _ALIASES.items():
        if not hasattr(np, name) and hasattr(np, target):
            setattr(np, name, getattr(np, target))
            added.append(name)
    return added


def numba_cuda_version() -> str | None:
    """The installed numba-cuda version, or None (not installed as its own package)."""
    try:
        return importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        return None


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def version_problem(version: str | None) -> str | None:
    """Why this numba-cuda version cannot run GPU ring kernels (None when it can)."""
    if version is None:
        return None
    if _parse(version)[:2] < MIN_NUMBA_CUDA:
        floor = ".".join(map(str, MIN_NUMBA_CUDA))
        return (
            f"numba-cuda {version} is too old for GPU ring kernels: their device code needs "
            f"numba.cuda.cgutils (numba-cuda {floor}+); pip install 'numba-cuda>={floor}'"
        )
    return None


def import_numba_cuda() -> Any:
    """`numba.cuda`, imported after `ensure_numpy_compat` (typed `Any`: Numba has no stubs)."""
    ensure_numpy_compat()
    return importlib.import_module("numba.cuda")
