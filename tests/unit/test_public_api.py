"""The public surface of ``pydotcompute`` and ``pydotcompute.ring_kernels`` (API.md), pinned.

Names and the signatures that user code written against the documented 0.2 API relies on.
Extra parameters with defaults ("ours" in API.md) are allowed when keyword-only or appended;
a missing name, a renamed or reordered parameter or a changed default is not.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import io
import os
import pickle
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest
from foundation_helpers import ROOT, run_python

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

# Ours, beside API.md's list: every other name of `ring_kernels.__all__`. Names for writing
# a tier (the contract, the bridge, the registry) live in `ring_kernels.extend` instead.
RING_KERNELS_OURS = [
    "GPUKernelOptions",
    "GPUKernelStatistics",
    "GPURingKernel",
    "Instrument",
    "QueueStats",
    "deserialize_message",
    "get_message_type",
    "get_priority_band",
    "get_registered_kernel",
    "managed_kernel",
    "register_ring_kernel",
]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name(name: str) -> None:
    assert name in pydotcompute.__all__ or name == "__version__"
    assert getattr(pydotcompute, name) is not None


@pytest.mark.parametrize("name", RING_KERNELS)
def test_ring_kernels_name(name: str) -> None:
    assert name in rk.__all__
    assert getattr(rk, name) is not None


def test_ring_kernels_all_holds_the_users_names_and_no_others() -> None:
    assert sorted(rk.__all__) == sorted(RING_KERNELS + RING_KERNELS_OURS)


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
            "terminate_all connect broadcast __aenter__ __aexit__",
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
    assert "tiers         : can each run here?\n  asyncio      yes" in proc.stdout
    gpu = next(ln for ln in proc.stdout.splitlines() if ln.startswith("  gpu "))
    assert gpu.startswith(("  gpu          yes  ", "  gpu          no   "))
    assert gpu.split(maxsplit=2)[2]  # and says why


def test_info_ignores_packages_in_the_working_directory(tmp_path: Path) -> None:
    """A folder named like an optional package (with its metadata) in the directory the
    command runs from is not an installed package: the report is the same as from an
    empty directory."""
    from pydotcompute import _info

    clean, planted = tmp_path / "clean", tmp_path / "planted"
    clean.mkdir()
    planted.mkdir()
    for module, dists, _extra in _info._OPTIONAL:
        if module in ("msgspec", "numpy", "uvloop"):
            continue  # `python -m` itself would import these from the folder, as any program
        (planted / module).mkdir()
        (planted / module / "__init__.py").write_text("raise SystemExit('imported')\n")
        for dist in dists.split("|"):
            meta = planted / f"{dist.replace('-', '_')}-99.0.dist-info"
            meta.mkdir()
            (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 99.0\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # the package under test; the cwd comes from `-m` alone

    def libraries(cwd: Path) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "pydotcompute", "info"],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        start = lines.index("libraries     :") + 1
        end = next(i for i, ln in enumerate(lines) if ln.startswith("tiers"))
        return lines[start:end]

    seen = libraries(planted)
    assert "99.0" not in "\n".join(seen)
    assert seen == libraries(clean)


# --- the shapes code written for 0.2 calls (API.md, last section) ------------------------
# Each is pinned here by signature; its behaviour is tested beside its module.


def _old_shapes() -> dict[str, tuple[Any, Spec]]:
    from pydotcompute.backends import cpu as cpu_backend
    from pydotcompute.compilation import (
        CompilationOptions,
        CompiledKernel,
        KernelCache,
        KernelCompiler,
        compile_kernel,
        warmup_kernels,
    )
    from pydotcompute.core import memory_pool as mp
    from pydotcompute.decorators import KernelRegistry, cuda_source
    from pydotcompute.ring_kernels import telemetry as tel

    return {
        "RingKernelTelemetry": (
            tel.RingKernelTelemetry,
            [
                ("kernel_id", POS, ""),
                ("messages_processed", POS, 0),
                ("messages_dropped", POS, 0),
                ("queue_depth", POS, 0),
                ("total_latency_ns", POS, 0),
                ("max_latency_ns", POS, 0),
                ("min_latency_ns", POS, 0),
                ("error_count", POS, 0),
                ("last_error", POS, None),
                ("uptime_seconds", POS, 0.0),
            ],
        ),
        "GPUInfo": (
            tel.GPUInfo,
            [
                ("index", POS, _),
                ("name", POS, _),
                ("uuid", POS, _),
                ("memory_total", POS, _),
                ("memory_used", POS, _),
                ("memory_free", POS, _),
                ("utilization_gpu", POS, _),
                ("utilization_memory", POS, _),
                ("temperature", POS, None),
                ("power_usage", POS, None),
                ("power_limit", POS, None),
            ],
        ),
        "GPUMonitor.get_memory_info": (tel.GPUMonitor.get_memory_info, [("index", POS, 0)]),
        "PoolStatistics": (
            mp.PoolStatistics,
            [("used_bytes", POS, 0), ("total_bytes", POS, 0), ("n_free_blocks", POS, 0)],
        ),
        "MemoryPool": (mp.MemoryPool, [("initial_size_mb", POS, 0), ("max_size_mb", POS, None)]),
        "configure_memory_pool": (
            mp.configure_memory_pool,
            [("initial_size_mb", POS, 0), ("max_size_mb", POS, None), ("enable", POS, True)],
        ),
        "CompilationOptions": (
            CompilationOptions,
            [
                ("device", POS, "cuda"),
                ("fastmath", POS, True),
                ("debug", POS, False),
                ("lineinfo", POS, False),
                ("opt_level", POS, 3),
                ("cache", POS, True),
            ],
        ),
        "CompiledKernel": (
            CompiledKernel,
            [
                ("kernel", POS, None),
                ("name", POS, "kernel"),
                ("source_hash", POS, ""),
                ("signature", POS, None),
                ("options", POS, None),
                ("compile_time_ms", POS, 0.0),
                ("ptx", POS, None),
            ],
        ),
        "KernelCompiler": (KernelCompiler, [("options", POS, None)]),
        "compile_kernel": (compile_kernel, [("func", POS, _), ("signature", KW, None)]),
        "KernelCache": (
            KernelCache,
            [("cache_dir", POS, None), ("max_entries", POS, 128), ("max_size_mb", POS, 256)],
        ),
        "warmup_kernels": (warmup_kernels, [("kernels", POS, _)]),
        "KernelRegistry.register": (
            KernelRegistry.register,
            [("name", POS, _), ("kernel", POS, _), ("overwrite", KW, False)],
        ),
        "cuda_source": (cuda_source, [("source", POS, _)]),
        "vector_add_cpu": (cpu_backend.vector_add_cpu, [("a", POS, _), ("b", POS, _)]),
        "matrix_multiply_cpu": (cpu_backend.matrix_multiply_cpu, [("a", POS, _), ("b", POS, _)]),
        "parallel_for": (
            cpu_backend.parallel_for,
            [("start", POS, _), ("end", POS, _), ("func", POS, _)],
        ),
    }


@pytest.mark.parametrize("what", list(_old_shapes()))
def test_0_2_signature(what: str) -> None:
    obj, expected = _old_shapes()[what]
    _check(obj, expected)


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "pydotcompute.ring_kernels.telemetry",
            "RingKernelTelemetry GPUInfo GPUMonitor TelemetryCollector",
        ),
        ("pydotcompute.core.memory_pool", "PoolStatistics MemoryPool configure_memory_pool"),
        ("pydotcompute.core.orchestrator", "ComputeOrchestrator KernelLaunchConfig"),
        (
            "pydotcompute.compilation",
            "CompilationOptions CompiledKernel KernelCompiler compile_kernel KernelCache "
            "CacheEntry get_kernel_cache warmup_kernels",
        ),
        ("pydotcompute.decorators", "KernelRegistry get_kernel_registry cuda_source"),
        ("pydotcompute.decorators.kernel", "KernelRegistry get_kernel_registry cuda_source"),
        (
            "pydotcompute.backends.cpu",
            "CPUBackend vector_add_cpu matrix_multiply_cpu parallel_for",
        ),
        ("pydotcompute.backends.cuda", "get_vector_add_kernel get_matrix_multiply_kernel"),
        (
            "pydotcompute.backends.metal",
            "MetalBackend get_vector_add_kernel get_matrix_multiply_kernel get_elementwise_kernel",
        ),
    ],
)
def test_0_2_import_paths(module: str, names: str) -> None:
    proc = run_python("-c", f"from {module} import {', '.join(names.split())}")
    assert proc.returncode == 0, proc.stderr


def test_0_2_members() -> None:
    from pydotcompute.backends import CPUBackend, MetalBackend
    from pydotcompute.compilation import CacheEntry, KernelCompiler
    from pydotcompute.core import ComputeOrchestrator
    from pydotcompute.ring_kernels.telemetry import GPUInfo, TelemetryCollector

    wanted = {
        TelemetryCollector: "register_kernel unregister_kernel get_kernel_telemetry "
        "get_all_telemetry get_summary reset_all",
        GPUInfo: "memory_utilization",
        ComputeOrchestrator: "is_active accelerator memory_pool",
        KernelCompiler: "cuda_available numba_available compile get_cached_kernel "
        "clear_cache get_cache_stats",
        CPUBackend: "allocate_zeros",
        MetalBackend: "get_memory_info clear_cache",
    }
    for cls, attrs in wanted.items():
        missing = [a for a in attrs.split() if not hasattr(cls, a)]
        assert not missing, f"{cls.__name__} lacks {missing}"
    assert {"kernel_name", "source_hash"} <= {f.name for f in dataclasses.fields(CacheEntry)}


def test_reprs_say_what_a_person_debugging_needs() -> None:
    from pydotcompute.compilation import KernelCompiler
    from pydotcompute.core import Accelerator, MemoryPool
    from pydotcompute.ring_kernels.telemetry import GPUMonitor

    assert repr(MemoryPool.create()).startswith("MemoryPool(enabled=True, ")
    acc = repr(Accelerator())
    assert acc.startswith("Accelerator(devices=")
    assert f"devices={Accelerator().device_count}" in acc
    assert repr(KernelCompiler()).startswith("KernelCompiler(cuda=")
    assert repr(GPUMonitor()).startswith("<GPUMonitor available=")


# --- info: can each tier run here, and why not -------------------------------------------


def _libs(**installed: bool) -> dict[str, Any]:
    names = ("numba", "numba_cuda", "cupy", "ray")
    return {
        n: {"installed": installed.get(n, False), "version": "9.9" if installed.get(n) else None}
        for n in names
    }


class _FakeDriver:
    def __init__(self, init_rc: int = 0, count: int = 1) -> None:
        self.init_rc, self.count = init_rc, count

    def cuInit(self, flags: int) -> int:
        return self.init_rc

    def cuDeviceGetCount(self, ref: Any) -> int:
        ref._obj.value = self.count
        return 0


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        (None, (0, "no NVIDIA driver (libcuda.so.1 not found)")),
        (
            _FakeDriver(init_rc=100),
            (0, "no CUDA device (the NVIDIA driver is loaded but sees no GPU)"),
        ),
        (_FakeDriver(init_rc=34), (0, "the NVIDIA driver did not start (CUDA_ERROR_STUB_LIBRARY")),
        (_FakeDriver(count=0), (0, "no CUDA device")),
        (_FakeDriver(count=2), (2, "")),
    ],
    ids=["no-driver", "no-device", "stub", "zero-devices", "two-gpus"],
)
def test_cuda_driver_probe(
    monkeypatch: pytest.MonkeyPatch, driver: Any, expected: tuple[int, str]
) -> None:
    from pydotcompute import _info

    def cdll(name: str) -> Any:
        if driver is None:
            raise OSError(f"{name}: cannot open shared object file")
        return driver

    monkeypatch.setattr(_info.sys, "platform", "linux")
    monkeypatch.setattr(_info.ctypes, "CDLL", cdll)
    count, why = _info.cuda_driver_devices()
    assert count == expected[0]
    assert why.startswith(expected[1])


def test_tier_status_says_why_a_tier_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydotcompute import _info

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.delenv("PYDOTCOMPUTE_PUREPYTHON", raising=False)
    monkeypatch.setattr(_info, "cuda_driver_devices", lambda: (0, "no NVIDIA driver (x)"))
    bare = _info.tier_status(_libs(), cython_ext=False)
    assert (bare["asyncio"]["runs"], bare["thread"]["runs"], bare["process"]["runs"]) == (
        True,
        True,
        True,
    )
    assert "pure-Python twin, slower" in bare["process"]["why"]
    assert bare["process"]["why"].count('pip install "pydotcompute[cython]"') == 1
    assert bare["gpu"] == {
        "runs": False,
        "why": 'numba-cuda is not installed: pip install "pydotcompute[cuda]"',
    }
    assert bare["ray"] == {
        "runs": False,
        "why": 'ray is not installed: pip install "pydotcompute[ray]"',
    }
    full = _info.tier_status(_libs(numba=True, numba_cuda=True, ray=True), cython_ext=True)
    assert full["gpu"] == {"runs": False, "why": "no NVIDIA driver (x)"}  # the code is not enough
    assert full["process"]["why"] == "shared-memory ring: the compiled extension"
    assert full["ray"] == {"runs": True, "why": "ray 9.9"}
    monkeypatch.setattr(_info, "cuda_driver_devices", lambda: (4, ""))
    assert _info.tier_status(_libs(numba=True), True)["gpu"] == {
        "runs": True,
        "why": "4 CUDA device(s)",
    }
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    sim = _info.tier_status(_libs(numba=True), True)["gpu"]
    assert sim["runs"] is True
    assert "simulator" in sim["why"]
    monkeypatch.setenv("PYDOTCOMPUTE_PUREPYTHON", "1")
    assert "PYDOTCOMPUTE_PUREPYTHON is set" in _info.tier_status(_libs(), True)["process"]["why"]


# A program written against 0.2's compute toolkit, as such code reads; it must run unchanged.
OLD_PROGRAM = """
import asyncio
import tempfile

import numpy as np

from pydotcompute.backends.cpu import CPUBackend, matrix_multiply_cpu, parallel_for, vector_add_cpu
from pydotcompute.backends.metal import MetalBackend, get_vector_add_kernel
from pydotcompute.compilation import (
    CompilationOptions, CompiledKernel, KernelCache, KernelCompiler, compile_kernel,
)
from pydotcompute.core.memory_pool import MemoryPool, PoolStatistics, configure_memory_pool
from pydotcompute.core.orchestrator import ComputeOrchestrator, KernelLaunchConfig
from pydotcompute.decorators.kernel import KernelRegistry, cuda_source
from pydotcompute.ring_kernels.telemetry import GPUInfo, RingKernelTelemetry, TelemetryCollector

t = RingKernelTelemetry("worker", 100, 2, 5)
t.uptime_seconds = 10.0
assert round(t.throughput) == 10
collector = TelemetryCollector()
collector.register_kernel("worker").record_message(1000)
assert collector.get_summary()["total_messages_processed"] == 1
gpu = GPUInfo(0, "GPU", "GPU-0", 100, 25, 75, 1.0, 2.0, 40, 50.0, 300.0)
assert gpu.memory_utilization == 0.25

pool = MemoryPool(0, 64)
stats = pool.get_stats()
assert isinstance(stats, PoolStatistics) and stats.utilization == 0.0
configure_memory_pool(initial_size_mb=0, max_size_mb=None, enable=True)


def add(a, b, out):
    out[:] = a + b


async def main():
    async with ComputeOrchestrator() as orch:
        assert orch.is_active and orch.accelerator is not None and orch.memory_pool is not None
        orch.register_kernel("add", add)
        out = np.zeros(4)
        a = b = np.ones(4)
        execution = await orch.launch_kernel("add", KernelLaunchConfig(1, 4), a, b, out)
        assert execution.duration_ms >= 0 and out.tolist() == [2.0] * 4
        assert KernelLaunchConfig(1, 4).grid_size == (1,)
        try:
            await orch.launch_kernel("missing", KernelLaunchConfig(1, 1))
        except ValueError:
            pass
        else:
            raise AssertionError("an unknown kernel must raise ValueError")

asyncio.run(main())

opts = CompilationOptions(
    device="cpu", fastmath=True, debug=False, lineinfo=False, opt_level=3, cache=True
)
compiler = KernelCompiler(options=opts)
assert isinstance(compiler.numba_available, bool) and isinstance(compiler.cuda_available, bool)
k = compiler.compile(add)
assert compiler.get_cached_kernel(k.source_hash) is k and compiler.clear_cache() == 1
assert isinstance(compile_kernel(add, signature=None, device="cpu"), CompiledKernel)
cache = KernelCache(cache_dir=tempfile.mkdtemp(), max_entries=128, max_size_mb=256)
assert cache.store("add", "abc", b"//ptx", signature=None, metadata=None) is True
assert cache.load("add", "abc") == b"//ptx" and cache.contains("add", "abc")

registry = KernelRegistry.private()
registry.register("add", cuda_source("__global__ void add() {}")(add))
assert registry.list() == ["add"] and registry.get("add").__cuda_source__

assert vector_add_cpu(np.ones(2), np.ones(2)).tolist() == [2.0, 2.0]
assert matrix_multiply_cpu(np.eye(2), np.eye(2)).tolist() == [[1.0, 0.0], [0.0, 1.0]]
assert CPUBackend().allocate_zeros((2,), np.float32).tolist() == [0.0, 0.0]
seen = []
parallel_for(0, 3, seen.append)
assert seen == [0, 1, 2]
if MetalBackend().is_available:
    import mlx.core as mx
    assert get_vector_add_kernel()(mx.array([1.0]), mx.array([2.0])).item() == 3.0
print("0.2 program ran")
"""


def test_a_0_2_program_runs_unchanged() -> None:
    proc = run_python("-c", OLD_PROGRAM)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("0.2 program ran")


# --- old module paths, and where public classes say they live --------------------------

# The module paths API.md names that only re-export: kept for 0.2 code, each the same
# objects as the public namespace.
OLD_PATHS = {
    "pydotcompute.ring_kernels.lifecycle": "KernelState RingKernelConfig KernelContext "
    "RingKernel managed_kernel",
    "pydotcompute.ring_kernels.sync_queue": "SyncQueue SPSCQueue",
    "pydotcompute.ring_kernels.threaded_kernel": "ThreadedKernelState ThreadedKernelConfig "
    "ThreadedKernelContext ThreadedRingKernel ThreadedKernelPool",
    "pydotcompute.ring_kernels.cython_kernel": "CythonKernelState CythonKernelConfig "
    "CythonKernelContext CythonRingKernel is_cython_kernel_available",
}


@pytest.mark.parametrize("path", list(OLD_PATHS))
def test_the_old_paths_0_2_code_imports_still_work(path: str) -> None:
    old = importlib.import_module(path)
    assert old.__doc__ is not None
    assert old.__doc__.startswith("Kept for 0.2 code: ")
    for name in OLD_PATHS[path].split():
        assert getattr(old, name) is getattr(rk, name), f"{path}.{name}"


def _reexport_only(tree: ast.Module) -> bool:
    """True when a module's body is only a docstring, imports, ``__all__`` and aliases."""
    imports = False
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom | ast.Import):
            imports = imports or getattr(node, "module", None) != "__future__"
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(
            node.value, ast.Name | ast.Attribute | ast.Tuple | ast.List
        ):
            continue
        return False
    return imports


def test_no_module_only_re_exports_except_those_kept_on_purpose() -> None:
    package = ROOT / "pydotcompute"
    found = sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and _reexport_only(ast.parse(path.read_text("utf-8")))
    )
    # the four old paths above, and the Ray tier's public entry point
    assert found == sorted([*OLD_PATHS, "pydotcompute.distributed.ray"])


def test_the_re_export_check_finds_one() -> None:
    """The checker itself flags a re-export module and passes one that defines something."""
    assert _reexport_only(ast.parse('"""Doc."""\nfrom .a import B as B\n__all__ = ("B",)\nC = B\n'))
    assert not _reexport_only(ast.parse("from .a import B\n\ndef f() -> None: ...\n"))


def _public_classes() -> dict[type, str]:
    """Each class the public namespaces export under its own name -> the shallowest of
    them that exports it."""
    out: dict[type, str] = {}
    for namespace in ("pydotcompute.core", "pydotcompute.ring_kernels", "pydotcompute"):
        module = importlib.import_module(namespace)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and obj.__qualname__ == name:
                out[obj] = namespace
    return out


# Message classes keep their defining module: it is part of their wire tag, and the check
# of their fields' types resolves names there. The GPU tier's classes are its room's own.
KEEP_DEFINING_MODULE = {"RingKernelMessage", "ArrayMessage"}
GPU_ROOM = {"GPURingKernel", "GPUKernelOptions", "GPUKernelStatistics"}


def test_public_classes_report_the_module_users_import_them_from() -> None:
    classes = _public_classes()
    assert len(classes) > 30
    wrong = {
        cls.__qualname__: (cls.__module__, namespace)
        for cls, namespace in classes.items()
        if cls.__qualname__ not in KEEP_DEFINING_MODULE | GPU_ROOM and cls.__module__ != namespace
    }
    assert wrong == {}
    assert pydotcompute.RingKernelRuntime.__module__ == "pydotcompute"
    assert repr(pydotcompute.RingKernelRuntime) == "<class 'pydotcompute.RingKernelRuntime'>"
    assert rk.RingKernelConfig.__module__ == "pydotcompute.ring_kernels"
    assert rk.RingKernelMessage.__module__ == "pydotcompute.ring_kernels.message.base"


def test_every_exported_class_is_found_where_it_says_it_lives() -> None:
    """What pickle and a reader of ``repr`` rely on: ``__module__`` + ``__qualname__``
    resolve to the class itself (aliases such as `CythonRingKernel` included), and its
    type hints still resolve."""
    for namespace in ("pydotcompute", "pydotcompute.ring_kernels", "pydotcompute.core"):
        module = importlib.import_module(namespace)
        for name in module.__all__:
            cls = getattr(module, name)
            if not isinstance(cls, type):
                continue
            home = importlib.import_module(cls.__module__)
            assert getattr(home, cls.__qualname__) is cls, f"{namespace}.{name}"
            typing.get_type_hints(cls, include_extras=True)
            assert pickle.loads(pickle.dumps(cls)) is cls
    config = rk.RingKernelConfig("k", grid_size=2)
    assert pickle.loads(pickle.dumps(config)) == config
    assert pickle.loads(pickle.dumps(rk.KernelState.ACTIVE)) is rk.KernelState.ACTIVE
    assert pickle.loads(pickle.dumps(rk.PriorityBand.HIGH)) is rk.PriorityBand.HIGH


def test_the_module_reported_does_not_depend_on_the_import_path() -> None:
    """Imported first from the defining module, in a fresh interpreter, a class already
    reports its public module."""
    code = (
        "from pydotcompute.ring_kernels.tiers.thread.standalone import ThreadedRingKernel\n"
        "from pydotcompute.ring_kernels.runtime import RingKernelRuntime\n"
        "from pydotcompute.core.memory_pool import MemoryPool, PoolStatistics\n"
        "from pydotcompute.ring_kernels.tiers.process.kernel import CythonKernelState\n"
        "for c in (ThreadedRingKernel, RingKernelRuntime, MemoryPool, PoolStatistics,\n"
        "          CythonKernelState):\n"
        "    print(c.__module__ + '.' + c.__qualname__)\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "pydotcompute.ring_kernels.ThreadedRingKernel",
        "pydotcompute.RingKernelRuntime",
        "pydotcompute.MemoryPool",
        "pydotcompute.core.PoolStatistics",
        "pydotcompute.ring_kernels.CythonKernelState",
    ]
