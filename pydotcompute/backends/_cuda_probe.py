"""Loading ``numba.cuda`` and asking whether the Numba CUDA simulator is on.

A leaf: device discovery (``core.accelerator``), the compiler and the CUDA backend all need
these two answers, and the backend uses the other two, so they live below all three.
Neither function imports Numba unless asked to load it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ("cuda_simulator_enabled", "numba_cuda")


def numba_cuda() -> Any:
    """``numba.cuda`` (imported on call; typed ``Any`` because Numba ships no type hints).

    Raises:
        ImportError: Numba CUDA is not installed.
    """
    from .numba_compat import import_numba_cuda

    return import_numba_cuda()


def cuda_simulator_enabled() -> bool:
    """Whether the Numba CUDA simulator is (or will be) active in this process.

    Reads ``numba.config`` when Numba is already imported, else the environment variable, so
    calling it never imports Numba.
    """
    numba = sys.modules.get("numba")
    if numba is not None and hasattr(numba, "config"):
        return bool(getattr(numba.config, "ENABLE_CUDASIM", 0))
    try:
        return int(os.environ.get("NUMBA_ENABLE_CUDASIM", "0") or "0") != 0
    except ValueError:
        return False
