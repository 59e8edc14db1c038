"""Code written for PyDotCompute 0.2 gets 0.2's behaviour from the actor runtime.

One test per behaviour of docs/compatibility.md (telemetry, messages, runtime, queue,
lifecycle), plus the switch to the stricter behaviour where ours differs on purpose.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
import types
from typing import Any

import msgspec
import pytest
from foundation_helpers import Req, Resp, doubler

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelAlreadyExistsError,
    KernelNotFoundError,
    KernelStateError,
    MessageDeserializationError,
    QueueFullError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.config import RingKernelConfig
from pydotcompute.ring_kernels.message import RingKernelMessage, deserialize_message, message
from pydotcompute.ring_kernels.queue import BackpressureStrategy, MessageQueue
from pydotcompute.ring_kernels.runtime import RingKernelRuntime
from pydotcompute.ring_kernels.states import KernelState
from pydotcompute.ring_kernels.telemetry import (
    GPUInfo,
    GPUMonitor,
    RingKernelTelemetry,
    TelemetryCollector,
)

# --- 3.1 telemetry ---------------------------------------------------------------------------


def test_average_latency_of_a_record_built_from_totals() -> None:
    t = RingKernelTelemetry(messages_processed=10, total_latency_ns=1_000_000)
    assert t.avg_latency_ns == 100_000.0  # total / processed, as in 0.2
    assert t.avg_latency_ms == 0.1
    assert RingKernelTelemetry().avg_latency_ns == 0.0  # nothing processed: no division


def test_average_latency_prefers_the_timed_messages() -> None:
    t = RingKernelTelemetry(messages_processed=10)
    t.record_latency(500)  # one of the ten was timed: its mean is the timed one's
    assert t.avg_latency_ns == 500.0


def test_uptime_is_stored_on_a_record_built_by_hand() -> None:
    t = RingKernelTelemetry(messages_processed=100, uptime_seconds=10.0)
    time.sleep(0.01)
    assert t.uptime_seconds == 10.0
    assert t.throughput == 10.0  # exactly
    assert t.live is False
    zero = RingKernelTelemetry(messages_processed=100, uptime_seconds=0.0)
    assert zero.throughput == 0.0  # no uptime: no throughput
    assert RingKernelTelemetry("k").uptime_seconds == 0.0  # the default
    t.uptime_seconds = 20.0
    assert t.to_dict()["throughput"] == 5.0
    t.reset()
    assert t.uptime_seconds == 0.0
    assert t.live_uptime_seconds >= 0.0  # the clock is still there to read


def test_a_live_record_reads_a_clock() -> None:
    t = RingKernelTelemetry("k", messages_processed=5, uptime_seconds=20.0, live=True)
    assert t.live
    assert 20.0 <= t.uptime_seconds < 30.0  # started 20 s back
    first = t.uptime_seconds
    time.sleep(0.01)
    assert t.uptime_seconds > first
    t.reset()
    assert t.live
    assert t.uptime_seconds < 10.0
    t.uptime_seconds = 3.0  # assigning stores, as in 0.2
    assert not t.live
    assert t.uptime_seconds == 3.0


async def test_the_runtime_keeps_live_records(rt: RingKernelRuntime) -> None:
    await rt.launch("k", doubler, input_type=Req, output_type=Resp)
    tel = rt.get_counters("k")
    assert tel.live
    first = tel.uptime_seconds
    time.sleep(0.01)
    assert tel.uptime_seconds > first


def test_to_dict_has_avg_latency_ms() -> None:
    d = RingKernelTelemetry(messages_processed=4, total_latency_ns=8_000_000).to_dict()
    assert d["avg_latency_ms"] == 2.0
    assert d["avg_latency_ns"] == 2_000_000.0


def test_collector_stamps_its_uptime_on_get_all_telemetry() -> None:
    c = TelemetryCollector()
    a = c.register_kernel("a")
    assert a.uptime_seconds == 0.0
    c.start_time -= 5.0  # the collector has been up five seconds
    assert c.get_all_telemetry()["a"].uptime_seconds >= 5.0


def test_gpu_info_reads_fractions_and_is_mutable() -> None:
    info = GPUInfo(0, "GPU", "GPU-0", 1000, 250, 750, 0.4, 0.2, 60.0, 120.5, 300.0)
    assert info.memory_utilization == 0.25
    assert info.memory_utilization_percent == 25.0
    assert info.utilization_gpu_percent == pytest.approx(40.0)
    assert info.utilization_memory_percent == pytest.approx(20.0)
    info.temperature = 70.0  # a plain, mutable record
    assert info.to_dict()["temperature"] == 70.0
    assert [f.name for f in dataclasses.fields(GPUInfo)][:11] == [
        "index",
        "name",
        "uuid",
        "memory_total",
        "memory_used",
        "memory_free",
        "utilization_gpu",
        "utilization_memory",
        "temperature",
        "power_usage",
        "power_limit",
    ]


def test_gpu_monitor_without_nvml_answers_with_placeholders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    mon = GPUMonitor()
    info = mon.get_gpu_info(0)
    assert (info.index, info.name, info.uuid) == (0, "N/A", "")
    assert (info.memory_total, info.memory_used, info.memory_free) == (0, 0, 0)
    assert (info.utilization_gpu, info.temperature, info.power_usage) == (0.0, 0.0, 0.0)
    assert mon.get_utilization(0) == 0.0
    assert mon.get_memory_info(0) == {"used": 0, "free": 0, "total": 0}
    # the strict switch says "no data" instead, and the reason stays readable
    assert mon.get_gpu_info(0, strict=True) is None
    assert mon.get_utilization(0, strict=True) is None
    assert mon.get_memory_info(0, strict=True) is None
    assert not mon.is_available
    assert "nvidia-ml-py" in mon.unavailable_reason
    text = repr(mon)
    assert "available=False" in text
    assert "devices=0" in text


def _failing_nvml() -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    calls = {"init": 0}

    def init() -> None:
        calls["init"] += 1

    def lost(*_: Any) -> Any:
        raise RuntimeError("GPU is lost")

    nv.nvmlInit = init  # type: ignore[attr-defined]
    nv.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"  # type: ignore[attr-defined]
    nv.nvmlDeviceGetName = lost  # type: ignore[attr-defined]
    nv.calls = calls  # type: ignore[attr-defined]
    return nv


def test_gpu_monitor_on_an_nvml_error(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = _failing_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    mon = GPUMonitor()
    assert mon.is_available
    assert mon.get_gpu_info(0) == GPUInfo.placeholder(0)  # 0.2: a placeholder
    assert mon.get_gpu_info(3) == GPUInfo.placeholder(3)  # out of range: the same
    with pytest.raises(RuntimeError, match="GPU is lost"):
        mon.get_gpu_info(0, strict=True)
    with pytest.raises(IndexError, match="out of range"):
        mon.get_gpu_info(3, strict=True)
    assert repr(mon) == "<GPUMonitor available=True devices=1>"


def test_gpu_monitor_stays_unavailable_after_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = _failing_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    mon = GPUMonitor()
    assert mon.is_available
    mon.shutdown()
    assert not mon.is_available
    assert "shut down" in mon.unavailable_reason
    assert nv.calls["init"] == 1  # type: ignore[attr-defined]  # no silent restart
    assert mon.initialize() is True  # the explicit way back
    assert nv.calls["init"] == 2  # type: ignore[attr-defined]


# --- 3.9 messages ------------------------------------------------------------------------


def test_a_bare_message_round_trips() -> None:
    msg = RingKernelMessage(priority=7)
    data = msg.serialize()
    assert isinstance(data, bytes)
    back = RingKernelMessage.deserialize(data)
    assert type(back) is RingKernelMessage
    assert (back.message_id, back.priority, back.correlation_id) == (msg.message_id, 7, None)
    again = deserialize_message(data)
    assert type(again) is RingKernelMessage
    assert again.message_id == msg.message_id


def test_an_undecorated_subclass_is_told_to_decorate() -> None:
    class Plain(RingKernelMessage):
        x: int = 0

    with pytest.raises(TypeValidationError, match="decorate it with @message") as info:
        Plain().serialize()
    assert "pickled" not in str(info.value)


def test_unknown_message_types_are_refused() -> None:
    data = msgspec.msgpack.encode(["nowhere.Unknown", 1, None, 128, None])
    with pytest.raises(MessageDeserializationError, match="import the module"):
        deserialize_message(data)


@message
class _Apple:
    n: int = 0


@message
class _Pear:
    n: int = 0


def test_bytes_of_another_type_are_refused() -> None:
    with pytest.raises(MessageDeserializationError, match="expected _Pear"):
        _Pear.deserialize(_Apple(n=1).serialize())
    # the base class reads any message: every message is a RingKernelMessage
    assert isinstance(RingKernelMessage.deserialize(_Apple(n=1).serialize()), _Apple)


# --- 3.10 runtime ------------------------------------------------------------------------


async def _reply_waiting(rt: RingKernelRuntime, kid: str = "k") -> None:
    await rt.launch(kid, doubler, input_type=Req, output_type=Resp)
    await rt.activate(kid)
    assert (await rt.send_and_receive(kid, Req(x=1), timeout=10)).y == 2
    await rt.send(kid, Req(x=5))
    tel = rt.get_counters(kid)
    deadline = time.monotonic() + 30
    while tel.messages_sent < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert tel.messages_sent == 2


async def test_terminate_frees_the_id_and_parks_the_kernel(rt: RingKernelRuntime) -> None:
    await _reply_waiting(rt)
    left = await rt.terminate("k")
    assert left == []  # the undelivered messages (0.2: None, which callers ignore)
    assert rt.kernel_ids == []
    assert "k" not in rt
    assert len(rt) == 0
    assert rt.terminated_ids == ["k"]
    # parked: still readable
    assert (await rt.receive("k", timeout=5)).y == 10
    assert rt.get_kernel("k").state is KernelState.TERMINATED
    assert rt.get_kernel("k").undelivered == []
    tel = rt.get_telemetry("k")
    assert tel is not None
    assert tel.messages_processed == 2
    rt.remove("k")
    assert rt.terminated_ids == []
    with pytest.raises(KernelNotFoundError):
        rt.get_kernel("k")


async def test_the_same_id_launches_again_after_terminate(
    rt: RingKernelRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    await _reply_waiting(rt)
    await rt.terminate("k")
    with caplog.at_level("WARNING", logger="pydotcompute"):
        await rt.launch("k", doubler, input_type=Req, output_type=Resp)
    assert "kernel 'k' removed with 1 unread replies" in caplog.text  # never silent
    assert rt.kernel_ids == ["k"]
    assert rt.terminated_ids == []
    assert rt.get_kernel("k").state is KernelState.LAUNCHED
    with pytest.raises(KernelAlreadyExistsError):  # a live id is still refused
        await rt.launch("k", doubler)


async def test_shutdown_clears_the_ids_and_the_runtime_starts_again() -> None:
    rt = RingKernelRuntime()
    await rt.start()
    await rt.launch("a", doubler, input_type=Req, output_type=Resp)
    await rt.send("a", Req(x=1))  # never activated: undelivered
    report = await rt.shutdown()
    assert report == {"a": 1}  # (0.2: None, which callers ignore)
    assert rt.kernel_ids == []
    assert not rt.is_active
    assert rt.get_kernel("a").undelivered  # still readable
    await rt.start()
    assert rt.is_active
    await rt.launch("a", doubler, input_type=Req, output_type=Resp)
    await rt.activate("a")
    assert (await rt.send_and_receive("a", Req(x=4), timeout=10)).y == 8
    assert await rt.shutdown() == {}


async def test_telemetry_disabled_reads_as_none() -> None:
    async with RingKernelRuntime(enable_telemetry=False) as rt:
        await rt.launch("k", doubler, input_type=Req, output_type=Resp)
        await rt.activate("k")
        assert (await rt.send_and_receive("k", Req(x=1), timeout=10)).y == 2
        assert rt.get_telemetry("k") is None
        assert rt.get_all_telemetry() == {}
        assert rt.get_summary() == {
            "kernel_count": 1,
            "total_messages_processed": 0,
            "total_messages_dropped": 0,
            "total_errors": 0,
        }
        # what is counted anyway (arrivals, drops, errors), through the strict accessor
        assert rt.get_counters("k").messages_received == 1


async def test_unknown_id_telemetry_is_none_counters_raise(rt: RingKernelRuntime) -> None:
    assert rt.get_telemetry("nope") is None
    with pytest.raises(KernelNotFoundError, match="nope"):
        rt.get_counters("nope")


# --- 3.12 queue --------------------------------------------------------------------------


def test_a_full_queue_raises_instead_of_growing() -> None:
    block = MessageQueue(1)
    assert block.put_nowait(1) is True
    with pytest.raises(QueueFullError, match="full"):
        block.put_nowait(2)  # 0.2 grew past maxsize here
    assert len(block) == 1
    reject = MessageQueue(1, backpressure="reject")
    reject.put_nowait(1)
    with pytest.raises(QueueFullError, match="reject"):
        reject.put_nowait(2)  # 0.2: False
    assert reject.backpressure is BackpressureStrategy.REJECT
    with pytest.raises(AttributeError):
        reject.backpressure = BackpressureStrategy.BLOCK  # type: ignore[misc]


# --- 3.13 lifecycle ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("grid_size", 0),
        ("block_size", -1),
        ("input_queue_size", 0),
        ("output_queue_size", 0),
    ],
)
def test_a_config_below_one_is_refused_when_made(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):  # InvalidConfigurationError is one
        RingKernelConfig("k", **{field: value})


def test_a_config_checks_the_runtime_bounds_when_made() -> None:
    with pytest.raises(InvalidConfigurationError, match=r"block_size must be an int in 1\.\.1024"):
        RingKernelConfig("k", block_size=4096)
    with pytest.raises(InvalidConfigurationError, match="grid_size must be an int"):
        RingKernelConfig("k", grid_size=2.0)  # type: ignore[arg-type]
    cfg = RingKernelConfig("k", grid_size=4, block_size=1024, input_queue_size=1)
    assert dataclasses.replace(cfg, grid_size=2).grid_size == 2


async def test_a_restarted_runtime_serves_metrics_again() -> None:
    pytest.importorskip("prometheus_client")
    rt = RingKernelRuntime()
    await rt.start()
    rt.serve_metrics(port=0)
    await rt.shutdown()
    with pytest.raises(KernelStateError, match=r"SHUT DOWN; await runtime.start\(\) first"):
        rt.serve_metrics(port=0)
    await rt.start()
    try:
        _host, port = rt.serve_metrics(port=0)
        assert port > 0
    finally:
        await rt.shutdown()
