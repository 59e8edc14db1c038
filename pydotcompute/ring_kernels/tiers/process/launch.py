"""Starting and ending a child process: stderr while it starts, exits, forks.

Design notes:
- A spawned child that dies while re-importing the main module (a script without the
  ``__main__`` guard) prints its traceback before any kernel code runs; `StderrTap`
  catches that stderr so the startup error can quote it.
- Only the process that started a child acts on it at exit. A ``fork()`` of the parent
  (by user code) inherits multiprocessing's list of started children, and
  multiprocessing's exit handler SIGTERMs the daemonic ones in whatever process runs it,
  so a fork child that exits normally would kill the parent's actors. After a fork the
  child drops our children from that list (multiprocessing resets the same private set in
  the children it starts itself; no public call does it): `track` records each child.
- Descriptors: a spawned child's ``Popen`` keeps the write end of the pipe that carried
  its start-up data until the process object is closed; `spawn_context` closes it once
  written (one descriptor per kernel), and `raise_fd_limit` lifts the soft descriptor
  limit to the hard one at the first start, so a runtime is not capped at a few hundred
  kernels by a default soft limit of 1,024.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing import connection as mp_connection
from multiprocessing import context as mp_context
from multiprocessing import process as mp_process
from multiprocessing import reduction, spawn
from multiprocessing import util as _mp_util
from typing import Any

from .child import ChildSpec

__all__ = (
    "StderrTap",
    "describe_exit",
    "exited",
    "raise_fd_limit",
    "reap",
    "spawn_context",
    "startup_hint",
    "track",
)

_monotonic = time.monotonic


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def startup_hint(report: list[Any]) -> str:
    """Why the child most likely failed before reporting ready (item: load or bootstrap)."""
    if report and report[0] == "error" and len(report) > 1 and report[1] == "load":
        return (
            "(the child process could not load the actor: it must be a module-level function "
            "of a module the child can import, not one defined under "
            '`if __name__ == "__main__":`, inside a function, or in an interactive session)'
        )
    if report:
        return ""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    where = f" ({main})" if main else ""
    return (
        f"(it died before running any kernel code, most likely while re-importing the main "
        f"module{where}: with the spawn start method a script that starts kernels must do so "
        f'under `if __name__ == "__main__":`, and the main module must import cleanly in a '
        "new process; the child's traceback is on its stderr)"
    )


_STDERR_LOCK = threading.Lock()
_STDERR_TAIL_BYTES = 4000


class StderrTap:
    """What a spawned child writes to stderr before it runs any kernel code.

    A child that dies while re-importing the main module (a script without the
    ``__main__`` guard, a module that raises on import) prints its traceback and exits
    before our code runs, so the parent could only say "exited with code 1". For the spawn
    start method the child starts with its stderr on an unlinked temporary file: the parent
    points its own fd 2 there for the few milliseconds of ``Process.start`` (under a lock),
    and the child puts its real stderr back first thing in `child.child_main`. A file, not a
    pipe: a process spawned by another thread in that window inherits it too, and a file
    can never fail its writes (a pipe closed later would raise EPIPE there). Whatever the
    file caught is forwarded to the parent's stderr, so nothing is hidden; its tail goes
    into the startup error.
    """

    def __init__(self, spec: ChildSpec) -> None:
        self._file: Any = None
        self._spec = spec

    def start(self, process: Any) -> None:
        """``process.start()`` with fd 2 on the tap's file (a plain start if that fails).

        Everything that reads or moves fd 2 happens under `_STDERR_LOCK`: a duplicate of
        fd 2 taken outside it, while another thread's tap had fd 2 on its file, would
        "restore" fd 2 to that (deleted) file for good.
        """
        try:
            file = tempfile.TemporaryFile(prefix="pdc-stderr-")  # noqa: SIM115 - kept open
        except OSError:
            process.start()
            return
        with _STDERR_LOCK:
            try:
                original = os.dup(2)
            except OSError:  # no stderr to tap
                file.close()
                process.start()
                return
            self._file = file
            self._spec.stderr = mp_connection.Connection(original)  # the child restores it
            try:
                sys.stderr.flush()
            except (OSError, ValueError, AttributeError):
                pass
            try:
                os.dup2(file.fileno(), 2)
                process.start()
            finally:
                os.dup2(original, 2)
                self._spec.stderr.close()  # closes ``original``
                self._spec.stderr = None

    def finish(self, *, failed: bool) -> str:
        """Forward what the file caught and close it; on failure, its tail for the error."""
        file, self._file = self._file, None
        if file is None:
            return ""
        try:
            file.seek(0)
            caught = file.read()
        except OSError:
            caught = b""
        finally:
            file.close()
        if caught:
            try:
                os.write(2, caught)
            except OSError:
                pass
        tail = caught[-_STDERR_TAIL_BYTES:]
        if not failed or not tail.strip():
            return ""
        lines = tail.decode("utf-8", "replace").strip().splitlines()[-15:]
        return "; the child's stderr ended with:\n" + "\n".join(lines)


# the children this process started, to be disowned by a fork() of it (see the notes)
_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _disown_children() -> None:
    """In a fork child: forget the parent's kernel children, so that multiprocessing's exit
    handler (which SIGTERMs daemonic children) never acts on them from here."""
    registry = getattr(mp_process, "_children", None)
    for process in list(_STARTED):
        if registry is not None:
            registry.discard(process)
    _STARTED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_children)


def exited(process: Any, timeout: float | None) -> bool:
    """Wait on the process sentinel (never ``waitpid``, which only one thread may win)."""
    return bool(mp_connection.wait([process.sentinel], timeout))


def reap(process: Any) -> int | None:
    """The exit code of a child whose sentinel fired, tolerating a concurrent reaper.

    ``Process.join`` in two threads at once lets one ``waitpid`` fail with ECHILD and
    report None; the winner stores the code on the shared ``Popen`` shortly after.
    """
    deadline = _monotonic() + 5.0
    while True:
        process.join(0.05)
        code: int | None = process.exitcode
        if code is not None or _monotonic() > deadline:
            return code


def track(process: Any) -> None:
    """Remember a started child, so that a ``fork()`` of this process disowns it."""
    _STARTED.add(process)


_FD_LIMIT_RAISED = False


def raise_fd_limit() -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` toward its hard limit (first call only).

    Only ever up, never down; where the limit cannot move (no ``resource`` module, a
    sandbox) nothing changes. Each process kernel holds a few descriptors in the parent.
    """
    global _FD_LIMIT_RAISED
    if _FD_LIMIT_RAISED:
        return
    _FD_LIMIT_RAISED = True
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if soft in (infinite, hard):
        return
    # an unlimited hard limit still stops at the kernel's own cap (nr_open, OPEN_MAX)
    for target in (hard,) if hard != infinite else (1 << 20, 10240):
        if target <= soft:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        return


if sys.platform != "win32" and hasattr(mp_context, "SpawnProcess"):
    from multiprocessing import popen_spawn_posix

    class _SpawnPopen(popen_spawn_posix.Popen):
        """The standard spawn ``Popen``, but the pipe that carried the child's start-up data
        is closed once written, instead of when the process object is closed."""

        def _launch(self, process_obj: Any) -> None:
            from multiprocessing import resource_tracker

            util: Any = _mp_util  # (its stubs lack close_fds and want bytes paths)
            fds: list[int] = self._fds  # type: ignore[attr-defined]
            tracker_fd: Any = resource_tracker.getfd()
            fds.append(tracker_fd)
            prep_data = spawn.get_preparation_data(process_obj.name)
            fp = io.BytesIO()
            mp_context.set_spawning_popen(self)
            try:
                reduction.dump(prep_data, fp)
                reduction.dump(process_obj, fp)
            finally:
                mp_context.set_spawning_popen(None)
            parent_r = child_w = child_r = parent_w = None
            try:
                parent_r, child_w = os.pipe()
                child_r, parent_w = os.pipe()
                cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
                fds.extend([child_r, child_w])
                self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, fds)
                self.sentinel = parent_r
                with open(parent_w, "wb", closefd=True) as f:
                    parent_w = None
                    f.write(fp.getbuffer())
            finally:
                if parent_w is not None:
                    os.close(parent_w)
                keep = [] if parent_r is None else [parent_r]
                self.finalizer = util.Finalize(self, util.close_fds, keep)
                for fd in (child_r, child_w):
                    if fd is not None:
                        os.close(fd)

    class _SpawnProcess(mp_context.SpawnProcess):
        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            return _SpawnPopen(process_obj)

    class _SpawnContext(mp_context.SpawnContext):
        Process = _SpawnProcess  # type: ignore[assignment]

    _SPAWN: Any = _SpawnContext()
else:  # pragma: no cover - Windows
    _SPAWN = None


def spawn_context(method: str | None) -> Any:
    """The multiprocessing context for ``method`` (``None``: spawn)."""
    from multiprocessing import get_context

    if (method or "spawn") == "spawn" and _SPAWN is not None:
        return _SPAWN
    return get_context(method)
