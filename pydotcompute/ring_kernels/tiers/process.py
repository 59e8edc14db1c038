"""The process tier: the actor runs in a child process over shared-memory rings.

The mechanism is `CythonRingKernel`
(compiled ring, or its pure-Python twin); `ProcessWorker` presents it through the
tier contract and `ProcessHostedKernel` is what
`runtime.launch(..., tier="process")` builds.

Design notes:
- The child's inbox ring is bounded by message count as well as bytes: the runtime gives
  it `bridge_queue_size` as its `input_queue_size`, so the user's inbox bound and
  priority bands act on everything the child has not yet been handed.
- The loop watches the reply doorbell and the child's exit itself (`watch`): one wake-up
  fewer per reply than a waker thread. It watches duplicates of the two descriptors, so
  the worker closing its own when it stops (in another thread) never pulls a descriptor
  out from under the loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from ..cython_kernel import CythonKernelConfig, CythonRingKernel
from ..hosted import HostedKernel
from .contract import TierWorker

__all__ = ("ProcessHostedKernel", "ProcessWorker")


def _drain_doorbell(fd: int) -> None:
    try:
        os.read(fd, 4096)
    except (BlockingIOError, InterruptedError):
        pass


class ProcessWorker(TierWorker):
    """A `CythonRingKernel` behind the tier contract."""

    ACTOR_KIND = "sync"

    def __init__(self, kernel: CythonRingKernel) -> None:
        self.kernel = kernel

    @property
    def max_message_bytes(self) -> int | None:
        return self.kernel.max_message_bytes

    @property
    def pending_input(self) -> int:
        return self.kernel.pending_input

    def start(self) -> None:
        self.kernel.start()

    def stop(self, timeout: float) -> bool:
        return self.kernel.stop(timeout)

    def offer(self, msg: Any) -> bool:
        return self.kernel.send_nowait(msg)

    def on_writable(self, callback: Callable[[], None]) -> None:
        self.kernel.add_waker(callback, when="writable")

    def poll_reply(self) -> Any:
        return self.kernel.receive_nowait()

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.kernel.add_waker(callback, when="readable")
        return lambda: self.kernel.remove_waker(callback)

    def watch(self, loop: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
        kernel = self.kernel
        bell, sentinel = (os.dup(fd) for fd in kernel.wait_handles())
        aloop: asyncio.AbstractEventLoop = loop

        def on_bell() -> None:
            _drain_doorbell(bell)
            callback()

        def on_exit() -> None:
            aloop.remove_reader(sentinel)  # it stays readable once the child has gone
            # record the exit (reaping may wait on the watcher thread: not on the loop),
            # then wake the collector, which reports it
            done = aloop.run_in_executor(None, kernel.join, 5.0)
            done.add_done_callback(lambda _: callback())

        try:
            aloop.add_reader(bell, on_bell)
            aloop.add_reader(sentinel, on_exit)
        except NotImplementedError:  # a loop without add_reader (Windows' proactor)
            os.close(bell)
            os.close(sentinel)
            return None
        kernel.arm_receive()  # the child rings the doorbell on every reply

        def unwatch() -> None:
            for fd in (bell, sentinel):
                aloop.remove_reader(fd)
                os.close(fd)

        return unwatch

    def drain_replies(self) -> list[Any]:
        return self.kernel.drain_replies()

    def take_undelivered(self) -> list[Any]:
        return self.kernel.take_undelivered()

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        return self.kernel.drain_latencies()

    @property
    def failure(self) -> BaseException | None:
        return self.kernel.error


class ProcessHostedKernel(HostedKernel):
    """Tier 3 in the runtime: the actor runs in a child process over shared-memory rings.

    The actor function must be importable by the child (a module-level function).
    Extra options: ``bridge_queue_size``, ``ring_bytes`` (each ring's capacity; a message
    must encode to at most ``ring_bytes - 8``), ``spin_us`` (how long the child polls for
    its next message before parking; default ``HOSTED_SPIN_US``).
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "ring_bytes", "spin_us"})
    # The child spins this long for its next message before parking (direct use: 50 us).
    # Hosted, the next message comes a loop round trip later (30-50 us here): with 50 us
    # the child often just missed it, parked, and each message then paid a wake-up
    # (round trips 80-110 us instead of ~50). Adaptive spinning still shrinks it when idle.
    HOSTED_SPIN_US = 200.0
    __slots__ = ()

    def _make_worker(self, bridge: int) -> TierWorker:
        kwargs: dict[str, Any] = {
            "spin_us": self.config.extra.get("spin_us", self.HOSTED_SPIN_US),
            "input_queue_size": bridge,
            "record_latency": self._timed,
        }
        ring_bytes = self.config.extra.get("ring_bytes")
        if ring_bytes is not None:
            kwargs["ring_bytes"] = ring_bytes
        cfg = CythonKernelConfig(self.kernel_id, **kwargs)
        return ProcessWorker(
            CythonRingKernel(
                self.kernel_id,
                self._func,
                config=cfg,
                input_type=self.input_type,
                output_type=self.output_type,
            )
        )
