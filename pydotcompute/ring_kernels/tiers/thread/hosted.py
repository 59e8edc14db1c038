"""The thread tier in the runtime: `runtime.launch(..., tier="thread")` builds a
`ThreadHostedKernel`, which runs its actor in a `HostedThreadWorker`.

The hosting bridge (`pydotcompute.ring_kernels.hosted.HostedKernel`) keeps the runtime's
policy; this class only says how to build the worker.

Design notes:
- Under an instrumented runtime the kernel builds a `TracedThreadWorker` instead: its
  ``offer`` hands each message's trace context over beside it and its actor gets a
  `TracedThreadedKernelContext` from the start (`trace_wire` arms both before the actor
  runs). A plain runtime's worker is the untraced class, so it checks nothing per
  message; nothing of a live worker or context is replaced.
- Direct edges (kind ``"objects"``, `edge.py`, and ``"shm-ring"`` to and from a process
  actor, whose in-process ends the process tier provides by name) hang off the hosted
  worker only: the standalone `ThreadedRingKernel` has no runtime to connect it.
- The hosted worker does not check what it is handed (type, fields): the bridge admitted
  every message first (`HostedKernel._admit`, or `send`'s exact-type check), so a second
  check per message was pure cost, on the pipelined path most of all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ....exceptions import InvalidConfigurationError
from ...hosted import HostedKernel
from ..contract import TierWorker
from .context import ThreadedKernelContext, TraceCarrier, TracedThreadedKernelContext
from .edge import KIND, SHM_KIND, EdgeEnds
from .worker import ThreadedKernelConfig, ThreadedKernelFunc, ThreadWorker

__all__ = ("HostedThreadWorker", "ThreadHostedKernel", "TracedThreadWorker")


class HostedThreadWorker(ThreadWorker):
    """The `ThreadWorker` of a runtime's thread-tier kernel, which direct edges connect
    (`open_edge`, `route_into`); `TracedThreadWorker` also carries trace context.
    Takes `ThreadWorker`'s arguments, and ``edge_bound``: the ``(capacity, policy)`` of each
    edge into it (its kernel's ``input_queue_size`` and backpressure)."""

    #: `ThreadWorker`'s, with direct edges of kinds ``"objects"`` and ``"shm-ring"`` both
    #: ways (spread over the replica edges into a pool, `pool_edges.Spread`), trace
    #: context carried to the actor (`trace_wire`), and urgent messages passing what the
    #: actor holds (`urgent_lane`: its inbox is always an `SPSCQueue`).
    CAPABILITIES = dataclasses.replace(
        ThreadWorker.CAPABILITIES,
        edges_out=frozenset({KIND, SHM_KIND}),
        edges_in=frozenset({KIND, SHM_KIND}),
        edges_spread=frozenset({KIND, SHM_KIND}),
        trace_wire=True,
        urgent_lane=True,
    )

    def __init__(
        self,
        kernel_id: str,
        kernel_func: ThreadedKernelFunc,
        *,
        edge_bound: tuple[int, str] = (4096, "block"),
        **kwargs: Any,
    ) -> None:
        self._hosted_actor = kernel_func  # checked by the runtime at launch
        config = kwargs.get("config")
        if config is not None and not config.use_spsc:
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: a hosted thread worker's inbox is an SPSCQueue "
                "(its urgent lane is the tier's promise); use_spsc must stay True"
            )
        super().__init__(kernel_id, self._run_actor, **kwargs)
        # the runtime's bridge admits every message (its type and fields) before handing
        # it over, and edges write to their own queues: no second check per message
        self._admits = False
        self._edges = EdgeEnds(
            kernel_id,
            self.inbox,
            self.outbox,
            capacity=edge_bound[0],
            policy=edge_bound[1],
            input_type=kwargs.get("input_type"),
            output_type=kwargs.get("output_type"),
        )

    # -- direct edges -------------------------------------------------------------------

    def open_edge(self, kind: str, source_id: str) -> Any:
        if kind not in (KIND, SHM_KIND):
            return super().open_edge(kind, source_id)  # type: ignore[no-any-return]
        return self._edges.open(source_id, kind)

    def route_into(self, edge: Any) -> None:
        if edge is not None and edge.kind not in (KIND, SHM_KIND):
            super().route_into(edge)
        self._edges.route(edge)

    def pause_edges(self, paused: bool) -> None:
        self._edges.pause(paused)

    def share_edge_bound(self, replicas: int) -> None:
        """One of ``replicas`` of a pool: each edge into it holds its share of the bound."""
        self._edges.share_bound(replicas)

    def stop(self, timeout: float = 5.0) -> bool:
        """As `ThreadWorker.stop`; when the actor has not finished within ``timeout``, the
        incoming edges close at once (what they hold is handed back by
        `take_undelivered`), so the actor takes nothing more from them."""
        if self._edges.queued or self._edges.routed_in:
            self.request_stop()
            if not self.join(timeout):
                self._edges.close()
                timeout = min(max(timeout, 0.0), 0.5)
        return super().stop(timeout)

    def take_undelivered(self) -> list[Any]:
        """As `ThreadWorker.take_undelivered`, then what the incoming edges still hold
        (they close: later sends into them take the loop path)."""
        return super().take_undelivered() + self._edges.take_left()

    @property
    def is_idle(self) -> bool:
        return super().is_idle and not self._edges.queued

    def _run_actor(self, ctx: ThreadedKernelContext) -> Any:
        self._edges.adopt(ctx)
        if not isinstance(ctx, TracedThreadedKernelContext):
            return self._hosted_actor(ctx)
        try:
            result = self._hosted_actor(ctx)
        except BaseException as exc:
            ctx.finish(exc)  # the span it recorded for an edge message says so
            raise
        ctx.finish(None)
        return result


class TracedThreadWorker(HostedThreadWorker):
    """A `HostedThreadWorker` that can carry trace context (`trace_wire`): what
    `ThreadHostedKernel` builds under an instrumented runtime."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trace_header: Callable[[Any], tuple[int, int, int] | None] | None = None
        self._trace_carrier: TraceCarrier | None = None

    def trace_wire(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """Hand each message to the actor with the context ``header(msg)`` gives (beside
        it, in this process), and report what the actor sends with its current context.
        Called before `start`: the actor's context is built traced; what comes over a
        direct edge into it carries its context too."""
        carrier = self._trace_carrier = TraceCarrier(received)
        self._trace_header = header
        self._edges.trace_into(carrier)
        return True

    def _new_context(self) -> ThreadedKernelContext:
        carrier = self._trace_carrier
        if carrier is None:
            return super()._new_context()
        return TracedThreadedKernelContext(self, carrier)

    def offer(self, msg: Any) -> bool:
        header, carrier = self._trace_header, self._trace_carrier
        ids = None if header is None else header(msg)
        if ids is None or carrier is None:
            return super().offer(msg)
        carrier.carry(msg, ids)  # before the actor can take it
        try:
            ok = super().offer(msg)
        except BaseException:
            carrier.forget(msg)
            raise
        if not ok:
            carrier.forget(msg)
        return ok


class ThreadHostedKernel(HostedKernel):
    """Tier 2 in the runtime: the actor is a plain function running in its own thread.

    The actor receives a `ThreadedKernelContext` (blocking ``receive``/``send``).
    Extra options: ``bridge_queue_size``, ``thread_name``.
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "thread_name"})
    WORKER = HostedThreadWorker
    __slots__ = ()

    def _make_worker(self, bridge: int) -> TierWorker:
        # an instrumented runtime may carry trace context: the worker that can (see notes)
        worker_class = TracedThreadWorker if self.instruments else HostedThreadWorker
        cfg = ThreadedKernelConfig(
            self.kernel_id,
            input_queue_size=bridge,
            output_queue_size=max(bridge, 1024),
            thread_name=self.config.extra.get("thread_name"),
            record_latency=self._timed,
            check_fields=self.config.check_fields,
        )
        return worker_class(
            self.kernel_id,
            self._func,  # type: ignore[arg-type]
            config=cfg,
            input_type=self.input_type,
            output_type=self.output_type,
            edge_bound=(self.config.input_queue_size, str(self.config.backpressure_strategy)),
        )
