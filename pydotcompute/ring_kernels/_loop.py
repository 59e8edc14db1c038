"""Event-loop setup: uvloop when installed, eager tasks on Python 3.12+.

Importing pydotcompute installs uvloop's event-loop *policy* (not ``uvloop.install()``,
which warns on 3.12+) so that plain ``asyncio.run`` gets the fast loop; set
``PYDOTCOMPUTE_NO_UVLOOP=1`` to opt out. Event-loop policies are deprecated from Python
3.14, so there the policy is left alone and `run` (a runner with uvloop's loop
factory) is the path the docs recommend on every version.

The eager task factory installed is our own `eager_task_factory`, not
``asyncio.eager_task_factory``: uvloop 0.23 on Python 3.13 calls a task factory with an
``eager_start`` keyword that the standard one only accepts from 3.14, so every
``create_task`` on such a loop would raise ``TypeError``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = (
    "create_optimized_loop",
    "eager_task_factory",
    "get_loop_info",
    "install_eager_task_factory",
    "install_uvloop",
    "is_eager_tasks_installed",
    "is_uvloop_available",
    "is_uvloop_installed",
    "optimize_current_loop",
    "run",
    "uvloop_disabled",
)

T = TypeVar("T")

_POLICIES_DEPRECATED = sys.version_info >= (3, 14)
_EAGER_SUPPORTED = sys.version_info >= (3, 12)


def uvloop_disabled() -> bool:
    """True when ``PYDOTCOMPUTE_NO_UVLOOP`` is set to a non-empty, non-'0' value."""
    return os.environ.get("PYDOTCOMPUTE_NO_UVLOOP", "") not in ("", "0")


def _uvloop() -> Any:
    if uvloop_disabled():
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def is_uvloop_available() -> bool:
    """True when uvloop can be imported (and is not disabled by the environment)."""
    return _uvloop() is not None


def install_uvloop() -> bool:
    """Make uvloop the default loop for ``asyncio.run``; True when it is in effect.

    On Python 3.14+ policies are deprecated: nothing is installed and False is returned;
    use `pydotcompute.run` instead.
    """
    uvloop = _uvloop()
    if uvloop is None or _POLICIES_DEPRECATED:
        return False
    if not isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy):
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def is_uvloop_installed() -> bool:
    """True when the current policy (or running loop) is uvloop's."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        return type(loop).__module__.startswith("uvloop")
    uvloop = _uvloop()
    if uvloop is None or _POLICIES_DEPRECATED:
        return False
    return isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy)


def eager_task_factory(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    *,
    eager_start: bool | None = None,
    **kwargs: Any,
) -> asyncio.Task[Any]:
    """``asyncio.eager_task_factory`` (3.12+) that also takes the ``eager_start`` keyword
    some loops pass (uvloop 0.23 on Python 3.13); None means eager, as the factory's
    name says."""
    return asyncio.Task(  # type: ignore[call-arg]
        coro, loop=loop, eager_start=True if eager_start is None else eager_start, **kwargs
    )


def install_eager_task_factory(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Start tasks eagerly on ``loop`` (default: the running loop); Python 3.12+.

    A task created on the loop runs at once, up to its first real wait, instead of
    waiting for the loop's next turn (`eager_task_factory`).
    """
    if not _EAGER_SUPPORTED:
        return False
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
    loop.set_task_factory(eager_task_factory)  # type: ignore[arg-type]
    return True


def is_eager_tasks_installed(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    if not _EAGER_SUPPORTED:
        return False
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
    factory = loop.get_task_factory()
    return factory is eager_task_factory or factory is asyncio.eager_task_factory  # type: ignore[attr-defined]


def create_optimized_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when available, with eager tasks on 3.12+."""
    uvloop = _uvloop()
    loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
    install_eager_task_factory(loop)
    return loop  # type: ignore[no-any-return]


def optimize_current_loop() -> dict[str, Any]:
    """Apply what can be applied to the running loop (eager tasks); returns loop info."""
    install_eager_task_factory()
    return get_loop_info()


def get_loop_info() -> dict[str, Any]:
    """Which loop runs (or would run), and whether uvloop and eager tasks are in effect."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    uvloop = _uvloop()
    return {
        "loop_type": type(loop).__name__ if loop is not None else None,
        "loop_module": type(loop).__module__ if loop is not None else None,
        "running": loop is not None,
        "uvloop_available": uvloop is not None,
        "uvloop_version": getattr(uvloop, "__version__", None),
        "uvloop_installed": is_uvloop_installed(),
        "uvloop_disabled_by_env": uvloop_disabled(),
        "eager_tasks_supported": _EAGER_SUPPORTED,
        "eager_tasks_installed": is_eager_tasks_installed(loop),
        "python": sys.version.split()[0],
    }


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run ``main`` like ``asyncio.run``, on uvloop when available, with eager tasks (3.12+).

    This is the forward-compatible entry point: it uses a loop factory rather than a
    global policy, so it keeps working once policies are gone.
    """
    with asyncio.Runner(debug=debug, loop_factory=create_optimized_loop) as runner:
        return runner.run(main)
