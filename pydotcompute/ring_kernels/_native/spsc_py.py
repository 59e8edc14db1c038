"""Pure-Python twin of the ``fast_spsc`` extension: same names, same semantics, same bytes.

``pydotcompute.ring_kernels._native`` imports the compiled extension when it is built and
this module otherwise (or when ``PYDOTCOMPUTE_PUREPYTHON=1``). Both define:

- `FastSPSCQueue`: a bounded in-process object ring for one producer and one
  consumer. ``put`` returns False when full, ``get`` returns None when empty. It relies on
  the GIL for atomicity (each call runs without releasing it), so it is not meant for
  free-threaded builds.
- `SharedByteRing`: a single-producer single-consumer ring of variable-length byte
  records in a named shared-memory segment, for two processes.

This file mirrors one extension module name for name, which is why it is a little past the
house limit.

Shared ring layout (all integers native-endian ``uint64``, 64-byte cache lines):

```text
line 0   magic, capacity, max_records                      written once by the creator
line 1   tail, records_written                             written by the producer per record
line 2   head, records_read, records_done, done_mark       written by the consumer per record
line 3   writer_waiting, writer_closed, reader_waiting, reader_closed
                                                           written only to park, wake or close
256..    data: ``capacity`` bytes (a multiple of 8)
```

The flags have a line of their own because each side reads the other's on every record (a
write checks ``reader_waiting`` and ``reader_closed``): beside ``head`` they would pull the
consumer's busiest line across cores once per record (0.15 µs of a raw round trip here).

``head`` and ``tail`` are byte positions that only grow (``2**64`` bytes never wrap in
practice); the offset in the data area is ``position % capacity``. A record is an 8-byte
length followed by the payload, padded to 8 bytes; because records and the capacity are
multiples of 8 the length word never straddles the end, while the payload may wrap and is
then copied in two pieces. A record larger than ``capacity - 8`` can never fit and is
refused with `InvalidConfigurationError`.

Commit protocol and memory ordering. The producer copies the length and payload into the
data area first and publishes the record by storing the new ``tail`` last; the consumer
loads ``tail`` first and reads only bytes below it, then stores the new ``head`` after it
has copied the record out. So the consumer never sees a record that is still being written,
and the producer never overwrites bytes still being read. In the extension these are C11
release stores and acquire loads. In this twin they are aligned 8-byte stores and loads
through a ``memoryview`` cast to ``Q`` (one ``mov`` on x86-64), issued in program order by
separate interpreter calls; that is sufficient on x86-64's total store order but not
guaranteed on weakly ordered CPUs (ARM), where the compiled extension should be used.

Parking. A side that has spun without progress sets its ``*_waiting`` flag, issues a full
fence, re-checks the ring and only then sleeps on a doorbell owned by the caller (a pipe);
the other side issues a full fence after publishing and rings the doorbell when it sees the
flag. This is Dekker's pattern: with both fences at least one side sees the other's store,
so a wake-up cannot be lost. The twin's fence is a lock acquire/release (a locked
instruction on x86-64); callers also sleep in bounded slices, which turns any missed
wake-up into a short delay instead of a hang.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from ...exceptions import (
    InvalidConfigurationError,
    QueueClosedError,
    RingCorruptedError,
)

try:  # POSIX shared memory without multiprocessing's attach-side tracking
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = (
    "HEADER_BYTES",
    "IMPLEMENTATION",
    "RECORD_HEADER_BYTES",
    "FastLock",
    "FastSPSCQueue",
    "SharedByteRing",
    "SharedSegment",
)

IMPLEMENTATION = "python"

MAGIC = 0x32474E4952434450  # b"PDCRING2" little-endian (the layout's version)
HEADER_BYTES = 256
RECORD_HEADER_BYTES = 8
MIN_CAPACITY = 64
MAX_CAPACITY = 1 << 40

# uint64 slot indices in the header
H_MAGIC, H_CAPACITY, H_MAX_RECORDS = 0, 1, 2
# header words are uint64: counters and positions wrap as the compiled ring's do
_U64 = (1 << 64) - 1
H_TAIL, H_WCOUNT = 8, 9
H_HEAD, H_RCOUNT, H_DONE, H_DONE_MARK = 16, 17, 18, 19
H_WWAIT, H_WCLOSED, H_RWAIT, H_RCLOSED = 24, 25, 26, 27

WRITE_FULL, WRITE_OK, WRITE_WAKE = 0, 1, 2

_FENCE = threading.Lock()

#: The process tier's send and receive lock: ``threading.Lock`` itself here (the compiled
#: module's `FastLock` has the same methods and skips the argument parsing).
FastLock = threading.Lock


def _fence() -> None:
    """A full memory barrier, as far as pure Python can get one (a locked instruction)."""
    _FENCE.acquire()
    _FENCE.release()


def _round_capacity(capacity: int) -> int:
    if not isinstance(capacity, int) or isinstance(capacity, bool):
        raise InvalidConfigurationError(
            f"ring capacity must be an int number of bytes, got {type(capacity).__name__}"
        )
    if not MIN_CAPACITY <= capacity <= MAX_CAPACITY:
        raise InvalidConfigurationError(
            f"ring capacity must be between {MIN_CAPACITY} bytes and 1 TiB, got {capacity}"
        )
    return (capacity + 7) & ~7


def _new_name() -> str:
    # short: macOS limits POSIX shm names to 31 characters
    return f"pdc_{os.getpid()}_{secrets.token_hex(4)}"


def too_large_error(size: int, capacity: int, name: str) -> InvalidConfigurationError:
    """The error for a record that can never fit (shared by both implementations)."""
    return InvalidConfigurationError(
        f"a record of {size} bytes can never fit shared ring {name!r} of {capacity} bytes "
        f"(largest record: {capacity - RECORD_HEADER_BYTES} bytes); create the ring with a "
        "larger capacity or send smaller messages"
    )


def corrupt_error(name: str, detail: str) -> RingCorruptedError:
    """The error for positions or a length word that cannot be right (both implementations)."""
    return RingCorruptedError(
        f"shared ring {name!r} is corrupt: {detail}; was the segment written by something "
        "other than its one producer and one consumer? The ring cannot be used any more"
    )


def length_detail(length: int, position: int, committed: int) -> str:
    """``corrupt_error`` detail for a length word larger than the committed bytes."""
    return (
        f"a record at position {position} claims {length} bytes but only {committed} bytes "
        "are committed"
    )


def positions_detail(head: int, tail: int, capacity: int) -> str:
    """``corrupt_error`` detail for a head/tail pair no ring of ``capacity`` bytes can have."""
    if head & 7 or tail & 7:
        return f"head {head} / tail {tail} is not on a record boundary (a multiple of 8 bytes)"
    if tail < head + RECORD_HEADER_BYTES:
        return f"tail {tail} is less than one record header past head {head} (committed)"
    return (
        f"tail {tail} is {tail - head} bytes past head {head}, more than the capacity "
        f"of {capacity} bytes (committed)"
    )


class _Mapping:
    """A shared mapping that keeps no file descriptor.

    ``mmap.mmap`` keeps a duplicate of the descriptor it maps for as long as the mapping
    lives (before Python 3.13, which added ``trackfd=False``): two rings and a timing block
    per process kernel would each hold one for nothing. This maps with ``mmap(2)`` through
    ``ctypes`` instead and refuses, as ``mmap.close`` does, to unmap while a view of it
    exists (each view keeps a reference to the mapped array).
    """

    __slots__ = ("_addr", "_array", "_size")

    def __init__(self, fd: int, size: int) -> None:
        libc = _libc()
        flags = mmap.PROT_READ | mmap.PROT_WRITE
        addr = libc.mmap(None, size, flags, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of a shared segment failed: {os.strerror(err)}")
        self._addr: int = addr
        self._size = size
        self._array: Any = (ctypes.c_char * size).from_address(addr)

    def view(self) -> memoryview:
        """A byte view of the whole mapping."""
        return memoryview(self._array).cast("B")

    def close(self) -> None:
        """Unmap (idempotent). Raises ``BufferError`` while a view of the mapping exists."""
        array = self._array
        if array is None:
            return
        # here: ``self._array``, ``array`` and getrefcount's argument; more is a live view
        if sys.getrefcount(array) > 3:
            raise BufferError("cannot close a shared segment while views of it exist")
        self._array = None
        del array
        _libc().munmap(self._addr, self._size)


_MAP_FAILED = ctypes.c_void_p(-1).value
_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        )
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        _LIBC = libc
    return _LIBC


class _TrackedMapping:
    """``mmap.mmap(..., trackfd=False)`` (Python 3.13+): no descriptor kept either."""

    __slots__ = ("_mmap",)

    def __init__(self, fd: int, size: int) -> None:
        self._mmap = mmap.mmap(fd, size, trackfd=False)  # type: ignore[call-arg,unused-ignore]

    def view(self) -> memoryview:
        """A byte view of the whole mapping."""
        return memoryview(self._mmap)

    def close(self) -> None:
        """Unmap (idempotent); ``BufferError`` while a view of it exists."""
        self._mmap.close()


def _map_shared(fd: int, size: int) -> Any:
    """Map ``size`` bytes of shared-memory descriptor ``fd`` without keeping ``fd``."""
    if sys.version_info >= (3, 13):
        return _TrackedMapping(fd, size)
    return _Mapping(fd, size)


class SharedSegment:
    """A named POSIX shared-memory segment mapped into this process.

    Unlike `multiprocessing.shared_memory.SharedMemory` on Python < 3.13, attaching
    does not register the segment with this process's resource tracker (which would unlink
    it when an unrelated attaching process exits). The creator registers it, so a creator
    that dies without ``unlink()`` still has the segment removed by the tracker.

    Args:
        name: Segment name without the leading slash; generated when None.
        size: Bytes to create (ignored when attaching).
        create: Create a new segment (fails if the name exists) or attach to one.
    """

    def __init__(self, name: str | None = None, size: int = 0, *, create: bool = True) -> None:
        self.name = name or _new_name()
        self._created = create
        self._unlinked = False
        self._shm: Any = None
        path = "/" + self.name
        if _posixshmem is None:  # pragma: no cover - Windows
            from multiprocessing.shared_memory import SharedMemory

            self._shm = SharedMemory(self.name, create=create, size=size)
            self._mmap: Any = None
            self.buf: memoryview = self._shm.buf
            self.size = self._shm.size
            return
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = _posixshmem.shm_open(path, flags, mode=0o600)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no shared-memory segment named {self.name!r}: it was never created or has "
                "already been unlinked (its owner stopped)"
            ) from None
        try:
            if create:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            self._mmap = _map_shared(fd, self.size)
        except BaseException:
            if create:
                _posixshmem.shm_unlink(path)
            raise
        finally:
            os.close(fd)
        if create:
            from multiprocessing import resource_tracker

            resource_tracker.register(path, "shared_memory")
        self.buf = self._mmap.view()

    def close(self) -> None:
        """Unmap the segment from this process (idempotent); views must be released first."""
        if self._shm is not None:  # pragma: no cover - Windows
            self._shm.close()
            return
        if self._mmap is not None:
            self.buf.release()
            self._mmap.close()
            self._mmap = None

    def unlink(self) -> None:
        """Remove the segment name (idempotent); mappings stay valid until closed."""
        if self._unlinked:
            return
        self._unlinked = True
        if self._shm is not None:  # pragma: no cover - Windows
            self._shm.unlink()
            return
        path = "/" + self.name
        try:
            _posixshmem.shm_unlink(path)
        except FileNotFoundError:
            pass
        if self._created:
            from multiprocessing import resource_tracker

            resource_tracker.unregister(path, "shared_memory")


class _ClosedView:
    """Stands in for the released views of a closed ring: any use says so clearly."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _fail(self, *args: object) -> Any:
        raise ValueError(f"shared ring {self.name!r} is closed in this process")

    __getitem__ = __setitem__ = _fail


class SharedByteRing:
    """SPSC ring of variable-length byte records in shared memory (pure-Python twin).

    One process writes (``try_write``), one reads (``try_read``); each side keeps its own
    object. Create it in one process with ``SharedByteRing(capacity)`` and attach in the
    other with ``SharedByteRing.attach(name)``. The creator calls `unlink` when done.

    Args:
        capacity: Data bytes (rounded up to a multiple of 8); a record takes 8 bytes plus its
            payload rounded up to 8.
        name: Segment name; generated when None.
        max_records: Also bound the number of queued records (0 = only bytes bound it).
        create: False attaches to an existing segment (``capacity`` is then read from it).
    """

    implementation = IMPLEMENTATION

    def __init__(
        self,
        capacity: int = 1 << 20,
        name: str | None = None,
        *,
        max_records: int = 0,
        create: bool = True,
    ) -> None:
        if create:
            capacity = _round_capacity(capacity)
            if max_records < 0:
                raise InvalidConfigurationError(
                    f"max_records must be >= 0 (0 = unbounded), got {max_records}"
                )
            self._segment = SharedSegment(name, HEADER_BYTES + capacity, create=True)
        else:
            if name is None:
                raise InvalidConfigurationError("attaching to a shared ring needs its name")
            self._segment = SharedSegment(name, create=False)
        buf = self._segment.buf
        self._q = buf[:HEADER_BYTES].cast("Q")
        q = self._q
        if create:
            q[H_CAPACITY] = capacity
            q[H_MAX_RECORDS] = max_records
            q[H_MAGIC] = MAGIC
        elif (
            q[H_MAGIC] != MAGIC
            or self._segment.size < HEADER_BYTES + q[H_CAPACITY]
            or q[H_CAPACITY] < MIN_CAPACITY
            or q[H_CAPACITY] & 7
        ):
            self._release()
            raise InvalidConfigurationError(
                f"shared-memory segment {name!r} is not a pydotcompute ring "
                "(bad magic number or size)"
            )
        self._capacity: int = q[H_CAPACITY]
        self._max_records: int = q[H_MAX_RECORDS]
        self._data = buf[HEADER_BYTES : HEADER_BYTES + self._capacity]
        self._words = self._data.cast("Q")
        self._head_cache = q[H_HEAD]
        self._tail_cache = q[H_TAIL]
        self._rcount_cache = q[H_RCOUNT]
        self._created = create
        self._closed = False

    @classmethod
    def attach(cls, name: str) -> SharedByteRing:
        """Map an existing ring created (possibly in another process) under ``name``."""
        return cls(name=name, create=False)

    # -- properties -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The shared-memory segment name (pass it to `attach`)."""
        return self._segment.name

    @property
    def capacity(self) -> int:
        """Data bytes in the ring."""
        return self._capacity

    @property
    def max_record_size(self) -> int:
        """The largest payload that fits an empty ring."""
        return self._capacity - RECORD_HEADER_BYTES

    @property
    def max_records(self) -> int:
        """The record-count bound (0 = none)."""
        return self._max_records

    @property
    def closed(self) -> bool:
        """True after `close` in this process."""
        return self._closed

    def __len__(self) -> int:
        """Records written and not yet read."""
        return self._pending()

    @property
    def used_bytes(self) -> int:
        """Bytes occupied by committed, unread records (headers and padding included)."""
        return self._used()

    # The consumer's counter is loaded first: it never overtakes the producer's, so the
    # difference cannot go negative however the two race.
    def _pending(self) -> int:
        read = self._q[H_RCOUNT]
        return int((self._q[H_WCOUNT] - read) & _U64)

    def _used(self) -> int:
        head = self._q[H_HEAD]
        return int(self._q[H_TAIL] - head)

    # -- producer -----------------------------------------------------------------------

    def _place(self, data: Any, n: int, tail: int, written: int) -> int:
        """Copy one record of ``n`` bytes in at ``tail`` (``written`` records so far), not
        yet published; the ring bytes it takes, 0 when it does not fit now, -1 when it can
        never fit. What `try_write` and `write_many` share."""
        q = self._q
        cap = self._capacity
        need = RECORD_HEADER_BYTES + ((n + 7) & ~7)
        if need > cap:
            return -1
        used = tail - self._head_cache
        if need > cap - used or tail & 7:
            head = self._head_cache = q[H_HEAD]
            used = tail - head
            if not 0 <= used <= cap or (head | tail) & 7:
                raise corrupt_error(self.name, positions_detail(head, tail, cap))
            if need > cap - used:
                return 0
        if self._max_records and (written - self._rcount_cache) & _U64 >= self._max_records:
            self._rcount_cache = q[H_RCOUNT]
            if (written - self._rcount_cache) & _U64 >= self._max_records:
                return 0
        off = tail % cap
        self._words[off >> 3] = n
        p = off + RECORD_HEADER_BYTES
        if p == cap:
            p = 0
        first = cap - p
        if n <= first:
            self._data[p : p + n] = data
        else:
            self._data[p:cap] = data[:first]
            self._data[: n - first] = data[first:]
        return need

    def try_write(self, data: bytes | bytearray | memoryview) -> int:
        """Append one record if it fits now.

        Returns:
            0 (``WRITE_FULL``) when there is no room now, 1 (``WRITE_OK``) when written, 2
            (``WRITE_WAKE``) when written and the reader is parked (ring its doorbell).

        Raises:
            InvalidConfigurationError: the record is larger than the ring can ever hold.
            QueueClosedError: the reader closed the ring.
        """
        q = self._q
        if type(data) is not bytes:
            data = memoryview(data).cast("B")
        n = len(data)
        cap = self._capacity
        if RECORD_HEADER_BYTES + ((n + 7) & ~7) > cap:
            raise too_large_error(n, cap, self.name)
        if q[H_RCLOSED]:
            raise QueueClosedError(f"shared ring {self.name!r}: the reader has closed it")
        tail = q[H_TAIL]
        written = q[H_WCOUNT]
        need = self._place(data, n, tail, written)
        if not need:
            return WRITE_FULL
        q[H_WCOUNT] = (written + 1) & _U64
        q[H_TAIL] = (tail + need) & _U64  # publish: the record is committed from here on
        _fence()
        return WRITE_WAKE if q[H_RWAIT] else WRITE_OK

    def write_many(self, records: list[bytes]) -> tuple[int, bool]:
        """Append the records of ``records`` in order while they fit, and publish them at
        once: one store of the tail, one look at the reader's flag.

        Returns:
            ``(count, wake)``: how many were written (a prefix of ``records``), and True
            when the reader is parked (ring its doorbell once for the batch).

        Raises:
            InvalidConfigurationError: the first record is larger than the ring can ever
                hold (a later one stops the batch before it, unwritten).
            QueueClosedError: the reader closed the ring.
        """
        q = self._q
        if q[H_RCLOSED]:
            raise QueueClosedError(f"shared ring {self.name!r}: the reader has closed it")
        tail = q[H_TAIL]
        written = q[H_WCOUNT]
        i = 0
        for data in records:
            if type(data) is not bytes:
                data = bytes(data)
            need = self._place(data, len(data), tail, written)
            if need < 0 and i == 0:
                raise too_large_error(len(data), self._capacity, self.name)
            if need <= 0:
                break
            tail = (tail + need) & _U64
            written = (written + 1) & _U64
            i += 1
        if not i:
            return 0, False
        q[H_WCOUNT] = written
        q[H_TAIL] = tail  # publish the whole batch
        _fence()
        return i, bool(q[H_RWAIT])

    def writable(self, size: int) -> bool:
        """True when a record of ``size`` payload bytes would fit now."""
        need = RECORD_HEADER_BYTES + ((size + 7) & ~7)
        if need > self._capacity - self._used():
            return False
        return not (self._max_records and self._pending() >= self._max_records)

    def spin_write(self, data: bytes | bytearray | memoryview, budget_s: float) -> int:
        """Like `try_write`, retrying for up to ``budget_s`` seconds while full."""
        result = self.try_write(data)
        if result or budget_s <= 0:
            return result
        deadline = time.perf_counter() + budget_s
        q = self._q
        while time.perf_counter() < deadline:
            if q[H_RCLOSED]:
                break
            result = self.try_write(data)
            if result:
                return result
        return self.try_write(data)

    def close_writer(self) -> None:
        """Mark that no more records will come; the reader drains and then sees it."""
        self._q[H_WCLOSED] = 1
        _fence()

    @property
    def writer_closed(self) -> bool:
        """True once the producer called `close_writer`."""
        return bool(self._q[H_WCLOSED])

    # -- consumer -----------------------------------------------------------------------

    def try_read(self) -> bytes | None:
        """Pop the oldest committed record, or return None when there is none."""
        q = self._q
        head = q[H_HEAD]
        if self._tail_cache <= head:
            self._tail_cache = q[H_TAIL]
            if self._tail_cache <= head:
                return None
        cap = self._capacity
        tail = self._tail_cache
        if tail - head > cap or tail - head < RECORD_HEADER_BYTES or (head | tail) & 7:
            raise corrupt_error(self.name, positions_detail(head, tail, cap))
        off = head % cap
        n = self._words[off >> 3]
        committed = tail - head - RECORD_HEADER_BYTES
        if n > committed:
            raise corrupt_error(self.name, length_detail(n, head, committed))
        p = off + RECORD_HEADER_BYTES
        if p == cap:
            p = 0
        first = cap - p
        if n <= first:
            out = bytes(self._data[p : p + n])
        else:
            out = bytes(self._data[p:cap]) + bytes(self._data[: n - first])
        q[H_RCOUNT] = (q[H_RCOUNT] + 1) & _U64
        q[H_HEAD] = (head + RECORD_HEADER_BYTES + ((n + 7) & ~7)) & _U64  # release the space
        return out

    def readable(self) -> bool:
        """True when a committed record is waiting."""
        q = self._q
        return bool(q[H_TAIL] != q[H_HEAD])

    def spin_read(self, budget_s: float, wake_fd: int = -1) -> bytes | None:
        """Like `try_read`, polling for up to ``budget_s`` seconds while empty.

        Stops early when the writer has closed the ring. With a ``wake_fd``, a read that
        finds the writer parked for space writes one byte to that doorbell (errors ignored:
        a full pipe already holds a wake-up, a closed one means the writer is gone).
        """
        out = self.try_read()
        if out is None and budget_s > 0:
            q = self._q
            deadline = time.perf_counter() + budget_s
            head = q[H_HEAD]
            while time.perf_counter() < deadline:
                if q[H_TAIL] != head or q[H_WCLOSED]:
                    break
            out = self.try_read()
        if out is not None and wake_fd >= 0 and self.writer_waiting:
            try:
                os.write(wake_fd, b"\x00")
            except OSError:
                pass
        return out

    def read_many(self, max_count: int, wake_fd: int = -1) -> list[bytes]:
        """Pop up to ``max_count`` committed records, oldest first (``[]``: none), in one
        call; with a ``wake_fd``, ring it once if the writer is parked for space."""
        out: list[bytes] = []
        while max_count > 0 and (rec := self.try_read()) is not None:
            out.append(rec)
            max_count -= 1
        if out and wake_fd >= 0 and self.writer_waiting:
            try:
                os.write(wake_fd, b"\x00")
            except OSError:
                pass
        return out

    def read_all(self) -> list[bytes]:
        """Pop every committed record (used to recover what a dead peer left behind)."""
        out: list[bytes] = []
        while (rec := self.try_read()) is not None:
            out.append(rec)
        return out

    def mark_done(self, out: SharedByteRing | None = None, wake_fd: int = -1) -> None:
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
        q = self._q
        if out is not None:
            q[H_DONE_MARK] = out.records_written
        q[H_DONE] = q[H_RCOUNT]
        if wake_fd >= 0:
            _fence()
            if q[H_WWAIT] and q[H_TAIL] == q[H_HEAD]:
                try:
                    os.write(wake_fd, b"\x00")
                except OSError:
                    pass

    @property
    def done_mark(self) -> int:
        """The answer ring's ``records_written`` when records were last marked done (read
        ``records_done`` first: the mark is stored before it)."""
        return int(self._q[H_DONE_MARK])

    @property
    def records_written(self) -> int:
        """Records the producer has written so far."""
        return int(self._q[H_WCOUNT])

    @property
    def records_done(self) -> int:
        """Records the consumer has marked finished (see `mark_done`)."""
        return int(self._q[H_DONE])

    @property
    def records_read(self) -> int:
        """Records the consumer has taken so far."""
        return int(self._q[H_RCOUNT])

    def close_reader(self) -> None:
        """Mark that the reader is gone; further writes raise ``QueueClosedError``."""
        self._q[H_RCLOSED] = 1
        _fence()

    @property
    def reader_closed(self) -> bool:
        """True once the consumer called `close_reader`."""
        return bool(self._q[H_RCLOSED])

    # -- parking flags ------------------------------------------------------------------

    @property
    def reader_waiting(self) -> bool:
        """True while the reader is parked on its doorbell (read after a full fence)."""
        _fence()
        return bool(self._q[H_RWAIT])

    def spin_read_quiet(self, budget_s: float, wake_fd: int = -1) -> tuple[bytes | None, bool]:
        """`spin_read` with the reader's waiting flag (the writer's cue to ring the
        doorbell) withdrawn meanwhile: a record found while polling needs no wake-up. A
        flag that was set is set again, and the ring looked at once more, before it
        returns, so no wake-up is lost.

        Returns ``(record or None, behind)``: ``behind`` is True when more records,
        written while the flag was withdrawn (nobody was rung for them), wait after the
        one returned.
        """
        armed = self.reader_waiting
        if armed:
            self.set_reader_waiting(False)
        out = self.spin_read(budget_s, wake_fd)
        behind = False
        if armed:
            self.set_reader_waiting(True)
            if out is None:
                out = self.spin_read(0, wake_fd)
            else:
                behind = self.readable()
        return out, behind

    def set_reader_waiting(self, waiting: bool) -> None:
        """Announce (or withdraw) that the reader is about to sleep; then re-check the ring."""
        self._q[H_RWAIT] = 1 if waiting else 0
        _fence()

    @property
    def writer_waiting(self) -> bool:
        """True while the writer is parked for space (read after a full fence)."""
        _fence()
        return bool(self._q[H_WWAIT])

    def set_writer_waiting(self, waiting: bool) -> None:
        """Announce (or withdraw) that the writer is about to sleep; then re-check the ring."""
        self._q[H_WWAIT] = 1 if waiting else 0
        _fence()

    # -- lifetime -----------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters straight from the shared header."""
        q = self._q
        return {
            "capacity": self._capacity,
            "max_records": self._max_records,
            "records_written": int(q[H_WCOUNT]),
            "records_read": int(q[H_RCOUNT]),
            "records_done": int(q[H_DONE]),
            "pending_records": self._pending(),
            "used_bytes": self._used(),
        }

    def _release(self) -> None:
        closed = _ClosedView(self._segment.name)
        for view in ("_words", "_data", "_q"):
            v = getattr(self, view, None)
            if isinstance(v, memoryview):
                v.release()
            setattr(self, view, closed)
        self._segment.close()

    def close(self) -> None:
        """Unmap the ring from this process (idempotent). Does not remove the name."""
        if not self._closed:
            self._closed = True
            self._release()

    def unlink(self) -> None:
        """Remove the segment's name so it is freed once every process has closed it."""
        self._segment.unlink()

    def __enter__(self) -> SharedByteRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self._created:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} records"
        return f"<SharedByteRing {self.name!r} {self._capacity} bytes, {state} ({IMPLEMENTATION})>"


class FastSPSCQueue:
    """Bounded in-process object ring for one producer and one consumer (pure-Python twin).

    ``put`` returns False when full and ``get`` returns None when empty, so neither ever
    blocks; ``None`` cannot be queued. Each call is atomic under the GIL.

    Args:
        capacity: Most items held at once (>= 1).
    """

    __slots__ = ("_capacity", "_items")

    implementation = IMPLEMENTATION

    def __init__(self, capacity: int = 4096) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise InvalidConfigurationError(
                f"FastSPSCQueue capacity must be an int >= 1, got {capacity!r}"
            )
        self._capacity = capacity
        self._items: deque[Any] = deque()

    @property
    def capacity(self) -> int:
        """Most items held at once."""
        return self._capacity

    def put(self, item: Any) -> bool:
        """Append ``item``; False (nothing queued) when full."""
        items = self._items
        if len(items) >= self._capacity:
            return False
        if item is None:
            raise TypeError("FastSPSCQueue cannot hold None (get() returns None when empty)")
        items.append(item)
        return True

    def get(self) -> Any:
        """Pop the oldest item, or None when empty."""
        items = self._items
        return items.popleft() if items else None

    def put_batch(self, items: Iterable[Any]) -> int:
        """Append items until full; returns how many were queued."""
        count = 0
        for item in items:
            if not self.put(item):
                break
            count += 1
        return count

    def get_batch(self, max_count: int) -> list[Any]:
        """Pop up to ``max_count`` items, oldest first."""
        items = self._items
        return [items.popleft() for _ in range(min(max_count, len(items)))]

    def clear(self) -> int:
        """Drop every item; returns how many were dropped."""
        n = len(self._items)
        self._items.clear()
        return n

    def qsize(self) -> int:
        """Items queued now."""
        return len(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def empty(self) -> bool:
        """True when nothing is queued."""
        return not self._items

    @property
    def full(self) -> bool:
        """True when ``put`` would return False."""
        return len(self._items) >= self._capacity

    def __repr__(self) -> str:
        return f"<FastSPSCQueue {len(self._items)}/{self._capacity} ({IMPLEMENTATION})>"
