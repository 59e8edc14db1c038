"""Blocking queues for the thread tier: ``SyncQueue`` (MPMC) and ``SPSCQueue``.

Design notes:
- ``SyncQueue`` is a deque behind one mutex. A thread that must wait parks on a lock of its
  own (acquired once, then acquired again to sleep) queued in ``_getters``/``_putters``; the
  thread that makes progress possible pops one waiter and releases its lock. Compared with
  ``threading.Condition`` this does no work when nobody waits and wakes exactly one thread
  per item. A woken thread re-checks under the mutex, so a barging thread that took the
  item only makes it wait again; a thread that times out after being signalled still finds
  the item on its re-check, so a wake-up is never lost.
- ``SPSCQueue`` has no mutex at all: ``deque.append``/``popleft`` are atomic under the GIL
  and each side parks with a flag plus a lock used as a saturating binary semaphore. The
  consumer sets ``_get_waiting`` *then* re-checks the deque; the producer appends *then*
  reads the flag. Bytecodes run one at a time under the GIL, so in every interleaving
  either the consumer sees the item or the producer sees the flag (Dekker's argument). A
  release that finds the lock already released is a pending wake-up and is ignored.
- ``shutdown()`` refuses new items but lets consumers drain: ``get`` raises only once the
  queue is empty (``QueueClosedError``, or the ``reason`` given, e.g. the actor's failure).
  ``shutdown(immediate=True)`` also discards (and counts) what is queued. Every waiter is
  woken either way.
- ``None`` cannot be queued: ``get(timeout=...)`` returns None when the time runs out, the
  convention the threaded kernel's ``receive`` follows.
- Length: two queues sharing one contract and the waker machinery, kept side by side so
  their semantics stay identical. ``_QueueBase`` holds what does not depend on how a side
  waits (state, counters, wakers, error wording); ``put``/``get`` are written out in each.
- Wakers (``add_waker``) let code outside the queue learn that it may have become readable
  or writable (a pool waiting on many outboxes, or an event loop hosting a threaded kernel);
  they run in the thread that changed the queue, after the change, outside any lock.
- Burst wakers (``add_burst_waker``) run once a burst on ``SPSCQueue``: after a consumer
  found the queue empty, or emptied it with ``get_many`` (or a producer found it full), the
  same flag-then-look-again handshake as parking. A host that polls until it finds nothing,
  or until ``get_many`` gives fewer than asked, loses no wake-up and does not pay a call
  per item; ``SyncQueue`` runs them as plain wakers.
- ``put_many``/``get_many`` move a batch at once, waking each side once.
- ``SPSCQueue.put_urgent`` queues an item in a second lane that ``get`` empties first: an
  urgent message passes what was queued before it and not yet taken (the runtime's
  thread tier hands its actor wide batches and still serves a HIGH message next). Both
  lanes share the capacity; each lane is FIFO. It costs every ``get`` one truth test.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from itertools import repeat, starmap
from typing import Any, Generic, TypeVar

from ....exceptions import (
    InvalidConfigurationError,
    QueueClosedError,
    TypeValidationError,
)
from ...wakers import WakeOn, Waker, WakerSet

__all__ = ("SPSCQueue", "SyncQueue")

T = TypeVar("T")

_allocate_lock = threading.Lock
_monotonic = time.monotonic


def _none_error(kind: str) -> TypeValidationError:
    return TypeValidationError(
        f"{kind} cannot hold None: get() returns None when its timeout expires; "
        "wrap the value or use a sentinel object"
    )


def _check_size(kind: str, name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidConfigurationError(
            f"{kind} {name} must be an int >= {minimum}"
            f"{' (0 = unbounded)' if minimum == 0 else ''}, got {value!r}"
        )
    return value


class _QueueBase(Generic[T]):
    """What both queues share: the items, the shutdown state, the counters and the wakers.

    ``put`` and ``get`` (the per-item path) and whatever touches the waiting threads stay
    in each queue: SyncQueue does them under its mutex, SPSCQueue without one.
    """

    __slots__ = (
        "_closed",
        "_dequeued",
        "_dropped",
        "_enqueued",
        "_items",
        "_name",
        "_peak",
        "_reason",
        "_wakers",
    )

    def __init__(self, name: str) -> None:
        self._name = name
        self._items: deque[T] = deque()
        self._closed = False
        self._reason: BaseException | None = None
        self._wakers = WakerSet()
        self._enqueued = 0
        self._dequeued = 0
        self._dropped = 0
        self._peak = 0

    # -- properties -------------------------------------------------------------------

    @property
    def maxsize(self) -> int:
        """Capacity; each queue defines it."""
        raise NotImplementedError

    @property
    def size(self) -> int:
        """Items queued now."""
        return len(self._items)

    qsize = size

    @property
    def empty(self) -> bool:
        """True when nothing is queued."""
        return not self._items

    @property
    def is_shutdown(self) -> bool:
        """True after `shutdown`."""
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    # -- errors -----------------------------------------------------------------------

    def _put_closed(self) -> QueueClosedError:
        return QueueClosedError(f"cannot put into {self._name}: it has been shut down")

    def _get_closed(self) -> BaseException:
        if self._reason is not None:
            return self._reason
        return QueueClosedError(f"{self._name} is shut down and drained; nothing more will come")

    # -- put and get ------------------------------------------------------------------

    def put(self, item: T, timeout: float | None = None) -> bool:
        """Append ``item``; each queue defines it."""
        raise NotImplementedError

    def put_nowait(self, item: T) -> bool:
        """Append ``item`` if there is space; False (nothing queued) when full.

        Raises:
            QueueClosedError: the queue is shut down.
        """
        return self.put(item, 0)

    def get(self, timeout: float | None = None) -> T | None:
        """Pop the oldest item; each queue defines it."""
        raise NotImplementedError

    def get_nowait(self) -> T | None:
        """Pop the oldest item, or return None when empty.

        Raises:
            QueueClosedError: the queue is shut down and drained.
        """
        return self.get(0)

    # -- wakers and counters ----------------------------------------------------------

    def _wake_all(self) -> None:
        for wake in (*self._wakers.readable, *self._wakers.writable):
            wake()

    def add_waker(self, callback: Waker, *, when: WakeOn = "readable") -> None:
        """Call ``callback()`` whenever the queue may have become readable (or writable).

        It runs in the thread that changed the queue, after the change and outside the
        queue's lock; it must be quick and must not raise. Shutdown calls every waker.
        """
        self._wakers.add(callback, when)

    def remove_waker(self, callback: Waker) -> None:
        """Stop calling ``callback`` (no error if it was not registered)."""
        self._wakers.remove(callback)

    def add_burst_waker(self, callback: Waker, *, when: WakeOn = "readable") -> None:
        """Call ``callback()`` at least once a burst: when the queue may have become
        readable after a consumer found it empty, or writable after a producer found it
        full. A consumer that polls until it finds nothing misses no item. Shutdown calls
        it too. This queue calls it as `add_waker` does; `SPSCQueue` once a burst."""
        self._wakers.add(callback, when)

    def remove_burst_waker(self, callback: Waker) -> None:
        """Stop calling a burst waker (no error if it was not registered)."""
        self._wakers.remove(callback)

    def get_stats(self) -> dict[str, int]:
        """Counters: current_size, max_size, peak_size, total_enqueued/dequeued/dropped."""
        return {
            "current_size": len(self),
            "max_size": self.maxsize,
            "peak_size": self._peak,
            "total_enqueued": self._enqueued,
            "total_dequeued": self._dequeued,
            "total_dropped": self._dropped,
        }

    statistics = get_stats


class SyncQueue(_QueueBase[T]):
    """A bounded (or unbounded) FIFO for any number of producer and consumer threads.

    Args:
        maxsize: Capacity; ``0`` means unbounded.
        name: Used in error messages (the threaded kernel passes ``"kernel 'x' inbox"``).
    """

    __slots__ = ("_getters", "_maxsize", "_mutex", "_putters")

    def __init__(self, maxsize: int = 4096, *, name: str = "SyncQueue") -> None:
        self._maxsize = _check_size("SyncQueue", "maxsize", maxsize, 0)
        super().__init__(name)
        self._mutex = _allocate_lock()
        self._getters: deque[Any] = deque()
        self._putters: deque[Any] = deque()

    # -- properties -------------------------------------------------------------------

    @property
    def maxsize(self) -> int:
        """Capacity (0 = unbounded)."""
        return self._maxsize

    capacity = maxsize

    @property
    def full(self) -> bool:
        """True when a bounded queue is at capacity."""
        return bool(self._maxsize) and len(self._items) >= self._maxsize

    # -- waiting ----------------------------------------------------------------------

    def _park(self, waiters: deque[Any], remaining: float) -> None:
        """Sleep in ``waiters`` until signalled or ``remaining`` seconds pass (-1: no limit).

        Entered and left with the mutex held; it is released while asleep. The caller
        re-checks its condition afterwards.
        """
        waiter = _allocate_lock()
        waiter.acquire()
        waiters.append(waiter)
        mutex = self._mutex
        mutex.release()
        try:
            signalled = waiter.acquire(True, remaining)
        finally:
            mutex.acquire()
        if not signalled:
            try:
                waiters.remove(waiter)
            except ValueError:
                pass  # signalled just after the timeout: the caller's re-check sees why

    def resize(self, maxsize: int) -> None:
        """Change the capacity (``0``: unbounded). Items beyond a smaller one stay; puts
        wait until they drain below it. Producers waiting for room look again.

        Raises:
            InvalidConfigurationError: ``maxsize`` is not an int >= 0.
        """
        maxsize = _check_size("SyncQueue", "maxsize", maxsize, 0)
        with self._mutex:
            self._maxsize = maxsize
            while self._putters:
                self._putters.popleft().release()

    # -- put --------------------------------------------------------------------------

    def put(self, item: T, timeout: float | None = None) -> bool:
        """Append ``item``, waiting while the queue is full.

        Args:
            item: Anything but None.
            timeout: Seconds to wait for space; None waits indefinitely, 0 does not wait.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            QueueClosedError: the queue is (or becomes, while waiting) shut down.
        """
        if item is None:
            raise _none_error(self._name)
        mutex = self._mutex
        mutex.acquire()
        try:
            deadline: float | None = None
            while True:
                if self._closed:
                    raise self._put_closed()
                items = self._items
                if not self._maxsize or len(items) < self._maxsize:
                    items.append(item)
                    self._enqueued += 1
                    if len(items) > self._peak:
                        self._peak = len(items)
                    if self._getters:
                        self._getters.popleft().release()
                    break
                if timeout is not None:
                    if deadline is None:
                        deadline = _monotonic() + timeout
                    remaining = deadline - _monotonic()
                    if remaining <= 0:
                        return False
                else:
                    remaining = -1
                self._park(self._putters, remaining)
        finally:
            mutex.release()
        for wake in self._wakers.readable:
            wake()
        return True

    # -- get --------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> T | None:
        """Pop the oldest item, waiting while the queue is empty.

        Args:
            timeout: Seconds to wait; None waits indefinitely, 0 does not wait.

        Returns:
            The item, or None when the timeout expired first.

        Raises:
            QueueClosedError: the queue is shut down and drained (or the ``reason`` given to
                `shutdown`).
        """
        mutex = self._mutex
        mutex.acquire()
        try:
            deadline: float | None = None
            while True:
                items = self._items
                if items:
                    item = items.popleft()
                    self._dequeued += 1
                    if self._putters:
                        self._putters.popleft().release()
                    break
                if self._closed:
                    raise self._get_closed()
                if timeout is not None:
                    if deadline is None:
                        deadline = _monotonic() + timeout
                    remaining = deadline - _monotonic()
                    if remaining <= 0:
                        return None
                else:
                    remaining = -1
                self._park(self._getters, remaining)
        finally:
            mutex.release()
        for wake in self._wakers.writable:
            wake()
        return item

    # -- batches ----------------------------------------------------------------------

    def put_many(self, items: list[T]) -> int:
        """Append a prefix of ``items`` that fits now, without waiting; returns its length.

        One lock acquisition and one wake-up of each side for the whole batch.

        Raises:
            QueueClosedError: the queue is shut down (nothing was appended).
        """
        mutex = self._mutex
        mutex.acquire()
        try:
            if self._closed:
                raise self._put_closed()
            queued = self._items
            n = len(items)
            if self._maxsize:
                n = min(n, self._maxsize - len(queued))
            if n <= 0:
                return 0
            queued.extend(items[:n] if n < len(items) else items)
            self._enqueued += n
            if len(queued) > self._peak:
                self._peak = len(queued)
            getters = self._getters
            for _ in range(min(n, len(getters))):
                getters.popleft().release()
        finally:
            mutex.release()
        for wake in self._wakers.readable:
            wake()
        return n

    def get_many(self, max_count: int) -> list[T]:
        """Pop up to ``max_count`` items, oldest first, without waiting (``[]``: none).

        Raises:
            QueueClosedError: the queue is shut down and drained (or the ``reason`` given to
                `shutdown`), as `get` does.
        """
        mutex = self._mutex
        mutex.acquire()
        try:
            queued = self._items
            if not queued:
                if self._closed:
                    raise self._get_closed()
                return []
            if max_count >= len(queued):
                out = list(queued)
                queued.clear()
            else:
                popleft = queued.popleft
                out = [popleft() for _ in range(max_count)]
            self._dequeued += len(out)
            putters = self._putters
            for _ in range(min(len(out), len(putters))):
                putters.popleft().release()
        finally:
            mutex.release()
        for wake in self._wakers.writable:
            wake()
        return out

    # -- management -------------------------------------------------------------------

    def clear(self) -> int:
        """Discard everything queued (counted as dropped); returns how many."""
        with self._mutex:
            n = len(self._items)
            self._items.clear()
            self._dropped += n
            while self._putters:
                self._putters.popleft().release()
        for wake in self._wakers.writable:
            wake()
        return n

    def drain(self) -> list[T]:
        """Pop everything queued now without waiting (works after shutdown too)."""
        with self._mutex:
            out = list(self._items)
            self._items.clear()
            self._dequeued += len(out)
            while self._putters:
                self._putters.popleft().release()
        return out

    def shutdown(self, immediate: bool = False, *, reason: BaseException | None = None) -> None:
        """Refuse further puts and wake every waiter.

        Args:
            immediate: Also discard what is queued (counted as dropped) instead of letting
                consumers drain it.
            reason: Raised by ``get`` once drained, instead of ``QueueClosedError``.
        """
        with self._mutex:
            if not self._closed:
                self._closed = True
                self._reason = reason
            if immediate:
                self._dropped += len(self._items)
                self._items.clear()
            while self._getters:
                self._getters.popleft().release()
            while self._putters:
                self._putters.popleft().release()
        self._wake_all()

    def __repr__(self) -> str:
        cap = self._maxsize or "unbounded"
        state = " shut down" if self._closed else ""
        return f"<SyncQueue {self._name!r} {len(self._items)}/{cap}{state}>"


class _Parking:
    """One side's parking spot: a flag and a lock used as a saturating binary semaphore."""

    __slots__ = ("signal", "waiting")

    def __init__(self) -> None:
        self.waiting = False
        self.signal = _allocate_lock()
        self.signal.acquire()

    def wake(self) -> None:
        self.waiting = False
        try:
            self.signal.release()
        except RuntimeError:
            pass  # already released: a wake-up is pending

    def sleep(self, remaining: float) -> None:
        self.signal.acquire(True, remaining)
        self.waiting = False


class SPSCQueue(_QueueBase[T]):
    """A bounded FIFO for exactly one producer thread and one consumer thread.

    No mutex: it relies on the GIL (``deque`` operations are atomic) and parks each side on
    a flag plus a binary semaphore. Several producers (or consumers) must serialize their
    calls themselves; `ThreadWorker`
    does. Not meant for free-threaded Python builds.

    Args:
        capacity: Most items held at once (>= 1).
        name: Used in error messages.
    """

    __slots__ = (
        "_bursts",
        "_capacity",
        "_consumer",
        "_empty_seen",
        "_full_seen",
        "_producer",
        "_urgent",
    )

    def __init__(self, capacity: int = 4096, *, name: str = "SPSCQueue") -> None:
        self._capacity = _check_size("SPSCQueue", "capacity", capacity, 1)
        super().__init__(name)
        self._consumer = _Parking()
        self._producer = _Parking()
        # the burst wakers, and the flags that arm them: the consumer found the queue
        # empty (a put runs the readable ones), the producer found it full (a get runs
        # the writable ones). Each side sets its flag, then looks again (as it parks).
        self._bursts = WakerSet()
        self._empty_seen = True
        self._full_seen = False
        self._urgent: deque[T] = deque()  # `put_urgent`'s lane, taken first

    # -- properties -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Most items held at once."""
        return self._capacity

    maxsize = capacity

    @property
    def full(self) -> bool:
        """True when at capacity."""
        return len(self._items) + len(self._urgent) >= self._capacity

    @property
    def size(self) -> int:
        """Items queued now (both lanes)."""
        return len(self._items) + len(self._urgent)

    qsize = size

    @property
    def empty(self) -> bool:
        """True when nothing is queued."""
        return not (self._items or self._urgent)

    def __len__(self) -> int:
        return len(self._items) + len(self._urgent)

    def resize(self, capacity: int) -> None:
        """Change the capacity (same contract as `SyncQueue.resize`, >= 1). Only the
        producer reads it, so the producer side calls it (or serializes with it)."""
        self._capacity = _check_size("SPSCQueue", "capacity", capacity, 1)
        if self._producer.waiting:
            self._producer.wake()

    # -- producer ---------------------------------------------------------------------

    def put(self, item: T, timeout: float | None = None) -> bool:
        """Append ``item``, waiting while full (same contract as `SyncQueue.put`)."""
        if self._closed:
            raise self._put_closed()
        if item is None:
            raise _none_error(self._name)
        items = self._items
        if len(items) + len(self._urgent) >= self._capacity:
            self._full_seen = True  # before `_wait_space` looks again
            if not self._wait_space(timeout):
                return False
        items.append(item)
        self._enqueued += 1
        if len(items) > self._peak:
            self._peak = len(items)
        # (`_readable_now`, inlined: every message's path)
        for wake in self._wakers.readable:
            wake()
        if self._empty_seen:
            self._empty_seen = False
            for wake in self._bursts.readable:
                wake()
        consumer = self._consumer
        if consumer.waiting:  # last: the woken thread waits for no more of our work
            consumer.waiting = False  # (`_Parking.wake`, inlined)
            try:
                consumer.signal.release()
            except RuntimeError:
                pass  # already released: a wake-up is pending
        return True

    def put_urgent(self, item: T) -> bool:
        """Queue ``item`` in the urgent lane, without waiting: `get` takes it before
        anything `put` or `put_many` queued that is not taken yet (after the urgent items
        queued before it). False, nothing queued, when the queue is full (both lanes
        count).

        Raises:
            QueueClosedError: the queue is shut down.
        """
        if self._closed:
            raise self._put_closed()
        if item is None:
            raise _none_error(self._name)
        urgent = self._urgent
        if len(self._items) + len(urgent) >= self._capacity:
            self._full_seen = True  # the next get runs the writable burst wakers
            if len(self._items) + len(urgent) >= self._capacity:  # looked at again
                return False
        urgent.append(item)
        self._enqueued += 1
        self._readable_now()
        return True

    def _readable_now(self) -> None:
        """An item was queued: run the readable wakers, then wake the consumer."""
        for wake in self._wakers.readable:
            wake()
        if self._empty_seen:
            self._empty_seen = False
            for wake in self._bursts.readable:
                wake()
        consumer = self._consumer
        if consumer.waiting:  # last: the woken thread waits for no more of our work
            consumer.waiting = False  # (`_Parking.wake`, inlined)
            try:
                consumer.signal.release()
            except RuntimeError:
                pass  # already released: a wake-up is pending

    def _wait_space(self, timeout: float | None) -> bool:
        items = self._items
        deadline = None if timeout is None else _monotonic() + timeout
        parking = self._producer
        while True:
            if self._closed:
                raise self._put_closed()
            parking.waiting = True
            if len(items) + len(self._urgent) < self._capacity:  # re-check after announcing
                parking.waiting = False
                return True
            if deadline is None:
                remaining = -1.0
            else:
                remaining = deadline - _monotonic()
                if remaining <= 0:
                    parking.waiting = False
                    return False
            parking.sleep(remaining)

    # -- consumer ---------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> T | None:
        """Pop the oldest item, waiting while empty (same contract as `SyncQueue.get`);
        the urgent lane's first."""
        urgent = self._urgent
        if urgent:
            item = urgent.popleft()
        else:
            items = self._items
            if not items:
                self._empty_seen = True  # before `_wait_item` looks again
                if not self._wait_item(timeout):
                    return None
            item = urgent.popleft() if urgent else items.popleft()
        self._dequeued += 1
        for wake in self._wakers.writable:
            wake()
        if self._full_seen:
            self._full_seen = False
            for wake in self._bursts.writable:
                wake()
        producer = self._producer
        if producer.waiting:  # last, as in `put`
            producer.waiting = False  # (`_Parking.wake`, inlined)
            try:
                producer.signal.release()
            except RuntimeError:
                pass  # already released: a wake-up is pending
        return item

    def _wait_item(self, timeout: float | None) -> bool:
        items = self._items
        urgent = self._urgent
        deadline = None if timeout is None else _monotonic() + timeout
        parking = self._consumer
        signal = parking.signal
        while True:
            parking.waiting = True
            if items or urgent:  # re-check after announcing
                parking.waiting = False
                return True
            if self._closed:
                parking.waiting = False
                raise self._get_closed()
            if deadline is None:
                signal.acquire()  # (`_Parking.sleep`, inlined: the actor's idle path)
            else:
                remaining = deadline - _monotonic()
                if remaining <= 0:
                    parking.waiting = False
                    return False
                signal.acquire(True, remaining)
            parking.waiting = False

    # -- batches ----------------------------------------------------------------------

    def put_many(self, items: list[T]) -> int:
        """Append a prefix of ``items`` that fits now, without waiting; returns its length.

        The consumer and the wakers are woken once for the whole batch (producer side).

        Raises:
            QueueClosedError: the queue is shut down (nothing was appended).
        """
        if self._closed:
            raise self._put_closed()
        queued = self._items
        urgent = self._urgent
        n = min(len(items), self._capacity - len(queued) - len(urgent))
        if n < len(items):  # some refused: the next get runs the writable burst wakers
            self._full_seen = True
            n = min(len(items), self._capacity - len(queued) - len(urgent))  # looked again
        if n <= 0:
            return 0
        queued.extend(items[:n] if n < len(items) else items)
        self._enqueued += n
        if len(queued) > self._peak:
            self._peak = len(queued)
        if self._consumer.waiting:
            self._consumer.wake()
        for wake in self._wakers.readable:
            wake()
        if self._empty_seen:
            self._empty_seen = False
            for wake in self._bursts.readable:
                wake()
        return n

    def get_many(self, max_count: int) -> list[T]:
        """Pop up to ``max_count`` items, oldest first, without waiting (``[]``: none);
        the producer and the wakers are woken once (consumer side). Fewer than
        ``max_count`` means it took all there was and the burst wakers are armed: the next
        put runs the readable ones.

        Raises:
            QueueClosedError: the queue is shut down and drained (or the ``reason`` given to
                `shutdown`), as `get` does.
        """
        if self._urgent:
            return self._get_urgent_first(max_count)
        queued = self._items
        closed = self._closed  # read first: what was put before the shutdown is seen below
        if not queued:
            self._empty_seen = True
            if not queued:  # looked at again
                if closed:
                    raise self._get_closed()
                return []
        n = len(queued)  # only this side pops: at least ``n`` stay there while it does
        if n > max_count:
            n = max_count
        out = [queued.popleft()] if n == 1 else list(starmap(queued.popleft, repeat((), n)))
        while n < max_count:
            # took all there was: arm the burst wakers, then look again (as when it finds
            # none), so a caller given fewer than it asked for need not poll to find none
            self._empty_seen = True
            more = len(queued)
            if not more:
                break
            more = min(more, max_count - n)
            out += starmap(queued.popleft, repeat((), more))
            n += more
        self._dequeued += n
        self._writable_now()
        return out

    def _get_urgent_first(self, max_count: int) -> list[T]:
        """`get_many` while the urgent lane holds items: those first, then the rest."""
        urgent = self._urgent
        out: list[T] = []
        while urgent and len(out) < max_count:
            out.append(urgent.popleft())
        self._dequeued += len(out)
        if len(out) < max_count:
            try:  # the other lane (it arms the burst wakers and wakes the producer)
                out += self.get_many(max_count - len(out))
                return out
            except BaseException:
                if not self._closed:
                    raise
                # shut down and drained: these are the last; the next call says so
        self._writable_now()
        return out

    def _writable_now(self) -> None:
        """A batch was taken: wake the producer, then run the writable wakers (`get`
        inlines the same, waking the producer last: its per-item path)."""
        if self._producer.waiting:
            self._producer.wake()
        for wake in self._wakers.writable:
            wake()
        if self._full_seen:
            self._full_seen = False
            for wake in self._bursts.writable:
                wake()

    # -- management -------------------------------------------------------------------

    def clear(self) -> int:
        """Discard everything queued (counted as dropped); returns how many."""
        n = 0
        for items in (self._urgent, self._items):
            while items:
                try:
                    items.popleft()
                except IndexError:
                    break
                n += 1
        self._dropped += n
        self._producer.wake()
        return n

    def drain(self) -> list[T]:
        """Pop everything queued now without waiting (works after shutdown too), the
        urgent lane's first."""
        out: list[T] = []
        for items in (self._urgent, self._items):
            while items:
                try:
                    out.append(items.popleft())
                except IndexError:
                    break
        self._dequeued += len(out)
        self._producer.wake()
        return out

    def shutdown(self, immediate: bool = False, *, reason: BaseException | None = None) -> None:
        """Refuse further puts and wake both sides (consumers drain unless ``immediate``)."""
        if not self._closed:
            self._reason = reason
            self._closed = True
        if immediate:
            self.clear()
        self._consumer.wake()
        self._producer.wake()
        self._wake_all()
        for wake in (*self._bursts.readable, *self._bursts.writable):
            wake()

    def add_burst_waker(self, callback: Waker, *, when: WakeOn = "readable") -> None:
        """Call ``callback()`` once a burst: readable, at the first put after the consumer
        found the queue empty (a ``get`` or ``get_many`` that had nothing to take at once);
        writable, at the first get after the producer found it full. A consumer that
        polls until it finds nothing misses no item, and a producer that offers until it
        is refused misses no room. Shutdown calls it too. It runs as `add_waker`'s do."""
        self._bursts.add(callback, when)

    def remove_burst_waker(self, callback: Waker) -> None:
        """Stop calling a burst waker (no error if it was not registered)."""
        self._bursts.remove(callback)

    def __repr__(self) -> str:
        state = " shut down" if self._closed else ""
        return f"<SPSCQueue {self._name!r} {len(self)}/{self._capacity}{state}>"
