"""The leak guard: nothing a test started may outlive it.

A `LeakGuard` snapshots the process before a test and compares after it. It looks for
four kinds of leftovers, each recognised by the ``pydotcompute`` naming convention so that
threads and processes owned by other libraries (pytest-timeout, Ray, uvloop, Numba, a
thread pool) are never blamed:

- kernel tasks: asyncio tasks named ``pydotcompute:<kernel id>`` still pending on the
  test's event loop when it is about to close (the loop would cancel them silently);
- threads whose name starts with ``pydotcompute``;
- child processes: ``multiprocessing`` children whose name starts with ``pydotcompute``, and
  (on Linux) direct children whose command name or an argument (such as
  ``-m pydotcompute.x``) starts with ``pydotcompute``;
- shared-memory segments in ``/dev/shm`` named ``pdc_<pid>_*`` whose pid is this process
  or one of its children (``/dev/shm`` is shared by the whole machine).

Only things that did not exist in the "before" snapshot count, and threads, processes and
segments get a grace period to go away (a stopping worker is not a leak). Processes and
segments that stay are reported and then cleaned up (terminated, unlinked) so one leaky
test does not poison the next; a thread cannot be killed and is only reported.

Design note: comparing before/after snapshots filtered by name was chosen over "nothing new
at all", which blames pytest-timeout's timer thread, Ray's raylet, Numba's pool or a
session fixture started lazily; resources created while a broader-scoped fixture is set up
are excused explicitly (`LeakGuard.excuse`).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ("LeakGuard", "Snapshot", "take_snapshot")

_SHM_DIR = Path("/dev/shm")
DEFAULT_PREFIXES: tuple[str, ...] = ("pydotcompute",)
DEFAULT_SHM_PREFIXES: tuple[str, ...] = ("pdc_",)


@dataclass(frozen=True)
class Snapshot:
    """Threads, child processes and shared-memory segments alive at one moment."""

    threads: frozenset[threading.Thread] = frozenset()
    processes: frozenset[int] = frozenset()
    segments: frozenset[str] = frozenset()


def _child_pids() -> set[int]:
    """Direct children of this process (Linux ``/proc``; elsewhere multiprocessing's)."""
    pids = {p.pid for p in multiprocessing.active_children() if p.pid is not None}
    task_dir = Path("/proc/self/task")
    if task_dir.is_dir():
        for task in task_dir.iterdir():
            try:
                text = (task / "children").read_text()
            except OSError:
                continue
            pids.update(int(tok) for tok in text.split())
    return pids


def _segments() -> set[str]:
    try:
        return set(os.listdir(_SHM_DIR))
    except OSError:  # macOS and Windows have no /dev/shm to list
        return set()


def take_snapshot() -> Snapshot:
    """What is alive now: threads, direct child processes, ``/dev/shm`` segments."""
    return Snapshot(
        threads=frozenset(threading.enumerate()),
        processes=frozenset(_child_pids()),
        segments=frozenset(_segments()),
    )


def _proc_info(pid: int) -> tuple[str, list[str], bool] | None:
    """(command name, argv, is zombie) of ``pid`` from ``/proc``, or None if unknown."""
    base = Path(f"/proc/{pid}")
    try:
        comm = (base / "comm").read_text().strip()
        argv = [
            a for a in (base / "cmdline").read_bytes().decode(errors="replace").split("\0") if a
        ]
        stat = (base / "stat").read_text()
    except OSError:
        return None
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return comm, argv, state == "Z"


#: how long a thread already gone from threading.enumerate() may take to be done, when the
#: grace period has run out meanwhile
_FINISHING_S = 0.1


@dataclass
class LeakGuard:
    """Fail when a kernel task, thread, child process or shared-memory segment outlives a test.

    Use it as a context manager (``with LeakGuard(): ...``; inside a coroutine it also checks
    the running loop's kernel tasks on exit) or through the pytest plugin's
    ``pydotcompute_leak_guard`` fixture.

    Args:
        prefixes: Names that mark a task, thread or process as pydotcompute's.
        shm_prefixes: Name prefixes of pydotcompute's ``/dev/shm`` segments; the creator's
            pid follows the prefix (``pdc_<pid>_<random>``).
        grace: Seconds a stopping thread, process or segment gets to go away.
        cleanup: Terminate leaked processes and unlink leaked segments after reporting them.
    """

    prefixes: tuple[str, ...] = DEFAULT_PREFIXES
    shm_prefixes: tuple[str, ...] = DEFAULT_SHM_PREFIXES
    grace: float = 2.0
    cleanup: bool = True
    before: Snapshot = field(default_factory=Snapshot)
    _excused: Snapshot = field(default_factory=Snapshot, repr=False)
    _task_leaks: list[str] = field(default_factory=list, repr=False)
    _started: bool = field(default=False, repr=False)

    # -- recording ---------------------------------------------------------------------------

    def start(self) -> LeakGuard:
        """Take the "before" snapshot."""
        self.before = take_snapshot()
        self._started = True
        return self

    def excuse(self, before: Snapshot, after: Snapshot) -> None:
        """Never report what appeared between two snapshots (a longer-lived fixture's setup)."""
        ex = self._excused
        self._excused = Snapshot(
            threads=ex.threads | (after.threads - before.threads),
            processes=ex.processes | (after.processes - before.processes),
            segments=ex.segments | (after.segments - before.segments),
        )

    def _is_ours(self, name: str) -> bool:
        low = name.lower()
        return any(low.startswith(p) for p in self.prefixes)

    def pending_kernel_tasks(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[Any]]:
        """pydotcompute-named tasks not yet finished on ``loop`` (other than the caller)."""
        try:
            current = asyncio.current_task(loop)
        except RuntimeError:
            current = None
        return [
            t
            for t in asyncio.all_tasks(loop)
            if t is not current and not t.done() and self._is_ours(t.get_name())
        ]

    def check_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Record kernel tasks still pending on ``loop``; call it before the loop closes."""
        for task in self.pending_kernel_tasks(loop):
            self._task_leaks.append(
                f"kernel task {task.get_name()!r} is still running on its event loop "
                "(shut the runtime down: `async with RingKernelRuntime()` or "
                "`await runtime.shutdown()`)"
            )

    # -- checking ----------------------------------------------------------------------------

    def _new_threads(self) -> list[threading.Thread]:
        old = self.before.threads | self._excused.threads
        return [
            t
            for t in threading.enumerate()
            if t not in old and t.is_alive() and self._is_ours(t.name)
        ]

    def _new_processes(self) -> dict[int, str]:
        """pid -> description of new pydotcompute child processes still running."""
        old = self.before.processes | self._excused.processes
        found: dict[int, str] = {}
        mp_names = {p.pid: p.name for p in multiprocessing.active_children()}
        for pid in _child_pids() - old:
            info = _proc_info(pid)
            if info is not None and info[2]:
                continue  # a zombie has exited; it is not running
            name = mp_names.get(pid)
            if name is not None and self._is_ours(name):
                found[pid] = f"child process {pid} {name!r}"
            elif info is not None:
                comm, argv = info[0], info[1]
                if self._is_ours(comm) or any(self._is_ours(a) for a in argv[1:]):
                    found[pid] = f"child process {pid} ({' '.join(argv)[:120]})"
        return found

    def _new_segments(self) -> list[str]:
        """New segments created by this process or one of its children.

        ``/dev/shm`` is shared by every process on the machine, so a segment only counts
        when the creator's pid embedded in its name (``pdc_<pid>_<random>``) is ours or a
        child's: a concurrent test run (pytest-xdist, another checkout) is never blamed,
        and its segments are never unlinked.
        """
        old = self.before.segments | self._excused.segments
        pids = {os.getpid()} | self.before.processes | _child_pids()
        found = []
        for name in _segments() - old:
            for prefix in self.shm_prefixes:
                if name.startswith(prefix):
                    pid = name[len(prefix) :].split("_", 1)[0]
                    if pid.isdigit() and int(pid) in pids:
                        found.append(name)
                    break
        return sorted(found)

    def find_leaks(self) -> list[str]:
        """Describe every leftover, after giving stopping things ``grace`` seconds.

        Cleans leaked processes and segments up when ``cleanup`` is set.
        """
        leaks = list(self._task_leaks)
        self._task_leaks.clear()
        deadline = time.monotonic() + self.grace
        seen: set[threading.Thread] = set()
        while True:
            threads = self._new_threads()
            seen.update(threads)
            procs = self._new_processes()
            segs = self._new_segments()
            left = deadline - time.monotonic()
            if not (threads or procs or segs) or left <= 0:
                break
            if threads:
                threads[0].join(min(left, 0.05))
            else:
                time.sleep(min(left, 0.01))
        # a finishing thread leaves threading.enumerate() a moment before it is done (its
        # interpreter state is still being torn down): wait for those it listed before
        for t in seen.difference(threads):
            t.join(max(deadline - time.monotonic(), _FINISHING_S))
        leaks += [
            f"thread {t.name!r} is still alive after {self.grace}s (stop its kernel or pool)"
            for t in threads
        ]
        for pid, what in sorted(procs.items()):
            note = " (terminated by the leak guard)" if self.cleanup and _terminate(pid) else ""
            leaks.append(f"{what} is still running{note}")
        for name in segs:
            note = ""
            if self.cleanup:
                with contextlib.suppress(OSError):
                    os.unlink(_SHM_DIR / name)
                    note = " (unlinked by the leak guard)"
            leaks.append(f"shared-memory segment /dev/shm/{name} was not unlinked{note}")
        return leaks

    def check(self) -> None:
        """Raise ``AssertionError`` listing every leftover (see `find_leaks`)."""
        leaks = self.find_leaks()
        if leaks:
            raise AssertionError(format_leaks(leaks))

    def __enter__(self) -> LeakGuard:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self.check_loop(loop)
        if exc_type is None:
            self.check()
        else:  # do not mask the test's own error; still clean up
            self.find_leaks()


def format_leaks(leaks: list[str]) -> str:
    """The report text: a count, then one line per leftover."""
    lines = "\n".join(f"  - {leak}" for leak in leaks)
    return (
        f"pydotcompute leak guard: {len(leaks)} resource(s) outlived the test:\n{lines}\n"
        "Stop every kernel, runtime, thread pool and shared ring the test starts "
        "(context managers do it for you)."
    )


def _terminate(pid: int) -> bool:
    """SIGTERM then SIGKILL a child; reap it. True when it is gone."""
    for mp_child in multiprocessing.active_children():
        if mp_child.pid == pid:
            mp_child.terminate()
            mp_child.join(1.0)
            if mp_child.is_alive():
                mp_child.kill()
                mp_child.join(1.0)
            return not mp_child.is_alive()
    if sys.platform == "win32":  # pragma: no cover - /proc discovery is Linux-only
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a Popen object)
                return True
            if done:
                return True
            time.sleep(0.01)
    return False
