# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled hot core of `FastMessageQueue`: what every tier-1 message touches.

Design notes:
- Same attributes, methods and results as ``_native.queue_core_py.QueueCore``, used when this
  extension is not built. `FastMessageQueue` subclasses whichever core is in use and
  supplies the hooks (``_band_of``, ``_not_a_message``, ``_closed_error``) that only
  unusual items and closed queues reach; they are called as Python methods.
- A serializing queue remembers the last class whose ``serialize`` is the compiled one
  (not overridden) and calls that function directly for it: no attribute lookup, no bound
  method per message.
- The counters are C integers behind ``public`` attributes, so the queue's Python methods
  read and write them as before; the actor's inlined fast paths read the count as
  ``qsize``, a C getter like ``_count``'s. The per-hop calls are public (``offer``,
  ``take``, ``park_getter``); ``_offer``, ``_pop`` and ``_park_getter`` are the same
  methods under their older names. The band of a valid
  priority is computed (224+, 160+, 64+, else LOW) instead of looked up; anything else
  (no ``priority``, not an exact int in 0..255) takes the hook, which keeps the Python
  table's answers.
"""

from collections import deque

from cpython.long cimport PyLong_AsLongAndOverflow, PyLong_CheckExact
from cpython.object cimport PyObject_IsTrue

IMPLEMENTATION = "cython"

cdef object _get_running_loop
from asyncio import get_running_loop as _get_running_loop

# the deque methods, called as functions: no method lookup per message
cdef object _deque_append = deque.append
cdef object _deque_popleft = deque.popleft

cdef object _fast_serialize = None  # RingKernelMessage.serialize, when compiled
try:
    from .fast_message import serialize as _fast_serialize
except ImportError:
    pass


cdef inline void _wake_one(object waiters) except *:
    """Complete the longest-waiting future that is still pending, if any."""
    while waiters:
        fut = _deque_popleft(waiters)
        if not fut.done():
            fut.set_result(None)
            return


cdef class QueueCore:
    """The per-message state and calls of a `FastMessageQueue` (compiled)."""

    cdef public object _bands
    cdef public bint _closed
    cdef public Py_ssize_t _count
    cdef public object _decode
    cdef public Py_ssize_t _dequeued
    cdef public object _getters
    cdef public Py_ssize_t _limit
    cdef public object _loop
    cdef public Py_ssize_t _peak
    cdef public object _putters
    cdef public bint _serialize
    cdef object _ser_type  # the last class seen to serialize with the compiled function
    cdef bint _own_append  # ``_append`` is this one (a subclass may replace it)

    def __cinit__(self, *args, **kwargs):
        self._own_append = getattr(type(self), "_append", None) is QueueCore._append

    def _append(self, item):
        """Enqueue ``item`` in its band (no capacity check) and wake one getter."""
        self._append_c(item)

    cdef int _append_c(self, object item) except -1:
        cdef Py_ssize_t band = -1, n
        cdef long p
        cdef int overflow = 0
        # no ``try`` here: a Cython ``try`` saves the exception state on every pass
        prio = getattr(item, "priority", None)
        if PyLong_CheckExact(prio):
            p = PyLong_AsLongAndOverflow(prio, &overflow)
            if 0 <= p <= 255 and not overflow:
                band = 0 if p >= 224 else 1 if p >= 160 else 2 if p >= 64 else 3
        if band < 0:
            band = self._band_of(item)
        if self._serialize and type(item) is not bytes:
            t = type(item)
            if t is self._ser_type:  # the compiled serialize, called without a lookup
                item = _fast_serialize(item)
            else:
                try:
                    item = item.serialize()
                except AttributeError:
                    if hasattr(item, "serialize"):
                        raise  # raised inside a message's own serialize
                    raise self._not_a_message(item) from None
                if _fast_serialize is not None and getattr(t, "serialize", None) is _fast_serialize:
                    self._ser_type = t
        d = self._bands[band]
        if d is None:
            d = self._new_band(band)
        _deque_append(d, item)
        n = self._count + 1
        self._count = n
        if n > self._peak:
            self._peak = n
        getters = self._getters
        if getters is not None and PyObject_IsTrue(getters):  # wake the longest waiter
            fut = _deque_popleft(getters)
            if fut.done():
                _wake_one(getters)
            else:
                fut.set_result(None)

    @property
    def qsize(self):
        """How many messages are queued (read-only; the hot paths test it per message)."""
        return self._count

    def offer(self, item):
        """Enqueue ``item`` when the queue is open with room (True), else do nothing (False).

        The non-waiting half of a put: the caller applies backpressure and close rules
        when this returns False.
        """
        if self._count < self._limit:
            if self._own_append:
                self._append_c(item)
            else:
                self._append(item)
            return True
        return False

    _offer = offer

    def _new_band(self, Py_ssize_t band):
        bands = self._bands
        if type(bands) is not list:
            bands = self._bands = [None, None, None, None]
        d = deque()
        bands[band] = d
        return d

    def take(self):
        """Dequeue the first item of the highest non-empty band (the caller checked
        `qsize`), wake one putter, and decode a frame of a serializing queue."""
        b = self._bands
        item = _deque_popleft(b[0] or b[1] or b[2] or b[3])
        self._count -= 1
        self._dequeued += 1
        putters = self._putters
        if putters is not None and PyObject_IsTrue(putters):
            fut = _deque_popleft(putters)
            if fut.done():
                _wake_one(putters)
            else:
                fut.set_result(None)
        if self._decode is not None:
            return self._decode(item)
        return item

    _pop = take

    def park_getter(self):
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
        fut = loop.create_future()
        getters = self._getters
        if getters is None:
            getters = self._getters = deque()
        _deque_append(getters, fut)
        return fut

    _park_getter = park_getter

    def _bind_loop(self):
        """The running loop, which owns this queue from its first wait on (as with
        ``asyncio.Queue``; a wait from another loop then raises ``RuntimeError``)."""
        loop = self._loop = _get_running_loop()
        return loop
