"""pydotcompute.testing: scripted actors, idleness, drop checks, the recording backend,
tier and loop parametrization, the leak guard and the plugin's fixtures."""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime, message, ring_kernel
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    BufferMismatchError,
    InvalidConfigurationError,
    KernelFailedError,
    QueueFullError,
    QueueTimeoutError,
)
from pydotcompute.ring_kernels import KernelState
from pydotcompute.ring_kernels.registry import unregister_ring_kernel
from pydotcompute.testing import (
    LOOP_KINDS,
    PYTHON_TIERS,
    LeakGuard,
    RecordingBackend,
    ScriptedKernel,
    all_tiers,
    assert_no_drops,
    assert_no_failures,
    collect_replies,
    cuda_unavailable_reason,
    current_loop_kind,
    event_loop_kinds,
    loop_factory,
    metal_unavailable_reason,
    run_actor,
    tier_unavailable_reason,
    wait_until_idle,
)
from pydotcompute.testing.environment import loop_unavailable_reason
from pydotcompute.testing.leaks import take_snapshot


@message
class Add:
    values: list[float]


@message
class Total:
    result: float


async def running_sum(ctx: Any) -> None:
    total = 0.0
    while not ctx.should_terminate:
        msg = await ctx.receive()
        total += sum(msg.values)
        await ctx.send(Total(result=total))


async def silent(ctx: Any) -> None:
    while not ctx.should_terminate:
        await ctx.receive()


async def chatty(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        for v in msg.values:
            await ctx.send(Total(result=v))


async def fails_on_negative(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        if min(msg.values) < 0:
            raise ValueError(f"negative value in {msg.values}")
        await ctx.send(Total(result=sum(msg.values)))


async def sleeper(ctx: Any) -> None:
    while not ctx.should_terminate:
        await asyncio.sleep(0.01)


def running_sum_sync(ctx: Any) -> None:
    """The tier-2/3 twin of ``running_sum`` (blocking receive)."""
    total = 0.0
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.05)
        if msg is None:
            continue
        total += sum(msg.values)
        ctx.send(Total(result=total))


def results(replies: list[Any]) -> list[float]:
    return [r.result for r in replies]


# -- run_actor and ScriptedKernel ------------------------------------------------------------


async def test_run_actor_steps_through_the_script_in_order() -> None:
    replies = await run_actor(
        running_sum,
        [Add(values=[1.0, 2.0]), Add(values=[3.0]), Add(values=[])],
        input_type=Add,
        output_type=Total,
    )
    assert results(replies) == [3.0, 6.0, 6.0]
    assert all(isinstance(r, Total) for r in replies)


async def test_run_actor_reply_is_correlated_with_its_request() -> None:
    req = Add(values=[4.0])
    (reply,) = await run_actor(running_sum, [req])
    assert reply.correlation_id == req.message_id


async def test_run_actor_burst_lets_priority_bands_decide_the_order() -> None:
    script = [Add(values=[1.0], priority=10), Add(values=[100.0], priority=250)]
    stepped = await run_actor(chatty, script)
    burst = await run_actor(chatty, script, burst=True)
    assert results(stepped) == [1.0, 100.0]
    assert results(burst) == [100.0, 1.0]


async def test_run_actor_validates_the_input_type() -> None:
    from pydotcompute.exceptions import TypeValidationError

    with pytest.raises(TypeValidationError, match="expects Add"):
        await run_actor(running_sum, [Total(result=1.0)], input_type=Add)


@pytest.fixture
def registered_summer() -> Iterator[str]:
    ring_kernel(kernel_id="toolkit_summer", input_type=Add, output_type=Total, queue_size=8)(
        running_sum
    )
    try:
        yield "toolkit_summer"
    finally:
        unregister_ring_kernel("toolkit_summer")
        running_sum.__dict__.pop("__ring_kernel_meta__", None)


async def test_run_actor_takes_a_registered_id_and_its_options(registered_summer: str) -> None:
    async with ScriptedKernel(registered_summer) as kernel:
        assert kernel.kernel_id == "toolkit_summer"
        assert kernel.kernel.input_type is Add
        assert kernel.kernel.config.input_queue_size == 8
        assert results(await kernel.step(Add(values=[2.0]))) == [2.0]
    assert results(await run_actor(running_sum, [Add(values=[5.0])])) == [5.0]


async def test_scripted_kernel_ask_feed_and_history() -> None:
    async with ScriptedKernel(running_sum, input_type=Add) as kernel:
        assert kernel.state is KernelState.ACTIVE
        assert (await kernel.ask(Add(values=[5.0]))).result == 5.0
        assert results(await kernel.feed(Add(values=[1.0]), Add(values=[1.0]))) == [6.0, 7.0]
        assert kernel.telemetry.messages_processed == 3
    assert kernel.state is KernelState.TERMINATED
    assert results(kernel.received) == [5.0, 6.0, 7.0]


async def test_ask_fails_readably_without_exactly_one_reply() -> None:
    async with ScriptedKernel(silent) as kernel:
        with pytest.raises(
            AssertionError, match=r"answered Add with 0 replies, expected exactly 1"
        ):
            await kernel.ask(Add(values=[1.0]))
    async with ScriptedKernel(chatty) as kernel:
        with pytest.raises(AssertionError, match="with 2 replies"):
            await kernel.ask(Add(values=[1.0, 2.0]))


async def test_a_failing_actor_raises_from_the_step_that_broke_it() -> None:
    async with ScriptedKernel(fails_on_negative) as kernel:
        assert results(await kernel.step(Add(values=[1.0]))) == [1.0]
        with pytest.raises(KernelFailedError, match=r"ValueError: negative value") as info:
            await kernel.step(Add(values=[-1.0]))
        assert isinstance(info.value.__cause__, ValueError)
        assert kernel.state is KernelState.FAILED
    assert results(kernel.received) == [1.0]


async def test_expect_waits_for_a_number_of_replies_and_says_how_many_came() -> None:
    async with ScriptedKernel(chatty) as kernel:
        await kernel.send(Add(values=[1.0, 2.0, 3.0]))
        assert results(await kernel.expect(3)) == [1.0, 2.0, 3.0]
        await kernel.send(Add(values=[4.0]))
        with pytest.raises(QueueTimeoutError, match=r"sent 1 of 2 expected replies"):
            await kernel.expect(2, timeout=0.2)


async def test_run_actor_with_a_reply_count_checks_the_count() -> None:
    assert results(await run_actor(chatty, [Add(values=[1.0, 2.0])], replies=2)) == [1.0, 2.0]
    with pytest.raises(AssertionError, match="sent 3 replies, expected exactly 2"):
        await run_actor(chatty, [Add(values=[1.0, 2.0]), Add(values=[3.0])], replies=2)


async def test_run_actor_in_a_shared_runtime_frees_the_id(runtime: RingKernelRuntime) -> None:
    assert results(await run_actor(running_sum, [Add(values=[1.0])], runtime=runtime)) == [1.0]
    assert "running_sum" not in runtime
    assert results(await run_actor(running_sum, [Add(values=[2.0])], runtime=runtime)) == [2.0]
    assert runtime.is_active


async def test_the_same_script_on_every_tier(kernel_tier: str) -> None:
    actor = running_sum if kernel_tier == "asyncio" else running_sum_sync
    script = [Add(values=[1.0]), Add(values=[2.0]), Add(values=[3.0])]
    replies = await run_actor(actor, script, tier=kernel_tier, replies=3, timeout=20.0)
    assert results(replies) == [1.0, 3.0, 6.0]


# -- wait_until_idle, collect_replies --------------------------------------------------------


async def test_wait_until_idle_covers_a_whole_pipeline(runtime: RingKernelRuntime) -> None:
    await runtime.launch("first", chatty, input_type=Add)
    await runtime.launch("second", chatty, input_type=Add)
    await runtime.activate("first")
    await runtime.activate("second")

    async def relay(ctx: Any) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await ctx.send_to("second", Add(values=[msg.result * 10]))

    await runtime.launch("relay", relay)
    await runtime.activate("relay")
    runtime.connect("first", "relay")
    for i in range(20):
        await runtime.send("first", Add(values=[float(i)]))
    await wait_until_idle(runtime, timeout=5.0)
    assert all(runtime.get_kernel(k).is_idle for k in runtime.kernel_ids)
    assert sorted(results(collect_replies(runtime, "second"))) == [10.0 * i for i in range(20)]
    assert collect_replies(runtime, "second") == []


async def test_wait_until_idle_names_a_kernel_that_never_parks(
    runtime: RingKernelRuntime,
) -> None:
    await runtime.launch("sleepy", sleeper)
    await runtime.activate("sleepy")
    await runtime.launch("quiet", silent)
    await runtime.activate("quiet")
    with pytest.raises(QueueTimeoutError, match=r"'sleepy': its actor is busy") as info:
        await wait_until_idle(runtime, timeout=0.1)
    assert "'quiet'" not in str(info.value)
    await wait_until_idle(runtime, timeout=1.0, kernel_ids=["quiet"])


async def test_kernels_that_are_not_delivering_count_as_idle(runtime: RingKernelRuntime) -> None:
    await runtime.launch("held", running_sum)
    await runtime.send("held", Add(values=[1.0]))  # LAUNCHED: queued, not delivered
    await wait_until_idle(runtime, timeout=1.0)
    await runtime.activate("held")
    await runtime.deactivate("held")
    await runtime.send("held", Add(values=[2.0]))
    await wait_until_idle(runtime, timeout=1.0)
    await runtime.reactivate("held")
    await wait_until_idle(runtime, timeout=1.0)
    assert results(collect_replies(runtime, "held")) == [1.0, 3.0]


def test_wait_and_collect_reject_what_they_cannot_read() -> None:
    with pytest.raises(TypeError, match="expected a RingKernelRuntime"):
        asyncio.run(wait_until_idle(42))
    with pytest.raises(TypeError, match="kernel_id is required"):
        collect_replies(RingKernelRuntime())


# -- assert_no_drops, assert_no_failures -----------------------------------------------------


async def test_assert_no_drops_reports_backpressure_drops(runtime: RingKernelRuntime) -> None:
    await runtime.launch("lossy", running_sum, queue_size=2, backpressure="drop_oldest")
    assert_no_drops(runtime)
    for i in range(5):
        await runtime.send("lossy", Add(values=[float(i)]))
    with pytest.raises(AssertionError, match=r"'lossy': its inbox dropped 3 .*'drop_oldest'"):
        assert_no_drops(runtime)
    with pytest.raises(AssertionError, match="lossy"):
        assert_no_drops(runtime.get_kernel("lossy"))
    await runtime.activate("lossy")


async def test_run_actor_fails_on_drops_unless_allowed() -> None:
    script = [Add(values=[float(i)]) for i in range(5)]
    kw: dict[str, Any] = {"burst": True, "queue_size": 2, "backpressure": "drop_oldest"}
    with pytest.raises(AssertionError, match="inbox dropped 3"):
        await run_actor(running_sum, script, **kw)
    assert results(await run_actor(running_sum, script, allow_drops=True, **kw)) == [3.0, 7.0]


async def test_assert_no_drops_reports_undelivered_messages(runtime: RingKernelRuntime) -> None:
    await runtime.launch("never_started", running_sum)
    await runtime.send("never_started", Add(values=[1.0]))
    await runtime.terminate("never_started")
    with pytest.raises(AssertionError, match=r"1 undelivered when it stopped: \[Add\("):
        assert_no_drops(runtime, "never_started")


# the message the actor raised on is handed back as undelivered
@pytest.mark.pydotcompute(allow_undelivered=True)
async def test_assert_no_failures_names_the_error(runtime: RingKernelRuntime) -> None:
    await runtime.launch("fragile", fails_on_negative)
    await runtime.activate("fragile")
    assert_no_failures(runtime)
    await runtime.send("fragile", Add(values=[-2.0]))
    await wait_until_idle(runtime)
    with pytest.raises(AssertionError, match=r"'fragile' is FAILED: .*ValueError"):
        assert_no_failures(runtime)


# -- RecordingBackend ------------------------------------------------------------------------


def test_recording_backend_records_every_transfer() -> None:
    backend = RecordingBackend()
    host = np.arange(8, dtype=np.float32)
    dev = backend.copy_to_device(host)
    assert dev is not host
    assert not np.shares_memory(dev, host)
    assert backend.is_device_array(dev)
    assert not backend.is_device_array(host)
    back = backend.copy_to_host(dev)
    backend.synchronize()
    out = backend.allocate((8,), np.float32)
    backend.copy_to_device(host, out=out)
    np.testing.assert_array_equal(out, host)
    np.testing.assert_array_equal(back, host)
    assert [c.op for c in backend.calls] == [
        "copy_to_device",
        "copy_to_host",
        "synchronize",
        "allocate",
        "copy_to_device",
    ]
    assert backend.host_to_device == 2
    assert backend.device_to_host == 1
    assert backend.bytes_to_device == 64
    assert backend.bytes_to_host == 32
    assert backend.calls[0].shape == (8,)
    assert backend.calls[0].dtype == "float32"
    backend.assert_transfers(to_device=2, to_host=1)
    with pytest.raises(AssertionError, match=r"2 host->device \(expected 1\).*recorded: \["):
        backend.assert_transfers(to_device=1)
    backend.reset()
    assert backend.calls == []
    assert backend.transfers == []


def test_recording_backend_checks_copies_like_a_real_backend() -> None:
    backend = RecordingBackend()
    with pytest.raises(BufferMismatchError, match="shapes differ"):
        backend.copy_to_device(np.zeros(3), out=np.zeros(4))
    assert backend.calls == []


def test_recording_backend_can_be_unavailable_or_fail_once() -> None:
    missing = RecordingBackend(available=False, reason="no such device")
    assert not missing.is_available
    assert missing.device_count == 0
    with pytest.raises(BackendNotAvailableError, match="no such device"):
        missing.allocate(4)
    backend = RecordingBackend()
    backend.fail_next("copy_to_host", RuntimeError("injected"))
    dev = backend.copy_to_device(np.ones(2))
    with pytest.raises(RuntimeError, match="injected"):
        backend.copy_to_host(dev)
    np.testing.assert_array_equal(backend.copy_to_host(dev), np.ones(2))


def test_recording_backend_runs_kernels_and_tracks_live_arrays() -> None:
    backend = RecordingBackend()
    a, b = backend.allocate(4), backend.allocate(4)
    out = backend.empty(4)
    backend.fill(a, 1.0)
    backend.fill(b, 2.0)
    result = backend.execute_kernel(backend.get_vector_add_kernel(), 1, 4, a, b, out)
    np.testing.assert_array_equal(out, np.full(4, 3.0, np.float32))
    assert result.kernel_name == "vector_add"
    assert backend.calls_of("execute_kernel")[0].detail == "vector_add"
    assert backend.live_device_arrays == 3
    backend.free(out)
    del out
    assert backend.live_device_arrays == 2


async def test_recording_backend_observes_a_unified_buffer() -> None:
    core = pytest.importorskip("pydotcompute.core")
    backend = RecordingBackend()
    buf = core.UnifiedBuffer((16,), dtype=np.float32, backend=backend).allocate()
    try:
        buf.host[:] = 2.0
        buf.mark_host_dirty()
        await buf.ensure_on_device()
        await buf.ensure_on_device()  # already synchronized: no second copy
        backend.assert_transfers(to_device=1, to_host=0)
        np.testing.assert_array_equal(buf.device, np.full(16, 2.0, np.float32))
    finally:
        buf.free()


# -- tiers, loops and hardware probes --------------------------------------------------------


def test_all_tiers_skips_what_is_missing_with_the_reason() -> None:
    params = {p.id: p for p in all_tiers([*PYTHON_TIERS, "gpu", "nope"])}
    assert list(params) == ["asyncio", "thread", "process", "gpu", "nope"]
    assert params["asyncio"].marks == ()
    (nope,) = params["nope"].marks
    assert nope.name == "skip"
    assert "unknown execution tier 'nope'" in nope.kwargs["reason"]
    gpu_reason = tier_unavailable_reason("gpu")
    if gpu_reason is None:
        assert params["gpu"].marks == ()
    else:
        assert params["gpu"].marks[0].kwargs["reason"] == gpu_reason


def test_kernel_tier_parametrizes_over_python_tiers(
    request: pytest.FixtureRequest, kernel_tier: str
) -> None:
    assert kernel_tier in PYTHON_TIERS
    assert request.node.callspec.id == kernel_tier


@pytest.mark.parametrize("kind", event_loop_kinds())
def test_loop_factory_builds_the_named_loop(kind: str) -> None:
    async def which() -> str:
        return current_loop_kind()

    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        assert runner.run(which()) == kind


def test_loop_kinds_and_unknown_kinds() -> None:
    assert [p.id for p in event_loop_kinds()] == list(LOOP_KINDS)
    assert loop_unavailable_reason("asyncio") is None
    with pytest.raises(InvalidConfigurationError, match="unknown event loop kind 'trio'"):
        loop_factory("trio")
    with pytest.raises(RuntimeError):
        current_loop_kind()


def test_hardware_probes_explain_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert "simulator is enabled" in str(cuda_unavailable_reason())
    if importlib.util.find_spec("numba") is None:  # a light install: the simulator is Numba's
        assert "Numba is not installed" in str(cuda_unavailable_reason(allow_simulator=True))
    else:
        assert cuda_unavailable_reason(allow_simulator=True) is None
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM")
    reason = cuda_unavailable_reason()
    assert reason is None or reason.startswith("needs an NVIDIA GPU: ")
    metal = metal_unavailable_reason()
    if os.uname().sysname != "Darwin":
        assert metal is not None
        assert "macOS" in metal


# -- the leak guard --------------------------------------------------------------------------


def _parked_thread(name: str) -> tuple[threading.Thread, threading.Event]:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(10.0,), name=name, daemon=True)
    thread.start()
    return thread, release


def test_leak_guard_reports_a_pydotcompute_thread_only() -> None:
    guard = LeakGuard(grace=0.05).start()
    ours, release_ours = _parked_thread("pydotcompute-leaky")
    theirs, release_theirs = _parked_thread("someone-elses-pool")
    try:
        with pytest.raises(
            AssertionError, match=r"(?s)1 resource.*thread 'pydotcompute-leaky'"
        ) as info:
            guard.check()
        assert "someone-elses-pool" not in str(info.value)
    finally:
        release_ours.set()
        release_theirs.set()
        ours.join()
        theirs.join()
    guard.check()


def test_leak_guard_gives_a_stopping_thread_its_grace() -> None:
    with LeakGuard(grace=2.0):
        thread, release = _parked_thread("pydotcompute-stopping")
        threading.Timer(0.05, release.set).start()
    assert not thread.is_alive()


def test_leak_guard_waits_for_a_thread_that_left_enumerate_but_is_not_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Python 3.13 drops a finishing thread from threading.enumerate() a moment before
    # is_alive() turns False: the guard must still wait for it to be done
    real = threading.enumerate
    with LeakGuard(grace=2.0):
        thread, release = _parked_thread("pydotcompute-finishing")
        calls = {"n": 0}

        def enumerate_dropping_it_after_one_look() -> list[threading.Thread]:
            calls["n"] += 1
            return [t for t in real() if t is not thread or calls["n"] == 1]

        monkeypatch.setattr(threading, "enumerate", enumerate_dropping_it_after_one_look)
        threading.Timer(0.2, release.set).start()
    monkeypatch.undo()
    assert calls["n"] >= 2
    assert not thread.is_alive()


def test_leak_guard_ignores_what_existed_before_or_was_excused() -> None:
    early, release_early = _parked_thread("pydotcompute-early")
    try:
        guard = LeakGuard(grace=0.05).start()
        before = take_snapshot()
        fixture_thread, release_fixture = _parked_thread("pydotcompute-session-fixture")
        guard.excuse(before, take_snapshot())
        try:
            guard.check()
        finally:
            release_fixture.set()
            fixture_thread.join()
    finally:
        release_early.set()
        early.join()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm to list here")
def test_leak_guard_reports_and_unlinks_a_shared_memory_segment() -> None:
    name = f"pdc_{os.getpid()}_leaktest"
    path = Path("/dev/shm") / name
    guard = LeakGuard(grace=0.05).start()
    path.write_bytes(b"\0" * 64)
    with pytest.raises(AssertionError, match=rf"/dev/shm/{name} was not unlinked \(unlinked by"):
        guard.check()
    assert not path.exists()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm to list here")
def test_leak_guard_leaves_other_processes_segments_alone() -> None:
    path = Path("/dev/shm") / f"pdc_1_{os.getpid()}_not_ours"  # "created" by pid 1
    guard = LeakGuard(grace=0.05).start()
    path.write_bytes(b"\0" * 64)
    try:
        guard.check()
        assert path.exists()
    finally:
        path.unlink()


def test_leak_guard_reports_and_terminates_a_child_process() -> None:
    ctx = multiprocessing.get_context("spawn")
    guard = LeakGuard(grace=0.05).start()
    child = ctx.Process(target=time.sleep, args=(30,), name="pydotcompute-orphan", daemon=True)
    child.start()
    try:
        with pytest.raises(
            AssertionError, match=r"'pydotcompute-orphan' is still running \(terminated by"
        ):
            guard.check()
        assert not child.is_alive()
    finally:
        if child.is_alive():
            child.kill()
        child.join()


def test_leak_guard_reports_a_kernel_task_left_on_its_loop() -> None:
    guard = LeakGuard(grace=0.05).start()

    async def start() -> RingKernelRuntime:
        rt = RingKernelRuntime()
        await rt.launch("forgotten", silent)
        await rt.activate("forgotten")
        await asyncio.sleep(0)
        return rt

    with asyncio.Runner() as runner:
        rt = runner.run(start())
        guard.check_loop(runner.get_loop())
        runner.run(rt.shutdown())
        guard.check_loop(runner.get_loop())  # nothing pending any more
    with pytest.raises(AssertionError, match=r"kernel task 'pydotcompute:forgotten' is still"):
        guard.check()
    guard.check()


async def test_leak_guard_context_checks_the_running_loop() -> None:
    rt = RingKernelRuntime()
    guard = LeakGuard(grace=0.05)
    try:
        guard.__enter__()
        await rt.launch("inner", silent)
        await rt.activate("inner")
        await asyncio.sleep(0)
        with pytest.raises(AssertionError, match="'pydotcompute:inner'"):
            guard.__exit__(None, None, None)
    finally:
        await rt.shutdown()


# -- the plugin's fixtures and markers -------------------------------------------------------


async def test_runtime_fixture_is_started(runtime: RingKernelRuntime) -> None:
    assert runtime.is_active
    assert runtime.kernel_ids == []


def test_plugin_registers_its_markers(pytestconfig: pytest.Config) -> None:
    names = {line.split(":")[0].split("(")[0] for line in pytestconfig.getini("markers")}
    assert {"cuda", "metal", "gpu", "slow", "ray", "cudasim", "pydotcompute"} <= names


def test_leak_guard_fixture_is_on_for_the_suite(
    pydotcompute_leak_guard: LeakGuard | None,
) -> None:
    assert isinstance(pydotcompute_leak_guard, LeakGuard)


@pytest.mark.pydotcompute(leak_guard=False)
def test_leak_guard_can_be_switched_off(pydotcompute_leak_guard: LeakGuard | None) -> None:
    assert pydotcompute_leak_guard is None


async def test_message_queue_fixture(message_queue: Any) -> None:
    assert message_queue.maxsize == 128
    await message_queue.put(Add(values=[1.0], priority=5))
    await message_queue.put(Add(values=[2.0], priority=200))
    assert (await message_queue.get()).values == [2.0]


@pytest.mark.parametrize("message_queue", [{"maxsize": 1, "backpressure": "reject"}], indirect=True)
def test_message_queue_fixture_takes_options(message_queue: Any) -> None:
    message_queue.put_nowait(Add(values=[1.0]))
    with pytest.raises(QueueFullError, match="full"):
        message_queue.put_nowait(Add(values=[2.0]))


def test_recording_backend_fixture(recording_backend: RecordingBackend) -> None:
    recording_backend.copy_to_device(np.zeros(2))
    assert recording_backend.host_to_device == 1


def test_core_fixtures(accelerator: Any, memory_pool: Any) -> None:
    assert accelerator.device_count >= 1
    block = memory_pool.acquire((32,), np.float32)
    memory_pool.release(block)
    assert memory_pool.get_stats().total_bytes >= 128


@pytest.mark.parametrize("unified_buffer", [((4, 4), "int32")], indirect=True)
def test_unified_buffer_fixture(unified_buffer: Any) -> None:
    assert unified_buffer.shape == (4, 4)
    assert unified_buffer.dtype == np.int32
    assert unified_buffer.is_allocated


def test_importing_the_toolkit_loads_no_test_runner_or_gpu_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pydotcompute.testing as t; t.LeakGuard; "
        "print(sorted(m for m in ('pytest', 'cupy', 'numba', 'mlx', 'ray', 'pynvml') "
        "if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[]"


def test_gpu_reason_combines_both_backends() -> None:
    from pydotcompute.testing import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if cuda_unavailable_reason() is None or metal_unavailable_reason() is None:
        assert reason is None
    else:
        assert reason is not None
        assert reason.startswith("needs a GPU: no CUDA (")
        assert "and no Metal (" in reason


# -- the runtime fixture's teardown honours each kernel's drain_timeout -----------------------


async def slow_sum(ctx: Any) -> None:
    """``running_sum`` at one second a message."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await asyncio.sleep(1.0)
        await ctx.send(Total(result=sum(msg.values)))


@pytest.fixture
def teardown_clock() -> Iterator[dict[str, float]]:
    """Set up before ``runtime`` (so torn down after it): checks how long the runtime's
    teardown took after the test body marked its end."""
    marks: dict[str, float] = {}
    yield marks
    took = time.monotonic() - marks["body_done"]
    # 10 s of queued work, shutdown_timeout=30, drain_timeout=0.2: a hang bound, not a speed
    assert took < 5.0, f"the fixture's shutdown took {took:.1f}s: it ignored drain_timeout"


@pytest.mark.pydotcompute(allow_undelivered=True, shutdown_timeout=30.0)
async def test_runtime_fixture_teardown_honours_drain_timeout(
    teardown_clock: dict[str, float], runtime: RingKernelRuntime
) -> None:
    await runtime.launch("slow", slow_sum, drain_timeout=0.2)
    await runtime.activate("slow")
    for i in range(10):
        await runtime.send("slow", Add(values=[float(i)]))
    teardown_clock["body_done"] = time.monotonic()


async def forward_or_count(ctx: Any) -> None:
    """Forwards what it receives; a full reject-policy kernel downstream drops it."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        try:
            await ctx.send(msg)
        except QueueFullError:
            pass  # counted as dropped (reply_lost) by the runtime


async def test_runtime_fixture_failure_names_what_the_shutdown_dropped() -> None:
    """Replies dropped while the shutdown drains (a full reject-policy kernel downstream)
    are lost messages too: counted in the report, and named in the fixture's failure."""
    from pydotcompute.testing.plugin import _undelivered_text

    rt = RingKernelRuntime()
    await rt.start()
    await rt.launch("tail", silent, input_type=Add, queue_size=1, backpressure="reject")
    await rt.launch("head", forward_or_count, input_type=Add, output_type=Add)
    rt.connect("head", "tail")
    await rt.activate("head")
    await rt.deactivate("head")  # queued until the shutdown opens the gate to drain
    for i in range(3):
        await rt.send("head", Add(values=[float(i)]))
    report = await rt.shutdown(timeout=5.0)
    # head drained 3 into tail (never activated, room for 1): 2 refused, 1 handed back
    assert report == {"head": 2, "tail": 1}
    assert (report.dropped, report.undelivered) == ({"head": 2}, {"tail": 1})
    assert rt.get_telemetry("head").drop_reasons() == {"reply_lost": 2}
    text = _undelivered_text(rt, report, 5.0)
    assert "kernel 'head': 2 message(s) dropped while shutting down" in text
    assert "kernel 'tail': 1 message(s) never handled: [Add(" in text


def test_pydotcompute_test_loops_narrows_all_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PYDOTCOMPUTE_TEST_LOOPS`` names the kinds `all_loops` runs on (one CI job on another
    Python runs one loop); unset, every kind; a kind it does not know is refused by name."""
    from pydotcompute.testing import LOOP_KINDS, selected_loop_kinds

    monkeypatch.delenv("PYDOTCOMPUTE_TEST_LOOPS", raising=False)
    assert selected_loop_kinds() == list(LOOP_KINDS)
    monkeypatch.setenv("PYDOTCOMPUTE_TEST_LOOPS", " asyncio ")
    assert selected_loop_kinds() == ["asyncio"]
    monkeypatch.setenv("PYDOTCOMPUTE_TEST_LOOPS", "uvloop,asyncio")
    assert selected_loop_kinds() == ["uvloop", "asyncio"]
    monkeypatch.setenv("PYDOTCOMPUTE_TEST_LOOPS", "trio")
    with pytest.raises(ValueError, match="PYDOTCOMPUTE_TEST_LOOPS names \\['trio'\\]"):
        selected_loop_kinds()
