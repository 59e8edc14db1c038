"""The thread tier: the actor is a plain function running in a thread of its own.

The mechanism is `ThreadedRingKernel`;
`ThreadWorker` presents it through the tier contract and `ThreadHostedKernel`
is what `runtime.launch(..., tier="thread")` builds.

Design notes:
- A thread cannot be interrupted: a message its actor still holds when terminate's grace
  period runs out is finished late, and its reply is counted as dropped
  (`on_late_reply`), not handed back as undelivered as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..hosted import HostedKernel
from ..threaded_kernel import ThreadedKernelConfig, ThreadedRingKernel
from .contract import TierWorker

__all__ = ("ThreadHostedKernel", "ThreadWorker")


class ThreadWorker(TierWorker):
    """A `ThreadedRingKernel` behind the tier contract."""

    ACTOR_KIND = "sync"

    def __init__(self, kernel: ThreadedRingKernel) -> None:
        self.kernel = kernel

    @property
    def pending_input(self) -> int:
        return self.kernel.pending_input

    @property
    def is_idle(self) -> bool:
        return self.kernel.is_idle

    def start(self) -> None:
        self.kernel.start()

    def stop(self, timeout: float) -> bool:
        return self.kernel.stop(timeout)

    def offer(self, msg: Any) -> bool:
        return self.kernel.send_nowait(msg)

    def on_writable(self, callback: Callable[[], None]) -> None:
        self.kernel.inbox.add_waker(callback, when="writable")

    def poll_reply(self) -> Any:
        return self.kernel.receive_nowait()

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        outbox = self.kernel.outbox
        outbox.add_waker(callback)
        return lambda: outbox.remove_waker(callback)

    def drain_replies(self) -> list[Any]:
        return self.kernel.drain_replies()

    def on_late_reply(self, callback: Callable[[], None]) -> None:
        self.kernel.outbox.add_waker(callback)
        callback()  # any that arrived before the waker was in place

    def take_undelivered(self) -> list[Any]:
        return self.kernel.take_undelivered()

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        return self.kernel.drain_latencies()

    @property
    def failure(self) -> BaseException | None:
        return self.kernel.error


class ThreadHostedKernel(HostedKernel):
    """Tier 2 in the runtime: the actor is a plain function running in its own thread.

    The actor receives a `ThreadedKernelContext` (blocking ``receive``/``send``).
    Extra options: ``bridge_queue_size``, ``thread_name``.
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "thread_name"})
    __slots__ = ()

    def _make_worker(self, bridge: int) -> TierWorker:
        cfg = ThreadedKernelConfig(
            self.kernel_id,
            input_queue_size=bridge,
            output_queue_size=max(bridge, 1024),
            thread_name=self.config.extra.get("thread_name"),
            record_latency=self._timed,
        )
        return ThreadWorker(
            ThreadedRingKernel(
                self.kernel_id,
                self._func,  # type: ignore[arg-type]
                config=cfg,
                input_type=self.input_type,
                output_type=self.output_type,
            )
        )
