"""RingKernelRuntime: launching, lookup, messaging, failures, telemetry, scopes, shutdown."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import numpy as np
import pytest
from foundation_helpers import Other, Req, Resp, crash_on_negative, doubler, echo, until

from pydotcompute import message, ring_kernel
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelAlreadyExistsError,
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.config import RingKernelConfig
from pydotcompute.ring_kernels.context import KernelContext
from pydotcompute.ring_kernels.message import array_message, get_buffer_registry
from pydotcompute.ring_kernels.registry import get_registered_kernel, register_ring_kernel
from pydotcompute.ring_kernels.runtime import RingKernelRuntime
from pydotcompute.ring_kernels.states import KernelState
from pydotcompute.ring_kernels.telemetry import RingKernelTelemetry
from pydotcompute.testing import current_loop_kind

S = KernelState


async def test_runs_on_the_parametrized_loop(request: pytest.FixtureRequest) -> None:
    assert current_loop_kind() == request.node.callspec.id


async def quick(rt: RingKernelRuntime, kid: str = "compute", **kw: Any) -> None:
    kw.setdefault("input_type", Req)
    kw.setdefault("output_type", Resp)
    await rt.launch(kid, kw.pop("func", doubler), **kw)
    await rt.activate(kid)


# --- the runtime itself ----------------------------------------------------------------


async def test_context_manager_starts_and_shuts_down() -> None:
    async with RingKernelRuntime() as rt:
        assert rt.is_active
        await quick(rt)
        await rt.send("compute", Req(x=3))
        assert (await rt.receive("compute", timeout=5)).y == 6
        kernel = rt.get_kernel("compute")
    assert not rt.is_active
    assert kernel.state is S.TERMINATED
    assert kernel._task is not None
    assert kernel._task.done()


async def test_start_is_idempotent_and_launch_starts_it() -> None:
    rt = RingKernelRuntime()
    assert not rt.is_active
    await rt.launch("k", doubler)
    assert rt.is_active
    assert await rt.start() is rt
    await rt.shutdown()


async def test_a_shut_down_runtime_can_start_again() -> None:
    rt = RingKernelRuntime()
    await rt.start()
    await rt.launch("k", doubler)
    assert await rt.shutdown() == {}
    assert await rt.shutdown() == {}  # idempotent
    assert rt.kernel_ids == []
    assert rt.terminated_ids == ["k"]
    assert not rt.is_active
    assert await rt.start() is rt
    assert rt.is_active
    await rt.launch("k", doubler)  # the terminated kernel is forgotten
    assert rt.kernel_ids == ["k"]
    assert rt.terminated_ids == []
    await rt.shutdown()


async def test_kernel_ids_contains_and_len(rt: RingKernelRuntime) -> None:
    await rt.launch("a", doubler)
    await rt.launch("b", doubler)
    assert rt.kernel_ids == ["a", "b"]
    assert "a" in rt
    assert "zz" not in rt
    assert len(rt) == 2


def test_constructor_defaults() -> None:
    rt = RingKernelRuntime()
    assert rt.enable_telemetry
    assert rt.use_uvloop
    assert rt.use_eager_tasks
    assert rt.kernel_ids == []


# --- launching -------------------------------------------------------------------------


async def test_two_phase_launch(rt: RingKernelRuntime) -> None:
    kernel = await rt.launch("k", doubler, input_type=Req)
    assert rt.get_kernel_state("k") is S.LAUNCHED
    await rt.send("k", Req(x=1))  # queued until activation
    assert len(kernel.inbox) == 1  # type: ignore[arg-type]
    await rt.activate("k")
    assert rt.get_kernel_state("k") is S.ACTIVE
    assert (await rt.receive("k", timeout=5)).y == 2


async def test_launch_takes_a_registered_kernel(
    rt: RingKernelRuntime, clean_kernel_registry: None
) -> None:
    @ring_kernel(
        kernel_id="registered", input_type=Req, output_type=Resp, queue_size=16, restart="never"
    )
    async def registered(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await ctx.send(Resp(y=msg.x + 1))

    kernel = await rt.launch("registered")
    assert kernel.input_type is Req
    assert kernel.output_type is Resp
    assert kernel.config.input_queue_size == 16
    assert kernel.config.output_queue_size == 16
    await rt.activate("registered")
    assert (await rt.send_and_receive("registered", Req(x=1), timeout=5)).y == 2
    with pytest.raises(TypeValidationError, match="kernel 'registered' expects Req, got Other"):
        await rt.send("registered", Other(z="x"))


async def test_launch_overrides_registered_options(
    rt: RingKernelRuntime, clean_kernel_registry: None
) -> None:
    register_ring_kernel("opt", doubler, input_type=Req, input_queue_size=8, output_queue_size=8)
    kernel = await rt.launch("opt", queue_size=3, output_queue_size=5)
    assert (kernel.config.input_queue_size, kernel.config.output_queue_size) == (3, 5)


async def test_launch_unregistered_without_function(
    rt: RingKernelRuntime, clean_kernel_registry: None
) -> None:
    register_ring_kernel("known_one", doubler)
    with pytest.raises(
        KernelNotFoundError,
        match=r"unknown kernel id 'ghost' in the @ring_kernel registry; known ids: .*'known_one'",
    ):
        await rt.launch("ghost")
    with pytest.raises(KeyError):
        get_registered_kernel("ghost")


async def test_duplicate_launch(rt: RingKernelRuntime) -> None:
    await rt.launch("dup", doubler)
    with pytest.raises(
        KernelAlreadyExistsError,
        match=r"kernel 'dup' is already launched in this runtime \(state LAUNCHED\); terminate "
        r"it first or choose another kernel_id",
    ):
        await rt.launch("dup", echo)
    assert rt.get_kernel("dup")._func is doubler


async def test_remove_frees_the_id(rt: RingKernelRuntime) -> None:
    await rt.launch("x", doubler)
    with pytest.raises(KernelStateError, match=r"cannot remove kernel 'x': it is LAUNCHED"):
        rt.remove("x")
    await rt.terminate("x")
    rt.remove("x")
    assert "x" not in rt
    await rt.launch("x", echo)


@array_message
class Frame:
    pixels: np.ndarray


async def echo_frames(ctx: KernelContext) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Frame(pixels=msg.pixels))


async def test_remove_drops_unread_replies_and_releases_their_arrays(
    rt: RingKernelRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    # a serialize=True outbox holds ArrayMessage replies as frames that pin their arrays in
    # the process-wide registry: forgetting the kernel must let go of them, and say so
    await rt.launch("frames", echo_frames, serialize=True)
    await rt.activate("frames")
    pixels = np.arange(4)
    for _ in range(3):
        await rt.send("frames", Frame(pixels=pixels))
    await until(lambda: rt.get_telemetry("frames").messages_sent == 3, "three replies")
    reg = get_buffer_registry()
    assert reg.refcount(reg._by_object[id(pixels)]) == 3  # one per unread reply frame
    await rt.terminate("frames")
    with caplog.at_level("WARNING", logger="pydotcompute"):
        rt.remove("frames")
    assert "kernel 'frames' removed with 3 unread replies" in caplog.text
    assert id(pixels) not in reg._by_object


async def test_a_runtime_thrown_away_with_unread_array_replies_releases_them() -> None:
    # no remove(): the whole runtime is dropped with frames in a serialize=True outbox;
    # once it is collected, nothing of it may keep the arrays pinned
    pixels = np.arange(4)
    reg = get_buffer_registry()

    async def run_and_forget() -> None:
        async with RingKernelRuntime() as runtime:
            await runtime.launch("frames", echo_frames, serialize=True)
            await runtime.activate("frames")
            for _ in range(2):
                await runtime.send("frames", Frame(pixels=pixels))
            tel = runtime.get_telemetry("frames")
            await until(lambda: tel.messages_sent == 2, "two replies")
        assert reg.refcount(reg._by_object[id(pixels)]) == 2

    await run_and_forget()
    gc.collect()
    assert id(pixels) not in reg._by_object


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"colour": "red"}, r"unknown option 'colour' for kernel 'k' on tier 'asyncio'; known:"),
        ({"queue_size": 0}, r"input_queue_size must be an int in 1\.\."),
        ({"backpressure": "nope"}, r"unknown backpressure strategy 'nope'"),
        ({"restart": "sometimes"}, r"restart must be one of"),
        ({"tier": "quantum"}, r"unknown execution tier 'quantum'; choose one of"),
    ],
)
async def test_bad_launch_options(
    rt: RingKernelRuntime, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidConfigurationError, match=match):
        await rt.launch("k", doubler, **options)
    assert "k" not in rt


def _tier_or_skip(tier: str) -> None:
    from pydotcompute.ring_kernels.tiers import tier_class

    try:
        tier_class(tier)
    except InvalidConfigurationError as exc:
        pytest.skip(f"tier {tier!r} cannot be imported here: {exc}")


@pytest.mark.parametrize("replicas", [1, 2], ids=["single", "pool"])
@pytest.mark.parametrize(
    ("tier", "named"),
    [
        ("asyncio", "asyncio"),
        ("thread", "thread"),
        ("process", "process"),
        ("cython", "process"),
        ("gpu", "gpu"),
    ],
)
async def test_unknown_option_names_the_tier_asked_for(
    rt: RingKernelRuntime, tier: str, named: str, replicas: int
) -> None:
    _tier_or_skip(tier)
    if tier == "gpu" and replicas > 1:
        pytest.skip("the gpu tier runs no pools")
    with pytest.raises(
        InvalidConfigurationError,
        match=rf"unknown option 'some_unknown_option' for kernel 'k' on tier '{named}'",
    ):
        await rt.launch("k", doubler, tier=tier, replicas=replicas, some_unknown_option=1)
    assert "k" not in rt


async def test_unknown_option_names_the_tier_of_the_config_or_registry(
    rt: RingKernelRuntime, clean_kernel_registry: None
) -> None:
    with pytest.raises(InvalidConfigurationError, match=r"on tier 'thread'; known:"):
        await rt.launch("k", doubler, config=RingKernelConfig("k", tier="thread"), colour="red")
    register_ring_kernel("reg", doubler, tier="thread", colour="red")
    with pytest.raises(InvalidConfigurationError, match=r"kernel 'reg' on tier 'thread'; known:"):
        await rt.launch("reg")
    with pytest.raises(InvalidConfigurationError, match=r"kernel 'reg' on tier 'process'; known:"):
        await rt.launch("reg", tier="process")
    assert "k" not in rt
    assert "reg" not in rt


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
async def test_bad_kernel_id(rt: RingKernelRuntime, bad: Any) -> None:
    with pytest.raises(InvalidConfigurationError, match="kernel_id must be a non-empty string"):
        await rt.launch(bad, doubler)


async def test_message_types_must_be_classes(rt: RingKernelRuntime) -> None:
    with pytest.raises(
        TypeValidationError,
        match=r"input_type must be a class \(an @message type\) or None, got 'Req' of type str",
    ):
        await rt.launch("k", doubler, input_type="Req")
    with pytest.raises(TypeValidationError, match="output_type must be a class"):
        await rt.launch("k", doubler, output_type=Resp(y=1))
    assert "k" not in rt


async def test_launch_with_a_config_object(rt: RingKernelRuntime) -> None:
    cfg = RingKernelConfig("ignored", input_queue_size=5, backpressure_strategy="reject")
    kernel = await rt.launch("cfg", doubler, config=cfg)
    assert kernel.config.kernel_id == "cfg"
    assert kernel.config.input_queue_size == 5
    assert cfg.kernel_id == "ignored"  # the caller's object is not modified


# --- unknown ids -----------------------------------------------------------------------

LOOKUPS = {
    "activate": lambda rt: rt.activate("nope"),
    "deactivate": lambda rt: rt.deactivate("nope"),
    "reactivate": lambda rt: rt.reactivate("nope"),
    "terminate": lambda rt: rt.terminate("nope"),
    "send": lambda rt: rt.send("nope", Req(x=1)),
    "send_nowait": lambda rt: rt.send_nowait("nope", Req(x=1)),
    "receive": lambda rt: rt.receive("nope"),
    "receive_nowait": lambda rt: rt.receive_nowait("nope"),
    "send_and_receive": lambda rt: rt.send_and_receive("nope", Req(x=1)),
    "get_kernel_state": lambda rt: rt.get_kernel_state("nope"),
    "get_counters": lambda rt: rt.get_counters("nope"),
    "connect": lambda rt: rt.connect("alpha", "nope"),
    "remove": lambda rt: rt.remove("nope"),
}


@pytest.mark.parametrize("op", list(LOOKUPS))
async def test_unknown_kernel_id_lists_the_known_ids(rt: RingKernelRuntime, op: str) -> None:
    await rt.launch("alpha", doubler)
    await rt.launch("beta", doubler)

    async def call() -> None:
        result = LOOKUPS[op](rt)
        if asyncio.iscoroutine(result):
            await result

    with pytest.raises(
        KernelNotFoundError,
        match=r"^unknown kernel id 'nope' in the runtime; known ids: 'alpha', 'beta'$",
    ) as info:
        await call()
    assert isinstance(info.value, KeyError)


async def test_unhashable_kernel_id_is_not_found(rt: RingKernelRuntime) -> None:
    with pytest.raises(KernelNotFoundError, match=r"unknown kernel id \"\['x'\]\""):
        await rt.send(["x"], Req(x=1))  # type: ignore[arg-type]


# --- messaging -------------------------------------------------------------------------


async def test_wrong_message_type_on_send(rt: RingKernelRuntime) -> None:
    await quick(rt)
    with pytest.raises(TypeValidationError, match=r"^kernel 'compute' expects Req, got Other$"):
        await rt.send("compute", Other(z="?"))
    with pytest.raises(TypeValidationError, match=r"kernel 'compute' expects Req, got dict"):
        await rt.send("compute", {"x": 1})
    with pytest.raises(TypeValidationError, match=r"kernel 'compute' expects Req, got int \(5\)"):
        rt.send_nowait("compute", 5)
    with pytest.raises(TypeValidationError, match="expects Req, got Other"):
        await rt.send_and_receive("compute", Other(z="?"), timeout=1)


async def test_subclass_instances_are_accepted(rt: RingKernelRuntime) -> None:
    from pydotcompute import message

    @message
    class SpecialReq(Req):
        note: str = ""

    await quick(rt)
    await rt.send("compute", SpecialReq(x=4, note="sub"))
    assert (await rt.receive("compute", timeout=5)).y == 8


async def test_send_nowait_and_receive_nowait(rt: RingKernelRuntime) -> None:
    await quick(rt)
    assert rt.receive_nowait("compute") is None
    assert rt.send_nowait("compute", Req(x=5)) is True
    await until(lambda: len(rt.get_kernel("compute").outbox) == 1, "reply")  # type: ignore[arg-type]
    assert rt.receive_nowait("compute").y == 10


async def test_queue_full_under_reject(rt: RingKernelRuntime) -> None:
    await rt.launch("r", doubler, queue_size=2, backpressure="reject")
    await rt.send("r", Req(x=0))
    rt.send_nowait("r", Req(x=1))
    with pytest.raises(
        QueueFullError,
        match=r"queue of kernel 'r' is full \(2/2 messages\) and its backpressure is 'reject'",
    ):
        await rt.send("r", Req(x=2))
    with pytest.raises(QueueFullError, match="is full"):
        rt.send_nowait("r", Req(x=2))


async def test_queue_full_under_block_times_out(rt: RingKernelRuntime) -> None:
    await rt.launch("b", doubler, queue_size=1)
    await rt.send("b", Req(x=0))
    with pytest.raises(QueueTimeoutError, match="waiting for space in queue of kernel 'b'"):
        await rt.send("b", Req(x=1), timeout=0.01)
    with pytest.raises(QueueFullError, match="backpressure is 'block'"):
        rt.send_nowait("b", Req(x=1))


async def test_drop_oldest_counts_drops(rt: RingKernelRuntime) -> None:
    kernel = await rt.launch("d", doubler, queue_size=2, backpressure="drop_oldest")
    for i in range(5):
        await rt.send("d", Req(x=i))
    assert [m.x for m in kernel.inbox.drain()] == [3, 4]  # type: ignore[union-attr]
    assert kernel.inbox.statistics().total_dropped == 3  # type: ignore[union-attr]


async def test_receive_timeout(rt: RingKernelRuntime) -> None:
    await quick(rt)
    with pytest.raises(
        QueueTimeoutError, match=r"no message arrived within 0\.01s on queue of kernel 'compute'"
    ):
        await rt.receive("compute", timeout=0.01)


async def test_send_to_a_terminated_kernel(rt: RingKernelRuntime) -> None:
    await quick(rt)
    await rt.terminate("compute")
    assert rt.get_kernel_state("compute") is S.TERMINATED
    with pytest.raises(
        KernelStateError, match=r"^cannot send to kernel 'compute': it is TERMINATED"
    ):
        await rt.send("compute", Req(x=1))
    with pytest.raises(KernelStateError, match="it is TERMINATED"):
        rt.send_nowait("compute", Req(x=1))
    with pytest.raises(KernelStateError, match="it is TERMINATED"):
        await rt.send_and_receive("compute", Req(x=1), timeout=1)


async def test_send_while_deactivated_is_queued(rt: RingKernelRuntime) -> None:
    await quick(rt)
    await rt.deactivate("compute")
    assert rt.get_kernel_state("compute") is S.DEACTIVATED
    for i in range(3):
        await rt.send("compute", Req(x=i))
    with pytest.raises(QueueTimeoutError):
        await rt.receive("compute", timeout=0.01)
    await rt.reactivate("compute")
    assert [(await rt.receive("compute", timeout=5)).y for _ in range(3)] == [0, 2, 4]


async def test_serialize_kernel_passes_copies(rt: RingKernelRuntime) -> None:
    kernel = await rt.launch("ser", echo, serialize=True)
    req = Req(x=9, priority=200)
    await rt.send("ser", req)
    stored = next(x for band in kernel.inbox._bands if band for x in band)  # type: ignore[union-attr]
    assert type(stored) is bytes
    await rt.activate("ser")
    back = await rt.receive("ser", timeout=5)
    assert back is not req  # it crossed as bytes, twice
    assert (back.message_id, back.priority, back.x) == (req.message_id, 200, 9)


async def test_serialize_needs_the_fast_queue(rt: RingKernelRuntime) -> None:
    # the exact-priority MessageQueue stores objects: serialize=True would be ignored silently
    with pytest.raises(InvalidConfigurationError, match=r"serialize=True.*use_fast_queue=True"):
        await rt.launch("ser", echo, serialize=True, use_fast_queue=False)
    assert "ser" not in rt.kernel_ids


async def test_send_and_receive_with_100_concurrent_callers(rt: RingKernelRuntime) -> None:
    async def slow_square(ctx: KernelContext) -> None:
        i = 0
        while not ctx.should_terminate:
            msg = await ctx.receive()
            i += 1
            if i % 2:
                await asyncio.sleep(0)
            await ctx.send(Resp(y=msg.x * msg.x))

    await quick(rt, "sq", func=slow_square)
    replies = await asyncio.gather(
        *(rt.send_and_receive("sq", Req(x=i), timeout=10) for i in range(100))
    )
    assert [r.y for r in replies] == [i * i for i in range(100)]
    assert rt.receive_nowait("sq") is None


async def test_ctx_send_nowait_answers_its_caller_or_counts_the_reply_lost(
    rt: RingKernelRuntime,
) -> None:
    """A reply sent with ``ctx.send_nowait`` reaches the ``send_and_receive`` caller that
    waits for it; one whose caller already gave up is counted once as ``reply_lost``."""
    release = asyncio.Event()

    async def nowait_doubler(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            if msg.x < 0:
                await release.wait()
            ctx.send_nowait(Resp(y=msg.x * 2))

    await quick(rt, "nw", func=nowait_doubler)
    assert (await rt.send_and_receive("nw", Req(x=4), timeout=10)).y == 8
    with pytest.raises(QueueTimeoutError):
        await rt.send_and_receive("nw", Req(x=-1), timeout=0.01)
    release.set()
    assert (await rt.send_and_receive("nw", Req(x=5), timeout=10)).y == 10
    tel = rt.get_telemetry("nw")
    assert tel.drop_reasons() == {"reply_lost": 1}
    assert rt.receive_nowait("nw") is None  # the late reply went nowhere else


async def test_send_and_receive_mixed_with_plain_sends(rt: RingKernelRuntime) -> None:
    await quick(rt)
    plain = [rt.send("compute", Req(x=100 + i)) for i in range(5)]
    correlated = [rt.send_and_receive("compute", Req(x=i), timeout=10) for i in range(5)]
    results = await asyncio.gather(*plain, *correlated)
    assert [r.y for r in results[5:]] == [0, 2, 4, 6, 8]
    uncorrelated = sorted([(await rt.receive("compute", timeout=5)).y for _ in range(5)])
    assert uncorrelated == [200, 202, 204, 206, 208]


# --- failures --------------------------------------------------------------------------


async def test_actor_failure_is_visible_to_callers(rt: RingKernelRuntime) -> None:
    await quick(rt, "c", func=crash_on_negative)
    receiver = asyncio.ensure_future(rt.receive("c"))
    await rt.send("c", Req(x=-1))
    with pytest.raises(
        KernelFailedError,
        match=r"cannot use kernel 'c': it is FAILED; the actor raised ValueError: negative "
        r"input -1",
    ):
        await asyncio.wait_for(receiver, 5)
    assert rt.get_kernel_state("c") is S.FAILED
    with pytest.raises(KernelFailedError, match="negative input -1"):
        await rt.send("c", Req(x=1))
    with pytest.raises(KernelFailedError, match="negative input -1"):
        await rt.send_and_receive("c", Req(x=1), timeout=1)
    summary = rt.get_summary()
    assert summary["total_errors"] == 1
    assert summary["failures"] == [("c", "ValueError('negative input -1')")]
    assert rt.get_telemetry("c").last_error == "ValueError: negative input -1"


async def test_restart_policy_from_launch_options(rt: RingKernelRuntime) -> None:
    await quick(rt, "c", func=crash_on_negative, restart="on_failure", max_restarts=1)
    await rt.send("c", Req(x=-1))
    await rt.send("c", Req(x=1))
    assert (await rt.receive("c", timeout=5)).y == 2
    assert rt.get_kernel_state("c") is S.ACTIVE
    assert rt.get_telemetry("c").restarts == 1
    await rt.send("c", Req(x=-2))
    with pytest.raises(KernelFailedError, match="negative input -2"):
        await rt.receive("c", timeout=5)
    assert rt.get_kernel_state("c") is S.FAILED


async def test_restarted_request_fails_its_send_and_receive_caller(rt: RingKernelRuntime) -> None:
    await quick(rt, "c", func=crash_on_negative, restart="on_failure", max_restarts=5)
    with pytest.raises(KernelFailedError, match="negative input -4 while handling this request"):
        await asyncio.wait_for(rt.send_and_receive("c", Req(x=-4)), 5)
    assert (await rt.send_and_receive("c", Req(x=4), timeout=5)).y == 8


async def test_a_failed_kernel_can_be_terminated_and_relaunched(rt: RingKernelRuntime) -> None:
    await quick(rt, "c", func=crash_on_negative)
    await rt.send("c", Req(x=-1))
    await until(lambda: rt.get_kernel_state("c") is S.FAILED, "failed")
    assert await rt.terminate("c") == []
    rt.remove("c")
    await quick(rt, "c", func=crash_on_negative)
    assert (await rt.send_and_receive("c", Req(x=3), timeout=5)).y == 6


# --- telemetry and introspection -------------------------------------------------------


async def test_telemetry_counts_messages(rt: RingKernelRuntime) -> None:
    await quick(rt)
    for i in range(10):
        await rt.send("compute", Req(x=i))
    for _ in range(10):
        await rt.receive("compute", timeout=5)
    tel = rt.get_telemetry("compute")
    assert isinstance(tel, RingKernelTelemetry)
    assert tel.kernel_id == "compute"
    assert tel.messages_processed == 10
    assert tel.messages_sent == 10
    assert tel.error_count == 0
    assert tel.histogram.count >= 9  # a message is timed when the actor asks for the next
    assert tel.p50_latency_ns <= tel.p99_latency_ns <= max(tel.max_latency_ns * 2, 1)
    assert rt.get_all_telemetry() == {"compute": tel}


async def test_telemetry_queue_depth(rt: RingKernelRuntime) -> None:
    await rt.launch("q", doubler)
    for i in range(4):
        await rt.send("q", Req(x=i))
    assert rt.get_telemetry("q").queue_depth == 4


async def test_summary_keys(rt: RingKernelRuntime) -> None:
    await quick(rt)
    await rt.send_and_receive("compute", Req(x=1), timeout=5)
    summary = rt.get_summary()
    for key in (
        "kernel_count",
        "total_messages_processed",
        "total_messages_dropped",
        "total_errors",
        "uptime_seconds",
        "gpu_utilization",
    ):
        assert key in summary
    assert summary["kernel_count"] == 1
    assert summary["total_messages_processed"] == 1
    assert summary["gpu_utilization"] is None  # no GPU on this machine
    assert summary["uptime_seconds"] >= 0


async def test_get_loop_info_reports_the_running_loop(rt: RingKernelRuntime) -> None:
    info = rt.get_loop_info()
    assert info["running"] is True
    kind = current_loop_kind()
    assert info["loop_module"].startswith("uvloop" if kind == "uvloop" else "asyncio")


# --- scopes, terminate_all, shutdown ---------------------------------------------------


async def test_kernel_scope(rt: RingKernelRuntime) -> None:
    async with rt.kernel_scope("scoped", doubler, input_type=Req) as kernel:
        assert kernel.state is S.ACTIVE
        await rt.send("scoped", Req(x=2))
        assert (await rt.receive("scoped", timeout=5)).y == 4
    assert kernel.state is S.TERMINATED
    assert "scoped" not in rt
    async with rt.kernel_scope("scoped", doubler):  # the id is free again
        pass


async def test_kernel_scope_from_the_registry(
    rt: RingKernelRuntime, clean_kernel_registry: None
) -> None:
    register_ring_kernel("reg_scope", doubler, input_type=Req)
    async with rt.kernel_scope("reg_scope") as kernel:
        assert kernel.input_type is Req
        assert (await rt.send_and_receive("reg_scope", Req(x=1), timeout=5)).y == 2


async def test_kernel_scope_terminates_on_error(rt: RingKernelRuntime) -> None:
    with pytest.raises(ZeroDivisionError):
        async with rt.kernel_scope("boom", doubler) as kernel:
            1 / 0  # noqa: B018
    assert kernel.state is S.TERMINATED
    assert "boom" not in rt


async def test_terminate_all(rt: RingKernelRuntime) -> None:
    await quick(rt, "a")
    await quick(rt, "b")
    await rt.launch("c", doubler)
    await rt.send("c", Req(x=1))  # never activated: undelivered
    report = await rt.terminate_all()
    assert report == {"c": 1}
    assert {rt.get_kernel_state(k) for k in "abc"} == {S.TERMINATED}
    assert await rt.terminate_all() == {}
    assert rt.get_summary()["total_messages_dropped"] == 1


async def test_shutdown_reports_undelivered(rt: RingKernelRuntime) -> None:
    hold = asyncio.Event()

    async def stuck(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()
            await hold.wait()

    kernel = await rt.launch("s", stuck)
    for i in range(4):
        await rt.send("s", Req(x=i))
    await rt.activate("s")
    await until(lambda: len(kernel.inbox) == 3, "first taken")  # type: ignore[arg-type]
    report = await rt.shutdown(timeout=0.01)
    # the message the actor was stuck handling is reported too, ahead of the queued ones
    assert report == {"s": 4}
    assert [m.x for m in kernel.undelivered] == [0, 1, 2, 3]
    assert not rt.is_active


async def test_shutdown_waits_for_a_termination_in_progress() -> None:
    rt = RingKernelRuntime()
    release = asyncio.Event()

    async def slow(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            await ctx.receive()
            await release.wait()

    kernel = await rt.launch("slow", slow)
    await rt.activate("slow")
    await rt.send("slow", Req(x=1))
    await rt.send("slow", Req(x=2))
    terminating = asyncio.ensure_future(rt.terminate("slow", timeout=10.0))
    await until(lambda: kernel.state is S.TERMINATING, "terminating")
    shutdown = asyncio.ensure_future(rt.shutdown(timeout=10.0))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not shutdown.done()  # it waits for the drain already under way
    release.set()
    assert await asyncio.wait_for(shutdown, 5) == {}
    assert kernel.state is S.TERMINATED
    assert await terminating == []
    assert kernel.telemetry.messages_processed == 2


# --- Ray placement options in-process ----------------------------------------------------


async def test_in_process_launch_ignores_ray_placement_options(
    rt: RingKernelRuntime, clean_kernel_registry: None
) -> None:
    # the same decorated actor runs on a RayRingKernelRuntime, which places it with these
    @ring_kernel(
        kernel_id="placed",
        input_type=Req,
        output_type=Resp,
        queue_size=8,
        num_cpus=2,
        num_gpus=0,
        resources={"accelerator": 1},
    )
    async def placed(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await ctx.send(Resp(y=msg.x * 3))

    kernel = await rt.launch("placed", memory=2**20)
    assert kernel.config.input_queue_size == 8
    assert kernel.config.extra == {}  # nothing of the placement reaches the kernel
    await rt.activate("placed")
    assert (await rt.send_and_receive("placed", Req(x=2), timeout=5)).y == 6
    direct = await rt.launch("direct", doubler, num_cpus=1, scheduling_strategy="SPREAD")
    assert direct.config.extra == {}


async def test_an_unknown_option_beside_placement_options_still_raises(
    rt: RingKernelRuntime,
) -> None:
    with pytest.raises(
        InvalidConfigurationError,
        match=r"unknown option 'colour' for kernel 'k' on tier 'asyncio'; known: \[.*'queue_size'"
        r".*\]; Ray placement options \(.*num_cpus.*\) are accepted and ignored in-process",
    ):
        await rt.launch("k", doubler, num_cpus=1, colour="red")
    assert "k" not in rt


async def test_every_ray_actor_option_is_accepted_in_process(rt: RingKernelRuntime) -> None:
    from pydotcompute.distributed.ray import RAY_ACTOR_OPTIONS

    for i, option in enumerate(sorted(RAY_ACTOR_OPTIONS)):
        kernel = await rt.launch(f"k{i}", doubler, **{option: 1})
        assert kernel.config.extra == {}, option


@message
class Cell:
    x: np.float32


def test_a_gpu_ring_kernel_declaration_accepts_placement_options() -> None:
    def handler(inp: Any, out: Any, state: Any) -> int:
        out.x = inp.x
        return 0

    fn = ring_kernel(
        kernel_id="placed_gpu",
        input_type=Cell,
        output_type=Cell,
        backend="cuda",
        auto_register=False,
        num_gpus=1,
    )(handler)
    assert fn is handler


# --- the tier registry and the launch-time checks of the tier contract ------------------------


def _plain_actor(ctx: Any) -> None:
    pass


class _AsyncCallable:
    async def __call__(self, ctx: Any) -> None:
        await ctx.receive()


def test_actor_kind_checks_judge_plain_functions_methods_and_partials() -> None:
    import functools

    from pydotcompute.ring_kernels.tiers import check_actor_kind

    check_actor_kind("k", "asyncio", doubler, "async")
    check_actor_kind("k", "asyncio", functools.partial(doubler), "async")
    check_actor_kind("k", "asyncio", _AsyncCallable(), "async")  # not judged: passes
    check_actor_kind("k", "gpu", _plain_actor, None)  # the tier does not check
    with pytest.raises(TypeValidationError, match=r"the asyncio tier runs async functions"):
        check_actor_kind("k", "asyncio", functools.partial(_plain_actor), "async")
    with pytest.raises(TypeValidationError, match=r"the thread tier runs plain functions"):
        check_actor_kind("k", "thread", doubler, "sync")


async def test_a_plain_def_is_refused_at_launch_and_nothing_is_left(rt: RingKernelRuntime) -> None:
    with pytest.raises(TypeValidationError, match="tier='thread' or tier='process'"):
        await rt.launch("k", _plain_actor)
    assert "k" not in rt
    await rt.launch("k", doubler)  # the id is free


def test_unknown_tiers_are_named_with_the_known_ones() -> None:
    from pydotcompute.ring_kernels.tiers import tier_class, tier_names

    assert {"asyncio", "thread", "process", "gpu"} <= set(tier_names())
    assert tier_class("cython").__name__ == "ProcessHostedKernel"  # an alias
    with pytest.raises(InvalidConfigurationError, match=r"unknown execution tier 'nope'.*'thread'"):
        tier_class("nope")


async def test_a_registered_tier_is_launched_by_name(rt: RingKernelRuntime) -> None:
    from pydotcompute.ring_kernels.kernel import RingKernel
    from pydotcompute.ring_kernels.runtime import register_tier
    from pydotcompute.ring_kernels.tiers import unregister_tier

    class Recording(RingKernel):
        __slots__ = ()

    register_tier("recording", Recording)
    try:
        kernel = await rt.launch("k", doubler, tier="recording")
        assert type(kernel) is Recording
    finally:
        unregister_tier("recording")


def test_a_tier_worker_must_implement_the_whole_contract() -> None:
    from pydotcompute.ring_kernels.tiers.contract import TierWorker

    class Half(TierWorker):
        def start(self) -> None:
            pass

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]


def test_the_thread_worker_hands_back_what_it_never_took_once() -> None:
    import threading

    from pydotcompute.ring_kernels.tiers.thread import ThreadedKernelConfig, ThreadedRingKernel

    release = threading.Event()

    def stuck(ctx: Any) -> None:
        ctx.receive()
        release.wait(5)
        raise ValueError("boom")

    kernel = ThreadedRingKernel("t", stuck, config=ThreadedKernelConfig("t", input_queue_size=8))
    kernel.start()
    for i in range(3):
        kernel.send(Req(x=i))
    release.set()
    assert kernel.join(5)
    # the message it raised on first, then the two it never took; once
    assert [m.x for m in kernel.take_undelivered()] == [0, 1, 2]
    assert kernel.take_undelivered() == []
    assert [m.x for m in kernel.unprocessed()] == [0, 1, 2]
    kernel.stop()


# --- round 4: first-day surprises ------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "hint"),
    [("replica", "replicas"), ("queue_sise", "queue_size"), ("backpresure", "backpressure")],
)
async def test_a_misspelt_option_gets_the_close_match(
    rt: RingKernelRuntime, typo: str, hint: str
) -> None:
    """`replicas` is a launch option like the config's fields: a near miss is named, the
    closest first."""
    with pytest.raises(
        InvalidConfigurationError,
        match=rf"unknown option '{typo}' for kernel 'k' on tier 'asyncio' "
        rf"\(did you mean '{hint}'(?: or '\w+')*\?\); known: \[.*'replicas'",
    ):
        await rt.launch("k", doubler, **{typo: 2})
    assert "k" not in rt


async def test_an_option_like_nothing_known_gets_no_guess(rt: RingKernelRuntime) -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        await rt.launch("k", doubler, colour="red")
    assert "did you mean" not in str(info.value)


async def test_a_runtime_is_true_even_with_no_kernels() -> None:
    """`if runtime:` asks whether there is a runtime, not whether it has kernels (len 0)."""
    rt = RingKernelRuntime()
    assert len(rt) == 0
    assert bool(rt) is True
    async with rt:
        assert rt
        await rt.launch("k", doubler)
        assert len(rt) == 1
        assert rt
    assert len(rt) == 0
    assert rt
