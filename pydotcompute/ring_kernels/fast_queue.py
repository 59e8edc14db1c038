"""FastMessageQueue: the four-band asyncio inbox/outbox every tier-1 actor uses.

Design notes:
- Four FIFO ``deque`` bands (SYSTEM, HIGH, NORMAL, LOW), created on first use so an idle
  actor's queues cost a few hundred bytes; ``put`` is an O(1) table lookup plus an append,
  ``get`` scans at most four bands. A heap was rejected: O(log n) and a tie-breaking counter
  per message.
- Waiting follows ``asyncio.Queue``: a blocked getter parks on a future and is woken by the
  next put, then re-checks. Handing the item straight to the waiter was rejected because a
  getter cancelled after the hand-off would lose the message.
- Blocked putters are admitted by priority band, FIFO within a band: each parks at the end
  of its band's stretch of the ``_putters`` deque, which stays sorted, so ``take`` still
  wakes the deque's head (the core is unchanged, and a put that finds room does no extra
  work). The place is found from both ends at once (at most the shorter stretch is
  walked; O(1) for one band). One deque per band in the core was rejected: every pop
  would scan the bands. A putter that was woken but lost the slot to a put that found
  room goes back to the head of its band.
- ``close()`` makes the queue refuse puts while getters drain what is left; once empty,
  getters raise the close reason (``QueueClosedError`` or the actor's failure). This is how
  shutdown wakes actors parked in ``receive()`` without a timeout.
- Not thread-safe: one event loop owns a queue (other tiers have their own queues). As with
  ``asyncio.Queue``, the loop of the first wait is kept: on Python 3.11 looking up the
  running loop costs as much as making the waiter future, twice per round trip.
- The calls every message makes (``_append``, ``take``, ``park_getter``) and the state they
  touch are the queue's core, compiled (``_native/fast_queue_core.pyx``) or its Python twin
  (``_native.queue_core_py``); this class adds everything else. Compiled, an append plus a pop
  costs about half as much.
- Hot-path shape (the runtime and ``KernelContext`` call ``offer``/``take`` directly, after
  testing ``qsize``): "open, with room" is one comparison, ``_count < _limit`` (``_limit``
  is the capacity, ``sys.maxsize`` when unbounded, 0 once closed), which ``offer`` makes
  before it appends; ``total_enqueued`` is derived from the
  other counters instead of counted; an idle queue shares one empty band tuple. Callers
  that wait inline (the actor's ``receive``) park with ``park_getter`` and clean up with
  ``unpark_getter``, so a wake-up resumes one coroutine frame less. A reusable waiter
  future per queue was rejected: an asyncio future cannot be re-armed once done, and a
  hand-rolled awaitable would lose the C task's fast path for futures.
- ``serialize=True`` stores each message's bytes. Bytes put as they are (a frame made
  elsewhere) go in the band of the priority in their header, read without decoding the
  frame; bytes that are not a frame are refused then, not when the actor takes them. A
  frame the queue throws away unread (``drop_oldest``, ``clear``) releases the arrays an
  `ArrayMessage` pinned in the buffer registry:
  only decoding would have released them.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from heapq import heapify as _heapify
from heapq import heappop as _heappop
from heapq import heappush as _heappush
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..exceptions import (
    InvalidConfigurationError,
    QueueClosedError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from ._native import queue_core_py as _queue_core_py
from ._native import queue_extension
from ._native.queue_core_py import BAND_OF as _BAND_OF
from ._native.queue_core_py import NO_BANDS as _NO_BANDS
from ._native.queue_core_py import wake_one as _wake_one
from .message import frame_priority, get_buffer_registry, release_frame

_buffers = get_buffer_registry()

__all__ = (
    "BackpressureStrategy",
    "FastMessageQueue",
    "PriorityBand",
    "QueueStats",
    "RingBuffer",
    "get_priority_band",
    "wait_until",
)

T = TypeVar("T")
_UNBOUNDED = sys.maxsize


class PriorityBand(enum.IntEnum):
    """Priority bands, served strictly in this order (lower value first)."""

    SYSTEM = 0  # priority 224..255
    HIGH = 1  # 160..223
    NORMAL = 2  # 64..159
    LOW = 3  # 0..63


class BackpressureStrategy(enum.StrEnum):
    """What a full bounded queue does with one more message."""

    BLOCK = "block"  # wait for space (honouring the timeout)
    REJECT = "reject"  # raise QueueFullError
    DROP_OLDEST = "drop_oldest"  # drop the oldest message of the lowest band; count it

    @classmethod
    def parse(cls, value: BackpressureStrategy | str) -> BackpressureStrategy:
        if value is cls.BLOCK or value == "block":
            return cls.BLOCK
        try:
            return cls(value.value if isinstance(value, cls) else str(value).lower())
        except ValueError:
            raise InvalidConfigurationError(
                f"unknown backpressure strategy {value!r}; choose one of {[s.value for s in cls]}"
            ) from None


_STRATEGIES: dict[str, BackpressureStrategy] = {s.value: s for s in BackpressureStrategy}


def get_priority_band(priority: int) -> PriorityBand:
    """The band of a 0..255 priority."""
    if not 0 <= priority <= 255:
        raise ValueError(f"priority must be in 0..255, got {priority!r}")
    return PriorityBand(_BAND_OF[priority])


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of a queue's counters (``queue.statistics()``)."""

    max_size: int
    current_size: int
    peak_size: int
    total_enqueued: int
    total_dequeued: int
    total_dropped: int
    band_counts: tuple[int, int, int, int]
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_size": self.max_size,
            "current_size": self.current_size,
            "peak_size": self.peak_size,
            "total_enqueued": self.total_enqueued,
            "total_dequeued": self.total_dequeued,
            "total_dropped": self.total_dropped,
            "band_counts": {b.name: self.band_counts[b] for b in PriorityBand},
            "closed": self.closed,
        }


def _priority_of(item: object) -> int:
    p = getattr(item, "priority", 128)
    if type(p) is not int or not 0 <= p <= 255:
        raise ValueError(f"message priority must be an int in 0..255, got {p!r}")
    return p


def _discard(items: Iterable[Any]) -> None:
    """Messages thrown away unread: frames among them give back the arrays they pinned."""
    if not len(_buffers):  # nothing pinned: no frame can hold a reference
        return
    for item in items:
        if type(item) is bytes:
            release_frame(item)


#: (public name, older private name) of the calls the actor's inlined paths make
_HOP_NAMES: tuple[tuple[str, str], ...] = (
    ("offer", "_offer"),
    ("take", "_pop"),
    ("park_getter", "_park_getter"),
    ("unpark_getter", "_unpark_getter"),
    ("take_within", "_get_slow"),
)

_core = queue_extension()
if TYPE_CHECKING:  # both cores have the twin's attributes and signatures
    _QueueCore = _queue_core_py.QueueCore
else:
    _QueueCore = _core.QueueCore if _core is not None else _queue_core_py.QueueCore


class FastMessageQueue(_QueueCore, Generic[T]):
    """Bounded four-band priority queue for one event loop.

    Args:
        maxsize: Capacity; ``0`` means unbounded.
        kernel_id: The owning kernel, used in error messages.
        serialize: Store MessagePack bytes instead of objects (decoded again on ``get``).
            Such a queue takes ``@message`` instances or the bytes of one: bytes go in the
            band of the priority in their header, and bytes that are not a message frame
            raise ``MessageDeserializationError`` on put; anything else raises
            ``TypeValidationError``.
        backpressure: ``block`` (default), ``reject`` or ``drop_oldest``.
        expect: With ``serialize``, the class every decoded message must be (a kernel's
            declared type): a frame of another class raises
            ``MessageDeserializationError`` when taken, as a frame that does not decode.

    Like ``asyncio.Queue``, a queue belongs to the event loop of its first wait: waiting on
    it from another loop raises ``RuntimeError``.

    Messages dropped by ``drop_oldest`` or ``clear`` are counted in ``total_dropped``; a
    dropped `ArrayMessage` frame releases the
    arrays it pinned in the buffer registry, and so do the frames still queued when the
    queue itself is garbage-collected.
    """

    # the per-message state (bands, counts, waiters, decoder, loop) is the core's
    __slots__ = (
        "_close_exc",
        "_dropped",
        "_maxsize",
        "_putter_bands",
        "_removed",
        "_strategy",
        "kernel_id",
        "on_drop",
        "on_drop_item",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Keep each per-hop call one method under two names: a subclass that overrides
        the public name (``take``) is also reached through the older private one
        (``_pop``), and one written against the private name through the public one."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        for public, older in _HOP_NAMES:
            if older in own and public not in own:
                setattr(cls, public, own[older])
            elif public in own and older not in own:
                setattr(cls, older, own[public])

    def __init__(
        self,
        maxsize: int = 4096,
        *,
        kernel_id: str = "",
        serialize: bool = False,
        backpressure: BackpressureStrategy | str = BackpressureStrategy.BLOCK,
        expect: type | None = None,
    ) -> None:
        if type(maxsize) is not int or maxsize < 0:
            raise InvalidConfigurationError(
                f"queue maxsize must be an int >= 0 (0 = unbounded), got {maxsize!r}"
            )
        self._maxsize = maxsize
        # the hot paths' one test "may append without waiting": ``_count < _limit``
        # (the capacity, unbounded as sys.maxsize; 0 once closed)
        self._limit = maxsize or _UNBOUNDED
        self.kernel_id = kernel_id
        self._serialize = serialize
        self._decode: Any = None
        if serialize:
            from .message import expecting, message_decoder

            self._decode = expecting(message_decoder(), expect, kernel_id)
        strategy = _STRATEGIES.get(backpressure) if type(backpressure) is str else None
        self._strategy = (
            backpressure
            if type(backpressure) is BackpressureStrategy
            else strategy or BackpressureStrategy.parse(backpressure)
        )
        # a shared empty tuple until the first put: an idle queue owns no band list
        self._bands: list[deque[Any] | None] | tuple[None, ...] = _NO_BANDS
        self._count = 0
        self._peak = 0
        self._removed = 0  # taken out without being dequeued (drop_oldest, clear)
        self._dequeued = 0
        self._dropped = 0
        self._getters: deque[asyncio.Future[None]] | None = None
        self._putters: deque[asyncio.Future[None]] | None = None
        # the band of each parked putter (only while senders are blocked)
        self._putter_bands: dict[asyncio.Future[None], int] = {}
        self._closed = False
        self._close_exc: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # bound by the first wait
        #: Called with 1 for every message ``drop_oldest`` drops (a kernel counts them).
        self.on_drop: Callable[[int], None] | None = None
        #: Called with each message ``drop_oldest`` drops, as it was queued (bytes on a
        #: ``serialize=True`` queue): a tracing runtime lets go of its trace context.
        self.on_drop_item: Callable[[Any], None] | None = None

    def __del__(self) -> None:
        # a serializing queue thrown away with frames in it (a runtime discarded with
        # unread ArrayMessage replies): their arrays would stay pinned in the process-wide
        # registry for good. getattr: a constructor that raised left the slots unset
        if getattr(self, "_serialize", False) and self._count:
            self._discard_queued()

    # -- properties ---------------------------------------------------------------------

    @property
    def maxsize(self) -> int:
        return self._maxsize

    # ``qsize`` (how many are queued) is the core's: the hot paths test it per message

    @property
    def empty(self) -> bool:
        return self._count == 0

    @property
    def full(self) -> bool:
        return 0 < self._maxsize <= self._count

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def backpressure(self) -> BackpressureStrategy:
        return self._strategy

    def __len__(self) -> int:
        return self._count

    @property
    def parked_getters(self) -> int:
        """How many getters wait on this empty queue (parked, not yet woken or cancelled)."""
        getters = self._getters
        return 0 if not getters else sum(1 for fut in getters if not fut.done())

    # -- internals ----------------------------------------------------------------------

    def _describe(self) -> str:
        return f"queue of kernel {self.kernel_id!r}" if self.kernel_id else "queue"

    def _closed_error(self) -> BaseException:
        if self._close_exc is not None:
            return self._close_exc
        return QueueClosedError(f"{self._describe()} is closed")

    def _discard_queued(self) -> None:
        """Everything queued is thrown away unread: frames give back what they pinned."""
        _discard(x for d in self._bands if d for x in d)

    def _band_of(self, item: Any) -> int:
        """The band of an item without a valid ``priority`` attribute (the slow path)."""
        try:
            return _BAND_OF[item.priority]
        except (AttributeError, KeyError, TypeError):
            pass
        if self._serialize and type(item) is bytes:  # a frame: its header says
            return _BAND_OF[frame_priority(item)]
        return _BAND_OF[_priority_of(item)]

    def _not_a_message(self, item: Any) -> TypeValidationError:
        return TypeValidationError(
            f"{self._describe()} serializes its messages (serialize=True) and takes @message "
            f"instances or their bytes; got {type(item).__name__}. Decorate the class with "
            "@message, or launch without serialize=True to pass plain objects"
        )

    def _drop_oldest(self) -> None:
        for d in reversed(self._bands):
            if d:
                item = d.popleft()
                self._count -= 1
                self._dropped += 1
                self._removed += 1
                _discard((item,))
                if self.on_drop is not None:
                    self.on_drop(1)
                if self.on_drop_item is not None:
                    self.on_drop_item(item)
                return

    def evict_oldest(self) -> None:
        """Drop (and count, through ``on_drop``) the oldest message of the lowest band,
        as ``drop_oldest`` does for a full queue, whatever this queue's own strategy: for
        an owner whose queue blocks one kind of sender and applies another policy to
        another (a Ray actor's inbox: the driver's batches wait, a direct edge's are
        evicted under the consumer's ``drop_oldest``). A no-op on an empty queue."""
        self._drop_oldest()

    def put_overflow(self, item: T) -> None:
        """Enqueue beyond the bound and even when closed (never waits, never drops).

        For an owner that must keep an item readable rather than lose it: a reply produced
        before its kernel stopped, say. Getters still drain it before the close reason.
        """
        self._append(item)

    def _full_error(self) -> QueueFullError:
        """The refusal of a full queue, with the advice its own policy leaves: under
        ``block`` only a hand-over that cannot wait is refused (``send_nowait``, a reply
        delivered as its kernel stops), so choosing ``block`` is no advice there."""
        full = f"{self._describe()} is full ({self._count}/{self._maxsize} messages)"
        if self._strategy is BackpressureStrategy.BLOCK:
            return QueueFullError(
                f"{full}; its backpressure is 'block', but this hand-over cannot wait for "
                "room (send_nowait, or a reply delivered while its sender stops): receive "
                "faster, raise queue_size, or choose backpressure='drop_oldest' to make room "
                "by dropping the oldest message"
            )
        return QueueFullError(
            f"{full} and its backpressure is {self._strategy.value!r}; receive faster, raise "
            "queue_size, or choose backpressure='block' or 'drop_oldest'"
        )

    # -- put ----------------------------------------------------------------------------

    def put_nowait(self, item: T) -> bool:
        """Enqueue without waiting.

        Returns:
            True when enqueued. With ``drop_oldest`` a full queue drops (and counts) its
            oldest lowest-band message first and still returns True.

        Raises:
            QueueFullError: the queue is full and the strategy is ``block`` or ``reject``.
            QueueClosedError: the queue is closed.
        """
        if self.offer(item):  # open, with room: appended
            return True
        if self._closed:
            raise self._closed_error()
        if self._strategy is BackpressureStrategy.DROP_OLDEST:
            self._drop_oldest()
        else:
            raise self._full_error()
        self._append(item)
        return True

    async def put(self, item: T, *, timeout: float | None = None) -> bool:
        """Enqueue, applying the backpressure strategy when full.

        With ``block`` this waits for space (up to ``timeout`` seconds, then
        ``QueueTimeoutError``); ``reject`` raises ``QueueFullError``; ``drop_oldest`` drops
        and counts the oldest lowest-band message. Blocked puts are admitted by the
        priority band of their item (a SYSTEM or HIGH message overtakes blocked NORMAL
        ones), FIFO within a band; a put that finds room goes in at once.
        """
        if self.offer(item):  # open, with room: appended
            return True
        if self._closed:
            raise self._closed_error()
        if self._strategy is not BackpressureStrategy.BLOCK:
            return self.put_nowait(item)
        try:
            band = _BAND_OF[item.priority]  # type: ignore[attr-defined]
        except (AttributeError, KeyError, TypeError):
            band = self._band_of(item)
        await self._wait_for_space(timeout, band)
        self._append(item)
        return True

    async def _wait_for_space(self, timeout: float | None, band: int = 2) -> None:
        loop = self._loop or self._bind_loop()
        deadline = None if timeout is None else loop.time() + timeout
        bands = self._putter_bands
        woken = False
        while self._maxsize and self._count >= self._maxsize:
            if self._closed:
                raise self._closed_error()
            if self._putters is None:
                self._putters = deque()
            putters = self._putters
            fut = loop.create_future()
            putters.insert(_putter_place(putters, bands, band, woken), fut)
            bands[fut] = band
            try:
                await wait_until(fut, deadline, loop)
            except TimeoutError:
                _forget(putters, fut, False)
                raise QueueTimeoutError(
                    f"timed out after {timeout}s waiting for space in {self._describe()} "
                    f"({self._count}/{self._maxsize} messages)"
                ) from None
            except BaseException:
                _forget(putters, fut, self._count < self._maxsize)
                raise
            finally:
                del bands[fut]
            woken = True
        if self._closed:
            raise self._closed_error()

    def put_batch(self, items: Iterable[T]) -> int:
        """Enqueue as many items as fit without waiting; returns how many were enqueued.

        With ``drop_oldest`` every item is enqueued (older ones dropped and counted).
        """
        if self._closed:
            raise self._closed_error()
        n = 0
        for item in items:
            if self._maxsize and self._count >= self._maxsize:
                if self._strategy is not BackpressureStrategy.DROP_OLDEST:
                    break
                self._drop_oldest()
            self._append(item)
            n += 1
        return n

    # -- get ----------------------------------------------------------------------------

    def get_nowait(self) -> T | None:
        """Dequeue the next message, or None when empty (raises if closed and drained)."""
        if self._count:
            return self.take()  # type: ignore[no-any-return]
        if self._closed:
            raise self._closed_error()
        return None

    async def get(self, *, timeout: float | None = None) -> T:
        """Dequeue the next message, waiting up to ``timeout`` seconds.

        Raises:
            QueueTimeoutError: nothing arrived in time.
            QueueClosedError: the queue was closed and is drained (or the close reason).
        """
        if self._count:
            return self.take()  # type: ignore[no-any-return]
        if timeout is not None:
            return await self.take_within(timeout)
        while True:  # ``take_within(None)``, inlined: one coroutine frame less per wake-up
            fut = self.park_getter()
            try:
                await fut
            except BaseException:
                self.unpark_getter(fut)
                raise
            if self._count:
                return self.take()  # type: ignore[no-any-return]

    def unpark_getter(self, fut: asyncio.Future[None]) -> None:
        """Clean up a wait from `park_getter` that was abandoned (its await raised:
        cancelled, say); a wake-up it got moves on to the next getter."""
        _forget(self._getters, fut, self._count > 0)  # type: ignore[arg-type]

    async def take_within(self, timeout: float | None) -> T:
        """Wait up to ``timeout`` seconds (None: without limit) for a message and take it:
        `get` once the queue was found empty.

        Raises:
            QueueTimeoutError: nothing arrived in time.
            QueueClosedError: the queue was closed and is drained (or the close reason).
        """
        loop = self._loop or self._bind_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._count:
            if self._closed:
                raise self._closed_error()
            if self._getters is None:
                self._getters = deque()
            fut = loop.create_future()
            self._getters.append(fut)
            try:
                if deadline is None:
                    await fut
                else:
                    await wait_until(fut, deadline, loop)
            except TimeoutError:
                _forget(self._getters, fut, False)
                raise QueueTimeoutError(
                    f"no message arrived within {timeout}s on {self._describe()}"
                ) from None
            except BaseException:
                _forget(self._getters, fut, self._count > 0)
                raise
        return self.take()  # type: ignore[no-any-return]

    # the older names of the calls the actor's inlined paths make
    _unpark_getter = unpark_getter
    _get_slow = take_within

    def get_batch(self, max_count: int) -> list[T]:
        """Dequeue up to ``max_count`` messages in priority order without waiting."""
        out: list[T] = []
        while self._count and len(out) < max_count:
            out.append(self.take())
        return out

    # -- lifecycle ----------------------------------------------------------------------

    def close(self, exc: BaseException | None = None) -> None:
        """Refuse further puts; getters drain what is queued, then raise ``exc``.

        Idempotent; a later call may set a more specific reason.
        """
        if exc is not None:
            self._close_exc = exc
        self._closed = True
        self._limit = 0
        for waiters in (self._getters, self._putters):
            while waiters:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_result(None)

    def clear(self) -> int:
        """Remove every queued message; returns how many (counted as dropped).

        Dropped `ArrayMessage` frames release
        the arrays they pinned in the buffer registry.
        """
        n = self._count
        self._discard_queued()
        self._bands = _NO_BANDS
        self._count = 0
        self._dropped += n
        self._removed += n
        putters = self._putters
        while putters:
            _wake_one(putters)
        return n

    def drain(self) -> list[T]:
        """Remove and return every queued message (not counted as dropped)."""
        out = self.get_batch(self._count)
        return out

    def count_dropped(self, n: int) -> None:
        """Add ``n`` to the dropped counter (messages discarded by the owner)."""
        self._dropped += n

    def statistics(self) -> QueueStats:
        """A frozen snapshot of the counters."""
        bands = self._bands
        return QueueStats(
            max_size=self._maxsize,
            current_size=self._count,
            peak_size=self._peak,
            total_enqueued=self._dequeued + self._count + self._removed,
            total_dequeued=self._dequeued,
            total_dropped=self._dropped,
            band_counts=tuple(len(d) if d else 0 for d in bands),  # type: ignore[arg-type]
            closed=self._closed,
        )

    def get_stats(self) -> dict[str, Any]:
        """The counters as a dict (keys as in `QueueStats`)."""
        return self.statistics().to_dict()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} kernel={self.kernel_id!r} size={self._count}/"
            f"{self._maxsize} closed={self._closed}>"
        )


# --- shared waiting helpers ------------------------------------------------------------------


def _forget(waiters: deque[asyncio.Future[None]], fut: asyncio.Future[None], pass_on: bool) -> None:
    """Clean up after an abandoned wait; a wake-up we received but will not use moves on."""
    woken = fut.done() and not fut.cancelled()
    fut.cancel()
    try:
        waiters.remove(fut)
    except ValueError:
        pass
    if woken and pass_on:
        _wake_one(waiters)


def _putter_place(
    putters: deque[asyncio.Future[None]],
    bands: dict[asyncio.Future[None], int],
    band: int,
    first: bool,
) -> int:
    """Where a putter of ``band`` parks in ``putters`` (sorted by band, lowest first): after
    every putter of a higher priority band, and after (``first``: before) those of its own.

    Walks from both ends at once, so it looks at no more putters than the shorter of the
    two stretches it separates: O(1) while every blocked sender is in one band.
    """
    n = len(putters)
    if not n:
        return 0
    # "goes before x": x's band is lower in priority (or, for ``first``, the same)
    if first:

        def before(x: asyncio.Future[None]) -> bool:
            return bands.get(x, 3) >= band
    else:

        def before(x: asyncio.Future[None]) -> bool:
            return bands.get(x, 3) > band

    i, j = 0, n
    for head, tail in zip(putters, reversed(putters), strict=True):
        if before(head):
            return i
        if not before(tail):
            return j
        i += 1
        j -= 1
    return i


async def wait_until(
    fut: asyncio.Future[Any], deadline: float | None, loop: asyncio.AbstractEventLoop
) -> Any:
    """Await ``fut`` and return its result; past ``deadline`` (``loop.time()``; None: no
    limit) the future fails with TimeoutError instead (cancelled, if the deadline has
    already passed). Not an ``asyncio.timeout`` scope: no task cancel and uncancel, and a
    cancellation from outside cancels ``fut`` as any await. The deadline joins the loop's
    `_Deadlines` (one timer for every wait on the loop), not a timer of its own."""
    if deadline is None:
        return await fut
    if deadline <= loop.time():
        fut.cancel()
        raise TimeoutError
    loop_ref, deadlines_ref = _last_deadlines  # (`_deadlines_of`'s first look, inlined)
    deadlines = deadlines_ref() if loop_ref() is loop else None
    if deadlines is None:
        deadlines = _deadlines_of(loop)
    if deadlines is None:  # a loop that cannot be referenced weakly: a timer per wait
        handle = loop.call_at(deadline, _expire, fut)
        try:
            return await fut
        finally:
            handle.cancel()
    # (`_Deadlines.add`, inlined: this is every timed round trip's path)
    key = next(_deadline_keys)
    waiting = deadlines.waiting
    waiting[key] = fut
    heap = deadlines.heap
    _heappush(heap, (deadline, key))
    if deadline < deadlines.armed or len(heap) > 2 * len(waiting) + 64:
        deadlines.tend(deadline, loop)
    try:
        return await fut
    finally:
        waiting.pop(key, None)


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


_INF = float("inf")


class _Deadlines:
    """The deadlines of every `wait_until` on one event loop, behind one loop timer.

    A timer per wait was the cost of a round trip with a timeout: on uvloop making one and
    cancelling it costs about 10,000 instructions, and closing the cancelled timer's
    handle makes the loop poll once more, without blocking, right after the caller's
    step; the loop thread then takes the GIL again while an off-loop actor holds it,
    which is one more sleep and wake-up a trip. Here a wait files its deadline (a dict
    entry and a heap push) and takes it back when it ends; the timer is set for the
    earliest deadline and moved only when an earlier one arrives. When it fires it fails
    every wait that is due, drops entries of waits that ended, and is set for the next.
    The heap keeps entries of ended waits until they reach its top, or until it holds
    more than twice the live ones plus 64, when it is rebuilt from those.

    Nothing here refers to the loop when idle: the loop's timer holds this object while
    it is set, and the registry (`_deadlines_of`) refers to it weakly, so a closed loop
    and its deadlines are collected together.
    """

    __slots__ = ("__weakref__", "armed", "handle", "heap", "waiting")

    def __init__(self) -> None:
        #: the waits in progress, by key (from `_deadline_keys`)
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        #: ``(deadline, key)`` of those waits (and of some that ended), earliest first
        self.heap: list[tuple[float, int]] = []
        self.armed = _INF  # the deadline the timer is set for (inf: no timer)
        self.handle: asyncio.TimerHandle | None = None

    def add(self, fut: asyncio.Future[Any], deadline: float, loop: Any) -> int:
        """File ``fut`` to fail with TimeoutError at ``deadline``; returns its key (the
        wait pops it from `waiting` when it ends)."""
        key = next(_deadline_keys)
        self.waiting[key] = fut
        _heappush(self.heap, (deadline, key))
        self.tend(deadline, loop)
        return key

    def file(self, fut: asyncio.Future[Any], deadline: float, loop: Any) -> int:
        """`add` for a caller that awaits ``fut`` itself (one frame less than `wait_until`
        on a timed round trip's path): returns the key to pop from `waiting` when the
        wait ends, whichever way it ends."""
        key = next(_deadline_keys)
        self.waiting[key] = fut
        heap = self.heap
        _heappush(heap, (deadline, key))
        if deadline < self.armed or len(heap) > 2 * len(self.waiting) + 64:
            self.tend(deadline, loop)
        return key

    def tend(self, deadline: float, loop: Any) -> None:
        """After ``deadline`` was filed: set the timer for it if it is the earliest, and
        rebuild the heap when entries of ended waits crowd it."""
        if deadline < self.armed:
            self._arm(deadline, loop)
        heap, waiting = self.heap, self.waiting
        if len(heap) > 2 * len(waiting) + 64:
            heap[:] = [e for e in heap if e[1] in waiting]
            _heapify(heap)

    def _arm(self, when: float, loop: Any) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed = when
        self.handle = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: Any) -> None:
        # a loop may run a timer up to its clock's resolution early (uvloop: a
        # millisecond): every wait due by the deadline the timer was set for is due now
        limit = max(self.armed, loop.time())
        self.armed, self.handle = _INF, None
        heap, waiting = self.heap, self.waiting
        while heap and heap[0][0] <= limit:
            fut = waiting.pop(_heappop(heap)[1], None)
            if fut is not None and not fut.done():
                fut.set_exception(TimeoutError())
        while heap and heap[0][1] not in waiting:  # waits that ended: no timer for them
            _heappop(heap)
        if heap:
            self._arm(heap[0][0], loop)


_deadline_keys = itertools.count()
#: each loop's `_Deadlines` (weakly: alive while a wait or the timer holds it)
_deadline_registry: weakref.WeakKeyDictionary[Any, weakref.ref[_Deadlines]] = (
    weakref.WeakKeyDictionary()
)
#: the last lookup's loop and deadlines, weakly (most programs run one loop)
_last_deadlines: tuple[Callable[[], Any], Callable[[], _Deadlines | None]] = (
    lambda: None,
    lambda: None,
)


def _deadlines_of(loop: Any) -> _Deadlines | None:
    """The `_Deadlines` of ``loop`` (made on first use); None when the loop cannot be
    referenced weakly."""
    global _last_deadlines
    loop_ref, deadlines_ref = _last_deadlines
    if loop_ref() is loop:
        deadlines = deadlines_ref()
        if deadlines is not None:
            return deadlines
    try:
        found = _deadline_registry.get(loop)
        deadlines = None if found is None else found()
        if deadlines is None:
            deadlines = _Deadlines()
            _deadline_registry[loop] = weakref.ref(deadlines)
        _last_deadlines = (weakref.ref(loop), weakref.ref(deadlines))
    except TypeError:  # no weak references to this loop
        return None
    return deadlines


#: The `_Deadlines` of a loop (made on first use), or None where the loop cannot be
#: referenced weakly: for a caller that files its own waits (`_Deadlines.file`).
deadlines_of: Callable[[Any], _Deadlines | None] = _deadlines_of


class RingBuffer(Generic[T]):
    """A power-of-two bounded FIFO ring for one event loop.

    ``put``/``get`` wait up to ``timeout`` and return False/None on expiry instead of
    raising (the 0.2 API); the capacity is rounded up to a power of two.
    """

    def __init__(self, capacity: int = 4096) -> None:
        if type(capacity) is not int or capacity <= 0:
            raise InvalidConfigurationError(f"ring capacity must be an int > 0, got {capacity!r}")
        cap = 1 << (capacity - 1).bit_length()
        self._mask = cap - 1
        self._slots: list[Any] = [None] * cap
        self._head = 0
        self._tail = 0
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()

    @property
    def capacity(self) -> int:
        return self._mask + 1

    @property
    def size(self) -> int:
        return self._tail - self._head

    def __len__(self) -> int:
        return self._tail - self._head

    @property
    def empty(self) -> bool:
        return self._tail == self._head

    @property
    def full(self) -> bool:
        return self._tail - self._head > self._mask

    def put_nowait(self, item: T) -> bool:
        if self.full:
            return False
        self._slots[self._tail & self._mask] = item
        self._tail += 1
        self._not_empty.set()
        if self.full:
            self._not_full.clear()
        return True

    def get_nowait(self) -> T | None:
        if self.empty:
            return None
        i = self._head & self._mask
        item = self._slots[i]
        self._slots[i] = None
        self._head += 1
        self._not_full.set()
        if self.empty:
            self._not_empty.clear()
        return item  # type: ignore[no-any-return]

    async def put(self, item: T, timeout: float | None = None) -> bool:
        while self.full:
            try:
                await asyncio.wait_for(self._not_full.wait(), timeout)
            except TimeoutError:
                return False
        return self.put_nowait(item)

    async def get(self, timeout: float | None = None) -> T | None:
        while self.empty:
            try:
                await asyncio.wait_for(self._not_empty.wait(), timeout)
            except TimeoutError:
                return None
        return self.get_nowait()


# Public names of the helpers the sibling `MessageQueue` shares (queue.py).
BAND_OF = _BAND_OF
priority_of = _priority_of
discard_items = _discard
wake_one = _wake_one
