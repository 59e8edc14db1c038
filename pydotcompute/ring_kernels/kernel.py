"""`RingKernel`: the tier-1 kernel and the lifecycle every tier shares.

State machine (illegal moves raise ``KernelStateError`` naming kernel, state and operation):

```text
CREATED --launch--> LAUNCHED --activate--> ACTIVE <--deactivate/reactivate--> DEACTIVATED
   |                   |                     |                                  |
   +-------------------+------terminate------+----------------------------------+
                                             v
                      TERMINATING --(drained or timed out)--> TERMINATED
any running state --(actor raises, no restart left)--> FAILED --terminate--> TERMINATED
```

Design notes:
- Launch allocates the queues; activate starts the actor task. Messages sent in between wait
  in the inbox.
- Deactivation is a gate inside ``ctx.receive()``: queued messages stay queued and a message
  already taken from the inbox is held, never dropped.
- Terminate closes the inbox: new sends fail, the actor drains what is queued (``receive``
  keeps returning messages, then raises ``QueueClosedError``, which the supervisor treats as
  a clean exit and which wakes an actor parked on an empty inbox without any timeout). After
  the grace period the task is cancelled and whatever is left is returned and counted as
  dropped, starting with the message the actor was handling, if any: a message counts as
  processed once the actor asks for the next one (or returns), so one cut off mid-handling
  is reported, not counted as processed. Outboxes close too: receivers drain them, then
  get a clear error.
- Replies to ``send_and_receive`` bypass the outbox: ``ctx.send`` hands a message whose
  ``correlation_id`` matches a pending request straight to that caller's future, so
  concurrent callers never see each other's replies. Each call owns its key: a request
  whose id is already awaited (a retry after a timeout, two callers sharing one object)
  is sent as a copy with a fresh id. Reusing the key was rejected: two replies would
  race for one caller and the other would be dropped.
- A reply forwarded into a kernel that stopped taking messages (terminating, terminated,
  failed) stays with the sender, readable in its outbox (logged once, then counted): in a
  cycle, or a tail closed first, the last stage would otherwise lose what it still made.
  A full ``reject`` kernel downstream is a policy, not a stop: that reply is dropped.
- `hurry` ends a terminate's grace period at once (an interrupted shutdown): the actors are
  cut off as when ``drain_timeout`` passes, so everything still queued is handed back.
- A reply correlated with a ``send_and_receive`` request that no caller waits for (its
  caller gave up, or it was answered already) is dropped and counted, never queued in the
  outbox: a full outbox nobody reads would otherwise block the actor, and every caller
  behind it, for good. Requests get ids from the kernel's request space
  (`message.request_space`), so such a reply is known by its id alone: remembering every
  abandoned key was rejected, as a reply that never comes would hold one for good. A
  caller that gives up still leaves its key registered as abandoned, at most
  `ABANDONED_REQUESTS_KEPT` of them (oldest forgotten first): a retry of the same object
  is then sent with a fresh id, and a request whose id was made before the call (outside
  the space) has its late reply dropped while its key is kept.
- An actor's ``ctx.send`` yields to the loop every `SEND_YIELD_EVERY` messages: a send
  that finds room never suspends, and a producer would otherwise starve every other task.
- Per-message cost: once a reply class has passed validation (for the current
  ``output_type``) and writes its correlation slot plainly, ``ctx.send`` stamps it inline;
  ``ctx.receive`` parks on the inbox itself (no nested coroutine). Field values are
  checked where a message enters (`send`, ``ctx.send``: one call, compiled for classes of
  scalar fields; see `message.fields`), unless ``check_fields=False``. Supervision stays a
  coroutine around the actor function rather than a done-callback: failures are handled in
  the same step the actor raised in, before any other task can send to a dead actor.
- Every guarantee is written once. `close_out` (drain, count, hand back, record) ends a
  kernel for every reason (failure, an actor that returned, terminate) on every tier, and
  `hand_back` is the one way a message becomes undelivered. One supervision loop serves
  each actor task, a pool's replicas included (`_supervise`). Kernels forward to each
  other through the public `accept`/`accept_nowait`, and reach the runtime only through
  the `lookup` and `on_failed` callables it hands them.
- A tier whose actor runs elsewhere adds its steps through the `_place_*` hooks (no-ops
  here), written once: the GPU tier's kernel (a hosted one) adds its device's side of
  launch, deactivate/reactivate and failure there.
- The context holds what ``ctx.receive``/``ctx.send`` read on every message (queues,
  waiters, gate, forward target, stopping flag) in its own slots: bound at construction,
  and pushed to it by the kernel when they change (`_sync_contexts`), so the hot path
  reads no attribute of the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, ClassVar, Protocol

from ..decorators.validators import (
    check_message,
    validate_config,
    validate_message_type,
)
from ..exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    QueueClosedError,
    QueueTimeoutError,
    TypeValidationError,
)
from .config import RingKernelConfig
from .context import SEND_YIELD_EVERY, DecodingContext, KernelContext
from .fast_queue import BackpressureStrategy, FastMessageQueue, deadlines_of, wait_until
from .instruments import Instruments, instrumented_context
from .message import (
    RingKernelMessage,
    check_declared_types,
    check_fields,
    claim_request_key,
    fields_check,
    fields_ok,
    in_request_space,
    next_request_id,
    reply_key,
    request_key,
    request_space,
)
from .message.ids import uuid_from_bytes
from .queue import MessageQueue
from .states import KernelState
from .supervision import BurstLog, RestartIntensity
from .telemetry import RingKernelTelemetry
from .tiers.contract import Capabilities, TierWorker, fold_legacy_capabilities

__all__ = (
    "ABANDONED_REQUESTS_KEPT",
    "SEND_YIELD_EVERY",
    "KernelContext",
    "KernelFunc",
    "KernelState",
    "RingKernel",
    "RingKernelConfig",
    "managed_kernel",
)

logger = logging.getLogger("pydotcompute")
_LAUNCHED = KernelState.LAUNCHED  # (a module constant: an enum member read costs ~70 ns)

KernelFunc = Callable[["KernelContext"], Awaitable[None]]


class KernelHost(Protocol):
    """What a kernel uses of the runtime that launched it (`RingKernelRuntime`): other
    kernels by id, a word when it fails, the instruments to report to, and its tracer."""

    def get_kernel(self, kernel_id: str) -> RingKernel: ...

    def kernel_failed(self, kernel: RingKernel) -> None: ...

    @property
    def instruments(self) -> Instruments: ...

    @property
    def tracer(self) -> Any:
        """The runtime's `observability.tracing.MessageTracer` (``tracing=True``), else
        None: a tier that must know at launch whether trace context will cross (Ray's
        actor reads it) asks here."""


#: How many requests whose ``send_and_receive`` caller gave up (timed out or was
#: cancelled) a kernel keeps registered: sending one of those message objects again gives
#: the new call a fresh id, so the late reply to the old one cannot answer it. Beyond this
#: the oldest are forgotten. A late reply is dropped and counted either way when its
#: request's id was made by ``send_and_receive`` (the usual case); for a request whose id
#: was made before the call (read, set or decoded), only while its key is kept.
ABANDONED_REQUESTS_KEPT = 4096


def fields_checker(message_type: type | None) -> Any:
    """The cheap field check of messages sent to a kernel declaring ``message_type``:
    its class's own (`fields_check`), or `fields_ok` (any class) when it declares none
    or a class that is not a message."""
    if isinstance(message_type, type) and issubclass(message_type, RingKernelMessage):
        return fields_check(message_type)
    return fields_ok


class _Abandoned:
    """What stays registered for a request whose caller gave up: a waiter that is done,
    so its reply is dropped and counted (the caller's future itself is let go)."""

    __slots__ = ()

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False


ABANDONED: Any = _Abandoned()


def restart_log() -> BurstLog:
    """The rate-limited log of one actor's restarts: a line, then summaries."""
    return BurstLog(logger, logging.WARNING, "%d more restart(s) since the last line")


_ALLOWED: dict[str, tuple[KernelState, ...]] = {
    "launch": (KernelState.CREATED,),
    "activate": (KernelState.LAUNCHED,),
    "deactivate": (KernelState.ACTIVE,),
    "reactivate": (KernelState.DEACTIVATED,),
    "terminate": (
        KernelState.CREATED,
        KernelState.LAUNCHED,
        KernelState.ACTIVE,
        KernelState.DEACTIVATED,
        KernelState.FAILED,
    ),
}
_HINTS: dict[tuple[str, KernelState], str] = {
    ("activate", KernelState.CREATED): "launch it first",
    ("activate", KernelState.ACTIVE): "it is already active",
    ("activate", KernelState.DEACTIVATED): "use reactivate() to resume a deactivated kernel",
    ("reactivate", KernelState.ACTIVE): "it is already active",
    ("deactivate", KernelState.DEACTIVATED): "it is already deactivated",
    ("deactivate", KernelState.LAUNCHED): "activate it first",
    ("launch", KernelState.LAUNCHED): "it is already launched",
    ("terminate", KernelState.TERMINATED): "it is already terminated",
}


class RingKernel:
    """One persistent actor: its function, queues, task, state and telemetry.

    Usually created by `RingKernelRuntime.launch`; usable alone through
    `managed_kernel`.
    """

    EXTRA_OPTIONS: frozenset[str] = frozenset()
    #: What the asyncio tier supports (`tiers.contract.Capabilities`): async actors,
    #: restarts and pools. A tier whose actor runs elsewhere states its own on its worker
    #: class (`HostedKernel.WORKER`); the runtime reads nothing else.
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        actor_kind="async", restart=True, replicas=True
    )

    __slots__ = (
        "__weakref__",  # (the message registry holds kernels weakly: `message.declared`)
        "_abandoned",
        "_answers",
        "_ctx",
        "_ctxs",
        "_deadlines",
        "_direct",
        "_forward",
        "_func",
        "_gate",
        "_grace_cut",
        "_in_ok",
        "_inbox",
        "_instruments",
        "_kept_log",
        "_lookup",
        "_loop",
        "_lost_log",
        "_on_failed",
        "_outbox",
        "_runtime",
        "_space",
        "_state",
        "_stopping",
        "_task",
        "_tasks",
        "_timed",
        "_undelivered",
        "_waiters",
        "config",
        "error",
        "input_type",
        "kernel_id",
        "output_type",
        "telemetry",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Keep the kernel-to-kernel protocol one method under two names: a subclass that
        overrides `accept`/`accept_nowait` is also reached through the older private
        names (``_accept``/``_accept_nowait``), and one written against those is reached
        through the public protocol."""
        super().__init_subclass__(**kwargs)
        fold_legacy_capabilities(cls)
        own = cls.__dict__
        if "_accept" in own and "accept" not in own:
            older = own["_accept"]

            async def accept(self: Any, msg: Any, timeout: float | None = None) -> None:
                await older(self, msg, timeout)

            setattr(cls, "accept", accept)  # noqa: B010 (mypy refuses assigning a method)
        elif "accept" in own and "_accept" not in own:
            setattr(cls, "_accept", own["accept"])  # noqa: B010
        if "_accept_nowait" in own and "accept_nowait" not in own:
            setattr(cls, "accept_nowait", own["_accept_nowait"])  # noqa: B010
        elif "accept_nowait" in own and "_accept_nowait" not in own:
            setattr(cls, "_accept_nowait", own["accept_nowait"])  # noqa: B010

    def __init__(
        self,
        kernel_id: str,
        kernel_func: KernelFunc,
        *,
        config: RingKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
        runtime: KernelHost | None = None,
        enable_telemetry: bool = True,
        lookup: Callable[[str], RingKernel] | None = None,
        on_failed: Callable[[RingKernel], None] | None = None,
    ) -> None:
        if config is None:
            config = RingKernelConfig(kernel_id=kernel_id)
        elif config.kernel_id != kernel_id:
            config.kernel_id = kernel_id
        validate_config(config)
        if input_type is not None:
            validate_message_type(input_type, "input_type")
        if output_type is not None:
            validate_message_type(output_type, "output_type")
        if not callable(kernel_func):
            raise TypeValidationError(
                f"kernel {kernel_id!r}: kernel_func must be an async function taking a "
                f"KernelContext, got {type(kernel_func).__name__}"
            )
        self.kernel_id = kernel_id
        self.config = config
        self.input_type = input_type
        self.output_type = output_type
        self._func = kernel_func
        self._runtime = runtime
        # what the kernel needs of its runtime: other kernels by id, a word when it fails,
        # and the instruments it reports to (the runtime's own list)
        self._instruments: Instruments | None = None
        if runtime is not None:
            lookup = lookup or runtime.get_kernel
            on_failed = on_failed or runtime.kernel_failed
            self._instruments = runtime.instruments
        self._lookup = lookup
        self._on_failed = on_failed
        self._timed = enable_telemetry
        self._state = KernelState.CREATED
        self._inbox: FastMessageQueue[Any] | None = None
        self._outbox: FastMessageQueue[Any] | None = None
        self._ctx: KernelContext | None = None  # the first of `_ctxs`
        self._ctxs: list[KernelContext] = []  # one per actor task (a pool has several)
        self._task: asyncio.Task[None] | None = None  # the first of `_tasks`
        self._tasks: list[asyncio.Task[None]] = []
        self._gate: asyncio.Future[None] | None = None
        self._stopping = False
        self._waiters: dict[Any, asyncio.Future[Any]] = {}
        # keys of abandoned requests, oldest first (made on first use)
        self._abandoned: deque[Any] | None = None
        # the high bytes of the ids this kernel's send_and_receive requests get, and
        # whether it has had one (its replies are then checked for an abandoned caller)
        self._space: bytes | None = None  # (`request_space`, on the first request)
        self._answers = False
        self._lost_log: BurstLog | None = None  # replies nobody waits for (made on first)
        self._forward: RingKernel | None = None
        self.telemetry = RingKernelTelemetry(kernel_id, live=True)
        self.error: BaseException | None = None
        self._undelivered: list[Any] | None = None  # made on first use
        self._grace_cut: asyncio.Future[None] | None = None  # set by `hurry`
        self._kept_log: BurstLog | None = None  # replies a stopped target refused
        self._direct = True  # runtime may enqueue into _inbox directly (tier 1)
        # the loop it was activated on (or of the first send_and_receive), kept as the
        # queues keep theirs: on 3.11 looking the running loop up costs a getpid() call
        self._loop: asyncio.AbstractEventLoop | None = None
        # that loop's shared deadlines (`fast_queue.deadlines_of`), on the first timed request
        self._deadlines: Any = None
        # the cheap field check of a message sent here (None: not checked): `_validate_in`
        self._in_ok = fields_checker(input_type) if config.check_fields else None
        check_declared_types(self, input_type=input_type, output_type=output_type)

    # -- introspection ------------------------------------------------------------------

    @property
    def state(self) -> KernelState:
        return self._state

    @property
    def is_active(self) -> bool:
        return self._state is KernelState.ACTIVE

    @property
    def undelivered(self) -> list[Any]:
        """Messages this kernel could not deliver (left queued at terminate or failure);
        each is also counted as dropped."""
        left = self._undelivered
        if left is None:  # most kernels never lose one: the list is made when asked for
            left = self._undelivered = []
        return left

    @property
    def inbox(self) -> FastMessageQueue[Any] | None:
        return self._inbox

    @property
    def outbox(self) -> FastMessageQueue[Any] | None:
        return self._outbox

    @property
    def telemetry_enabled(self) -> bool:
        """Whether the actor's messages are counted and timed (``enable_telemetry``)."""
        return self._timed

    @property
    def stopping(self) -> bool:
        """True once the kernel takes no more messages (terminating, or its actor returned)."""
        return self._stopping

    @property
    def reply_waiters(self) -> dict[Any, Any]:
        """The callers awaiting a correlated reply, by the `reply_key` of the reply (the
        16 bytes of the ``correlation_id`` it will carry; read-only: register through
        `expect_reply`). Whoever delivers the kernel's replies (its context, the hosting
        bridge) pops a caller from it and completes its future."""
        return self._waiters

    @property
    def answers_requests(self) -> bool:
        """True once a ``send_and_receive`` request was made to this kernel: from then on
        whoever delivers its replies asks `hand_to_caller` about each, even with no caller
        waiting, so that a reply to a caller who gave up is dropped, not queued. (Every
        caller is registered after `claim_request`, which sets it: while it is False no
        caller waits, and a reply needs no look-up.)"""
        return self._answers

    @property
    def instruments(self) -> Instruments | None:
        """The runtime's instruments this kernel reports to (empty: none installed), or
        None for a kernel outside any runtime."""
        return self._instruments

    @property
    def lookup(self) -> Callable[[str], RingKernel] | None:
        """Another kernel of the same runtime by id (raising ``KernelNotFoundError``), or
        None for a kernel outside any runtime."""
        return self._lookup

    @property
    def messages_in_hand(self) -> int:
        """Messages its actors took and have not finished (one per actor at most): what a
        tier that counts the messages a dead process took with it adds to its count."""
        return sum(1 for ctx in self._ctxs if ctx.handling)

    @property
    def is_idle(self) -> bool:
        """True when this kernel cannot make progress without a new message (read-only).

        An ACTIVE kernel is idle when its inbox is empty and each of its actors is parked
        in ``ctx.receive()`` (or has returned); a kernel in any other state is idle because
        nothing is delivered to it. Used by ``pydotcompute.testing.wait_until_idle``; tiers
        that run the actor elsewhere override it.
        """
        if self._state is not KernelState.ACTIVE:
            return True
        inbox = self._inbox
        if inbox is None or len(inbox):
            return False
        if not self._tasks:  # the actor runs elsewhere (a hosted tier that does not say)
            return False
        live = sum(1 for t in self._tasks if not t.done())
        return inbox.parked_getters >= live

    def is_actor_task(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task`` runs this kernel's actor (on the runtime's loop): the runtime
        refuses, in such a task, calls that wait for every actor to finish."""
        return task in self._tasks

    def __repr__(self) -> str:
        return f"<RingKernel {self.kernel_id!r} {self._state.name}>"

    def _check(self, operation: str) -> None:
        if self._state not in _ALLOWED[operation]:
            raise KernelStateError(
                self.kernel_id, self._state, operation, _HINTS.get((operation, self._state), "")
            )

    # -- lifecycle ----------------------------------------------------------------------

    def _make_queue(self, size: int, inbox: bool) -> FastMessageQueue[Any]:
        cfg = self.config
        strategy = cfg.backpressure_strategy if inbox else BackpressureStrategy.BLOCK
        queue: Any
        if cfg.use_fast_queue:
            queue = FastMessageQueue(
                size,
                kernel_id=self.kernel_id,
                serialize=cfg.serialize,
                backpressure=strategy,
                expect=self.input_type if inbox else self.output_type,
            )
        else:
            queue = MessageQueue(size, kernel_id=self.kernel_id, backpressure=strategy)
        if inbox:  # drop_oldest drops reach telemetry as they happen
            queue.on_drop = self.telemetry.record_backpressure_drop
            if self._instruments:  # ... and the instruments, with the message dropped
                queue.on_drop_item = self._evicted
        result: FastMessageQueue[Any] = queue
        return result

    def _evicted(self, item: Any) -> None:
        """A full ``drop_oldest`` inbox evicted ``item``: the instruments hear of it."""
        if self._instruments:
            self._instruments.message_dropped(self, item, "backpressure")

    def _context_class(self) -> type[KernelContext]:
        """The class of the actor's context: plain or decoding, reporting to the
        instruments when the runtime has any (chosen once, here: see `instruments`)."""
        ctx_class: type[KernelContext] = DecodingContext if self.config.serialize else KernelContext
        if self._instruments:
            ctx_class = instrumented_context(ctx_class)
        return ctx_class

    def _make_contexts(self) -> list[KernelContext]:
        """One context per actor task (a pool makes one per replica)."""
        return [self._context_class()(self)]

    async def launch(self) -> None:
        """Phase 1: allocate the queues (CREATED -> LAUNCHED).

        Raises:
            InvalidConfigurationError: ``serialize=True`` with ``use_fast_queue=False``.
        """
        self._check("launch")
        if self.config.serialize and not self.config.use_fast_queue:
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: serialize=True needs use_fast_queue=True (the "
                "exact-priority MessageQueue stores message objects, not bytes)"
            )
        await self._place_launch()
        self._inbox = self._make_queue(self.config.input_queue_size, True)
        self._outbox = self._make_queue(self.config.output_queue_size, False)
        self._ctxs = self._make_contexts()
        self._ctx = self._ctxs[0] if self._ctxs else None
        self._state = KernelState.LAUNCHED

    def _actor_name(self, index: int) -> str:
        """How logs and task names call actor ``index`` (a pool's replicas: ``id[i]``)."""
        return self.kernel_id if len(self._ctxs) == 1 else f"{self.kernel_id}[{index}]"

    async def activate(self) -> None:
        """Phase 2: start the actor task, one per replica (LAUNCHED -> ACTIVE)."""
        self._check("activate")
        await self._place_set_active(True, "activate")
        self._state = KernelState.ACTIVE  # first: an eagerly started actor looks at it
        loop = self._loop = asyncio.get_running_loop()
        self._deadlines = None  # (its loop's, found again on the first timed request)
        try:
            for i in range(len(self._ctxs)):
                coro = self._supervise(i)
                try:
                    task = loop.create_task(coro, name=f"pydotcompute:{self._actor_name(i)}")
                except BaseException:
                    coro.close()
                    raise
                self._tasks.append(task)
        except BaseException:  # a task factory that refused: stop what started
            for task in self._tasks:
                task.cancel()
            self._tasks = []
            self._state = KernelState.LAUNCHED
            raise
        self._task = self._tasks[0] if self._tasks else None

    async def deactivate(self) -> None:
        """Pause delivery (ACTIVE -> DEACTIVATED); queued messages stay queued."""
        self._check("deactivate")
        await self._place_set_active(False, "deactivate")
        self._gate = asyncio.get_running_loop().create_future()
        self._state = KernelState.DEACTIVATED
        self._sync_contexts()

    async def reactivate(self) -> None:
        """Resume delivery (DEACTIVATED -> ACTIVE)."""
        self._check("reactivate")
        await self._place_set_active(True, "reactivate")
        self._state = KernelState.ACTIVE
        self._open_gate()

    def _open_gate(self) -> None:
        gate, self._gate = self._gate, None
        self._sync_contexts()
        if gate is not None and not gate.done():
            gate.set_result(None)

    def _sync_contexts(self) -> None:
        """Hand the actors' contexts what they read on every message and the kernel
        changes: the deactivation gate, the forward target, the stopping flag, and
        `answers_requests`."""
        for ctx in self._ctxs:
            ctx.kernel_changed(self._gate, self._forward, self._stopping, self._answers)

    def _stop_intake(self) -> None:
        """Take no more messages: new sends are refused, actors see ``should_terminate``
        once the inbox is drained."""
        self._stopping = True
        self._sync_contexts()

    def _begin_terminating(self, actor_tasks: Collection[Any], timeout: float | None) -> float:
        """The first steps of every `terminate`: refuse an actor awaiting its own
        termination (before anything changes: the kernel keeps running), then stop intake
        and wake the actors. Returns the grace period."""
        self._check("terminate")
        current = asyncio.current_task()
        if current is not None and current in actor_tasks:
            raise KernelStateError(
                self.kernel_id,
                self._state,
                "terminate",
                "an actor cannot await its own termination; return from the actor function instead",
            )
        self._state = KernelState.TERMINATING
        self._grace_cut = asyncio.get_running_loop().create_future()
        self._stop_intake()
        if self._inbox is not None:
            self._inbox.close(QueueClosedError(f"kernel {self.kernel_id!r} is terminating"))
        self._open_gate()
        return self.config.drain_timeout if timeout is None else timeout

    async def terminate(self, timeout: float | None = None) -> list[Any]:
        """Stop the kernel, draining its inbox gracefully.

        The actor keeps receiving until the inbox is empty (or ``timeout`` seconds pass,
        default ``config.drain_timeout``); then it is cancelled. Messages still queued are
        returned, kept in ``undelivered`` and counted as dropped; so is the message the
        actor was still handling when it was cancelled (taken, but it had not asked for
        the next one), first in the list and no longer counted as processed. The outbox
        stays readable until drained.
        """
        was = self._state
        timeout = self._begin_terminating(self._tasks, timeout)
        running = {t for t in self._tasks if not t.done()}
        if running:
            pending = await self.within_grace(running, timeout)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        # the messages the actors held when cancelled, or raised on while draining
        left = self._cut_off()
        held = await self._place_stop(was, timeout)
        if held is None:  # the place could not be stopped: the kernel was failed instead
            return []
        return self._finish_termination(left + held)

    def hurry(self) -> None:
        """End the grace period of a `terminate` under way now, as if its ``drain_timeout``
        had passed: the actors are cut off and what is still queued is handed back (an
        interrupted shutdown calls it). No effect on a kernel that is not terminating."""
        cut = self._grace_cut
        if cut is not None and not cut.done():
            cut.set_result(None)

    @property
    def hurried(self) -> bool:
        """Whether `hurry` cut the current terminate's grace period short."""
        cut = self._grace_cut
        return cut is not None and cut.done()

    async def within_grace(self, waits: set[Any], timeout: float) -> set[Any]:
        """Wait until every future of ``waits`` is done, ``timeout`` seconds pass or `hurry`
        is called; returns those not done. A terminate's wait for its actor (or its
        bridge) to drain."""
        cut = self._grace_cut
        if cut is None:
            _, pending = await asyncio.wait(waits, timeout=timeout)
            return pending
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pending = {w for w in waits if not w.done()}
        while pending and not cut.done():
            left = deadline - loop.time()
            if left <= 0:
                break
            _, pending = await asyncio.wait(
                pending | {cut}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(cut)
        return {w for w in pending if not w.done()}

    def _cut_off(self) -> list[Any]:
        """The messages the actors were handling when they were cancelled, if any: never
        processed, so they stop counting as processed and are reported with the
        undelivered ones (see `KernelContext.take_unfinished`)."""
        out: list[Any] = []
        for ctx in self._ctxs:
            out += ctx.take_unfinished()
        return out

    # -- closing the books (every tier) ---------------------------------------------------

    def hand_back(
        self, messages: list[Any], *, at: int | None = None, log: str | None = None
    ) -> None:
        """Account, once, for messages this kernel will never deliver: kept in
        `undelivered` (inserted at index ``at``, default the end: older leftovers go
        first), counted as dropped on the inbox's statistics and in telemetry (reason
        ``undelivered``), and logged as a warning with ``log`` (a %-format taking the
        kernel id and the count) when given. Every tier hands messages back through it."""
        if not messages:
            return
        n = len(messages)
        if at is None:
            self.undelivered.extend(messages)
        else:
            self.undelivered[at:at] = messages
        self.telemetry.record_drop(n, "undelivered")
        if self._inbox is not None:
            self._inbox.count_dropped(n)
        if log is not None:
            logger.warning(log, self.kernel_id, n)
        instruments = self._instruments
        if instruments:
            for msg in messages:
                instruments.message_dropped(self, msg, "undelivered")

    def reply_kept(self, target: Any, exc: BaseException) -> None:
        """A reply forwarded into ``target`` was refused because ``target`` stopped taking
        messages (``exc``); the caller keeps it in this kernel's outbox, readable. Logged
        once, then counted in summaries: a stopped target can refuse thousands."""
        log = self._kept_log
        if log is None:
            log = self._kept_log = BurstLog(
                logger,
                logging.WARNING,
                "%d more repl(ies) kept in the outbox since the last line",
            )
        log.event(
            "kernel %r: %r stopped taking messages (%s); what %r forwards to it is kept in "
            "its own outbox instead (runtime.receive / runtime.take_unread)",
            self.kernel_id,
            getattr(target, "kernel_id", target),
            exc,
            self.kernel_id,
        )

    def _log_kept_summary(self) -> None:
        log = self._kept_log
        kept = log.take_pending() if log is not None else 0
        if kept:
            logger.warning(
                "kernel %r: %d more repl(ies) kept in its outbox (the kernel it forwards "
                "into had stopped)",
                self.kernel_id,
                kept,
            )

    @property
    def unread_replies(self) -> int:
        """How many replies wait in the outbox, unread (a tier with a reply buffer of its
        own counts that)."""
        out = self._outbox
        return len(out) if out is not None else 0

    def count_lost_reply(self) -> None:
        """A reply that got nowhere (its caller gave up, or the kernel it was forwarded to
        refused it): counted as dropped, reason ``reply_lost``, on the outbox and in
        telemetry. Every tier counts such replies through it."""
        if self._outbox is not None:
            self._outbox.count_dropped(1)
        self.telemetry.record_drop(reason="reply_lost")

    def hand_to_caller(self, reply: Any) -> bool:
        """Complete the caller awaiting ``reply`` (registered in `reply_waiters` under its
        ``correlation_id``). True when the reply was a caller's: delivered, or dropped and
        counted when no caller waits for it any more (`drop_unawaited`); False when it
        answers no ``send_and_receive`` request and goes on to the forward target or the
        outbox."""
        key = reply_key(reply)
        if key is None:  # correlated with no request (or with one whose id was never made)
            return False
        fut = self._waiters.pop(key, None)
        if fut is None:
            return self.drop_unawaited(key)
        if not fut.done():
            fut.set_result(reply)
        else:  # its caller timed out or was cancelled: nobody reads it
            self.drop_unawaited(key, abandoned=True)
        return True

    def any_for_callers(self, replies: list[Any]) -> bool:
        """Whether `hand_to_caller` would take any of ``replies``: one a caller waits for,
        or one correlated with a request of this kernel's (`drop_unawaited` drops it).
        False lets a batch of plain replies go on in one piece."""
        keys = list(map(reply_key, replies))
        if not any(keys):
            return False
        waiters = self._waiters
        space = self._space
        return any(
            key is not None and (key in waiters or in_request_space(key, space)) for key in keys
        )

    def drop_unawaited(self, key: Any, *, abandoned: bool = False) -> bool:
        """Drop a reply correlated with a ``send_and_receive`` request that no caller
        waits for (it timed out, was cancelled, or has its reply already): counted as a
        lost reply and logged, one line then a count every few seconds. Every tier's reply
        delivery asks it about a reply whose correlation key ``key`` matched no waiting
        caller.

        Returns:
            True when the reply was dropped: ``key`` is in this kernel's request space, or
            ``abandoned`` (its caller's registration was found, abandoned). False, and
            nothing done, for any other reply (one to a plain ``send``, an uncorrelated
            one): it goes on to the forward target or the outbox.
        """
        if not abandoned and not in_request_space(key, self._space):
            return False
        self.count_lost_reply()
        log = self._lost_log
        if log is None:
            log = self._lost_log = BurstLog(
                logger,
                logging.WARNING,
                "%d more since the last line",
            )
        log.event(
            "kernel %r: dropped a reply nobody waits for: it answers a send_and_receive "
            "request whose caller timed out, was cancelled or has its reply already "
            "(counted in telemetry as dropped, reason 'reply_lost')",
            self.kernel_id,
        )
        return True

    def close_replies(self, error: BaseException) -> None:
        """Close the reply side: readers drain what is there, then get ``error``. A tier
        with its own reply channel overrides it."""
        if self._outbox is not None:
            self._outbox.close(error)

    def close_out(
        self,
        send_error: BaseException,
        receive_error: BaseException | None = None,
        left: list[Any] | None = None,
        *,
        log: str | None = None,
    ) -> list[Any]:
        """Close the kernel's books, the same way for every ending (a failure, an actor
        that returned, terminate) on every tier: intake closes with ``send_error``; the
        inbox is drained; ``left`` (what the actor side still held, oldest first) and then
        the drained messages are handed back (`hand_back`, logged with ``log``); callers
        awaiting a correlated reply get ``send_error``; the reply side closes with
        ``receive_error`` (default ``send_error``). Returns the messages handed back.
        The state is the caller's to set."""
        out = [] if left is None else left
        inbox = self._inbox
        if inbox is not None:
            inbox.close(send_error)
            out += inbox.drain()
        self.hand_back(out, log=log)
        self._fail_waiters(send_error)
        self.close_replies(send_error if receive_error is None else receive_error)
        return out

    def _finish_termination(self, left: list[Any]) -> list[Any]:
        """Close out a terminate: ``left`` (messages an actor never finished) plus whatever
        is still in the inbox are returned and handed back; waiting callers get a
        "terminated" error, and the state becomes TERMINATED. Shared by every tier's
        ``terminate``."""
        left = self.close_out(
            KernelStateError(
                self.kernel_id, KernelState.TERMINATED, "send to", "it was terminated"
            ),
            KernelStateError(
                self.kernel_id,
                KernelState.TERMINATED,
                "receive from",
                "it was terminated and its outbox is drained",
            ),
            left,
            log="kernel %r terminated with %d undelivered message(s) (counted as dropped)",
        )
        self._log_kept_summary()
        self._state = KernelState.TERMINATED
        return left

    def _fail(self, exc: BaseException) -> None:
        """The actor raised with no restart left (or its tier failed): FAILED, everything
        queued handed back, everyone waiting told why, and the runtime told."""
        held = self._place_failed(exc)
        self.error = exc
        self._state = KernelState.FAILED
        logger.error("kernel %r failed: %r", self.kernel_id, exc)
        err = KernelFailedError(self.kernel_id, exc)
        err.__cause__ = exc
        self.close_out(err, left=held)
        if self._on_failed is not None:
            self._on_failed(self)

    def _finished(self) -> None:
        """The actor function returned on its own: no more deliveries."""
        self._stop_intake()
        self.close_out(
            KernelStateError(
                self.kernel_id, KernelState.TERMINATED, "send to", "its actor function returned"
            ),
            KernelStateError(
                self.kernel_id,
                KernelState.TERMINATED,
                "receive from",
                "its actor function returned and its outbox is drained",
            ),
            log="kernel %r returned with %d queued message(s) (counted as dropped)",
        )
        self._state = KernelState.TERMINATED

    def _fail_request(self, request: Any, exc: BaseException, note: str) -> None:
        """The actor raised on ``request`` and restarts: its correlated caller learns why."""
        if request is None or not self._waiters:
            return
        try:
            key = request_key(request)
        except AttributeError:  # a plain value: no caller can wait for its reply
            return
        fut = self._waiters.pop(key, None)
        if fut is not None and not fut.done():
            err = KernelFailedError(
                self.kernel_id, exc, state=KernelState.ACTIVE, note=note, restarted=True
            )
            err.__cause__ = exc
            fut.set_exception(err)

    def _fail_waiters(self, err: BaseException) -> None:
        # emptied in place: the contexts hold this very dict
        waiters = list(self._waiters.values())
        self._waiters.clear()
        self._abandoned = None
        for fut in waiters:
            if not fut.done():
                fut.set_exception(err)

    # -- the actor tasks: one supervision loop -------------------------------------------

    def _replica_telemetry(self, index: int) -> RingKernelTelemetry | None:
        """Actor ``index``'s own telemetry record when it has one besides the kernel's (a
        pool's replica), else None."""
        return None

    async def _supervise(self, index: int) -> None:
        """Run actor ``index`` under the restart policy: its own restart budget and restart
        log, made at its first failure (an idle actor keeps one coroutine frame here)."""
        ctx = self._ctxs[index]
        own = self._replica_telemetry(index)
        taken_at_restart: int | None = None
        intensity: RestartIntensity | None = None
        log: BurstLog | None = None
        try:
            while True:
                try:
                    await self._func(ctx)
                except QueueClosedError:
                    ctx.message_done()  # it asked for the next message: the last one is done
                    if self._stopping or self._state is KernelState.FAILED:
                        return
                    self._fail(QueueClosedError(f"kernel {self.kernel_id!r}: inbox closed"))
                    return
                except asyncio.CancelledError:
                    if self._state is KernelState.FAILED:  # another replica failed the kernel
                        self.hand_back(ctx.take_unfinished())
                        return
                    if self._stopping:
                        return
                    raise
                except Exception as exc:
                    if self._state is KernelState.FAILED:  # woken by another replica's failure
                        self.hand_back(ctx.take_unfinished())
                        return
                    self.telemetry.record_error(exc)
                    if own is not None:
                        own.record_error(exc)
                    ctx.actor_raised(exc)
                    if self._stopping:  # the message it raised on is handed back by terminate
                        self.error = exc
                        logger.error("kernel %r raised while terminating: %r", self.kernel_id, exc)
                        return
                    if intensity is None or log is None:
                        intensity, log = self.restart_intensity(), restart_log()
                    pause = self._restart_pause(intensity, taken_at_restart)
                    if pause is not None:
                        self.telemetry.restarts += 1
                        if own is not None:
                            own.restarts += 1
                        note = self._restart_note(intensity, (own or self.telemetry).restarts)
                        self._log_restart(log, self._actor_name(index), exc, note)
                        self._fail_request(ctx.current_message, exc, note)
                        if ctx.take_unfinished():  # the message it raised on: dropped, and counted
                            self.telemetry.record_drop(reason="actor_failed")
                            if self._inbox is not None:
                                self._inbox.count_dropped(1)
                        ctx.forget_current()
                        if pause and not await self._backoff(pause):
                            return
                        taken_at_restart = self._taken()
                        continue
                    self.hand_back(ctx.take_unfinished())  # the message it raised on goes first
                    self._fail(exc)
                    return
                else:
                    ctx.message_done()  # returning finishes the message it held
                    if not self._stopping:
                        self._actor_returned(index)
                    return
        finally:
            if log is not None:
                total = (own or self.telemetry).restarts
                self._log_restarts_left(log, self._actor_name(index), total)

    def _actor_returned(self, index: int) -> None:
        """Actor ``index`` returned on its own (not asked to stop): the kernel ends."""
        self._finished()

    # -- supervision helpers ------------------------------------------------------------

    def restart_intensity(self) -> RestartIntensity:
        """A fresh restart budget from the config (one per actor, or per replica)."""
        cfg = self.config
        return RestartIntensity(
            cfg.max_restarts, cfg.restart_window, cfg.restart_backoff, cfg.restart_backoff_max
        )

    def _taken(self) -> int:
        """How many messages the actors took from the inbox so far."""
        inbox = self._inbox
        return int(inbox.statistics().total_dequeued) if inbox is not None else 0

    def _restart_pause(
        self, intensity: RestartIntensity, taken_at_restart: int | None
    ) -> float | None:
        """The pause before restarting an actor that raised, or None: no restart (the
        policy is ``never`` or the budget is spent). ``taken_at_restart``: the `_taken`
        count at the last restart (None: none yet)."""
        if self.config.restart != "on_failure":
            return None
        # it took the message it raised on; one more means it finished one in between
        progressed = taken_at_restart is None or self._taken() - taken_at_restart > 1
        return intensity.next_restart(progressed)

    async def _backoff(self, pause: float) -> bool:
        """Wait ``pause`` seconds before a restart; False when terminate cut it short."""
        try:
            await asyncio.sleep(pause)
        except asyncio.CancelledError:
            if self._stopping:
                return False
            raise
        return True

    @staticmethod
    def _restart_note(intensity: RestartIntensity, count: int) -> str:
        if intensity.max_restarts is None:
            return f"restart {count}, no limit"
        return f"restart {count} of {intensity.describe()}"

    def _log_restart(self, log: BurstLog, who: str, exc: BaseException, note: str) -> None:
        log.event("kernel %r raised %r; restarted (%s)", who, exc, note)

    @staticmethod
    def _log_restarts_left(log: BurstLog, who: str, total: int) -> None:
        """The closing summary of a rate-limited restart log (when the actor stops)."""
        left = log.take_pending()
        if left:
            logger.warning(
                "kernel %r: %d more restart(s) not logged one by one; %d in all",
                who,
                left,
                total,
            )

    # -- messaging ----------------------------------------------------------------------

    def _refuse(self, operation: str) -> BaseException:
        if self._state is KernelState.FAILED:
            return KernelFailedError(self.kernel_id, self.error)
        if self._inbox is None:
            return KernelStateError(self.kernel_id, self._state, operation, "launch it first")
        return KernelStateError(self.kernel_id, self._state, operation)

    def _validate_in(self, msg: Any) -> None:
        in_t = self.input_type
        t = type(msg)
        if in_t is not None and t is not in_t and not isinstance(msg, in_t):
            check_message(msg, in_t, self.kernel_id, "expects")
        ok = self._in_ok  # (the declared class's own check, or one for any class)
        if ok is not None and not ((t is in_t or in_t is None) and ok(msg)):
            check_fields(msg, self.kernel_id, "expects")

    def try_accept(self, msg: Any, timeout: float | None = None) -> bool:
        """Accept ``msg`` at once, without a coroutine, where that needs no waiting: True
        when done; False (nothing done) when the caller must ``await accept(msg)``, which
        this kernel always asks for. A tier with a quick intake (the hosting bridge's
        direct hand-over) overrides it; ``send_and_receive`` tries it first, passing its
        ``timeout`` (the most a reply spin at the hand-over may take).

        It raises what `accept` raises for a message this kernel can never take
        (``TypeValidationError`` for the wrong class, say).
        """
        return False

    async def accept(self, msg: Any, timeout: float | None = None) -> None:
        """Validate ``msg`` and enqueue it, applying the inbox's backpressure policy: the
        path of every send that is not the runtime's fast path, and how kernels hand
        messages to each other (``connect``, ``ctx.send_to``). A tier overrides it (with
        `accept_nowait`) where its intake differs.

        Raises:
            TypeValidationError: not the kernel's ``input_type``.
            KernelStateError: the kernel is terminating, terminated or failed.
            QueueFullError / QueueTimeoutError: ``reject`` backpressure / the ``timeout``.
        """
        self._validate_in(msg)
        inbox = self._inbox
        if inbox is not None and not self._stopping and inbox.offer(msg):
            return  # open, with room: appended
        if inbox is None or inbox.closed or self._stopping:
            raise self._refuse("send to")
        try:
            await inbox.put(msg, timeout=timeout)
        except QueueClosedError:
            raise self._refuse("send to") from None

    def accept_nowait(self, msg: Any) -> None:
        """Like `accept` but a full inbox raises ``QueueFullError`` at once."""
        self._validate_in(msg)
        inbox = self._inbox
        if inbox is None or inbox.closed or self._stopping:
            raise self._refuse("send to")
        inbox.put_nowait(msg)

    # the protocol's older names (a subclass that overrides one of a pair gets it under
    # both names: see `__init_subclass__`)
    async def _accept(self, msg: Any, timeout: float | None) -> None:
        await self.accept(msg, timeout)

    def _accept_nowait(self, msg: Any) -> None:
        self.accept_nowait(msg)

    def forward_to(self, target: RingKernel | None) -> None:
        """Send everything the actor sends on into ``target``'s inbox (None: the outbox)."""
        self._forward = target
        self._sync_contexts()

    @property
    def forwards_to(self) -> RingKernel | None:
        """The kernel this one forwards into, or None."""
        return self._forward

    async def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Put ``msg`` in the inbox (waits under ``block`` backpressure).

        ``runtime.send`` returns this coroutine itself, so its fast path (the exact
        ``input_type``, room in an open inbox: one append, no await) is the whole cost of
        a send.
        """
        inbox = self._inbox
        in_t = self.input_type
        ok = self._in_ok
        if (
            self._direct
            and (in_t is None or type(msg) is in_t)
            and (ok is None or ok(msg))
            and inbox is not None
            and not self._stopping
            and inbox.offer(msg)  # open, with room: appended
        ):
            return True
        await self.accept(msg, timeout)
        return True

    def send_nowait(self, msg: Any) -> bool:
        """Put ``msg`` in the inbox or raise (``QueueFullError``, state errors)."""
        self.accept_nowait(msg)
        return True

    async def receive(self, timeout: float | None = None) -> Any:
        """The next message from the outbox (a reply), waiting up to ``timeout``.

        Raises:
            QueueTimeoutError: nothing arrived in time.
            KernelStateError: the kernel is LAUNCHED (never activated: no reply can come,
                so this raises at once), or terminated and drained.
            KernelFailedError: the actor raised (after the outbox was drained).
        """
        out = self._outbox
        if out is None:
            raise self._refuse("receive from")
        if out.qsize:
            return out.take()
        if self._state is KernelState.LAUNCHED:
            raise self._not_active("receive from")
        if timeout is not None:
            return await out.take_within(timeout)
        while True:  # ``out.get()`` inlined: the caller's wake-up resumes one frame less
            fut = out.park_getter()
            try:
                await fut
            except BaseException:
                out.unpark_getter(fut)
                raise
            if out.qsize:
                return out.take()

    def _not_active(self, operation: str) -> KernelStateError:
        return KernelStateError(
            self.kernel_id,
            self._state,
            operation,
            "activate it first: a kernel that was never activated runs no actor, so no "
            "reply can come",
        )

    def receive_nowait(self) -> Any:
        """The next reply or None."""
        out = self._outbox
        if out is None:
            raise self._refuse("receive from")
        return out.get_nowait()

    # -- correlated requests ------------------------------------------------------------

    @property
    def pending_requests(self) -> int:
        """How many ``send_and_receive`` registrations this kernel holds: requests awaiting
        their reply, plus at most `ABANDONED_REQUESTS_KEPT` whose caller gave up."""
        return len(self._waiters)

    def _no_message_id(self, msg: Any) -> TypeValidationError:
        return TypeValidationError(
            f"kernel {self.kernel_id!r}: send_and_receive needs a message (an @message "
            f"instance with a message_id), got {type(msg).__name__}"
        )

    def expect_reply(self, msg: Any, waiter: Any) -> tuple[Any, Any]:
        """Register ``waiter`` (a future, or an object with its ``done``/``set_result``/
        ``set_exception``) for the reply to ``msg``. Runs on the kernel's loop.

        Returns:
            ``(request, key)``: what to send, and the key its caller is filed under
            (`request_key`: the 16 bytes of the ``correlation_id`` its reply will
            carry). ``request`` is ``msg`` itself, or a copy of it with a fresh
            ``message_id`` when a reply to ``msg``'s id is already awaited (another caller
            sent the same object, or an earlier attempt timed out): each call gets its own
            reply.

        Raises:
            TypeValidationError: ``msg`` has no ``message_id``, or it needs a fresh id and
                cannot be copied.
        """
        key = self.claim_request(msg)
        waiters = self._waiters
        if key in waiters:
            try:
                msg = copy.copy(msg)
                msg.message_id = uuid_from_bytes(next_request_id(self._space or self._make_space()))
                key = request_key(msg)
            except (AttributeError, TypeError) as exc:
                raise TypeValidationError(
                    f"kernel {self.kernel_id!r}: a reply to this {type(msg).__name__} "
                    f"(message_id {msg.message_id}) is already awaited, and the request "
                    f"cannot be copied with a new id ({exc}); send a new message instead"
                ) from None
        waiters[key] = waiter
        return msg, key

    def _make_space(self) -> bytes:
        """This kernel's request space (`request_space`: a hash of its id), made on its
        first request, not at launch: most kernels are never asked one."""
        space = self._space = request_space(self.kernel_id)
        return space

    def claim_request(self, msg: Any) -> Any:
        """The key a reply to request ``msg`` is filed under (`request_key`), its id made
        now in this kernel's request space when it has none (`claim_request_key`), and
        the kernel marked as answering requests (`answers_requests`). Every tier's
        ``send_and_receive`` takes its key here before the request is sent.

        Raises:
            TypeValidationError: ``msg`` has no ``message_id``.
        """
        try:
            key = claim_request_key(msg, self._space or self._make_space())
        except AttributeError:
            raise self._no_message_id(msg) from None
        if not self._answers:
            self._answers = True
            self._sync_contexts()
        return key

    def forget_request(self, key: Any, waiter: Any) -> None:
        """Unregister ``waiter``: its call ended (its reply came, or its request was never
        accepted, so no reply can come)."""
        waiters = self._waiters
        if waiters.get(key) is waiter:
            del waiters[key]

    def abandon_request(self, key: Any, waiter: Any) -> None:
        """The caller of ``waiter`` gave up on an accepted request: the key stays registered
        (without the caller's waiter) so the late reply is counted as dropped, not left in
        the outbox; beyond `ABANDONED_REQUESTS_KEPT` such keys the oldest is forgotten."""
        waiters = self._waiters
        if waiters.get(key) is not waiter:
            return  # answered (or failed) meanwhile
        waiters[key] = ABANDONED
        kept = self._abandoned
        if kept is None:
            kept = self._abandoned = deque()
        kept.append(key)
        if len(kept) > ABANDONED_REQUESTS_KEPT:
            oldest = kept.popleft()
            if waiters.get(oldest) is ABANDONED:
                del waiters[oldest]

    async def send_and_receive(self, msg: Any, timeout: float | None = None) -> Any:
        """Send ``msg`` and wait for the reply whose ``correlation_id`` is its id.

        Safe with concurrent callers: each waits on its own future. A message object sent
        again while a reply to it is still awaited (or after an attempt timed out) goes as
        a copy with a fresh ``message_id`` (see `expect_reply`).
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        # (``hasattr`` would read ``message_id``, which builds a UUID a message keeps its
        # id as bytes to avoid)
        if not isinstance(msg, RingKernelMessage) and not hasattr(msg, "message_id"):
            raise self._no_message_id(msg)
        if self._state is _LAUNCHED:
            raise self._not_active("send_and_receive to")
        # `expect_reply`, inlined for its common case: a request whose key is free
        key = self.claim_request(msg)
        waiters = self._waiters
        if key in waiters:
            msg, key = self.expect_reply(msg, fut)  # a copy with a fresh id
        else:
            waiters[key] = fut
        accepted = timed_out = False
        try:
            if timeout is None:
                if not self.try_accept(msg):
                    await self.accept(msg, None)
                accepted = True
                reply = await fut
            else:
                # The time limit is the intake's own (a send that waits for room) and then
                # the loop's shared deadlines (`fast_queue.deadlines_of`): no
                # `asyncio.timeout` scope (its task cancel and uncancel cost a round trip
                # microseconds), no timer or task of its own (on 3.11 ``wait_for`` can
                # swallow a cancellation that lands as the reply arrives).
                deadline = loop.time() + timeout
                try:
                    if not self.try_accept(msg, timeout):
                        await self.accept(msg, timeout)
                except QueueTimeoutError:
                    timed_out = True
                    raise self._no_reply(msg, timeout) from None
                accepted = True
                book = self._deadlines
                if book is None:
                    book = self._deadlines = deadlines_of(loop)
                try:
                    if fut.done():
                        reply = fut.result()
                    elif book is None or deadline <= loop.time():
                        reply = await wait_until(fut, deadline, loop)
                    else:  # (`wait_until`, inlined: one coroutine less a round trip)
                        filed = book.file(fut, deadline, loop)
                        try:
                            reply = await fut
                        finally:
                            book.waiting.pop(filed, None)
                except TimeoutError:
                    timed_out = True
                    raise self._no_reply(msg, timeout) from None
        except BaseException:
            self.end_request(key, fut, accepted, timed_out)
            raise
        # answered (`end_request`'s common case): the delivery took the key off already
        if waiters.get(key) is fut:
            del waiters[key]
        return reply

    async def await_reply(
        self, msg: Any, key: Any, fut: asyncio.Future[Any], timeout: float | None, deadline: float
    ) -> Any:
        """The second half of `send_and_receive`, for a tier that accepted ``msg`` itself
        (registered with `expect_reply` under ``key`` to ``fut``): wait for the reply until
        ``deadline`` (the loop's clock; ignored when ``timeout`` is None), then end the
        request as `send_and_receive` does."""
        timed_out = False
        try:
            if timeout is None:
                return await fut
            if fut.done():
                return fut.result()
            try:
                return await wait_until(fut, deadline, self._loop or asyncio.get_running_loop())
            except TimeoutError:
                timed_out = True
                raise self._no_reply(msg, timeout) from None
        finally:
            self.end_request(key, fut, True, timed_out)

    def end_request(
        self, key: Any, fut: asyncio.Future[Any], accepted: bool, timed_out: bool
    ) -> None:
        """A `send_and_receive` call ends: a request accepted but not answered (timed out,
        cancelled) is abandoned, its late reply dropped and counted; any other is forgotten."""
        if accepted and (timed_out or not fut.done() or fut.cancelled()):
            if not fut.done():
                fut.cancel()
            self.abandon_request(key, fut)
        else:
            self.forget_request(key, fut)

    def _no_reply(self, msg: Any, timeout: float) -> QueueTimeoutError:
        return QueueTimeoutError(
            f"no reply from kernel {self.kernel_id!r} within {timeout}s "
            f"(request {type(msg).__name__} {msg.message_id}; kernel {self._state.name})"
        )

    def messages_received(self) -> int:
        """Messages accepted into this kernel so far (telemetry's ``messages_received``),
        read from the inbox's own counters: nothing is counted per message for it."""
        inbox = self._inbox
        return 0 if inbox is None else inbox.statistics().total_enqueued

    # -- what a tier may add: the defaults (see `Capabilities`) ---------------------------

    @property
    def worker(self) -> TierWorker | None:
        """The `TierWorker` the actor runs in, or None: it runs on the runtime's loop."""
        return None

    def carry_trace(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """Have the tier carry trace context to its actor and back (a tracing instrument
        asks, at `Instrument.kernel_launched`): see `TierWorker.trace_wire`. False here:
        an asyncio actor runs in the runtime's own context, where the instrument makes a
        message's span current itself (``CAPABILITIES.trace_wire`` off)."""
        return False

    def refresh_telemetry(self) -> None:
        """Fold what the tier counted elsewhere into `telemetry` (``runtime.get_telemetry``
        calls it before reading, where ``CAPABILITIES.telemetry_refresh`` says there is
        something to fold). Nothing here: tier 1 counts into its record directly."""

    def replica_telemetry(self) -> list[RingKernelTelemetry]:
        """One telemetry record per actor (``CAPABILITIES.replica_telemetry``: a pool's
        replicas, adding up to the kernel's); here the kernel's own record, its only one."""
        return [self.telemetry]

    async def broadcast(self, msg: Any, timeout: float | None = None) -> int:
        """Send each actor of this kernel its own copy of ``msg`` (``runtime.broadcast``);
        with one actor (``CAPABILITIES.broadcast`` off) that is one `send`. Returns how
        many actors it reached."""
        await self.send(msg, timeout)
        return 1

    # -- the tier's side of each verb (no-ops here: the actor runs on this loop) ----------
    #
    # A tier whose actor runs elsewhere (a device, a process) overrides these instead of the
    # verbs: the checks, states, hand-back and accounting stay the verbs' own.

    async def _place_launch(self) -> None:
        """`launch`'s tier step, before the queues are made: start the place where the
        actor runs. Raising leaves the kernel CREATED."""

    async def _place_set_active(self, active: bool, operation: str) -> None:
        """`activate`/`reactivate` (``active`` True) and `deactivate`'s tier step, before
        the state changes: let the place take messages, or stop it taking any."""

    async def _place_stop(self, was: KernelState, grace: float) -> list[Any] | None:
        """`terminate`'s tier step, once intake is closed and the actor tasks ended: stop
        the place (``was``: the state before terminate; ``grace``: the drain period) and
        return what it still held, oldest first, to hand back. None: it could not be
        stopped and failed the kernel instead, which stays FAILED."""
        return []

    def _place_failed(self, exc: BaseException) -> list[Any]:
        """`_fail`'s tier step, before the books close: tell the place to stop, and return
        the messages it held that will never be delivered (handed back before the inbox's)."""
        return []

    # -- the end of the actors, seen from outside ------------------------------------------

    def _actor_tasks(self) -> list[asyncio.Task[Any]]:
        """The loop tasks that run this kernel's actors (a tier that drives its actor from
        other tasks overrides it)."""
        return list(self._tasks)

    def add_done_callback(self, callback: Callable[[RingKernel], object]) -> None:
        """Have ``callback(kernel)`` called, on the kernel's loop, once its actors have all
        stopped: they returned by themselves, failed with no restart left, or terminate
        stopped them. By then a kernel that ended on its own account is TERMINATED or
        FAILED with its books closed (what it held handed back, callers told). Called soon
        (not inline) when they have stopped already. What a host that runs the kernel for
        someone else (a Ray actor) watches to learn that the kernel ended.

        Raises:
            KernelStateError: the kernel was never activated (no actor runs yet).
        """
        tasks = self._actor_tasks()
        if not tasks:
            raise KernelStateError(
                self.kernel_id, self._state, "watch", "activate it first: no actor runs yet"
            )
        running = [t for t in tasks if not t.done()]
        if not running:
            asyncio.get_running_loop().call_soon(callback, self)
            return
        left = [len(running)]

        def one_done(_task: asyncio.Task[Any]) -> None:
            left[0] -= 1
            if not left[0]:
                callback(self)

        for task in running:
            task.add_done_callback(one_done)


@contextlib.asynccontextmanager
async def managed_kernel(
    kernel_id: str, kernel_func: KernelFunc, **kwargs: Any
) -> AsyncIterator[RingKernel]:
    """Launch and activate a standalone kernel; terminate it on exit.

    ``kwargs`` are passed to `RingKernel` (``config``, ``input_type``, ...).
    """
    kernel = RingKernel(kernel_id, kernel_func, **kwargs)
    await kernel.launch()
    await kernel.activate()
    try:
        yield kernel
    finally:
        if kernel.state is not KernelState.TERMINATED:
            await kernel.terminate()
