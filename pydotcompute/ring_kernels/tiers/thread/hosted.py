"""The thread tier in the runtime: `runtime.launch(..., tier="thread")` builds a
`ThreadHostedKernel`, which runs its actor in a `ThreadWorker`.

The hosting bridge (`pydotcompute.ring_kernels.hosted.HostedKernel`) keeps the runtime's
policy; this class only says how to build the worker.
"""

from __future__ import annotations

from ...hosted import HostedKernel
from ..contract import TierWorker
from .worker import ThreadedKernelConfig, ThreadWorker

__all__ = ("ThreadHostedKernel",)


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
            self.kernel_id,
            self._func,  # type: ignore[arg-type]
            config=cfg,
            input_type=self.input_type,
            output_type=self.output_type,
        )
