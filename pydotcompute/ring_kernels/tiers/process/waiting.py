"""Waiting on a shared-memory ring, in either process: spin, then park on a doorbell.

Each waiting role (reader or writer of one ring) has a `Waiter`. It first polls the ring
without the GIL for a spin budget, then sets the ring's ``waiting`` flag, re-checks, and
sleeps in ``poll()`` on a doorbell pipe that the other side writes only when it sees the
flag (see ``_spsc_py`` for why no wake-up is lost).

Design notes:
- Spinning longer was rejected: on a 2-core machine a spinning process that gets
  descheduled stalls its peer for a scheduler tick (tens of milliseconds).
- Every sleep is cut into slices of `SLICE_S`, a safety net: doorbells and the peer's
  liveness descriptor wake a waiter sooner, and callers re-check after each slice.
"""

from __future__ import annotations

import os
import select
import time
from typing import Any

__all__ = (
    "PROBE_EVERY",
    "SLICE_S",
    "WRITE_OK",
    "WRITE_WAKE",
    "Waiter",
    "drain_bell",
    "read_parked",
    "read_wait",
    "ring_bell",
    "write_wait",
)

WRITE_OK, WRITE_WAKE = 1, 2  # SharedByteRing.try_write's codes
SLICE_S = 0.05  # longest single sleep; a safety net, doorbells and sentinels wake sooner
_monotonic = time.monotonic


def ring_bell(fd: int) -> None:
    """Wake whoever parks on doorbell `fd` (a non-blocking pipe's write end)."""
    try:
        os.write(fd, b"\x00")
    except (BlockingIOError, BrokenPipeError, ConnectionResetError):
        pass  # full: a wake-up is already pending; broken: the peer is gone (seen elsewhere)


def drain_bell(fd: int) -> None:
    """Empty doorbell `fd` (a non-blocking pipe's read end) after waking on it."""
    try:
        os.read(fd, 4096)
    except (BlockingIOError, InterruptedError, ConnectionResetError):
        pass  # reset: the peer closed its end of the socket (seen by its hang-up)


def _poll_ms(remaining: float | None) -> int:
    if remaining is None or remaining > SLICE_S:
        return int(SLICE_S * 1000)
    return max(int(remaining * 1000 + 0.999), 0)


PROBE_EVERY = 8  # an adaptive waiter that keeps parking still tries a full spin this often
_MIN_SPIN_S = 1e-6


class Waiter:
    """Waits for one role (reader or writer of one ring): spin, then park on a doorbell.

    Parking polls the doorbell plus a liveness fd and returns when the bell rang, the
    liveness fd fired (child exited in the parent, parent hung up in the child) or the
    slice ended; callers re-check.

    The spin budget adapts when ``adaptive``: a wait that ended while spinning restores the
    full budget (``max_spin_s``); one that had to park quarters it, down to zero, and every
    ``PROBE_EVERY``-th consecutive park tries the full budget again. So a busy peer on a
    quiet machine is met by spinning (microsecond round trips), while a slow peer, or a
    machine so loaded that the peer is rarely on a core, stops costing a core per wait.
    """

    __slots__ = ("adaptive", "bell_fd", "live_fd", "max_spin_s", "misses", "poller", "spin_s")

    def __init__(
        self, bell_fd: int, live_fd: int | None, max_spin_s: float = 0.0, adaptive: bool = True
    ) -> None:
        self.bell_fd = bell_fd
        self.live_fd = live_fd
        self.max_spin_s = self.spin_s = max_spin_s
        self.adaptive = adaptive
        self.misses = 0
        self.poller = select.poll()
        self.poller.register(bell_fd, select.POLLIN)
        if live_fd is not None:
            self.poller.register(live_fd, select.POLLIN)

    def hit(self) -> None:
        """The wait ended while spinning: spinning pays off, use the full budget."""
        self.spin_s = self.max_spin_s
        self.misses = 0

    def miss(self) -> None:
        """The wait had to park: spin less next time (but probe now and then)."""
        if not self.adaptive:
            return
        self.misses += 1
        if self.misses % PROBE_EVERY == 0:
            self.spin_s = self.max_spin_s
        else:
            quarter = self.spin_s / 4
            self.spin_s = quarter if quarter >= _MIN_SPIN_S else 0.0

    def park(self, remaining: float | None) -> bool:
        """Sleep; True when the liveness fd fired or the bell hung up (peer gone)."""
        gone = False
        for fd, events in self.poller.poll(_poll_ms(remaining)):
            if fd == self.bell_fd:
                if events & select.POLLIN:
                    drain_bell(fd)
                # a hang-up: every writer of a pipe, or the peer of a socket, is gone (a
                # socket reports it with POLLIN too: its end of file is readable)
                if events & (select.POLLHUP | select.POLLERR):
                    gone = True
            else:
                gone = True
        return gone


def read_wait(
    ring: Any, waiter: Waiter, timeout: float | None, gone: Any, wake_fd: int = -1
) -> bytes | None:
    """Spin, then park, until a record arrives, ``gone()`` is true, or the timeout ends.

    ``spin_read`` tries at once, so callers need no ``try_read`` of their own first.
    ``gone`` is consulted before each park; it returns True when the peer has exited (the
    caller then drains what is committed and reports the error). Returns None on timeout
    or when the writer closed the ring and it is empty. With a ``wake_fd`` (the writer's
    space doorbell), a read that frees space for a parked writer rings it.
    """
    budget = waiter.spin_s if timeout is None else min(waiter.spin_s, timeout)
    data: bytes | None = ring.spin_read(budget, wake_fd)
    if data is not None:
        if budget > 0 and waiter.misses:  # a shrunken budget paid off: restore it
            waiter.hit()
        return data
    if timeout is not None and timeout <= 0:
        return None
    return read_parked(ring, waiter, timeout, gone, wake_fd)


def read_parked(
    ring: Any, waiter: Waiter, timeout: float | None, gone: Any, wake_fd: int = -1
) -> bytes | None:
    """The rest of `read_wait` once its spin found nothing: park until a record, ``gone()``,
    a closed ring or the timeout. Hot paths inline the spin and call this on a miss."""
    data: bytes | None = None
    deadline = None if timeout is None else _monotonic() + timeout
    waiter.miss()
    while data is None:
        if gone() or ring.writer_closed:
            last: bytes | None = ring.spin_read(0, wake_fd)
            return last
        remaining = None if deadline is None else deadline - _monotonic()
        if remaining is not None and remaining <= 0:
            return None
        ring.set_reader_waiting(True)
        data = ring.spin_read(0, wake_fd)
        if data is None:
            if waiter.park(remaining):
                gone(True)
            data = ring.spin_read(0, wake_fd)
        ring.set_reader_waiting(False)
    return data


def write_wait(ring: Any, data: bytes, waiter: Waiter, timeout: float | None, gone: Any) -> int:
    """Spin, then park, until ``data`` fits (returns the write code) or the timeout ends (0).

    Raises ``QueueClosedError`` through ``try_write`` when the reader has closed the ring;
    returns 0 early when ``gone()`` says the peer exited.
    """
    budget = waiter.spin_s if timeout is None else min(waiter.spin_s, timeout)
    result: int = ring.spin_write(data, budget)
    if result:
        if budget > 0:
            waiter.hit()
        return result
    if timeout is not None and timeout <= 0:
        return 0
    deadline = None if timeout is None else _monotonic() + timeout
    waiter.miss()
    while not result:
        if gone():
            return 0
        remaining = None if deadline is None else deadline - _monotonic()
        if remaining is not None and remaining <= 0:
            return 0
        ring.set_writer_waiting(True)
        result = ring.try_write(data)
        if not result:
            if waiter.park(remaining):
                gone(True)
            result = ring.try_write(data)
        ring.set_writer_waiting(False)
    return result
