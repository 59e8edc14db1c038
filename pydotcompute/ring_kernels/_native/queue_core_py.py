"""The hot core of `FastMessageQueue` in pure Python: the twin of the compiled
``_native/fast_queue_core.pyx``, used when that extension is not built or
``PYDOTCOMPUTE_PUREPYTHON=1`` is set.

Design notes:
- The core holds what every message touches (the bands, the count and limit, the waiters,
  the decoder, the owning loop) and the calls of every hop: ``_append`` (and ``offer``,
  which appends only when there is room), ``take`` and ``park_getter``, with ``qsize``
  the count they keep. Everything else (backpressure, close, statistics, timeouts) lives
  in `FastMessageQueue`, which subclasses whichever core is in use and supplies the hooks
  below; the two cores have the same attributes, methods and results.
- The per-hop calls are public because the actor's inlined fast paths (``KernelContext``,
  ``RingKernel``) make them on other objects; the older private spellings (``_offer``,
  ``_pop``, ``_park_getter``) are the same functions under a second name, not wrappers.
- The priority band table lives here so the queue module and this twin share one table;
  the compiled core computes the same bands arithmetically (a test compares all 256).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

__all__ = ("BAND_OF", "NO_BANDS", "QueueCore", "wake_one")

#: priority (0..255) -> band: SYSTEM 224+, HIGH 160+, NORMAL 64+, LOW below. A dict, not a
#: tuple: a negative priority must miss instead of indexing from the end.
BAND_OF: dict[int, int] = {
    p: 0 if p >= 224 else 1 if p >= 160 else 2 if p >= 64 else 3 for p in range(256)
}
#: the bands of a queue that never held a message: one shared tuple, no lists
NO_BANDS: tuple[None, ...] = (None, None, None, None)

_get_running_loop = asyncio.get_running_loop


def wake_one(waiters: deque[asyncio.Future[None]]) -> None:
    """Complete the longest-waiting future that is still pending, if any."""
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return


class QueueCore:
    """The per-message state and calls of a `FastMessageQueue` (pure Python).

    Subclasses supply the hooks `_band_of`, `_not_a_message` and `_closed_error`.
    """

    __slots__ = (
        "_bands",
        "_closed",
        "_count",
        "_decode",
        "_dequeued",
        "_getters",
        "_limit",
        "_loop",
        "_peak",
        "_putters",
        "_serialize",
    )

    _bands: list[deque[Any] | None] | tuple[None, ...]
    _closed: bool
    _count: int
    _decode: Any
    _dequeued: int
    _getters: deque[asyncio.Future[None]] | None
    _limit: int
    _loop: asyncio.AbstractEventLoop | None
    _peak: int
    _putters: deque[asyncio.Future[None]] | None
    _serialize: bool

    if TYPE_CHECKING:  # at run time, the ``_count`` slot itself (set after the class)

        @property
        def qsize(self) -> int:
            """How many messages are queued (read-only; the hot paths test it per message)."""
            return self._count

    # -- hooks (FastMessageQueue) -------------------------------------------------------

    def _band_of(self, item: Any) -> int:
        """The band of an item without a valid ``priority`` attribute (the slow path)."""
        raise NotImplementedError

    def _not_a_message(self, item: Any) -> Exception:
        raise NotImplementedError

    def _closed_error(self) -> BaseException:
        raise NotImplementedError

    # -- every message ------------------------------------------------------------------

    def _append(self, item: Any) -> None:
        """Enqueue ``item`` in its band (no capacity check) and wake one getter."""
        try:
            band = BAND_OF[item.priority]
        except (AttributeError, KeyError, TypeError):
            band = self._band_of(item)
        if self._serialize and type(item) is not bytes:
            try:
                item = item.serialize()
            except AttributeError:
                if hasattr(item, "serialize"):
                    raise  # raised inside a message's own serialize
                raise self._not_a_message(item) from None
        d = self._bands[band]
        if d is None:
            d = self._new_band(band)
        d.append(item)
        n = self._count + 1
        self._count = n
        if n > self._peak:
            self._peak = n
        getters = self._getters
        if getters:  # wake the longest waiter (``wake_one``, first round inlined)
            fut = getters.popleft()
            if fut.done():
                wake_one(getters)
            else:
                fut.set_result(None)

    def offer(self, item: Any) -> bool:
        """Enqueue ``item`` when the queue is open with room (True), else do nothing (False).

        The non-waiting half of a put: the caller applies backpressure and close rules
        when this returns False.
        """
        if self._count < self._limit:
            self._append(item)
            return True
        return False

    _offer = offer

    def _new_band(self, band: int) -> deque[Any]:
        bands = self._bands
        if type(bands) is not list:
            bands = self._bands = [None, None, None, None]
        d: deque[Any] = deque()
        bands[band] = d
        return d

    def take(self) -> Any:
        """Dequeue the first item of the highest non-empty band (the caller checked
        `qsize`), wake one putter, and decode a frame of a serializing queue."""
        b = self._bands
        item = (b[0] or b[1] or b[2] or b[3]).popleft()  # type: ignore[union-attr]
        self._count -= 1
        self._dequeued += 1
        putters = self._putters
        if putters:
            fut = putters.popleft()
            if fut.done():
                wake_one(putters)
            else:
                fut.set_result(None)
        if self._decode is not None:
            return self._decode(item)
        return item

    _pop = take

    def park_getter(self) -> asyncio.Future[None]:
        """The empty queue's next wait: a future the next put (or ``close``) completes.

        Raises the close reason instead when the queue is closed. Callers that wait
        inline (the actor's ``receive``) await the future, call ``unpark_getter`` if
        that await raises, and re-check `qsize` when it returns.
        """
        if self._closed:
            raise self._closed_error()
        loop = self._loop
        if loop is None:
            loop = self._bind_loop()
        fut: asyncio.Future[None] = loop.create_future()
        getters = self._getters
        if getters is None:
            getters = self._getters = deque()
        getters.append(fut)
        return fut

    _park_getter = park_getter

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, which owns this queue from its first wait on (as with
        ``asyncio.Queue``; a wait from another loop then raises ``RuntimeError``)."""
        loop = self._loop = _get_running_loop()
        return loop


# ``qsize`` is the ``_count`` slot's own descriptor under a public name: reading it costs
# what reading ``_count`` does, where a property would add a Python call per message
setattr(QueueCore, "qsize", vars(QueueCore)["_count"])  # noqa: B010
