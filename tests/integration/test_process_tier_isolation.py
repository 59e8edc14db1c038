"""The process tier as one process among others: what its children send back, what it does
to the parent's stderr while starting them, and what a ``fork()`` of the parent does to them.

- A reply of a class the parent never imported is counted as dropped, its caller told,
  logged once, and the kernel keeps serving.
- Starting several children at once leaves the parent's fd 2 exactly where it was.
- A ``fork()`` child of the parent (not one of the runtime's) that exits normally leaves
  the parent's kernel children alone.

Actors are module-level so that a child process can import them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import QueueClosedError, ReplyDecodeError
from pydotcompute.ring_kernels import KernelState
from tests import tier_scenarios as sc

BOUND_S = sc.BOUND_S
ROOT = Path(__file__).resolve().parents[2]


def alien_replier(ctx: Any) -> None:
    """Answers ``payload="alien"`` with a message class that exists only in the child."""

    @message
    class ChildOnly:  # defined here, in the child: the parent never has this class
        seq: int

    while not ctx.should_terminate:
        try:
            job = ctx.receive(timeout=0.05)
        except QueueClosedError:
            return
        if job is None:
            continue
        ctx.send(ChildOnly(seq=job.seq) if job.payload == "alien" else sc.Done(seq=job.seq))


async def test_reply_of_a_class_the_parent_never_imported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pydotcompute")
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("k", alien_replier, input_type=sc.Job, tier="process")
        await rt.activate("k")
        with pytest.raises(ReplyDecodeError, match=r"import the module that defines") as info:
            await rt.send_and_receive("k", sc.Job(seq=1, payload="alien"), timeout=BOUND_S)
        assert "ChildOnly" in str(info.value)
        # the kernel keeps serving, a second bad reply included
        assert (await rt.send_and_receive("k", sc.Job(seq=2), timeout=BOUND_S)).seq == 2
        await rt.send("k", sc.Job(seq=3, payload="alien"))
        assert (await rt.send_and_receive("k", sc.Job(seq=4), timeout=BOUND_S)).seq == 4
        assert rt.get_kernel_state("k") is KernelState.ACTIVE
        tel = rt.get_telemetry("k")
        assert tel.messages_dropped == 2
        assert tel.error_count == 2
        assert str(tel.last_error).startswith("ReplyDecodeError")
        left = await rt.terminate("k")
        assert left == []
    logged = [r for r in caplog.records if "does not decode" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in logged]


# --- the parent's stderr while children start ------------------------------------------------


async def test_concurrent_starts_leave_fd2_where_it_was(capfd: pytest.CaptureFixture[str]) -> None:
    before = os.fstat(2)
    for round_ in range(4):
        async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
            await asyncio.gather(
                *(
                    rt.launch(f"k{i}", sc.echo_sync, input_type=sc.Job, tier="process", replicas=2)
                    for i in range(2)
                )
            )
            await asyncio.gather(*(rt.activate(f"k{i}") for i in range(2)))
            after = os.fstat(2)
            assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino), round_
    marker = "stderr still reaches its file"
    os.write(2, marker.encode())
    assert marker in capfd.readouterr().err


# --- a fork() of the parent ------------------------------------------------------------------

_FORK_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from pydotcompute import RingKernelRuntime
    from tests.tier_scenarios import Job, Done, echo_sync

    async def start(rt):
        await rt.launch("k", echo_sync, input_type=Job, output_type=Done, tier="process")
        await rt.activate("k")
        return (await rt.send_and_receive("k", Job(seq=1), timeout=30)).seq

    async def check(rt):
        try:
            seq = (await rt.send_and_receive("k", Job(seq=2), timeout=30)).seq
        finally:
            await rt.shutdown()
        return seq

    if __name__ == "__main__":
        rt = RingKernelRuntime()
        loop = asyncio.new_event_loop()
        assert loop.run_until_complete(start(rt)) == 1
        pid = os.fork()
        if pid == 0:
            # what the interpreter may do to the inherited kernel objects on the way out
            rt.get_kernel("k").worker.__del__()
            sys.exit(0)  # a normal exit: the exit handlers run here
        _, status = os.waitpid(pid, 0)
        print("fork child status", status, flush=True)
        print("kernel", rt.get_kernel_state("k").name, flush=True)
        print("reply", loop.run_until_complete(check(rt)), flush=True)
        loop.close()
    """
)


def test_a_fork_child_leaves_the_kernel_children_alone(tmp_path: Path) -> None:
    script = tmp_path / "fork_parent.py"
    script.write_text(_FORK_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=BOUND_S * 3,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "fork child status 0" in done.stdout, (done.stdout, done.stderr)
    assert "kernel ACTIVE" in done.stdout, (done.stdout, done.stderr)
    assert "reply 2" in done.stdout, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert time.monotonic() - started < BOUND_S * 3


# --- plain values the ring can never carry ---


@pytest.mark.parametrize("queued_ahead", [False, True])
async def test_a_plain_value_too_large_for_the_ring_is_refused_to_the_caller(
    queued_ahead: bool,
) -> None:
    """A plain value (not a ``@message``) that encodes to more than the ring holds is
    refused at the send, naming the size and ``ring_bytes``, as a ``@message`` is: not
    dropped later by the bridge with the caller told nothing. The kernel keeps serving."""
    from pydotcompute.exceptions import MessageSerializationError
    from tests.integration.tier_actors import forward_sync

    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        await rt.launch("p", forward_sync, tier="process", ring_bytes=1 << 16)
        await rt.activate("p")
        if queued_ahead:  # the inbox path: messages wait ahead of it
            await rt.deactivate("p")
            await rt.send("p", b"small")
        with pytest.raises(MessageSerializationError, match=r"ring_bytes=\d+"):
            await rt.send("p", b"x" * (1 << 17))
        if queued_ahead:
            await rt.reactivate("p")
            assert await rt.receive("p", timeout=sc.BOUND_S) == b"small"
        await rt.send("p", b"after")
        assert await rt.receive("p", timeout=sc.BOUND_S) == b"after"
        assert rt.get_telemetry("p").messages_dropped == 0
