"""The CUDA simulator suite: runs only in its own pytest process with NUMBA_ENABLE_CUDASIM=1.

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cudasim -p no:cacheprovider

The simulator must be switched on before Numba is imported, so it cannot share a process with
the other suites (which also compile real PTX, something the simulator cannot do). In any
other process every test here is skipped with that reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

SIMULATOR_ON = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE not in Path(str(item.path)).parents:
            continue
        item.add_marker(pytest.mark.cudasim)
        if not SIMULATOR_ON:
            item.add_marker(
                pytest.mark.skip(
                    reason="CUDA simulator suite: run it alone with NUMBA_ENABLE_CUDASIM=1 "
                    "python -m pytest tests/cudasim"
                )
            )


@pytest.fixture(autouse=True)
def _fresh_device_state(tmp_path: Path) -> Iterator[None]:
    """A fresh accelerator/backends and a private kernel compiler for every test."""
    if not SIMULATOR_ON:
        yield
        return
    from pydotcompute.compilation import KernelCache, KernelCompiler
    from pydotcompute.compilation import compiler as compiler_mod
    from pydotcompute.core import Accelerator

    saved = compiler_mod._compiler
    compiler_mod._compiler = KernelCompiler(cache=KernelCache(tmp_path))
    Accelerator._reset_for_tests()
    try:
        yield
    finally:
        compiler_mod._compiler = saved
        Accelerator._reset_for_tests()
