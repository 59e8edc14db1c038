"""ComputeOrchestrator: registration, launches off the event loop, history, streams, errors."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from pydotcompute.backends import CPUBackend, MetalBackend
from pydotcompute.core import ComputeOrchestrator, KernelExecution, KernelLaunchConfig
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    InvalidConfigurationError,
    KernelAlreadyExistsError,
    KernelNotFoundError,
    KernelStateError,
)


def vector_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out=out)


def failing(x: Any) -> None:
    raise ArithmeticError("bad math")


def test_launch_config_validation() -> None:
    cfg = KernelLaunchConfig(grid_size=(2, 3), block_size=128)
    assert cfg.total_threads == 768
    with pytest.raises(InvalidConfigurationError, match="grid_size must be a positive int"):
        KernelLaunchConfig(grid_size=0)
    with pytest.raises(InvalidConfigurationError, match="shared_memory_bytes must be an int >= 0"):
        KernelLaunchConfig(shared_memory_bytes=-1)


async def test_register_launch_and_history() -> None:
    async with ComputeOrchestrator("cpu") as orch:
        assert orch.is_initialized
        orch.register_kernel("vector_add", vector_add)
        assert orch.get_kernel("vector_add") is vector_add
        assert orch.kernel_names == ["vector_add"]
        a = np.arange(5.0)
        out = np.empty(5)
        execution = await orch.launch_kernel("vector_add", KernelLaunchConfig(1, 5), a, a, out)
        np.testing.assert_array_equal(out, 2 * a)
        assert isinstance(execution, KernelExecution)
        assert execution.success
        assert execution.kernel_name == "vector_add"
        assert execution.backend == "cpu:0"
        assert execution.duration_ms >= 0
        assert execution.device_time_ms is not None
        assert execution.end_time >= execution.start_time
        direct = await orch.launch_kernel(vector_add, (1, 5), a, a, out)
        assert direct.kernel_name == "vector_add"
        assert [e.execution_id for e in orch.get_execution_history()] == [1, 2]
    assert not orch.is_initialized


async def test_failures_are_raised_and_recorded() -> None:
    async with ComputeOrchestrator("cpu") as orch:
        orch.register_kernel("failing", failing)
        with pytest.raises(ArithmeticError, match="bad math"):
            await orch.launch_kernel("failing", None, 1)
        [record] = orch.get_execution_history()
        assert not record.success
        assert record.error_message == "ArithmeticError: bad math"
        assert isinstance(record.error, ArithmeticError)
        assert record.result is None
        assert orch.statistics()["failures"] == 1


async def test_registry_errors() -> None:
    orch = ComputeOrchestrator("cpu")
    orch.register_kernel("a", vector_add)
    with pytest.raises(KernelAlreadyExistsError, match="'a' is already registered"):
        orch.register_kernel("a", vector_add)
    with pytest.raises(
        KernelNotFoundError,
        match=r"Kernel 'b' not registered with the orchestrator; known ids: 'a'",
    ):
        orch.require_kernel("b")
    assert orch.get_kernel("b") is None
    with pytest.raises(KeyError):
        await orch.launch_kernel("b")
    with pytest.raises(InvalidConfigurationError, match="must be callable, got int"):
        orch.register_kernel("c", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigurationError, match="non-empty str"):
        orch.register_kernel("", vector_add)
    orch.unregister_kernel("a")
    with pytest.raises(KernelNotFoundError):
        orch.unregister_kernel("a")
    with pytest.raises(InvalidConfigurationError, match="max_history must be an int >= 1"):
        ComputeOrchestrator(max_history=0)


async def test_bad_config_argument() -> None:
    async with ComputeOrchestrator("cpu") as orch:
        with pytest.raises(InvalidConfigurationError, match="config must be a KernelLaunchConfig"):
            await orch.launch_kernel(vector_add, "big")  # type: ignore[arg-type]


async def test_history_filters_limits_and_bounds() -> None:
    async with ComputeOrchestrator("cpu", max_history=3, run_in_thread=False) as orch:
        orch.register_kernel("f", lambda: None)
        orch.register_kernel("g", lambda: None)
        for name in ("f", "g", "f", "g"):
            await orch.launch_kernel(name)
        history = orch.get_execution_history()
        assert [e.execution_id for e in history] == [2, 3, 4]  # bounded: the oldest dropped
        assert [e.kernel_name for e in orch.get_execution_history(kernel_name="g")] == ["g", "g"]
        assert [e.execution_id for e in orch.get_execution_history(limit=1)] == [4]
        assert len(orch.get_execution_history(limit=0)) == 3  # 0: all of it
        with pytest.raises(InvalidConfigurationError, match="limit must be >= 0"):
            orch.get_execution_history(limit=-1)
        stats = orch.statistics()
        assert stats["kernels"]["g"]["launches"] == 2
        orch.clear_execution_history()
        assert orch.get_execution_history() == []


async def test_launches_do_not_block_the_event_loop() -> None:
    release = threading.Event()

    def waits_for_the_loop() -> bool:
        # only the event loop can set the event: if the launch blocked the loop, this waits
        # out its timeout and returns False
        return release.wait(timeout=10)

    async with ComputeOrchestrator("cpu") as orch:
        launch = asyncio.create_task(orch.launch_kernel(waits_for_the_loop))
        await asyncio.sleep(0)
        release.set()
        execution = await launch
        assert execution.result is not None
        assert execution.result.output is True


async def test_launch_after_shutdown() -> None:
    orch = ComputeOrchestrator("cpu")
    orch.initialize()  # works without await too
    await orch.shutdown()
    with pytest.raises(KernelStateError, match="cannot launch kernel 'x': it is SHUT_DOWN"):
        await orch.launch_kernel("x")


async def test_streams_on_cpu_and_sync_context() -> None:
    with ComputeOrchestrator(CPUBackend()) as orch:
        assert orch.create_stream() is None
        with orch.stream_context() as stream:
            assert stream is None
            await orch.launch_kernel(lambda: None)
        orch.synchronize()


async def test_unavailable_backend_is_reported_on_initialize() -> None:
    orch = ComputeOrchestrator(CPUBackend(device_id=3))
    with pytest.raises(BackendNotAvailableError, match="the cpu backend is not available"):
        await orch.initialize()
    assert "new" in repr(orch)


@pytest.mark.skipif(not MetalBackend().is_available, reason="MLX is not installed")
async def test_metal_stream_context_launches_in_a_worker_thread() -> None:
    import mlx.core as mx

    async with ComputeOrchestrator("metal") as orch:  # launches run in a worker thread
        with orch.stream_context() as stream:
            assert stream is not None
            execution = await orch.launch_kernel(lambda a: a * 2, (1, 3), mx.arange(3))
            assert execution.success
            assert execution.result is not None
            assert execution.result.output.tolist() == [0, 2, 4]
        other = orch.create_stream()
        config = KernelLaunchConfig(grid_size=1, block_size=3, stream=other)
        execution = await orch.launch_kernel(lambda a: a + 1, config, mx.arange(3))
        assert execution.result is not None
        assert execution.result.output.tolist() == [1, 2, 3]
        lazy = [mx.arange(3) + 10]  # built on the loop, inside a container
        execution = await orch.launch_kernel(lambda xs: xs[0] * 3, None, lazy)
        assert execution.result is not None
        assert execution.result.output.tolist() == [30, 33, 36]
        orch.synchronize()


# --- the shapes code written for 0.2 calls ---------------------------------------------


def test_launch_config_promotes_ints_to_tuples() -> None:
    cfg = KernelLaunchConfig(4, 8)
    assert (cfg.grid_size, cfg.block_size) == ((4,), (8,))
    assert KernelLaunchConfig(grid_size=(2, 3), block_size=(4, 4)).grid_size == (2, 3)
    assert cfg.total_threads == 32


async def test_orchestrator_0_2_properties() -> None:
    from pydotcompute.core import get_accelerator, get_memory_pool

    orch = ComputeOrchestrator(CPUBackend())
    assert orch.is_active is False
    assert orch.accelerator is get_accelerator()
    assert orch.memory_pool is get_memory_pool()
    async with orch:
        assert orch.is_active is True
    assert orch.is_active is False


async def test_launching_an_unknown_name_raises_a_value_error() -> None:
    from pydotcompute.core.orchestrator import KernelNotRegisteredError

    async with ComputeOrchestrator(CPUBackend()) as orch:
        orch.register_kernel("known", vector_add)
        with pytest.raises(ValueError, match=r"'nope'.*known") as info:
            await orch.launch_kernel("nope", KernelLaunchConfig(1, 1))
        assert isinstance(info.value, KernelNotRegisteredError)
        assert isinstance(info.value, KernelNotFoundError)  # and still a KeyError
        with pytest.raises(KeyError):
            orch.require_kernel("nope")


# --- async def kernels ------------------------------------------------------------------------


async def scale_async(x: np.ndarray, out: np.ndarray, factor: float) -> str:
    await asyncio.sleep(0.01)
    np.multiply(x, factor, out=out)
    return "scaled"


async def failing_async(x: Any) -> None:
    await asyncio.sleep(0)
    raise ArithmeticError("bad async math")


@pytest.mark.parametrize("run_in_thread", [True, False], ids=["thread", "inline"])
async def test_an_async_kernel_is_run_to_completion(run_in_thread: bool) -> None:
    async with ComputeOrchestrator("cpu", run_in_thread=run_in_thread) as orch:
        orch.register_kernel("scale", scale_async)
        x = np.arange(4.0)
        out = np.zeros(4)
        execution = await orch.launch_kernel("scale", None, x, out, 3.0)
        np.testing.assert_array_equal(out, 3 * x)  # its body ran, not just its creation
        assert execution.success
        assert execution.result is not None
        assert execution.result.output == "scaled"
        assert execution.device_time_ms is not None
        assert execution.device_time_ms >= 10 * 0.5  # the await is part of the kernel's time
        assert execution.duration_ms >= execution.device_time_ms * 0.5


@pytest.mark.parametrize("run_in_thread", [True, False], ids=["thread", "inline"])
async def test_an_async_kernel_that_raises_is_recorded_as_failed(run_in_thread: bool) -> None:
    async with ComputeOrchestrator("cpu", run_in_thread=run_in_thread) as orch:
        with pytest.raises(ArithmeticError, match="bad async math"):
            await orch.launch_kernel(failing_async, None, 1)
        [record] = orch.get_execution_history()
        assert not record.success
        assert isinstance(record.error, ArithmeticError)
        assert record.error_message == "ArithmeticError: bad async math"
