"""The thread tier in the runtime: `runtime.launch(..., tier="thread")` builds a
`ThreadHostedKernel`, which runs its actor in a `HostedThreadWorker`.

The hosting bridge (`pydotcompute.ring_kernels.hosted.HostedKernel`) keeps the runtime's
policy; this class only says how to build the worker.

Design notes:
- `HostedThreadWorker` starts the actor through a method of its own, where a tracing
  runtime's `trace_wire` makes the actor's context traced before the actor runs: one
  ``None`` check per actor start, none per message, and `ThreadWorker` stays untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...hosted import HostedKernel
from ..contract import TierWorker
from .context import ThreadedKernelContext, TraceCarrier, TracedThreadedKernelContext
from .worker import ThreadedKernelConfig, ThreadedKernelFunc, ThreadWorker

__all__ = ("HostedThreadWorker", "ThreadHostedKernel")


class HostedThreadWorker(ThreadWorker):
    """The `ThreadWorker` of a runtime's thread-tier kernel, which a tracing runtime can
    instrument (`trace_wire`). Takes `ThreadWorker`'s arguments."""

    def __init__(self, kernel_id: str, kernel_func: ThreadedKernelFunc, **kwargs: Any) -> None:
        self._hosted_actor = kernel_func  # checked by the runtime at launch
        self._trace_carrier: TraceCarrier | None = None
        super().__init__(kernel_id, self._run_actor, **kwargs)

    def _run_actor(self, ctx: ThreadedKernelContext) -> Any:
        carrier = self._trace_carrier
        if carrier is not None:
            TracedThreadedKernelContext.adopt(ctx, carrier)
        return self._hosted_actor(ctx)

    def trace_wire(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """Hand each message to the actor with the context ``header(msg)`` gives (beside
        it, in this process), and report what the actor sends with its current context.

        The traced ``offer`` shadows the plain one on this instance (the way a tracing
        runtime shadows its ``send``), so an untraced worker checks nothing.
        """
        carrier = self._trace_carrier = TraceCarrier(received)
        plain_offer = self.offer

        def offer(msg: Any) -> bool:
            ids = header(msg)
            if ids is None:
                return plain_offer(msg)
            carrier.carry(msg, ids)  # before the actor can take it
            try:
                ok = plain_offer(msg)
            except BaseException:
                carrier.forget(msg)
                raise
            if not ok:
                carrier.forget(msg)
            return ok

        self.offer = offer  # type: ignore[method-assign]
        return True


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
            check_fields=self.config.check_fields,
        )
        return HostedThreadWorker(
            self.kernel_id,
            self._func,  # type: ignore[arg-type]
            config=cfg,
            input_type=self.input_type,
            output_type=self.output_type,
        )
