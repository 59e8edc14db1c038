"""Tier 3 specifics: CythonRingKernel's child process, its rings and its failure modes.

Behaviour shared with the threaded tier lives in ``test_tier_behaviour.py``. Actors and
messages are module-level so the child process can import them.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import sys as _sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from pydotcompute import message
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import _cython
from pydotcompute.ring_kernels.cython_kernel import (
    CythonKernelConfig,
    CythonKernelState,
    CythonRingKernel,
    is_cython_kernel_available,
)


@message
class Job:
    seq: int
    payload: str = ""


@message
class Done:
    seq: int
    pid: int = 0


class Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickling drops b: cannot rebuild
        super().__init__(a)


def worker(ctx: Any) -> None:
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.1)
        if job is None:
            continue
        if job.payload == "boom":
            raise ValueError(f"boom at {job.seq}")
        if job.payload == "odd":
            raise Unpicklable(1, 2)
        if job.payload == "exit":
            os._exit(3)
        if job.payload == "sleep":
            time.sleep(60)
        ctx.send(Done(seq=job.seq, pid=os.getpid()))


def fanout(ctx: Any) -> None:
    job = ctx.receive()
    for i in range(job.seq):
        ctx.send(Done(seq=i))
    ctx.wait_shutdown()


def slow(ctx: Any) -> None:
    while True:
        job = ctx.receive()
        time.sleep(0.001)
        ctx.send(Done(seq=job.seq))


def mirror(ctx: Any) -> None:
    """Answer a Job with a Done and a Done with a Job (two types each way)."""
    while True:
        msg = ctx.receive()
        if isinstance(msg, Job):
            ctx.send(Done(seq=msg.seq, pid=len(msg.payload)))
        else:
            ctx.send(Job(seq=msg.seq, payload="x" * msg.pid))


def wrong_output(ctx: Any) -> None:
    ctx.receive()
    ctx.send(Job(seq=0))


def _shm_names() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"pdc_{os.getpid()}_")}
    except OSError:
        return set()


def test_seed_style_use() -> None:
    assert is_cython_kernel_available() is _cython.CYTHON_AVAILABLE
    with CythonRingKernel("fast_worker", worker) as kernel:
        assert kernel.using_cython is _cython.CYTHON_AVAILABLE
        assert kernel.state is CythonKernelState.RUNNING
        assert kernel.is_running
        job = Job(seq=7)
        kernel.send(job)
        reply = kernel.receive(timeout=30)
        assert reply == Done(
            seq=7, pid=kernel.pid, message_id=reply.message_id, correlation_id=job.message_id
        )
        assert reply.pid != os.getpid()  # it really ran in another process
        assert _shm_names() == set()  # names are unlinked once the child attached
        stats = kernel.statistics()
        assert stats["inbox"]["records_written"] == 1
        assert stats["implementation"] == _cython.IMPLEMENTATION
    assert kernel.state is CythonKernelState.STOPPED
    assert kernel.exit_code == 0


def test_streams_of_mixed_types_decode_each_message_as_its_own_class() -> None:
    # both sides decode with a per-stream fast path keyed on the previous message's type;
    # alternating types must switch it, never decode one class's bytes as the other
    kinds = [Job, Done, Done, Job, Job, Done, Job]
    with CythonRingKernel("mirror", mirror) as kernel:
        sent = []
        for seq, kind in enumerate(kinds):
            msg = Job(seq=seq, payload="ab"[: seq % 3]) if kind is Job else Done(seq=seq, pid=seq)
            sent.append(msg)
            kernel.send(msg)
        replies = [kernel.receive(timeout=30) for _ in kinds]
    for msg, reply in zip(sent, replies, strict=True):
        assert reply.correlation_id == msg.message_id
        if isinstance(msg, Job):
            assert type(reply) is Done
            assert (reply.seq, reply.pid) == (msg.seq, len(msg.payload))
        else:
            assert type(reply) is Job
            assert (reply.seq, reply.payload) == (msg.seq, "x" * msg.pid)


def test_local_function_is_refused() -> None:
    def local(ctx: Any) -> None:
        pass

    with pytest.raises(TypeValidationError, match="must be importable by module path"):
        CythonRingKernel("k", local)
    with pytest.raises(TypeValidationError, match="must be importable by module path"):
        CythonRingKernel("k", lambda ctx: None)


def test_async_actor_and_non_callable_are_refused() -> None:
    async def actor(ctx: Any) -> None:
        pass

    with pytest.raises(TypeValidationError, match="runs plain functions in a child process"):
        CythonRingKernel("k", actor)
    with pytest.raises(TypeValidationError, match="needs a callable actor"):
        CythonRingKernel("k", "worker")


def test_config_validation() -> None:
    with pytest.raises(InvalidConfigurationError, match="'fork' would copy the parent"):
        CythonKernelConfig("k", start_method="fork")
    with pytest.raises(InvalidConfigurationError, match="spin_us of kernel 'k' must be >= 0"):
        CythonKernelConfig("k", spin_us=-1)
    with pytest.raises(InvalidConfigurationError, match="input_ring_bytes of kernel 'k'"):
        CythonKernelConfig("k", input_ring_bytes=100)
    cfg = CythonKernelConfig("k", ring_bytes=1 << 16)
    assert cfg.input_ring_bytes == cfg.output_ring_bytes == 1 << 16
    with pytest.raises(InvalidConfigurationError, match="does not match its config's 'x'"):
        CythonRingKernel("k", worker, config=CythonKernelConfig("x"))


def test_use_before_start_and_after_stop() -> None:
    kernel = CythonRingKernel("k", worker)
    with pytest.raises(KernelStateError, match="call start\\(\\) first"):
        kernel.send(Job(seq=1))
    with pytest.raises(KernelStateError, match="call start\\(\\) first"):
        kernel.receive(timeout=0.1)
    assert kernel.stop()
    with pytest.raises(KernelStateError, match="a kernel runs once"):
        kernel.start()


def test_messages_must_be_messages_and_fit() -> None:
    cfg = CythonKernelConfig("big", input_ring_bytes=4096)
    with CythonRingKernel("big", worker, config=cfg) as kernel:
        with pytest.raises(TypeValidationError, match=r"carries @message instances .* got dict"):
            kernel.send({"seq": 1})
        with pytest.raises(
            InvalidConfigurationError,
            match=r"Job message of \d+ bytes can never fit the inbox of kernel 'big' "
            r"\(largest message: 4088 bytes\); raise CythonKernelConfig\(input_ring_bytes",
        ):
            kernel.send(Job(seq=1, payload="x" * 5000))
        kernel.send(Job(seq=2))  # still usable
        assert kernel.receive(timeout=30).seq == 2


def test_output_type_is_checked_in_the_child() -> None:
    with CythonRingKernel("typed", wrong_output, output_type=Done) as kernel:
        kernel.send(Job(seq=1))
        with pytest.raises(KernelFailedError, match="must send Done, got Job"):
            kernel.receive(timeout=30)


def test_actor_error_carries_the_child_traceback() -> None:
    with CythonRingKernel("err", worker) as kernel:
        kernel.send(Job(seq=1))
        kernel.send(Job(seq=2, payload="boom"))
        assert kernel.receive(timeout=30).seq == 1
        with pytest.raises(KernelFailedError, match="ValueError: boom at 2") as info:
            kernel.receive(timeout=30)
        cause = info.value.__cause__
        assert isinstance(cause, ValueError)
        notes = "".join(getattr(cause, "__notes__", []))
        assert "raised in the child process" in notes
        assert "in worker" in notes
        assert kernel.failed
        assert kernel.error is cause
        with pytest.raises(KernelFailedError):
            kernel.send(Job(seq=3))
    assert kernel.exit_code == 1


def test_unpicklable_error_becomes_a_runtime_error_naming_it() -> None:
    with CythonRingKernel("odd", worker) as kernel:
        kernel.send(Job(seq=1, payload="odd"))
        with pytest.raises(KernelFailedError, match=r"RuntimeError: .*Unpicklable: 1"):
            kernel.receive(timeout=30)


def test_child_exit_without_a_report_is_a_failure() -> None:
    with CythonRingKernel("exit", worker) as kernel:
        kernel.send(Job(seq=1, payload="exit"))
        with pytest.raises(KernelFailedError, match="exited with code 3 without reporting"):
            kernel.receive(timeout=30)
        assert isinstance(kernel.error, ChildProcessError)


def test_sigkill_reaches_a_blocked_receiver_and_later_senders() -> None:
    kernel = CythonRingKernel("victim", worker).start()
    try:
        kernel.send(Job(seq=1))
        assert kernel.receive(timeout=30).seq == 1
        result: list[BaseException] = []

        def receive_forever() -> None:
            try:
                kernel.receive()  # no timeout: only the crash can end it
            except BaseException as exc:
                result.append(exc)

        t = threading.Thread(target=receive_forever, name="test-receiver")
        t.start()
        time.sleep(0.1)
        assert kernel.pid is not None
        os.kill(kernel.pid, signal.SIGKILL)
        t.join(30)
        assert not t.is_alive()
        assert isinstance(result[0], KernelFailedError)
        assert "was killed by SIGKILL" in str(result[0])
        with pytest.raises(KernelFailedError, match="SIGKILL"):
            kernel.send(Job(seq=2))
        assert kernel.state is CythonKernelState.STOPPED
        assert kernel.exit_code == -9
    finally:
        kernel.stop()
    assert _shm_names() == set()


def test_crash_is_noticed_without_any_caller_waiting() -> None:
    kernel = CythonRingKernel("idle", worker).start()
    try:
        assert kernel.pid is not None
        os.kill(kernel.pid, signal.SIGKILL)
        assert kernel.join(30)
        deadline = time.monotonic() + 30
        while kernel.is_running and time.monotonic() < deadline:
            time.sleep(0.01)  # the watcher thread flips the state
        assert kernel.failed
        with pytest.raises(KernelFailedError, match="was killed by SIGKILL"):
            kernel.send_nowait(Job(seq=1))
    finally:
        kernel.stop()


def test_stop_timeout_terminates_and_returns_the_unprocessed() -> None:
    kernel = CythonRingKernel("stuck", worker).start()
    kernel.send(Job(seq=0, payload="sleep"))
    for i in range(1, 4):
        kernel.send(Job(seq=i))
    time.sleep(0.2)
    assert kernel.stop(timeout=0.5) is False
    assert [m.seq for m in kernel.unprocessed()] == [1, 2, 3]
    assert kernel.exit_code == -signal.SIGTERM
    assert not kernel.failed  # we stopped it; that is not the actor's failure


def test_stop_drains_a_full_outbox() -> None:
    cfg = CythonKernelConfig("fan", output_queue_size=16, output_ring_bytes=4096)
    kernel = CythonRingKernel("fan", fanout, config=cfg).start()
    kernel.send(Job(seq=500))  # 500 replies through a 16-slot outbox
    assert kernel.stop(timeout=30)
    got = [kernel.receive(timeout=1).seq for _ in range(500)]
    assert got == list(range(500))
    with pytest.raises(KernelStateError, match="it has stopped"):
        kernel.receive(timeout=1)


@pytest.mark.parametrize("spin_us", [0.0, 50.0])
def test_small_rings_park_and_wake_in_order(spin_us: float) -> None:
    cfg = CythonKernelConfig("tiny", input_queue_size=2, output_queue_size=2, spin_us=spin_us)
    with CythonRingKernel("tiny", slow, config=cfg) as kernel:
        got: list[int] = []

        def drain() -> None:
            got.extend(kernel.receive(timeout=30).seq for _ in range(200))

        t = threading.Thread(target=drain, name="test-drain")
        t.start()
        for i in range(200):
            assert kernel.send(Job(seq=i), timeout=30)  # waits for space
        t.join(60)
        assert got == list(range(200))


def test_send_and_receive_timeouts() -> None:
    cfg = CythonKernelConfig("to", input_queue_size=1)
    with CythonRingKernel("to", worker, config=cfg) as kernel:
        assert kernel.receive(timeout=0.05) is None
        assert kernel.receive_nowait() is None
        kernel.send(Job(seq=0, payload="sleep"))
        time.sleep(0.2)
        assert kernel.send(Job(seq=1), timeout=0.05) is True  # the one free slot
        assert kernel.send(Job(seq=2), timeout=0.05) is False  # full: timed out
        assert kernel.send_nowait(Job(seq=3)) is False
        assert kernel.stop(timeout=0.2) is False


def test_forkserver_start_method() -> None:
    cfg = CythonKernelConfig("fs", start_method="forkserver")
    with CythonRingKernel("fs", worker, config=cfg) as kernel:
        kernel.send(Job(seq=5))
        assert kernel.receive(timeout=30).seq == 5


def test_child_that_cannot_import_the_actor_fails_start() -> None:
    mod = types.ModuleType("pdc_ephemeral_actors")
    exec(
        "def actor(ctx):\n    pass\n",
        mod.__dict__,
    )
    _sys.modules["pdc_ephemeral_actors"] = mod  # importable here, not in the child
    try:
        kernel = CythonRingKernel("ghost", mod.actor)
        with pytest.raises(KernelFailedError, match="No module named 'pdc_ephemeral_actors'"):
            kernel.start()
        assert kernel.state is CythonKernelState.STOPPED
        assert kernel.stop()
    finally:
        del _sys.modules["pdc_ephemeral_actors"]
    assert _shm_names() == set()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def test_event_loop_hosting_with_wait_handles() -> None:
    async def main(kernel: CythonRingKernel) -> list[int]:
        loop = asyncio.get_running_loop()
        out: list[int] = []
        for i in range(20):
            kernel.send_nowait(Job(seq=i))
            while (reply := kernel.receive_nowait()) is None:
                kernel.arm_receive()
                if (reply := kernel.receive_nowait()) is not None:
                    kernel.disarm_receive()
                    break
                ready = loop.create_future()
                fds = kernel.wait_handles()
                for fd in fds:
                    loop.add_reader(fd, _resolve, ready)
                try:
                    await asyncio.wait_for(ready, 30)
                finally:
                    for fd in fds:
                        loop.remove_reader(fd)
                    kernel.disarm_receive()
            out.append(reply.seq)
        return out

    cfg = CythonKernelConfig("loop", spin_us=0)  # the child parks too
    with CythonRingKernel("loop", slow, config=cfg) as kernel:
        assert asyncio.run(main(kernel)) == list(range(20))


def test_wakers_fire_from_the_watcher_thread() -> None:
    cfg = CythonKernelConfig("wk", spin_us=0)
    kernel = CythonRingKernel("wk", worker, config=cfg)
    arrived = threading.Event()
    kernel.outbox.add_waker(arrived.set)
    with kernel:
        for i in range(5):
            arrived.clear()
            kernel.send_nowait(Job(seq=i))
            assert arrived.wait(30)
            reply = kernel.receive_nowait()
            while reply is None:  # the waker may run just before the record is visible
                reply = kernel.receive(timeout=30)
            assert reply.seq == i
        assert len(kernel.outbox) == 0
        assert kernel.inbox.get_stats()["records_written"] == 5


def test_child_exits_when_the_parent_dies(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            sys.path[:0] = {[str(Path(__file__).parent), *sys.path]!r}
            from test_cython_kernel import worker
            from pydotcompute.ring_kernels.cython_kernel import CythonRingKernel
            if __name__ == "__main__":
                k = CythonRingKernel("orphan", worker, config=None).start()
                print(k.pid, flush=True)
                os._exit(0)  # no stop(): the child must notice on its own
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    child = int(out.stdout.split()[0])

    def alive(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")

    deadline = time.monotonic() + 60
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_pickled_error_report_round_trip() -> None:
    from pydotcompute.ring_kernels._process_actor import _error_report
    from pydotcompute.ring_kernels.cython_kernel import _rebuild_error

    try:
        raise KeyError("missing")
    except KeyError as exc:
        report = _error_report(exc)
    rebuilt = _rebuild_error(pickle.loads(pickle.dumps(report)), "k", 123)
    assert isinstance(rebuilt, KeyError)
    assert "pid 123" in "".join(getattr(rebuilt, "__notes__", []))


def test_adaptive_spin_budget() -> None:
    from pydotcompute.ring_kernels._process_actor import PROBE_EVERY, _Waiter

    r, w = os.pipe()
    try:
        waiter = _Waiter(r, None, 50e-6, adaptive=True)
        budgets = []
        for _ in range(PROBE_EVERY):
            waiter.miss()
            budgets.append(waiter.spin_s)
        assert budgets[:3] == [12.5e-6, 3.125e-6, 0.0]  # quartered down to no spin
        assert budgets[PROBE_EVERY - 1] == 50e-6  # ... but probing with the full budget
        waiter.miss()
        waiter.hit()
        assert waiter.spin_s == 50e-6
        assert waiter.misses == 0
        fixed = _Waiter(r, None, 50e-6, adaptive=False)
        fixed.miss()
        assert fixed.spin_s == 50e-6
    finally:
        os.close(r)
        os.close(w)


def test_fixed_spin_mode_round_trips() -> None:
    cfg = CythonKernelConfig("fixed", spin_us=20, adaptive_spin=False)
    with CythonRingKernel("fixed", worker, config=cfg) as kernel:
        for i in range(50):
            kernel.send(Job(seq=i))
            assert kernel.receive(timeout=30).seq == i
