"""GPU ring kernels on the Numba CUDA simulator: the shared behavioural suite plus faults.

Run alone (the simulator must be on before Numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cudasim -p no:cacheprovider

The persistent kernel runs in simulated device threads (``pydotcompute-gpu:<id>:<tid>``)
while the test's event loop feeds and drains its rings, exactly as on a GPU.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.decorators.ring_kernel import ring_kernel
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    CUDAError,
    KernelFailedError,
    KernelStateError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import KernelState
from pydotcompute.ring_kernels.registry import unregister_ring_kernel
from pydotcompute.ring_kernels.tiers.gpu import GPURingKernel, layout
from tests import gpu_ring_kernel_suite as suite
from tests.gpu_ring_kernel_suite import SIM, Add, Seq, SeqOut, Sum, launch_gpu, poke_state

cuda = pytest.importorskip("numba.cuda")


def _device_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pydotcompute-gpu")]


@pytest.fixture
async def rt() -> AsyncIterator[RingKernelRuntime]:
    """A runtime shut down after the test; no simulated device thread may outlive it."""
    before = set(_device_threads())
    runtime = RingKernelRuntime()
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.shutdown(timeout=10.0)
        deadline = time.monotonic() + 5.0
        while set(_device_threads()) - before and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        leaked = set(_device_threads()) - before
        assert not leaked, f"simulated device threads outlived the test: {leaked}"
        pending = [
            t
            for t in asyncio.all_tasks()
            if t.get_name().startswith("pydotcompute:") and not t.done()
        ]
        assert not pending, f"pump tasks outlived the test: {pending}"


# --- the shared suite ----------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(suite.SCENARIOS))
async def test_behaviour(rt: RingKernelRuntime, scenario: str) -> None:
    await suite.SCENARIOS[scenario](rt, SIM)


# --- simulator specifics ---------------------------------------------------------------------


async def test_kernel_runs_in_named_device_threads(rt: RingKernelRuntime) -> None:
    k = await launch_gpu(rt, "add", suite.add_handler, Add, Sum)
    assert k.flavour == "simulator"
    assert [t.name for t in _device_threads()] == ["pydotcompute-gpu:add:0"]
    await rt.terminate("add")
    assert _device_threads() == []


async def test_cooperative_block_has_one_thread_per_lane(rt: RingKernelRuntime) -> None:
    await launch_gpu(
        rt, "vec", suite.vec_handler, suite.Vec, suite.VecOut, cooperative=True, block_size=3
    )
    assert sorted(t.name for t in _device_threads()) == [
        f"pydotcompute-gpu:vec:{i}" for i in range(3)
    ]


async def test_decorated_kernel_launches_from_the_registry(rt: RingKernelRuntime) -> None:
    @ring_kernel(
        kernel_id="gpu_registered_adder",
        input_type=Add,
        output_type=Sum,
        backend="cuda",
        queue_size=64,
        state=np.array([41], np.int64),
    )
    def adder(inp: Any, out: Any, state: Any) -> int:
        state[0] += 1
        out.total = inp.a + inp.b
        out.count = state[0]
        return 0

    try:
        k = await rt.launch("gpu_registered_adder")
        assert isinstance(k, GPURingKernel)
        assert k.config.tier == "gpu"
        assert k.ring_size == 64
        await rt.activate("gpu_registered_adder")
        reply = await rt.send_and_receive("gpu_registered_adder", Add(a=2.0, b=3.0), timeout=20)
        assert (reply.total, reply.count) == (5.0, 42)
    finally:
        unregister_ring_kernel("gpu_registered_adder")


async def test_cuda_c_handler_needs_a_real_gpu(rt: RingKernelRuntime) -> None:
    src = "__device__ int handle(const Add* in, Sum* out, pdc_state_t* s) { return 0; }"
    with pytest.raises(BackendNotAvailableError, match="CUDA C handler needs a real GPU"):
        await rt.launch(
            "c", lambda *a: 0, input_type=Add, output_type=Sum, tier="gpu", cuda_source=src
        )
    assert "c" not in rt


# --- faults ------------------------------------------------------------------------------------


def _crashing_handler(inp: Any, out: Any, state: Any) -> int:
    if inp.seq == 3:
        return int(state[100])  # out of bounds: the simulator raises IndexError
    out.seq = inp.seq
    return 0


async def test_a_handler_fault_fails_the_kernel(rt: RingKernelRuntime) -> None:
    k = await launch_gpu(rt, "crash", _crashing_handler, Seq, SeqOut)
    for i in range(3):
        assert (await rt.send_and_receive("crash", Seq(seq=i), timeout=20)).seq == i
    pending = asyncio.ensure_future(rt.send_and_receive("crash", Seq(seq=3)))
    with pytest.raises(KernelFailedError, match="IndexError") as info:
        await asyncio.wait_for(pending, 20)
    assert isinstance(info.value.__cause__, IndexError)
    assert k.state is KernelState.FAILED
    assert isinstance(k.error, IndexError)
    with pytest.raises(KernelFailedError):
        await rt.send("crash", Seq(seq=4))
    with pytest.raises(KernelFailedError):
        await rt.receive("crash", timeout=1)
    assert rt.get_summary()["failures"][0][0] == "crash"
    assert rt.get_telemetry("crash").error_count >= 1
    await rt.terminate("crash")
    assert k.state is KernelState.TERMINATED


async def test_watchdog_reports_a_hung_kernel_as_failed(rt: RingKernelRuntime) -> None:
    k = await launch_gpu(
        rt,
        "stuck",
        suite.stuck_handler,
        Add,
        Sum,
        state=np.array([0, 1], np.int64),
        watchdog_timeout=0.3,
    )
    pending = asyncio.ensure_future(rt.send_and_receive("stuck", Add(a=1.0, b=0.0)))
    with pytest.raises(KernelFailedError, match=r"made no progress for 0\.3s with 1 message"):
        await asyncio.wait_for(pending, 20)
    assert k.state is KernelState.FAILED
    assert isinstance(k.error, TimeoutError)
    poke_state(k, 1, 0)  # let the handler return so the device thread can end
    await rt.terminate("stuck")
    assert k.state is KernelState.TERMINATED


async def test_watchdog_flags_a_live_kernel_that_never_sees_the_doorbell(
    rt: RingKernelRuntime,
) -> None:
    k = await launch_gpu(rt, "deaf", suite.add_handler, Add, Sum, watchdog_timeout=0.5)
    r = k.rings
    assert r is not None
    beat = r.word(layout.HEARTBEAT)
    # a message published with its tail, but the doorbell word (what the kernel polls) left
    # alone, as if that store never reached the device: the kernel idles on, alive
    r.inbox[r.in_tail % r.capacity_in] = Add.to_records([Add(a=1.0, b=2.0)])[0]
    r.in_tail += 1
    r.ctl[layout.IN_TAIL] = r.in_tail
    await suite.wait_for(lambda: k.state is KernelState.FAILED)
    assert isinstance(k.error, TimeoutError)
    assert "is alive" in str(k.error)
    assert "the host published 1" in str(k.error)
    # alive all along: a heartbeat alone is no progress (read as the kernel stopped: its
    # memory went back to the slab)
    assert k.control_word(layout.HEARTBEAT) > beat
    assert k.control_word(layout.TAIL_SEEN) == 0
    await rt.terminate("deaf")
    assert k.state is KernelState.TERMINATED


async def test_terminate_times_out_on_a_kernel_that_does_not_acknowledge(
    rt: RingKernelRuntime,
) -> None:
    k = await launch_gpu(
        rt,
        "stuck",
        suite.stuck_handler,
        Add,
        Sum,
        state=np.array([0, 1], np.int64),
        watchdog_timeout=None,
        terminate_timeout=0.3,
    )
    await rt.send("stuck", Add(a=1.0, b=0.0))
    await asyncio.sleep(0.3)  # the kernel took it and spins in the handler
    assert k.statistics().processed == 0
    with pytest.raises(KernelStateError, match=r"did not acknowledge termination within 0\.3s"):
        await rt.terminate("stuck", timeout=0.2)
    assert k.state is KernelState.FAILED
    assert _device_threads()  # still spinning in the handler
    poke_state(k, 1, 0)
    await suite.wait_for(lambda: not _device_threads())
    await rt.terminate("stuck")
    assert k.state is KernelState.TERMINATED


async def test_a_kernel_that_exits_on_its_own_is_reported_failed(rt: RingKernelRuntime) -> None:
    k = await launch_gpu(rt, "quit", suite.add_handler, Add, Sum, activate=False)
    assert k.state is KernelState.LAUNCHED
    k.rings.set_word(layout.TERMINATE, 1)  # type: ignore[union-attr]  # as if it crashed
    await suite.wait_for(lambda: k.state is KernelState.FAILED)  # the pump's watchdog
    assert isinstance(k.error, RuntimeError)
    assert "exited on its own" in str(k.error)
    with pytest.raises(KernelStateError, match="cannot activate kernel 'quit': it is FAILED"):
        await rt.activate("quit")
    with pytest.raises(KernelFailedError, match="exited on its own"):
        await rt.send("quit", Add(a=1.0, b=2.0))
    await rt.terminate("quit")
    assert k.state is KernelState.TERMINATED


async def test_requests_left_in_the_ring_of_a_failed_kernel_are_counted_once(
    rt: RingKernelRuntime,
) -> None:
    """A kernel that exits with requests in its ring hands them back first, and they are
    counted as dropped once, alike in telemetry and on the inbox's statistics."""
    k = await launch_gpu(rt, "quit", suite.add_handler, Add, Sum)
    rings = k.rings
    assert rings is not None
    rings.set_word(layout.ACTIVE, 0)  # the device stops taking messages; the host still sends
    await suite.wait_for(lambda: rings.word(layout.ACTIVE_ACK) == 0)
    for i in range(3):
        await rt.send("quit", Add(a=float(i), b=0.0))
    assert rings.in_flight() == 3  # published straight into the ring, never taken
    rings.set_word(layout.TERMINATE, 1)  # as if it crashed
    await suite.wait_for(lambda: k.state is KernelState.FAILED)
    assert [m.a for m in k.undelivered] == [0.0, 1.0, 2.0]
    assert rt.get_telemetry("quit").messages_dropped == 3
    assert k.inbox is not None
    assert k.inbox.statistics().total_dropped == 3
    assert await rt.terminate("quit") == []  # handed back once, at the failure
    assert rt.get_telemetry("quit").messages_dropped == 3
    assert k.inbox.statistics().total_dropped == 3


# --- capacity ----------------------------------------------------------------------------------

#: Rings far smaller than the message count: a scenario that sends everything before it reads
#: anything deadlocks here by construction (staging + inbox + outbox + reply buffer is full).
TIGHT = suite.Env("simulator, small rings", many=300, coop_block=4, settle=0.2, queue_size=16)


@pytest.mark.parametrize("scenario", ["batches_of_objects_and_records", "ordering_is_kept"])
async def test_bulk_scenarios_do_not_assume_ring_capacity(
    rt: RingKernelRuntime, scenario: str
) -> None:
    assert suite.capacity(TIGHT) < TIGHT.many * 3
    await asyncio.wait_for(suite.SCENARIOS[scenario](rt, TIGHT), 30)


# --- no device-wide synchronization while GPU actors run ---------------------------------------


async def test_device_wide_sync_is_refused_while_an_actor_runs(rt: RingKernelRuntime) -> None:
    from pydotcompute.backends import CUDABackend, device_sync

    backend = CUDABackend()
    backend.synchronize()  # nothing runs yet
    await launch_gpu(rt, "add", suite.add_handler, Add, Sum)
    assert device_sync.running_ring_kernels() == ["pydotcompute-gpu:add"]
    with pytest.raises(CUDAError, match=r"CUDABackend\.synchronize\(\) refused.*gpu:add"):
        backend.synchronize()
    backend.synchronize_stream()  # a stream-scoped wait is fine
    await rt.terminate("add")
    assert not device_sync.ring_kernels_running()
    backend.synchronize()


async def test_buffer_synchronize_waits_on_a_stream_while_an_actor_runs(
    rt: RingKernelRuntime,
) -> None:
    core = pytest.importorskip("pydotcompute.core")
    await launch_gpu(rt, "add", suite.add_handler, Add, Sum)
    buf = core.UnifiedBuffer((4,), np.float32, backend="cuda").allocate()
    buf.host[:] = 3.0
    buf.mark_host_dirty()
    buf.synchronize()  # copies, then waits for the current stream only
    assert buf.state.value == "synchronized"


async def test_exit_hook_terminates_running_kernels(rt: RingKernelRuntime) -> None:
    from pydotcompute.ring_kernels.tiers.gpu import resources

    k = await launch_gpu(rt, "add", suite.add_handler, Add, Sum)
    assert _device_threads()
    assert resources.terminate_running_kernels(timeout=10) == []
    assert not _device_threads()  # the kernel left its loop
    assert k.control_word(layout.TERMINATED) == 1


# --- memory comes from slabs made before the kernels run ----------------------------------------


async def test_an_actor_started_beside_a_running_one_allocates_nothing(
    rt: RingKernelRuntime,
) -> None:
    from pydotcompute.ring_kernels.tiers.gpu import resources

    slabs = resources.memory_slabs()
    await launch_gpu(rt, "a", suite.add_handler, Add, Sum)
    chunks = slabs.stats()["mapped"]["chunks"]
    free = slabs.stats()["mapped"]["bytes_free"]
    assert chunks >= 1
    await launch_gpu(rt, "b", suite.seq_handler, Seq, SeqOut)
    assert slabs.stats()["mapped"]["chunks"] == chunks  # carved from what was there
    assert slabs.stats()["mapped"]["bytes_free"] < free
    await rt.terminate("b")
    assert slabs.stats()["mapped"]["bytes_free"] == free  # given back to the slab
    assert (await rt.send_and_receive("a", Add(a=1.0, b=2.0), timeout=20)).total == 3.0


async def test_a_full_slab_refuses_a_start_beside_running_actors(
    rt: RingKernelRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydotcompute.ring_kernels.tiers.gpu import resources

    slabs = resources.memory_slabs()
    await launch_gpu(rt, "a", suite.add_handler, Add, Sum, ring_size=8)
    free = slabs.stats()["mapped"]["bytes_free"]
    big = free // Seq.dtype.itemsize + 1  # more slots than the slab has bytes for
    with pytest.raises(CUDAError, match="cannot grow while GPU actors run"):
        await launch_gpu(rt, "b", suite.seq_handler, Seq, SeqOut, ring_size=big)
    assert "b" not in rt
    assert slabs.stats()["mapped"]["bytes_free"] == free  # the partial carve was given back
    assert (await rt.send_and_receive("a", Add(a=1.0, b=2.0), timeout=20)).total == 3.0


async def test_memory_is_reserved_up_front_only(rt: RingKernelRuntime) -> None:
    from pydotcompute.ring_kernels.tiers.gpu import reserve_gpu_memory, resources

    slabs = resources.memory_slabs()
    reserve_gpu_memory(mapped_mb=100)
    assert slabs.stats()["mapped"]["bytes_free"] >= 100 << 20
    await launch_gpu(rt, "a", suite.add_handler, Add, Sum)
    with pytest.raises(CUDAError, match="cannot reserve GPU actor memory while 1 GPU actor"):
        reserve_gpu_memory(mapped_mb=200)


async def test_a_handler_is_prepared_before_actors_run(rt: RingKernelRuntime) -> None:
    from pydotcompute.ring_kernels.tiers.gpu import prepare_gpu_kernel, resources

    slabs = resources.memory_slabs()
    free = slabs.stats()["mapped"]["bytes_free"]
    state = np.zeros(1, np.int64)
    assert prepare_gpu_kernel(suite.seq_handler, Seq, SeqOut, state=state) == "simulator"
    assert resources.live_actor_count() == 0  # nothing was launched
    assert slabs.stats()["mapped"]["bytes_free"] in (free, slabs.stats()["mapped"]["bytes"])
    k = await launch_gpu(rt, "seq", suite.seq_handler, Seq, SeqOut, state=state)
    assert (await rt.send_and_receive("seq", Seq(seq=5), timeout=20)).running == 5
    assert k.flavour == "simulator"
    with pytest.raises(TypeValidationError, match="output_type int is not a fixed-layout"):
        prepare_gpu_kernel(suite.seq_handler, Seq, int, state=state)


async def test_a_cooperative_block_stages_the_batch_before_handling_it(
    rt: RingKernelRuntime,
) -> None:
    k = await launch_gpu(
        rt, "vec", suite.vec_handler, suite.Vec, suite.VecOut, cooperative=True, block_size=3
    )
    x = np.arange(suite.VEC, dtype=np.float32)
    req = suite.Vec(values=x, scale=np.float32(3.0))
    reply = await rt.send_and_receive("vec", req, timeout=20)
    np.testing.assert_allclose(reply.values, x * 3)
    assert k.device is not None
    staged = k.device.stage[0]  # the block copied the slot before the handler ran
    assert float(staged["scale"]) == 3.0
    np.testing.assert_array_equal(staged["values"], x)
    assert int(staged["_mid_lo"]) == req.message_id.int & ((1 << 64) - 1)


async def test_the_hardware_check_probe_runs_on_the_simulator() -> None:
    """The probe of tests/gpu/gpu_check.py, short, so the hardware run meets working code."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "gpu" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_probe", path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    result: dict[str, Any] = {}
    await asyncio.wait_for(mod.probe(1.0, result), 60)
    assert result["ok"], result
    assert {x["phase"] for x in result["launches"]} == {"prepared", "careless"}
    assert result["a_round_trips"] > 0
    assert not _device_threads()


# --- the worker thread of start/stop makes no CUDA call ------------------------------------------


async def test_device_calls_are_made_on_the_loop_thread(
    rt: RingKernelRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`start` and `stop` run in a worker thread, but every CUDA call they need (has the
    kernel ended, copy its state back, give its memory back) is made on the loop's thread,
    where the kernel was started: in a thread without a current CUDA context the question
    "has it ended?" fails, which reads as "still running"."""
    from pydotcompute.ring_kernels.tiers.gpu import resources

    seen: list[tuple[str, int]] = []
    for name in ("finished", "failure", "read_state", "release"):
        original = getattr(resources.DeviceActor, name)

        def spy(self: Any, *args: Any, _original: Any = original, _name: str = name) -> Any:
            seen.append((_name, threading.get_ident()))
            return _original(self, *args)

        monkeypatch.setattr(resources.DeviceActor, name, spy)
    k = await launch_gpu(rt, "add", suite.add_handler, Add, Sum, state=np.zeros(1, np.int64))
    assert (await rt.send_and_receive("add", Add(a=1.0, b=2.0), timeout=20)).total == 3.0
    await rt.terminate("add")
    assert {"finished", "read_state", "release"} <= {name for name, _ in seen}
    assert {thread for _, thread in seen} == {threading.get_ident()}, seen
    assert k.final_state is not None
    assert k.final_state.tolist() == [1]
