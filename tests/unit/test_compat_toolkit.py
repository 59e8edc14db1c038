"""Code written for PyDotCompute 0.2 gets 0.2's behaviour from the compute toolkit.

One test per behaviour of docs/compatibility.md (decorators, validators, orchestrator,
memory pool, compilation cache, unified buffer, backends, accelerator), plus the switch to
the stricter behaviour where ours differs on purpose.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
import warnings
from typing import Any

import numpy as np
import pytest

from pydotcompute.exceptions import (
    BufferNotAllocatedError,
    BufferSyncError,
    InvalidConfigurationError,
    KernelNotFoundError,
    TypeValidationError,
)

# --- 3.2 decorators, RingKernelMeta, RingKernelBuilder, KernelRegistry -------------------


def test_kernel_registry_is_a_singleton_with_a_private_escape() -> None:
    from pydotcompute.decorators import KernelRegistry, get_kernel_registry

    assert KernelRegistry() is KernelRegistry() is get_kernel_registry()
    shared = KernelRegistry()
    shared.register("compat_probe", len, overwrite=True)
    try:
        assert "compat_probe" in KernelRegistry()  # a second call did not empty it
        private = KernelRegistry.private()
        assert private is not shared
        assert len(private) == 0
    finally:
        shared.unregister("compat_probe")


def test_ring_kernel_meta_reads_as_the_0_2_dict() -> None:
    from pydotcompute.decorators import get_ring_kernel_meta, ring_kernel

    @ring_kernel(kernel_id="compat_meta", queue_size=64, grid_size=2, auto_register=False)
    async def actor(ctx: Any) -> None: ...

    meta = get_ring_kernel_meta(actor)
    assert meta is not None
    assert list(meta.keys()) == ["kernel_id", "input_type", "output_type", "config"]
    assert meta["kernel_id"] == "compat_meta"
    assert meta["input_type"] is None
    assert meta["config"] == {
        "input_queue_size": 64,
        "output_queue_size": 64,
        "grid_size": 2,
        "block_size": 256,
        "backpressure_strategy": "block",
    }
    assert meta.get("nope", 5) == 5
    assert "config" in meta
    with pytest.raises(KeyError):
        meta["backend_name"]
    assert meta.grid_size == 2  # the flat fields stay


def test_ring_kernel_zero_queue_sizes_mean_queue_size() -> None:
    from pydotcompute.decorators import get_ring_kernel_meta, ring_kernel

    @ring_kernel(
        kernel_id="compat_zero_q",
        queue_size=32,
        input_queue_size=0,
        output_queue_size=0,
        auto_register=False,
    )
    async def actor(ctx: Any) -> None: ...

    meta = get_ring_kernel_meta(actor)
    assert meta is not None
    assert (meta.input_queue_size, meta.output_queue_size) == (32, 32)


def test_builder_with_chain_and_build_without_arguments() -> None:
    from pydotcompute.decorators import RingKernelBuilder, get_ring_kernel_meta

    async def handler(ctx: Any) -> None: ...

    builder = (
        RingKernelBuilder("compat_built")
        .with_input_queue_size(16)
        .with_output_queue_size(8)
        .with_grid_size(4)
        .with_block_size(128)
        .with_handler(handler)
    )
    assert repr(builder) == "RingKernelBuilder(id='compat_built', input=None, output=None)"
    fn = builder.build(register=False)
    assert fn is handler
    meta = get_ring_kernel_meta(fn)
    assert meta is not None
    assert (meta.input_queue_size, meta.output_queue_size) == (16, 8)
    assert (meta.grid_size, meta.block_size) == (4, 128)
    with pytest.raises(InvalidConfigurationError, match="Handler function is required"):
        RingKernelBuilder("compat_no_handler").build()
    with pytest.raises(ValueError, match="Handler function is required"):
        RingKernelBuilder("compat_no_handler").build()


def test_builder_grid_keeps_an_earlier_block_size() -> None:
    from pydotcompute.decorators import RingKernelBuilder, get_ring_kernel_meta

    async def handler(ctx: Any) -> None: ...

    fn = RingKernelBuilder("compat_grid").with_block_size(64).grid(8).build(handler, register=False)
    meta = get_ring_kernel_meta(fn)
    assert meta is not None
    assert (meta.grid_size, meta.block_size) == (8, 64)


# --- 3.3 validators ------------------------------------------------------------------------


def test_get_validator_imports_the_0_2_way_and_is_process_wide() -> None:
    from pydotcompute.decorators.validators import RuntimeValidator, get_validator

    v = get_validator()
    assert isinstance(v, RuntimeValidator)
    assert get_validator(strict=False) is v  # strict applies on first creation only


def test_grid_and_block_sizes_take_and_return_tuples() -> None:
    from pydotcompute.decorators.validators import validate_block_size, validate_grid_size

    assert validate_grid_size(1) == (1,)
    assert validate_grid_size((2, 3)) == (2, 3)
    assert validate_grid_size(()) == ()
    assert validate_grid_size(10**9) == (10**9,)  # no upper bound
    assert validate_block_size(256) == (256,)
    assert validate_block_size((16, 16, 4)) == (16, 16, 4)
    assert validate_block_size(()) == ()
    assert validate_block_size((32, 64), max_threads=2048) == (32, 64)
    with pytest.raises(InvalidConfigurationError, match="at most 3 dimensions"):
        validate_grid_size((1, 1, 1, 1), name="grid")
    with pytest.raises(InvalidConfigurationError, match=r"^my_block .* 2048 threads"):
        validate_block_size((32, 64), name="my_block")
    with pytest.raises(InvalidConfigurationError, match="positive ints, got 0"):
        validate_grid_size((2, 0))


def test_queue_size_and_priority_use_0_2_ranges() -> None:
    from pydotcompute.decorators.validators import validate_priority, validate_queue_size

    assert validate_queue_size(1_000_000) == 1_000_000
    assert validate_queue_size(True) == 1
    with pytest.raises(InvalidConfigurationError):
        validate_queue_size(1_000_001)
    assert validate_priority(True) == 1
    with pytest.raises(InvalidConfigurationError, match=r"0\.\.255"):
        validate_priority(256)
    with pytest.raises(ValueError):  # still a ValueError
        validate_priority(-1)


def test_backpressure_strategy_compares_equal_to_its_string() -> None:
    from pydotcompute.decorators.validators import validate_backpressure_strategy

    assert validate_backpressure_strategy("block") == "block"
    assert validate_backpressure_strategy("drop_oldest") == "drop_oldest"


def test_runtime_validator_0_2_api() -> None:
    from pydotcompute.decorators.validators import RuntimeValidator

    @dataclasses.dataclass
    class Msg:
        x: int = 0

    strict = RuntimeValidator(strict=True)
    assert strict.strict is True
    assert strict.validate_message_type(Msg) is True
    with pytest.raises(TypeValidationError, match="dict is not a dataclass"):
        strict.validate_message_type(dict)
    lax = RuntimeValidator(strict=False)
    assert lax.strict_types is False
    assert lax.validate_message_type(dict) is False
    warned = lax.warnings
    assert warned == ["dict is not a dataclass"]
    warned.append("not kept")  # a copy
    assert len(lax.warnings) == 1
    lax.clear_warnings()
    assert lax.warnings == []
    config = lax.validate_kernel_config(
        {"grid_size": 2, "block_size": (8, 8), "queue_size": 10, "backpressure_strategy": "reject"}
        | {"unknown": 1}
    )
    assert config == {
        "queue_size": 10,
        "grid_size": (2,),
        "block_size": (8, 8),
        "backpressure_strategy": "reject",
    }
    with pytest.raises(InvalidConfigurationError):
        lax.validate_kernel_config({"block_size": 4096})


def test_validate_message_is_a_class_decorator_too() -> None:
    from pydotcompute.decorators.validators import check_message, validate_message

    @dataclasses.dataclass
    class WithSerialize:
        x: int = 0

        def serialize(self) -> bytes:
            return b""

    assert validate_message(WithSerialize) is WithSerialize
    with pytest.warns(UserWarning, match="serialize"):

        @validate_message
        @dataclasses.dataclass
        class Plain:
            x: int = 0

    with pytest.raises(TypeValidationError, match="must be a dataclass"):
        validate_message(dict)
    msg = WithSerialize()
    assert validate_message(msg, WithSerialize) is msg  # the instance check stays
    assert check_message(msg, WithSerialize, "k") is msg


def test_validate_message_accepts_message_classes() -> None:
    from pydotcompute import message
    from pydotcompute.decorators.validators import validate_message

    @message
    class Ping:
        n: int = 0

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate_message(Ping) is Ping  # a dataclass with serialize(): no warning


def test_validate_config_is_a_decorator_factory_for_classes() -> None:
    from pydotcompute.decorators.validators import validate_config
    from pydotcompute.ring_kernels.lifecycle import RingKernelConfig

    @dataclasses.dataclass
    class Settings:
        size: int
        name: str
        scale: float | None = None

    @validate_config(Settings)
    def run(size: int, name: str, scale: float | None = None, other: Any = None) -> str:
        return f"{name}:{size}"

    assert run(3, "a") == "a:3"
    assert run(size=3, name="a", scale=2, other=object()) == "a:3"  # an int is a float
    with pytest.raises(TypeValidationError, match="parameter 'size' must be int, got str"):
        run("3", "a")
    with pytest.raises(TypeValidationError, match="'scale'"):
        run(3, "a", scale="big")
    cfg = RingKernelConfig("instance")
    assert validate_config(cfg) is cfg  # an instance is still validated and returned


async def test_validate_config_keeps_coroutine_functions_async() -> None:
    from pydotcompute.decorators.validators import validate_config

    @dataclasses.dataclass
    class Settings:
        n: int

    @validate_config(Settings)
    async def work(n: int) -> int:
        return n * 2

    assert inspect.iscoroutinefunction(work)
    assert await work(4) == 8
    with pytest.raises(TypeValidationError):
        await work("4")


# --- 3.4 orchestrator ------------------------------------------------------------------------


def test_kernel_execution_defaults_every_field() -> None:
    from pydotcompute.core.orchestrator import KernelExecution, KernelLaunchConfig

    e = KernelExecution()
    assert e.kernel_name == ""
    assert e.config == KernelLaunchConfig()
    assert (e.start_time, e.end_time, e.success, e.error) == (0.0, 0.0, False, None)
    assert e.duration_ms == 0.0
    assert KernelExecution().execution_id != e.execution_id
    partial = KernelExecution(kernel_name="k", start_time=1.0, end_time=1.25)
    assert partial.duration_ms == pytest.approx(250.0)
    partial.end_time = 1.5  # mutable, and duration_ms follows
    assert partial.duration_ms == pytest.approx(500.0)
    err = ZeroDivisionError("x")
    failed = KernelExecution(kernel_name="k", error=err)
    assert failed.error is err
    assert failed.error_message == "ZeroDivisionError: x"
    assert KernelExecution(execution_id=uuid.uuid4().int).execution_id > 0


async def test_orchestrator_0_2_calls() -> None:
    from pydotcompute.backends.cpu import CPUBackend
    from pydotcompute.core.orchestrator import ComputeOrchestrator, KernelLaunchConfig

    def scale(x: np.ndarray, *, factor: float = 1.0) -> np.ndarray:
        return x * factor

    orch = ComputeOrchestrator(CPUBackend())
    await orch.initialize()
    orch.register_kernel("scale", scale)
    assert orch.get_kernel("missing") is None
    with pytest.raises(KernelNotFoundError):
        orch.require_kernel("missing")
    with pytest.raises(ValueError, match="Kernel 'missing' not registered"):
        await orch.launch_kernel("missing", KernelLaunchConfig())
    execution = await orch.launch_kernel("scale", KernelLaunchConfig(), np.ones(3), factor=4.0)
    assert execution.success
    assert execution.result is not None
    assert execution.result.output.tolist() == [4.0, 4.0, 4.0]
    with pytest.raises(InvalidConfigurationError, match="reserved"):
        await orch.launch_kernel("scale", None, np.ones(3), stream=None)
    async with orch.stream_context() as stream:
        assert stream is None  # the CPU has no streams
    with orch.stream_context() as stream:
        assert stream is None
    assert len(orch.get_execution_history(limit=0)) == 1  # 0: all of it
    assert repr(orch).startswith("ComputeOrchestrator(active=True, kernels=1, executions=1")
    await orch.shutdown()


async def test_orchestrator_records_the_exception_object() -> None:
    from pydotcompute.backends.cpu import CPUBackend
    from pydotcompute.core.orchestrator import ComputeOrchestrator

    def bad() -> None:
        raise KeyError("gone")

    async with ComputeOrchestrator(CPUBackend()) as orch:
        with pytest.raises(KeyError):
            await orch.launch_kernel(bad)
        [record] = orch.get_execution_history()
        assert isinstance(record.error, KeyError)
        assert record.error_message == "KeyError: 'gone'"
        assert record.success is False


# --- 3.5 memory pool ---------------------------------------------------------------------


def test_memory_pool_singleton_and_private_pools() -> None:
    from pydotcompute.core import MemoryPool, PoolStatistics, get_memory_pool

    assert MemoryPool() is MemoryPool() is get_memory_pool()
    private = MemoryPool(max_size_mb=1)
    assert private is not MemoryPool()
    assert MemoryPool.create() is not MemoryPool.create()
    stats = MemoryPool.create().get_pinned_stats()
    assert isinstance(stats, PoolStatistics)
    assert stats["bytes_in_use"] == 0
    pool = MemoryPool.create()
    block = pool.acquire(1024, np.uint8)
    pool.release(block)
    assert pool.get_stats().n_free_blocks == 1
    assert pool.free_all_free() > 0
    assert pool.get_stats().n_free_blocks == 0
    assert repr(pool).startswith("MemoryPool(enabled=True, used=0.00MB, total=0.00MB, cuda=")


def test_memory_pool_instance_reset() -> None:
    from pydotcompute.core import MemoryPool, get_memory_pool

    old = MemoryPool()
    try:
        MemoryPool._instance = None  # what 0.2 tests do to start over
        fresh = MemoryPool()
        assert fresh is not old
        assert fresh is get_memory_pool()
    finally:
        MemoryPool._instance = old


# --- 3.6 compilation cache and compiler ------------------------------------------------------


def test_cache_entry_accepts_0_2_keywords() -> None:
    from pydotcompute.compilation.cache import CacheEntry

    entry = CacheEntry(
        kernel_name="add",
        source_hash="abc",
        signature="(f4[:],)",
        ptx_path="/tmp/add.ptx",
        created_timestamp=1.0,
        last_accessed=2.0,
        hit_count=3,
    )
    assert (entry.kernel_name, entry.signature, entry.hit_count) == ("add", "(f4[:],)", 3)
    assert entry.key == ""


def test_cache_stats_serve_the_0_2_keys(tmp_path: Any) -> None:
    from pydotcompute.compilation.cache import KernelCache

    cache = KernelCache(cache_dir=tmp_path / "c", max_entries=4)
    assert cache.store("add", "abc", b"//ptx")
    assert cache.load("add", "abc") == b"//ptx"
    stats = cache.get_stats()
    assert stats.keys() == [
        "entries",
        "max_entries",
        "total_size_bytes",
        "max_size_bytes",
        "total_hits",
        "cache_dir",
    ]
    assert stats["entries"] == 1
    assert stats["total_size_bytes"] == 5
    assert stats["total_hits"] == 1
    assert stats["max_entries"] == 4
    [entry] = cache.entries()
    assert entry.ptx_path is not None
    assert entry.ptx_path.endswith(".bin")
    assert entry.created_timestamp > 0
    assert repr(cache).startswith("KernelCache(entries=1/4, size=0.0KB")


def test_compiler_cache_stats_and_repr() -> None:
    from pydotcompute.compilation.compiler import KernelCompiler

    compiler = KernelCompiler()
    compiler.compile(lambda x: x + 1, device="cpu")
    stats = compiler.get_cache_stats()
    assert stats["cached_kernels"] == 1 == stats["size"]
    assert "cached=1" in repr(compiler)


# --- 3.7 UnifiedBuffer -------------------------------------------------------------------


def test_cpu_device_is_the_host_array() -> None:
    from pydotcompute import UnifiedBuffer

    buf = UnifiedBuffer((4,), np.float32, backend="cpu").allocate()
    assert buf.device is buf.host
    assert buf.shares_memory
    buf.host[:] = 7  # no mark: the device sees it anyway
    assert buf.device.tolist() == [7, 7, 7, 7]
    buf.mark_host_dirty()
    buf.mark_device_dirty()  # nothing can be lost: no warning, no error
    assert buf.transfer_stats.host_to_device == 0
    separate = UnifiedBuffer((4,), np.float32, backend="cpu", device_copy=True).allocate()
    assert separate.device is not separate.host
    assert not separate.shares_memory


def test_fill_zeros_copy_from_allocate_and_chain() -> None:
    from pydotcompute import UnifiedBuffer

    buf = UnifiedBuffer((3,), np.float32, backend="cpu")
    assert buf.fill(2.0) is buf
    assert buf.host.tolist() == [2.0, 2.0, 2.0]
    assert UnifiedBuffer((3,), np.float32, backend="cpu").zeros().host.tolist() == [0, 0, 0]
    fresh = UnifiedBuffer((3,), np.float32, backend="cpu")
    assert fresh.copy_from(np.arange(3)) is fresh  # int64 into float32, as np.copyto does
    assert fresh.host.tolist() == [0.0, 1.0, 2.0]
    assert fresh.copy_from(np.array([5.0])).host.tolist() == [5.0, 5.0, 5.0]  # broadcast
    with pytest.raises(ValueError, match="dtypes differ"):
        fresh.copy_from(np.arange(3), exact=True)
    fresh.free()
    for op in (lambda: fresh.fill(1), fresh.zeros, lambda: fresh.copy_from([1, 2, 3])):
        with pytest.raises(BufferNotAllocatedError, match="was freed"):
            op()


def test_conflicting_marks_warn_by_default_and_raise_when_strict() -> None:
    from pydotcompute import UnifiedBuffer
    from pydotcompute.core.unified_buffer import BufferState

    buf = UnifiedBuffer((2,), np.float32, backend="cpu", device_copy=True).allocate()
    buf.mark_host_dirty()
    with pytest.warns(RuntimeWarning, match="the last mark wins"):
        buf.mark_device_dirty()
    assert buf.state is BufferState.DEVICE_DIRTY
    strict = UnifiedBuffer(
        (2,), np.float32, backend="cpu", device_copy=True, strict_sync=True
    ).allocate()
    strict.mark_host_dirty()
    with pytest.raises(BufferSyncError):
        strict.mark_device_dirty()


def test_unified_buffer_is_subscriptable_at_runtime() -> None:
    from pydotcompute import UnifiedBuffer

    alias = UnifiedBuffer[np.float32]
    assert alias.__origin__ is UnifiedBuffer


# --- 3.8 backends ----------------------------------------------------------------------------


def test_cpu_execute_kernel_returns_failures_by_default() -> None:
    from pydotcompute.backends.base import KernelExecutionResult
    from pydotcompute.backends.cpu import CPUBackend

    def bad() -> None:
        raise ValueError("inside")

    backend = CPUBackend()
    result = backend.execute_kernel(bad, 1, 1)
    assert result.success is False
    assert isinstance(result.error, ValueError)
    assert result.execution_time_ms >= 0
    with pytest.raises(ValueError, match="inside"):
        backend.execute_kernel(bad, 1, 1, on_error="raise")
    with pytest.raises(InvalidConfigurationError, match="on_error"):
        backend.execute_kernel(bad, 1, 1, on_error="ignore")
    ok = backend.execute_kernel(lambda x, *, k: x * k, 1, 1, 2, k=5)  # keywords reach it
    assert ok.output == 10
    assert ok.error is None
    made = KernelExecutionResult(success=True, execution_time_ms=1.5, error=None)
    made.success = False  # mutable, as in 0.2
    assert made.kernel_name == ""


def test_cpu_backend_parallel_for_and_repr() -> None:
    from pydotcompute.backends.cpu import CPUBackend

    seen: list[int] = []
    CPUBackend().parallel_for(0, 4, seen.append)
    assert seen == [0, 1, 2, 3]
    assert repr(CPUBackend()) == "CPUBackend(available=True, device='cpu:0')"


def test_metal_compiled_kernel_takes_numpy_arrays() -> None:
    from pydotcompute.backends.metal import MetalBackend

    metal = MetalBackend()
    if not metal.is_available:
        pytest.skip(f"MLX is not usable here: {metal.unavailable_reason}")
    kernel = metal.compile_kernel(lambda x: x * 2 + 1)
    out = kernel(np.array([1, 2, 3], dtype=np.float32))
    assert np.asarray(out).tolist() == [3.0, 5.0, 7.0]


# --- 3.11 accelerator --------------------------------------------------------------------


def test_compute_capability_str_is_na_without_one() -> None:
    from pydotcompute.core.accelerator import DeviceProperties, DeviceType

    none = DeviceProperties(0, DeviceType.CUDA, "x", compute_capability=None)
    assert none.compute_capability_str == "N/A"
    assert DeviceProperties(0, DeviceType.CPU, "cpu").compute_capability_str == "N/A"
    cuda = DeviceProperties(0, DeviceType.CUDA, "h100", compute_capability=(9, 0))
    assert cuda.compute_capability_str == "9.0"


def test_memory_info_is_a_tuple_and_a_dict() -> None:
    from pydotcompute.core import get_accelerator

    info = get_accelerator().get_memory_info()
    free, total = info
    assert (info["free"], info["total"]) == (free, total)
    assert "used" in info
    assert info["used"] == total - free
    assert {"free", "total", "used"} <= set(info.keys())
    assert dict(info.items())["free"] == free


def test_accelerator_repr_names_devices() -> None:
    from pydotcompute.core import get_accelerator

    acc = get_accelerator()
    acc.device_count  # noqa: B018 - probe
    text = repr(acc)
    assert text.startswith("Accelerator(devices=")
    assert "cuda_available=" in text
    assert "current_device=" in text
