"""Tier 2 specifics: ThreadedRingKernel, its context, and ThreadedKernelPool.

Behaviour shared with the process tier (ordering, drain on stop, failures, bad input) lives
in ``test_tier_behaviour.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.tiers.thread import (
    ThreadedKernelConfig,
    ThreadedKernelPool,
    ThreadedKernelState,
    ThreadedRingKernel,
)
from pydotcompute.ring_kernels.tiers.thread.sync_queue import SPSCQueue, SyncQueue


def doubler(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.1)
        if msg is None:
            continue
        if msg == "boom":
            raise ValueError("boom requested")
        ctx.send(msg * 2)


def tagger(ctx: Any) -> None:
    while True:
        msg = ctx.receive()  # no timeout: the stop must wake it
        ctx.send((ctx.kernel_id, msg))


def test_seed_style_context_manager() -> None:
    with ThreadedRingKernel("worker", doubler) as kernel:
        assert kernel.is_running
        assert kernel.state is ThreadedKernelState.RUNNING
        assert kernel.thread is not None
        assert kernel.thread.name == "pydotcompute-worker"
        kernel.send(21)
        assert kernel.receive(timeout=5) == 42
    assert kernel.state is ThreadedKernelState.STOPPED
    assert not kernel.failed
    assert kernel.error is None


@pytest.mark.parametrize("use_spsc", [True, False], ids=["spsc", "sync"])
def test_queue_kind_follows_config(use_spsc: bool) -> None:
    cfg = ThreadedKernelConfig("q", input_queue_size=8, output_queue_size=16, use_spsc=use_spsc)
    kernel = ThreadedRingKernel("q", doubler, config=cfg)
    kind = SPSCQueue if use_spsc else SyncQueue
    assert isinstance(kernel.inbox, kind)
    assert isinstance(kernel.outbox, kind)
    assert kernel.inbox.maxsize == 8
    assert kernel.outbox.maxsize == 16
    with kernel:
        for i in range(50):
            kernel.send(i, timeout=5)
            assert kernel.receive(timeout=5) == 2 * i


def test_receive_blocked_without_timeout_is_woken_by_a_stop() -> None:
    kernel = ThreadedRingKernel("t", tagger).start()
    out: list[Any] = []

    def waiter() -> None:
        try:
            out.append(kernel.receive())
        except KernelStateError as exc:
            out.append(exc)

    t = threading.Thread(target=waiter, name="test-waiter")
    t.start()
    time.sleep(0.05)
    assert kernel.stop(timeout=5)
    t.join(5)
    assert not t.is_alive()
    assert isinstance(out[0], KernelStateError)
    assert "it has stopped" in str(out[0])


def test_ctx_helpers() -> None:
    seen: dict[str, Any] = {}
    ready = threading.Event()

    def actor(ctx: Any) -> None:
        seen["active_before"] = ctx.is_active
        assert ctx.send_nowait("hello")
        assert ctx.receive_nowait() is None
        ready.set()
        seen["shutdown"] = ctx.wait_shutdown(timeout=10)
        seen["active_after"] = ctx.is_active
        seen["terminate"] = ctx.should_terminate

    with ThreadedRingKernel("h", actor) as kernel:
        assert kernel.receive(timeout=5) == "hello"
        assert ready.wait(5)
    assert seen == {
        "active_before": True,
        "shutdown": True,
        "active_after": False,
        "terminate": True,
    }


def test_stop_timeout_moves_queued_messages_to_unprocessed() -> None:
    release = threading.Event()

    def stuck(ctx: Any) -> None:
        ctx.receive()
        release.wait(10)  # ignores the stop until released

    kernel = ThreadedRingKernel("stuck", stuck).start()
    for i in range(4):
        kernel.send(i)
    time.sleep(0.05)
    assert kernel.stop(timeout=0.1) is False  # still in user code
    assert kernel.state is ThreadedKernelState.STOPPING
    assert kernel.unprocessed() == [1, 2, 3]  # message 0 is with the actor
    release.set()
    assert kernel.join(5)
    assert kernel.state is ThreadedKernelState.STOPPED


def test_stop_is_idempotent_and_a_kernel_runs_once() -> None:
    kernel = ThreadedRingKernel("once", doubler)
    assert kernel.stop() is True  # never started: nothing to wait for
    assert kernel.state is ThreadedKernelState.STOPPED
    with pytest.raises(KernelStateError, match="a kernel runs once"):
        kernel.start()
    k2 = ThreadedRingKernel("twice", doubler).start()
    assert k2.stop()
    assert k2.stop()
    with pytest.raises(KernelStateError, match=r"cannot start kernel 'twice': it is TERMINATED"):
        k2.start()


def test_stop_from_inside_the_actor() -> None:
    holder: list[ThreadedRingKernel] = []

    def self_stopping(ctx: Any) -> None:
        holder[0].stop()
        ctx.send("bye")

    kernel = ThreadedRingKernel("self", self_stopping)
    holder.append(kernel)
    kernel.start()
    assert kernel.join(5)
    assert kernel.receive(timeout=5) == "bye"
    assert kernel.state is ThreadedKernelState.STOPPED


def test_actor_returning_on_its_own_stops_the_kernel() -> None:
    kernel = ThreadedRingKernel("short", lambda ctx: ctx.send("only"))
    with kernel:
        assert kernel.receive(timeout=5) == "only"
        assert kernel.join(5)
        with pytest.raises(KernelStateError, match="it has stopped"):
            kernel.send(1)
        with pytest.raises(KernelStateError, match=r"outbox|stopped"):
            kernel.receive(timeout=1)


def test_failure_reports_the_cause_and_keeps_earlier_replies() -> None:
    kernel = ThreadedRingKernel("f", doubler).start()
    kernel.send(1)
    kernel.send("boom")
    assert kernel.receive(timeout=5) == 2
    with pytest.raises(KernelFailedError, match="ValueError: boom requested") as info:
        kernel.receive(timeout=5)
    assert isinstance(info.value.__cause__, ValueError)
    assert kernel.failed
    assert isinstance(kernel.error, ValueError)
    assert kernel.state is ThreadedKernelState.STOPPED
    with pytest.raises(KernelFailedError):
        kernel.send(3)
    assert kernel.stop()
    assert kernel.statistics()["failed"] is True


def test_output_type_is_checked_in_the_actor() -> None:
    kernel = ThreadedRingKernel("typed", doubler, output_type=str).start()
    kernel.send(2)  # the actor sends 4, an int
    with pytest.raises(KernelFailedError, match=r"kernel 'typed' must send str, got int"):
        kernel.receive(timeout=5)
    kernel.stop()


def test_async_actor_is_refused() -> None:
    async def actor(ctx: Any) -> None:
        pass

    with pytest.raises(TypeValidationError, match=r"runs plain functions, but .* is async"):
        ThreadedRingKernel("a", actor)
    with pytest.raises(TypeValidationError, match="needs a callable actor"):
        ThreadedRingKernel("a", 42)  # type: ignore[arg-type]


def test_config_validation() -> None:
    with pytest.raises(InvalidConfigurationError, match="input_queue_size of kernel 'c'"):
        ThreadedKernelConfig("c", input_queue_size=0)
    with pytest.raises(InvalidConfigurationError, match="kernel_id must be a non-empty string"):
        ThreadedKernelConfig("")
    with pytest.raises(InvalidConfigurationError, match="does not match its config's 'other'"):
        ThreadedRingKernel("c", doubler, config=ThreadedKernelConfig("other"))


def test_wakers_let_an_adapter_wait_without_polling() -> None:
    arrived = threading.Event()
    kernel = ThreadedRingKernel("w", doubler)
    kernel.outbox.add_waker(arrived.set)
    with kernel:
        assert kernel.receive_nowait() is None
        kernel.send_nowait(5)
        assert arrived.wait(5)
        assert kernel.receive_nowait() == 10


# --- pool ------------------------------------------------------------------------------------


def test_pool_round_robin_and_receive_any() -> None:
    with ThreadedKernelPool("p", tagger, num_workers=3) as pool:
        assert len(pool) == 3
        assert [w.kernel_id for w in pool] == ["p_0", "p_1", "p_2"]
        for i in range(9):
            assert pool.send(i, timeout=5)
        got = [pool.receive_any(timeout=5) for _ in range(9)]
        assert sorted(m for _, m in got) == list(range(9))
        per_worker: dict[str, list[int]] = {}
        for wid, m in got:
            per_worker.setdefault(wid, []).append(m)
        assert {k: sorted(v) for k, v in per_worker.items()} == {
            "p_0": [0, 3, 6],
            "p_1": [1, 4, 7],
            "p_2": [2, 5, 8],
        }
    assert all(w.state is ThreadedKernelState.STOPPED for w in pool)


def test_pool_receive_any_waits_on_every_worker() -> None:
    gate = threading.Event()

    def late_last_worker(ctx: Any) -> None:
        msg = ctx.receive()
        if ctx.kernel_id == "late_2":
            gate.wait(10)
            ctx.send(("late", msg))
        ctx.wait_shutdown()

    with ThreadedKernelPool("late", late_last_worker, num_workers=3) as pool:
        for i in range(3):
            pool.send(i)
        assert pool.receive_any(timeout=0.1) is None  # nobody replied yet
        timer = threading.Timer(0.1, gate.set)
        timer.start()
        assert pool.receive_any(timeout=5) == ("late", 2)  # woken by the third worker
        timer.join()


def test_pool_reports_a_failed_worker_once_and_keeps_serving() -> None:
    with ThreadedKernelPool("fp", doubler, num_workers=2) as pool:
        pool.send("boom")  # worker fp_0 fails
        with pytest.raises(KernelFailedError, match="kernel 'fp_0'"):
            pool.receive_any(timeout=5)
        for i in range(4):
            pool.send(i)  # the failed worker is skipped
        assert sorted(pool.receive_any(timeout=5) for _ in range(4)) == [0, 2, 4, 6]


def test_pool_after_stop_and_bad_options() -> None:
    pool = ThreadedKernelPool("s", doubler, num_workers=2, input_queue_size=4)
    assert all(w.config.input_queue_size == 4 for w in pool)
    with pytest.raises(KernelStateError, match="no worker is running"):
        pool.send(1)
    pool.start_all()
    assert pool.stop_all(timeout=5)
    with pytest.raises(KernelStateError, match="every worker has stopped"):
        pool.receive_any(timeout=1)
    with pytest.raises(InvalidConfigurationError, match=r"unknown option\(s\) \['queue'\]"):
        ThreadedKernelPool("s", doubler, queue=3)
    with pytest.raises(InvalidConfigurationError, match="num_workers >= 1"):
        ThreadedKernelPool("s", doubler, num_workers=0)


# --- one mechanism behind both faces ---------------------------------------------------------


def test_the_standalone_kernel_is_a_face_of_the_thread_worker() -> None:
    from pydotcompute.ring_kernels.states import KernelState
    from pydotcompute.ring_kernels.tiers.contract import TierWorker
    from pydotcompute.ring_kernels.tiers.thread import ThreadWorker

    kernel = ThreadedRingKernel("face", doubler)
    worker = kernel.worker
    assert isinstance(worker, ThreadWorker)
    assert isinstance(worker, TierWorker)
    # the 0.2 state names are the shared states
    assert ThreadedKernelState.CREATED is KernelState.CREATED
    assert ThreadedKernelState.RUNNING is KernelState.ACTIVE
    assert ThreadedKernelState.STOPPING is KernelState.TERMINATING
    assert ThreadedKernelState.STOPPED is KernelState.TERMINATED
    assert list(ThreadedKernelState) == [
        KernelState.CREATED,
        KernelState.ACTIVE,
        KernelState.TERMINATING,
        KernelState.TERMINATED,
    ]
    assert ThreadedKernelState["RUNNING"] is KernelState.ACTIVE
    with kernel:
        assert worker.state is KernelState.ACTIVE
        kernel.send(4)
        assert worker.get(timeout=5) == 8  # what one face sends, the other reads
        assert worker.offer(5)
        assert kernel.receive(timeout=5) == 10
    assert worker.state is KernelState.TERMINATED
    assert repr(kernel) == "<ThreadedRingKernel 'face' TERMINATED>"
    assert kernel.statistics()["state"] == "terminated"


def test_the_thread_worker_through_the_tier_contract() -> None:
    from pydotcompute.ring_kernels.tiers.thread import ThreadWorker

    release = threading.Event()
    readable = threading.Event()

    def held(ctx: Any) -> None:
        while not ctx.should_terminate:
            msg = ctx.receive(timeout=0.05)
            if msg is None:
                continue
            if msg == "hold":
                release.wait(10)
            ctx.send(msg)

    worker = ThreadWorker("c", held, config=ThreadedKernelConfig("c", input_queue_size=2))
    undo = worker.on_readable(readable.set)
    worker.start()
    assert worker.poll_reply() is None
    assert worker.offer("a")
    assert readable.wait(5)
    assert worker.poll_reply() == "a"
    undo()
    assert worker.offer("hold")
    deadline = time.monotonic() + 5
    while not worker.inbox.empty or worker.is_idle:  # the actor took "hold"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert worker.offer("b")
    assert worker.offer("c")
    assert not worker.offer("d")  # the bound the runtime set: room for two not yet taken
    assert worker.pending_input == 2
    assert worker.stop(0.05) is False  # cut off: "hold" is in the actor's hands
    assert worker.take_undelivered() == ["b", "c"]
    assert worker.take_undelivered() == []
    with pytest.raises(KernelStateError, match="it is TERMINATING; it is stopping"):
        worker.offer("e")
    release.set()
    assert worker.join(5)
    assert worker.drain_replies() == ["hold"]  # finished late, still readable
    with pytest.raises(KernelStateError, match="it has stopped"):
        worker.poll_reply()
    assert worker.failure is None


def test_the_thread_worker_hands_over_and_polls_in_batches() -> None:
    from pydotcompute.ring_kernels.tiers.thread import ThreadWorker

    go = threading.Event()

    def gated(ctx: Any) -> None:
        go.wait(10)
        while not ctx.should_terminate:
            msg = ctx.receive(timeout=0.05)
            if msg is not None:
                ctx.send(msg * 10)

    cfg = ThreadedKernelConfig("b", input_queue_size=4)
    worker = ThreadWorker("b", gated, config=cfg, input_type=int)
    with pytest.raises(KernelStateError):
        worker.offer_many([1])  # not started
    with pytest.raises(KernelStateError):
        worker.poll_replies(4)  # not started
    worker.start()
    with pytest.raises(TypeValidationError, match="expects int, got str"):
        worker.offer_many(["x", 1])  # the first is wrong: nothing is queued
    assert worker.offer_many([1, 2, "x", 3]) == 2  # the prefix before the wrong one
    assert worker.offer_many([3, 4, 5, 6]) == 2  # room for four not yet taken
    assert worker.offer_many([7]) == 0
    assert worker.pending_input == 4
    assert worker.poll_replies(8) == []
    go.set()
    got: list[int] = []
    deadline = time.monotonic() + 5
    while len(got) < 4:
        assert time.monotonic() < deadline
        got += worker.poll_replies(3)
    assert got == [10, 20, 30, 40]
    assert worker.stop(5)
    with pytest.raises(KernelStateError, match="it has stopped"):
        worker.poll_replies(4)
    with pytest.raises(KernelStateError):
        worker.offer_many([1])


def test_a_thread_that_cannot_start_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    kernel = ThreadedRingKernel("nothread", doubler)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(KernelFailedError, match="can't start new thread"):
        kernel.start()
    monkeypatch.undo()
    assert kernel.state is ThreadedKernelState.STOPPED
    assert kernel.failed
    with pytest.raises(KernelFailedError):
        kernel.send(1)
    assert kernel.stop() is True


def test_old_module_paths_name_the_same_objects() -> None:
    from pydotcompute.ring_kernels import sync_queue, threaded_kernel
    from pydotcompute.ring_kernels import tiers as tiers_pkg
    from pydotcompute.ring_kernels.tiers import thread

    assert threaded_kernel.ThreadedRingKernel is thread.ThreadedRingKernel
    assert threaded_kernel.ThreadedKernelState is thread.ThreadedKernelState
    assert threaded_kernel.ThreadedKernelContext is thread.ThreadedKernelContext
    assert sync_queue.SPSCQueue is thread.SPSCQueue
    assert sync_queue.SyncQueue is thread.SyncQueue
    assert tiers_pkg.tier_class("thread") is thread.ThreadHostedKernel
    assert ThreadedRingKernel is thread.ThreadedRingKernel


# -- a caller's reply, handed straight to it (`TierWorker.hand_replies_to_callers`) -----------


def _answerer(ctx: Any) -> None:
    while True:
        msg = ctx.receive()
        ctx.send(_Answer(n=msg.n))


def _message_classes() -> tuple[Any, Any]:
    from pydotcompute import message

    @message
    class _AskT:
        n: int

    @message
    class _AnswerT:
        n: int

    return _AskT, _AnswerT


_Ask, _Answer = _message_classes()


def _replies_within(worker: Any, delivered: list[Any], n: int) -> list[Any]:
    polled: list[Any] = []
    deadline = time.monotonic() + 5
    while len(polled) + len(delivered) < n:
        assert time.monotonic() < deadline, (polled, delivered)
        polled += worker.poll_replies(8)
        time.sleep(0.001)
    return polled


def test_a_callers_reply_is_handed_to_deliver_and_the_rest_to_the_outbox() -> None:
    from pydotcompute.ring_kernels.message import reply_key, request_key
    from pydotcompute.ring_kernels.tiers.thread import ThreadWorker

    waiters: dict[Any, Any] = {}
    delivered: list[Any] = []
    keys: list[Any] = []

    def deliver(reply: Any, key: Any) -> None:
        delivered.append(reply)
        keys.append(key)

    worker = ThreadWorker("cb", _answerer)
    assert worker.hand_replies_to_callers(waiters, deliver) is True
    worker.start()
    try:
        # armed before the start only: the context is built once
        assert worker.hand_replies_to_callers(waiters, deliver) is False
        asked, plain = _Ask(n=1), _Ask(n=2)
        waiters[request_key(asked)] = object()  # a caller waits for this one's reply
        worker.put(asked)
        worker.put(plain)
        polled = _replies_within(worker, delivered, 2)
        assert [r.n for r in delivered] == [1]
        assert keys == [reply_key(delivered[0])] == [request_key(asked)]
        assert [r.n for r in polled] == [2]  # nobody waits for it: the outbox, as before
    finally:
        worker.stop(5)


def test_a_reply_deliver_cannot_take_goes_to_the_outbox() -> None:
    from pydotcompute.ring_kernels.message import request_key
    from pydotcompute.ring_kernels.tiers.thread import ThreadWorker

    def closed(reply: Any, key: Any) -> None:
        raise RuntimeError("Event loop is closed")

    waiters: dict[Any, Any] = {}
    worker = ThreadWorker("cb2", _answerer)
    worker.hand_replies_to_callers(waiters, closed)
    worker.start()
    try:
        asked = _Ask(n=7)
        waiters[request_key(asked)] = object()
        worker.put(asked)
        assert [r.n for r in _replies_within(worker, [], 1)] == [7]  # not lost
    finally:
        worker.stop(5)


async def test_the_thread_tier_answers_callers_without_its_outbox() -> None:
    """Through the runtime: each caller gets its own reply while the kernel's outbox
    carries none of them, and a plain ``send``'s reply still waits there, in order."""
    from pydotcompute import RingKernelRuntime

    async with RingKernelRuntime() as rt:
        await rt.launch("t", _answerer, input_type=_Ask, output_type=_Answer, tier="thread")
        await rt.activate("t")
        got = await asyncio.gather(
            *(rt.send_and_receive("t", _Ask(n=i), timeout=10) for i in range(50))
        )
        assert [r.n for r in got] == list(range(50))
        worker = rt.get_kernel("t").worker
        assert worker is not None
        assert worker.outbox.statistics()["total_enqueued"] == 0
        await rt.send("t", _Ask(n=99))
        assert (await rt.receive("t", timeout=10)).n == 99
        assert rt.get_kernel("t").pending_requests == 0


def test_offer_passes_urgent_messages_ahead_of_what_the_actor_holds() -> None:
    """The bridge's hand-over (`offer`, `offer_many`): priority 160 and up goes into the
    urgent lane, taken before the batch handed over earlier; each band keeps its order,
    and `put` (the standalone kernel's send) stays one FIFO."""
    from pydotcompute import message
    from pydotcompute.ring_kernels.tiers.thread.worker import ThreadWorker

    @message
    class Urg:
        seq: int

    go = threading.Event()
    taken: list[int] = []

    def actor(ctx: Any) -> None:
        go.wait(5.0)
        while not ctx.should_terminate:
            msg = ctx.receive(timeout=0.05)
            if msg is not None:
                taken.append(msg.seq)

    worker = ThreadWorker("urgent-lane", actor)
    worker.start()
    try:
        assert worker.offer_many([Urg(seq=i, priority=10) for i in range(5)]) == 5
        assert worker.offer(Urg(seq=100, priority=200))
        batch = [Urg(seq=101, priority=250), Urg(seq=102, priority=170)]
        batch += [Urg(seq=i, priority=10) for i in range(5, 8)]
        assert worker.offer_many(batch) == 5
        assert worker.put(Urg(seq=103, priority=255))  # `put`: behind everything
        assert worker.pending_input == 12
        go.set()
        deadline = time.monotonic() + 5.0
        while len(taken) < 12:
            assert time.monotonic() < deadline, taken
            time.sleep(0.01)
    finally:
        worker.stop(timeout=2.0)
    assert taken == [100, 101, 102, 0, 1, 2, 3, 4, 5, 6, 7, 103]


def test_a_hosted_thread_worker_keeps_its_spsc_inbox() -> None:
    """The runtime's thread worker promises an urgent lane, which only the SPSC inbox
    has: a config asking for the other queue is refused, naming the option."""
    from pydotcompute.ring_kernels.tiers.thread.hosted import HostedThreadWorker

    cfg = ThreadedKernelConfig("k", use_spsc=False)
    with pytest.raises(InvalidConfigurationError, match="use_spsc"):
        HostedThreadWorker("k", lambda ctx: None, config=cfg)
    assert HostedThreadWorker.CAPABILITIES.urgent_lane
