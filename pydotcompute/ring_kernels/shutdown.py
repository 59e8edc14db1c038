"""What a runtime shutdown reports, and Ctrl-C while it runs.

`ShutdownReport` is what ``runtime.shutdown()`` returns (and keeps as
``runtime.shutdown_report``, for a shutdown that ``async with`` ran): a dict of the
messages each kernel lost, with the figures behind it and the replies still unread.

`held_interrupts` holds SIGINT while a shutdown runs on the main thread: an interrupt then
makes the shutdown stop every kernel at once (no more draining) instead of breaking it
off, and is passed on to the handler it was meant for once every message is accounted for.

Design notes:
- The report stays a ``dict[str, int]`` (kernel id -> messages lost, ``{}`` when none):
  code written against the older plain dict keeps working, and the new figures are
  attributes. Unread replies are not in the dict: they are not lost (they stay readable
  until the kernel is removed), but a program that exits without reading them loses them,
  so they are reported beside it and logged.
- Why hold SIGINT instead of letting a second Ctrl-C through: under ``asyncio.run`` the
  second one raises ``KeyboardInterrupt`` wherever the loop happens to be, and the runner
  then cancels the shutdown half-way; the kernels it had not reached yet never close their
  books, so their queued messages were neither delivered, handed back nor counted. Only
  the default handler and ``asyncio.Runner``'s are replaced: a handler of the program's
  own stays in charge (and with it, what a second Ctrl-C does).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ("ShutdownReport", "held_interrupts")


class ShutdownReport(dict[str, int]):
    """Kernel id -> messages the shutdown could not deliver (only kernels that lost any).

    Each count adds a kernel's handed-back messages (`undelivered`) and the messages it
    dropped while the shutdown ran (`dropped`: mostly replies whose destination was gone,
    reason ``reply_lost``); ``-1`` marks a kernel whose terminate raised or did not finish.
    An empty report means nothing was lost.

    Attributes:
        undelivered: Kernel id -> length of ``kernel.undelivered`` (handed back by the
            shutdown, or by an earlier failure), for kernels with any.
        dropped: Kernel id -> messages dropped while the shutdown ran, other than the
            handed-back ones (each counted once in ``messages_dropped`` too).
        unread: Kernel id -> replies still waiting in its outbox, not lost: readable with
            ``runtime.take_unread(id)`` (or ``receive``) until the kernel is removed or its
            id launched again; gone when the program exits.
        interrupted: A Ctrl-C (or a cancellation of the task running the shutdown) cut
            the draining short: every kernel still running was stopped at once.
    """

    def __init__(
        self,
        lost: dict[str, int] | None = None,
        *,
        undelivered: dict[str, int] | None = None,
        dropped: dict[str, int] | None = None,
        unread: dict[str, int] | None = None,
        interrupted: bool = False,
    ) -> None:
        super().__init__(lost or {})
        self.undelivered: dict[str, int] = dict(undelivered or {})
        self.dropped: dict[str, int] = dict(dropped or {})
        self.unread: dict[str, int] = dict(unread or {})
        self.interrupted = interrupted

    @property
    def lost(self) -> int:
        """Every message lost, over all kernels (kernels marked ``-1`` not included)."""
        return sum(n for n in self.values() if n > 0)

    @property
    def unread_total(self) -> int:
        """Every reply left unread, over all kernels."""
        return sum(self.unread.values())

    def __repr__(self) -> str:
        extra = "".join(
            f", {name}={value!r}"
            for name, value in (
                ("undelivered", self.undelivered),
                ("dropped", self.dropped),
                ("unread", self.unread),
            )
            if value
        )
        if self.interrupted:
            extra += ", interrupted=True"
        return f"ShutdownReport({dict(self)!r}{extra})"


# -- Ctrl-C during a shutdown -----------------------------------------------------------------

# Module state, touched on the main thread only: the shutdowns under way (each told of an
# interrupt through its loop), the handler ours replaced, and the interrupts held.
_waiting: dict[object, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}
_replaced: list[Any] = []  # [the previous handler] while ours is installed
_held = [0]


def _ours(signum: int, frame: Any) -> None:
    """The SIGINT handler while a shutdown runs: hold the interrupt, tell each shutdown."""
    _held[0] += 1
    for loop, on_interrupt in list(_waiting.values()):
        with contextlib.suppress(RuntimeError):  # a loop closed meanwhile
            loop.call_soon_threadsafe(on_interrupt)


def _replaceable(handler: Any) -> bool:
    """The default SIGINT handler, or the one ``asyncio.Runner`` installs (a partial of its
    ``_on_sigint``): those whose second Ctrl-C would break a shutdown off."""
    if handler is signal.default_int_handler:
        return True
    func = getattr(handler, "func", None)
    return getattr(func, "__name__", None) == "_on_sigint" and isinstance(
        getattr(func, "__self__", None), asyncio.Runner
    )


@contextlib.contextmanager
def held_interrupts(on_interrupt: Callable[[], None]) -> Iterator[None]:
    """Hold SIGINT for the duration of the block (a shutdown on the main thread).

    Each interrupt calls ``on_interrupt`` on the running loop. On leaving, the handler
    that was replaced is put back, and if any interrupt was held it is passed on to it
    once, as if it had just come (under ``asyncio.run``: the main task is cancelled, or
    ``KeyboardInterrupt`` raised if it was already). Off the main thread, or with a
    SIGINT handler of the program's own, the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    token = object()
    if not _waiting:
        try:
            current = signal.getsignal(signal.SIGINT)
            if not _replaceable(current):
                yield
                return
            signal.signal(signal.SIGINT, _ours)
        except (ValueError, OSError):  # not the main interpreter, say
            yield
            return
        _replaced[:] = [current]
        _held[0] = 0
    _waiting[token] = (asyncio.get_running_loop(), on_interrupt)
    try:
        yield
    finally:
        del _waiting[token]
        if not _waiting and _replaced:
            previous = _replaced.pop()
            held, _held[0] = _held[0], 0
            if signal.getsignal(signal.SIGINT) is _ours:
                signal.signal(signal.SIGINT, previous)
            if held and callable(previous):
                previous(signal.SIGINT, None)
