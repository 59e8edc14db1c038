"""One behavioural suite for tier 2 (threads) and tier 3 (child processes).

The same messages, ordering, shutdown and failure expectations hold for
``ThreadedRingKernel`` and ``CythonRingKernel``; only construction differs (the ``make``
fixture). Tier 1 runs the same expectations through the runtime in
``tests/integration/test_runtime_tiers.py``. Neither tier reorders by priority: both are
FIFO, which the suite pins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pydotcompute import message
from pydotcompute.exceptions import (
    KernelFailedError,
    KernelStateError,
    QueueClosedError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.tiers.process.kernel import CythonKernelConfig, CythonRingKernel
from pydotcompute.ring_kernels.tiers.thread import ThreadedKernelConfig, ThreadedRingKernel


@message
class Job:
    seq: int
    payload: str = ""
    sender: int = 0


@message
class Done:
    seq: int
    sender: int = 0


# --- actors (module level: the process tier imports them in the child) ----------------------


def echo(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is None:
            continue
        if job.payload == "boom":
            raise ValueError(f"boom at {job.seq}")
        if job.payload == "sleep":
            time.sleep(2)  # ignores a stop meanwhile (a thread cannot be interrupted)
        ctx.send(Done(seq=job.seq, sender=job.sender))


def echo_blocking(ctx: Any) -> None:
    while True:
        job = ctx.receive()  # no timeout: the stop must wake it
        ctx.send(Done(seq=job.seq, sender=job.sender))


def slow_echo(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is not None:
            time.sleep(0.002)
            ctx.send(Done(seq=job.seq))


def counts_until_terminate(ctx: Any) -> None:
    n = 0
    while not ctx.should_terminate:
        try:
            job = ctx.receive(timeout=0.05)
        except QueueClosedError:  # the stop landed between the check and the receive
            break
        if job is not None:
            n += 1
    ctx.send(Done(seq=n))  # after the drain: every queued job was seen


# --- the tiers -------------------------------------------------------------------------------

Make = Callable[..., Any]


def _make_thread(kid: str, fn: Any, *, queue: int = 1024, **kw: Any) -> ThreadedRingKernel:
    cfg = ThreadedKernelConfig(kid, input_queue_size=queue, output_queue_size=max(queue, 1024))
    return ThreadedRingKernel(kid, fn, config=cfg, **kw)


def _make_process(kid: str, fn: Any, *, queue: int = 1024, **kw: Any) -> CythonRingKernel:
    cfg = CythonKernelConfig(kid, input_queue_size=queue, output_queue_size=max(queue, 1024))
    return CythonRingKernel(kid, fn, config=cfg, **kw)


@pytest.fixture(params=[_make_thread, _make_process], ids=["thread", "process"])
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    made: list[Any] = []

    def factory(kid: str, fn: Any, **kw: Any) -> Any:
        kernel = request.param(kid, fn, **kw)
        made.append(kernel)
        return kernel

    yield factory
    for kernel in made:
        kernel.stop(timeout=5)


# --- ordering --------------------------------------------------------------------------------


def test_replies_arrive_in_order(make: Make) -> None:
    with make("k", echo) as kernel:
        for i in range(300):
            assert kernel.send(Job(seq=i), timeout=10)
        assert [kernel.receive(timeout=30).seq for _ in range(300)] == list(range(300))


def test_fifo_regardless_of_priority(make: Make) -> None:
    with make("k", echo) as kernel:
        for i, prio in enumerate([10, 250, 128, 0, 200]):
            kernel.send(Job(seq=i, priority=prio))
        assert [kernel.receive(timeout=30).seq for _ in range(5)] == [0, 1, 2, 3, 4]


def test_interleaved_request_reply(make: Make) -> None:
    with make("k", echo) as kernel:
        for i in range(200):
            kernel.send(Job(seq=i))
            assert kernel.receive(timeout=30).seq == i


def test_concurrent_senders_keep_their_own_order(make: Make) -> None:
    with make("k", echo) as kernel:
        senders, per = 4, 100

        def send_all(s: int) -> None:
            for i in range(per):
                assert kernel.send(Job(seq=i, sender=s), timeout=30)

        threads = [threading.Thread(target=send_all, args=(s,)) for s in range(senders)]
        for t in threads:
            t.start()
        got = [kernel.receive(timeout=30) for _ in range(senders * per)]
        for t in threads:
            t.join(30)
        for s in range(senders):
            assert [d.seq for d in got if d.sender == s] == list(range(per))


def test_backpressure_with_a_small_inbox(make: Make) -> None:
    with make("k", slow_echo, queue=2) as kernel:
        got: list[int] = []
        t = threading.Thread(
            target=lambda: got.extend(kernel.receive(timeout=30).seq for _ in range(100))
        )
        t.start()
        for i in range(100):
            assert kernel.send(Job(seq=i), timeout=30)
        t.join(60)
        assert got == list(range(100))


# --- shutdown --------------------------------------------------------------------------------


def test_graceful_stop_loses_nothing(make: Make) -> None:
    kernel = make("k", echo).start()
    for i in range(200):
        kernel.send(Job(seq=i))
    assert kernel.stop(timeout=30)
    assert [kernel.receive(timeout=5).seq for _ in range(200)] == list(range(200))
    assert kernel.unprocessed() == []
    with pytest.raises(KernelStateError, match="it has stopped"):
        kernel.receive(timeout=1)


def test_should_terminate_waits_for_the_drain(make: Make) -> None:
    kernel = make("k", counts_until_terminate).start()
    for i in range(50):
        kernel.send(Job(seq=i))
    assert kernel.stop(timeout=30)
    assert kernel.receive(timeout=5).seq == 50


def test_stop_wakes_an_actor_blocked_in_receive(make: Make) -> None:
    kernel = make("k", echo_blocking).start()
    kernel.send(Job(seq=1))
    assert kernel.receive(timeout=30).seq == 1
    assert kernel.stop(timeout=30) is True  # no timeout in the actor, yet it ends cleanly
    assert not kernel.failed


def test_stop_timeout_returns_what_the_actor_never_took(make: Make) -> None:
    kernel = make("k", echo).start()
    kernel.send(Job(seq=0, payload="sleep"))
    for i in range(1, 6):
        kernel.send(Job(seq=i))
    time.sleep(0.3)
    assert kernel.stop(timeout=0.3) is False
    assert [m.seq for m in kernel.unprocessed()] == [1, 2, 3, 4, 5]


def test_use_after_stop(make: Make) -> None:
    kernel = make("k", echo)
    with kernel:
        pass
    stopped = kernel.state.name  # each tier names its own terminal state
    with pytest.raises(KernelStateError, match=rf"cannot send to kernel 'k': it is {stopped}"):
        kernel.send(Job(seq=1))


# --- bad input -------------------------------------------------------------------------------


def test_wrong_input_type_is_refused(make: Make) -> None:
    with make("k", echo, input_type=Job) as kernel:
        with pytest.raises(TypeValidationError, match="kernel 'k' expects Job, got Done"):
            kernel.send(Done(seq=1))
        kernel.send(Job(seq=2))
        assert kernel.receive(timeout=30).seq == 2


def test_send_before_start_is_refused(make: Make) -> None:
    kernel = make("k", echo)
    with pytest.raises(KernelStateError, match=r"it is CREATED; call start\(\) first"):
        kernel.send(Job(seq=1))


def test_receive_timeout_returns_none(make: Make) -> None:
    with make("k", echo) as kernel:
        assert kernel.receive(timeout=0.05) is None
        assert kernel.receive_nowait() is None


# --- failures --------------------------------------------------------------------------------


def test_failure_after_earlier_replies(make: Make) -> None:
    with make("k", echo) as kernel:
        kernel.send(Job(seq=1))
        kernel.send(Job(seq=2, payload="boom"))
        assert kernel.receive(timeout=30).seq == 1
        with pytest.raises(KernelFailedError, match=r"kernel 'k'.*ValueError: boom at 2") as info:
            kernel.receive(timeout=30)
        assert isinstance(info.value.__cause__, ValueError)
        assert kernel.failed
        assert isinstance(kernel.error, ValueError)
        with pytest.raises(KernelFailedError):
            kernel.send(Job(seq=3))


def test_failure_wakes_a_receiver_waiting_without_timeout(make: Make) -> None:
    with make("k", echo) as kernel:
        out: list[BaseException] = []

        def wait() -> None:
            try:
                kernel.receive()
            except BaseException as exc:
                out.append(exc)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.1)
        kernel.send(Job(seq=1, payload="boom"))
        t.join(30)
        assert not t.is_alive()
        assert isinstance(out[0], KernelFailedError)
