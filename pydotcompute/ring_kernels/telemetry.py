"""Per-kernel counters, an O(1) latency histogram, and GPU telemetry through NVML.

Design notes:
- The histogram is log-linear (8 sub-buckets per power of two, HDR-style): recording is a
  ``bit_length`` and a list increment (a table lookup from 128 ns to 65 us, where actor
  latencies fall: big-int arithmetic costs more than the lookup), percentiles are within
  12.5% of the true value.
  Its bucket list is allocated on the first record so an idle actor stays small.
- Tier-1 actors time each message with a `LatencyRecorder`: the compiled one
  (``_native/fast_telemetry.pyx``) reads the clock and bins the latency in C, one call per
  message; its Python twin `PyLatencyRecorder` buffers latencies and bins them with NumPy
  every ``FOLD_AT``. Either is drained into the record (`_fold`) before anything reads a
  latency statistic, so the statistics stay exact: total, min, max and the histogram are
  read through properties that fold first. ``record_latency`` buffers the same way.
- ``GPUMonitor`` imports ``pynvml`` (from the ``nvidia-ml-py`` package) only when first
  used; with no library, driver or GPU it reports ``is_available = False`` and its queries
  return PyDotCompute 0.2's placeholders (name ``"N/A"``, zeros), or None with
  ``strict=True``: a zero reads like an idle GPU, so code that must tell "no data" apart
  asks strictly or checks ``is_available``.
- ``uptime_seconds`` is a stored number on a record built by hand (0.2's contract: it
  changes only when assigned) and a live clock on the records the runtime keeps
  (``live=True``), whose throughput must follow time without anyone assigning it.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, overload

import numpy as np

from ._native import telemetry_extension

__all__ = (
    "GPUInfo",
    "GPUMonitor",
    "LatencyHistogram",
    "LatencyRecorder",
    "PyLatencyRecorder",
    "RingKernelTelemetry",
    "SharedLatencyBlock",
    "TelemetryCollector",
    "get_gpu_monitor",
)

_SUB_BITS = 3
_SUB = 1 << _SUB_BITS
_BUCKETS = (64 - _SUB_BITS + 1) * _SUB


def _bucket_of(ns: int) -> int:
    """The bucket index of an ``ns`` latency."""
    if ns < _SUB:
        return max(ns, 0)
    shift = ns.bit_length() - _SUB_BITS - 1
    idx = ((shift + 1) << _SUB_BITS) + ((ns >> shift) & (_SUB - 1))
    return idx if idx < _BUCKETS else _BUCKETS - 1


# Buckets are at least 16 ns wide from 128 ns up, so below 65,536 ns (where most actor
# latencies fall) ``ns >> 4`` determines the bucket: a 4,096-entry table of small ints.
_MID_BUCKET: tuple[int, ...] = tuple(_bucket_of(max(i << 4, 128)) for i in range(65536 >> 4))
_MID_LO, _MID_HI = 128, 65536
# the same for NumPy batches (telemetry._fold), with a direct table below 128 ns
_MID_BUCKET_NP = np.array(_MID_BUCKET, dtype=np.intp)
_LOW_BUCKET_NP = np.array([_bucket_of(i) for i in range(_MID_LO)], dtype=np.intp)

FOLD_AT = _FOLD_AT = 512  # pending latencies folded at once (a list of at most ~20 KiB per actor)
_FOLD_LOCK = threading.Lock()  # one folder at a time (a reader may be on another thread)


class LatencyHistogram:
    """Log-linear histogram of nanosecond latencies; O(1) record, approximate percentiles."""

    __slots__ = ("_buckets", "count")

    def __init__(self) -> None:
        self._buckets: list[int] | None = None
        self.count = 0

    def record(self, ns: int) -> None:
        b = self._buckets
        if b is None:
            b = self._buckets = [0] * _BUCKETS
        b[_bucket_of(ns)] += 1
        self.count += 1

    @staticmethod
    def _upper(idx: int) -> int:
        if idx < _SUB:
            return idx
        shift = (idx >> _SUB_BITS) - 1
        sub = idx & (_SUB - 1)
        return ((_SUB + sub + 1) << shift) - 1

    def percentile(self, q: float) -> int:
        """The ``q``-th percentile (0..100) in ns (upper edge of its bucket); 0 if empty."""
        if not self.count or self._buckets is None:
            return 0
        target = max(1, int(self.count * q / 100.0 + 0.999999))
        seen = 0
        for idx, n in enumerate(self._buckets):
            seen += n
            if seen >= target:
                return self._upper(idx)
        return self._upper(_BUCKETS - 1)

    def bucket_counts(self) -> list[tuple[int, int]]:
        """``(bucket, count)`` of every bucket that holds a latency, in bucket order."""
        b = self._buckets
        return [] if b is None else [(i, c) for i, c in enumerate(b) if c]

    def cumulative_counts(self, bounds_ns: Sequence[int]) -> list[int]:
        """How many latencies fell at or below each of ``bounds_ns`` (ascending ns bounds).

        A latency counts towards the first bound at or above the upper edge of its bucket,
        so a bound inside a bucket counts that bucket with the next bound (an undercount of
        at most one bucket, 12.5% of the value). Made for exporters that need fixed bucket
        bounds (Prometheus ``le`` buckets); the total is `count`.
        """
        out = [0] * len(bounds_ns)
        b = self._buckets
        if b is None or not bounds_ns:
            return out
        upper = self._upper
        k = 0
        seen = 0
        last = len(bounds_ns)
        for idx, n in enumerate(b):
            if not n:
                continue
            edge = upper(idx)
            while k < last and bounds_ns[k] < edge:
                out[k] = seen
                k += 1
            if k == last:
                return out
            seen += n
        while k < last:
            out[k] = seen
            k += 1
        return out

    def add_counts(self, pairs: Iterable[tuple[int, int]], count: int) -> None:
        """Add ``count`` latencies given as ``(bucket, count)`` pairs (the form of
        `bucket_counts`): how histograms merge."""
        b = self._buckets
        if b is None:
            b = self._buckets = [0] * _BUCKETS
        for i, c in pairs:
            b[i] += c
        self.count += count

    def reset(self) -> None:
        self._buckets = None
        self.count = 0


# a batch of latencies summed up: (count, total, min, max, [(bucket, count), ...])
_Summary = tuple[int, int, int, int, list[tuple[int, int]]]
_perf_ns = time.perf_counter_ns
_INT64_MAX = (1 << 63) - 1


def _summarize(batch: list[int]) -> _Summary:
    """Count, total, min, max and the bucket counts of a non-empty batch of latencies."""
    n = len(batch)
    try:
        a: Any = np.array(batch, dtype=np.int64)
    except OverflowError:  # a latency beyond int64: Python ints, exactly
        per: dict[int, int] = {}
        for ns in batch:
            i = _bucket_of(ns)
            per[i] = per.get(i, 0) + 1
        return n, sum(batch), min(batch), max(batch), list(per.items())
    # 0 .. 65,535 ns (nearly all) by table lookup, the rest one at a time
    table = (a >= 0) & (a < _MID_HI)
    v = a[table]
    idx = np.where(
        v < _MID_LO,
        _LOW_BUCKET_NP[np.minimum(v, _MID_LO - 1)],
        _MID_BUCKET_NP[v >> 4],
    )
    counts = np.bincount(idx, minlength=_BUCKETS)
    hit = np.flatnonzero(counts)
    pairs = list(zip(hit.tolist(), counts[hit].tolist(), strict=True))
    if len(v) < n:
        pairs += [(_bucket_of(ns), 1) for ns in a[~table].tolist()]
    lo, hi = int(a.min()), int(a.max())
    # an int64 sum is exact unless n values this large could overflow it
    exact = max(hi, -lo) <= _INT64_MAX // n
    return n, int(a.sum()) if exact else sum(batch), lo, hi, pairs


def _take(batch: list[int]) -> _Summary | None:
    """Summarize what ``batch`` holds now and remove it (None if empty).

    The batch is a prefix, copied then deleted: a latency appended meanwhile (from another
    thread) stays for the next take.
    """
    n = len(batch)
    if not n:
        return None
    part = batch[:n]
    del batch[:n]
    return _summarize(part)


def _combine(a: _Summary | None, b: _Summary) -> _Summary:
    if a is None:
        return b
    return (a[0] + b[0], a[1] + b[1], min(a[2], b[2]), max(a[3], b[3]), a[4] + b[4])


class PyLatencyRecorder:
    """The pure-Python twin of the compiled `LatencyRecorder` (same methods and results).

    Times the messages of one actor and keeps their latency statistics until drained:
    `took` marks a message taken (ending the previous one's time, if any), `idle` ends the
    running message's time before the actor waits, `cancel` forgets it, `add` records a
    latency directly. `drain` hands over what was recorded since the last drain as
    ``(count, total_ns, min_ns, max_ns, [(bucket, count), ...])`` and starts over; it
    returns None when nothing was recorded. Latencies are buffered and binned with NumPy
    every ``FOLD_AT``; a lock keeps a drain from another thread whole.
    """

    __slots__ = ("_batch", "_lock", "_start", "_sum")

    def __init__(self) -> None:
        self._start = 0
        self._batch: list[int] = []
        self._sum: _Summary | None = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        # a copy starts empty: what was recorded belongs to the telemetry it was drained into
        return (PyLatencyRecorder, ())

    @property
    def dirty(self) -> bool:
        """True when latencies were recorded since the last `drain`."""
        return bool(self._batch) or self._sum is not None

    @property
    def timing(self) -> bool:
        """True while a message's time is running (between `took` and `idle`)."""
        return self._start != 0

    def took(self) -> None:
        """A message was taken now: the previous one's time (if running) ends here."""
        now = _perf_ns()
        start = self._start
        self._start = now
        if start:
            self._append(now - start)

    def idle(self) -> None:
        """The actor is about to wait: the running message's time (if any) ends here."""
        start = self._start
        if start:
            self._start = 0
            self._append(_perf_ns() - start)

    def cancel(self) -> None:
        """Forget the running message's time (it failed, or was cut off)."""
        self._start = 0

    def add(self, latency_ns: int) -> None:
        """Record one latency of ``latency_ns`` (an int64)."""
        ns = operator.index(latency_ns)
        if not -(1 << 63) <= ns < 1 << 63:
            raise OverflowError(f"latency {ns} does not fit in an int64")
        self._append(ns)

    def _append(self, ns: int) -> None:
        batch = self._batch
        batch.append(ns)
        if len(batch) >= _FOLD_AT:
            self._absorb()

    def _absorb(self) -> None:
        with self._lock:
            part = _take(self._batch)
            if part is not None:
                self._sum = _combine(self._sum, part)

    def drain(self) -> _Summary | None:
        """What was recorded since the last drain (see the class), or None; starts over."""
        self._absorb()
        with self._lock:
            out, self._sum = self._sum, None
        return out

    def clear(self) -> None:
        """Drop what was recorded (a running message's time keeps running)."""
        with self._lock:
            self._batch.clear()
            self._sum = None


#: bytes a `SharedLatencyBlock` needs: count, total, min, max and every bucket (int64 each)
LATENCY_BLOCK_BYTES = (4 + _BUCKETS) * 8


class SharedLatencyBlock:
    """Latency statistics in a buffer one process writes and another reads (shared memory).

    Layout: int64 words ``[count, total_ns, min_ns, max_ns, bucket...]``. The writer (a
    process-tier child) `add`s what its `LatencyRecorder` drained; the reader (the parent)
    `take`s what is new since its last take, in the same summary form, for
    `RingKernelTelemetry.merge_summary`. A take that overlaps an add sees part of it: counts
    come from the buckets read, and the rest (and the total) arrives with the next take.
    `release` must be called before the buffer's memory is unmapped.
    """

    __slots__ = ("_seen", "_seen_total", "_slice", "_words")

    def __init__(self, buf: memoryview) -> None:
        self._slice = buf[:LATENCY_BLOCK_BYTES]
        self._words = self._slice.cast("q")
        self._seen: list[int] = [0] * _BUCKETS
        self._seen_total = 0

    def add(self, part: _Summary) -> None:
        """Add a drained summary (writer side)."""
        w = self._words
        n, total, lo, hi, pairs = part
        for i, c in pairs:
            w[4 + i] += c
        if not w[0] or lo < w[2]:
            w[2] = lo
        if hi > w[3]:
            w[3] = hi
        w[1] += total
        w[0] += n

    def take(self) -> _Summary | None:
        """What was added since the last take (reader side), or None."""
        w = self._words
        now = w[4:].tolist()
        seen = self._seen
        pairs = [(i, c - seen[i]) for i, c in enumerate(now) if c != seen[i]]
        if not pairs:
            return None
        self._seen = now
        total = w[1]
        part = (sum(c for _, c in pairs), total - self._seen_total, w[2], w[3], pairs)
        self._seen_total = total
        return part

    def release(self) -> None:
        """Release the views of the buffer (idempotent)."""
        self._words.release()
        self._slice.release()


_ext = telemetry_extension()
#: the recorder actors use: compiled when the extension is built, else `PyLatencyRecorder`
LatencyRecorder: type[PyLatencyRecorder] = (
    PyLatencyRecorder if _ext is None else _ext.LatencyRecorder
)


@dataclass(slots=True, init=False)
class RingKernelTelemetry:
    """Counters and latencies of one kernel (``runtime.get_telemetry(id)``).

    Latency is the time the actor spent on a message: from ``receive()`` taking it to the
    actor's next ``receive()`` taking the next message or starting to wait. The latency
    statistics are exact whenever read: what `latency_recorder` and ``record_latency`` hold
    is folded in first.
    """

    # latencies recorded and not yet folded in (see `_fold`); set first in `__init__`,
    # before the latency fields (properties that look at it)
    _pending: list[int] = field(default_factory=list, init=False, repr=False, compare=False)
    #: what times the actor's messages (`LatencyRecorder`), drained into this record
    latency_recorder: PyLatencyRecorder = field(
        default_factory=LatencyRecorder, init=False, repr=False, compare=False
    )
    kernel_id: str = ""
    messages_processed: int = 0
    messages_dropped: int = 0
    queue_depth: int = 0
    total_latency_ns: int = 0
    max_latency_ns: int = 0
    min_latency_ns: int = 0
    error_count: int = 0
    last_error: str | None = None
    messages_sent: int = 0
    restarts: int = 0
    #: messages that arrived in the inbox (read from the inbox's own counters when the
    #: runtime reads telemetry: nothing is counted per message for it)
    messages_received: int = field(default=0, init=False)
    #: `messages_dropped` by reason, for drops whose reason is known: ``"backpressure"``
    #: (a full ``drop_oldest`` inbox), ``"undelivered"`` (left at terminate or failure),
    #: ``"actor_failed"`` (the message an actor raised on), ``"undecodable"``,
    #: ``"reply_lost"`` (a reply nobody waited for any more); made on the first one
    drops_by_reason: dict[str, int] | None = field(default=None, init=False)
    # not constructor arguments (`uptime_seconds` sets the clock), so that
    # `dataclasses.replace` calls `__init__` with the arguments it takes
    start_time: float = field(default_factory=time.monotonic, init=False)
    # the stored uptime of a record built by hand; None: a live clock (`live=True`)
    _uptime: float | None = field(default=0.0, init=False, repr=False, compare=False)
    histogram: LatencyHistogram = field(default_factory=LatencyHistogram, init=False, repr=False)

    def __init__(
        self,
        kernel_id: str = "",
        messages_processed: int = 0,
        messages_dropped: int = 0,
        queue_depth: int = 0,
        total_latency_ns: int = 0,
        max_latency_ns: int = 0,
        min_latency_ns: int = 0,
        error_count: int = 0,
        last_error: str | None = None,
        uptime_seconds: float = 0.0,
        *,
        messages_sent: int = 0,
        restarts: int = 0,
        live: bool = False,
    ) -> None:
        """Start the counters (all zero by default).

        The positional order is the one older code passes. By default `uptime_seconds` is
        stored as given and changes only when assigned (as in PyDotCompute 0.2), so
        `throughput` is ``messages_processed / uptime_seconds`` exactly. With ``live=True``
        (the records the runtime keeps) it is a clock instead, started `uptime_seconds`
        back.
        """
        self._pending = []
        self.latency_recorder = LatencyRecorder()
        self.kernel_id = kernel_id
        self.messages_processed = messages_processed
        self.messages_dropped = messages_dropped
        self.queue_depth = queue_depth
        self.histogram = LatencyHistogram()
        self.total_latency_ns = total_latency_ns
        self.max_latency_ns = max_latency_ns
        self.min_latency_ns = min_latency_ns
        self.error_count = error_count
        self.last_error = last_error
        self.messages_sent = messages_sent
        self.restarts = restarts
        self.messages_received = 0
        self.drops_by_reason = None
        self.start_time = time.monotonic() - float(uptime_seconds)
        self._uptime = None if live else float(uptime_seconds)

    def record_message(self, latency_ns: int) -> None:
        """Count one processed message that took ``latency_ns``."""
        self.messages_processed += 1
        self.record_latency(latency_ns)

    def record_latency(self, latency_ns: int) -> None:
        """Record how long one message took (its count is kept by ``messages_processed``)."""
        pend = self._pending
        pend.append(operator.index(latency_ns))  # an int (a float is refused here, not later)
        if len(pend) >= _FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        """Fold what the recorder and ``_pending`` hold into total, min, max and the
        histogram (a latency appended meanwhile, from another thread, waits for the next)."""
        with _FOLD_LOCK:
            for part in (self.latency_recorder.drain(), _take(self._pending)):
                if part is not None:
                    self._merge(part)

    def _merge(self, part: _Summary) -> None:
        n, total, lo, hi, pairs = part
        _total_slot.__set__(self, _total_slot.__get__(self) + total)
        if hi > _max_slot.__get__(self):
            _max_slot.__set__(self, hi)
        h: LatencyHistogram = _hist_slot.__get__(self)
        if lo < _min_slot.__get__(self) or not h.count:
            _min_slot.__set__(self, lo)
        h.add_counts(pairs, n)

    def latency_summary(self) -> tuple[int, int, int, int, list[tuple[int, int]]]:
        """This record's latency statistics in the form `merge_summary` takes."""
        h = self.histogram  # folds first
        pairs = h.bucket_counts()
        return (h.count, self.total_latency_ns, self.min_latency_ns, self.max_latency_ns, pairs)

    def record_drop(self, n: int = 1, reason: str | None = None) -> None:
        """Count ``n`` dropped messages, under ``reason`` in `drops_by_reason` when given."""
        self.messages_dropped += n
        if reason is not None:
            per = self.drops_by_reason
            if per is None:
                per = self.drops_by_reason = {}
            per[reason] = per.get(reason, 0) + n

    def record_backpressure_drop(self, n: int = 1) -> None:
        """Count ``n`` messages a full ``drop_oldest`` inbox dropped (its ``on_drop``)."""
        self.record_drop(n, "backpressure")

    def drop_reasons(self) -> dict[str, int]:
        """`messages_dropped` split by reason; drops recorded without one are ``"other"``
        (only present when non-zero)."""
        per = dict(self.drops_by_reason or {})
        other = self.messages_dropped - sum(per.values())
        if other > 0:
            per["other"] = other
        return per

    def merge_summary(self, part: tuple[int, int, int, int, list[tuple[int, int]]]) -> None:
        """Fold in latencies timed elsewhere: ``(count, total_ns, min_ns, max_ns,
        [(bucket, count), ...])`` as `LatencyRecorder.drain` returns them (a worker thread
        or a child process times its actor's messages and hands the summary over)."""
        if part[0]:
            self._fold()
            with _FOLD_LOCK:
                self._merge(part)

    def record_error(self, error: BaseException | str) -> None:
        self.error_count += 1
        self.last_error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"

    def reset(self) -> None:
        """Zero every counter: a stored `uptime_seconds` becomes 0.0, a live clock starts
        again."""
        kid = self.kernel_id
        pending, recorder = self._pending, self.latency_recorder
        self.__init__(kid, live=self.live)  # type: ignore[misc]
        # the same list and recorder: an actor's hot path may hold them
        pending.clear()
        recorder.clear()
        self._pending, self.latency_recorder = pending, recorder

    def __getstate__(self) -> dict[str, Any]:
        # the statistics, folded (a copy gets its own, empty, recorder and pending list)
        return {f: getattr(self, f) for f in _STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._pending = []
        self.latency_recorder = LatencyRecorder()
        for f in _STATE:
            setattr(self, f, state[f])

    def merge_latencies(self, parts: list[RingKernelTelemetry]) -> None:
        """Make this record's latency statistics those of `parts` taken together (the
        replicas of a pool); latencies recorded here directly are replaced."""
        hist = LatencyHistogram()
        timed = [p for p in parts if p.histogram.count]
        for p in timed:
            part = p.histogram
            hist.add_counts(part.bucket_counts(), part.count)
        self.histogram = hist
        self.total_latency_ns = sum(p.total_latency_ns for p in timed)
        self.max_latency_ns = max((p.max_latency_ns for p in timed), default=0)
        self.min_latency_ns = min((p.min_latency_ns for p in timed), default=0)

    @property
    def live(self) -> bool:
        """True when `uptime_seconds` is a running clock (the runtime's records), False
        when it is a stored number."""
        return self._uptime is None

    @property
    def uptime_seconds(self) -> float:
        """How long the kernel has been up, in seconds.

        A stored number (0.0 unless given or assigned, as in PyDotCompute 0.2), or on a
        `live` record the seconds since `start_time`. Assigning stores the value: the
        record is no longer live (`live_uptime_seconds` still reads the clock).
        """
        up = self._uptime
        return time.monotonic() - self.start_time if up is None else up

    @uptime_seconds.setter
    def uptime_seconds(self, seconds: float) -> None:
        self._uptime = float(seconds)

    @property
    def live_uptime_seconds(self) -> float:
        """Seconds since `start_time` (since the record was made, or reset), whether or
        not `uptime_seconds` is stored."""
        return time.monotonic() - self.start_time

    @property
    def avg_latency_ns(self) -> float:
        """Mean latency: total over the timed messages, or over `messages_processed` when
        none was timed (a record built from totals, as PyDotCompute 0.2 computed it)."""
        timed = self.histogram.count
        if timed:
            return self.total_latency_ns / timed
        n = self.messages_processed
        return self.total_latency_ns / n if n > 0 else 0.0

    @property
    def avg_latency_ms(self) -> float:
        return self.avg_latency_ns / 1e6

    @property
    def throughput(self) -> float:
        """Messages processed per second of `uptime_seconds` (0.0 with no uptime)."""
        up = self.uptime_seconds
        return self.messages_processed / up if up > 0 else 0.0

    @property
    def p50_latency_ns(self) -> int:
        return self.histogram.percentile(50)

    @property
    def p95_latency_ns(self) -> int:
        return self.histogram.percentile(95)

    @property
    def p99_latency_ns(self) -> int:
        return self.histogram.percentile(99)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_id": self.kernel_id,
            "messages_processed": self.messages_processed,
            "messages_dropped": self.messages_dropped,
            "messages_sent": self.messages_sent,
            "queue_depth": self.queue_depth,
            "total_latency_ns": self.total_latency_ns,
            "max_latency_ns": self.max_latency_ns,
            "min_latency_ns": self.min_latency_ns,
            "avg_latency_ns": self.avg_latency_ns,
            "avg_latency_ms": self.avg_latency_ms,
            "p50_latency_ns": self.p50_latency_ns,
            "p95_latency_ns": self.p95_latency_ns,
            "p99_latency_ns": self.p99_latency_ns,
            "error_count": self.error_count,
            "last_error": self.last_error,
            "restarts": self.restarts,
            "uptime_seconds": self.uptime_seconds,
            "throughput": self.throughput,
        }


def _folding(slot: Any) -> property:
    """A property over ``slot`` that folds pending latencies in before it reads, and
    before it writes (so a value set is not then shifted by older latencies)."""
    get, put = slot.__get__, slot.__set__

    def fget(self: RingKernelTelemetry) -> Any:
        if self._pending or self.latency_recorder.dirty:
            self._fold()
        return get(self)

    def fset(self: RingKernelTelemetry, value: Any) -> None:
        if self._pending or self.latency_recorder.dirty:
            self._fold()
        put(self, value)

    return property(fget, fset)


#: what a pickled or copied record carries
_STATE = tuple(
    f.name for f in fields(RingKernelTelemetry) if f.name not in ("_pending", "latency_recorder")
)
_total_slot = RingKernelTelemetry.__dict__["total_latency_ns"]
_max_slot = RingKernelTelemetry.__dict__["max_latency_ns"]
_min_slot = RingKernelTelemetry.__dict__["min_latency_ns"]
_hist_slot = RingKernelTelemetry.__dict__["histogram"]
for _name, _slot in (
    ("total_latency_ns", _total_slot),
    ("max_latency_ns", _max_slot),
    ("min_latency_ns", _min_slot),
    ("histogram", _hist_slot),
):
    setattr(RingKernelTelemetry, _name, _folding(_slot))


# --- GPU telemetry ---------------------------------------------------------------------------


@dataclass
class GPUInfo:
    """One GPU as NVML sees it.

    Memory is in bytes, the utilizations are fractions 0..1 (as in PyDotCompute 0.2; the
    ``*_percent`` properties give percent), temperature in degrees Celsius, power in watts;
    a reading the board does not support is None.
    """

    index: int
    name: str
    uuid: str
    memory_total: int
    memory_used: int
    memory_free: int
    utilization_gpu: float
    utilization_memory: float
    temperature: float | None = None
    power_usage: float | None = None
    power_limit: float | None = None
    driver_version: str | None = None

    @property
    def memory_utilization(self) -> float:
        """Used memory as a fraction 0..1 of the total (0.0 when the total is unknown)."""
        return self.memory_used / self.memory_total if self.memory_total else 0.0

    @property
    def memory_utilization_percent(self) -> float:
        """`memory_utilization` in percent."""
        return 100.0 * self.memory_utilization

    @property
    def utilization_gpu_percent(self) -> float:
        """`utilization_gpu` in percent (NVML's own unit)."""
        return 100.0 * self.utilization_gpu

    @property
    def utilization_memory_percent(self) -> float:
        """`utilization_memory` in percent (NVML's own unit)."""
        return 100.0 * self.utilization_memory

    @classmethod
    def placeholder(cls, index: int = 0) -> GPUInfo:
        """What a query answers when NVML cannot: name ``"N/A"``, no uuid, every number 0
        (PyDotCompute 0.2's placeholder; ``strict=True`` queries return None instead)."""
        return cls(index, "N/A", "", 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)

    @property
    def total_memory(self) -> int:
        """The same as `memory_total`."""
        return self.memory_total

    @property
    def used_memory(self) -> int:
        """The same as `memory_used`."""
        return self.memory_used

    @property
    def free_memory(self) -> int:
        """The same as `memory_free`."""
        return self.memory_free

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["memory_utilization"] = self.memory_utilization
        return d


class GPUMonitor:
    """Reads GPU utilization, memory, power and temperature through NVML.

    ``nvidia-ml-py`` is imported on first use. Without it (or without a driver or GPU),
    or when NVML fails, ``is_available`` is False and ``unavailable_reason`` says why;
    the queries then answer as PyDotCompute 0.2 did (`GPUInfo.placeholder`, 0.0, zeros),
    or None when called with ``strict=True``. After `shutdown` the monitor stays
    unavailable until `initialize` is called.
    """

    def __init__(self) -> None:
        self._nvml: Any = None
        self._initialized = False
        self._available = False
        self._reason = "not probed yet"
        self._lock = threading.Lock()

    def initialize(self) -> bool:
        """Start NVML (again, after `shutdown`); returns `is_available`."""
        with self._lock:
            self._initialized = False
        return self._init()

    def _init(self) -> bool:
        with self._lock:
            if self._initialized:
                return self._available
            self._initialized = True
            try:
                import pynvml  # from the nvidia-ml-py package
            except ImportError:
                self._reason = 'nvidia-ml-py is not installed (pip install "pydotcompute[cuda]")'
                return False
            try:
                pynvml.nvmlInit()
            except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                self._reason = f"NVML unavailable: {exc}"
                return False
            self._nvml = pynvml
            self._available = True
            self._reason = ""
            return True

    @property
    def is_available(self) -> bool:
        return self._init()

    @property
    def unavailable_reason(self) -> str:
        """Why ``is_available`` is False ('' when it is available)."""
        self._init()
        return self._reason

    @property
    def device_count(self) -> int:
        if not self._init():
            return 0
        return int(self._nvml.nvmlDeviceGetCount())

    def _handle(self, index: int) -> Any:
        if not self._init():
            return None
        if not 0 <= index < self.device_count:
            raise IndexError(f"GPU index {index} out of range (have {self.device_count})")
        return self._nvml.nvmlDeviceGetHandleByIndex(index)

    @overload
    def get_gpu_info(self, index: int = 0, *, strict: Literal[False] = False) -> GPUInfo: ...
    @overload
    def get_gpu_info(self, index: int = 0, *, strict: bool) -> GPUInfo | None: ...

    def get_gpu_info(self, index: int = 0, *, strict: bool = False) -> GPUInfo | None:
        """GPU ``index`` as NVML reports it.

        Without NVML, for an index NVML does not know, or when NVML fails, the
        `GPUInfo.placeholder` (PyDotCompute 0.2). With ``strict=True``: None without NVML,
        ``IndexError`` for an index out of range, and NVML's own errors propagate.
        """
        if strict:
            return self._read_info(index)
        try:
            info = self._read_info(index)
        except Exception:  # NVMLError (a lost GPU, a reset), an index NVML does not know
            info = None
        return GPUInfo.placeholder(index) if info is None else info

    def _read_info(self, index: int) -> GPUInfo | None:
        h = self._handle(index)
        if h is None:
            return None
        nv = self._nvml
        name = nv.nvmlDeviceGetName(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        util = nv.nvmlDeviceGetUtilizationRates(h)
        temp = power = limit = None
        try:
            temp = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        except Exception:  # not supported on every board
            temp = None
        try:
            power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:  # not supported on every board
            power = None
        try:
            limit = nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0
        except Exception:  # not supported on every board
            limit = None
        try:
            uuid = nv.nvmlDeviceGetUUID(h)
        except Exception:  # very old drivers
            uuid = ""
        try:
            driver = nv.nvmlSystemGetDriverVersion()
        except Exception:  # very old drivers
            driver = None
        return GPUInfo(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
            memory_total=int(mem.total),
            memory_used=int(mem.used),
            memory_free=int(mem.free),
            utilization_gpu=float(util.gpu) / 100.0,
            utilization_memory=float(util.memory) / 100.0,
            temperature=temp,
            power_usage=power,
            power_limit=limit,
            driver_version=driver.decode() if isinstance(driver, bytes) else driver,
        )

    def get_all_gpu_info(self) -> list[GPUInfo]:
        """Every GPU NVML sees (empty without NVML)."""
        infos = (self.get_gpu_info(k, strict=True) for k in range(self.device_count))
        return [i for i in infos if i is not None]

    @overload
    def get_utilization(self, index: int = 0, *, strict: Literal[False] = False) -> float: ...
    @overload
    def get_utilization(self, index: int = 0, *, strict: bool) -> float | None: ...

    def get_utilization(self, index: int = 0, *, strict: bool = False) -> float | None:
        """GPU utilization as a fraction 0..1: 0.0 without NVML, or None with
        ``strict=True`` (see `get_gpu_info`)."""
        info = self.get_gpu_info(index, strict=strict)
        return None if info is None else info.utilization_gpu

    @overload
    def get_memory_info(
        self, index: int = 0, *, strict: Literal[False] = False
    ) -> dict[str, int]: ...
    @overload
    def get_memory_info(self, index: int = 0, *, strict: bool) -> dict[str, int] | None: ...

    def get_memory_info(self, index: int = 0, *, strict: bool = False) -> dict[str, int] | None:
        """``{"used", "free", "total"}`` in bytes: zeros without NVML, or None with
        ``strict=True`` (see `get_gpu_info`)."""
        info = self.get_gpu_info(index, strict=strict)
        if info is None:
            return None
        return {"used": info.memory_used, "free": info.memory_free, "total": info.memory_total}

    def __repr__(self) -> str:
        if not self._init():
            return f"<GPUMonitor available=False devices=0 reason={self._reason!r}>"
        return f"<GPUMonitor available=True devices={self.device_count}>"

    def shutdown(self) -> None:
        """Shut NVML down; the monitor is unavailable until `initialize` (idempotent)."""
        with self._lock:
            if self._available and self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:  # already shut down
                    pass
            self._initialized = True  # stays unavailable: `initialize` starts NVML again
            self._available = False
            self._nvml = None
            self._reason = "NVML was shut down (call initialize() to start it again)"


_monitor: GPUMonitor | None = None


def get_gpu_monitor() -> GPUMonitor:
    """The process-wide `GPUMonitor`."""
    global _monitor
    if _monitor is None:
        _monitor = GPUMonitor()
    return _monitor


class TelemetryCollector:
    """Collects `RingKernelTelemetry` of many kernels and summarizes them."""

    def __init__(self) -> None:
        self._kernels: dict[str, RingKernelTelemetry] = {}
        self.start_time = time.monotonic()

    def register(self, kernel_id: str) -> RingKernelTelemetry:
        t = self._kernels.get(kernel_id)
        if t is None:
            t = self._kernels[kernel_id] = RingKernelTelemetry(kernel_id)
        return t

    def unregister(self, kernel_id: str) -> None:
        self._kernels.pop(kernel_id, None)

    def get(self, kernel_id: str) -> RingKernelTelemetry | None:
        return self._kernels.get(kernel_id)

    def all(self) -> dict[str, RingKernelTelemetry]:
        return dict(self._kernels)

    def reset_all(self) -> None:
        """Zero every kernel's counters and restart the collector's uptime clock."""
        for t in self._kernels.values():
            t.reset()
        self.start_time = time.monotonic()

    # The names older code calls; each is the method above it under another name.
    def register_kernel(self, kernel_id: str) -> RingKernelTelemetry:
        """The same as `register`."""
        return self.register(kernel_id)

    def unregister_kernel(self, kernel_id: str) -> None:
        """The same as `unregister`."""
        self.unregister(kernel_id)

    def get_kernel_telemetry(self, kernel_id: str) -> RingKernelTelemetry | None:
        """The same as `get`."""
        return self.get(kernel_id)

    def get_all_telemetry(self) -> dict[str, RingKernelTelemetry]:
        """The same as `all`, after storing the collector's uptime as each record's
        `uptime_seconds` (as PyDotCompute 0.2 does; `live` records keep their clock)."""
        up = time.monotonic() - self.start_time
        for t in self._kernels.values():
            if not t.live:
                t.uptime_seconds = up
        return self.all()

    def get_summary(self) -> dict[str, Any]:
        """The same as `summary()`."""
        return self.summary()

    def __repr__(self) -> str:
        return f"<TelemetryCollector kernels={len(self._kernels)}>"

    def summary(self, *, gpu: bool = True) -> dict[str, Any]:
        """Totals across kernels, the collector's uptime and GPU 0's utilization (a
        fraction 0..1; None without NVML)."""
        ks = self._kernels.values()
        util = None
        if gpu:
            mon = get_gpu_monitor()
            util = mon.get_utilization(0) if mon.is_available and mon.device_count else None
        return {
            "kernel_count": len(self._kernels),
            "total_messages_processed": sum(k.messages_processed for k in ks),
            "total_messages_dropped": sum(k.messages_dropped for k in ks),
            "total_errors": sum(k.error_count for k in ks),
            "uptime_seconds": time.monotonic() - self.start_time,
            "gpu_utilization": util,
        }
