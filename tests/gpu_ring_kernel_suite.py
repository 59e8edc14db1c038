"""The GPU ring kernel behavioural suite, shared by the simulator and hardware runs.

``tests/cudasim/test_gpu_ring_kernel.py`` runs every scenario on the Numba CUDA simulator;
``tests/gpu/test_gpu_ring_kernel_hw.py`` runs the same scenarios on a real GPU. A scenario
is ``async def scenario(rt, env)``; ``env`` scales it to the platform (the simulator runs
Python threads, so it gets fewer messages and smaller blocks).

Handlers live here too. Under the simulator the ``cuda`` global of this module is swapped
for a fake while a kernel runs, so host code below never touches ``cuda``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import (
    KernelError,
    KernelStateError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import KernelState, RingKernelConfig
from pydotcompute.ring_kernels.message import message
from pydotcompute.ring_kernels.tiers.gpu import GPURingKernel

cuda = pytest.importorskip("numba.cuda")  # a module global: the simulator swaps it

VEC = 64


@message
class Add:
    a: float
    b: float


@message
class Sum:
    total: float
    count: int


@message
class Seq:
    seq: int


@message
class SeqOut:
    seq: int
    running: int


@message
class Vec:
    values: Annotated[np.ndarray, (VEC,), np.float32]
    scale: np.float32


@message
class VecOut:
    values: Annotated[np.ndarray, (VEC,), np.float32]
    norm: float


# --- handlers (device functions) -----------------------------------------------------------


def add_handler(inp: Any, out: Any, state: Any) -> int:
    state[0] += 1
    out.total = inp.a + inp.b
    out.count = state[0]
    return 0


def seq_handler(inp: Any, out: Any, state: Any) -> int:
    state[0] += inp.seq
    out.seq = inp.seq
    out.running = state[0]
    return 0


def picky_handler(inp: Any, out: Any, state: Any) -> int:
    if inp.a < 0:
        return 3
    out.total = inp.a * 2.0
    return 0


def double_handler(inp: Any, out: Any, state: Any) -> int:
    out.total = inp.total * 2.0
    out.count = inp.count
    return 0


def vec_handler(inp: Any, out: Any, state: Any) -> int:
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    for i in range(tid, VEC, step):
        out.values[i] = inp.values[i] * inp.scale
    if tid == 0:
        acc = 0.0
        for i in range(VEC):
            v = inp.values[i] * inp.scale
            acc += v * v
        out.norm = acc
        state[0] += 1
    return 0


def stuck_handler(inp: Any, out: Any, state: Any) -> int:
    """Spins while ``state[1] != 0`` (read atomically, so the poll is never hoisted)."""
    while cuda.atomic.add(state, 1, 0) != 0:
        pass
    out.total = inp.a
    return 0


# --- environment -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Env:
    """How big a scenario runs on this platform."""

    name: str
    many: int  # messages in the ordering / batch scenarios
    coop_block: int  # threads of the cooperative block
    settle: float  # seconds to let the device show it does nothing
    queue_size: int | None = None  # the bulk scenarios' queue (and ring) size; None: default

    def sizes(self) -> dict[str, Any]:
        """Launch options of the bulk scenarios."""
        return {} if self.queue_size is None else {"queue_size": self.queue_size}


SIM = Env("simulator", many=400, coop_block=4, settle=0.2)
HW = Env("hardware", many=20_000, coop_block=128, settle=0.05)


def capacity(env: Env) -> int:
    """Messages a kernel holds unread: staging queue + inbox ring + outbox ring + reply buffer.

    A scenario that sends more than this before it reads deadlocks by construction, so the
    bulk scenarios receive while they send.
    """
    q = env.queue_size or RingKernelConfig(kernel_id="capacity").input_queue_size
    ring = min(q, 4096)
    return q + ring + ring + q


async def launch_gpu(
    rt: RingKernelRuntime,
    kid: str,
    handler: Any,
    in_t: type,
    out_t: type,
    *,
    activate: bool = True,
    **options: Any,
) -> GPURingKernel:
    """Launch (and activate) a GPU kernel with the given tier options."""
    kernel = await rt.launch(
        kid, handler, input_type=in_t, output_type=out_t, tier="gpu", **options
    )
    assert isinstance(kernel, GPURingKernel)
    if activate:
        await rt.activate(kid)
    return kernel


async def wait_for(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def poke_state(kernel: GPURingKernel, index: int, value: int) -> None:
    """Write one state element while the kernel runs (simulator: NumPy; GPU: a copy)."""
    dev = kernel.device
    assert dev is not None
    arr = dev.state_dev
    if isinstance(arr, np.ndarray):
        arr[index] = value
    else:
        arr[index : index + 1].copy_to_device(np.array([value], dtype=arr.dtype))


# --- scenarios -------------------------------------------------------------------------------


async def round_trip_and_correlation(rt: RingKernelRuntime, env: Env) -> None:
    await launch_gpu(rt, "add", add_handler, Add, Sum, state=np.zeros(1, np.int64))
    req = Add(a=1.5, b=2.25)
    await rt.send("add", req)
    reply = await rt.receive("add", timeout=20)
    assert isinstance(reply, Sum)
    assert reply.total == 3.75
    assert reply.count == 1
    assert reply.correlation_id == req.message_id
    assert reply.priority == req.priority


async def concurrent_send_and_receive(rt: RingKernelRuntime, env: Env) -> None:
    await launch_gpu(rt, "add", add_handler, Add, Sum, state=np.zeros(1, np.int64))
    reqs = [Add(a=float(i), b=0.5) for i in range(24)]
    replies = await asyncio.gather(*(rt.send_and_receive("add", r, timeout=20) for r in reqs))
    assert [r.total for r in replies] == [i + 0.5 for i in range(24)]
    assert [r.correlation_id for r in replies] == [r.message_id for r in reqs]
    assert sorted(r.count for r in replies) == list(range(1, 25))


async def ordering_is_kept(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(
        rt, "seq", seq_handler, Seq, SeqOut, state=np.zeros(1, np.int64), **env.sizes()
    )
    n = env.many

    async def send_all() -> None:
        for i in range(n):
            await rt.send("seq", Seq(seq=i))

    sender = asyncio.ensure_future(send_all())  # more than the rings hold: read meanwhile
    got = [await rt.receive("seq", timeout=30) for _ in range(n)]
    await sender
    assert [g.seq for g in got] == list(range(n))
    assert [g.running for g in got] == np.cumsum(np.arange(n)).tolist()
    assert k.statistics().processed == n


async def batches_of_objects_and_records(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(
        rt, "seq", seq_handler, Seq, SeqOut, state=np.zeros(1, np.int64), **env.sizes()
    )
    n = env.many
    # more than the rings hold (see capacity): each batch is received while it is sent
    sender = asyncio.ensure_future(k.send_batch([Seq(seq=i) for i in range(n)]))
    got: list[Any] = []
    while len(got) < n:
        got += await k.receive_batch(n, timeout=30)
    assert await sender == n
    assert [g.seq for g in got] == list(range(n))
    recs = np.zeros(3 * n, dtype=Seq.dtype)
    recs["seq"] = np.arange(n, 4 * n)
    sender = asyncio.ensure_future(k.send_records(recs, timeout=60))
    out = []
    total = 0
    while total < 3 * n:
        chunk = await k.receive_records(4096, timeout=30)
        out.append(chunk)
        total += len(chunk)
    assert await sender == 3 * n
    allrec = np.concatenate(out)
    assert allrec.dtype == SeqOut.dtype
    np.testing.assert_array_equal(allrec["seq"], np.arange(n, 4 * n))
    np.testing.assert_array_equal(allrec["running"], np.cumsum(np.arange(4 * n))[n:])


async def state_persists_across_messages(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(rt, "add", add_handler, Add, Sum, state=np.array([100], np.int64))
    counts = [
        (await rt.send_and_receive("add", Add(a=0.0, b=0.0), timeout=20)).count for _ in range(5)
    ]
    assert counts == [101, 102, 103, 104, 105]
    assert k.state_snapshot().tolist() == [105]
    await rt.terminate("add")
    assert k.final_state is not None
    assert k.final_state.tolist() == [105]
    assert k.state_snapshot().tolist() == [105]


async def unified_buffer_state_is_updated_in_place(rt: RingKernelRuntime, env: Env) -> None:
    """State in a ``UnifiedBuffer``: a CuPy array on a GPU (typed through the CUDA typing
    module), NumPy under the simulator; the kernel updates it in place."""
    from pydotcompute.core import UnifiedBuffer

    buf = UnifiedBuffer((1,), np.int64, backend="cuda").allocate()
    buf.host[:] = 7
    buf.mark_host_dirty()
    await launch_gpu(rt, "add", add_handler, Add, Sum, state=buf)
    counts = [
        (await rt.send_and_receive("add", Add(a=0.0, b=0.0), timeout=20)).count for _ in range(3)
    ]
    assert counts == [8, 9, 10]
    await rt.terminate("add")
    assert buf.host.tolist() == [10]  # terminate marked the device side dirty


async def deactivate_holds_messages(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(rt, "add", add_handler, Add, Sum, state=np.zeros(1, np.int64))
    await rt.send_and_receive("add", Add(a=1.0, b=1.0), timeout=20)
    await rt.deactivate("add")
    assert rt.get_kernel_state("add") is KernelState.DEACTIVATED
    for i in range(5):
        await rt.send("add", Add(a=float(i), b=0.0))
    await asyncio.sleep(env.settle)
    assert k.statistics().processed == 1
    assert k.receive_nowait() is None
    await rt.reactivate("add")
    got = [await rt.receive("add", timeout=20) for _ in range(5)]
    assert [g.total for g in got] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert k.statistics().processed == 6


async def terminate_drains_queued_messages(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(rt, "seq", seq_handler, Seq, SeqOut, state=np.zeros(1, np.int64))
    for i in range(50):
        await rt.send("seq", Seq(seq=i))
    left = await rt.terminate("seq", timeout=30)
    assert left == []
    assert k.state is KernelState.TERMINATED
    got = [await rt.receive("seq") for _ in range(50)]
    assert [g.seq for g in got] == list(range(50))
    with pytest.raises(KernelStateError, match="terminated and its outbox is drained"):
        await rt.receive("seq")
    with pytest.raises(KernelStateError, match="cannot send to kernel 'seq'"):
        await rt.send("seq", Seq(seq=1))


async def terminate_while_deactivated_drains(rt: RingKernelRuntime, env: Env) -> None:
    await launch_gpu(rt, "seq", seq_handler, Seq, SeqOut, state=np.zeros(1, np.int64))
    await rt.deactivate("seq")
    for i in range(10):
        await rt.send("seq", Seq(seq=i))
    assert await rt.terminate("seq", timeout=30) == []
    assert [(await rt.receive("seq")).seq for _ in range(10)] == list(range(10))


async def terminate_before_activate_returns_messages(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(
        rt,
        "seq",
        seq_handler,
        Seq,
        SeqOut,
        activate=False,
        state=np.zeros(1, np.int64),
        ring_size=4,
    )
    for i in range(7):  # nothing enters the ring before activate: all are staged
        await rt.send("seq", Seq(seq=i))
    left = await rt.terminate("seq")
    assert [m.seq for m in left] == list(range(7))
    assert all(isinstance(m, Seq) for m in left)
    assert k.undelivered == left
    assert rt.get_telemetry("seq").messages_dropped == 7
    assert k.statistics().processed == 0


async def handler_rejection_is_an_error(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(rt, "picky", picky_handler, Add, Sum)
    bad = Add(a=-1.0, b=0.0)
    with pytest.raises(KernelError, match=f"rejected message {bad.message_id} with status 3"):
        await rt.send_and_receive("picky", bad, timeout=20)
    await rt.send("picky", Add(a=-2.0, b=0.0))
    good = await rt.send_and_receive("picky", Add(a=4.0, b=0.0), timeout=20)
    assert good.total == 8.0
    tel = rt.get_telemetry("picky")
    assert tel.error_count == 2
    assert tel.last_error is not None
    assert "status 3" in tel.last_error
    assert k.statistics().last_status == 3
    assert tel.drop_reasons() == {"rejected": 2}  # each rejected message ends as a drop
    assert k.receive_nowait() is None  # rejected messages produce no reply
    assert rt.get_kernel_state("picky") is KernelState.ACTIVE


async def outbox_full_blocks_then_delivers(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(
        rt, "seq", seq_handler, Seq, SeqOut, state=np.zeros(1, np.int64), queue_size=4, ring_size=4
    )
    n = 40
    sender = asyncio.ensure_future(k.send_batch([Seq(seq=i) for i in range(n)]))
    await wait_for(lambda: k.statistics().outbox_full_events >= 1)
    assert k.statistics().processed < n  # the kernel waits for the host to take replies
    got = [(await rt.receive("seq", timeout=20)).seq for _ in range(n)]
    await sender
    assert got == list(range(n))
    assert k.statistics().dropped == 0


async def outbox_full_drop_is_counted(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(
        rt,
        "seq",
        seq_handler,
        Seq,
        SeqOut,
        state=np.zeros(1, np.int64),
        queue_size=4,
        ring_size=4,
        outbox_full="drop",
    )
    n = 30
    await k.send_batch([Seq(seq=i) for i in range(n)])
    await wait_for(lambda: k.statistics().processed == n)
    received = 0
    while True:
        try:
            await rt.receive("seq", timeout=0.5)
        except QueueTimeoutError:
            break
        received += 1
    stats = k.statistics()
    assert stats.dropped > 0
    assert stats.dropped + received == n
    assert stats.outbox_full_events >= 1
    assert k.state_snapshot().tolist() == [sum(range(n))]  # the handler ran on every one
    assert rt.get_telemetry("seq").messages_dropped == stats.dropped


async def cooperative_block(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(
        rt, "vec", vec_handler, Vec, VecOut, cooperative=True, block_size=env.coop_block
    )
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = rng.standard_normal(VEC).astype(np.float32)
        reply = await rt.send_and_receive("vec", Vec(values=x, scale=np.float32(2.0)), timeout=20)
        np.testing.assert_allclose(reply.values, x * 2, rtol=1e-6)
        assert reply.norm == pytest.approx(float(np.sum((x * 2).astype(np.float64) ** 2)), rel=1e-4)
    assert k.state_snapshot().tolist() == [3.0]


async def telemetry_reads_device_counters(rt: RingKernelRuntime, env: Env) -> None:
    await launch_gpu(rt, "add", add_handler, Add, Sum, state=np.zeros(1, np.int64))
    for i in range(10):
        await rt.send_and_receive("add", Add(a=float(i), b=0.0), timeout=20)
    tel = rt.get_telemetry("add")
    assert tel.messages_processed == 10
    assert tel.messages_sent == 10
    assert tel.error_count == 0
    assert tel.histogram.count == 10
    assert 0 < tel.min_latency_ns <= tel.max_latency_ns
    assert tel.total_latency_ns >= tel.max_latency_ns
    summary = rt.get_summary()
    assert summary["total_messages_processed"] >= 10


async def pipeline_between_gpu_kernels(rt: RingKernelRuntime, env: Env) -> None:
    await launch_gpu(rt, "add", add_handler, Add, Sum, state=np.zeros(1, np.int64))
    await launch_gpu(rt, "double", double_handler, Sum, Sum)
    rt.connect("add", "double")
    for i in range(6):
        await rt.send("add", Add(a=float(i), b=1.0))
    got = [await rt.receive("double", timeout=20) for _ in range(6)]
    assert [g.total for g in got] == [2.0 * (i + 1) for i in range(6)]
    assert [g.count for g in got] == [1, 2, 3, 4, 5, 6]


async def pipeline_through_host_actors(rt: RingKernelRuntime, env: Env) -> None:
    async def source(ctx: Any) -> None:
        while True:
            msg = await ctx.receive()
            await ctx.send(Add(a=msg.a * 10.0, b=msg.b))

    async def sink(ctx: Any) -> None:
        while True:
            msg = await ctx.receive()
            await ctx.send(Sum(total=msg.total + 0.5, count=msg.count))

    await rt.launch("src", source, input_type=Add, output_type=Add)
    await launch_gpu(rt, "add", add_handler, Add, Sum, state=np.zeros(1, np.int64))
    await rt.launch("sink", sink, input_type=Sum, output_type=Sum)
    await rt.activate("src")
    await rt.activate("sink")
    rt.connect("src", "add")
    rt.connect("add", "sink")
    for i in range(5):
        await rt.send("src", Add(a=float(i), b=1.0))
    got = [await rt.receive("sink", timeout=20) for _ in range(5)]
    assert [g.total for g in got] == [10.0 * i + 1.5 for i in range(5)]
    assert [g.count for g in got] == [1, 2, 3, 4, 5]


async def bad_input_is_refused(rt: RingKernelRuntime, env: Env) -> None:
    await launch_gpu(rt, "add", add_handler, Add, Sum)
    with pytest.raises(TypeValidationError, match="kernel 'add' expects Add, got Seq"):
        await rt.send("add", Seq(seq=1))
    k = rt.get_kernel("add")
    assert isinstance(k, GPURingKernel)
    with pytest.raises(TypeValidationError, match=r"expects records of Add\.dtype"):
        await k.send_records(np.zeros(3, dtype=Seq.dtype))
    with pytest.raises(
        QueueTimeoutError, match=r"no message arrived within 0\.05s on .*kernel 'add'"
    ):
        await rt.receive("add", timeout=0.05)


async def reject_backpressure_when_full(rt: RingKernelRuntime, env: Env) -> None:
    k = await launch_gpu(
        rt,
        "seq",
        seq_handler,
        Seq,
        SeqOut,
        state=np.zeros(1, np.int64),
        queue_size=3,
        ring_size=2,
        backpressure="reject",
    )
    await rt.deactivate("seq")
    for i in range(3):  # a paused kernel takes none: all wait in the staging queue
        await rt.send("seq", Seq(seq=i))
    with pytest.raises(QueueFullError, match="full"):
        await rt.send("seq", Seq(seq=3))  # the user's bound holds end to end
    assert k.statistics().staged == 3
    assert k.statistics().in_flight == 0
    await rt.reactivate("seq")
    assert [(await rt.receive("seq", timeout=20)).seq for _ in range(3)] == list(range(3))


async def several_actors_at_once(rt: RingKernelRuntime, env: Env) -> None:
    ks = [
        await launch_gpu(rt, f"add{i}", add_handler, Add, Sum, state=np.array([10 * i], np.int64))
        for i in range(3)
    ]
    for _ in range(3):
        for i in range(3):
            await rt.send(f"add{i}", Add(a=float(i), b=0.0))
    for i in range(3):
        got = [await rt.receive(f"add{i}", timeout=20) for _ in range(3)]
        assert [g.count for g in got] == [10 * i + 1, 10 * i + 2, 10 * i + 3]
        assert all(g.total == float(i) for g in got)
    for k in ks:
        await rt.terminate(k.kernel_id)
    assert [k.final_state.tolist() for k in ks] == [[3], [13], [23]]  # type: ignore[union-attr]


Scenario = Callable[[RingKernelRuntime, Env], Awaitable[None]]

SCENARIOS: dict[str, Scenario] = {
    f.__name__: f
    for f in (
        round_trip_and_correlation,
        concurrent_send_and_receive,
        ordering_is_kept,
        batches_of_objects_and_records,
        state_persists_across_messages,
        unified_buffer_state_is_updated_in_place,
        deactivate_holds_messages,
        terminate_drains_queued_messages,
        terminate_while_deactivated_drains,
        terminate_before_activate_returns_messages,
        handler_rejection_is_an_error,
        outbox_full_blocks_then_delivers,
        outbox_full_drop_is_counted,
        cooperative_block,
        telemetry_reads_device_counters,
        pipeline_between_gpu_kernels,
        pipeline_through_host_actors,
        bad_input_is_refused,
        reject_backpressure_when_full,
        several_actors_at_once,
    )
}
