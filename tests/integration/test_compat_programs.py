"""Small programs written the PyDotCompute 0.2 way run unchanged, each in its own interpreter.

One program per module of the compute toolkit (decorators and validators, orchestrator,
memory pool, compilation cache, unified buffer, backends, accelerator) and of the actor
runtime (telemetry, messages, runtime, queue, lifecycle). Each prints ``ok`` as its last
line; any assertion or exception fails the test with the program's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAMS = {
    "decorators_and_validators": """
        import warnings
        from dataclasses import dataclass

        from pydotcompute.decorators import KernelRegistry, RingKernelBuilder, get_kernel_registry
        from pydotcompute.decorators import get_ring_kernel_meta, ring_kernel
        from pydotcompute.decorators.validators import (
            RuntimeValidator, get_validator, validate_block_size, validate_config,
            validate_grid_size, validate_message,
        )
        from pydotcompute.exceptions import TypeValidationError

        assert KernelRegistry() is KernelRegistry() is get_kernel_registry()

        @ring_kernel(kernel_id="doubler", queue_size=128)
        async def doubler(ctx):
            async for msg in ctx:
                pass

        meta = get_ring_kernel_meta(doubler)
        assert meta["kernel_id"] == "doubler"
        assert meta["config"]["input_queue_size"] == 128

        async def handler(ctx):
            pass

        built = (RingKernelBuilder("built").with_queue_size(64).with_grid_size(2)
                 .with_block_size(128).with_handler(handler).build())
        assert get_ring_kernel_meta(built)["config"]["block_size"] == 128
        try:
            RingKernelBuilder("empty").build()
        except ValueError as exc:
            assert "Handler function is required" in str(exc)
        else:
            raise AssertionError("build() without a handler must raise")

        assert validate_grid_size(4) == (4,)
        assert validate_block_size((16, 16)) == (16, 16)
        validator = get_validator()
        assert validator is get_validator()
        lax = RuntimeValidator(strict=False)
        assert lax.validate_message_type(int) is False and lax.warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")

            @validate_message
            @dataclass
            class Reading:
                value: float = 0.0

        @dataclass
        class Params:
            n: int

        @validate_config(Params)
        def step(n):
            return n + 1

        assert step(1) == 2
        try:
            step("1")
        except TypeValidationError:
            pass
        else:
            raise AssertionError("a str for an int parameter must be refused")
        print("ok")
    """,
    "orchestrator": """
        import asyncio

        import numpy as np

        from pydotcompute.core.orchestrator import (
            ComputeOrchestrator, KernelExecution, KernelLaunchConfig,
        )

        def axpy(x, y, a=1.0):
            return a * x + y

        async def main():
            orch = ComputeOrchestrator()
            await orch.initialize()
            orch.register_kernel("axpy", axpy)
            assert orch.get_kernel("nothing") is None
            cfg = KernelLaunchConfig(grid_size=1, block_size=4)
            ex = await orch.launch_kernel("axpy", cfg, np.ones(4), np.ones(4), a=3.0)
            assert ex.success and ex.duration_ms >= 0
            async with orch.stream_context() as stream:
                await orch.launch_kernel("axpy", cfg, np.ones(4), np.zeros(4))
            try:
                await orch.launch_kernel("missing", cfg)
            except ValueError as exc:
                assert "not registered" in str(exc)
            assert len(orch.get_execution_history()) == 2
            await orch.shutdown()

        asyncio.run(main())
        blank = KernelExecution()
        assert blank.success is False and blank.error is None and blank.duration_ms == 0.0
        print("ok")
    """,
    "memory_pool": """
        import numpy as np

        from pydotcompute.core.memory_pool import MemoryPool, get_memory_pool

        pool = MemoryPool()
        assert pool is MemoryPool() is get_memory_pool()
        block = pool.acquire((256,), np.float32)
        pool.release(block)
        stats = pool.get_stats()
        assert stats.used_bytes == 0
        pinned = pool.get_pinned_stats()
        assert pinned.used_bytes == 0
        pool.free_all_free()
        pool.free_all_blocks()
        assert "cuda=" in repr(pool)
        MemoryPool._instance = None
        assert MemoryPool() is not pool
        print("ok")
    """,
    "compilation_cache": """
        import tempfile

        from pydotcompute.compilation.cache import CacheEntry, KernelCache
        from pydotcompute.compilation.compiler import KernelCompiler

        cache = KernelCache(cache_dir=tempfile.mkdtemp(), max_entries=8)
        cache.store("scale", "feed", b"// ptx")
        assert cache.load("scale", "feed") == b"// ptx"
        stats = cache.get_stats()
        assert stats["entries"] == 1 and stats["total_hits"] == 1
        assert stats["total_size_bytes"] == len(b"// ptx")
        entry = CacheEntry(kernel_name="scale", source_hash="feed", signature=None)
        assert entry.hit_count == 0
        compiler = KernelCompiler()
        compiler.compile(lambda x: x * 2, device="cpu")
        assert compiler.get_cache_stats()["cached_kernels"] == 1
        print("ok")
    """,
    "unified_buffer": """
        import numpy as np

        from pydotcompute.core.unified_buffer import UnifiedBuffer

        buf = UnifiedBuffer((4,), dtype=np.float32, backend="cpu")
        buf.copy_from(np.arange(4))          # allocates; int64 data into float32
        assert buf.device.tolist() == [0.0, 1.0, 2.0, 3.0]
        buf.host[0] = 9.0                    # no mark: the CPU device is the host array
        assert buf.device[0] == 9.0
        ones = UnifiedBuffer((3,), dtype=np.float32, backend="cpu").fill(1.0)
        assert ones.host.sum() == 3.0
        assert UnifiedBuffer((2,), backend="cpu").zeros().host.tolist() == [0.0, 0.0]
        typed = UnifiedBuffer[np.float32]
        print("ok")
    """,
    "backends": """
        import numpy as np

        from pydotcompute.backends.base import KernelExecutionResult
        from pydotcompute.backends.cpu import CPUBackend

        backend = CPUBackend()

        def fails(x):
            raise RuntimeError("kernel error")

        result = backend.execute_kernel(fails, (1,), (1,), np.zeros(2))
        assert result.success is False and isinstance(result.error, RuntimeError)
        out = backend.execute_kernel(lambda x, k=1: x * k, (1,), (1,), np.ones(2), k=2)
        assert out.success and out.output.tolist() == [2.0, 2.0]
        seen = []
        backend.parallel_for(0, 3, seen.append)
        assert seen == [0, 1, 2]
        assert repr(backend).startswith("CPUBackend(available=True")
        made = KernelExecutionResult(success=True, execution_time_ms=0.5)
        assert made.error is None

        from pydotcompute.backends.metal import MetalBackend

        metal = MetalBackend()
        if metal.is_available:
            y = metal.compile_kernel(lambda x: x * 2 + 1)(np.array([1, 2, 3], dtype=np.float32))
            assert np.asarray(y).tolist() == [3.0, 5.0, 7.0]
        print("ok")
    """,
    "accelerator": """
        from pydotcompute.core.accelerator import (
            Accelerator, DeviceProperties, DeviceType, get_accelerator,
        )

        acc = Accelerator()
        assert acc is get_accelerator()
        info = acc.get_memory_info()
        assert "free" in info and info["used"] >= 0
        free, total = info
        assert "devices=" in repr(acc)
        props = DeviceProperties(0, DeviceType.CPU, "cpu", compute_capability=None)
        assert props.compute_capability_str == "N/A"
        print("ok")
    """,
    "telemetry": """
        from pydotcompute.ring_kernels.telemetry import (
            GPUInfo, GPUMonitor, RingKernelTelemetry, TelemetryCollector,
        )

        t = RingKernelTelemetry(kernel_id="worker", messages_processed=100,
                                total_latency_ns=10_000_000, uptime_seconds=10.0)
        assert t.throughput == 10.0
        assert t.avg_latency_ns == 100_000.0 and t.avg_latency_ms == 0.1
        d = t.to_dict()
        assert d["avg_latency_ms"] == 0.1 and d["throughput"] == 10.0
        t.reset()
        assert t.uptime_seconds == 0.0 and t.throughput == 0.0

        collector = TelemetryCollector()
        collector.register_kernel("worker").record_message(1000)
        assert collector.get_summary()["total_messages_processed"] == 1
        assert "worker" in collector.get_all_telemetry()

        gpu = GPUInfo(0, "GPU", "GPU-0", 100, 25, 75, 0.5, 0.1, 40.0, 50.0, 300.0)
        assert gpu.memory_utilization == 0.25
        gpu.utilization_gpu = 0.75

        monitor = GPUMonitor()
        info = monitor.get_gpu_info(0)
        if not monitor.is_available:
            assert info.name == "N/A" and info.memory_total == 0
            assert monitor.get_utilization(0) == 0.0
            assert monitor.get_memory_info(0) == {"used": 0, "free": 0, "total": 0}
        assert "available=" in repr(monitor) and "devices=" in repr(monitor)
        monitor.shutdown()
        assert not monitor.is_available
        print("ok")
    """,
    "messages": """
        from pydotcompute.ring_kernels.message import (
            RingKernelMessage, deserialize_message, message,
        )

        ping = RingKernelMessage(priority=200)
        data = ping.serialize()
        back = RingKernelMessage.deserialize(data)
        assert back.priority == 200 and back.message_id == ping.message_id
        assert deserialize_message(data).message_id == ping.message_id

        @message
        class Reading:
            value: float = 0.0

        r = Reading(value=1.5, priority=10)
        assert Reading.deserialize(r.serialize()).value == 1.5
        print("ok")
    """,
    "runtime": """
        import asyncio

        from pydotcompute import RingKernelRuntime, message


        @message
        class Job:
            n: int = 0


        async def square(ctx):
            while not ctx.should_terminate:
                job = await ctx.receive()
                await ctx.send(Job(n=job.n * job.n))


        async def main():
            runtime = RingKernelRuntime(enable_telemetry=False)
            await runtime.start()
            await runtime.launch("sq", square, input_type=Job, output_type=Job)
            await runtime.activate("sq")
            await runtime.send("sq", Job(n=3))
            assert (await runtime.receive("sq", timeout=10)).n == 9
            assert runtime.get_telemetry("sq") is None
            assert runtime.get_all_telemetry() == {}
            assert runtime.get_telemetry("unknown") is None
            await runtime.terminate("sq", timeout=5.0)
            assert "sq" not in runtime.kernel_ids
            await runtime.launch("sq", square, input_type=Job, output_type=Job)
            await runtime.shutdown()
            assert runtime.kernel_ids == []
            await runtime.start()
            await runtime.launch("sq", square, input_type=Job, output_type=Job)
            await runtime.activate("sq")
            await runtime.send("sq", Job(n=4))
            assert (await runtime.receive("sq", timeout=10)).n == 16
            await runtime.shutdown()


        asyncio.run(main())
        print("ok")
    """,
    "queue": """
        import asyncio

        from pydotcompute.ring_kernels.queue import BackpressureStrategy, MessageQueue
        from pydotcompute.exceptions import QueueFullError


        async def main():
            q = MessageQueue(maxsize=2, backpressure=BackpressureStrategy.DROP_OLDEST)
            for i in range(3):
                await q.put(i)
            assert len(q) == 2
            strict = MessageQueue(maxsize=1, backpressure=BackpressureStrategy.REJECT)
            assert strict.put_nowait("a")
            try:
                strict.put_nowait("b")
            except QueueFullError:
                pass
            else:
                raise AssertionError("a full reject queue must refuse")


        asyncio.run(main())
        print("ok")
    """,
    "lifecycle": """
        from pydotcompute.ring_kernels.lifecycle import KernelState, RingKernelConfig

        config = RingKernelConfig(kernel_id="k", grid_size=2, block_size=128)
        assert config.input_queue_size >= 1
        for field in ("grid_size", "block_size", "input_queue_size", "output_queue_size"):
            try:
                RingKernelConfig(kernel_id="k", **{field: 0})
            except ValueError as exc:
                assert field in str(exc)
            else:
                raise AssertionError(f"{field}=0 must be refused")
        assert KernelState.ACTIVE != KernelState.TERMINATED
        print("ok")
    """,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_0_2_program_runs_unchanged(name: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAMS[name])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.splitlines()[-1] == "ok"
