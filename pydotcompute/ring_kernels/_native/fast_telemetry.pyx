# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled per-message latency recorder of tier-1 actors.

Design notes:
- Same names, methods and results as `telemetry.PyLatencyRecorder`, used when this
  extension is not built. An actor's ``receive`` calls `took` once per message: one clock
  read in C closes the previous message's time and starts this one, and the latency goes
  straight into counts per histogram bucket (the buckets of `LatencyHistogram`), total, min
  and max. Nothing is buffered, so nothing needs folding until a statistic is read.
- Every method runs with the GIL held and never releases it, so a reader draining from
  another thread always sees whole records. The clock is CLOCK_MONOTONIC, the clock of
  ``time.perf_counter_ns`` on POSIX.
"""

from cpython.number cimport PyNumber_Index
from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef extern from *:
    """
    #include <stdint.h>
    static inline int pdc_bit_length(unsigned long long v) {
        return v ? 64 - __builtin_clzll(v) : 0;
    }
    static inline int pdc_add_overflows(int64_t a, int64_t b, int64_t *out) {
        return __builtin_add_overflow(a, b, out);
    }
    """
    int pdc_bit_length(unsigned long long v) nogil
    int pdc_add_overflows(int64_t a, int64_t b, int64_t *out) nogil

IMPLEMENTATION = "cython"

cdef enum:
    SUB_BITS = 3
    SUB = 8
    BUCKETS = (64 - SUB_BITS + 1) * SUB  # as telemetry._BUCKETS


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + <int64_t>ts.tv_nsec


cdef inline Py_ssize_t _bucket_of(int64_t ns) noexcept nogil:
    """`telemetry._bucket_of` for an int64."""
    if ns < SUB:
        return ns if ns > 0 else 0
    cdef int shift = pdc_bit_length(<unsigned long long>ns) - SUB_BITS - 1
    cdef Py_ssize_t idx = ((shift + 1) << SUB_BITS) + ((ns >> shift) & (SUB - 1))
    return idx if idx < BUCKETS else BUCKETS - 1


cdef class LatencyRecorder:
    """Times the messages of one actor and keeps their latency statistics until drained.

    `took` marks a message taken (ending the previous one's time, if any), `idle` ends the
    current message's time before the actor waits, `cancel` forgets it, `add` records a
    latency directly. `drain` hands over what was recorded since the last drain as
    ``(count, total_ns, min_ns, max_ns, [(bucket, count), ...])`` and starts over; it
    returns None when nothing was recorded.
    """

    cdef int64_t _start  # when the message in hand was taken; 0: none
    cdef int64_t _n
    cdef int64_t _total
    cdef int64_t _lo
    cdef int64_t _hi
    cdef int64_t *_counts  # BUCKETS counters, allocated with the first latency
    cdef object _spill  # the part of the total beyond int64, a Python int (0 nearly always)

    def __cinit__(self):
        self._spill = 0

    def __dealloc__(self):
        free(self._counts)

    def __reduce__(self):
        # a copy starts empty: what was recorded belongs to the telemetry it was drained into
        return (LatencyRecorder, ())

    @property
    def dirty(self) -> bool:
        """True when latencies were recorded since the last `drain`."""
        return self._n != 0

    @property
    def timing(self) -> bool:
        """True while a message's time is running (between `took` and `idle`)."""
        return self._start != 0

    cdef int _record(self, int64_t ns) except -1:
        if self._counts == NULL:
            self._counts = <int64_t *>calloc(BUCKETS, sizeof(int64_t))
            if self._counts == NULL:
                raise MemoryError("telemetry: no memory for the latency histogram")
        self._counts[_bucket_of(ns)] += 1
        if self._n == 0:
            self._lo = ns
            self._hi = ns
        elif ns < self._lo:
            self._lo = ns
        elif ns > self._hi:
            self._hi = ns
        cdef int64_t total
        if pdc_add_overflows(self._total, ns, &total):
            self._spill += self._total  # what had been summed: exact in a Python int
            self._total = ns
        else:
            self._total = total
        self._n += 1
        return 0

    def took(self):
        """A message was taken now: the previous one's time (if running) ends here."""
        cdef int64_t now = _now_ns()
        if self._start:
            self._record(now - self._start)
        self._start = now

    def idle(self):
        """The actor is about to wait: the running message's time (if any) ends here."""
        if self._start:
            self._record(_now_ns() - self._start)
            self._start = 0

    def cancel(self):
        """Forget the running message's time (it failed, or was cut off)."""
        self._start = 0

    def add(self, latency_ns):
        """Record one latency of ``latency_ns`` (an int64)."""
        cdef int64_t ns = PyNumber_Index(latency_ns)  # an int: a float is refused
        self._record(ns)

    def drain(self):
        """What was recorded since the last drain (see the class), or None; starts over."""
        if self._n == 0:
            return None
        cdef Py_ssize_t i
        cdef list pairs = []
        for i in range(BUCKETS):
            if self._counts[i]:
                pairs.append((i, self._counts[i]))
                self._counts[i] = 0
        out = (self._n, self._spill + self._total, self._lo, self._hi, pairs)
        self._n = self._total = self._lo = self._hi = 0
        self._spill = 0
        return out

    def clear(self):
        """Drop what was recorded (a running message's time keeps running)."""
        if self._counts != NULL:
            memset(self._counts, 0, BUCKETS * sizeof(int64_t))
        self._n = self._total = self._lo = self._hi = 0
        self._spill = 0
