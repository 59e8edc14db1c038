"""The pydotcompute pytest plugin, loaded through the ``pytest11`` entry point.

It gives a project that builds on pydotcompute what its tests need, with an empty
``conftest.py``:

- fixtures ``runtime`` (a started ``RingKernelRuntime``, shut down after the test, which
  fails if the shutdown lost messages), ``accelerator``, ``memory_pool``,
  ``unified_buffer``, ``message_queue``, ``recording_backend``, ``kernel_tier`` (the test
  runs once per execution tier) and ``pydotcompute_leak_guard``;
- markers ``cuda``, ``metal``, ``gpu`` and ``ray`` that skip with a reason when the hardware
  or library is missing, ``slow`` and ``cudasim`` (registered, so ``--strict-markers``
  accepts them), and ``pydotcompute(...)`` for per-test options;
- event loop factories ``asyncio`` and ``uvloop`` for
  ``pytest.mark.asyncio(loop_factories=[...])`` (pytest-asyncio >= 1.4).

Nothing here changes tests that use none of it: fixtures run only when requested, the
hardware markers only act on tests that carry them, and a test not asking for several loops
gets the same single loop it would get without the plugin. Disable the whole plugin with
``-p no:pydotcompute``.

Design note: the leak guard's kernel-task check must run after the test's async fixtures
are torn down but before pytest-asyncio closes the event loop (closing cancels leftover
tasks silently). The plugin therefore adds a finalizer to the loop runner fixture right
after it is set up; finalizers run last-in first-out, so it runs after every fixture that
was set up on that loop and before the runner closes it.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from .environment import (
    PYTHON_TIERS,
    all_tiers,
    available_loop_factories,
    cuda_unavailable_reason,
    gpu_unavailable_reason,
    metal_unavailable_reason,
    ray_unavailable_reason,
)
from .leaks import LeakGuard, format_leaks, take_snapshot

if TYPE_CHECKING:
    from ..ring_kernels.runtime import RingKernelRuntime
    from ..ring_kernels.shutdown import ShutdownReport
    from .backend import RecordingBackend

pytest_asyncio: Any
try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - pytest-asyncio is in the "test" extra
    pytest_asyncio = None

_MARKERS = (
    "cuda: needs an NVIDIA GPU with CuPy or Numba; skipped with the reason otherwise",
    "metal: needs Apple Metal through MLX (macOS); skipped with the reason otherwise",
    "gpu: needs any GPU backend (CUDA or Metal); skipped with the reason otherwise",
    "ray: needs Ray installed; skipped with the reason otherwise",
    "slow: long-running (stress, soak); deselect with -m 'not slow'",
    "cudasim: runs under the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1) in its own "
    "pytest process",
    "pydotcompute(allow_undelivered=False, leak_guard=None, shutdown_timeout=5.0): "
    "per-test options of the pydotcompute fixtures",
)
_HARDWARE: dict[str, Callable[[], str | None]] = {
    "cuda": cuda_unavailable_reason,
    "metal": metal_unavailable_reason,
    "gpu": gpu_unavailable_reason,
    "ray": ray_unavailable_reason,
}
_OUR_FIXTURES = frozenset(
    {"runtime", "accelerator", "memory_pool", "unified_buffer", "message_queue"}
)
_RUNNER_FIXTURE = re.compile(r"^_(function|class|module|package|session)_scoped_runner$")


@dataclass(frozen=True)
class _Options:
    """What ``@pytest.mark.pydotcompute(...)`` can set for one test."""

    allow_undelivered: bool = False
    leak_guard: bool | None = None
    shutdown_timeout: float = 5.0


def _options(node: pytest.Item | pytest.Collector) -> _Options:
    kwargs: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers("pydotcompute"))):  # closest wins
        if mark.args:
            raise pytest.UsageError(
                f"{node.nodeid}: @pytest.mark.pydotcompute takes keyword options only, got "
                f"positional {mark.args!r}"
            )
        kwargs.update(mark.kwargs)
    known = set(_Options.__dataclass_fields__)
    unknown = set(kwargs) - known
    if unknown:
        raise pytest.UsageError(
            f"{node.nodeid}: unknown @pytest.mark.pydotcompute option(s) {sorted(unknown)}; "
            f"known: {sorted(known)}"
        )
    return _Options(**kwargs)


# -- configuration ---------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "pydotcompute_leak_guard",
        type="bool",
        default=False,
        help="fail every test that leaves a pydotcompute kernel task, thread, child process "
        "or shared-memory segment behind",
    )
    parser.addini(
        "pydotcompute_loop_factories",
        type="bool",
        default=True,
        help="provide the 'asyncio' and 'uvloop' loop factories to pytest-asyncio "
        "(pytest.mark.asyncio(loop_factories=[...]))",
    )


class _LoopFactories:
    """The ``pytest_asyncio_loop_factories`` hook, registered when pytest-asyncio has it."""

    @staticmethod
    def pytest_asyncio_loop_factories(
        config: pytest.Config, item: pytest.Item
    ) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
        marker = item.get_closest_marker("asyncio")
        if marker is not None and marker.kwargs.get("loop_factories") is not None:
            return available_loop_factories()
        # A test that asks for no particular loop gets the one it would get anyway.
        return {"default": asyncio.new_event_loop}


def pytest_configure(config: pytest.Config) -> None:
    for line in _MARKERS:
        config.addinivalue_line("markers", line)
    if (
        config.getini("pydotcompute_loop_factories")
        and hasattr(config.hook, "pytest_asyncio_loop_factories")
        and hasattr(pytest, "HIDDEN_PARAM")  # keeps other tests' names unchanged
    ):
        config.pluginmanager.register(_LoopFactories(), "pydotcompute-loop-factories")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel_tier" in metafunc.fixturenames:
        metafunc.parametrize("kernel_tier", all_tiers(PYTHON_TIERS))


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name, probe in _HARDWARE.items():
        if item.get_closest_marker(name) is not None:
            if name == "cuda" and item.get_closest_marker("cudasim") is not None:
                reason = cuda_unavailable_reason(allow_simulator=True)
            else:
                reason = probe()
            if reason is not None:
                pytest.skip(f"[{name}] {reason}")
    _check_async_setup(item)


def _check_async_setup(item: pytest.Item) -> None:
    """Say how to fix an async test that pytest-asyncio will not run (strict mode)."""
    func = getattr(item, "obj", None)
    if func is None or not inspect.iscoroutinefunction(func):
        return
    if not _OUR_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return
    if pytest_asyncio is None:
        pytest.fail(
            f"{item.nodeid} is an async test using pydotcompute fixtures but pytest-asyncio "
            'is not installed; pip install pytest-asyncio (or "pydotcompute[test]")',
            pytrace=False,
        )
    if item.get_closest_marker("asyncio") is None:
        pytest.fail(
            f"{item.nodeid} is an async test but pytest-asyncio runs in strict mode and "
            'the test has no @pytest.mark.asyncio; set asyncio_mode = "auto" under '
            "[tool.pytest.ini_options] (recommended) or mark the test",
            pytrace=False,
        )


# -- the leak guard --------------------------------------------------------------------------


_active_guard: LeakGuard | None = None  # the running test's guard (tests run one at a time)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Any:
    guard = _active_guard
    before = take_snapshot() if guard is not None and fixturedef.scope != "function" else None
    result = yield
    if guard is not None:
        if before is not None:  # a longer-lived fixture may keep what it starts
            guard.excuse(before, take_snapshot())
        get_loop = getattr(result, "get_loop", None)
        if get_loop is not None and _RUNNER_FIXTURE.match(fixturedef.argname):
            fixturedef.addfinalizer(lambda: _check_loop(get_loop))
    return result


def _check_loop(get_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    guard = _active_guard
    if guard is not None:
        guard.check_loop(get_loop())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The guard must be set up before, and so torn down after, every other function-scoped
    # fixture of the test, whatever order the test lists them in.
    for item in items:
        names = getattr(item, "fixturenames", None)
        if not names:
            continue
        for name in ("pydotcompute_leak_guard", "_pydotcompute_auto_leak_guard"):
            if name in names and names[0] != name:
                names.remove(name)
                names.insert(0, name)


def _guard_wanted(request: pytest.FixtureRequest) -> bool:
    option = _options(request.node).leak_guard
    if option is not None:
        return option
    return bool(request.config.getini("pydotcompute_leak_guard"))


@pytest.fixture
def pydotcompute_leak_guard(request: pytest.FixtureRequest) -> Iterator[LeakGuard | None]:
    """Fail the test if a kernel task, thread, child process or shared-memory segment
    started during it is still there after it (pydotcompute-named ones only).

    Request it (or set ``pydotcompute_leak_guard = true`` in the pytest ini options, or
    mark a test ``@pytest.mark.pydotcompute(leak_guard=True)``); a test marked
    ``leak_guard=False`` opts out. Yields the `LeakGuard`, or None when opted out.
    """
    if _options(request.node).leak_guard is False:
        yield None
        return
    global _active_guard
    guard = LeakGuard().start()
    _active_guard = guard
    try:
        yield guard
    finally:
        _active_guard = None
    leaks = guard.find_leaks()
    if leaks:
        pytest.fail(format_leaks(leaks), pytrace=False)


@pytest.fixture(autouse=True)
def _pydotcompute_auto_leak_guard(request: pytest.FixtureRequest) -> None:
    """Turns the leak guard on for tests the ini option or marker selects."""
    if "pydotcompute_leak_guard" not in request.fixturenames and _guard_wanted(request):
        request.getfixturevalue("pydotcompute_leak_guard")


# -- fixtures --------------------------------------------------------------------------------


def _import_or_skip(module: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"the {what} fixture needs {module}, which is not available: {exc}")


async def _runtime_fixture(request: pytest.FixtureRequest) -> AsyncIterator[RingKernelRuntime]:
    """A started ``RingKernelRuntime``, shut down after the test.

    The test fails when the shutdown lost messages (handed them back undelivered, or
    dropped replies while it ran), unless it is marked
    ``@pytest.mark.pydotcompute(allow_undelivered=True)``; ``shutdown_timeout`` (seconds,
    default 5) bounds the shutdown, and each kernel drains for at most its own
    ``drain_timeout``. Replies left unread are not a failure.
    """
    from ..ring_kernels.runtime import RingKernelRuntime

    options = _options(request.node)
    rt = RingKernelRuntime()
    await rt.start()
    try:
        yield rt
    finally:
        report = await rt.shutdown(timeout=options.shutdown_timeout)
    if report and not options.allow_undelivered:
        pytest.fail(_undelivered_text(rt, report, options.shutdown_timeout), pytrace=False)


def _undelivered_text(rt: RingKernelRuntime, report: ShutdownReport, timeout: float) -> str:
    lines = []
    for kid, count in sorted(report.items()):
        if count < 0:
            lines.append(f"  - kernel {kid!r}: terminating it raised (see the log)")
            continue
        left = rt.get_kernel(kid).undelivered
        if left:
            shown = ", ".join(repr(m) for m in left[:3]) + (", ..." if len(left) > 3 else "")
            lines.append(f"  - kernel {kid!r}: {len(left)} message(s) never handled: [{shown}]")
        dropped = report.dropped.get(kid, 0)
        if dropped:
            lines.append(
                f"  - kernel {kid!r}: {dropped} message(s) dropped while shutting down "
                "(replies a full reject-policy kernel refused, say: see its drop reasons)"
            )
    return (
        "runtime shutdown left messages undelivered (its actors did not drain their "
        f"inboxes within their drain_timeout, or the {timeout}s shutdown timeout):\n"
        + "\n".join(lines)
        + "\nReceive or wait for them in the test (pydotcompute.testing.wait_until_idle), "
        "or mark the test @pytest.mark.pydotcompute(allow_undelivered=True) if losing them "
        "is the point."
    )


if pytest_asyncio is not None:
    runtime = pytest_asyncio.fixture(_runtime_fixture, name="runtime")
else:  # pragma: no cover - pytest-asyncio is in the "test" extra

    @pytest.fixture(name="runtime")
    def runtime() -> None:
        pytest.fail(
            "the runtime fixture is async and needs pytest-asyncio; pip install "
            'pytest-asyncio (or "pydotcompute[test]")',
            pytrace=False,
        )


@pytest.fixture
def accelerator() -> Any:
    """The process-wide ``pydotcompute.core.Accelerator`` (skips if the module is missing)."""
    core = _import_or_skip("pydotcompute.core", "accelerator")
    return core.get_accelerator()


@pytest.fixture
def memory_pool() -> Iterator[Any]:
    """A fresh ``MemoryPool`` for this test; its blocks are freed afterwards."""
    core = _import_or_skip("pydotcompute.core", "memory_pool")
    pool = core.MemoryPool.create()
    try:
        yield pool
    finally:
        pool.free_all_blocks()


@pytest.fixture
def unified_buffer(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An allocated ``UnifiedBuffer`` (1024 float32 by default), freed afterwards.

    Choose another shape and dtype with indirect parametrization:

    ```text
    @pytest.mark.parametrize("unified_buffer", [((64, 64), "int32")], indirect=True)
    ```
    """
    core = _import_or_skip("pydotcompute.core", "unified_buffer")
    shape, dtype = getattr(request, "param", ((1024,), "float32"))
    buf = core.UnifiedBuffer(shape, dtype=dtype)
    buf.allocate()
    try:
        yield buf
    finally:
        buf.free()


@pytest.fixture
def message_queue(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``MessageQueue`` (exact priority order, capacity 128 by default), closed after.

    Pass keyword arguments with indirect parametrization:

    ```text
    @pytest.mark.parametrize("message_queue", [{"maxsize": 2, "backpressure": "reject"}],
                             indirect=True)
    ```
    """
    module = _import_or_skip("pydotcompute.ring_kernels.queue", "message_queue")
    kwargs = {"maxsize": 128, **getattr(request, "param", {})}
    queue = module.MessageQueue(**kwargs)
    try:
        yield queue
    finally:
        queue.close()


@pytest.fixture
def recording_backend() -> RecordingBackend:
    """A fresh `RecordingBackend` (records every transfer)."""
    from .backend import RecordingBackend

    return RecordingBackend()


@pytest.fixture
def kernel_tier(request: pytest.FixtureRequest) -> str:
    """The execution tier this run of the test uses.

    A test requesting it runs once per tier that runs Python actors (``asyncio``,
    ``thread``, ``process``); a tier that is not available here is skipped with the reason.
    """
    return str(request.param)
