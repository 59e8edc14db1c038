"""What this machine can run: GPUs, Ray, execution tiers and event loops, with reasons.

Every probe returns ``None`` when the thing is usable and otherwise a sentence saying why
not (and how to fix it), which is what a skipped test prints. Probes import CuPy, Numba,
MLX or Ray only when called, never at import, and cache their answer for the process.

The parametrization helpers (`all_tiers`, `event_loop_kinds`) return
``pytest.param`` objects whose unavailable entries carry a skip mark with the reason, so a
suite written once runs everywhere and says what it could not run.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _pytest.mark.structures import MarkDecorator, ParameterSet

__all__ = (
    "LOOP_KINDS",
    "PYTHON_TIERS",
    "all_loops",
    "all_tiers",
    "available_loop_factories",
    "cuda_unavailable_reason",
    "current_loop_kind",
    "event_loop_kinds",
    "gpu_unavailable_reason",
    "loop_factory",
    "loop_unavailable_reason",
    "metal_unavailable_reason",
    "ray_unavailable_reason",
    "selected_loop_kinds",
    "simulator_enabled",
    "tier_unavailable_reason",
)

#: The tiers that run an ``async def actor(ctx)`` written in Python; the GPU tier runs a
#: handler compiled for the device instead, so a suite opts into it explicitly.
PYTHON_TIERS: tuple[str, ...] = ("asyncio", "thread", "process")

#: Event loops a test can run on: the standard library's (the reference) and uvloop's.
LOOP_KINDS: tuple[str, ...] = ("asyncio", "uvloop")

_CUDA_EXTRA = 'pip install "pydotcompute[cuda]"'


def simulator_enabled() -> bool:
    """True when the Numba CUDA simulator is switched on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@functools.cache
def _cuda_hardware_reason() -> str | None:
    try:
        import cupy
    except Exception as exc:
        cupy_reason = f"CuPy is not importable ({type(exc).__name__}: {exc})"
    else:
        try:
            count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:
            return f"CuPy found no usable CUDA device ({type(exc).__name__}: {exc})"
        if count > 0:
            return None
        return "CuPy found no CUDA device"
    if importlib.util.find_spec("numba") is None:
        return f"{cupy_reason} and Numba is not installed; {_CUDA_EXTRA}"
    try:
        from numba import cuda as numba_cuda

        cuda: Any = numba_cuda
        if cuda.is_available():
            return None
    except Exception as exc:
        return f"{cupy_reason}; Numba CUDA failed ({type(exc).__name__}: {exc})"
    return f"{cupy_reason} and Numba sees no CUDA device"


def cuda_unavailable_reason(*, allow_simulator: bool = False) -> str | None:
    """Why CUDA code cannot run here, or ``None`` when an NVIDIA GPU is usable.

    Args:
        allow_simulator: Count the Numba CUDA simulator as a device when it is enabled
            (GPU-tier tests written for it); hardware tests leave this False.
    """
    if simulator_enabled():
        if allow_simulator:
            if importlib.util.find_spec("numba") is None:
                return f"NUMBA_ENABLE_CUDASIM is set but Numba is not installed; {_CUDA_EXTRA}"
            return None
        return (
            "the Numba CUDA simulator is enabled (NUMBA_ENABLE_CUDASIM=1) and this test "
            "needs a real NVIDIA GPU"
        )
    reason = _cuda_hardware_reason()
    return None if reason is None else f"needs an NVIDIA GPU: {reason}"


@functools.cache
def metal_unavailable_reason() -> str | None:
    """Why Apple Metal cannot run here, or ``None`` when MLX has a Metal GPU."""
    if sys.platform != "darwin":
        return f"needs Apple Metal: Metal runs on macOS only and this is {sys.platform}"
    try:
        import mlx.core as mx
    except Exception as exc:
        return (
            f"needs Apple Metal: MLX is not importable ({type(exc).__name__}: {exc}); "
            'pip install "pydotcompute[metal]"'
        )
    try:
        if mx.metal.is_available():
            return None
    except Exception as exc:
        return f"needs Apple Metal: the MLX Metal probe failed ({type(exc).__name__}: {exc})"
    return "needs Apple Metal: MLX reports no Metal device"


def gpu_unavailable_reason() -> str | None:
    """Why no GPU backend can run here (CUDA or Metal), or ``None`` when one can."""
    cuda = cuda_unavailable_reason()
    if cuda is None:
        return None
    metal = metal_unavailable_reason()
    if metal is None:
        return None
    cuda_detail = cuda.removeprefix("needs an NVIDIA GPU: ")
    metal_detail = metal.removeprefix("needs Apple Metal: ")
    return f"needs a GPU: no CUDA ({cuda_detail}) and no Metal ({metal_detail})"


@functools.cache
def ray_unavailable_reason() -> str | None:
    """Why Ray cannot run here, or ``None`` when it is importable."""
    if importlib.util.find_spec("ray") is None:
        return 'needs Ray: it is not installed; pip install "pydotcompute[ray]"'
    return None


def tier_unavailable_reason(tier: str) -> str | None:
    """Why execution tier ``tier`` cannot run here, or ``None`` when it can.

    A tier is available when its implementation imports; the ``gpu`` tier also needs a
    CUDA device or the Numba CUDA simulator.
    """
    from ..exceptions import InvalidConfigurationError
    from ..ring_kernels.tiers import canonical_tier, tier_class

    try:
        tier_class(tier)
    except InvalidConfigurationError as exc:
        return str(exc)
    if canonical_tier(tier) == "gpu":
        reason = cuda_unavailable_reason(allow_simulator=True)
        if reason is not None:
            return f"execution tier 'gpu' {reason}"
    return None


def all_tiers(tiers: Iterable[str] = PYTHON_TIERS) -> list[ParameterSet]:
    """``pytest.param`` per execution tier, skipped with the reason where unavailable.

    Example:

    ```python
    @pytest.mark.parametrize("tier", all_tiers())
    async def test_echo(runtime, tier):
        await runtime.launch("echo", echo, tier=tier)
    ```

    Args:
        tiers: Which tiers (default: those that run Python actors; add ``"gpu"`` for
            suites written for the GPU tier).
    """
    import pytest

    params = []
    for tier in tiers:
        reason = tier_unavailable_reason(tier)
        marks = () if reason is None else (pytest.mark.skip(reason=reason),)
        params.append(pytest.param(tier, id=tier, marks=marks))
    return params


# -- event loops ---------------------------------------------------------------------------


def loop_unavailable_reason(kind: str) -> str | None:
    """Why event loop ``kind`` (``"asyncio"`` or ``"uvloop"``) cannot run, or ``None``."""
    if kind == "asyncio":
        return None
    if kind == "uvloop":
        if sys.platform == "win32":
            return "uvloop does not run on Windows"
        if importlib.util.find_spec("uvloop") is None:
            return 'uvloop is not installed; pip install "pydotcompute[fast]"'
        return None
    return f"unknown event loop kind {kind!r}; choose one of {list(LOOP_KINDS)}"


def _new_asyncio_loop() -> asyncio.AbstractEventLoop:
    cls: Any = getattr(asyncio, "EventLoop", None)  # 3.13+: the platform's default loop
    if cls is None:
        name = "ProactorEventLoop" if sys.platform == "win32" else "SelectorEventLoop"
        cls = getattr(asyncio, name)
    loop: asyncio.AbstractEventLoop = cls()
    return loop


def _new_uvloop_loop() -> asyncio.AbstractEventLoop:
    import uvloop

    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function creating a new event loop of ``kind`` (``"asyncio"`` or ``"uvloop"``).

    ``"asyncio"`` is the standard library's loop whatever policy is installed (importing
    pydotcompute installs uvloop's), so it is the reference to compare against.

    Raises:
        InvalidConfigurationError: ``kind`` is unknown or not installed here.
    """
    reason = loop_unavailable_reason(kind)
    if reason is not None:
        from ..exceptions import InvalidConfigurationError

        raise InvalidConfigurationError(f"cannot create a {kind!r} event loop: {reason}")
    return _new_asyncio_loop if kind == "asyncio" else _new_uvloop_loop


def available_loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Loop kind -> factory for every kind usable here (``"asyncio"`` always)."""
    return {k: loop_factory(k) for k in LOOP_KINDS if loop_unavailable_reason(k) is None}


def event_loop_kinds() -> list[ParameterSet]:
    """``pytest.param`` per event loop kind, skipped with the reason where unavailable.

    For synchronous tests that create their loop themselves:

    ```python
    @pytest.mark.parametrize("kind", event_loop_kinds())
    def test_on_each_loop(kind):
        with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
            runner.run(main())
    ```

    Async tests use `all_loops` instead.
    """
    import pytest

    params = []
    for kind in LOOP_KINDS:
        reason = loop_unavailable_reason(kind)
        marks = () if reason is None else (pytest.mark.skip(reason=reason),)
        params.append(pytest.param(kind, id=kind, marks=marks))
    return params


def _pytest_asyncio_has_loop_factories() -> bool:
    try:
        from pytest_asyncio import plugin
    except Exception:
        return False
    return hasattr(plugin, "PytestAsyncioSpecs")


def all_loops() -> MarkDecorator:
    """A mark running an async test once per event loop kind (``[asyncio]``, ``[uvloop]``).

    It is ``pytest.mark.asyncio(loop_factories=["asyncio", "uvloop"])``, whose factories
    the pydotcompute plugin provides; a kind that is not installed is skipped with the
    reason. Needs pytest-asyncio 1.4 or later: with an older one the test is skipped with
    a reason rather than silently run once.

    Example:

    ```python
    @all_loops()
    async def test_echo_on_every_loop(runtime):
        ...
    ```
    """
    import pytest

    if not _pytest_asyncio_has_loop_factories():
        return pytest.mark.skip(
            reason="running a test on every event loop needs pytest-asyncio >= 1.4 "
            "(the pytest_asyncio_loop_factories hook)"
        )
    return pytest.mark.asyncio(loop_factories=selected_loop_kinds())


def selected_loop_kinds() -> list[str]:
    """The loop kinds `all_loops` runs a test on: every kind of `LOOP_KINDS`, or those
    named in ``PYDOTCOMPUTE_TEST_LOOPS`` (comma-separated, e.g. ``asyncio``), so a CI job
    on another Python can run the same tests on one loop.

    Raises:
        ValueError: the variable names a kind that is not in `LOOP_KINDS`.
    """
    named = os.environ.get("PYDOTCOMPUTE_TEST_LOOPS", "").strip()
    if not named:
        return list(LOOP_KINDS)
    kinds = [k.strip() for k in named.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in LOOP_KINDS]
    if unknown:
        raise ValueError(
            f"PYDOTCOMPUTE_TEST_LOOPS names {unknown}: the kinds are {list(LOOP_KINDS)}"
        )
    return kinds


def current_loop_kind() -> str:
    """``"uvloop"`` or ``"asyncio"``: the kind of the running event loop.

    Raises:
        RuntimeError: no event loop is running in this thread.
    """
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
