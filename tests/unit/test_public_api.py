"""The public surface of ``pydotcompute`` and ``pydotcompute.ring_kernels`` (API.md), pinned.

Names and the signatures that user code written against the documented 0.2 API relies on.
Extra parameters with defaults ("ours" in API.md) are allowed when keyword-only or appended;
a missing name, a renamed or reordered parameter or a changed default is not.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import io
from typing import Any

import msgspec
import pytest
from foundation_helpers import run_python

import pydotcompute
import pydotcompute.ring_kernels as rk
from pydotcompute.ring_kernels.fast_queue import BackpressureStrategy

P = inspect.Parameter
POS = P.POSITIONAL_OR_KEYWORD
KW = P.KEYWORD_ONLY
_ = P.empty

TOP_LEVEL = [
    "__version__",
    "Accelerator",
    "UnifiedBuffer",
    "BufferState",
    "MemoryPool",
    "ComputeOrchestrator",
    "RingKernelRuntime",
    "RingKernelMessage",
    "kernel",
    "gpu_kernel",
    "ring_kernel",
    "message",
    "KernelContext",
    "show_config",
    "run",
]
RING_KERNELS = [
    "RingKernelRuntime",
    "RingKernel",
    "KernelState",
    "KernelContext",
    "RingKernelConfig",
    "RingKernelMessage",
    "message",
    "ArrayMessage",
    "array_message",
    "MessageQueue",
    "FastMessageQueue",
    "RingBuffer",
    "PriorityBand",
    "BackpressureStrategy",
    "BufferRegistry",
    "BufferHandle",
    "get_buffer_registry",
    "register_buffer",
    "get_buffer",
    "release_buffer",
    "RingKernelTelemetry",
    "GPUMonitor",
    "install_uvloop",
    "install_eager_task_factory",
    "is_uvloop_available",
    "is_uvloop_installed",
    "is_eager_tasks_installed",
    "get_loop_info",
    "create_optimized_loop",
    "optimize_current_loop",
    "ThreadedRingKernel",
    "ThreadedKernelContext",
    "ThreadedKernelConfig",
    "ThreadedKernelState",
    "ThreadedKernelPool",
    "SyncQueue",
    "SPSCQueue",
    "CythonRingKernel",
    "CythonKernelContext",
    "CythonKernelConfig",
    "CythonKernelState",
    "is_cython_kernel_available",
]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name(name: str) -> None:
    assert name in pydotcompute.__all__ or name == "__version__"
    assert getattr(pydotcompute, name) is not None


@pytest.mark.parametrize("name", RING_KERNELS)
def test_ring_kernels_name(name: str) -> None:
    assert name in rk.__all__
    assert getattr(rk, name) is not None


def test_all_is_a_sorted_tuple_of_existing_names() -> None:
    for module in (pydotcompute, rk):
        assert isinstance(module.__all__, tuple)
        assert len(set(module.__all__)) == len(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
        assert set(module.__all__) <= set(dir(module))


def test_same_objects_at_both_levels() -> None:
    for name in ("RingKernelRuntime", "RingKernelMessage", "message", "KernelContext"):
        assert getattr(pydotcompute, name) is getattr(rk, name)


def test_unknown_attributes_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        pydotcompute.nope  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        rk.nope  # noqa: B018


def test_version() -> None:
    assert pydotcompute.__version__ == "0.3.0"


# --- signatures ------------------------------------------------------------------------

Spec = list[tuple[str, Any, Any]]  # (name, kind, default)


def _check(obj: Any, expected: Spec) -> None:
    params = list(inspect.signature(obj).parameters.values())
    params = [p for p in params if p.name != "self"]
    names = [p.name for p in params]
    for i, (name, kind, default) in enumerate(expected):
        assert name in names, f"{obj!r} lacks parameter {name!r}; has {names}"
        p = params[names.index(name)]
        if kind is POS:
            assert names.index(name) == i, f"{name!r} moved in {obj!r}: {names}"
        assert p.kind == kind, f"{name!r} of {obj!r} is {p.kind}, expected {kind}"
        assert p.default == default, f"{name!r} of {obj!r} defaults to {p.default!r}"
    documented = {n for n, _, _ in expected}
    last_documented = max(names.index(n) for n in documented)
    for i, p in enumerate(params):  # anything else is optional and appended or keyword-only
        if p.name not in documented:
            assert p.kind == P.VAR_KEYWORD or p.default is not _, p.name
            if p.kind is POS:
                assert i > last_documented, f"undocumented positional {p.name!r} inserted"


SIGNATURES: dict[str, tuple[Any, Spec]] = {
    "MessageQueue": (
        rk.MessageQueue,
        [
            ("maxsize", POS, 4096),
            ("backpressure", KW, BackpressureStrategy.BLOCK),
            ("use_priority", KW, True),
            ("kernel_id", KW, ""),
        ],
    ),
    "FastMessageQueue": (
        rk.FastMessageQueue,
        [("maxsize", POS, 4096), ("kernel_id", KW, ""), ("serialize", KW, False)],
    ),
    "RingBuffer": (rk.RingBuffer, [("capacity", POS, 4096)]),
    "RingKernel": (
        rk.RingKernel,
        [
            ("kernel_id", POS, _),
            ("kernel_func", POS, _),
            ("config", KW, None),
            ("input_type", KW, None),
            ("output_type", KW, None),
        ],
    ),
    "RingKernelRuntime": (
        rk.RingKernelRuntime,
        [("enable_telemetry", KW, True), ("use_uvloop", KW, True), ("use_eager_tasks", KW, True)],
    ),
    "runtime.launch": (
        rk.RingKernelRuntime.launch,
        [
            ("kernel_id", POS, _),
            ("kernel_func", POS, None),
            ("config", KW, None),
            ("input_type", KW, None),
            ("output_type", KW, None),
        ],
    ),
    "runtime.send": (
        rk.RingKernelRuntime.send,
        [("kernel_id", POS, _), ("msg", POS, _), ("timeout", KW, None)],
    ),
    "runtime.receive": (
        rk.RingKernelRuntime.receive,
        [("kernel_id", POS, _), ("timeout", KW, None)],
    ),
    "runtime.shutdown": (rk.RingKernelRuntime.shutdown, [("timeout", POS, 10.0)]),
    "runtime.kernel_scope": (
        rk.RingKernelRuntime.kernel_scope,
        [("kernel_id", POS, _), ("kernel_func", POS, None)],
    ),
    "kernel.terminate": (rk.RingKernel.terminate, [("timeout", POS, None)]),
    "kernel.send": (rk.RingKernel.send, [("msg", POS, _), ("timeout", POS, None)]),
    "kernel.receive": (rk.RingKernel.receive, [("timeout", POS, None)]),
    "ctx.receive": (rk.KernelContext.receive, [("timeout", POS, None)]),
    "ctx.send": (rk.KernelContext.send, [("msg", POS, _)]),
    "ring_kernel": (
        pydotcompute.ring_kernel,
        [
            ("func", POS, None),
            ("kernel_id", KW, None),
            ("input_type", KW, None),
            ("output_type", KW, None),
            ("queue_size", KW, 4096),
            ("input_queue_size", KW, None),
            ("output_queue_size", KW, None),
            ("grid_size", KW, 1),
            ("block_size", KW, 256),
            ("backpressure", KW, "block"),
            ("auto_register", KW, True),
        ],
    ),
    "managed_kernel": (
        rk.managed_kernel,
        [("kernel_id", POS, _), ("kernel_func", POS, _)],
    ),
    "install_eager_task_factory": (rk.install_eager_task_factory, [("loop", POS, None)]),
}


@pytest.mark.parametrize("what", list(SIGNATURES))
def test_signature(what: str) -> None:
    obj, expected = SIGNATURES[what]
    _check(obj, expected)


def test_message_decorator_bare_or_called() -> None:
    params = list(inspect.signature(pydotcompute.message).parameters.values())
    assert [(p.name, p.default) for p in params] == [("cls", None)]


def test_ring_kernel_config_fields() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(rk.RingKernelConfig)}
    assert list(fields)[:7] == [
        "kernel_id",
        "grid_size",
        "block_size",
        "input_queue_size",
        "output_queue_size",
        "backpressure_strategy",
        "use_fast_queue",
    ]
    assert (fields["grid_size"], fields["block_size"]) == (1, 256)
    assert (fields["input_queue_size"], fields["output_queue_size"]) == (4096, 4096)
    assert (fields["backpressure_strategy"], fields["use_fast_queue"]) == ("block", True)


def test_message_header_fields() -> None:
    fields = {f.name: f for f in msgspec.structs.fields(rk.RingKernelMessage)}
    assert list(fields) == ["message_id", "priority", "correlation_id"]
    params = inspect.signature(rk.RingKernelMessage).parameters
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in fields)
    assert fields["priority"].default == 128
    assert fields["correlation_id"].default is None
    for method in ("serialize", "deserialize", "with_correlation", "reply"):
        assert callable(getattr(rk.RingKernelMessage, method))


def _members(cls: type[enum.Enum]) -> dict[str, Any]:
    return {m.name: m.value for m in cls}


def test_enums() -> None:
    assert _members(rk.KernelState) == {
        "CREATED": "created",
        "LAUNCHED": "launched",
        "ACTIVE": "active",
        "DEACTIVATED": "deactivated",
        "TERMINATING": "terminating",
        "TERMINATED": "terminated",
        "FAILED": "failed",
    }
    assert _members(rk.PriorityBand) == {"SYSTEM": 0, "HIGH": 1, "NORMAL": 2, "LOW": 3}
    assert set(_members(rk.BackpressureStrategy)) == {"BLOCK", "REJECT", "DROP_OLDEST"}


@pytest.mark.parametrize(
    ("cls", "attrs"),
    [
        (
            rk.MessageQueue,
            "maxsize qsize empty full put get put_nowait get_nowait clear get_stats __len__",
        ),
        (
            rk.FastMessageQueue,
            "maxsize qsize empty full put get put_nowait get_nowait clear get_stats put_batch "
            "get_batch statistics __len__",
        ),
        (rk.RingBuffer, "put get put_nowait get_nowait capacity"),
        (rk.KernelContext, "should_terminate is_active receive send wait_active send_to"),
        (
            rk.RingKernel,
            "state config launch activate deactivate reactivate terminate send receive "
            "send_nowait send_and_receive",
        ),
        (
            rk.RingKernelRuntime,
            "start shutdown is_active kernel_ids launch activate deactivate reactivate "
            "terminate send receive send_and_receive get_kernel_state get_telemetry "
            "get_all_telemetry get_summary get_loop_info kernel_scope send_nowait "
            "terminate_all connect __aenter__ __aexit__",
        ),
        (
            rk.RingKernelTelemetry,
            "avg_latency_ns avg_latency_ms throughput record_message record_drop record_error "
            "reset to_dict p50_latency_ns p95_latency_ns p99_latency_ns uptime_seconds",
        ),
        (
            rk.GPUMonitor,
            "is_available device_count get_gpu_info get_all_gpu_info get_utilization "
            "get_memory_info shutdown",
        ),
        (rk.BufferRegistry, "register get release get_stats"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "attrs",
)
def test_members(cls: type, attrs: str) -> None:
    missing = [a for a in attrs.split() if not hasattr(cls, a)]
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_telemetry_fields() -> None:
    names = {f.name for f in dataclasses.fields(rk.RingKernelTelemetry)}
    assert names >= {
        "kernel_id",
        "messages_processed",
        "messages_dropped",
        "queue_depth",
        "total_latency_ns",
        "max_latency_ns",
        "min_latency_ns",
        "error_count",
        "last_error",
    }


def test_registry_helpers_live_in_the_runtime_module() -> None:
    from pydotcompute.ring_kernels import runtime

    assert callable(runtime.register_ring_kernel)
    assert callable(runtime.get_registered_kernel)


def test_decorators_surface() -> None:
    import pydotcompute.decorators as d

    for name in (
        "kernel",
        "gpu_kernel",
        "ring_kernel",
        "get_ring_kernel_meta",
        "is_ring_kernel",
        "RingKernelBuilder",
        "validate_message",
        "validate_config",
        "validate_queue_size",
        "validate_grid_size",
        "validate_block_size",
        "validate_priority",
        "validate_backpressure_strategy",
        "RuntimeValidator",
    ):
        assert name in d.__all__
        assert getattr(d, name) is not None


# --- show_config / python -m pydotcompute info -----------------------------------------


def test_show_config_writes_a_report() -> None:
    buf = io.StringIO()
    pydotcompute.show_config(file=buf)
    text = buf.getvalue()
    assert text.startswith(f"pydotcompute {pydotcompute.__version__}  (Python ")
    for line in ("event loop    :", "libraries     :", "tiers         :", "backends      :"):
        assert line in text
    assert "msgspec" in text


@pytest.mark.parametrize("argv", [["info"], []], ids=["info", "no-command"])
def test_python_m_pydotcompute_info(argv: list[str]) -> None:
    proc = run_python("-m", "pydotcompute", *argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"pydotcompute {pydotcompute.__version__}")
    assert "event loop    : uvloop available=" in proc.stdout
    assert "tiers         : asyncio=True" in proc.stdout
