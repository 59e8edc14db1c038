"""Tier 3 specifics: CythonRingKernel's child process, its rings and its failure modes.

Behaviour shared with the threaded tier lives in ``test_tier_behaviour.py``. Actors and
messages are module-level so the child process can import them.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
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
    MessageRejectedError,
    MessageSerializationError,
    RemoteActorError,
    RingCorruptedError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import _native as _cython
from pydotcompute.ring_kernels._native import spsc_py as _spsc_py
from pydotcompute.ring_kernels.tiers.process import worker as process_worker
from pydotcompute.ring_kernels.tiers.process.kernel import (
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


def echo(ctx: Any) -> None:
    """Send back whatever arrives, until the stop."""
    while True:
        ctx.send(ctx.receive())


def sleeper(ctx: Any) -> None:
    """Half a second per message, then a Done."""
    while True:
        job = ctx.receive()
        time.sleep(0.5)
        ctx.send(Done(seq=job.seq))


def chatty(ctx: Any) -> None:
    """Write to stderr from the child, then answer."""
    msg = ctx.receive()
    print("chatty child speaking", file=sys.stderr, flush=True)
    ctx.send(msg)


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


def test_the_seed_names_are_the_process_tier_and_its_states_are_kernel_states() -> None:
    from pydotcompute.ring_kernels import KernelState
    from pydotcompute.ring_kernels import cython_kernel as old_module
    from pydotcompute.ring_kernels.tiers.contract import TierWorker
    from pydotcompute.ring_kernels.tiers.process import (
        ProcessKernel,
        ProcessKernelConfig,
        ProcessKernelContext,
        ProcessWorker,
    )

    assert CythonRingKernel is ProcessKernel is old_module.CythonRingKernel
    assert CythonKernelConfig is ProcessKernelConfig
    assert old_module.CythonKernelContext is ProcessKernelContext
    assert list(CythonKernelState) == [
        KernelState.CREATED,
        KernelState.ACTIVE,
        KernelState.TERMINATING,
        KernelState.TERMINATED,
    ]
    kernel = CythonRingKernel("facade", echo)
    # the façade drives the very worker the runtime drives through the tier contract
    assert isinstance(kernel.worker, ProcessWorker)
    assert isinstance(kernel.worker, TierWorker)
    assert kernel.state is KernelState.CREATED
    with kernel:
        assert kernel.worker.offer(3)
        deadline = time.monotonic() + 30
        reply = kernel.worker.poll_reply()
        while reply is None and time.monotonic() < deadline:
            reply = kernel.receive(timeout=0.1)
        assert reply == 3
        assert kernel.state is KernelState.ACTIVE
    assert kernel.state is KernelState.TERMINATED


def test_the_child_module_imports_without_the_parent_side() -> None:
    # spawn and forkserver children import the entry point by its module path
    code = textwrap.dedent(
        """
        import pickle, sys
        from pydotcompute.ring_kernels.tiers.process.child import ChildSpec, child_main
        assert pickle.loads(pickle.dumps(child_main)) is child_main
        parent = ("pydotcompute.ring_kernels.tiers.process.worker",
                  "pydotcompute.ring_kernels.hosted")
        print(sorted(m for m in parent if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


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

    with pytest.raises(TypeValidationError, match="the process tier runs plain functions"):
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


def test_a_value_that_contains_itself_is_refused_at_send() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    kernel = CythonRingKernel("deep", echo, config=CythonKernelConfig("deep"))
    with kernel:
        with pytest.raises(
            MessageSerializationError,
            match=r"kernel 'deep' .* a list nested too deeply or containing itself does not",
        ):
            kernel.send(loop, timeout=1)
        kernel.send(Job(seq=2))  # still usable; nothing of the refused one was queued
        assert kernel.receive(timeout=30).seq == 2


def test_an_oversized_message_is_refused_at_send_naming_both_fixes() -> None:
    cfg = CythonKernelConfig("big", ring_bytes=4096)
    kernel = CythonRingKernel("big", echo, config=cfg)
    assert kernel.max_message_bytes == 4088  # known before start, for an up-front check
    with kernel:
        assert kernel.max_message_bytes == 4088
        big = Job(seq=1, payload="x" * 5000)
        size = len(big.serialize())
        with pytest.raises(MessageSerializationError) as info:
            kernel.send(big, timeout=1)
        text = str(info.value)
        assert isinstance(info.value, ValueError)
        assert f"a Job that encodes to {size} bytes" in text
        assert "takes at most 4088 bytes per message" in text
        assert "launch(..., ring_bytes=" in text
        assert "CythonKernelConfig(ring_bytes=" in text
        with pytest.raises(MessageSerializationError, match="a bytes that encodes to"):
            kernel.send_nowait(b"x" * 5000)
        kernel.send(Job(seq=2))  # still usable; nothing of the refused ones was queued
        assert kernel.receive(timeout=30).seq == 2
        assert kernel.receive(timeout=0.05) is None


def test_a_reply_too_large_for_the_outbox_fails_the_actor_naming_the_fix() -> None:
    cfg = CythonKernelConfig("bigout", output_ring_bytes=4096)
    with CythonRingKernel("bigout", echo, config=cfg) as kernel:
        kernel.send("y" * 8000)
        with pytest.raises(KernelFailedError, match=r"output_ring_bytes") as info:
            kernel.receive(timeout=30)
        assert "MessageSerializationError" in str(info.value)


PLAIN_VALUES: list[Any] = [
    7,
    -2.5,
    "text",
    b"\x00bytes",
    True,
    None,
    [1, [2, "three"]],
    {"a": 1, "b": [None, 2.0]},
    2**63 - 1,
]


def test_plain_values_travel_both_ways() -> None:
    import numpy as np

    with CythonRingKernel("plain", echo) as kernel:
        for value in PLAIN_VALUES:
            assert kernel.send(value, timeout=30)
            got = kernel.receive(timeout=30)
            assert got == value
            assert type(got) is type(value)
        arr = np.arange(12, dtype=np.float32).reshape(3, 4)
        kernel.send(arr)
        back = kernel.receive(timeout=30)
        assert back.dtype == arr.dtype
        assert back.shape == (3, 4)
        assert np.array_equal(back, arr)
        back[0, 0] = 99  # the receiver's own copy
        kernel.send((1, "a"))
        assert kernel.receive(timeout=30) == [1, "a"]  # MessagePack has no tuple
        kernel.send(Job(seq=3))  # messages still go as messages
        assert kernel.receive(timeout=30).seq == 3


def test_a_value_that_cannot_be_encoded_is_refused_naming_its_type() -> None:
    import numpy as np

    with CythonRingKernel("plainbad", echo) as kernel:
        with pytest.raises(MessageSerializationError, match="a object does not"):
            kernel.send(object())
        with pytest.raises(MessageSerializationError, match=r"a list does not .*Unpicklable"):
            kernel.send([1, Unpicklable(1, 2)])
        with pytest.raises(MessageSerializationError, match="dtype object"):
            kernel.send(np.array([object()]))
        kernel.send(5)
        assert kernel.receive(timeout=30) == 5


def test_input_type_still_applies_to_plain_values() -> None:
    with (
        CythonRingKernel("typedin", echo, input_type=Job) as kernel,
        pytest.raises(TypeValidationError, match="expects Job, got int"),
    ):
        kernel.send(1)


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


def test_a_non_builtin_error_becomes_a_remote_actor_error_naming_it() -> None:
    with CythonRingKernel("odd", worker) as kernel:
        kernel.send(Job(seq=1, payload="odd"))
        with pytest.raises(KernelFailedError, match=r"RemoteActorError: .*Unpicklable: 1") as info:
            kernel.receive(timeout=30)
        cause = info.value.__cause__
        assert isinstance(cause, RemoteActorError)
        assert (cause.type_name, cause.text) == ("Unpicklable", "1")
        assert cause.module.endswith("test_cython_kernel")
        assert "raise Unpicklable(1, 2)" in cause.remote_traceback


SPRUNG: list[str] = []


def _spring(text: str) -> ValueError:
    SPRUNG.append(text)  # what unpickling the trap would run, in whichever process does it
    return ValueError(text)


class Trap(Exception):
    """An exception whose unpickling runs code: it must never be unpickled in the parent."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_spring, (f"sprung in {os.getpid()}",))


def trap_actor(ctx: Any) -> None:
    ctx.receive()
    raise Trap("from the child")


def test_the_childs_exception_is_never_unpickled_by_the_parent() -> None:
    SPRUNG.clear()
    with CythonRingKernel("trap", trap_actor) as kernel:
        kernel.send(Job(seq=1))
        with pytest.raises(KernelFailedError) as info:
            kernel.receive(timeout=30)
    assert SPRUNG == []
    cause = info.value.__cause__
    assert isinstance(cause, RemoteActorError)
    assert cause.type_name == "Trap"
    assert cause.text == "from the child"
    assert "in trap_actor" in cause.remote_traceback
    assert "raised in the child process" in "".join(cause.__notes__)


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
            from pydotcompute.ring_kernels import CythonRingKernel
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


def test_error_reports_are_data_and_rebuild_only_builtins() -> None:
    from pydotcompute.ring_kernels.tiers.process.framing import (
        exception_data,
        pack_report,
        rebuild_error,
        unpack_report,
    )

    def report_of(exc: BaseException) -> list[Any]:
        try:
            raise exc
        except BaseException as caught:
            data = pack_report("error", "run", *exception_data(caught))
        with pytest.raises(pickle.UnpicklingError):
            pickle.loads(data)  # MessagePack, not a pickle
        return unpack_report(data)

    rebuilt = rebuild_error(report_of(KeyError("missing")), "k", 123)
    assert type(rebuilt) is KeyError
    assert rebuilt.args == ("missing",)
    assert "pid 123" in "".join(getattr(rebuilt, "__notes__", []))
    rebuilt = rebuild_error(report_of(OSError(2, "gone")), "k", 1)
    assert isinstance(rebuilt, OSError)
    assert rebuilt.errno == 2
    # a builtin name from another module, or a non-exception builtin, is never looked up
    forged = ["error", "run", "builtins", "print", "x", ["boo"], "tb"]
    assert isinstance(rebuild_error(forged, "k", 1), RemoteActorError)
    forged = ["error", "run", "os", "system", "x", ["echo hi"], "tb"]
    assert isinstance(rebuild_error(forged, "k", 1), RemoteActorError)
    assert isinstance(rebuild_error(["error"], "k", 1), RemoteActorError)  # truncated
    assert unpack_report(b"\x80\x04garbage") == []
    rebuilt = rebuild_error(report_of(ValueError(2**70)), "k", 1)  # args MessagePack refuses
    assert type(rebuilt) is ValueError
    assert str(rebuilt) == str(2**70)


def test_adaptive_spin_budget() -> None:
    from pydotcompute.ring_kernels.tiers.process.waiting import PROBE_EVERY, Waiter

    r, w = os.pipe()
    try:
        waiter = Waiter(r, None, 50e-6, adaptive=True)
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
        fixed = Waiter(r, None, 50e-6, adaptive=False)
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


# --- robustness: corruption, what is in flight, replies, rejected frames, startup ----------


class _KeepSegments:
    """Wraps ``SharedByteRing`` so a test keeps its own mapping of each ring the kernel
    creates (the kernel unlinks the names once the child attached)."""

    def __init__(self) -> None:
        self.segments: list[Any] = []
        self._real = _cython.SharedByteRing

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ring = self._real(*args, **kwargs)
        self.segments.append(_spsc_py.SharedSegment(ring.name, create=False))
        return ring

    def close(self) -> None:
        for seg in self.segments:
            seg.close()


def test_a_corrupted_outbox_fails_the_kernel_and_never_the_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keep = _KeepSegments()
    monkeypatch.setattr(process_worker, "SharedByteRing", keep)
    kernel = CythonRingKernel("scribbled", echo).start()
    try:
        _inbox, outbox = keep.segments
        kernel.send(1)
        assert kernel.receive(timeout=30) == 1
        kernel.send(2)
        deadline = time.monotonic() + 30
        while not kernel.outbox.get_stats()["pending_records"] and time.monotonic() < deadline:
            time.sleep(0.01)
        # a stray writer: the tail far past the capacity, a length word of 1 GiB
        struct.pack_into("<Q", outbox.buf, _spsc_py.H_TAIL * 8, 1 << 40)
        head = struct.unpack_from("<Q", outbox.buf, _spsc_py.H_HEAD * 8)[0]
        cap = kernel.outbox.get_stats()["capacity"]
        struct.pack_into("<Q", outbox.buf, _spsc_py.HEADER_BYTES + head % cap, 1 << 30)
        with pytest.raises(KernelFailedError, match="is corrupt") as info:
            kernel.receive(timeout=30)
        assert isinstance(info.value.__cause__, RingCorruptedError)
        assert kernel.failed
        assert isinstance(kernel.error, RingCorruptedError)
        with pytest.raises(KernelFailedError, match="is corrupt"):
            kernel.send(3)
        with pytest.raises(KernelFailedError, match="is corrupt"):
            kernel.receive(timeout=1)
        assert kernel.join(30)  # the child was ended: its channel cannot be trusted
    finally:
        kernel.stop(timeout=5)
        keep.close()
    assert kernel.state is CythonKernelState.STOPPED


def test_a_corrupted_inbox_fails_the_actor_and_reaches_the_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keep = _KeepSegments()
    monkeypatch.setattr(process_worker, "SharedByteRing", keep)
    cfg = CythonKernelConfig("scribbled-in", spin_us=0)
    kernel = CythonRingKernel("scribbled-in", echo, config=cfg).start()
    try:
        inbox = keep.segments[0]
        kernel.send(1)
        assert kernel.receive(timeout=30) == 1
        time.sleep(0.1)  # the child parks on the empty inbox
        # a stray writer; the parked child re-checks its inbox within a wait slice
        struct.pack_into("<Q", inbox.buf, _spsc_py.H_TAIL * 8, 1 << 40)
        with pytest.raises(KernelFailedError, match="RingCorruptedError") as info:
            kernel.receive(timeout=30)
        cause = info.value.__cause__
        assert isinstance(cause, RemoteActorError)
        assert cause.type_name == "RingCorruptedError"
    finally:
        kernel.stop(timeout=5)
        keep.close()


def test_the_message_in_the_childs_hands_comes_back_at_a_stop_timeout() -> None:
    kernel = CythonRingKernel("hands", sleeper).start()
    sent = [Job(seq=i) for i in range(3)]
    for job in sent:
        kernel.send(job)
    time.sleep(0.1)  # message 0 is with the actor, asleep
    assert kernel.stop(timeout=0.2) is False
    assert kernel.drain_replies() == []
    undelivered = kernel.take_undelivered()
    assert [m.seq for m in undelivered] == [0, 1, 2]
    assert all(a is b for a, b in zip(undelivered, sent, strict=True))  # the sent objects
    assert kernel.take_undelivered() == []  # exactly once
    assert [m.seq for m in kernel.unprocessed()] == [1, 2]  # never handed to the actor


def test_replies_and_undelivered_account_for_every_message_exactly_once() -> None:
    kernel = CythonRingKernel("split", sleeper).start()
    for i in range(5):
        kernel.send(Job(seq=i))
    time.sleep(1.2)  # two or three finished, one in hand
    kernel.stop(timeout=0.0)
    replies = [r.seq for r in kernel.drain_replies()]
    undelivered = [m.seq for m in kernel.take_undelivered()]
    assert replies + undelivered == list(range(5))
    assert len(replies) >= 1
    assert len(undelivered) >= 2


def test_nothing_is_undelivered_after_a_clean_stop() -> None:
    with CythonRingKernel("clean", echo) as kernel:
        with pytest.raises(KernelStateError, match="call stop\\(\\) first"):
            kernel.take_undelivered()
        for i in range(50):
            kernel.send(i)
    assert kernel.take_undelivered() == []
    assert kernel.drain_replies() == list(range(50))
    assert CythonRingKernel("never", echo).take_undelivered() == []


def test_a_killed_child_hands_back_what_it_held_and_what_was_queued() -> None:
    kernel = CythonRingKernel("killed", sleeper).start()
    try:
        for i in range(4):
            kernel.send(Job(seq=i))
        time.sleep(0.1)
        assert kernel.pid is not None
        os.kill(kernel.pid, signal.SIGKILL)
        assert kernel.join(30)
        assert [m.seq for m in kernel.take_undelivered()] == [0, 1, 2, 3]
    finally:
        kernel.stop()
    assert kernel.take_undelivered() == []


def test_the_message_that_made_the_actor_raise_is_handed_back_first() -> None:
    with CythonRingKernel("raised", worker) as kernel:
        kernel.send(Job(seq=0))
        assert kernel.receive(timeout=30).seq == 0
        kernel.send(Job(seq=1, payload="boom"))
        with pytest.raises(KernelFailedError):
            kernel.receive(timeout=30)
    assert [m.seq for m in kernel.take_undelivered()] == [1]


def test_kept_messages_stay_within_the_in_flight_window() -> None:
    cfg = CythonKernelConfig("window", input_queue_size=4)
    with CythonRingKernel("window", echo, config=cfg) as kernel:
        for i in range(200):
            kernel.send(i, timeout=30)
            assert kernel.receive(timeout=30) == i
            assert kernel.statistics()["in_flight"] <= 2 * (4 + 1)


def test_input_queue_size_bounds_messages_sent_and_not_taken() -> None:
    cfg = CythonKernelConfig("bound", input_queue_size=3)
    with CythonRingKernel("bound", sleeper, config=cfg) as kernel:
        assert kernel.pending_input == 0
        kernel.send(Job(seq=0))
        deadline = time.monotonic() + 30
        while kernel.pending_input and time.monotonic() < deadline:
            time.sleep(0.01)  # the actor took it
        assert [kernel.send_nowait(Job(seq=i)) for i in range(1, 5)] == [True, True, True, False]
        assert kernel.pending_input == 3
        assert kernel.send(Job(seq=9), timeout=0.05) is False
        kernel.stop(timeout=0.1)
    assert kernel.pending_input == 3  # never taken
    assert [m.seq for m in kernel.take_undelivered()] == [0, 1, 2, 3]


def test_replies_produced_before_stop_are_never_discarded() -> None:
    cfg = CythonKernelConfig("echo4", input_queue_size=128, output_queue_size=4)
    kernel = CythonRingKernel("echo4", echo, config=cfg).start()
    for i in range(100):
        kernel.send(i)
    assert kernel.stop(timeout=30)  # nothing was read; the outbox holds 4
    assert kernel.receive_nowait() == 0
    assert kernel.drain_replies() == list(range(1, 100))
    assert kernel.drain_replies() == []
    with pytest.raises(KernelStateError, match="it has stopped"):
        kernel.receive_nowait()


@message
class Strict:
    count: int


def test_a_frame_the_child_cannot_decode_is_one_rejected_message() -> None:
    # check_fields=False: the parent sends it unchecked, so the child's decoder refuses it
    cfg = CythonKernelConfig("strict", check_fields=False)
    with CythonRingKernel("strict", echo, config=cfg) as kernel:
        bad = Strict(count="not a number")  # type: ignore[arg-type]
        kernel.send(bad)
        kernel.send(Strict(count=2))
        with pytest.raises(MessageRejectedError, match="count") as info:
            kernel.receive(timeout=30)
        assert info.value.correlation_id == bad.message_id
        assert info.value.kernel_id == "strict"
        assert kernel.is_running  # the child keeps serving
        assert kernel.receive(timeout=30).count == 2
        kernel.send(Strict(count="again"))  # type: ignore[arg-type]
    (rejected,) = kernel.drain_replies()
    assert isinstance(rejected, MessageRejectedError)
    assert kernel.take_undelivered() == []  # answered with its error: finished
    assert pickle.loads(pickle.dumps(rejected)).correlation_id == rejected.correlation_id


_SCRIPT_HEAD = f"""
import sys
sys.path[:0] = {[str(Path(__file__).parent), *sys.path]!r}
from pydotcompute.exceptions import KernelFailedError
from pydotcompute.ring_kernels import CythonRingKernel
"""


def _run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT_HEAD + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def test_startup_failure_names_a_missing_main_guard(tmp_path: Path) -> None:
    out = _run_script(
        tmp_path,
        """
        from test_cython_kernel import echo
        try:
            CythonRingKernel("unguarded", echo).start().stop()
        except KernelFailedError as exc:
            print("FAILED:", str(exc).replace("\\n", " | "))
        """,
    )
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAILED:")]
    assert failed, out.stdout + out.stderr
    assert "before reporting ready" in failed[0]
    assert 'if __name__ == "__main__":' in failed[0]
    assert "script.py" in failed[0]
    # the child's own traceback: in the error, and still on stderr
    assert "the child's stderr ended with: | " in failed[0]
    assert "bootstrapping phase" in failed[0]
    assert "bootstrapping phase" in out.stderr


def test_startup_failure_names_an_actor_defined_under_the_main_guard(tmp_path: Path) -> None:
    out = _run_script(
        tmp_path,
        """
        if __name__ == "__main__":
            def actor(ctx):
                ctx.receive()

            try:
                CythonRingKernel("guarded", actor).start().stop()
            except KernelFailedError as exc:
                print("FAILED:", exc)
        """,
    )
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAILED:")]
    assert failed, out.stdout + out.stderr
    assert "could not load the actor" in failed[0]
    assert 'not one defined under `if __name__ == "__main__":`' in failed[0]


def test_the_hosted_process_tier_keeps_to_its_bridge_bound() -> None:
    from pydotcompute.ring_kernels.runtime import RingKernelRuntime

    async def main() -> tuple[int, int]:
        async with RingKernelRuntime() as rt:
            kernel = await rt.launch("hosted", sleeper, tier="process", bridge_queue_size=2)
            await rt.activate("hosted")
            for i in range(10):
                await rt.send("hosted", Job(seq=i))
            await asyncio.sleep(0.3)
            worker = kernel.worker  # type: ignore[attr-defined]
            window = (worker.pending_input, worker.statistics()["inbox"]["records_written"])
            await rt.terminate("hosted", timeout=0.1)
            return window

    pending, written = asyncio.run(main())
    assert pending == 2  # the bridge is full ...
    assert written == 3  # ... behind the one in the actor's hands: the rest wait upstream


def test_the_hosted_caller_of_a_rejected_message_gets_the_error() -> None:
    from pydotcompute.ring_kernels.runtime import RingKernelRuntime

    async def main() -> None:
        async with RingKernelRuntime() as rt:
            await rt.launch("hosted-strict", echo, tier="process", check_fields=False)
            await rt.activate("hosted-strict")
            bad = Strict(count="x")  # type: ignore[arg-type]
            with pytest.raises(MessageRejectedError) as info:
                await rt.send_and_receive("hosted-strict", bad, timeout=30)
            assert info.value.correlation_id == bad.message_id
            reply = await rt.send_and_receive("hosted-strict", Strict(count=4), timeout=30)
            assert reply.count == 4  # still serving

    asyncio.run(main())


def test_the_hosted_process_tier_carries_plain_values() -> None:
    from pydotcompute.ring_kernels.runtime import RingKernelRuntime

    async def main() -> list[Any]:
        async with RingKernelRuntime() as rt:
            await rt.launch("hosted-plain", echo, tier="process")
            await rt.activate("hosted-plain")
            for value in (7, "seven", [7]):
                await rt.send("hosted-plain", value)
            return [await rt.receive("hosted-plain", timeout=30) for _ in range(3)]

    assert asyncio.run(main()) == [7, "seven", [7]]


def test_the_childs_stderr_still_reaches_the_parents(tmp_path: Path) -> None:
    out = _run_script(
        tmp_path,
        """
        from test_cython_kernel import chatty
        if __name__ == "__main__":
            with CythonRingKernel("chatty", chatty) as kernel:
                kernel.send(1)
                print("REPLY:", kernel.receive(timeout=30))
            print("parent still speaking", file=sys.stderr)
        """,
    )
    assert "REPLY: 1" in out.stdout, out.stderr
    assert "chatty child speaking" in out.stderr
    assert "parent still speaking" in out.stderr


def test_the_hosted_caller_of_an_oversized_message_gets_the_error() -> None:
    from pydotcompute.ring_kernels.runtime import RingKernelRuntime

    async def main() -> None:
        async with RingKernelRuntime() as rt:
            await rt.launch("hosted-small", echo, tier="process", ring_bytes=4096)
            await rt.activate("hosted-small")
            big = Job(seq=1, payload="x" * 5000)
            with pytest.raises(MessageSerializationError, match="ring_bytes=") as info:
                await rt.send_and_receive("hosted-small", big, timeout=30)
            assert "launch(..., ring_bytes=" in str(info.value)
            reply = await rt.send_and_receive("hosted-small", Job(seq=2), timeout=30)
            assert reply.seq == 2  # the pump goes on

    asyncio.run(main())


def test_a_rejection_report_always_fits_a_small_outbox() -> None:
    cfg = CythonKernelConfig("tiny-out", output_ring_bytes=1024, check_fields=False)
    with CythonRingKernel("tiny-out", echo, config=cfg) as kernel:
        bad = Strict(count="n" * 3000)  # type: ignore[arg-type]
        kernel.send(bad)
        with pytest.raises(MessageRejectedError) as info:
            kernel.receive(timeout=30)
        assert info.value.correlation_id == bad.message_id
        assert kernel.is_running
        kernel.send(Strict(count=1))
        assert kernel.receive(timeout=30).count == 1


def test_undelivered_is_exact_after_finished_messages_were_pruned() -> None:
    cfg = CythonKernelConfig("pruned", input_queue_size=2)  # prunes every few sends
    kernel = CythonRingKernel("pruned", worker, config=cfg).start()
    for i in range(20):
        kernel.send(Job(seq=i), timeout=30)
        assert kernel.receive(timeout=30).seq == i
    kernel.send(Job(seq=20, payload="sleep"))
    kernel.send(Job(seq=21))
    kernel.send(Job(seq=22))
    time.sleep(0.2)
    assert kernel.stop(timeout=0.2) is False
    assert [m.seq for m in kernel.take_undelivered()] == [20, 21, 22]
    assert [m.seq for m in kernel.unprocessed()] == [21, 22]


# --- batches between the runtime and the child ------------------------------------------


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_a_batch_goes_in_at_once_and_replies_come_out_in_order_before_an_error() -> None:
    cfg = CythonKernelConfig("batch", check_fields=False)  # the child refuses the bad one
    w = process_worker.ProcessWorker("batch", echo, config=cfg)
    w.start()
    try:
        assert w.offer_many([]) == 0
        bad = Strict(count="x")  # type: ignore[arg-type]
        w.keep_encoded(bad, None)
        assert w.offer_many([Strict(count=1), Strict(count=2), bad, Strict(count=3)]) == 4
        _until(lambda: w.statistics()["outbox"]["pending_records"] == 4, "four records")
        assert [r.count for r in w.poll_replies(10)] == [1, 2]  # stops before the error
        with pytest.raises(MessageRejectedError) as info:
            w.poll_replies(10)
        assert info.value.correlation_id == bad.message_id
        assert [r.count for r in w.poll_replies(10)] == [3]
        assert w.poll_replies(10) == []
        with pytest.raises(MessageSerializationError):
            w.offer_many([object()])  # the first cannot be encoded: raised
        assert w.offer_many([Strict(count=4), object()]) == 1  # a later one: stops there
        _until(lambda: w.statistics()["outbox"]["pending_records"] == 1, "the reply")
        assert [r.count for r in w.poll_replies(10)] == [4]
    finally:
        w.stop(5.0)


def test_a_batch_of_mixed_messages_and_plain_values_keeps_order_and_types() -> None:
    """Batches are encoded and decoded in one C loop while every item is a message of one
    class; a plain value (a frame on the ring) or another class anywhere in a batch must
    come out as itself, in its place."""
    w = process_worker.ProcessWorker("mixed", echo, config=CythonKernelConfig("mixed"))
    w.start()
    try:
        sent: list[Any] = [Job(seq=0), Job(seq=1), 7, Job(seq=2), "eight", Done(seq=9, pid=1)]
        sent += [Job(seq=i) for i in range(10, 20)] + [[1, 2], Job(seq=20)]
        assert w.offer_many(sent) == len(sent)
        _until(lambda: w.statistics()["outbox"]["pending_records"] == len(sent), "replies")
        got: list[Any] = []
        while len(got) < len(sent):
            got += w.poll_replies(4)
        assert [type(g) for g in got] == [type(x) for x in sent]

        def key(x: Any) -> Any:  # a reply carries its request's id as its correlation
            return x.seq if isinstance(x, (Job, Done)) else x

        assert [key(g) for g in got] == [key(x) for x in sent]
    finally:
        w.stop(5.0)


def test_a_watching_loop_runs_the_writable_wakers_on_its_own_thread() -> None:
    """With an event loop watching the worker (`watch`), the child's space rings are the
    loop's to handle: the writable wakers run on the loop's thread (not on a watcher
    thread that would take the GIL from the loop), and the space pipe closes with the
    undo even when the worker stopped first."""
    # (a slow actor: it is still at its first message when the refused offer arms the
    # space pipe, so the ring that the test waits for comes when it finishes it)
    w = process_worker.ProcessWorker("watched", sleeper, config=CythonKernelConfig("watched"))
    called_on: list[int] = []
    w.add_waker(lambda: called_on.append(threading.get_ident()), when="writable")
    w.bound_in_flight(1)
    w.start()

    async def run() -> tuple[int, Any]:
        loop = asyncio.get_running_loop()
        unwatch = w.watch(loop, lambda: None)
        assert unwatch is not None
        jobs = [Job(seq=i) for i in range(4)]
        assert w.offer_many(jobs) == 2  # the bound, and one for the actor's hands
        assert not w.offer(jobs[2])  # refused: the space pipe is armed
        deadline = loop.time() + 30
        while not called_on:  # the child finishes its message and rings the space pipe
            assert loop.time() < deadline, "no writable wake-up"
            await asyncio.sleep(0.005)
        return threading.get_ident(), unwatch

    try:
        loop_thread, unwatch = asyncio.run(run())
        assert called_on
        assert set(called_on) == {loop_thread}
    finally:
        w.stop(5.0)
    unwatch()  # after the stop: closes what the loop was lent, once


def test_the_hand_over_bound_counts_replies_not_yet_read() -> None:
    w = process_worker.ProcessWorker("bound", sleeper, config=CythonKernelConfig("bound"))
    woken = threading.Event()
    w.add_waker(woken.set, when="writable")
    w.bound_in_flight(2)
    w.start()
    try:
        jobs = [Job(seq=i) for i in range(6)]
        assert w.offer_many(jobs) == 3  # the bound, and one for the actor's hands
        assert not w.offer(jobs[3])
        _until(lambda: w.pending_input == 2, "the actor to take the first")
        # the actor finishes the first and takes the next: its reply still counts
        _until(lambda: w.statistics()["outbox"]["pending_records"] == 1, "the first reply")
        assert not w.offer(jobs[3])
        woken.clear()
        assert [r.seq for r in w.poll_replies(10)] == [0]  # read: that opens the bound
        assert woken.is_set()
        assert w.offer(jobs[3])
        assert w.pending_input == 2
        assert not w.offer(jobs[4])
    finally:
        w.stop(0.1)
    assert [m.seq for m in w.take_undelivered()] == [1, 2, 3]
