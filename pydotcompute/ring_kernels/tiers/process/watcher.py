"""One thread that watches the descriptors of every process kernel in this process.

Each kernel registers its child's sentinel (to notice an exit at once) and, while wakers
are registered, a doorbell; the thread runs the kernel's callback when one becomes
readable. One thread and one wake-up pipe serve all the kernels of a process, instead of a
thread and a pipe per kernel; the thread ends (closing its pipe) when nothing is watched.

Design notes:
- `Watcher.discard` returns only once the thread polls without those descriptors and no
  callback for them runs, so their owner may close them right after (a closed number
  reused by another file would otherwise be polled, or a callback run on a closed kernel).
  From the thread itself (a callback discarding its own descriptors) it returns at once.
- Callbacks run on the watcher thread and must be quick: they wake someone up
  (``call_soon_threadsafe``, a waker) or record a child's exit.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable, Iterable

from .waiting import drain_bell, ring_bell

__all__ = ("WATCHER", "Watcher")

logger = logging.getLogger("pydotcompute")


class Watcher:
    """Runs ``callback()`` on a thread of its own whenever a registered fd is readable."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._fds: dict[int, Callable[[], None]] = {}
        self._changed = 0  # bumped by every change of ``_fds``
        self._seen = 0  # the change the thread polls with
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None

    def set(self, fd: int, callback: Callable[[], None]) -> None:
        """Watch ``fd`` (replacing its callback if it is watched already)."""
        with self._cond:
            self._fds[fd] = callback
            self._poke()

    def discard(self, fds: Iterable[int]) -> None:
        """Stop watching ``fds``; on return the thread no longer touches them."""
        with self._cond:
            dropped = [fd for fd in fds if self._fds.pop(fd, None) is not None]
            if not dropped:
                return
            change = self._poke()
            if threading.current_thread() is self._thread:
                return
            while self._thread is not None and self._seen < change:
                self._cond.wait(1.0)

    @property
    def watched(self) -> int:
        """How many descriptors are watched now."""
        return len(self._fds)

    def _poke(self) -> int:
        """Tell the thread the set changed (starting it if none runs); ``_cond`` held."""
        self._changed += 1
        if self._thread is None:
            self._wake = r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            thread = threading.Thread(target=self._run, name="pydotcompute-watch", daemon=True)
            self._thread = thread
            thread.start()
        else:
            assert self._wake is not None
            ring_bell(self._wake[1])
        return self._changed

    def _run(self) -> None:
        assert self._wake is not None
        wake_r = self._wake[0]
        poller = select.poll()
        callbacks: dict[int, Callable[[], None]] = {}
        while True:
            with self._cond:
                if self._seen != self._changed:
                    if not self._fds:  # nothing left: end, the next `set` starts anew
                        os.close(wake_r)
                        os.close(self._wake[1])
                        self._wake = None
                        self._thread = None
                        self._seen = self._changed
                        self._cond.notify_all()
                        return
                    for fd in callbacks:
                        if fd not in self._fds:
                            poller.unregister(fd)
                    for fd in self._fds:
                        if fd not in callbacks:
                            poller.register(fd, select.POLLIN)
                    if not callbacks:
                        poller.register(wake_r, select.POLLIN)
                    callbacks = dict(self._fds)
                    self._seen = self._changed
                    self._cond.notify_all()
            for fd, _events in poller.poll():
                if fd == wake_r:
                    drain_bell(wake_r)
                    continue
                callback = callbacks.get(fd)
                if callback is not None and self._fds.get(fd) is callback:
                    try:
                        callback()
                    except Exception:  # a bug of a callback must not end every kernel's watch
                        logger.exception("process kernel watcher: a callback raised")


#: The process's watcher, shared by every process kernel it starts.
WATCHER = Watcher()
