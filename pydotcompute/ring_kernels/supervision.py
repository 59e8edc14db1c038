"""Supervision policy shared by the runtime and the tiers that restart actors.

Three small pieces, each pure policy (no tier mechanism):

- `RestartIntensity`: whether an actor that raised may be restarted, and after what pause.
  Erlang/Akka-style intensity: at most ``max_restarts`` restarts within any
  ``restart_window`` seconds (``max_restarts=None``: no limit; ``restart_window=None``:
  the whole life of the kernel, the behaviour before windows existed). Before each restart
  the supervisor waits a capped exponential backoff, ``restart_backoff * 2**(n-1)`` up to
  ``restart_backoff_max``, where ``n`` counts the restarts in a row that made no progress
  (the actor raised again before it finished another message). An actor that handles a
  message between failures restarts after the base pause again, so a service failing on
  one message in a hundred keeps its throughput, while a crash loop slows down.
- `BurstLog`: one log line for the first event of a burst, then one summary line per
  ``interval`` seconds (and one at the end, see `BurstLog.take_pending`), never a line
  per event: a restart storm or thousands of dropped replies must not bury everything
  else in the log.
- `stop_waves`: the order a runtime stops its kernels in: along ``connect`` edges, head to
  tail (a kernel is stopped once every kernel that forwards into it has stopped, so what
  they drain reaches it while it still runs). A cycle has no head: the kernel of the cycle
  launched first is stopped first, which breaks it deterministically.

Rejected: counting restarts per message class, or a fixed sleep between restarts (a crash
loop at a fixed pause still floods the log and the CPU; an unbounded exponential stalls a
service with sporadic failures for minutes).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

__all__ = ("BurstLog", "RestartIntensity", "stop_waves")

K = TypeVar("K", bound=Hashable)


class RestartIntensity:
    """The restart budget and backoff of one supervised actor (one replica of a pool).

    Not thread-safe: used from the loop (or thread) that supervises the actor.
    """

    __slots__ = (
        "_clock",
        "_in_a_row",
        "_times",
        "backoff",
        "backoff_max",
        "max_restarts",
        "window",
    )

    def __init__(
        self,
        max_restarts: int | None,
        window: float | None,
        backoff: float = 0.0,
        backoff_max: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.backoff_max = max(backoff, backoff_max)
        self._clock = clock
        self._times: deque[float] | None = None  # made at the first restart: an idle
        # actor keeps one budget, and an empty deque is over 600 bytes
        self._in_a_row = 0

    def next_restart(self, progressed: bool = True) -> float | None:
        """Record a failure; the pause before the restart, or None when the budget is spent.

        Args:
            progressed: The actor finished a message since its last restart (resets the
                backoff to its base).
        """
        now = self._clock()
        times = self._times
        if times is None:
            times = self._times = deque()
        window = self.window
        if window is not None:
            while times and now - times[0] > window:
                times.popleft()
        limit = self.max_restarts
        if limit is not None and len(times) >= limit:
            return None
        if limit is not None:  # unlimited restarts keep no timestamps
            times.append(now)
        self._in_a_row = 1 if progressed else self._in_a_row + 1
        if self.backoff <= 0:
            return 0.0
        return float(min(self.backoff_max, self.backoff * 2 ** (self._in_a_row - 1)))

    def describe(self) -> str:
        """``"3 within 5s"``, ``"3"`` (no window) or ``"unlimited"``."""
        if self.max_restarts is None:
            return "unlimited"
        if self.window is None:
            return str(self.max_restarts)
        return f"{self.max_restarts} within {self.window:g}s"


class BurstLog:
    """Rate-limited logging of one kind of event: the first line, then summaries.

    ``event(text)`` logs ``text`` when no line was written in the last ``interval``
    seconds, and otherwise only counts it; the next line written says how many were
    counted in between, and `take_pending` hands the rest to a closing summary.
    Not thread-safe: one loop or thread logs through it.
    """

    __slots__ = ("_clock", "_last", "_logger", "_pending", "_summary", "interval", "level")

    def __init__(
        self,
        logger: logging.Logger,
        level: int,
        summary: str,
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``summary`` is a format with one ``%d`` (the count of events not logged)."""
        self._logger = logger
        self.level = level
        self._summary = summary
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self._pending = 0

    def event(self, text: str, *args: Any) -> None:
        now = self._clock()
        last = self._last
        if last is not None and now - last < self.interval:
            self._pending += 1
            return
        self._last = now
        if self._pending:
            text += "; " + self._summary
            args = (*args, self._pending)
            self._pending = 0
        self._logger.log(self.level, text, *args)

    def take_pending(self) -> int:
        """How many events were counted since the last line (and forget them): the
        caller writes the closing summary in its own words."""
        pending, self._pending = self._pending, 0
        return pending


def stop_waves(kernels: Sequence[K], forwards_to: Callable[[K], K | None]) -> list[list[K]]:
    """The order to stop ``kernels`` in (listed in launch order), as waves that may stop in
    parallel: each wave holds the kernels no remaining kernel forwards into; when every
    remaining kernel is fed by another (a cycle), the one launched first goes alone."""
    todo = list(kernels)
    waves: list[list[K]] = []
    while todo:
        remaining = set(todo)
        fed = {t for t in (forwards_to(k) for k in todo) if t is not None and t in remaining}
        wave = [k for k in todo if k not in fed] or todo[:1]
        waves.append(wave)
        chosen = set(wave)
        todo = [k for k in todo if k not in chosen]
    return waves
