"""The Ray tier in the runtime: `runtime.launch(..., tier="ray")` builds a `RayTierKernel`,
whose actor runs in a Ray actor driven by a `worker.RayWorker`.

The hosting bridge (`pydotcompute.ring_kernels.hosted.HostedKernel`) keeps the runtime's
policy on the driver, as for the thread and process tiers: the banded inbox with the user's
bound and backpressure, correlated ``send_and_receive``, accounting, ordered shutdown,
``connect`` in and out (with kernels of any tier). This class builds the worker, places it
(Ray options, resources) and folds into the kernel's telemetry what happened in the actor.

Design notes:
- The tier inside the Ray actor is the ``actor_tier`` option (asyncio by default); its
  actor kind is the one checked at launch. The actor's own runtime applies the restart
  policy to its function; Ray restarts the actor itself (``restart="on_failure"`` also
  sets Ray's ``max_restarts``), and the worker launches the kernel in it again.
- ``bridge_queue_size`` defaults to twice the session's ``max_batch`` (2,048): a Ray call
  costs about a millisecond, so the bridge must hold several batches to keep the actor
  busy. An urgent message waits behind at most that many; set it lower for a tighter bound.
- Telemetry is read without a Ray call: what the actor counted (restarts, errors, drops,
  requests it raised on) comes back with its replies, its latencies with a background
  call that the previous read started (`RayWorker.drain_latencies`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ....decorators.validators import validate_config
from ....exceptions import (
    InvalidConfigurationError,
    KernelStateError,
    QueueTimeoutError,
    TypeValidationError,
)
from ...hosted import HostedKernel
from ...message import RingKernelMessage
from ...states import KernelState
from .. import check_actor_kind, tier_class
from ..contract import TierWorker
from .session import RAY_ACTOR_OPTIONS, RaySession, session_for
from .wire import unpack_error
from .worker import RayWorker

__all__ = ("RayTierKernel",)

_ENDED = (KernelState.TERMINATED, KernelState.FAILED)
_CATCH_UP_S = 5.0  # how long an answer saying the kernel ended waits for the driver to hear


class RayTierKernel(HostedKernel):
    """A ring kernel whose actor runs in a Ray actor (``tier="ray"``).

    Extra options: the Ray placement options (``num_cpus``, ``num_gpus``, ``resources``,
    ``scheduling_strategy``, ...), ``ray_options`` (more ``ActorClass.options``),
    ``check_resources`` (refuse resources the cluster lacks; default True),
    ``actor_tier`` (the tier inside the actor) and ``bridge_queue_size``.
    """

    #: Its capabilities are the worker's (`RayWorker.CAPABILITIES`): the actor's kind is
    #: checked in `launch`, against the tier inside the actor (asyncio: async functions);
    #: the actor's runtime restarts its function, Ray restarts the actor; one kernel is
    #: one Ray actor (launch several kernels for several actors).
    WORKER = RayWorker
    EXTRA_OPTIONS = RAY_ACTOR_OPTIONS | frozenset(
        {"ray_options", "check_resources", "actor_tier", "bridge_queue_size"}
    )

    __slots__ = ("_ray", "_session")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: RaySession = session_for(self._runtime, enable_telemetry=self._timed)
        self._ray: RayWorker | None = None

    def __repr__(self) -> str:
        name = self._ray.actor_name if self._ray is not None else ""
        return f"<RayTierKernel {self.kernel_id!r} {self._state.name} actor={name!r}>"

    # -- what is particular to Ray ------------------------------------------------------

    @property
    def session(self) -> RaySession:
        """The `RaySession` this kernel runs in (shared by its runtime's Ray kernels)."""
        return self._session

    def _placed(self) -> RayWorker:
        ray = self._ray
        if ray is None or ray.actor is None:
            self._check("use")
            raise InvalidConfigurationError(f"kernel {self.kernel_id!r} has no Ray actor yet")
        return ray

    @property
    def actor(self) -> Any:
        """The Ray actor handle (``ray.kill(kernel.actor)`` simulates a lost actor)."""
        return self._placed().actor

    @property
    def actor_name(self) -> str:
        """The Ray actor's name (unique per session)."""
        return self._placed().actor_name

    @property
    def ray_options(self) -> dict[str, Any]:
        """The ``ActorClass.options(...)`` the actor was created with."""
        return self._placed().ray_options

    @property
    def lost_with_actor(self) -> int:
        """Messages (and replies) that died with a lost Ray actor: counted as dropped,
        reason ``actor_lost``, never handed back (the shutdown report adds them)."""
        return (self.telemetry.drops_by_reason or {}).get("actor_lost", 0)

    @property
    def restarts(self) -> int:
        """How many times Ray restarted the actor (its function's restarts inside the
        actor are counted in telemetry's ``restarts`` too)."""
        return 0 if self._ray is None else self._ray.restarts

    # -- lifecycle ----------------------------------------------------------------------

    async def launch(self) -> None:
        """Create the Ray actor and launch the kernel in it (LAUNCHED).

        Ray placement options, ``ray_options`` and the session's ``actor_options`` go to
        the actor; a kernel on the GPU tier inside the actor asks for ``num_gpus=1`` unless
        told otherwise. The kernel function and its message classes must be importable
        by the Ray workers.

        Raises:
            InvalidConfigurationError: a bad option, resources the cluster does not have
                (with ``check_resources``), or an actor that could not start.
        """
        extra = dict(self.config.extra)
        ray_options = extra.pop("ray_options", None)
        check_resources = extra.pop("check_resources", True)
        named = extra.pop("actor_tier", None)
        bridge = extra.pop("bridge_queue_size", None)
        actor_tier = named or "asyncio"
        if actor_tier == "ray":
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: actor_tier='ray' would nest a Ray actor in a Ray "
                "actor; choose the tier inside the actor: 'asyncio', 'thread' or 'process'"
            )
        inner = tier_class(actor_tier)
        check_actor_kind(self.kernel_id, named or "ray", self._func, inner.CAPABILITIES.actor_kind)
        session = self._session
        actor_opts = session.options_for(self.kernel_id, extra, ray_options)
        if bridge is None:
            bridge = 2 * session.max_batch
        if type(bridge) is not int or bridge < 1:
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: bridge_queue_size must be an int >= 1, got {bridge!r}"
            )
        # the actor's inbox: half the bridge (the rest is on its way), and never more than
        # the user's bound, which a direct edge from another actor meets there
        inbox = max(1, min(bridge // 2, self.config.input_queue_size))
        policy = self.config.backpressure_strategy  # a direct edge meets it in the actor
        config = dataclasses.replace(
            self.config,
            tier=actor_tier,
            extra={},
            backpressure_strategy="block",
            input_queue_size=inbox,
        )
        validate_config(config)
        if actor_tier in ("gpu", "cuda") and "num_gpus" not in actor_opts:
            actor_opts["num_gpus"] = 1
        session.start()
        if check_resources:
            session.check_resources(self.kernel_id, actor_opts)
        self._ray = RayWorker(
            self.kernel_id,
            self._func,
            input_type=self.input_type,
            output_type=self.output_type,
            config=config,
            options=extra,
            actor_opts=actor_opts,
            session=session,
            room=max(1, bridge - inbox),
            on_events=self._actor_events,
            tracing=self._runtime is not None and self._runtime.tracer is not None,
            edge_backpressure=str(getattr(policy, "value", policy)),
        )
        self.config.extra = {"bridge_queue_size": bridge}
        await self._ray.create()
        try:
            await super().launch()
        except BaseException:
            await self._ray.release()
            raise
        self._direct = False  # every send is checked (`_admit`): it must encode

    def _make_worker(self, bridge: int) -> TierWorker:
        assert self._ray is not None
        return self._ray

    def forward_to(self, target: Any) -> None:
        """As `RingKernel.forward_to`; into another Ray kernel of the same session the
        edge is direct: this kernel's actor hands its batches to the target's actor, and
        the driver carries control only (a reply already on its way to the driver when
        the edge is made is forwarded from here)."""
        super().forward_to(target)
        ray = self._ray
        if ray is None:
            return
        if (
            isinstance(target, RayTierKernel)
            and target.session is self._session
            and target.state not in _ENDED
        ):
            ray.forward_direct(
                target.kernel_id, target.actor, restarted=target.config.restart == "on_failure"
            )
        else:
            ray.forward_direct(None, None)

    @property
    def direct_edge(self) -> str | None:
        """The kernel this one's actor forwards into directly, actor to actor, or None."""
        return None if self._ray is None else self._ray.direct_target

    async def release(self) -> None:
        """End the Ray actor now (idempotent; no drain: `terminate` is the graceful stop)."""
        if self._ray is not None:
            await self._ray.release()

    # -- messages -----------------------------------------------------------------------

    def _admit(self, msg: Any) -> None:
        """Refuse at once what cannot cross to the actor: not a message, not the kernel's
        ``input_type``, or a message that does not encode (a value nested too deeply)."""
        if not isinstance(msg, RingKernelMessage):
            self._validate_in(msg)  # (the expected type, named, when there is one)
            raise TypeValidationError(
                f"kernel {self.kernel_id!r} runs in a Ray actor, so its messages cross as "
                f"MessagePack and must be @message objects; got {type(msg).__name__}"
            )
        super()._admit(msg)
        msg.serialize()  # the worker encodes it again: an encoder's refusal comes here

    async def send_and_receive(self, msg: Any, timeout: float | None = None) -> Any:
        """As `RingKernel.send_and_receive`; when nothing waits to be sent before it, the
        request and its reply go as one Ray call (admitted after every batch on its way)."""
        ray = self._ray
        inbox = self._inbox
        if (
            ray is None
            or self._instruments  # an instrumented bridge reports: the bridge's road
            or self._state is not KernelState.ACTIVE
            or self._stopping
            or self._gate is not None
            or self._held is not None
            or self._backlog
            or self.config.serialize
            or inbox is None
            or inbox.qsize
            or not ray.can_request
            or not isinstance(msg, RingKernelMessage)
        ):
            return await super().send_and_receive(msg, timeout)
        self._admit(msg)
        self._handed_direct += 1
        if self._timed:
            self.telemetry.messages_processed += 1
        try:
            reply = await ray.request(msg, timeout)
        except KernelStateError as exc:
            await self._catch_up(exc)
            raise
        if self._timed:
            self.telemetry.messages_sent += 1
        return reply

    async def _catch_up(self, exc: KernelStateError) -> None:
        """An answer says the kernel in the actor ended (its function returned, or it
        failed for good) before the driver heard: wait (bounded) for the news, so that
        whoever hears of it finds the kernel ended and what it held handed back."""
        if getattr(exc, "restarted", False) or exc.state not in _ENDED:
            return
        collector = self._collector  # it ends the kernel once the worker says so
        if collector is not None and not collector.done():
            await asyncio.wait({collector}, timeout=_CATCH_UP_S)

    async def send_batch(self, msgs: Any, timeout: float | None = None) -> int:
        """Send many messages (they cross in batches either way); returns how many."""
        n = 0
        for msg in msgs:
            await self.send(msg, timeout)
            n += 1
        return n

    async def receive_batch(self, max_count: int = 1024, timeout: float | None = None) -> list[Any]:
        """Up to ``max_count`` replies: waits (up to ``timeout``) for the first, then takes
        what has arrived; ``[]`` when the timeout passes first."""
        try:
            out = [await self.receive(timeout)]
        except QueueTimeoutError:
            return []
        while len(out) < max_count:
            try:
                reply = self.receive_nowait()
            except KernelStateError:  # drained and closed: the next call says so
                break
            if reply is None:
                break
            out.append(reply)
        return out

    # -- what the actor counted ---------------------------------------------------------

    def _actor_events(self, events: dict[str, Any]) -> None:
        """Fold into this kernel what its actor counted: its function's restarts and
        errors, drops in the actor (replies refused downstream, the message an actor
        raised on, what died with a lost actor), and requests it raised on (their callers
        are told at once)."""
        lost = events.get("failed_before_start")
        if lost is not None:  # its actor died before activate: nothing else would tell
            if self._state is KernelState.LAUNCHED:
                self._fail(lost)
            return
        tel = self.telemetry
        sent = events.get("sent")
        if sent and self._timed:
            tel.messages_sent += sent
        restarts = events.get("restarts")
        if restarts:
            tel.restarts += restarts
        errors = events.get("errors")
        if errors:
            n, last = errors
            tel.error_count += n
            tel.last_error = last
        for why, n in (events.get("drops") or {}).items():
            self._count_dropped(n, why)
        for key, packed in events.get("failed") or ():
            fut = self._waiters.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_exception(unpack_error(packed))

    async def wait_drained(self, timeout: float | None = None) -> None:
        """Wait until everything sent so far has reached the Ray actor."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while (self._inbox is not None and len(self._inbox)) or (
            self._ray is not None and self._ray.pending_input
        ):
            if deadline is not None and loop.time() >= deadline:
                raise QueueTimeoutError(
                    f"messages to kernel {self.kernel_id!r} still on their way after {timeout}s"
                )
            await asyncio.sleep(0.005)
