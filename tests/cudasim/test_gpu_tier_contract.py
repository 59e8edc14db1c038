"""The tier contract on the GPU tier, under the Numba CUDA simulator.

The CPU tiers run the scenarios of ``tests/tier_scenarios.py`` with Python actors; a GPU
kernel's handler is a device function over fixed-layout messages, so the same promises are
checked here with the GPU suite's messages and handlers (and the same exactly-once check).
Run in its own process: ``NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cudasim``.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelStateError,
    QueueTimeoutError,
)
from pydotcompute.ring_kernels import KernelState
from tests.gpu_ring_kernel_suite import Add, Seq, SeqOut, Sum, add_handler, launch_gpu, seq_handler
from tests.tier_scenarios import BOUND_S, assert_exactly_once

pytest.importorskip("numba.cuda")


def _state() -> np.ndarray:
    return np.zeros(1, np.int64)


async def test_restart_is_refused_at_launch() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        with pytest.raises(
            InvalidConfigurationError, match="restart='on_failure' is not supported on the gpu"
        ):
            await launch_gpu(rt, "add", add_handler, Add, Sum, state=_state(), restart="on_failure")
        assert "add" not in rt


async def test_receive_on_a_launched_kernel_raises_at_once() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await launch_gpu(rt, "add", add_handler, Add, Sum, state=_state(), activate=False)
        with pytest.raises(KernelStateError, match="LAUNCHED"):
            await asyncio.wait_for(rt.receive("add"), 5)
        with pytest.raises(KernelStateError, match="LAUNCHED"):
            await asyncio.wait_for(rt.send_and_receive("add", Add(a=1.0, b=2.0)), 5)


async def test_abandoned_replies_are_dropped_and_counted() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await launch_gpu(rt, "add", add_handler, Add, Sum, state=_state(), queue_size=4)
        await rt.deactivate("add")  # no reply can come while it waits
        for i in range(8):
            with contextlib.suppress(QueueTimeoutError):
                await rt.send_and_receive("add", Add(a=float(i), b=0.0), timeout=0.01)
        await rt.reactivate("add")
        reply = await rt.send_and_receive("add", Add(a=1.0, b=2.0), timeout=20)
        assert reply.total == 3.0
        assert rt.receive_nowait("add") is None  # no stale reply in the outbox
        assert rt.get_kernel_state("add") is KernelState.ACTIVE


async def test_terminate_accounts_for_every_message() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await launch_gpu(rt, "seq", seq_handler, Seq, SeqOut, state=_state(), queue_size=8)
        accepted: list[int] = []

        async def sender() -> None:
            for i in range(100):
                await rt.send("seq", Seq(seq=i))
                accepted.append(i)

        task = asyncio.create_task(sender())
        await asyncio.sleep(0.5)  # nothing is read: the bounds fill
        left = await rt.terminate("seq", timeout=2)
        with contextlib.suppress(KernelStateError):
            await task
        read: list[int] = []
        while True:
            try:
                reply = rt.receive_nowait("seq")
            except KernelStateError:
                break
            if reply is None:
                break
            read.append(reply.seq)
        dropped = rt.get_telemetry("seq").messages_dropped
        assert_exactly_once(accepted, read, [m.seq for m in left], dropped)


async def test_same_request_object_twice_gets_a_reply_per_call() -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await launch_gpu(rt, "add", add_handler, Add, Sum, state=_state(), queue_size=4)
        req = Add(a=1.0, b=2.0)
        a, b = await asyncio.gather(
            rt.send_and_receive("add", req, timeout=20), rt.send_and_receive("add", req)
        )
        assert (a.total, b.total) == (3.0, 3.0)
        await rt.deactivate("add")  # no reply can come while it waits
        retry = Add(a=2.0, b=2.0)
        with contextlib.suppress(QueueTimeoutError):
            await rt.send_and_receive("add", retry, timeout=0.01)
        await rt.reactivate("add")
        assert (await rt.send_and_receive("add", retry, timeout=20)).total == 4.0
        assert (await rt.send_and_receive("add", Add(a=0.0, b=1.0), timeout=20)).total == 1.0
        assert rt.receive_nowait("add") is None  # no stray reply in the outbox
