"""Telemetry: the latency histogram, per-kernel counters, the collector and GPUMonitor."""

from __future__ import annotations

import copy
import pickle
import random
import sys
import threading
import types
from typing import Any

import pytest
from foundation_helpers import Req, doubler
from hypothesis import given, settings
from hypothesis import strategies as st

from pydotcompute.ring_kernels._native import telemetry_extension
from pydotcompute.ring_kernels.runtime import RingKernelRuntime
from pydotcompute.ring_kernels.telemetry import (
    _FOLD_AT,
    GPUInfo,
    GPUMonitor,
    LatencyHistogram,
    LatencyRecorder,
    PyLatencyRecorder,
    RingKernelTelemetry,
    TelemetryCollector,
    get_gpu_monitor,
)

# --- the histogram ---------------------------------------------------------------------


def _exact_percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil, at least the first
    return ordered[int(rank) - 1]


def test_empty_histogram_reports_zero() -> None:
    h = LatencyHistogram()
    assert h.count == 0
    assert h.percentile(50) == 0
    assert h.percentile(99) == 0


def test_small_values_are_exact() -> None:
    h = LatencyHistogram()
    for v in range(8):
        h.record(v)
    assert [h.percentile(q) for q in (12.5, 25, 50, 100)] == [0, 1, 3, 7]


def test_negative_values_count_as_zero() -> None:
    h = LatencyHistogram()
    h.record(-5)
    assert h.count == 1
    assert h.percentile(100) == 0


def test_huge_values_land_in_the_last_bucket() -> None:
    h = LatencyHistogram()
    h.record(2**70)
    assert h.count == 1
    assert h.percentile(100) >= 2**63


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=300),
    st.sampled_from([1, 50, 90, 95, 99, 99.9, 100]),
)
def test_percentiles_are_within_one_eighth_above_the_truth(values: list[int], q: float) -> None:
    h = LatencyHistogram()
    for v in values:
        h.record(v)
    exact = _exact_percentile(values, q)
    approx = h.percentile(q)
    # the reported value is the upper edge of the bucket holding the exact percentile
    assert exact <= approx <= max(exact * 9 // 8, exact + 1)


def test_percentiles_of_a_known_distribution() -> None:
    rng = random.Random(7)
    values = [rng.randrange(1_000, 1_000_000) for _ in range(10_000)]
    h = LatencyHistogram()
    for v in values:
        h.record(v)
    for q in (50, 95, 99):
        exact = _exact_percentile(values, q)
        assert exact <= h.percentile(q) <= exact * 1.125
    assert h.percentile(50) <= h.percentile(95) <= h.percentile(99)


def test_reset() -> None:
    h = LatencyHistogram()
    h.record(100)
    h.reset()
    assert (h.count, h.percentile(50)) == (0, 0)


# --- RingKernelTelemetry ---------------------------------------------------------------


def test_record_message_updates_every_latency_statistic() -> None:
    t = RingKernelTelemetry("k")
    for ns in (300, 100, 200):
        t.record_message(ns)
    assert t.messages_processed == 3
    assert t.total_latency_ns == 600
    assert (t.min_latency_ns, t.max_latency_ns) == (100, 300)
    assert t.avg_latency_ns == 200.0
    assert t.avg_latency_ms == 0.0002
    assert 200 <= t.p50_latency_ns <= 225
    assert 300 <= t.p99_latency_ns <= 338
    assert t.p95_latency_ns <= t.p99_latency_ns


def test_new_telemetry_is_zero() -> None:
    t = RingKernelTelemetry("fresh")
    assert (t.messages_processed, t.avg_latency_ns, t.p50_latency_ns, t.throughput) == (
        0,
        0.0,
        0,
        0.0,
    )
    assert t.uptime_seconds >= 0


def test_drops_errors_and_reset() -> None:
    t = RingKernelTelemetry("k")
    t.record_drop()
    t.record_drop(4)
    t.record_error(ValueError("bad"))
    t.record_error("plain text")
    assert t.messages_dropped == 5
    assert t.error_count == 2
    assert t.last_error == "plain text"
    t.record_message(10)
    t.reset()
    assert t.kernel_id == "k"
    assert (t.messages_dropped, t.error_count, t.messages_processed, t.last_error) == (
        0,
        0,
        0,
        None,
    )
    assert t.histogram.count == 0


def test_first_error_text() -> None:
    t = RingKernelTelemetry("k")
    t.record_error(KeyError("missing"))
    assert t.last_error == "KeyError: 'missing'"


def test_to_dict_has_every_documented_key() -> None:
    t = RingKernelTelemetry("k")
    t.record_message(1_000)
    d = t.to_dict()
    for key in (
        "kernel_id",
        "messages_processed",
        "messages_dropped",
        "queue_depth",
        "total_latency_ns",
        "max_latency_ns",
        "min_latency_ns",
        "avg_latency_ns",
        "p50_latency_ns",
        "p95_latency_ns",
        "p99_latency_ns",
        "error_count",
        "last_error",
        "uptime_seconds",
        "throughput",
    ):
        assert key in d, key
    assert d["messages_processed"] == 1
    assert d["throughput"] >= 0


async def test_runtime_telemetry_measures_actor_time(rt: RingKernelRuntime) -> None:
    await rt.launch("k", doubler, input_type=Req)
    await rt.activate("k")
    for i in range(20):
        await rt.send_and_receive("k", Req(x=i), timeout=5)
    tel = rt.get_telemetry("k")
    assert tel.messages_processed == 20
    assert tel.histogram.count in (19, 20)  # a message is timed at the next receive()
    assert 0 < tel.min_latency_ns <= tel.p50_latency_ns <= tel.p99_latency_ns
    assert tel.p99_latency_ns <= tel.max_latency_ns * 9 // 8 + 1


async def test_runtime_telemetry_stays_exact_across_folds(rt: RingKernelRuntime) -> None:
    # enough messages that the actor's pending latencies are folded in several batches
    n = 3 * _FOLD_AT + 7
    await rt.launch("k", doubler, input_type=Req, input_queue_size=n, output_queue_size=n)
    await rt.activate("k")
    for i in range(n):
        await rt.send("k", Req(x=i))
    for _ in range(n):
        await rt.receive("k", timeout=5)
    tel = rt.get_kernel("k").telemetry  # read directly: no refresh, the fields fold
    assert tel.messages_processed == n
    timed = tel.histogram.count
    assert timed in (n - 1, n)
    assert sum(tel.histogram._buckets or []) == timed
    assert 0 < tel.min_latency_ns <= tel.max_latency_ns <= tel.total_latency_ns
    assert tel.avg_latency_ns == tel.total_latency_ns / timed


def test_pending_latencies_are_read_exactly_before_any_fold() -> None:
    t = RingKernelTelemetry("k")
    values = [5, 127, 128, 70_000, 2**70, -1]
    for v in values:
        t.record_latency(v)
    ref = LatencyHistogram()
    for v in values:
        ref.record(v)
    assert t.histogram._buckets == ref._buckets
    assert (t.total_latency_ns, t.min_latency_ns, t.max_latency_ns) == (
        sum(values),
        -1,
        2**70,
    )


def test_setting_a_latency_field_folds_pending_values_first() -> None:
    t = RingKernelTelemetry("k")
    t.record_latency(900)
    t.max_latency_ns = 50  # what was set is what is read, not max(50, 900)
    assert t.max_latency_ns == 50
    assert t.histogram.count == 1


def test_a_non_integer_latency_is_refused_when_recorded() -> None:
    t = RingKernelTelemetry("k")
    with pytest.raises(TypeError):
        t.record_latency(1.5)  # type: ignore[arg-type]
    assert t.histogram.count == 0


def test_reset_keeps_the_pending_list_an_actor_holds() -> None:
    t = RingKernelTelemetry("k")
    pending = t._pending
    t.record_latency(10)
    t.reset()
    assert t._pending is pending
    assert not pending
    assert t.total_latency_ns == 0
    assert t.histogram.count == 0


def _write_while_reading(n: int, write: Any, read: Any) -> None:
    """Call ``write(i)`` for i in range(n) while another thread calls ``read()`` in a loop."""
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            read()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(n):
            write(i)
    finally:
        stop.set()
        thread.join()


def test_a_reader_thread_folding_loses_no_latency() -> None:
    t = RingKernelTelemetry("k")
    n = 50_000

    def read() -> None:
        assert t.total_latency_ns >= 0  # folds whatever is pending right now

    _write_while_reading(n, lambda i: t.record_latency(100 + i % 1000), read)
    assert t.histogram.count == n
    assert t.total_latency_ns == sum(100 + i % 1000 for i in range(n))
    assert (t.min_latency_ns, t.max_latency_ns) == (100, 1099)


# --- the latency recorders (compiled and Python) -------------------------------------

_EXT = telemetry_extension()
RECORDERS = [
    pytest.param(PyLatencyRecorder, id="python"),
    pytest.param(
        None if _EXT is None else _EXT.LatencyRecorder,
        id="compiled",
        marks=pytest.mark.skipif(_EXT is None, reason="the fast_telemetry extension is not built"),
    ),
]


def _drained_into_histogram(rec: Any) -> tuple[Any, LatencyHistogram]:
    got = rec.drain()
    h = LatencyHistogram()
    if got is not None:
        h._buckets = [0] * len(LatencyHistogram()._buckets or [0] * 496)
        for i, c in got[4]:
            h._buckets[i] += c
        h.count = got[0]
    return got, h


def test_actors_use_the_compiled_recorder_when_it_is_built() -> None:
    expected = PyLatencyRecorder if _EXT is None else _EXT.LatencyRecorder
    assert LatencyRecorder is expected
    assert type(RingKernelTelemetry("k").latency_recorder) is expected


@pytest.mark.parametrize("recorder", RECORDERS)
@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=700))
@settings(max_examples=60, deadline=None)
def test_recorder_matches_the_histogram(recorder: Any, values: list[int]) -> None:
    rec = recorder()
    for v in values:
        rec.add(v)
    assert rec.dirty
    got, h = _drained_into_histogram(rec)
    ref = LatencyHistogram()
    for v in values:
        ref.record(v)
    assert got[:4] == (len(values), sum(values), min(values), max(values))
    assert h._buckets == ref._buckets
    assert not rec.dirty
    assert rec.drain() is None


@pytest.mark.parametrize("recorder", RECORDERS)
def test_recorder_refuses_what_is_not_an_int64(recorder: Any) -> None:
    rec = recorder()
    with pytest.raises(OverflowError):
        rec.add(2**63)
    with pytest.raises(TypeError):
        rec.add(1.5)
    assert rec.drain() is None


@pytest.mark.parametrize("recorder", RECORDERS)
def test_recorder_times_from_took_to_the_next_took_or_idle(recorder: Any) -> None:
    rec = recorder()
    rec.idle()  # nothing running: nothing recorded
    assert not rec.timing
    assert not rec.dirty
    rec.took()  # the first message: nothing before it
    assert rec.timing
    assert not rec.dirty
    rec.took()  # ends the first, starts the second
    rec.idle()  # ends the second
    rec.idle()
    assert not rec.timing
    got = rec.drain()
    assert got is not None
    assert got[0] == 2
    assert 0 <= got[2] <= got[3]
    assert got[1] == got[2] + got[3]
    rec.took()
    rec.cancel()  # forgotten: the message failed
    rec.took()
    rec.clear()  # the statistics go, the running message keeps its clock
    assert rec.timing
    assert rec.drain() is None
    rec.idle()
    assert rec.drain()[0] == 1


@pytest.mark.parametrize("recorder", RECORDERS)
def test_recorder_drained_from_another_thread_loses_no_latency(recorder: Any) -> None:
    rec = recorder()
    n = 30_000
    seen: list[Any] = []

    def read() -> None:
        got = rec.drain()
        if got is not None:
            seen.append(got)

    _write_while_reading(n, lambda i: rec.add(100 + i % 1000), read)
    last = rec.drain()
    if last is not None:
        seen.append(last)
    assert sum(g[0] for g in seen) == n
    assert sum(g[1] for g in seen) == sum(100 + i % 1000 for i in range(n))
    assert sum(c for g in seen for _, c in g[4]) == n


def test_recorder_latencies_reach_the_telemetry() -> None:
    t = RingKernelTelemetry("k")
    t.latency_recorder.add(300)
    t.record_latency(40)  # the other path, folded in the same way
    t.latency_recorder.add(5_000)
    assert (t.total_latency_ns, t.min_latency_ns, t.max_latency_ns) == (5_340, 40, 5_000)
    assert t.histogram.count == 3
    t.latency_recorder.add(1)
    assert t.avg_latency_ns == 5_341 / 4


def test_reset_keeps_the_recorder_an_actor_holds() -> None:
    t = RingKernelTelemetry("k")
    rec = t.latency_recorder
    rec.add(10)
    t.reset()
    assert t.latency_recorder is rec
    assert t.histogram.count == 0
    assert t.total_latency_ns == 0


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_a_copied_record_carries_every_statistic(how: str) -> None:
    t = RingKernelTelemetry("k", messages_processed=3, messages_sent=2)
    for v in (300, 40, 5_000):
        t.latency_recorder.add(v)
    t.record_latency(7)
    t.record_error("boom")
    if how == "pickle":
        c = pickle.loads(pickle.dumps(t))
    else:
        c = copy.copy(t) if how == "copy" else copy.deepcopy(t)
    fields = ("kernel_id", "messages_processed", "messages_sent", "error_count", "start_time")
    assert [getattr(c, f) for f in fields] == [getattr(t, f) for f in fields]
    assert (c.total_latency_ns, c.min_latency_ns, c.max_latency_ns) == (5_347, 7, 5_000)
    assert c.histogram._buckets == t.histogram._buckets
    assert c.last_error == "boom"
    assert c.latency_recorder is not t.latency_recorder
    c.latency_recorder.add(1)  # a copy's recorder is its own
    assert c.histogram.count == 5
    if how != "copy":  # (a shallow copy shares the histogram object)
        assert t.histogram.count == 4


async def test_telemetry_can_be_switched_off() -> None:
    async with RingKernelRuntime(enable_telemetry=False) as runtime:
        await runtime.launch("k", doubler, input_type=Req)
        await runtime.activate("k")
        await runtime.send_and_receive("k", Req(x=1), timeout=5)
        assert runtime.get_telemetry("k") is None  # as in 0.2
        assert runtime.get_counters("k").messages_processed == 0
        assert runtime.get_counters("k").histogram.count == 0


# --- the collector ---------------------------------------------------------------------


def test_collector_register_get_and_summary() -> None:
    c = TelemetryCollector()
    a = c.register("a")
    assert c.register("a") is a
    b = c.register("b")
    a.record_message(5)
    b.record_drop(2)
    b.record_error("x")
    assert c.get("a") is a
    assert c.get("zz") is None
    assert c.all() == {"a": a, "b": b}
    s = c.summary(gpu=False)
    assert s["kernel_count"] == 2
    assert (s["total_messages_processed"], s["total_messages_dropped"], s["total_errors"]) == (
        1,
        2,
        1,
    )
    assert s["gpu_utilization"] is None
    c.unregister("a")
    assert c.get("a") is None


# --- GPUMonitor ------------------------------------------------------------------------


def test_gpu_monitor_reports_unavailable_cleanly_without_a_gpu() -> None:
    mon = GPUMonitor()
    if mon.is_available:
        pytest.skip("an NVIDIA GPU is present: the unavailable path is not reachable here")
    assert mon.unavailable_reason  # says why: library, driver or device missing
    assert mon.device_count == 0
    assert mon.get_gpu_info(0, strict=True) is None
    assert mon.get_all_gpu_info() == []
    assert mon.get_utilization(0, strict=True) is None
    assert mon.get_memory_info(0, strict=True) is None
    # the default answers are PyDotCompute 0.2's placeholders
    assert mon.get_gpu_info(0) == GPUInfo.placeholder(0)
    assert mon.get_utilization(0) == 0.0
    assert mon.get_memory_info(0) == {"used": 0, "free": 0, "total": 0}
    mon.shutdown()
    mon.shutdown()  # idempotent
    assert TelemetryCollector().summary()["gpu_utilization"] is None


def test_gpu_monitor_without_the_library_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    mon = GPUMonitor()
    assert mon.is_available is False
    assert mon.unavailable_reason == (
        'nvidia-ml-py is not installed (pip install "pydotcompute[cuda]")'
    )


def _fake_nvml(**overrides: Any) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    state = {"init": 0, "shutdown": 0}

    class Mem:
        total, used, free = 80 << 30, 10 << 30, 70 << 30

    class Util:
        gpu, memory = 37, 12

    def unsupported(*_: Any) -> Any:
        raise RuntimeError("not supported")

    nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    nv.nvmlInit = lambda: state.__setitem__("init", state["init"] + 1)  # type: ignore[attr-defined]
    nv.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"  # type: ignore[attr-defined]
    nv.nvmlDeviceGetName = lambda h: b"Fake GPU " + h.encode()  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMemoryInfo = lambda h: Mem()  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUtilizationRates = lambda h: Util()  # type: ignore[attr-defined]
    nv.nvmlDeviceGetTemperature = lambda h, kind: 55  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPowerUsage = unsupported  # type: ignore[attr-defined]
    nv.nvmlSystemGetDriverVersion = lambda: "550.1"  # type: ignore[attr-defined]
    nv.state = state  # type: ignore[attr-defined]
    for name, value in overrides.items():
        setattr(nv, name, value)
    return nv


def test_gpu_monitor_reads_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    mon = GPUMonitor()
    assert mon.is_available
    assert mon.unavailable_reason == ""
    assert mon.device_count == 2
    info = mon.get_gpu_info(1)
    assert info == GPUInfo(
        index=1,
        name="Fake GPU h1",
        uuid="",  # the fake has no nvmlDeviceGetUUID: empty, not an error
        memory_total=80 << 30,
        memory_used=10 << 30,
        memory_free=70 << 30,
        utilization_gpu=0.37,  # fractions, as in 0.2
        utilization_memory=0.12,
        temperature=55.0,
        power_usage=None,  # unsupported on this board: None, not an error
        power_limit=None,
        driver_version="550.1",
    )
    assert info.memory_utilization == pytest.approx(0.125)
    assert info.memory_utilization_percent == pytest.approx(12.5)
    assert info.utilization_gpu_percent == pytest.approx(37.0)
    assert (info.total_memory, info.used_memory, info.free_memory) == (
        80 << 30,
        10 << 30,
        70 << 30,
    )
    assert repr(mon) == "<GPUMonitor available=True devices=2>"
    assert info.to_dict()["name"] == "Fake GPU h1"
    assert [i.index for i in mon.get_all_gpu_info()] == [0, 1]
    assert mon.get_utilization(0) == pytest.approx(0.37)
    assert mon.get_memory_info(0) == {"total": 80 << 30, "used": 10 << 30, "free": 70 << 30}
    with pytest.raises(IndexError, match=r"GPU index 5 out of range \(have 2\)"):
        mon.get_gpu_info(5, strict=True)
    assert mon.get_gpu_info(5) == GPUInfo.placeholder(5)  # 0.2: a placeholder, no error
    mon.shutdown()
    assert nv.state == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]
    assert not mon.is_available  # stays shut down, as in 0.2
    assert nv.state == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]
    assert mon.initialize() is True
    assert nv.state == {"init": 2, "shutdown": 1}  # type: ignore[attr-defined]


def test_gpu_monitor_when_nvml_init_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise RuntimeError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(nvmlInit=no_driver))
    mon = GPUMonitor()
    assert not mon.is_available
    assert mon.unavailable_reason == "NVML unavailable: Driver Not Loaded"
    assert mon.get_all_gpu_info() == []


def test_get_gpu_monitor_is_a_singleton() -> None:
    assert get_gpu_monitor() is get_gpu_monitor()


# --- the shapes code written for 0.2 calls ---------------------------------------------


def test_telemetry_built_the_0_2_way_every_argument_optional() -> None:
    blank = RingKernelTelemetry()
    assert (blank.kernel_id, blank.messages_processed, blank.queue_depth) == ("", 0, 0)
    # positionally, in 0.2's order: kernel_id, processed, dropped, queue_depth, latencies...
    t = RingKernelTelemetry("k", 10, 2, 3, 1_000, 400, 50, 1, "boom", 20.0)
    assert (t.messages_processed, t.messages_dropped, t.queue_depth) == (10, 2, 3)
    assert (t.total_latency_ns, t.max_latency_ns, t.min_latency_ns) == (1_000, 400, 50)
    assert (t.error_count, t.last_error) == (1, "boom")
    assert t.uptime_seconds == 20.0  # stored, as in 0.2
    assert t.throughput == 0.5
    assert t.to_dict()["uptime_seconds"] == 20.0


def test_telemetry_dataclass_replace_and_equality() -> None:
    import dataclasses

    t = RingKernelTelemetry("k", 3, 1)
    t.record_message(500)
    r = dataclasses.replace(t, messages_dropped=7)
    assert (r.kernel_id, r.messages_processed, r.messages_dropped) == ("k", 4, 7)
    assert RingKernelTelemetry("a", 1) != RingKernelTelemetry("b", 1)


def test_telemetry_uptime_seconds_is_settable() -> None:
    t = RingKernelTelemetry(kernel_id="k", messages_processed=50, uptime_seconds=0.0)
    t.uptime_seconds = 100.0
    assert t.uptime_seconds == 100.0
    assert t.throughput == 0.5
    t.reset()
    assert t.uptime_seconds == 0.0  # reset stores 0.0 (a live record restarts its clock)
    assert t.messages_processed == 0


def test_gpu_info_built_the_0_2_way() -> None:
    info = GPUInfo(0, "GPU", "GPU-1234", 1000, 250, 750, 0.4, 0.2, 60, 120.5, 300.0)
    assert info.memory_utilization == pytest.approx(0.25)
    assert (info.temperature, info.power_usage, info.power_limit) == (60, 120.5, 300.0)
    assert info.to_dict()["memory_utilization"] == pytest.approx(0.25)
    empty = GPUInfo(0, "GPU", "", 0, 0, 0, 0.0, 0.0, None, None, None)
    assert empty.memory_utilization == 0.0  # no division by zero


def test_collector_0_2_method_names() -> None:
    c = TelemetryCollector()
    a = c.register_kernel("a")
    assert c.register_kernel("a") is a
    a.record_message(7)
    a.record_error(RuntimeError("bad"))
    assert c.get_kernel_telemetry("a") is a
    assert c.get_kernel_telemetry("zz") is None
    assert c.get_all_telemetry() == {"a": a}
    s = c.get_summary()
    assert (s["kernel_count"], s["total_messages_processed"], s["total_errors"]) == (1, 1, 1)
    c.reset_all()
    assert (a.messages_processed, a.error_count) == (0, 0)
    assert c.get_summary()["total_messages_processed"] == 0
    assert repr(c) == "<TelemetryCollector kernels=1>"
    c.unregister_kernel("a")
    assert c.get_all_telemetry() == {}


def test_gpu_monitor_repr_says_why_it_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert repr(GPUMonitor()) == (
        "<GPUMonitor available=False devices=0 reason='nvidia-ml-py is not installed"
        ' (pip install "pydotcompute[cuda]")\'>'
    )
