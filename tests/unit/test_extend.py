"""`pydotcompute.ring_kernels.extend`: the names it takes to write a tier, and only those.

A tier written here from that module's names alone (a thread running a plain function over
two `SyncQueue`s) runs under the real runtime: launched by name, answering
`send_and_receive`, handing back what it never took at terminate, and reporting its
actor's failure.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from foundation_helpers import run_python, until

import pydotcompute.ring_kernels as rk
from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import KernelFailedError, KernelStateError
from pydotcompute.ring_kernels import extend


def test_all_is_a_sorted_tuple_of_names_that_resolve() -> None:
    assert isinstance(extend.__all__, tuple)
    assert list(extend.__all__) == sorted(extend.__all__)
    for name in extend.__all__:
        assert getattr(extend, name) is not None, name
    assert set(extend.__all__) <= set(dir(extend))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        extend.nope  # noqa: B018


def test_the_tier_writing_names_are_not_in_the_users_namespace() -> None:
    for name in ("TierWorker", "HostedKernel", "ThreadHostedKernel", "ProcessHostedKernel"):
        assert name not in rk.__all__
        assert name in extend.__all__
    # the ones a program uses too are the same objects in both
    for name in ("RingKernel", "KernelContext", "KernelState", "SyncQueue", "SPSCQueue"):
        assert getattr(extend, name) is getattr(rk, name)


def test_importing_it_loads_no_tier() -> None:
    code = (
        "import json, sys\n"
        "import pydotcompute.ring_kernels.extend\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith("
        "'pydotcompute.ring_kernels.tiers.'))))\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == ["pydotcompute.ring_kernels.tiers.contract"]


# --- a tier written from `extend` alone -----------------------------------------------


@message
class Num:
    x: int


@message
class Doubled:
    y: int


class QueueWorker(extend.TierWorker):
    """The actor `fn(msg) -> reply` runs in a thread of its own, between two queues."""

    def __init__(self, kernel_id: str, fn: Callable[[Any], Any], room: int) -> None:
        self.kernel_id = kernel_id
        self.fn = fn
        self.inbox: extend.SyncQueue[Any] = extend.SyncQueue(room)
        self.outbox: extend.SyncQueue[Any] = extend.SyncQueue(0)
        self.hand: list[Any] = []  # the message the actor is handling
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.readable: list[Callable[[], None]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name=f"queue-tier-{kernel_id}")

    def run(self) -> None:
        while not self.stopping.is_set():
            msg = self.inbox.get(timeout=0.01)
            if msg is None:
                continue
            with self.lock:
                self.hand.append(msg)
            try:
                reply = self.fn(msg)
            except Exception as exc:
                self.error = exc  # the message stays in hand: handed back first
                for wake in self.readable:  # the runtime polls, and gets the failure
                    wake()
                return
            with self.lock:
                if not self.hand:  # handed back by a stop that did not wait for it
                    return
                self.hand.pop()
            self.outbox.put(reply)

    @property
    def pending_input(self) -> int:
        return self.inbox.size

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float) -> bool:
        self.stopping.set()
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def offer(self, msg: Any) -> bool:
        if self.error is not None:
            raise KernelFailedError(self.kernel_id, self.error)
        return self.inbox.put_nowait(msg)

    def on_writable(self, callback: Callable[[], None]) -> None:
        self.inbox.add_waker(callback, when="writable")

    def poll_reply(self) -> Any:
        reply = self.outbox.get_nowait()
        if reply is not None:
            return reply
        if self.error is not None:
            raise KernelFailedError(self.kernel_id, self.error)
        if self.stopping.is_set() and not self.thread.is_alive():
            raise KernelStateError(self.kernel_id, "STOPPED", "receive from", "")
        return None

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.readable.append(callback)
        self.outbox.add_waker(callback)

        def undo() -> None:
            self.readable.remove(callback)
            self.outbox.remove_waker(callback)

        return undo

    def drain_replies(self) -> list[Any]:
        return self.outbox.drain()

    def take_undelivered(self) -> list[Any]:
        with self.lock:
            out, self.hand = [*self.hand, *self.inbox.drain()], []
        return out

    @property
    def failure(self) -> BaseException | None:
        return self.error


class QueueKernel(extend.HostedKernel):
    """What ``tier="queue"`` builds: the runtime's policy around a `QueueWorker`."""

    __slots__ = ("actor",)

    def __init__(self, kernel_id: str, kernel_func: Any, **kwargs: Any) -> None:
        super().__init__(kernel_id, kernel_func, **kwargs)
        self.actor = kernel_func

    def _make_worker(self, bridge: int) -> extend.TierWorker:
        return QueueWorker(self.kernel_id, self.actor, bridge)


@pytest.fixture
def queue_tier() -> Any:
    extend.register_tier("queue", QueueKernel)
    yield
    extend.unregister_tier("queue")


GATE = threading.Event()  # the actor blocks on a message >= 10 until it is set


def double(msg: Num) -> Doubled:
    if msg.x < 0:
        raise ValueError(f"negative: {msg.x}")
    if msg.x >= 10:
        GATE.wait(30)
    return Doubled(y=2 * msg.x, correlation_id=msg.message_id)


async def test_a_tier_from_extend_alone_runs_under_the_runtime(queue_tier: Any) -> None:
    assert "queue" in extend.tier_names()
    GATE.clear()
    try:
        async with RingKernelRuntime() as rt:
            kernel = await rt.launch("q", double, tier="queue", input_type=Num, output_type=Doubled)
            assert type(kernel) is QueueKernel
            await rt.activate("q")
            replies = [await rt.send_and_receive("q", Num(x=i), timeout=10) for i in range(5)]
            assert [r.y for r in replies] == [0, 2, 4, 6, 8]
            for i in range(3):  # the actor blocks on the first; the others wait for it
                await rt.send("q", Num(x=10 + i))
            left = await rt.terminate("q", timeout=0.5)
            assert [m.x for m in left] == [10, 11, 12]  # the one in its hands first
    finally:
        GATE.set()


async def test_its_actors_failure_fails_the_kernel(queue_tier: Any) -> None:
    async with RingKernelRuntime() as rt:
        await rt.launch("q", double, tier="queue", input_type=Num, output_type=Doubled)
        await rt.activate("q")
        await rt.send("q", Num(x=-1))
        with pytest.raises(KernelFailedError, match="negative: -1"):
            await rt.receive("q", timeout=10)
        assert rt.get_kernel_state("q") is extend.KernelState.FAILED
        kernel = rt.get_kernel("q")
        await until(lambda: kernel.undelivered, "the message it raised on is handed back")
        assert [m.x for m in kernel.undelivered] == [-1]


# --- a tier that declares the inline request ---------------------------------------------


class SpinQueueWorker(QueueWorker):
    """`QueueWorker` that can wait a moment for the next reply on the caller's thread."""

    CAPABILITIES = extend.Capabilities(inline_request=True)

    def __init__(self, kernel_id: str, fn: Callable[[Any], Any], room: int) -> None:
        super().__init__(kernel_id, fn, room)
        self.budgets: list[float] = []

    def reply_within(self, budget_s: float) -> Any:
        self.budgets.append(budget_s)
        reply = self.outbox.get(timeout=budget_s)
        return reply if reply is not None else self.poll_reply()


class SpinQueueKernel(extend.HostedKernel):
    """``tier="spinqueue"``: the bridge's reply spin, offered as ``reply_spin_us``."""

    EXTRA_OPTIONS = extend.HostedKernel.EXTRA_OPTIONS | {"reply_spin_us"}
    WORKER = SpinQueueWorker  # its capabilities (the inline request) are this kernel's
    __slots__ = ("actor",)

    def __init__(self, kernel_id: str, kernel_func: Any, **kwargs: Any) -> None:
        super().__init__(kernel_id, kernel_func, **kwargs)
        self.actor = kernel_func

    def _reply_spin_budget(self) -> float:
        return float(self.config.extra.get("reply_spin_us", 0)) / 1e6

    def _make_worker(self, bridge: int) -> extend.TierWorker:
        return SpinQueueWorker(self.kernel_id, self.actor, bridge)


async def test_a_tier_declaring_the_inline_request_gets_the_bridges_spin() -> None:
    """Any tier may state ``Capabilities(inline_request=True)``: the bridge, not the tier, makes the
    request (correlation, accounting) and hands each poll its budget, never more than
    the caller's timeout; a plain send is never polled for."""
    GATE.set()  # messages >= 10 pass at once (the gate is another test's, and may be shut)
    extend.register_tier("spinqueue", SpinQueueKernel)
    try:
        async with RingKernelRuntime() as rt:
            await rt.launch(
                "q",
                double,
                tier="spinqueue",
                input_type=Num,
                output_type=Doubled,
                reply_spin_us=2e4,
            )
            await rt.activate("q")
            worker: Any = rt.get_kernel("q").worker
            for i in range(50):
                assert (await rt.send_and_receive("q", Num(x=i), timeout=0.005)).y == 2 * i
            assert worker.budgets, "the bridge never polled the tier for a reply"
            assert max(worker.budgets) <= 0.005, worker.budgets  # never past the timeout
            worker.budgets.clear()
            for i in range(50):
                assert (await rt.send_and_receive("q", Num(x=i))).y == 2 * i  # no timeout
            assert max(worker.budgets) == 0.02  # the full budget, nothing left of the last
            telemetry = rt.get_telemetry("q")
            assert telemetry is not None
            assert telemetry.messages_sent == 100
            assert rt.get_kernel("q").pending_requests == 0
            polled = len(worker.budgets)
            await rt.send("q", Num(x=3))
            assert (await rt.receive("q", timeout=10)).y == 6
            assert len(worker.budgets) == polled  # a plain send is not polled for
    finally:
        extend.unregister_tier("spinqueue")
