# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, always_allow_keywords=False
"""Compiled SPSC rings: ``FastSPSCQueue`` (in-process objects) and ``SharedByteRing``.

The pure-Python twin ``pydotcompute/ring_kernels/_native/spsc_py.py`` documents the shared-ring
layout, the commit protocol and the parking (Dekker) argument; this file implements exactly
the same bytes and semantics. Here the ordering is explicit: the producer fills the record,
then publishes ``tail`` with a C11 release store; the consumer loads ``tail`` with an
acquire load before touching the record and publishes ``head`` with a release store after
copying it out. ``set_*_waiting`` and the producer's post-publish check are separated from
the opposite re-check by sequentially consistent fences. Spinning happens without the GIL
(``spin_read``/``spin_write``) with a CPU ``pause`` between polls.

Segment management (create/attach/unlink) and error wording are shared with the twin:
this module does mechanism only.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport (
    PY_LOCK_ACQUIRED,
    PY_LOCK_INTR,
    PyLockStatus,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from cpython.buffer cimport PyBUF_SIMPLE, PyObject_GetBuffer, PyBuffer_Release
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from posix.unistd cimport write

from threading import TIMEOUT_MAX as _TIMEOUT_MAX
from time import monotonic as _monotonic

from pydotcompute.exceptions import InvalidConfigurationError, QueueClosedError
from pydotcompute.ring_kernels._native import spsc_py as _twin

cdef extern from "pythread.h":
    PyLockStatus PyThread_acquire_lock_timed(
        PyThread_type_lock lock, long long microseconds, int intr_flag
    ) nogil

cdef extern from *:
    """
    #include <stdint.h>
    static inline uint64_t pdc_load_acquire(uint64_t *p) {
        return __atomic_load_n(p, __ATOMIC_ACQUIRE);
    }
    static inline uint64_t pdc_load_relaxed(uint64_t *p) {
        return __atomic_load_n(p, __ATOMIC_RELAXED);
    }
    static inline void pdc_store_release(uint64_t *p, uint64_t v) {
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }
    static inline void pdc_store_relaxed(uint64_t *p, uint64_t v) {
        __atomic_store_n(p, v, __ATOMIC_RELAXED);
    }
    static inline void pdc_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    static inline void pdc_pause(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    """
    uint64_t pdc_load_acquire(uint64_t *p) nogil
    uint64_t pdc_load_relaxed(uint64_t *p) nogil
    void pdc_store_release(uint64_t *p, uint64_t v) nogil
    void pdc_store_relaxed(uint64_t *p, uint64_t v) nogil
    void pdc_fence() nogil
    void pdc_pause() nogil

IMPLEMENTATION = "cython"

HEADER_BYTES = _twin.HEADER_BYTES
RECORD_HEADER_BYTES = _twin.RECORD_HEADER_BYTES
SharedSegment = _twin.SharedSegment

cdef enum:
    C_HEADER_BYTES = 256
    C_RECORD_HEADER = 8
    H_MAGIC = 0
    H_CAPACITY = 1
    H_MAX_RECORDS = 2
    H_TAIL = 8
    H_WCOUNT = 9
    H_HEAD = 16
    H_RCOUNT = 17
    H_DONE = 18
    H_DONE_MARK = 19
    H_WWAIT = 24
    H_WCLOSED = 25
    H_RWAIT = 26
    H_RCLOSED = 27

cdef uint64_t C_MAGIC = _twin.MAGIC
# spin_read polls this long holding the GIL before it lets other threads run
cdef uint64_t GIL_SPIN_NS = 3000

cdef inline uint64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000ULL + <uint64_t>ts.tv_nsec


cdef bint _await_tail(uint64_t *hdr, uint64_t head, uint64_t deadline) noexcept nogil:
    """Poll until the tail moves past ``head`` or the writer closed (True), or ``deadline``."""
    cdef unsigned int i = 0
    while True:
        if pdc_load_acquire(&hdr[H_TAIL]) != head or pdc_load_relaxed(&hdr[H_WCLOSED]):
            return True
        pdc_pause()
        i += 1
        if (i & 15) == 0 and _now_ns() >= deadline:
            return False


cdef class SharedByteRing:
    """SPSC ring of variable-length byte records in shared memory (compiled).

    One process writes (``try_write``), one reads (``try_read``); each side keeps its own
    object. Create it in one process with ``SharedByteRing(capacity)`` and attach in the
    other with ``SharedByteRing.attach(name)``. The creator calls :meth:`unlink` when done.

    Args:
        capacity: Data bytes (rounded up to a multiple of 8); a record takes 8 bytes plus its
            payload rounded up to 8.
        name: Segment name; generated when None.
        max_records: Also bound the number of queued records (0 = only bytes bound it).
        create: False attaches to an existing segment (``capacity`` is then read from it).
    """

    cdef object _segment
    cdef object _view
    cdef Py_buffer _pybuf
    cdef bint _has_buf
    cdef char *_base
    cdef uint64_t *_hdr
    cdef char *_data
    cdef uint64_t _cap
    cdef uint64_t _max_records
    cdef uint64_t _head_cache
    cdef uint64_t _tail_cache
    cdef uint64_t _rcount_cache
    cdef bint _created
    cdef bint _closed
    cdef str _name

    implementation = IMPLEMENTATION

    def __cinit__(self):
        self._has_buf = False
        self._closed = True

    def __init__(self, capacity=1 << 20, name=None, *, max_records=0, create=True):
        if create:
            capacity = _twin._round_capacity(capacity)
            if max_records < 0:
                raise InvalidConfigurationError(
                    f"max_records must be >= 0 (0 = unbounded), got {max_records}"
                )
            self._segment = SharedSegment(name, C_HEADER_BYTES + capacity, create=True)
        else:
            if name is None:
                raise InvalidConfigurationError("attaching to a shared ring needs its name")
            self._segment = SharedSegment(name, create=False)
        self._name = self._segment.name
        self._view = self._segment.buf
        PyObject_GetBuffer(self._view, &self._pybuf, PyBUF_SIMPLE)
        self._has_buf = True
        self._closed = False
        self._base = <char *>self._pybuf.buf
        self._hdr = <uint64_t *>self._base
        self._data = self._base + C_HEADER_BYTES
        if create:
            self._hdr[H_CAPACITY] = capacity
            self._hdr[H_MAX_RECORDS] = max_records
            pdc_store_release(&self._hdr[H_MAGIC], C_MAGIC)
        elif (
            self._pybuf.len < C_HEADER_BYTES
            or pdc_load_acquire(&self._hdr[H_MAGIC]) != C_MAGIC
            # written so that a huge capacity cannot wrap the sum around
            or self._hdr[H_CAPACITY] > <uint64_t>self._pybuf.len - C_HEADER_BYTES
            or self._hdr[H_CAPACITY] < _twin.MIN_CAPACITY
            or (self._hdr[H_CAPACITY] & 7)
        ):
            self._release()
            raise InvalidConfigurationError(
                f"shared-memory segment {name!r} is not a pydotcompute ring "
                "(bad magic number or size)"
            )
        self._cap = self._hdr[H_CAPACITY]
        self._max_records = self._hdr[H_MAX_RECORDS]
        self._head_cache = pdc_load_acquire(&self._hdr[H_HEAD])
        self._tail_cache = pdc_load_acquire(&self._hdr[H_TAIL])
        self._rcount_cache = pdc_load_acquire(&self._hdr[H_RCOUNT])
        self._created = create

    @classmethod
    def attach(cls, name):
        """Map an existing ring created (possibly in another process) under ``name``."""
        return cls(name=name, create=False)

    cdef inline int _check_open(self) except -1:
        if self._closed:
            raise ValueError(f"shared ring {self._name!r} is closed in this process")
        return 0

    # -- properties -------------------------------------------------------------------

    @property
    def name(self):
        """The shared-memory segment name (pass it to :meth:`attach`)."""
        return self._name

    @property
    def capacity(self):
        """Data bytes in the ring."""
        return self._cap

    @property
    def max_record_size(self):
        """The largest payload that fits an empty ring."""
        return self._cap - C_RECORD_HEADER

    @property
    def max_records(self):
        """The record-count bound (0 = none)."""
        return self._max_records

    @property
    def closed(self):
        """True after :meth:`close` in this process."""
        return self._closed

    def __len__(self):
        """Records written and not yet read."""
        self._check_open()
        return self._pending()

    @property
    def used_bytes(self):
        """Bytes occupied by committed, unread records (headers and padding included)."""
        self._check_open()
        return self._used()

    # The consumer's counter is loaded first: it never overtakes the producer's, so the
    # difference cannot go negative however the two race.
    cdef inline uint64_t _pending(self) noexcept:
        cdef uint64_t read = pdc_load_acquire(&self._hdr[H_RCOUNT])
        return pdc_load_acquire(&self._hdr[H_WCOUNT]) - read

    cdef inline uint64_t _used(self) noexcept:
        cdef uint64_t head = pdc_load_acquire(&self._hdr[H_HEAD])
        return pdc_load_acquire(&self._hdr[H_TAIL]) - head

    # -- producer -----------------------------------------------------------------------

    cdef inline long long _place(
        self, const char *src, uint64_t n, uint64_t tail, uint64_t written
    ) except -2:
        """Copy one record of ``n`` bytes in at ``tail`` (``written`` records so far), not
        yet published; the ring bytes it takes, 0 when it does not fit now, -1 when it can
        never fit. What `_write` and `write_many` share."""
        cdef uint64_t cap = self._cap
        cdef uint64_t need = C_RECORD_HEADER + ((n + 7) & ~(<uint64_t>7))
        cdef uint64_t head, used, off, p, first
        if need > cap:
            return -1
        used = tail - self._head_cache
        if used > cap or need > cap - used or (tail & 7):
            head = self._head_cache = pdc_load_acquire(&self._hdr[H_HEAD])
            used = tail - head
            if used > cap or ((head | tail) & 7):  # a head past the tail wraps: > cap too
                raise _twin.corrupt_error(self._name, _twin.positions_detail(head, tail, cap))
            if need > cap - used:
                return 0
        if self._max_records and written - self._rcount_cache >= self._max_records:
            self._rcount_cache = pdc_load_acquire(&self._hdr[H_RCOUNT])
            if written - self._rcount_cache >= self._max_records:
                return 0
        off = tail % cap
        (<uint64_t *>(self._data + off))[0] = n
        p = off + C_RECORD_HEADER
        if p == cap:
            p = 0
        first = cap - p
        if n <= first:
            memcpy(self._data + p, src, n)
        else:
            memcpy(self._data + p, src, first)
            memcpy(self._data, src + first, n - first)
        return <long long>need

    cdef int _write(self, const char *src, uint64_t n) except -1:
        cdef uint64_t cap = self._cap
        cdef uint64_t tail, written
        cdef long long need
        if C_RECORD_HEADER + ((n + 7) & ~(<uint64_t>7)) > cap:
            raise _twin.too_large_error(n, cap, self._name)
        if pdc_load_relaxed(&self._hdr[H_RCLOSED]):
            raise QueueClosedError(f"shared ring {self._name!r}: the reader has closed it")
        tail = pdc_load_relaxed(&self._hdr[H_TAIL])
        written = pdc_load_relaxed(&self._hdr[H_WCOUNT])
        need = self._place(src, n, tail, written)
        if need == 0:
            return 0
        pdc_store_relaxed(&self._hdr[H_WCOUNT], written + 1)
        pdc_store_release(&self._hdr[H_TAIL], tail + <uint64_t>need)  # publish the record
        pdc_fence()
        return 2 if pdc_load_relaxed(&self._hdr[H_RWAIT]) else 1

    cdef int _write_obj(self, object data) except -1:
        cdef Py_buffer view
        cdef int result
        if type(data) is bytes:
            return self._write(PyBytes_AS_STRING(data), <uint64_t>len(<bytes>data))
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            result = self._write(<const char *>view.buf, <uint64_t>view.len)
        finally:
            PyBuffer_Release(&view)
        return result

    def try_write(self, data):
        """Append one record if it fits now.

        Returns:
            0 (``WRITE_FULL``) when there is no room now, 1 (``WRITE_OK``) when written, 2
            (``WRITE_WAKE``) when written and the reader is parked (ring its doorbell).

        Raises:
            InvalidConfigurationError: the record is larger than the ring can ever hold.
            QueueClosedError: the reader closed the ring.
        """
        self._check_open()
        return self._write_obj(data)

    def write_many(self, list records):
        """Append the records of ``records`` (bytes) in order while they fit, and publish
        them at once: one release of the tail, one look at the reader's flag.

        Returns:
            ``(count, wake)``: how many were written (a prefix of ``records``), and True
            when the reader is parked (ring its doorbell once for the batch).

        Raises:
            InvalidConfigurationError: the first record is larger than the ring can ever
                hold (a later one stops the batch before it, unwritten).
            QueueClosedError: the reader closed the ring.
        """
        self._check_open()
        cdef Py_ssize_t i = 0, count = len(records)
        cdef uint64_t tail, written
        cdef long long need
        cdef object data
        if pdc_load_relaxed(&self._hdr[H_RCLOSED]):
            raise QueueClosedError(f"shared ring {self._name!r}: the reader has closed it")
        tail = pdc_load_relaxed(&self._hdr[H_TAIL])
        written = pdc_load_relaxed(&self._hdr[H_WCOUNT])
        while i < count:
            data = records[i]
            if type(data) is not bytes:
                data = bytes(data)
            need = self._place(
                PyBytes_AS_STRING(data), <uint64_t>len(<bytes>data), tail, written
            )
            if need < 0 and i == 0:
                raise _twin.too_large_error(len(<bytes>data), self._cap, self._name)
            if need <= 0:
                break
            tail += <uint64_t>need
            written += 1
            i += 1
        if not i:
            return (0, False)
        pdc_store_relaxed(&self._hdr[H_WCOUNT], written)
        pdc_store_release(&self._hdr[H_TAIL], tail)  # publish the whole batch
        pdc_fence()
        return (i, pdc_load_relaxed(&self._hdr[H_RWAIT]) != 0)

    def writable(self, size):
        """True when a record of ``size`` payload bytes would fit now."""
        self._check_open()
        cdef uint64_t need = C_RECORD_HEADER + ((<uint64_t>size + 7) & ~(<uint64_t>7))
        if need > self._cap - self._used():
            return False
        if self._max_records and self._pending() >= self._max_records:
            return False
        return True

    def spin_write(self, data, double budget_s):
        """Like :meth:`try_write`, retrying for up to ``budget_s`` seconds while full.

        The wait runs without the GIL, polling the consumer's ``head`` with a CPU pause.
        """
        self._check_open()
        cdef int result = self._write_obj(data)
        if result or budget_s <= 0:
            return result
        cdef uint64_t deadline = _now_ns() + <uint64_t>(budget_s * 1e9)
        cdef uint64_t head0 = self._head_cache
        cdef uint64_t *hdr = self._hdr
        cdef unsigned int i = 0
        cdef bint moved = False
        with nogil:
            while True:
                if pdc_load_acquire(&hdr[H_HEAD]) != head0 or pdc_load_relaxed(&hdr[H_RCLOSED]):
                    moved = True
                    break
                pdc_pause()
                i += 1
                if (i & 63) == 0 and _now_ns() >= deadline:
                    break
        result = self._write_obj(data)
        if result or not moved:
            return result
        # the reader freed some space but not enough yet: keep spinning within the budget
        while _now_ns() < deadline:
            result = self._write_obj(data)
            if result:
                return result
            with nogil:
                for i in range(64):
                    pdc_pause()
        return self._write_obj(data)

    def close_writer(self):
        """Mark that no more records will come; the reader drains and then sees it."""
        self._check_open()
        pdc_store_release(&self._hdr[H_WCLOSED], 1)
        pdc_fence()

    @property
    def writer_closed(self):
        """True once the producer called :meth:`close_writer`."""
        self._check_open()
        return pdc_load_acquire(&self._hdr[H_WCLOSED]) != 0

    # -- consumer -----------------------------------------------------------------------

    cdef object _read(self):
        cdef uint64_t head = pdc_load_relaxed(&self._hdr[H_HEAD])
        cdef uint64_t cap = self._cap
        cdef uint64_t tail, off, n, p, first, committed
        cdef object out
        cdef char *dst
        if self._tail_cache <= head:
            self._tail_cache = pdc_load_acquire(&self._hdr[H_TAIL])
            if self._tail_cache <= head:
                return None
        tail = self._tail_cache
        # everything read from the shared header is checked against the capacity before a
        # byte is copied: a scribbled position or length must never read past the mapping
        if tail - head > cap or tail - head < C_RECORD_HEADER or ((head | tail) & 7):
            raise _twin.corrupt_error(self._name, _twin.positions_detail(head, tail, cap))
        off = head % cap
        n = (<uint64_t *>(self._data + off))[0]
        committed = tail - head - C_RECORD_HEADER
        if n > committed:
            raise _twin.corrupt_error(self._name, _twin.length_detail(n, head, committed))
        p = off + C_RECORD_HEADER
        if p == cap:
            p = 0
        first = cap - p
        out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>n)
        dst = PyBytes_AS_STRING(out)
        if n <= first:
            memcpy(dst, self._data + p, n)
        else:
            memcpy(dst, self._data + p, first)
            memcpy(dst + first, self._data, n - first)
        pdc_store_relaxed(
            &self._hdr[H_RCOUNT], pdc_load_relaxed(&self._hdr[H_RCOUNT]) + 1
        )
        pdc_store_release(
            &self._hdr[H_HEAD], head + C_RECORD_HEADER + ((n + 7) & ~(<uint64_t>7))
        )
        return out

    def try_read(self):
        """Pop the oldest committed record, or return None when there is none."""
        self._check_open()
        return self._read()

    def readable(self):
        """True when a committed record is waiting."""
        self._check_open()
        return pdc_load_acquire(&self._hdr[H_TAIL]) != pdc_load_relaxed(&self._hdr[H_HEAD])

    def spin_read(self, double budget_s, int wake_fd=-1):
        """Like :meth:`try_read`, polling for up to ``budget_s`` seconds while empty.

        The wait runs without the GIL with a CPU pause between polls; it stops early when
        the writer has closed the ring. With a ``wake_fd``, a read that finds the writer
        parked for space writes one byte to that doorbell (errors ignored: a full pipe
        already holds a wake-up, a closed one means the writer is gone).
        """
        self._check_open()
        return self._spin_read(budget_s, wake_fd)

    def spin_read_quiet(self, double budget_s, int wake_fd=-1):
        """:meth:`spin_read` with the reader's waiting flag (the writer's cue to ring the
        doorbell) withdrawn meanwhile: a record found while polling needs no wake-up. A
        flag that was set is set again, and the ring looked at once more, before it
        returns, so no wake-up is lost.

        Returns ``(record or None, behind)``: ``behind`` is True when more records,
        written while the flag was withdrawn (nobody was rung for them), wait after the
        one returned.
        """
        self._check_open()
        cdef uint64_t *hdr = self._hdr
        cdef bint behind = False
        pdc_fence()
        cdef bint armed = pdc_load_relaxed(&hdr[H_RWAIT]) != 0
        if armed:
            pdc_store_relaxed(&hdr[H_RWAIT], 0)
            pdc_fence()
        cdef object out = self._spin_read(budget_s, wake_fd)
        if armed:
            pdc_store_relaxed(&hdr[H_RWAIT], 1)
            pdc_fence()
            if out is None:
                out = self._spin_read(0, wake_fd)
            else:
                behind = pdc_load_acquire(&hdr[H_TAIL]) != pdc_load_relaxed(&hdr[H_HEAD])
        return out, behind

    cdef object _spin_read(self, double budget_s, int wake_fd):
        cdef object out = self._read()
        cdef uint64_t *hdr = self._hdr
        cdef uint64_t head, now, deadline
        if out is None and budget_s > 0:
            head = pdc_load_relaxed(&hdr[H_HEAD])
            now = _now_ns()
            deadline = now + <uint64_t>(budget_s * 1e9)
            # the first few microseconds keep the GIL: giving it up and taking it back
            # costs about as much as a reply from a busy peer takes to arrive
            if not _await_tail(hdr, head, min(now + GIL_SPIN_NS, deadline)):
                with nogil:
                    _await_tail(hdr, head, deadline)
            out = self._read()
        if out is not None and wake_fd >= 0:
            self._wake_writer(wake_fd)
        return out

    cdef inline void _wake_writer(self, int fd) noexcept:
        cdef char byte = 0
        cdef ssize_t ignored
        pdc_fence()  # Dekker: our new head is visible before we look at the writer's flag
        if pdc_load_relaxed(&self._hdr[H_WWAIT]):
            ignored = write(fd, &byte, 1)  # a failure needs nothing (see spin_read)

    def read_many(self, Py_ssize_t max_count, int wake_fd=-1):
        """Pop up to ``max_count`` committed records, oldest first (``[]``: none), in one
        call; with a ``wake_fd``, ring it once if the writer is parked for space."""
        self._check_open()
        out = []
        cdef object rec
        while max_count > 0:
            rec = self._read()
            if rec is None:
                break
            out.append(rec)
            max_count -= 1
        if out and wake_fd >= 0:
            self._wake_writer(wake_fd)
        return out

    def read_all(self):
        """Pop every committed record (used to recover what a dead peer left behind)."""
        self._check_open()
        out = []
        while True:
            rec = self._read()
            if rec is None:
                return out
            out.append(rec)

    def mark_done(self, SharedByteRing out=None, int wake_fd=-1):
        """Record that every record read so far is finished with (``records_done``).

        The consumer calls it when it has dealt with what it took (a process actor asking
        for its next message), so the producer can tell records merely taken from records
        finished: after the consumer dies, ``records_read - records_done`` were in its hands.

        Args:
            out: The ring the consumer answers into: its ``records_written`` now is stored
                first as ``done_mark`` (every answer to a finished record is among those).
            wake_fd: The writer's space doorbell, rung when the writer is parked and this
                ring is empty (no read follows to ring it).
        """
        self._check_open()
        cdef uint64_t *hdr = self._hdr
        cdef char byte = 0
        cdef ssize_t ignored
        if out is not None:
            out._check_open()
            pdc_store_relaxed(&hdr[H_DONE_MARK], pdc_load_relaxed(&out._hdr[H_WCOUNT]))
        pdc_store_release(&hdr[H_DONE], pdc_load_relaxed(&hdr[H_RCOUNT]))
        if wake_fd >= 0:
            pdc_fence()  # Dekker, as in a read: our count is visible before we look
            if pdc_load_relaxed(&hdr[H_WWAIT]) and (
                pdc_load_acquire(&hdr[H_TAIL]) == pdc_load_relaxed(&hdr[H_HEAD])
            ):
                ignored = write(wake_fd, &byte, 1)

    @property
    def done_mark(self):
        """The answer ring's ``records_written`` when records were last marked done (read
        ``records_done`` first: the mark is stored before it)."""
        self._check_open()
        return pdc_load_acquire(&self._hdr[H_DONE_MARK])

    @property
    def records_written(self):
        """Records the producer has written so far."""
        self._check_open()
        return pdc_load_acquire(&self._hdr[H_WCOUNT])

    @property
    def records_done(self):
        """Records the consumer has marked finished (see :meth:`mark_done`)."""
        self._check_open()
        return pdc_load_acquire(&self._hdr[H_DONE])

    @property
    def records_read(self):
        """Records the consumer has taken so far."""
        self._check_open()
        return pdc_load_acquire(&self._hdr[H_RCOUNT])

    def close_reader(self):
        """Mark that the reader is gone; further writes raise ``QueueClosedError``."""
        self._check_open()
        pdc_store_release(&self._hdr[H_RCLOSED], 1)
        pdc_fence()

    @property
    def reader_closed(self):
        """True once the consumer called :meth:`close_reader`."""
        self._check_open()
        return pdc_load_acquire(&self._hdr[H_RCLOSED]) != 0

    # -- parking flags ------------------------------------------------------------------

    @property
    def reader_waiting(self):
        """True while the reader is parked on its doorbell (read after a full fence)."""
        self._check_open()
        pdc_fence()
        return pdc_load_relaxed(&self._hdr[H_RWAIT]) != 0

    def set_reader_waiting(self, bint waiting):
        """Announce (or withdraw) that the reader is about to sleep; then re-check the ring."""
        self._check_open()
        pdc_store_relaxed(&self._hdr[H_RWAIT], 1 if waiting else 0)
        pdc_fence()

    @property
    def writer_waiting(self):
        """True while the writer is parked for space (read after a full fence)."""
        self._check_open()
        pdc_fence()
        return pdc_load_relaxed(&self._hdr[H_WWAIT]) != 0

    def set_writer_waiting(self, bint waiting):
        """Announce (or withdraw) that the writer is about to sleep; then re-check the ring."""
        self._check_open()
        pdc_store_relaxed(&self._hdr[H_WWAIT], 1 if waiting else 0)
        pdc_fence()

    # -- lifetime -----------------------------------------------------------------------

    def stats(self):
        """Counters straight from the shared header."""
        self._check_open()
        cdef uint64_t *h = self._hdr
        return {
            "capacity": self._cap,
            "max_records": self._max_records,
            "records_written": pdc_load_acquire(&h[H_WCOUNT]),
            "records_read": pdc_load_acquire(&h[H_RCOUNT]),
            "records_done": pdc_load_acquire(&h[H_DONE]),
            "pending_records": self._pending(),
            "used_bytes": self._used(),
        }

    cdef _release(self):
        if self._has_buf:
            PyBuffer_Release(&self._pybuf)
            self._has_buf = False
        self._closed = True
        self._hdr = NULL
        self._data = NULL
        self._base = NULL
        self._view = None
        self._segment.close()

    def close(self):
        """Unmap the ring from this process (idempotent). Does not remove the name."""
        if not self._closed:
            self._release()

    def unlink(self):
        """Remove the segment's name so it is freed once every process has closed it."""
        self._segment.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        if self._created:
            self.unlink()

    def __dealloc__(self):
        if self._has_buf:
            PyBuffer_Release(&self._pybuf)
            self._has_buf = False

    def __repr__(self):
        state = "closed" if self._closed else f"{len(self)} records"
        return (
            f"<SharedByteRing {self._name!r} {self._cap} bytes, {state} ({IMPLEMENTATION})>"
        )


cdef class FastSPSCQueue:
    """Bounded in-process object ring for one producer and one consumer (compiled).

    ``put`` returns False when full and ``get`` returns None when empty, so neither ever
    blocks; ``None`` cannot be queued. Each call is atomic under the GIL (it never releases
    it), which is what makes one-producer/one-consumer use from two threads safe.

    Args:
        capacity: Most items held at once (>= 1).
    """

    cdef PyObject **_slots
    cdef Py_ssize_t _capacity
    cdef size_t _mask
    cdef size_t _head
    cdef size_t _tail

    implementation = IMPLEMENTATION

    def __cinit__(self, capacity=4096):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise InvalidConfigurationError(
                f"FastSPSCQueue capacity must be an int >= 1, got {capacity!r}"
            )
        cdef size_t size = 1
        while size < <size_t>capacity:
            size <<= 1
        self._slots = <PyObject **>calloc(size, sizeof(PyObject *))
        if self._slots == NULL:
            raise MemoryError()
        self._capacity = capacity
        self._mask = size - 1
        self._head = 0
        self._tail = 0

    def __dealloc__(self):
        if self._slots != NULL:
            while self._head != self._tail:
                Py_XDECREF(self._slots[self._head & self._mask])
                self._head += 1
            free(self._slots)
            self._slots = NULL

    @property
    def capacity(self):
        """Most items held at once."""
        return self._capacity

    def put(self, object item):
        """Append ``item``; False (nothing queued) when full."""
        if self._tail - self._head >= <size_t>self._capacity:
            return False
        if item is None:
            raise TypeError("FastSPSCQueue cannot hold None (get() returns None when empty)")
        Py_INCREF(item)
        self._slots[self._tail & self._mask] = <PyObject *>item
        self._tail += 1
        return True

    def get(self):
        """Pop the oldest item, or None when empty."""
        if self._head == self._tail:
            return None
        cdef size_t i = self._head & self._mask
        cdef object item = <object>self._slots[i]  # new reference
        Py_XDECREF(self._slots[i])  # drop the ring's reference
        self._slots[i] = NULL
        self._head += 1
        return item

    def put_batch(self, items):
        """Append items until full; returns how many were queued."""
        cdef Py_ssize_t count = 0
        for item in items:
            if not self.put(item):
                break
            count += 1
        return count

    def get_batch(self, Py_ssize_t max_count):
        """Pop up to ``max_count`` items, oldest first."""
        out = []
        while max_count > 0 and self._head != self._tail:
            out.append(self.get())
            max_count -= 1
        return out

    def clear(self):
        """Drop every item; returns how many were dropped."""
        cdef Py_ssize_t n = 0
        while self._head != self._tail:
            self.get()
            n += 1
        return n

    def qsize(self):
        """Items queued now."""
        return self._tail - self._head

    def __len__(self):
        return self._tail - self._head

    @property
    def empty(self):
        """True when nothing is queued."""
        return self._head == self._tail

    @property
    def full(self):
        """True when ``put`` would return False."""
        return self._tail - self._head >= <size_t>self._capacity

    def __repr__(self):
        return (
            f"<FastSPSCQueue {self._tail - self._head}/{self._capacity} ({IMPLEMENTATION})>"
        )


# --- a lock whose uncontended acquire and release cost no argument parsing -------------------

cdef class FastLock:
    """``threading.Lock`` for the process tier's send and receive paths (same methods).

    Every caller holds the GIL, so the held flag is a C field that an uncontended acquire
    tests and sets with no system call and no argument parsing (``threading.Lock`` costs
    about 90 ns for an acquire and a release on Python 3.11, this about 30). Contended
    acquires count themselves as waiters and block, without the GIL, on a gate that a
    release opens once for each release that finds a waiter; a woken waiter tests the flag
    again (another thread may have taken the lock first, as with ``threading.Lock``, which
    is not fair either). While it waits, signal handlers run, so a ``KeyboardInterrupt``
    raises as it would from ``threading.Lock``.
    """

    cdef PyThread_type_lock _gate  # closed: waiters block on it; a release opens it once
    cdef bint _held
    cdef Py_ssize_t _waiters

    def __cinit__(self):
        self._gate = PyThread_allocate_lock()
        if self._gate == NULL:
            raise MemoryError("cannot allocate a lock")
        PyThread_acquire_lock(self._gate, 1)  # closed from the start

    def __dealloc__(self):
        if self._gate != NULL:
            PyThread_release_lock(self._gate)
            PyThread_free_lock(self._gate)

    def acquire(self, blocking=True, timeout=-1):
        """Take the lock; False when ``blocking`` is false or ``timeout`` (seconds) expired."""
        cdef double wait = -1
        if timeout is not -1:  # checked as threading.Lock checks it, even when free
            wait = timeout
            if not blocking and wait != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            if wait < 0 and wait != -1:
                raise ValueError("timeout value must be a non-negative number")
            if wait > _TIMEOUT_MAX:
                raise OverflowError("timeout value is too large")
        if not self._held:
            self._held = True
            return True
        if not blocking:
            return False
        cdef double deadline = _monotonic() + wait if wait >= 0 else -1
        cdef long long us
        cdef PyLockStatus got
        self._waiters += 1
        try:
            while True:
                if deadline < 0:
                    us = -1
                else:
                    us = <long long>(max(deadline - _monotonic(), 0.0) * 1e6)
                with nogil:
                    got = PyThread_acquire_lock_timed(self._gate, us, 1)
                if not self._held:  # free now (woken, or released as the wait ended)
                    self._held = True
                    return True
                if got == PY_LOCK_INTR:
                    PyErr_CheckSignals()  # a signal interrupted the wait: it may raise
                elif got != PY_LOCK_ACQUIRED:
                    return False  # timed out
        finally:
            self._waiters -= 1

    def release(self):
        """Give the lock back (``RuntimeError`` when it is not held)."""
        if not self._held:
            raise RuntimeError("release unlocked lock")
        self._held = False
        if self._waiters:
            PyThread_release_lock(self._gate)  # open the gate for one waiter

    def locked(self):
        """True while some thread holds the lock."""
        return self._held

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
