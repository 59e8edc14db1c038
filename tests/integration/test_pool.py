"""Worker pools (`launch(..., replicas=N)`) on the asyncio, thread and process tiers.

The tier contract's scenarios run again with `replicas=2` (a pool is one kernel to the
runtime, so every promise holds as for one kernel), then what is particular to pools:
both replicas work, telemetry per replica sums to the pool's, the lifecycle and
`connect` act on the pool as a whole, supervision per replica, and the refusal on tiers
that cannot run a pool. Run again with `PYDOTCOMPUTE_PUREPYTHON=1` for the process tier
on the pure-Python ring.

Actors are module-level so that a child process can import them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime, message, ring_kernel
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    QueueClosedError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import KernelState, RingKernel
from pydotcompute.ring_kernels.registry import unregister_ring_kernel
from pydotcompute.ring_kernels.tiers import register_tier, unregister_tier
from tests import tier_scenarios as sc

BOUND_S = sc.BOUND_S

ASYNCIO_POOL = sc.TierCase("asyncio", sc.echo_async, sc.plain_def_actor, (("replicas", 2),))
THREAD_POOL = sc.TierCase("thread", sc.echo_sync, sc.echo_async, (("replicas", 2),))
PROCESS_POOL = sc.TierCase("process", sc.echo_sync, sc.echo_async, (("replicas", 2),))

CASES = [
    pytest.param(ASYNCIO_POOL, id="asyncio"),
    pytest.param(THREAD_POOL, id="thread"),
    pytest.param(PROCESS_POOL, id="process"),
]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> sc.TierCase:
    return request.param  # type: ignore[no-any-return]


# --- actors that say which replica answered -----------------------------------------------


@message
class Work:
    seq: int
    pause: float = 0.0
    boom: bool = False


@message
class Who:
    seq: int
    worker: str


async def who_async(ctx: Any) -> None:
    me = f"task-{id(asyncio.current_task())}"
    while not ctx.should_terminate:
        job = await ctx.receive()
        if job.boom:
            raise ValueError(f"boom at {job.seq}")
        await asyncio.sleep(job.pause)
        await ctx.send(Who(seq=job.seq, worker=me))


def who_sync(ctx: Any) -> None:
    me = f"{os.getpid()}-{threading.get_ident()}"
    while not ctx.should_terminate:
        try:
            job = ctx.receive(timeout=0.05)
        except QueueClosedError:
            return
        if job is None:
            continue
        if job.boom:
            raise ValueError(f"boom at {job.seq}")
        if job.pause:
            time.sleep(job.pause)
        ctx.send(Who(seq=job.seq, worker=me))


def _who(case: sc.TierCase) -> Any:
    return who_async if case.name == "asyncio" else who_sync


async def _launch_who(
    rt: RingKernelRuntime, case: sc.TierCase, kid: str = "p", **opts: Any
) -> None:
    await rt.launch(
        kid, _who(case), input_type=Work, output_type=Who, tier=case.name, **case.opts(**opts)
    )
    await rt.activate(kid)


# --- the contract's scenarios, on a pool ----------------------------------------------------
# Not repeated here: the bridge-bound scenario (it counts on one actor holding one message
# while nothing else moves; a second replica keeps working) and the wrong-actor-kind one
# (it launches without the case's options). Drop-oldest and abandoned replies have pool
# versions below: a pool's replies come in completion order.


async def test_terminate_with_unread_replies(case: sc.TierCase) -> None:
    await sc.scenario_terminate_with_unread_replies(case)


async def test_forward_into_full_kernel_at_terminate(case: sc.TierCase) -> None:
    await sc.scenario_forward_into_full_kernel_at_terminate(case)


async def test_message_in_hand_at_grace_end(case: sc.TierCase) -> None:
    await sc.scenario_message_in_hand_at_grace_end(case)


async def test_answered_message_in_hand_is_not_handed_back(case: sc.TierCase) -> None:
    await sc.scenario_answered_message_in_hand_is_not_handed_back(case)


async def test_forward_into_reject_inbox(case: sc.TierCase) -> None:
    await sc.scenario_forward_into_reject_inbox(case)


async def test_failure_reports_each_message_once(case: sc.TierCase) -> None:
    await sc.scenario_failure_reports_each_message_once(case)


async def test_leave_scope_mid_pipeline(case: sc.TierCase) -> None:
    await sc.scenario_leave_scope_mid_pipeline(case)


async def test_abandoned_replies_do_not_wedge(case: sc.TierCase) -> None:
    """As the contract's scenario; a free replica may answer the last request before the
    other has finished an abandoned one, so the drops are awaited (bounded)."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await sc._launch(rt, case, input_queue_size=64, output_queue_size=2)
        for i in range(6):
            with contextlib.suppress(QueueTimeoutError):
                await rt.send_and_receive("k", sc.Job(seq=i, payload="sleep:0.02"), timeout=0.005)
        reply = await rt.send_and_receive("k", sc.Job(seq=99), timeout=10)
        assert reply.seq == 99
        deadline = time.monotonic() + 10
        while rt.get_telemetry("k").messages_dropped < 6:
            assert time.monotonic() < deadline, rt.get_telemetry("k").messages_dropped
            await asyncio.sleep(0.01)
        assert rt.receive_nowait("k") is None  # no stale reply left in the outbox
        assert rt.get_telemetry("k").messages_dropped == 6
        assert rt.get_kernel_state("k") is KernelState.ACTIVE


async def test_cancel_send_and_receive_loops(case: sc.TierCase) -> None:
    await sc.scenario_cancel_send_and_receive_loops(case)


async def test_request_loop_lets_other_tasks_run(case: sc.TierCase) -> None:
    await sc.scenario_request_loop_lets_other_tasks_run(case)


async def test_receive_on_launched_kernel(case: sc.TierCase) -> None:
    await sc.scenario_receive_on_launched_kernel(case)


async def test_restart_on_failure(case: sc.TierCase) -> None:
    await sc.scenario_restart_on_failure(case)


@pytest.mark.parametrize("serialize", [False, True], ids=["objects", "serialized"])
async def test_bad_field_is_not_a_poison_pill(case: sc.TierCase, serialize: bool) -> None:
    await sc.scenario_bad_field_is_not_a_poison_pill(case, serialize=serialize)


async def test_priority_not_starved(case: sc.TierCase) -> None:
    if case.name == "asyncio":
        pytest.skip("the asyncio tier serves its banded inbox directly")
    await sc.scenario_priority_not_starved(case)


async def test_oversized_message_refused_at_send(case: sc.TierCase) -> None:
    await sc.scenario_oversized_message(case)


async def test_pipeline_exactly_once(case: sc.TierCase) -> None:
    await sc.scenario_pipeline_exactly_once(case)


async def test_drop_oldest_counted(case: sc.TierCase) -> None:
    """As the contract's scenario, but a pool's replies come in completion order."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await sc._launch(rt, case, activate=False, queue_size=8, backpressure="drop_oldest")
        for i in range(100):
            await rt.send("k", sc.Job(seq=i))
        assert rt.get_telemetry("k").messages_dropped == 92
        await rt.activate("k")
        read = [(await rt.receive("k", timeout=10)).seq for _ in range(8)]
        assert sorted(read) == list(range(92, 100))
        assert rt.get_telemetry("k").messages_dropped == 92


# --- what is particular to pools ----------------------------------------------------------


async def test_pool_is_one_kernel_of_the_tier(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        kernel = rt.get_kernel("p")
        assert isinstance(kernel, RingKernel)
        assert kernel.replicas == 2  # type: ignore[attr-defined]
        assert rt.kernel_ids == ["p"]
        assert len(rt.get_replica_telemetry("p")) == 2


async def test_every_replica_serves_under_concurrent_send_and_receive(
    case: sc.TierCase,
) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        replies = await asyncio.gather(
            *(rt.send_and_receive("p", Work(seq=i, pause=0.01), timeout=20) for i in range(40))
        )
        # each caller got the reply to its own request
        assert [r.seq for r in replies] == list(range(40))
        assert len({r.worker for r in replies}) == 2, {r.worker for r in replies}


async def test_telemetry_per_replica_sums_to_the_pool(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        await asyncio.gather(
            *(rt.send_and_receive("p", Work(seq=i, pause=0.005), timeout=20) for i in range(30))
        )
        total = rt.get_telemetry("p")
        per = rt.get_replica_telemetry("p")
        assert total.messages_processed == 30
        assert total.messages_sent == 30
        assert sum(t.messages_processed for t in per) == 30
        assert sum(t.messages_sent for t in per) == 30
        assert all(t.messages_processed > 0 for t in per), [t.messages_processed for t in per]
        assert [t.kernel_id for t in per] == ["p[0]", "p[1]"]


async def test_deactivate_holds_every_replica(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        await rt.deactivate("p")
        for i in range(10):
            await rt.send("p", Work(seq=i))
        await asyncio.sleep(0.3)
        assert rt.receive_nowait("p") is None
        await rt.reactivate("p")
        got = sorted([(await rt.receive("p", timeout=10)).seq for _ in range(10)])
        assert got == list(range(10))
        assert rt.get_kernel_state("p") is KernelState.ACTIVE


async def relay_who(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(msg)


async def test_connect_into_and_out_of_a_pool(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("front", relay_who, input_type=Work, output_type=Work)
        await _launch_who(rt, case)
        await rt.launch("back", relay_who, input_type=Who, output_type=Who)
        for kid in ("front", "back"):
            await rt.activate(kid)
        rt.connect("front", "p")
        rt.connect("p", "back")
        for i in range(50):
            await rt.send("front", Work(seq=i, pause=0.002))
        got = [await rt.receive("back", timeout=10) for _ in range(50)]
        assert sorted(r.seq for r in got) == list(range(50))
        assert len({r.worker for r in got}) == 2
        report = await rt.shutdown()
        assert report == {}


async def test_terminate_hands_back_each_queued_message_once(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        opts = {} if case.name == "asyncio" else {"bridge_queue_size": 4}
        await _launch_who(rt, case, **opts)
        for i in range(200):
            await rt.send("p", Work(seq=i, pause=0.02))
        await asyncio.sleep(0.1)  # both replicas hold a message; the rest is queued
        left = await rt.terminate("p", timeout=0.2)
        read = sc._read_all(rt, "p")
        seqs = [m.seq for m in left]
        assert len(left) > 100  # most never ran
        sc.assert_exactly_once(list(range(200)), read, seqs, rt.get_telemetry("p").messages_dropped)


async def test_a_failing_replica_fails_the_pool_without_restart(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        pending = [
            asyncio.create_task(rt.send_and_receive("p", Work(seq=i, pause=0.05), timeout=20))
            for i in range(1, 6)
        ]
        await asyncio.sleep(0.02)
        with pytest.raises(KernelFailedError):
            await rt.send_and_receive("p", Work(seq=0, boom=True), timeout=20)
        deadline = time.monotonic() + 10
        while rt.get_kernel_state("p") is not KernelState.FAILED:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        results = await asyncio.gather(*pending, return_exceptions=True)
        answered = [r.seq for r in results if not isinstance(r, BaseException)]
        for r in results:
            assert not isinstance(r, BaseException) or isinstance(r, KernelFailedError), r
        with pytest.raises(KernelFailedError):
            await rt.send("p", Work(seq=99))
        await rt.terminate("p")
        undelivered = [m.seq for m in rt.get_kernel("p").undelivered]
        assert undelivered[:1] == [0]  # the message it raised on comes back first
        read = sc._read_all(rt, "p")
        sc.assert_exactly_once(
            list(range(6)),
            answered + read,
            undelivered,
            rt.get_telemetry("p").messages_dropped,
        )


async def test_asyncio_replica_restarts_alone() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, ASYNCIO_POOL, restart="on_failure", max_restarts=1)
        slow = asyncio.create_task(rt.send_and_receive("p", Work(seq=1, pause=0.2), timeout=10))
        await asyncio.sleep(0.02)  # one replica holds message 1
        with pytest.raises(KernelFailedError, match="restart 1 of 1"):
            await rt.send_and_receive("p", Work(seq=0, boom=True), timeout=10)
        assert (await slow).seq == 1  # the other replica was not disturbed
        per = rt.get_replica_telemetry("p")
        assert sorted(t.restarts for t in per) == [0, 1]
        assert rt.get_telemetry("p").restarts == 1
        assert rt.get_telemetry("p").error_count == 1
        # each replica may restart max_restarts times: a second boom on the other one
        # (the restarted replica is the free one; keep it busy)
        busy = asyncio.create_task(rt.send_and_receive("p", Work(seq=2, pause=0.3), timeout=10))
        await asyncio.sleep(0.05)
        with pytest.raises(KernelFailedError):
            await rt.send_and_receive("p", Work(seq=3, boom=True), timeout=10)
        with contextlib.suppress(KernelFailedError):
            await busy
        assert rt.get_telemetry("p").error_count == 2


# --- options and refusals -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True])
async def test_replicas_must_be_a_positive_int(bad: Any) -> None:
    async with RingKernelRuntime() as rt:
        with pytest.raises(InvalidConfigurationError, match=r"replicas must be an int >= 1"):
            await rt.launch("k", sc.echo_async, replicas=bad)
        assert "k" not in rt


@pytest.mark.parametrize("replicas", [1, None])
async def test_one_replica_is_a_plain_kernel(replicas: int | None) -> None:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch("k", sc.echo_async, replicas=replicas)
        assert type(kernel) is RingKernel
        assert rt.get_replica_telemetry("k") == [rt.get_telemetry("k")]


async def test_ring_kernel_decorator_takes_replicas() -> None:
    @ring_kernel(kernel_id="pool_decorated", input_type=Work, output_type=Who, replicas=3)
    async def pool_decorated(ctx: Any) -> None:
        await who_async(ctx)

    try:
        async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
            kernel = await rt.launch("pool_decorated")
            assert kernel.replicas == 3  # type: ignore[attr-defined]
            await rt.activate("pool_decorated")
            reply = await rt.send_and_receive("pool_decorated", Work(seq=7), timeout=10)
            assert reply.seq == 7
        async with RingKernelRuntime() as rt:  # an explicit option wins
            kernel = await rt.launch("pool_decorated", replicas=1)
            assert type(kernel) is RingKernel
    finally:
        unregister_ring_kernel("pool_decorated")


class _OwnKernel(RingKernel):
    """A tier that is neither the asyncio tier nor hosted: cannot be pooled."""

    __slots__ = ()


async def test_a_tier_that_cannot_pool_refuses_at_launch() -> None:
    register_tier("own", _OwnKernel)
    try:
        async with RingKernelRuntime() as rt:
            with pytest.raises(
                InvalidConfigurationError,
                match=r"replicas=2 is not supported on the own tier.*asyncio, thread or process",
            ):
                await rt.launch("k", sc.echo_async, tier="own", replicas=2)
            assert "k" not in rt
    finally:
        unregister_tier("own")


async def test_the_gpu_tier_refuses_replicas() -> None:
    async with RingKernelRuntime() as rt:
        with pytest.raises(InvalidConfigurationError, match=r"gpu"):
            await rt.launch("k", sc.echo_async, tier="gpu", replicas=2)
        assert "k" not in rt


async def test_a_pool_started_twice_is_refused(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        with pytest.raises(KernelStateError, match="already active"):
            await rt.activate("p")


async def test_asyncio_pool_latency_is_the_replicas_together() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, ASYNCIO_POOL)
        await asyncio.gather(
            *(rt.send_and_receive("p", Work(seq=i, pause=0.002), timeout=20) for i in range(20))
        )
        await rt.send_and_receive("p", Work(seq=99), timeout=20)  # the last one is timed
        total = rt.get_telemetry("p")
        per = rt.get_replica_telemetry("p")
        timed = [t for t in per if t.histogram.count]
        assert len(timed) == 2
        assert total.histogram.count == sum(t.histogram.count for t in per)
        assert total.total_latency_ns == sum(t.total_latency_ns for t in per)
        assert total.max_latency_ns == max(t.max_latency_ns for t in timed)
        assert total.min_latency_ns == min(t.min_latency_ns for t in timed)
        assert total.p50_latency_ns > 0


@pytest.mark.parametrize("pool_case", [ASYNCIO_POOL, THREAD_POOL], ids=["asyncio", "thread"])
async def test_wait_until_idle_waits_for_every_replica(pool_case: sc.TierCase) -> None:
    from pydotcompute.testing import wait_until_idle

    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, pool_case)
        for i in range(10):
            await rt.send("p", Work(seq=i, pause=0.02))
        await wait_until_idle(rt, timeout=20)
        got = sorted(r.seq for r in iter(lambda: rt.receive_nowait("p"), None))
        assert got == list(range(10))


async def test_pool_routes_around_a_returned_replica(case: sc.TierCase) -> None:
    await sc.scenario_pool_routes_around_a_returned_replica(case)


# --- broadcast: every replica gets its own copy ---------------------------------------------


async def test_broadcast_reaches_every_replica(case: sc.TierCase) -> None:
    await sc.scenario_broadcast_reaches_every_replica(case)


async def test_broadcast_accounted_at_terminate(case: sc.TierCase) -> None:
    await sc.scenario_broadcast_accounted_at_terminate(case)


def _by_worker(replies: list[Any]) -> dict[str, list[int]]:
    """The seqs each replica answered, in the order it answered them."""
    seen: dict[str, list[int]] = {}
    for r in replies:
        seen.setdefault(r.worker, []).append(r.seq)
    return seen


async def test_broadcast_goes_ahead_of_queued_normal_messages(case: sc.TierCase) -> None:
    """Each replica, busy with one message while NORMAL ones queue up, takes its copy of a
    HIGH broadcast next (hosted tiers: behind at most the message already handed to it
    and the one the bridge holds)."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        hosted = case.name != "asyncio"
        await _launch_who(rt, case, **({"bridge_queue_size": 2} if hosted else {}))
        for i in range(2):
            await rt.send("p", Work(seq=i, pause=0.3))
        await asyncio.sleep(0.1)  # each replica holds one
        for i in range(2, 30):
            await rt.send("p", Work(seq=i))
        assert await rt.broadcast("p", Work(seq=999, priority=200)) == 2
        seen = _by_worker([await rt.receive("p", timeout=10) for _ in range(32)])
        assert len(seen) == 2, seen
        allowed = 3 if hosted else 1
        for worker, seqs in seen.items():
            assert seqs.count(999) == 1, (worker, seqs)
            assert seqs.index(999) <= allowed, (worker, seqs)
        assert sorted(s for seqs in seen.values() for s in seqs if s != 999) == list(range(30))


async def test_broadcast_to_an_idle_pool_many_times(case: sc.TierCase) -> None:
    """Back-to-back broadcasts to idle replicas with a fast handler: each replica answers
    each broadcast once, and no copy is put back into the inbox more than needed."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        rounds = 40
        for r in range(rounds):
            assert await rt.broadcast("p", Work(seq=r)) == 2
            if r % 10 == 9:
                await asyncio.sleep(0.01)  # let them go idle again
        seen = _by_worker([await rt.receive("p", timeout=10) for _ in range(2 * rounds)])
        assert len(seen) == 2, seen
        for worker, seqs in seen.items():
            assert sorted(seqs) == list(range(rounds)), (worker, seqs)
        assert rt.receive_nowait("p") is None
        tel = rt.get_telemetry("p")
        assert tel.messages_dropped == 0
        assert tel.messages_processed == 2 * rounds


async def test_broadcast_skips_a_replica_that_returned(case: sc.TierCase) -> None:
    """A replica whose actor function returned is not counted as reached and gets no
    copy; the running one still does."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch(
            "k",
            sc._returning_actor(case),
            input_type=sc.Job,
            output_type=sc.Done,
            tier=case.name,
            **case.opts(queue_size=64),
        )
        await rt.activate("k")
        kernel: Any = rt.get_kernel("k")
        assert kernel.running_replicas == 2
        await rt.send("k", sc.Job(seq=0, payload="return:0"))
        deadline = time.monotonic() + BOUND_S
        while kernel.running_replicas != 1:
            assert time.monotonic() < deadline, "the returned replica was never noticed"
            await asyncio.sleep(0.01)
        assert await rt.broadcast("k", sc.Job(seq=7), timeout=10) == 1
        assert (await rt.receive("k", timeout=10)).seq == 7
        assert (await rt.send_and_receive("k", sc.Job(seq=8), timeout=10)).seq == 8
        assert rt.receive_nowait("k") is None
        assert rt.get_telemetry("k").messages_dropped == 0
        assert await rt.terminate("k") == []


async def test_broadcast_replies_correlate(case: sc.TierCase) -> None:
    """Each copy has its own message_id, so a reply names the copy it answers; the
    original message is not sent itself."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        msg = Work(seq=5)
        assert await rt.broadcast("p", msg) == 2
        replies = [await rt.receive("p", timeout=10) for _ in range(2)]
        ids = {r.correlation_id for r in replies}
        assert len(ids) == 2
        assert msg.message_id not in ids


async def test_broadcast_into_a_connected_pool_forwards_each_reply(case: sc.TierCase) -> None:
    """Replies to a broadcast go where the pool's replies go: into the kernel it is
    connected to."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        await rt.launch("back", relay_who, input_type=Who, output_type=Who)
        await rt.activate("back")
        rt.connect("p", "back")
        assert await rt.broadcast("p", Work(seq=3)) == 2
        got = [await rt.receive("back", timeout=10) for _ in range(2)]
        assert [r.seq for r in got] == [3, 3]
        assert len({r.worker for r in got}) == 2
        assert rt.receive_nowait("p") is None


async def test_broadcast_honours_backpressure(case: sc.TierCase) -> None:
    """``reject`` needs room for every copy (nothing is sent otherwise); ``block`` waits
    for room for the first copy up to ``timeout``."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case, "r", queue_size=4, backpressure="reject")
        await rt.deactivate("r")
        for i in range(3):
            await rt.send("r", Work(seq=i))
        with pytest.raises(QueueFullError, match="room for 2 copies"):
            await rt.broadcast("r", Work(seq=9))
        assert len(rt.get_kernel("r").inbox) == 3  # nothing of it went in
        await _launch_who(rt, case, "b", queue_size=2)
        await rt.deactivate("b")
        for i in range(2):
            await rt.send("b", Work(seq=i))
        with pytest.raises(QueueTimeoutError):
            await rt.broadcast("b", Work(seq=9), timeout=0.05)
        assert len(rt.get_kernel("b").inbox) == 2
        await rt.reactivate("b")
        assert await rt.broadcast("b", Work(seq=9), timeout=10) == 2
        seqs = sorted([(await rt.receive("b", timeout=10)).seq for _ in range(4)])
        assert seqs == [0, 1, 9, 9]


async def test_broadcast_refusals(case: sc.TierCase) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, case)
        with pytest.raises(TypeValidationError):
            await rt.broadcast("p", sc.Job(seq=1))  # not the pool's input_type
        with pytest.raises(InvalidConfigurationError, match="timeout"):
            await rt.broadcast("p", Work(seq=1), timeout=float("nan"))
        with pytest.raises(KernelNotFoundError):
            await rt.broadcast("nope", Work(seq=1))
        await rt.terminate("p")
        with pytest.raises(KernelStateError):
            await rt.broadcast("p", Work(seq=1))


async def test_asyncio_copy_kept_for_a_busy_replica_is_handed_back() -> None:
    """On the asyncio tier a copy taken by the replica that already had one is kept for
    the busy replica owed it: taken by it next, or handed back by terminate, once."""
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, ASYNCIO_POOL)
        busy = asyncio.create_task(rt.send_and_receive("p", Work(seq=0, pause=5), timeout=20))
        await asyncio.sleep(0.05)  # one replica is busy for a long time
        assert await rt.broadcast("p", Work(seq=999)) == 2
        first = await rt.receive("p", timeout=10)  # the free replica answers its copy
        assert first.seq == 999
        await asyncio.sleep(0.05)
        assert rt.receive_nowait("p") is None  # the other copy waits for the busy replica
        assert not rt.get_kernel("p").is_idle
        left = [m.seq for m in await rt.terminate("p", timeout=0.05)]
        with contextlib.suppress(KernelStateError):
            await busy
        assert sorted(left) == [0, 999], left
        assert rt.get_telemetry("p").messages_dropped == 2
        assert sum(t.messages_processed for t in rt.get_replica_telemetry("p")) == 1


async def test_asyncio_copy_kept_for_a_busy_replica_is_taken_next() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _launch_who(rt, ASYNCIO_POOL)
        await rt.send("p", Work(seq=0, pause=0.3))
        await asyncio.sleep(0.05)
        for i in range(1, 10):
            await rt.send("p", Work(seq=i, priority=100))
        assert await rt.broadcast("p", Work(seq=999, priority=120)) == 2
        seen = _by_worker([await rt.receive("p", timeout=10) for _ in range(12)])
        slow = next(seqs for seqs in seen.values() if seqs[0] == 0)
        assert slow[1] == 999, slow  # the copy kept for it comes next
        assert all(seqs.count(999) == 1 for seqs in seen.values()), seen
