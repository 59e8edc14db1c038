"""The Ray tier's kernel: one ring kernel running in a Ray actor, driven from the loop.

`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)` builds a
`RayTierKernel`: it creates a Ray actor (`host.KernelHost`) that hosts an ordinary
asyncio-tier kernel, and moves messages to and from it in batches. The runtime keeps the
registry, routing and ordered shutdown; this class is the mechanism on the driver's side.

Design notes:
- A kernel-level tier (like the GPU tier), not a `TierWorker` behind the hosting bridge:
  the runtime inside the Ray actor already applies the policy (accounting, correlation,
  backpressure, supervision) on its queues, and this class batches across the network. A
  bridge on the driver would add a second set of queues, a second bound and a second copy
  of every message in flight.
- Sends coalesce with no added delay: one ``push`` call in flight per kernel and priority
  band, and whatever is sent while it flies leaves together in the next call (Nagle
  without the timer). Ray does not order the calls to a threaded actor, so each call of a
  band (pushes and ``send_and_receive`` requests) carries its number and the actor admits
  them in that order. Bands go side by side: a higher band never waits behind a lower one.
  ``send`` waits for its batch's answer (so it raises the actor's refusal);
  ``send_nowait`` does not, and a refusal is raised by the next send and kept in
  ``undelivered``.
- Receives prefetch: one ``fetch`` call brings back up to ``prefetch`` replies; later
  receives are served from the driver-side buffer. A fetch a caller gave up on (timeout,
  cancellation) still lands in the buffer; replies are never dropped.
- ``send_and_receive`` is one Ray call (the actor correlates the reply).
- Pipelines go actor to actor: `forward_to` hands the source actor the target's handle; the
  driver never relays kernel-to-kernel traffic. So a Ray kernel forwards only into Ray
  kernels of the same session; a mixed pipeline is refused at ``connect``.
- Faults: a ``watch`` call stays parked in every actor. When the actor dies, that call and
  every other call in flight fail; the kernel becomes FAILED with the Ray error as its
  cause and every waiting caller gets `KernelFailedError`. With ``restart="on_failure"``
  the actor is created with Ray's ``max_restarts``; when Ray brings it back, the kernel is
  launched in it again and returned to its previous state (`_restore`).
- An actor function that returns by itself: the parked ``watch`` answers with what the
  kernel left (messages handed back, replies still unread, its last telemetry), so the
  kernel is TERMINATED on the driver with its books closed and the actor is released. An
  answer that says the kernel ended arrives before it (a request told "its actor function
  returned"): it waits for the watch, briefly, so its caller finds the kernel ended.
- Accounting: the actor counts what it drops and hands back; the driver adds only what it
  alone knows (``send_nowait`` messages refused on their way). A ``send`` that raised
  delivered nothing: its message is neither kept in `undelivered` nor counted.
- Ray loads when the first kernel launches (`session.ray_module`), never on import.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from ....decorators.validators import check_message, validate_config
from ....exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from ...config import RingKernelConfig
from ...fast_queue import PriorityBand, get_priority_band
from ...kernel import KernelFunc
from ...message import (
    RingKernelMessage,
    check_declared_types,
    check_fields,
    claim_request_key,
    deserialize_message,
    fields_ok,
    request_space,
)
from ...states import KernelState
from ...telemetry import RingKernelTelemetry
from .. import check_actor_kind, tier_class
from .host import KernelHost
from .session import RAY_ACTOR_OPTIONS, RaySession, errors, ray_module, reason, session_for
from .wire import split_traced, traced_item, unpack_cause, unpack_error

__all__ = ("RayTierKernel",)

logger = logging.getLogger("pydotcompute")

_RUNNING = (KernelState.LAUNCHED, KernelState.ACTIVE, KernelState.DEACTIVATED)
_ENDED = (KernelState.TERMINATED, KernelState.FAILED)
_REPLY_GRACE_S = 30.0  # how long past a caller's timeout a silent actor is still waited for
_CATCH_UP_S = 5.0  # how long an answer saying the kernel ended waits for the watch's news
_EXIT_S = 5.0  # how long an actor whose kernel ended may take to exit before it is killed

_HOST_CLASS: Any = None


def _host_class() -> Any:
    """``ray.remote(KernelHost)``, built once per process."""
    global _HOST_CLASS
    if _HOST_CLASS is None:
        _HOST_CLASS = ray_module().remote(KernelHost)
    return _HOST_CLASS


def _min_timeout(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _limit(max_restarts: int | None) -> str:
    return "no limit" if max_restarts is None else str(max_restarts)


def _never_activated(kernel_id: str, operation: str) -> KernelStateError:
    """Waiting on a kernel that was never activated: no reply can come (said at once)."""
    return KernelStateError(
        kernel_id,
        KernelState.LAUNCHED,
        operation,
        "activate it first: a kernel that was never activated runs no actor, so no reply can come",
    )


class _Batch:
    """Messages that will cross in one ``push`` call."""

    __slots__ = ("accepted", "done", "error", "items", "nowait", "sent", "timeout", "unwaited")

    def __init__(self, timeout: float | None) -> None:
        self.items: list[bytes] = []
        self.timeout = timeout
        self.sent = False
        self.unwaited = False
        self.nowait: set[int] = set()  # indices of items whose sender does not wait
        self.accepted: int | None = None
        self.error: BaseException | None = None
        self.done: asyncio.Future[None] | None = None


class _Lane:
    """The messages of one priority band on their way to the actor. One ``push`` call in
    flight per lane keeps a band in order; lanes go side by side, so a message never
    waits behind those of a lower band (the actor's inbox admits blocked senders by
    band, FIFO within one)."""

    __slots__ = ("band", "batches", "pump", "queued", "seq")

    def __init__(self, band: int) -> None:
        self.band = band
        self.batches: deque[_Batch] = deque()
        self.pump: asyncio.Task[None] | None = None
        self.queued = 0  # messages in `batches` (not yet answered)
        # the number of the last call of this band (pushes and requests): the actor
        # admits them in this order whichever arrives first
        self.seq = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def _band_of(msg: Any) -> int:
    """The priority band of a message (0: SYSTEM ... 3: LOW)."""
    return int(get_priority_band(msg.priority))


class _Buffered:
    """The driver-side reply buffer as the runtime sees an outbox (`len`, `clear`)."""

    __slots__ = ("_kernel",)

    def __init__(self, kernel: RayTierKernel) -> None:
        self._kernel = kernel

    def __len__(self) -> int:
        return self._kernel.buffered

    def clear(self) -> int:
        return self._kernel.drop_buffered()


class _Depth:
    """The inbox as the runtime sees it: in flight on the driver plus queued in the actor
    (as last reported by its telemetry)."""

    __slots__ = ("_kernel",)

    def __init__(self, kernel: RayTierKernel) -> None:
        self._kernel = kernel

    def __len__(self) -> int:
        kernel = self._kernel
        return kernel.pending + max(kernel.telemetry.queue_depth, 0)


class RayTierKernel:
    """A ring kernel running in a Ray actor, with the interface the runtime drives.

    Attributes:
        kernel_id: The kernel's id.
        config: The `RingKernelConfig` it was launched with.
        input_type: The message class `send` accepts (None: any `@message`).
        output_type: The message class the actor sends.
        error: Why the kernel FAILED (the actor's exception, or the Ray error when the
            actor died).
        restarts: How many times Ray restarted the actor.
        telemetry: The last snapshot fetched from the actor, plus the driver's own counts
            of refused messages, errors and restarts.
    """

    #: Checked in `launch`, against the tier inside the actor (asyncio: async functions).
    ACTOR_KIND: ClassVar[str | None] = None
    #: Ray restarts the actor (`max_restarts`) and the kernel is launched in it again.
    SUPPORTS_RESTART: ClassVar[bool] = True
    EXTRA_OPTIONS: ClassVar[frozenset[str]] = RAY_ACTOR_OPTIONS | frozenset(
        {"ray_options", "check_resources", "actor_tier"}
    )

    def __init__(
        self,
        kernel_id: str,
        kernel_func: KernelFunc | None,
        *,
        config: RingKernelConfig,
        input_type: type | None = None,
        output_type: type | None = None,
        runtime: Any = None,
        enable_telemetry: bool = True,
    ) -> None:
        self.kernel_id = kernel_id
        self.config = config
        self.input_type = input_type
        self.output_type = output_type
        self.error: BaseException | None = None
        self.restarts = 0
        self.telemetry = RingKernelTelemetry(kernel_id, live=True)
        self._func = kernel_func
        self._runtime = runtime
        self._session = session_for(runtime, enable_telemetry=enable_telemetry)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = KernelState.CREATED
        self._actor: Any = None
        self._actor_name = ""
        self._ray_options: dict[str, Any] = {}
        self._undelivered: list[Any] = []
        self._accepted = 0
        # drops only the driver knows of (messages refused on their way, whose sender was
        # not told): added to every snapshot fetched from the actor, which counts its own
        self._own_drops: dict[str, int] = {}
        # outbound
        self._lanes = tuple(_Lane(int(band)) for band in PriorityBand)  # SYSTEM first
        self._queued = 0  # in all lanes
        self._async_error: BaseException | None = None
        # inbound
        self._replies: deque[Any] = deque()
        self._fetch: asyncio.Task[None] | None = None
        self._fetch_error: BaseException | None = None
        self._end_error: BaseException | None = None
        self._ended_seen = False  # a fetch found the actor's outbox closed before the watch
        # control
        self._watch: asyncio.Task[None] | None = None
        self._restoring: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._setup: asyncio.Task[None] | None = None
        self._forward: RayTierKernel | None = None
        self._dead = False
        self._released = False
        self._books_closed = False  # the actor handed over what the kernel left
        self._inbox = _Depth(self)
        self._outbox = _Buffered(self)
        check_declared_types(self, input_type=input_type, output_type=output_type)

    def __repr__(self) -> str:
        return f"<RayTierKernel {self.kernel_id!r} {self._state.name} actor={self._actor_name!r}>"

    # -- what the runtime reads ---------------------------------------------------------

    @property
    def session(self) -> RaySession:
        """The `RaySession` this kernel runs in (shared by its runtime's Ray kernels)."""
        return self._session

    @property
    def handle(self) -> RayTierKernel | None:
        """This kernel once launched (None before): older code read the Ray handle here."""
        return self if self._actor is not None else None

    @property
    def actor(self) -> Any:
        """The Ray actor handle (`ray.kill(kernel.actor)` simulates a lost node)."""
        self._require("use")
        return self._actor

    @property
    def actor_name(self) -> str:
        """The Ray actor's name (unique per session)."""
        self._require("use")
        return self._actor_name

    @property
    def ray_options(self) -> dict[str, Any]:
        """The `ActorClass.options(...)` the actor was created with."""
        self._require("use")
        return self._ray_options

    @property
    def pending(self) -> int:
        """Messages sent from the driver and not yet acknowledged by the actor."""
        return self._queued

    @property
    def accepted(self) -> int:
        """Messages the actor accepted from the driver so far."""
        return self._accepted

    def messages_received(self) -> int:
        """Telemetry's ``messages_received``: messages the actor accepted from the driver."""
        return self._accepted

    @property
    def buffered(self) -> int:
        """Replies already fetched to the driver and not yet received."""
        return len(self._replies)

    @property
    def fetching(self) -> bool:
        """True while a fetch of replies is on its way from the actor."""
        return self._fetch is not None

    def drop_buffered(self) -> int:
        """Drop the replies fetched to the driver and not yet received; how many."""
        n = len(self._replies)
        self._replies.clear()
        return n

    @property
    def setup(self) -> asyncio.Task[None] | None:
        """The last `connect`/`disconnect` on its way to the actor (await it to wait until
        the actor applied it), or None."""
        return self._setup

    @property
    def state(self) -> KernelState:
        return self._state

    @property
    def is_active(self) -> bool:
        return self._state is KernelState.ACTIVE

    @property
    def undelivered(self) -> list[Any]:
        """Messages sent but never processed (left in the inbox at terminate, refused on
        their way, or in the actor when it failed)."""
        return self._undelivered

    @property
    def inbox(self) -> _Depth:
        return self._inbox

    @property
    def outbox(self) -> _Buffered:
        return self._outbox

    @property
    def is_idle(self) -> bool:
        return False

    def is_actor_task(self, task: asyncio.Task[Any]) -> bool:
        """Never: the actor runs in a Ray actor, not in a task of the driver's loop."""
        del task
        return False

    def _require(self, operation: str) -> None:
        if self._actor is None:
            raise KernelStateError(
                self.kernel_id, KernelState.CREATED, operation, "launch it first"
            )

    def _refuse(self, operation: str) -> BaseException:
        if self._state is KernelState.FAILED:
            return self._failed_error()
        return KernelStateError(self.kernel_id, self._state, operation)

    def _failed_error(self) -> BaseException:
        if isinstance(self._end_error, KernelFailedError):
            return self._end_error
        err = KernelFailedError(self.kernel_id, self.error)
        err.__cause__ = self.error
        return err

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        assert loop is not None, "launched kernels have a loop"
        return loop

    # -- lifecycle ----------------------------------------------------------------------

    async def launch(self) -> None:
        """Create the Ray actor and launch the kernel in it (LAUNCHED).

        Ray placement options (`RAY_ACTOR_OPTIONS`, here or in ``@ring_kernel(...)``),
        ``ray_options`` and the session's ``actor_options`` go to the actor; a kernel on
        the GPU tier inside the actor asks for ``num_gpus=1`` unless told otherwise.
        The kernel function and its message classes must be importable by the Ray
        workers.

        Raises:
            InvalidConfigurationError: a bad option, resources the cluster does not have
                (with ``check_resources``), or an actor that could not start.
        """
        if self._actor is not None:
            raise KernelStateError(self.kernel_id, self._state, "launch", "it is launched")
        extra = dict(self.config.extra)
        ray_options = extra.pop("ray_options", None)
        check_resources = extra.pop("check_resources", True)
        named = extra.pop("actor_tier", None)
        actor_tier = named or "asyncio"
        if actor_tier == "ray":
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: actor_tier='ray' would nest a Ray actor in a Ray "
                "actor; choose the tier inside the actor: 'asyncio', 'thread' or 'process'"
            )
        inner = tier_class(actor_tier)
        kind = getattr(inner, "ACTOR_KIND", None)
        check_actor_kind(self.kernel_id, named or "ray", self._func, kind)
        session = self._session
        actor_opts = session.options_for(self.kernel_id, extra, ray_options)
        config = dataclasses.replace(self.config, tier=actor_tier, extra={})
        validate_config(config)
        self.config = config
        if actor_tier in ("gpu", "cuda") and "num_gpus" not in actor_opts:
            actor_opts["num_gpus"] = 1
        self._loop = asyncio.get_running_loop()
        session.start()
        if check_resources:
            session.check_resources(self.kernel_id, actor_opts)
        self._actor = await self._create_actor(config, extra, actor_opts)
        self._state = KernelState.LAUNCHED
        self._start_watch()

    async def _create_actor(
        self, config: RingKernelConfig, options: dict[str, Any], actor_opts: dict[str, Any]
    ) -> Any:
        session = self._session
        name = session.actor_name(self.kernel_id)
        restartable = config.restart == "on_failure"
        settings = {
            "enable_telemetry": session.enable_telemetry,
            "max_batch": session.max_batch,
            "peer_limit": config.output_queue_size,
            # a tracing driver: the actor's runtime traces and reads trace context
            "tracing": getattr(self._runtime, "tracer", None) is not None,
        }
        try:
            actor = (
                _host_class()
                .options(
                    name=name,
                    # Ray counts over the actor's whole life; -1: no limit
                    max_restarts=(-1 if config.max_restarts is None else config.max_restarts)
                    if restartable
                    else 0,
                    max_task_retries=0,
                    **actor_opts,
                )
                .remote(
                    self.kernel_id,
                    self._func,
                    self.input_type,
                    self.output_type,
                    config,
                    options,
                    session.name_prefix,
                    settings,
                )
            )
        except (TypeError, ValueError) as exc:
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: Ray refused the actor: {exc}"
            ) from exc
        except Exception as exc:  # pickling the function or a message class
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: cannot ship {self._func!r} to Ray: {exc}; define "
                "the kernel function and its message classes at module level in an "
                "importable module"
            ) from exc
        try:
            _, err = await actor.launch.remote()
        except errors().actor as exc:
            with contextlib.suppress(Exception):
                ray_module().kill(actor)
            module = getattr(self._func, "__module__", "?")
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: its Ray actor could not start ({reason(exc)}); "
                f"every Ray worker must be able to import {module!r} (install it on each "
                "node or ship it with runtime_env={'py_modules': [...]} or "
                "{'working_dir': ...})"
            ) from exc
        except BaseException:
            with contextlib.suppress(Exception):
                ray_module().kill(actor)
            raise
        if err is not None:
            with contextlib.suppress(Exception):
                ray_module().kill(actor)
            raise unpack_error(err)
        self._actor_name = name
        self._ray_options = actor_opts
        return actor

    async def _lifecycle(self, operation: str) -> None:
        self._require(operation)
        await self._settle()
        if self._state is KernelState.FAILED and self._dead:
            raise self._failed_error()
        try:
            state, err = await getattr(self._actor, operation).remote()
        except errors().actor as exc:
            raise self._lost(exc, operation) from exc
        if err is not None:
            raise unpack_error(err)
        if self._state not in _ENDED and self._stopping is None:
            self._state = KernelState[state]

    async def activate(self) -> None:
        """Start processing (LAUNCHED -> ACTIVE)."""
        await self._lifecycle("activate")

    async def deactivate(self) -> None:
        """Pause delivery; queued messages are kept (ACTIVE -> DEACTIVATED)."""
        await self._lifecycle("deactivate")

    async def reactivate(self) -> None:
        """Resume delivery (DEACTIVATED -> ACTIVE)."""
        await self._lifecycle("reactivate")

    async def terminate(self, timeout: float | None = None) -> list[Any]:
        """Drain and stop the actor, then release it; returns the messages not processed.

        Messages still waiting on the driver are sent first; the actor drains its inbox
        (``timeout`` seconds, default ``config.drain_timeout``); the replies left in its
        outbox come back to the driver and stay receivable. What could not be processed is
        also kept in `undelivered` and counted as dropped.
        """
        self._require("terminate")
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
            return []
        if self._state is KernelState.TERMINATED:
            raise KernelStateError(
                self.kernel_id, self._state, "terminate", "it is already terminated"
            )
        stopping = self._stopping = self._running_loop().create_future()
        self._state = KernelState.TERMINATING
        left: list[Any] = []
        try:
            if self._restoring is not None:
                await asyncio.wait({self._restoring})
            grace = self.config.drain_timeout if timeout is None else timeout
            await self._flush_quietly(grace)
            alive = not self._dead
            if alive:
                left = await self._terminate_remote(timeout)
            # a push the actor could not take (its inbox full, its outbox unread) ends
            # with the actor's terminate: wait for its answer, so that what it refused is
            # accounted for before terminate returns
            await self._flush_quietly(5.0)
            if not isinstance(self._end_error, KernelStateError):
                self._end_error = KernelStateError(
                    self.kernel_id,
                    KernelState.TERMINATED,
                    "receive from",
                    "it was terminated and its outbox is drained",
                )
        finally:
            self._state = KernelState.TERMINATED
            await self.release()
            self._stopping = None
            stopping.set_result(None)
        return left

    async def _terminate_remote(self, timeout: float | None) -> list[Any]:
        try:
            value, err = await self._actor.terminate.remote(timeout)
        except errors().actor as exc:
            self.error = self.error or exc
            self.telemetry.record_error(exc)
            logger.error("kernel %r: its Ray actor died while terminating: %s", self.kernel_id, exc)
            return []
        if err is not None:
            error = unpack_error(err)
            if getattr(error, "state", None) is KernelState.TERMINATED:
                return []  # its function had returned already
            raise error
        return await self._take_handover(value)

    async def _take_handover(self, value: Any) -> list[Any]:
        """What the actor handed over when the kernel's books closed (terminate, or its
        function returned): the replies still unread become receivable here, the messages
        it never processed are kept in `undelivered` (the actor counted them, reason
        ``undelivered``), its last telemetry is merged and its log lines written here."""
        left_b, rest_b, _state, (tel, lines) = value
        self._books_closed = True
        if self._fetch is not None:  # replies it took came out of the outbox before these
            await asyncio.wait({self._fetch}, timeout=5.0)
        self._replies.extend(deserialize_message(b) for b in rest_b)
        left = [deserialize_message(b) for b in left_b]
        self._undelivered.extend(left)
        self._replay(lines)
        self._merge_telemetry(tel)
        return left

    async def release(self) -> None:
        """Stop the driver-side tasks and end the Ray actor (idempotent; no drain: use
        `terminate` for a graceful stop).

        Once the kernel's books are closed the actor exits by itself, after the calls it
        is still answering (another actor's push, refused when the inbox closed, must
        tell its sender what it took); otherwise, or if that takes over
        ``_EXIT_S`` seconds, it is killed."""
        await self._stop_tasks()
        if not self._released and self._actor is not None:
            self._released = True
            actor = self._actor
            if self._books_closed and not self._dead:
                with contextlib.suppress(Exception):  # its death is the answer
                    async with asyncio.timeout(_EXIT_S):
                        await actor.__ray_terminate__.remote()
            with contextlib.suppress(Exception):
                ray_module().kill(actor, no_restart=True)

    async def _stop_tasks(self) -> None:
        """Cancel the driver-side tasks of this kernel (not the one calling)."""
        me = asyncio.current_task()
        for task in (self._watch, self._fetch, self._restoring, self._setup):
            if task is not None and not task.done() and task is not me:
                task.cancel()
                await asyncio.wait({task})  # (our own cancellation still propagates)
        self._watch = self._fetch = self._restoring = self._setup = None

    # -- messages in ----------------------------------------------------------------------

    def _encode(self, msg: Any) -> bytes:
        state = self._state
        if state is not KernelState.ACTIVE and state not in _RUNNING:
            if state is KernelState.CREATED:
                self._require("send to")
            raise self._refuse("send to")
        in_t = self.input_type
        if in_t is not None and type(msg) is not in_t and not isinstance(msg, in_t):
            check_message(msg, in_t, self.kernel_id, "expects")
        if not isinstance(msg, RingKernelMessage):
            raise TypeValidationError(
                f"kernel {self.kernel_id!r} runs in a Ray actor, so its messages cross as "
                f"MessagePack and must be @message objects; got {type(msg).__name__}"
            )
        if self.config.check_fields and not fields_ok(msg):
            check_fields(msg, self.kernel_id, "expects")  # as every tier does, at the call
        return msg.serialize()

    def trace_wire(self, header: Callable[[Any], tuple[int, int, int] | None]) -> None:
        """Ship each message in the trace context ``header(msg)`` gives (a tracing runtime
        calls it once, after launch); the encoder is shadowed on this instance, so an
        untraced kernel checks nothing."""
        plain = self._encode

        def encode(msg: Any) -> bytes:
            return traced_item(header(msg), plain(msg))

        self._encode = encode  # type: ignore[method-assign]

    async def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Deliver ``msg`` to the inbox in the Ray actor; waits until the actor took it
        (messages sent meanwhile by other callers share the same Ray call).

        Raises:
            TypeValidationError: ``msg`` is not the kernel's ``input_type``.
            KernelStateError: the kernel is terminating or terminated.
            KernelFailedError: the kernel failed or its actor died.
            QueueFullError / QueueTimeoutError: backpressure ``reject`` / a ``timeout``.
        """
        data = self._encode(msg)
        lane = self._lanes[_band_of(msg)]
        if self._async_error is not None:
            self._raise_async_error()
        if self._setup is not None:
            await self._settle()
        if lane.queued >= self.config.input_queue_size:
            await self._room(lane, timeout)
        await self._wait_parts(self._enqueue(lane, [data], timeout, True))
        return True

    def send_nowait(self, msg: Any) -> bool:
        """Queue ``msg`` without waiting for the actor; it leaves with the next Ray call.

        If the actor later refuses it, the error is raised by the next send and the
        message is kept in `undelivered`.

        Raises:
            QueueFullError: ``input_queue_size`` messages of its priority band are already
                in flight.
        """
        data = self._encode(msg)
        lane = self._lanes[_band_of(msg)]
        self._raise_async_error()
        if lane.queued >= self.config.input_queue_size:
            raise QueueFullError(
                f"{lane.queued} messages to kernel {self.kernel_id!r} are already in flight "
                "to its Ray actor (its input_queue_size); use send() to wait for room"
            )
        self._enqueue(lane, [data], None, False)
        return True

    async def accept(self, msg: Any, timeout: float | None = None) -> None:
        """What a forwarding kernel calls on its target (as `send`)."""
        await self.send(msg, timeout)

    def accept_nowait(self, msg: Any) -> None:
        """What a forwarding kernel calls on its target (as `send_nowait`)."""
        self.send_nowait(msg)

    # the names a forwarding kernel of another tier calls on its target
    _accept = accept
    _accept_nowait = accept_nowait

    async def send_batch(self, msgs: Any, timeout: float | None = None) -> int:
        """Send many messages in as few Ray calls as possible (``max_batch`` per call).

        Returns how many were sent (all of them, or it raises the refusal: the messages
        before the refused one stay delivered, those from it on were not accepted).
        """
        encode = self._encode
        by_band: dict[int, list[bytes]] = {}
        n = 0
        for m in msgs:
            data = encode(m)
            by_band.setdefault(_band_of(m), []).append(data)
            n += 1
        if not n:
            return 0
        self._raise_async_error()
        await self._settle()
        parts: list[tuple[_Batch, int]] = []
        for band in sorted(by_band):
            parts += self._enqueue(self._lanes[band], by_band[band], timeout, True)
        await self._wait_parts(parts)
        return n

    async def flush(self) -> None:
        """Wait until every message sent so far has reached the actor; raises the refusal
        of a ``send_nowait`` message, if any."""
        last = [(lane.batches[-1], 0) for lane in self._lanes if lane.batches]
        if last:
            await self._wait_parts(last)
        self._raise_async_error()

    def _enqueue(
        self, lane: _Lane, datas: list[bytes], timeout: float | None, waited: bool
    ) -> list[tuple[_Batch, int]]:
        """Append encoded messages to a lane's outgoing batches; start its pump."""
        parts: list[tuple[_Batch, int]] = []
        batches = lane.batches
        max_batch = self._session.max_batch
        i, n = 0, len(datas)
        while i < n:
            b = batches[-1] if batches else None
            if b is None or b.sent or len(b.items) >= max_batch:
                b = _Batch(timeout)
                batches.append(b)
            else:
                b.timeout = _min_timeout(b.timeout, timeout)
            take = min(max_batch - len(b.items), n - i)
            if take == 1:
                b.items.append(datas[i])
            else:
                b.items.extend(datas[i : i + take])
            i += take
            if not waited:
                b.unwaited = True
                b.nowait.update(range(len(b.items) - take, len(b.items)))
            parts.append((b, len(b.items)))
        lane.queued += n
        self._queued += n
        if lane.pump is None:
            lane.pump = self._running_loop().create_task(self._run_pump(lane))
        return parts

    async def _run_pump(self, lane: _Lane) -> None:
        """Push a lane's batches one Ray call at a time (the order is kept)."""
        batches = lane.batches
        push = self._actor.push
        try:
            while batches:
                if self._restoring is not None:
                    await asyncio.wait({self._restoring})
                b = batches[0]
                b.sent = True
                err: BaseException | None
                try:
                    answer = await push.remote(
                        b.items, b.timeout, None, False, lane.band, lane.next_seq()
                    )
                    if type(answer) is int:
                        accepted, err = answer, None
                    else:
                        accepted, err = answer[0], unpack_error(answer[1])
                except errors().actor as exc:
                    accepted, err = 0, self._lost(exc, "send to")
                except Exception as exc:
                    accepted, err = 0, exc
                batches.popleft()
                lane.queued -= len(b.items)
                self._queued -= len(b.items)
                self._accepted += accepted
                b.accepted = accepted
                b.error = err
                if accepted < len(b.items):
                    unwaited = sorted(i for i in b.nowait if i >= accepted)
                    self._refused([b.items[i] for i in unwaited], err)
                    if b.unwaited and self._async_error is None:
                        self._async_error = err
                    await self._catch_up(err)
                if b.done is not None and not b.done.done():
                    b.done.set_result(None)
        finally:
            lane.pump = None

    def _refused(self, items: list[bytes], err: BaseException | None) -> None:
        """Messages the actor refused whose sender was not told (`send_nowait`): kept in
        `undelivered` and counted as dropped (reason ``undelivered``). A sender that was
        told (its `send` raised) still holds its message: it was never accepted, so it is
        neither kept nor counted."""
        if not items:
            return
        msgs: list[Any] = []
        for data in items:
            try:
                msgs.append(deserialize_message(split_traced(data)[1]))
            except Exception:
                msgs.append(data)
        self._undelivered.extend(msgs)
        self._count_own_drop(len(msgs), "undelivered")
        logger.warning(
            "kernel %r refused %d message(s) sent with send_nowait: %s (kept in "
            "kernel.undelivered, counted as dropped)",
            self.kernel_id,
            len(msgs),
            err,
        )

    def _count_own_drop(self, n: int, reason: str) -> None:
        self.telemetry.record_drop(n, reason)
        self._own_drops[reason] = self._own_drops.get(reason, 0) + n

    async def _wait_parts(self, parts: list[tuple[_Batch, int]]) -> None:
        for b, end in parts:
            if b.accepted is None:
                if b.done is None:
                    b.done = self._running_loop().create_future()
                await asyncio.shield(b.done)
            if b.accepted is not None and b.accepted < end:
                assert b.error is not None
                raise b.error

    def _raise_async_error(self) -> None:
        err = self._async_error
        if err is not None:
            self._async_error = None
            raise err

    async def _room(self, lane: _Lane, timeout: float | None) -> None:
        """Driver-side backpressure: wait while ``input_queue_size`` messages of the
        lane's band are in flight (a higher band has room of its own)."""
        limit = self.config.input_queue_size
        if lane.queued < limit:
            return
        loop = self._running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while lane.queued >= limit and lane.batches:
            head = lane.batches[0]
            if head.done is None:
                head.done = loop.create_future()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueTimeoutError(
                    f"timed out after {timeout}s: {lane.queued} messages to kernel "
                    f"{self.kernel_id!r} are still in flight to its Ray actor"
                )
            await asyncio.wait({head.done}, timeout=remaining)

    async def _settle(self) -> None:
        """Wait for a pending connect and an ongoing restart before talking to the actor."""
        if self._setup is not None:
            setup, self._setup = self._setup, None
            await setup
        if self._restoring is not None:
            await asyncio.wait({self._restoring})

    async def _flush_quietly(self, timeout: float | None = None) -> None:
        """Wait (up to `timeout` seconds) until every batch so far has been answered.

        Bounded because the actor may be unable to take a batch until it is terminated
        (a full inbox behind an actor blocked on a full, unread outbox).
        """
        last = [(lane.batches[-1], 0) for lane in self._lanes if lane.batches]
        if last:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._wait_parts(last), timeout)
        self._async_error = None

    # -- messages out ---------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Any:
        """The next reply, waiting up to ``timeout`` seconds.

        Raises:
            QueueTimeoutError: nothing arrived in time (a ``TimeoutError``).
            KernelFailedError: the actor raised or died (after its replies were drained).
            KernelStateError: the kernel was terminated and its outbox is drained.
        """
        self._require("receive from")
        replies = self._replies
        if not replies:
            if self._state is KernelState.LAUNCHED:
                raise _never_activated(self.kernel_id, "receive from")
            await self._wait_replies(timeout, 1)
        msg = replies.popleft()
        if not replies and self._fetch is None and self._session.read_ahead:
            self._read_ahead()
        return msg

    def receive_nowait(self) -> Any:
        """The next reply already on the driver, or None (starts a fetch in the background)."""
        self._require("receive from")
        if self._replies:
            return self._replies.popleft()
        if self._fetch_error is not None:
            err, self._fetch_error = self._fetch_error, None
            raise err
        if self._end_error is not None and self._stopping is None:
            raise self._end_error
        if self._fetch is None and self._stopping is None and self._restoring is None:
            self._fetch = self._running_loop().create_task(
                self._fetch_replies(self._session.prefetch, None)
            )
        return None

    async def receive_batch(self, max_count: int = 1024, timeout: float | None = None) -> list[Any]:
        """Up to ``max_count`` replies: waits (up to ``timeout``) for the first, then takes
        what has arrived. Returns an empty list when the timeout passes first."""
        self._require("receive from")
        replies = self._replies
        if not replies:
            try:
                await self._wait_replies(timeout, max_count)
            except QueueTimeoutError:
                return []
        if len(replies) <= max_count:
            out = list(replies)
            replies.clear()
            if self._fetch is None and self._session.read_ahead:
                self._read_ahead()
            return out
        return [replies.popleft() for _ in range(max_count)]

    async def send_and_receive(self, msg: Any, timeout: float | None = None) -> Any:
        """Send ``msg`` and wait for the reply correlated with it, in one Ray call.

        Concurrent callers each get their own reply; earlier sends reach the actor first.
        """
        self._require("send_and_receive to")
        if self._state is KernelState.LAUNCHED:
            raise _never_activated(self.kernel_id, "send_and_receive to")
        if isinstance(msg, RingKernelMessage):
            # an id not made yet is made in the kernel's request space, which the runtime
            # in the actor recognises: a reply whose caller gave up is dropped there
            claim_request_key(msg, request_space(self.kernel_id))
        data = self._encode(msg)
        if self._queued or self._setup is not None or self._restoring is not None:
            await self.flush()
            await self._settle()
        request = self._actor.request
        lane = self._lanes[_band_of(msg)]
        try:
            # numbered among the band's calls: a send made after this one is admitted
            # after it, though Ray may deliver it first
            if timeout is None:
                answer = await request.remote(data, None, lane.band, lane.next_seq())
            else:
                # ``asyncio.timeout``, not ``wait_for``: on 3.11 ``wait_for`` can swallow a
                # cancellation that lands as the answer arrives
                async with asyncio.timeout(timeout + _REPLY_GRACE_S):
                    answer = await request.remote(data, timeout, lane.band, lane.next_seq())
        except errors().actor as exc:
            raise self._lost(exc, "send to") from exc
        except TimeoutError:
            raise QueueTimeoutError(
                f"no reply from kernel {self.kernel_id!r} within {timeout}s: its Ray actor "
                "did not answer"
            ) from None
        if type(answer) is bytes:
            return deserialize_message(answer)
        err = unpack_error(answer[1])
        await self._catch_up(err)
        raise err

    def _read_ahead(self) -> None:
        """Park a fetch in the actor so the next reply travels back as soon as it exists.

        Started when a receive empties the driver's buffer, so the reply to the next
        ``send`` comes back without waiting for the next ``receive`` call; at most
        ``prefetch`` replies wait on the driver beyond what was asked for.
        """
        if (
            self._fetch is None
            and self._state in _RUNNING
            and self._stopping is None
            and self._restoring is None
            and self._end_error is None
        ):
            self._fetch = self._running_loop().create_task(
                self._fetch_replies(self._session.prefetch, None, background=True)
            )

    async def _fetch_replies(self, n: int, wait: float | None, *, background: bool = False) -> None:
        """One ``fetch`` call: replies go to the buffer, a terminal error to ``_end_error``.

        A transient error (a reply that cannot be encoded, a restarting actor) is kept for
        the next receiver, unless nobody asked for this fetch (``background``).
        """
        fetch = self._actor.fetch
        try:
            answer = await (fetch.remote(n) if wait is None else fetch.remote(n, wait))
            items, packed = (answer, None) if type(answer) is list else answer
            if items:
                self._replies.extend(deserialize_message(b) for b in items)
            if packed is not None:
                err = unpack_error(packed)
                if isinstance(err, KernelStateError):
                    # closed and drained: terminated or failed. Where its function returned
                    # by itself, the watch brings what it left (and the end) first
                    if self._stopping is None and self._state in _RUNNING:
                        self._ended_seen = True
                    else:
                        self._end_error = err
                elif not background:
                    self._fetch_error = err
                else:
                    logger.warning(
                        "kernel %r: a reply could not be fetched: %s", self.kernel_id, err
                    )
        except errors().actor as exc:
            err = self._lost(exc, "receive from")
            if self._state is not KernelState.FAILED and not background:
                self._fetch_error = err
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not background:
                self._fetch_error = exc
        finally:
            self._fetch = None

    async def _wait_replies(self, timeout: float | None, n: int) -> None:
        """Return once a reply is buffered; raise the kernel's end or a timeout."""
        loop = self._running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._replies:
            if self._fetch_error is not None:
                err, self._fetch_error = self._fetch_error, None
                raise err
            waiting: asyncio.Future[Any] | None = self._stopping or self._restoring
            if waiting is None and self._ended_seen and self._end_error is None:
                watch = self._watch  # the kernel ended in the actor: its news is on its way
                if watch is None or watch.done():
                    self._ended_seen = False
                else:
                    waiting = watch
            if waiting is None:
                if self._end_error is not None:
                    raise self._end_error
                if self._setup is not None:
                    await self._settle()
                    continue
                waiting = self._fetch
                if waiting is None:
                    wait = None if deadline is None else max(0.0, deadline - loop.time())
                    waiting = self._fetch = loop.create_task(
                        self._fetch_replies(max(n, self._session.prefetch), wait)
                    )
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueTimeoutError(
                    f"no message from kernel {self.kernel_id!r} within {timeout}s"
                )
            done, _ = await asyncio.wait({waiting}, timeout=remaining)
            if not done and not self._replies:
                raise QueueTimeoutError(
                    f"no message from kernel {self.kernel_id!r} within {timeout}s"
                )

    # -- routing --------------------------------------------------------------------------

    def forward_to(self, target: Any) -> None:
        """Forward this kernel's output into `target`'s actor (actor to actor), or stop
        (None). The change reaches the actor before any later call to it (`setup`).

        Raises:
            InvalidConfigurationError: `target` is not a Ray-tier kernel of the same session.
        """
        self._require("connect")
        if target is None:
            self._forward = None
            ended = self._state in _ENDED
            self._setup = None if ended else self._remote_setup(self._actor.disconnect.remote())
            return
        if not isinstance(target, RayTierKernel) or target.session is not self._session:
            raise InvalidConfigurationError(
                f"cannot connect {self.kernel_id!r} -> "
                f"{getattr(target, 'kernel_id', target)!r}: a kernel on the ray tier forwards "
                "only into another ray-tier kernel of the same runtime; launch the target "
                "with tier='ray', or receive from the source and send to the target yourself"
            )
        if self._state in _ENDED or self._stopping is not None:
            raise self._refuse("connect")
        self._forward = target
        self._setup = self._remote_setup(self._actor.connect.remote(target.kernel_id, target.actor))

    @property
    def forwards_to(self) -> RayTierKernel | None:
        return self._forward

    def _remote_setup(self, ref: Any) -> asyncio.Task[None]:
        previous = self._setup

        async def apply() -> None:
            if previous is not None:
                await previous
            try:
                _, err = await ref
            except errors().actor as exc:
                raise self._lost(exc, "connect") from exc
            if err is not None:
                raise unpack_error(err)

        return self._running_loop().create_task(apply())

    # -- telemetry ------------------------------------------------------------------------

    async def fetch_telemetry(self) -> RingKernelTelemetry:
        """Fetch the telemetry from the actor (one Ray call) and merge it."""
        if self._actor is not None and not self._released and not self._dead:
            try:
                tel, lines = await self._actor.telemetry.remote()
            except errors().actor as exc:
                raise self._lost(exc, "read telemetry of") from exc
            self._replay(lines)
            self._merge_telemetry(tel)
        return self.telemetry

    def refresh_telemetry(self, timeout: float = 5.0) -> RingKernelTelemetry:
        """`fetch_telemetry` for synchronous callers (the runtime's `get_telemetry`): waits,
        blocking the caller up to `timeout` seconds; on any Ray error the last snapshot is
        returned unchanged, with a warning."""
        if self._actor is not None and not self._released and not self._dead:
            try:
                tel, lines = ray_module().get(self._actor.telemetry.remote(), timeout=timeout)
            except Exception as exc:
                logger.warning("kernel %r: telemetry not refreshed: %r", self.kernel_id, exc)
            else:
                self._replay(lines)
                self._merge_telemetry(tel)
        return self.telemetry

    def _merge_telemetry(self, tel: RingKernelTelemetry | None) -> None:
        """Take the actor's snapshot, plus what only the driver counted: its own drops and
        the actor's restarts by Ray."""
        if tel is not None:
            local = self.telemetry
            tel.start_time = time.monotonic() - tel.uptime_seconds
            for why, n in self._own_drops.items():
                tel.record_drop(n, why)
            tel.restarts += self.restarts  # in-actor restarts + Ray restarts
            if local.error_count > tel.error_count:
                tel.error_count, tel.last_error = local.error_count, local.last_error
            self.telemetry = tel

    # -- faults ---------------------------------------------------------------------------

    def _start_watch(self) -> None:
        self._watch = self._running_loop().create_task(
            self._watch_actor(), name=f"pydotcompute:ray-watch:{self.kernel_id}"
        )

    async def _watch_actor(self) -> None:
        """Wait in the actor until the kernel ends; notice the actor dying."""
        try:
            value, _ = await self._actor.watch.remote()
        except errors().actor as exc:
            if self._stopping is None and self._state is not KernelState.TERMINATED:
                self._lost(exc, "use")
            return
        if not isinstance(value, tuple):
            return
        state, cause, handover, lines = value
        self._replay(lines)
        if self._stopping is not None or self._state in _ENDED:
            return  # a terminate under way takes the hand-over from its own answer
        if state == "FAILED":  # (the actor logged it: its line came with the answer)
            self._mark_failed(unpack_cause(cause), dead=False, log=False)
        elif state == "TERMINATED" and handover is not None:
            await self._returned(handover)

    async def _returned(self, handover: Any) -> None:
        """Its actor function returned by itself: the kernel is TERMINATED at once
        (sends refused), what it held is handed back and its last replies stay
        receivable, as on every tier; then the actor is released."""
        self._state = KernelState.TERMINATED
        # receivers wait for the hand-over (its replies come before the end)
        stopping = self._stopping = self._running_loop().create_future()
        try:
            await self._take_handover(handover)
        finally:
            if not isinstance(self._end_error, KernelStateError):
                self._end_error = KernelStateError(
                    self.kernel_id,
                    KernelState.TERMINATED,
                    "receive from",
                    "its actor function returned and its outbox is drained",
                )
            self._stopping = None
            stopping.set_result(None)
            await self._stop_tasks()
            if not self._released:
                self._released = True
                with contextlib.suppress(Exception):
                    # it exits once the calls under way have answered (see `release`)
                    self._actor.__ray_terminate__.remote()

    async def _catch_up(self, err: BaseException | None) -> None:
        """An answer says the kernel in the actor has ended (its function returned, or it
        failed for good) while the driver still sees it running: wait (bounded) for the
        watch to bring the end over, so that whoever hears of it finds the kernel ended
        and what it held handed back."""
        if self._stopping is not None or self._state not in _RUNNING:
            return
        state = getattr(err, "state", None)
        if state not in _ENDED or getattr(err, "restarted", False):
            return
        watch = self._watch
        if watch is not None and not watch.done() and watch is not asyncio.current_task():
            await asyncio.wait({watch}, timeout=_CATCH_UP_S)

    @staticmethod
    def _replay(lines: list[tuple[int, str]] | None) -> None:
        """Write the actor's log lines (its warnings and errors) into this process's log."""
        for level, text in lines or ():
            logger.log(level, "%s", text)

    def _lost(self, exc: BaseException, operation: str) -> BaseException:
        """The actor is gone: restart it or mark FAILED; returns the caller's error."""
        if self._released or self._state is KernelState.TERMINATED:
            err: BaseException = KernelStateError(
                self.kernel_id, KernelState.TERMINATED, operation, "it was terminated"
            )
            err.__cause__ = exc
            return err
        cfg = self.config
        restartable = cfg.restart == "on_failure" and (
            cfg.max_restarts is None or self.restarts < cfg.max_restarts
        )
        if restartable and isinstance(exc, errors().unavailable) and self._stopping is None:
            if self._restoring is None:
                self._restoring = self._running_loop().create_task(self._restore(exc))
            err = KernelStateError(
                self.kernel_id,
                "RESTARTING",
                operation,
                f"its Ray actor stopped ({type(exc).__name__}) and Ray is restarting it "
                f"(restart {self.restarts + 1} of {_limit(cfg.max_restarts)}); messages in "
                "flight were lost, send them again",
            )
            err.__cause__ = exc
            return err
        self._mark_failed(exc, dead=True)
        return self._failed_error()

    def _mark_failed(self, cause: BaseException | None, *, dead: bool, log: bool = True) -> None:
        if self._state is KernelState.FAILED:
            return
        self._state = KernelState.FAILED
        self._dead = self._dead or dead
        self.error = cause
        self.telemetry.record_error(cause or "failed")
        if self._runtime is not None:  # the runtime's failure log (`get_summary`)
            self._runtime.kernel_failed(self)
        if dead:
            err = KernelFailedError(self.kernel_id, cause)
            BaseException.__init__(
                err,
                f"cannot use kernel {self.kernel_id!r}: it is FAILED; its Ray actor died "
                f"({reason(cause) if cause else 'no reason given'}); launch it again, or "
                "launch it with restart='on_failure' to let Ray restart it",
            )
            err.__cause__ = cause
            self._end_error = err
            logger.error("kernel %r failed: its Ray actor died: %s", self.kernel_id, cause)
        elif log:
            logger.error("kernel %r failed: %r", self.kernel_id, cause)

    async def _restore(self, cause: BaseException) -> None:
        """Wait for Ray to restart the actor, launch the kernel there, resume its state.

        Ray refuses calls while the actor is restarting (``ActorUnavailableError``), so the
        restore call is retried until ``restart_timeout`` seconds have passed.
        """
        loop = self._running_loop()
        deadline = loop.time() + self._session.restart_timeout
        delay = 0.05
        try:
            while True:
                target = self._forward
                forward = None
                if target is not None and target.state not in _ENDED:
                    forward = (target.kernel_id, target.actor)
                try:
                    turns = [lane.seq for lane in self._lanes]
                    value, err = await self._actor.restore.remote(self._state.name, forward, turns)
                    break
                except errors().unavailable as exc:
                    if loop.time() >= deadline:
                        self._mark_failed(exc, dead=True)
                        return
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                except errors().actor as exc:
                    self._mark_failed(exc, dead=True)
                    return
        finally:
            self._restoring = None
        if err is not None:
            self._mark_failed(unpack_error(err), dead=False)
            return
        if value == "restored":
            self.restarts += 1
            self.telemetry.restarts = self.restarts
            self.telemetry.record_error(cause)
            logger.warning(
                "kernel %r: Ray restarted its actor; restart %d of %s",
                self.kernel_id,
                self.restarts,
                _limit(self.config.max_restarts),
            )
        if self._stopping is None and self._state not in _ENDED:
            self._start_watch()
