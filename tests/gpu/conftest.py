"""The hardware suite's rules: no CUDA at import or collection, eager module loading.

- Nothing here, nor in the test modules, touches CUDA while pytest imports and collects them:
  whether a GPU is usable is asked once, by the fixture of the first test that runs (a
  driver call at collection would start CUDA before the settings below, and in every
  process that merely collects the whole suite).
- ``CUDA_MODULE_LOADING=EAGER`` is set before that first CUDA call (a user's own setting is
  kept): under lazy loading, the first launch of a second kernel beside a running persistent
  kernel can block inside a driver call that no timeout can interrupt.
- An exception in a CUDA object's finalizer is reported, not turned into a test error: the
  project-wide ``error::PytestUnraisableExceptionWarning`` filter is for host code, and on
  hardware a finalizer running at an unlucky moment (a freed stream, a context torn down)
  would fail whichever test happened to be running.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

_HERE = Path(__file__).parent
#: Marks win over the ini file's filters: on hardware, report finalizer exceptions.
UNRAISABLE_REPORTED = pytest.mark.filterwarnings("default::pytest.PytestUnraisableExceptionWarning")
_REASONS: dict[str, str | None] = {}


def gpu_reason() -> str | None:
    """Why the Numba half of the suite cannot run here (None: a usable GPU). Asked once."""
    if "numba" not in _REASONS:
        _REASONS["numba"] = _numba_reason()
    return _REASONS["numba"]


def cupy_reason() -> str | None:
    """Why the CuPy half of the suite cannot run here (None: CuPy sees a GPU). Asked once."""
    if "cupy" not in _REASONS:
        from pydotcompute.backends import CUDABackend
        from pydotcompute.backends.cuda import cuda_simulator_enabled

        backend = CUDABackend()
        if cuda_simulator_enabled():
            _REASONS["cupy"] = "the CUDA simulator is on; this suite needs a real GPU"
        elif not backend.is_available or backend.mode != "cupy":
            _REASONS["cupy"] = f"needs a CUDA GPU with CuPy ({backend.unavailable_reason})"
        else:
            _REASONS["cupy"] = None
    return _REASONS["cupy"]


def _numba_reason() -> str | None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1); this suite needs a real GPU"
    try:
        from pydotcompute.backends.numba_compat import import_numba_cuda

        cuda = import_numba_cuda()
    except ImportError as exc:
        return f'numba-cuda is not installed ({exc}); pip install "pydotcompute[cuda]"'
    try:
        if not cuda.is_available():
            return "needs an NVIDIA GPU: none is visible to Numba"
        cc = cuda.get_current_device().compute_capability
    except Exception as exc:
        return f"needs an NVIDIA GPU: CUDA is not usable ({type(exc).__name__}: {exc})"
    if tuple(cc) < (7, 0):
        return f"needs compute capability 7.0+, the GPU is {cc[0]}.{cc[1]}"
    return None


@pytest.fixture(autouse=True)
def _needs_a_gpu(request: pytest.FixtureRequest) -> None:
    """Skip (with the reason) when no usable GPU: a module says ``NEEDS = "cupy"`` for the
    CuPy backend, else Numba CUDA is what it needs."""
    needs = getattr(request.module, "NEEDS", "numba")
    reason = cupy_reason() if needs == "cupy" else gpu_reason()
    if reason is not None:
        pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(UNRAISABLE_REPORTED)
