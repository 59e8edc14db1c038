"""What telemetry offers exporters: cumulative buckets at fixed bounds, drop reasons,
summaries timed elsewhere (a thread, a child process through shared memory)."""

from __future__ import annotations

import random

from pydotcompute.ring_kernels.telemetry import (
    LATENCY_BLOCK_BYTES,
    LatencyHistogram,
    LatencyRecorder,
    RingKernelTelemetry,
    SharedLatencyBlock,
)


def test_cumulative_counts_at_fixed_bounds() -> None:
    h = LatencyHistogram()
    assert h.cumulative_counts([1_000, 10_000]) == [0, 0]
    for ns in (500, 900, 5_000, 50_000, 2_000_000_000):
        h.record(ns)
    got = h.cumulative_counts([1_000, 10_000, 100_000, 1_000_000_000])
    assert got == [2, 3, 4, 4]
    assert h.count == 5  # the +Inf bucket


def test_cumulative_counts_never_overcount_and_are_monotonic() -> None:
    rng = random.Random(7)
    h = LatencyHistogram()
    values = [int(rng.lognormvariate(9, 2)) for _ in range(5_000)]
    for v in values:
        h.record(v)
    bounds = [10**k for k in range(2, 11)]
    got = h.cumulative_counts(bounds)
    assert got == sorted(got)
    for bound, n in zip(bounds, got, strict=True):
        exact = sum(v <= bound for v in values)
        assert n <= exact  # a straddling bucket counts with the next bound
        assert n >= sum(v <= bound * 0.875 for v in values)  # within one bucket (12.5%)


def test_drop_reasons_keep_the_unspecified_as_other() -> None:
    t = RingKernelTelemetry("k")
    t.record_drop()
    t.record_drop(3, "undelivered")
    t.record_backpressure_drop()
    t.messages_dropped += 2  # a tier that sets the total itself
    assert t.messages_dropped == 7
    assert t.drop_reasons() == {"undelivered": 3, "backpressure": 1, "other": 3}
    t.reset()
    assert t.drop_reasons() == {}


def test_merge_summary_adds_latencies_timed_elsewhere() -> None:
    rec = LatencyRecorder()
    for ns in (1_000, 2_000, 3_000):
        rec.add(ns)
    part = rec.drain()
    assert part is not None
    t = RingKernelTelemetry("k")
    t.record_latency(10_000)
    t.merge_summary(part)
    assert t.histogram.count == 4
    assert t.total_latency_ns == 16_000
    assert (t.min_latency_ns, t.max_latency_ns) == (1_000, 10_000)
    again = RingKernelTelemetry("k2")
    again.merge_summary(t.latency_summary())
    assert again.histogram.bucket_counts() == t.histogram.bucket_counts()


def test_shared_latency_block_hands_over_only_what_is_new() -> None:
    buf = memoryview(bytearray(LATENCY_BLOCK_BYTES))
    writer, reader = SharedLatencyBlock(buf), SharedLatencyBlock(buf)
    assert reader.take() is None
    rec = LatencyRecorder()
    for ns in (100, 200, 300):
        rec.add(ns)
    writer.add(rec.drain())  # type: ignore[arg-type]
    first = reader.take()
    assert first is not None
    assert first[0] == 3
    assert first[1] == 600
    assert reader.take() is None
    rec.add(50_000)
    writer.add(rec.drain())  # type: ignore[arg-type]
    t = RingKernelTelemetry("k")
    t.merge_summary(first)
    second = reader.take()
    assert second is not None
    t.merge_summary(second)
    assert t.histogram.count == 4
    assert (t.min_latency_ns, t.max_latency_ns, t.total_latency_ns) == (100, 50_000, 50_600)
    writer.release()
    reader.release()
