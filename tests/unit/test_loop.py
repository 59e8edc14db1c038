"""Event-loop setup: uvloop policy at import (opt-out), eager tasks, loop info, run()."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from foundation_helpers import run_python

import pydotcompute
from pydotcompute.ring_kernels._loop import (
    create_optimized_loop,
    get_loop_info,
    install_eager_task_factory,
    install_uvloop,
    is_eager_tasks_installed,
    is_uvloop_available,
    is_uvloop_installed,
    optimize_current_loop,
    uvloop_disabled,
)

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None
needs_uvloop = pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
EAGER = sys.version_info >= (3, 12)


@pytest.fixture
def keep_policy() -> Iterator[None]:
    policy = asyncio.get_event_loop_policy()
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(policy)


def run_code(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_python("-W", "error", "-c", textwrap.dedent(code), **env)


LOOP_PROBE = """
    import asyncio, json
    import pydotcompute

    async def main():
        return type(asyncio.get_running_loop()).__module__

    print(json.dumps({
        "policy": type(asyncio.get_event_loop_policy()).__module__,
        "asyncio_run": asyncio.run(main()),
        "pdc_run": pydotcompute.run(main()),
        "installed": pydotcompute.ring_kernels.is_uvloop_installed(),
        "available": pydotcompute.ring_kernels.is_uvloop_available(),
    }))
"""


@needs_uvloop
def test_import_installs_the_uvloop_policy_without_warnings() -> None:
    proc = run_code(LOOP_PROBE)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if sys.version_info >= (3, 14):  # policies are deprecated: only run() uses uvloop
        assert out["asyncio_run"].startswith("asyncio")
    else:
        assert out["policy"].startswith("uvloop")
        assert out["asyncio_run"].startswith("uvloop")
        assert out["installed"] is True
    assert out["pdc_run"].startswith("uvloop")
    assert out["available"] is True


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_no_uvloop_env_is_respected(value: str) -> None:
    proc = run_code(LOOP_PROBE, PYDOTCOMPUTE_NO_UVLOOP=value)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["policy"].startswith("asyncio")
    assert out["asyncio_run"].startswith("asyncio")
    assert out["pdc_run"].startswith("asyncio")
    assert out["installed"] is False
    assert out["available"] is False


@pytest.mark.parametrize(("value", "disabled"), [("", False), ("0", False), ("1", True)])
def test_uvloop_disabled_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool
) -> None:
    monkeypatch.setenv("PYDOTCOMPUTE_NO_UVLOOP", value)
    assert uvloop_disabled() is disabled
    if disabled:
        assert is_uvloop_available() is False


def test_install_uvloop_is_a_no_op_when_disabled(
    monkeypatch: pytest.MonkeyPatch, keep_policy: None
) -> None:
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    monkeypatch.setenv("PYDOTCOMPUTE_NO_UVLOOP", "1")
    assert install_uvloop() is False
    assert type(asyncio.get_event_loop_policy()) is asyncio.DefaultEventLoopPolicy
    assert is_uvloop_installed() is False


@needs_uvloop
@pytest.mark.skipif(sys.version_info >= (3, 14), reason="event-loop policies are deprecated")
def test_install_uvloop_sets_the_policy_idempotently(
    monkeypatch: pytest.MonkeyPatch, keep_policy: None
) -> None:
    monkeypatch.delenv("PYDOTCOMPUTE_NO_UVLOOP", raising=False)
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    assert is_uvloop_installed() is False
    assert install_uvloop() is True
    policy = asyncio.get_event_loop_policy()
    assert type(policy).__module__.startswith("uvloop")
    assert install_uvloop() is True
    assert asyncio.get_event_loop_policy() is policy  # not replaced again
    assert is_uvloop_installed() is True


@needs_uvloop
def test_run_uses_uvloop_and_returns_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYDOTCOMPUTE_NO_UVLOOP", raising=False)

    async def main() -> tuple[str, bool]:
        return type(asyncio.get_running_loop()).__module__, is_uvloop_installed()

    module, installed = pydotcompute.run(main())
    assert module.startswith("uvloop")
    assert installed is True


def test_run_propagates_exceptions() -> None:
    async def boom() -> None:
        raise LookupError("from the coroutine")

    with pytest.raises(LookupError, match="from the coroutine"):
        pydotcompute.run(boom())


@needs_uvloop
def test_create_optimized_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYDOTCOMPUTE_NO_UVLOOP", raising=False)
    loop = create_optimized_loop()
    try:
        assert type(loop).__module__.startswith("uvloop")
        assert is_eager_tasks_installed(loop) is EAGER
    finally:
        loop.close()


def test_eager_task_factory_on_this_python() -> None:
    loop = asyncio.SelectorEventLoop()
    try:
        assert install_eager_task_factory(loop) is EAGER
        assert is_eager_tasks_installed(loop) is EAGER
    finally:
        loop.close()


def test_eager_tasks_need_a_loop_outside_one() -> None:
    assert install_eager_task_factory() is False
    assert is_eager_tasks_installed() is False


async def test_optimize_current_loop_returns_loop_info() -> None:
    info = optimize_current_loop()
    assert info["running"] is True
    assert info["eager_tasks_installed"] is EAGER
    asyncio.get_running_loop().set_task_factory(None)


async def test_loop_info_inside_a_loop() -> None:
    info = get_loop_info()
    loop = asyncio.get_running_loop()
    assert info["running"] is True
    assert info["loop_type"] == type(loop).__name__
    assert info["loop_module"] == type(loop).__module__
    assert info["uvloop_installed"] is type(loop).__module__.startswith("uvloop")


def test_loop_info_outside_a_loop() -> None:
    info = get_loop_info()
    assert info["running"] is False
    assert info["loop_type"] is None
    assert set(info) >= {
        "loop_type",
        "loop_module",
        "running",
        "uvloop_available",
        "uvloop_version",
        "uvloop_installed",
        "uvloop_disabled_by_env",
        "eager_tasks_supported",
        "eager_tasks_installed",
        "python",
    }
    assert info["eager_tasks_supported"] is EAGER
    assert info["python"] == sys.version.split()[0]


@pytest.mark.skipif(not EAGER, reason="eager task factories need Python 3.12+")
async def test_runtime_installs_eager_tasks_on_312() -> None:
    from pydotcompute import RingKernelRuntime

    loop = asyncio.get_running_loop()
    try:
        async with RingKernelRuntime():
            assert is_eager_tasks_installed(loop)
    finally:
        loop.set_task_factory(None)


@pytest.mark.skipif(not EAGER, reason="eager task factories need Python 3.12+")
async def test_the_eager_factory_takes_the_keywords_a_loop_may_pass() -> None:
    # uvloop 0.23 on Python 3.13 calls task_factory(loop, coro, context=..., eager_start=...);
    # the standard factory only takes eager_start from 3.14, so create_task raised TypeError
    from pydotcompute.ring_kernels._loop import eager_task_factory

    ran: list[str] = []

    async def step() -> str:
        ran.append("started")
        return "done"

    loop = asyncio.get_running_loop()
    task = eager_task_factory(loop, step(), name="t", context=None, eager_start=None)
    assert ran == ["started"]  # eager: it ran as it was created
    assert task.done()
    assert task.result() == "done"
    assert task.get_name() == "t"
    lazy = eager_task_factory(loop, step(), eager_start=False)
    assert not lazy.done()  # an explicit eager_start=False is honoured
    assert await lazy == "done"


@pytest.mark.skipif(not (EAGER and HAS_UVLOOP), reason="needs Python 3.12+ and uvloop")
def test_a_uvloop_loop_with_eager_tasks_creates_tasks() -> None:
    async def main() -> str:
        async def child() -> str:
            await asyncio.sleep(0)
            return "ok"

        return await asyncio.get_running_loop().create_task(child())

    loop = create_optimized_loop()
    try:
        assert is_eager_tasks_installed(loop)
        assert loop.run_until_complete(main()) == "ok"
    finally:
        loop.close()
