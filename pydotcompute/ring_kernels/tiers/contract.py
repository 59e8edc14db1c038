"""The tier contract: what a place to run an actor must provide to the runtime.

A tier is mechanism. It starts and stops the place where the actor runs (a thread, a
child process, a GPU kernel, a Ray actor), moves messages in and out, and reports what
happened. Everything that is a promise to the user is policy and lives once, in the
runtime's kernel (`RingKernel` and the hosting bridge `HostedKernel`), for every tier:

- *accounting*: every message accepted by `send` ends exactly once: as a reply read by
  the user, a message forwarded to a connected kernel, a message handed back by
  `terminate`/`shutdown` (`undelivered`), or a counted drop (backpressure, a reply nobody
  waits for any more, a message the tier rejected). Telemetry counts every drop; nothing
  is reported twice.
- *supervision*: the restart policy, `FAILED`, errors to waiting callers.
- *correlation*: `send_and_receive` matches replies; a caller that timed out or was
  cancelled leaves no reply behind to fill an outbox (it is dropped and counted).
- *backpressure*: the user's bounds hold end to end: the runtime keeps the banded inbox and
  hands a tier at most `bridge_queue_size` messages, so priority is never starved behind a
  tier's own backlog.
- *edges*: cancellation, receive on a kernel that is not active, an oversized message and
  a wrong actor kind are reported at once.

What a tier supports beyond the required methods is stated once, as a frozen
`Capabilities` on its worker class (``CAPABILITIES``; the asyncio tier's on `RingKernel`):
the runtime and the bridge read those flags and nothing else. Where a tier lacks one, the
base classes do the default (a plain send for a broadcast, no telemetry to fold in, loop
edges, ...); no caller probes an object for a method.

Design notes:
- The contract is an abstract class rather than a Protocol so that a tier states its
  capabilities in one place a reader finds (`Capabilities`), and so that a missing
  method fails at construction, not at the first message.
- Capabilities are one frozen value rather than a class attribute each: a pool or a
  wrapper derives its own with `dataclasses.replace`, and a flag nobody declared cannot
  be misspelled into existence. The older attribute names (``ACTOR_KIND``,
  ``SUPPORTS_RESTART``, ``SUPPORTS_POOL``, ``EDGE_OUT``, ``EDGE_IN``,
  ``SUPPORTS_INLINE_REQUEST``) stated by a class of a tier written before are folded
  into its ``CAPABILITIES`` once, when the class is made (`fold_legacy_capabilities`);
  nothing reads them.
- Every method is non-blocking except `start` and `stop`, which the runtime runs in a
  worker thread (`asyncio.to_thread`). Wake-ups come back through callbacks the tier may
  call from any thread; the runtime hands them to its loop.
- The asyncio tier is the runtime's own kernel class: its actor is a task on the loop, so
  it needs no bridge and implements the policy directly on its queues.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from ...exceptions import InvalidConfigurationError, TypeValidationError

__all__ = (
    "ActorKind",
    "Capabilities",
    "TierWorker",
    "actor_kind",
    "check_actor_kind",
    "fold_legacy_capabilities",
)

ActorKind = Literal["async", "sync"]


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """What a tier supports, stated once: the spec every tier is read by.

    A tier states it on its `TierWorker` subclass (``CAPABILITIES = Capabilities(...)``),
    and its `HostedKernel` subclass names that worker class (``WORKER``) to take it over;
    the asyncio tier, which needs no bridge, states it on `RingKernel`. The runtime and the
    bridge read these flags and never look for a method on a kernel or a worker: where a
    flag is off, the base class's default applies (the column on the right).

    Attributes:
        actor_kind: ``"sync"`` (a plain function), ``"async"`` (a coroutine function), or
            None: the tier checks its actor itself (a GPU device handler, the tier inside a
            Ray actor). The runtime refuses the other kind at launch
            (`check_actor_kind`).
        restart: ``restart="on_failure"`` is honoured. Off: refused at launch.
        replicas: ``replicas=N`` runs N actors behind one id (`pool.py`). Off: refused at
            launch for N > 1.
        broadcast: ``runtime.broadcast`` sends each actor of the kernel its own copy (a
            pool's `broadcast`). Off: it is one `send`, reaching 1.
        resize: the worker's room can change once built (`TierWorker.set_room`), so the
            bridge widens for a quick actor. Off: the room given at launch stays.
        inline_request: the worker can be polled for a reply within a budget
            (``reply_within``), so a lone ``send_and_receive`` may be made inline (the
            process tier's ``reply_spin_us``). Off: every request waits on a future.
        edges_out: the direct edge kinds (`edges.EdgeKind`) the actor can produce into
            (`TierWorker.route_into`). Empty: its output always crosses the loop.
        edges_in: the direct edge kinds the actor can consume from
            (`TierWorker.open_edge`). Empty: its input always crosses the loop.
        hurry: `RingKernel.hurry` ends a terminate's grace period at once (an interrupted
            shutdown). Off: the call is accepted and the kernel drains to its
            ``drain_timeout``.
        telemetry_refresh: the tier has figures to fold into the kernel's telemetry when
            it is read (`RingKernel.refresh_telemetry`: the latencies a worker timed,
            `TierWorker.drain_latencies`; a device's counters; a pool's replicas). Off:
            the record is read as it is (a worker's latencies are not asked for).
        replica_telemetry: one telemetry record per actor (`RingKernel.replica_telemetry`),
            adding up to the kernel's; the metrics add a series per replica. Off: the
            kernel's own record is its only one.
        trace_wire: the worker carries trace context to its actor and back
            (`TierWorker.trace_wire`). Off: its actor handles messages outside their
            traces (a tracing runtime still records the bridge's spans).
        short_poll_rearms: `TierWorker.poll_replies` returning fewer replies than asked
            means the tier held no more just then and `on_readable`'s callback runs for
            the next one: the bridge stops polling there, without one more poll to find
            none (on a round trip, a poll and a lock for nothing). Off: it polls until a
            poll finds none.
        edges_spread: the direct edge kinds (of ``edges_out``) the kernel's producer side
            spreads over its consumer's replicas (`TierWorker.edge_replicas`), one edge per
            replica, rather than one edge into the consumer's first actor. Empty: one edge.
        urgent_lane: a message of priority 160 or more (HIGH, SYSTEM) that `offer` or
            `offer_many` hands over is taken by the actor before what it was handed
            earlier and has not taken yet (each band's order kept), so the bridge may hand
            a quick actor wider batches (`hosted.BRIDGE_WINDOW_URGENT_LANE_S`). Off: what
            is handed over is taken in the order given, and the batches stay narrow
            enough that an urgent message waits behind about 0.5 ms of work.
    """

    actor_kind: ActorKind | None = "sync"
    restart: bool = False
    replicas: bool = False
    broadcast: bool = False
    resize: bool = False
    inline_request: bool = False
    edges_out: frozenset[str] = frozenset()
    edges_in: frozenset[str] = frozenset()
    hurry: bool = True
    telemetry_refresh: bool = False
    replica_telemetry: bool = False
    trace_wire: bool = False
    short_poll_rearms: bool = False
    edges_spread: frozenset[str] = frozenset()
    urgent_lane: bool = False


#: The older class attributes a tier stated its capabilities with, and the flag each is.
_LEGACY_NAMES = {
    "ACTOR_KIND": "actor_kind",
    "SUPPORTS_RESTART": "restart",
    "SUPPORTS_POOL": "replicas",
    "EDGE_OUT": "edges_out",
    "EDGE_IN": "edges_in",
    "SUPPORTS_INLINE_REQUEST": "inline_request",
    "SHORT_POLL_REARMS": "short_poll_rearms",
    "EDGE_SPREAD": "edges_spread",
}


def fold_legacy_capabilities(cls: type) -> None:
    """Fold the older capability attributes ``cls`` states itself (``ACTOR_KIND``,
    ``SUPPORTS_RESTART``, ...) into its ``CAPABILITIES``, and remove them, so that a tier
    written before `Capabilities` keeps meaning what it said and nothing reads two
    spellings. A class that states ``CAPABILITIES`` itself keeps it as stated."""
    own = cls.__dict__
    found = {flag: own[name] for name, flag in _LEGACY_NAMES.items() if name in own}
    if not found:
        return
    for name in _LEGACY_NAMES:
        if name in own:
            delattr(cls, name)
    if "CAPABILITIES" not in own:
        base: Capabilities = cls.CAPABILITIES  # type: ignore[attr-defined]
        for key in ("edges_out", "edges_in", "edges_spread"):
            if key in found:
                found[key] = frozenset(found[key])
        cls.CAPABILITIES = dataclasses.replace(base, **found)  # type: ignore[attr-defined]


class TierWorker(abc.ABC):
    """The place one actor runs, as the runtime sees it.

    Lifecycle: built (nothing runs), `start()` (the actor runs and may take messages),
    `stop(timeout)` (the actor is asked to finish what it was given; after `timeout`
    seconds it is stopped by force where the tier can), then `drain_replies()` and
    `take_undelivered()` hand back everything the tier still holds.

    Capabilities: ``CAPABILITIES``, one frozen `Capabilities` (read its docstring): what
    the tier supports beyond the required methods. The default states nothing optional (a
    plain function as actor, no restart, no pool, a fixed room, loop edges only).
    """

    CAPABILITIES: ClassVar[Capabilities] = Capabilities()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fold_legacy_capabilities(cls)

    # -- limits -----------------------------------------------------------------------------

    @property
    def max_message_bytes(self) -> int | None:
        """The largest encoded message the tier can carry, or None when unbounded.

        The runtime refuses a larger message in `send`, at once.
        """
        return None

    def encode_checked(self, msg: Any, keep: bool = False) -> bytes | None:
        """The bytes ``msg`` goes as, checked as `offer` checks it (its type, its size
        against `max_message_bytes`) and not handed over: how the runtime refuses, in
        ``send`` itself, a message the tier encodes to measure. With ``keep``, the next
        `offer` of this very object writes these bytes instead of encoding it again (see
        `keep_encoded`).

        Returns:
            None (the default): the tier does not encode at the edge (the runtime measures
            a message's ``serialize()`` against `max_message_bytes` itself).

        Raises:
            TypeValidationError: ``msg`` is not the type the tier was built for.
            MessageSerializationError: it cannot be encoded, or encodes too large.
        """
        return None

    def keep_encoded(self, msg: Any, data: bytes | None) -> None:  # noqa: B027
        """Have the next `offer` of this very object write ``data`` (what it encodes to,
        measured by the runtime on the same thread just before), and forget it either way;
        None forgets it now. The default keeps nothing."""

    @property
    @abc.abstractmethod
    def pending_input(self) -> int:
        """Messages handed over by `offer` and not yet taken by the actor."""

    # -- lifecycle -------------------------------------------------------------------------

    @abc.abstractmethod
    def start(self) -> None:
        """Start the place the actor runs; blocking (the runtime calls it in a thread).

        Raises:
            KernelFailedError: the actor could not start (the reason chained).
        """

    @abc.abstractmethod
    def stop(self, timeout: float) -> bool:
        """Stop the actor; blocking. True when it finished by itself within `timeout`.

        Replies it produced stay available to `poll_reply`/`drain_replies`; messages it
        never finished go to `take_undelivered`.
        """

    # -- messages in -----------------------------------------------------------------------

    @abc.abstractmethod
    def offer(self, msg: Any) -> bool:
        """Hand `msg` to the actor without waiting; False when the tier's side is full.

        A tier is built with room for `bridge_queue_size` messages its actor has not taken
        (`HostedKernel._make_worker(bridge)`, or later `set_room`): beyond that `offer`
        returns False, so the runtime's banded inbox, not the tier's backlog, decides what
        the actor gets next.

        Raises:
            KernelFailedError: the actor failed (the runtime reports it).
            KernelStateError: the actor stopped (or its function returned by itself).
        """

    def offer_many(self, msgs: list[Any]) -> int:
        """Hand over the longest prefix of `msgs` the tier takes now, without waiting;
        returns its length (0: full). A tier overrides it to take a batch at once. The
        bridge's batches come in priority order, as its banded inbox serves them.

        Raises:
            As `offer`, and only when none of `msgs` was handed over (an error after the
            first stops the prefix there: the caller offers the rest one by one).
        """
        n = 0
        for msg in msgs:
            try:
                if not self.offer(msg):
                    break
            except Exception:
                if n:
                    break
                raise
            n += 1
        return n

    def set_room(self, n: int) -> bool:
        """Let the actor hold up to `n` (>= 1) messages it has not taken, from the next
        `offer` on (what it holds beyond a smaller `n` stays; offers wait for it to drain).

        Returns False, changing nothing, when the tier's room is fixed once built (the
        default) or cannot hold `n`. A tier that can returns True, and the runtime then
        sizes the bridge to the actor's measured speed (`HostedKernel`).
        """
        return False

    @abc.abstractmethod
    def on_writable(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from any thread) when room frees up after `offer` said False."""

    # -- messages out ----------------------------------------------------------------------

    @abc.abstractmethod
    def poll_reply(self) -> Any:
        """The next reply, or None when none is ready; never waits.

        Replies come in the order the actor produced them, and stay readable after the
        actor stopped or failed.

        Raises:
            MessageRejectedError: the tier could not decode one message it was given; the
                actor keeps running (the runtime counts it as dropped and tells its caller).
            MessageDeserializationError: one reply does not decode on the runtime's side
                (`ReplyDecodeError`, carrying the id of the request it answers); it is
                consumed and the actor keeps running (the runtime counts it as dropped
                and tells its caller).
            KernelFailedError: the actor failed and every earlier reply was polled.
            KernelStateError: the actor stopped and every reply was polled; before any
                `stop`, this means its function returned by itself, and the runtime ends
                the kernel.
        """

    def poll_replies(self, max_count: int) -> list[Any]:
        """Up to `max_count` replies, oldest first, never waiting (`[]`: none ready).

        Raises:
            As `poll_reply`, and only when no reply precedes the error. The default takes
            one reply; a tier overrides it to take a batch at once.
        """
        reply = self.poll_reply()
        return [] if reply is None else [reply]

    def reply_within(self, budget_s: float) -> Any:
        """With ``CAPABILITIES.inline_request``: poll for the next reply for up to ``budget_s``
        seconds, holding the calling thread (the event loop, while a caller waits for a
        reply), and return it; None when none came within ``budget_s`` (or when another
        thread is reading replies: it gets them). The runtime passes each call's budget,
        never more than what is left of its caller's timeout.

        It raises what `poll_reply` raises. A tier that mutes its wake-ups while it polls
        must restore them, and announce any reply found behind the one it returns, before
        it returns: no wake-up is lost. The default returns None at once (the runtime calls
        it only with the capability).
        """
        return None

    @abc.abstractmethod
    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` (from any thread) when a reply may be ready; returns an undo."""

    @abc.abstractmethod
    def drain_replies(self) -> list[Any]:
        """Every reply readable now, oldest first, without waiting or raising.

        A message the tier rejected appears as its `MessageRejectedError`.
        """

    def watch(self, loop: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Have the event loop `loop` itself call `callback` when a reply may be ready
        (watching descriptors, say: one thread hop fewer than `on_readable`); returns an
        undo, or None when the tier cannot (the runtime then uses `on_readable`)."""
        return None

    @property
    def is_idle(self) -> bool:
        """True when the actor holds no message and waits for the next; False when unsure."""
        return False

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        """How long the actor spent on each message it finished since the last call, as
        ``(count, total_ns, min_ns, max_ns, [(bucket, count), ...])`` (the form of
        `telemetry.LatencyRecorder.drain`), or None: nothing new, or the tier does not time
        its actor. The runtime folds it into the kernel's telemetry when that is read."""
        return None

    def trace_wire(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """Carry trace context to this tier's actor (a tracing runtime calls it once,
        before `start`), across its wire or, in-process, beside the message: each message
        goes with the context ``header(msg)`` gives, as
        ``(trace_id, span_id, trace_flags)`` (None: none), and each reply that arrives
        with a context is reported as ``received(reply, trace_id, span_id, trace_flags)``
        before it is returned.

        Returns:
            False (the default) when the tier does not carry it (its actor then handles
            messages outside their traces).
        """
        return False

    def hand_replies_to_callers(
        self, waiters: Mapping[Any, Any], deliver: Callable[[Any, Any], None]
    ) -> bool:
        """Let the actor hand a reply that answers a waiting ``send_and_receive`` caller
        straight to ``deliver`` instead of queueing it for `poll_replies`: before the
        actor starts, the bridge passes the registrations of its callers (``waiters``,
        read-only: keys are `message.reply_key` values, present while a caller's
        registration is) and ``deliver(reply, key)``, callable from any thread, which
        takes the reply (and the key it was found under) to the loop and delivers it
        there (or counts it, as a polled reply would be).
        When ``deliver`` raises, the reply goes the usual way. A reply routed into a direct
        edge never goes this way. Returns whether the tier does; the default is False
        (every reply is polled), so tiers need not implement it."""
        return False

    def on_late_reply(self, callback: Callable[[], None]) -> None:  # noqa: B027
        """Call `callback` when the actor replies after `stop` returned (a thread that could
        not be interrupted finishing its message). Tiers whose actor cannot outlive `stop`
        need not implement it."""

    # -- direct edges (see `edges.py`) -------------------------------------------------------

    def open_edge(self, kind: str, source_id: str) -> Any:
        """Make a direct edge of ``kind`` (one of ``CAPABILITIES.edges_in``) into this
        actor, from the kernel ``source_id``, and read it from now on beside the runtime's
        inbox, fairly and by priority. Its bound and backpressure policy are this kernel's.
        The edge
        must offer ``counters()`` (see `edges.EdgeInfo`), readable from any thread.
        What it holds when this actor stops is handed back by `take_undelivered`.

        Raises:
            InvalidConfigurationError: the tier does not consume from ``kind``.
        """
        raise InvalidConfigurationError(
            f"kernel {source_id!r}: a {kind!r} edge cannot go into a {type(self).__name__}"
        )

    def route_into(self, edge: Any) -> None:
        """Send what the actor sends into ``edge`` (made by the consumer's `open_edge`)
        instead of the reply side; None routes it back. A send the edge cannot take (its
        consumer stopped) takes the reply side, and so the loop path, instead.

        Raises:
            InvalidConfigurationError: the tier does not produce into the edge's kind.
        """
        raise InvalidConfigurationError(
            f"a {type(self).__name__} cannot send into a direct edge ({edge!r})"
        )

    def edge_fit(self, kind: str, consumer: TierWorker) -> str:
        """Refine a direct edge of ``kind`` from this actor into ``consumer``'s (both
        ends offer it): "" (the default) accepts it, a reason keeps the loop path (a GPU
        kernel on another device, say).

        Raises:
            TypeValidationError: the pair cannot be connected at all (a ``device-ring``
                edge between records of different classes).
        """
        return ""

    @property
    def edge_replicas(self) -> int:
        """How many replica edges a direct edge with this end is made of: a pool's
        replica count (`pool_edges.py`), 0 (the default) for one actor."""
        return 0

    def pause_edges(self, paused: bool) -> None:  # noqa: B027
        """Stop (``paused``) or resume taking messages from the direct edges into this
        actor: the kernel is deactivated, and its actor must take nothing more from them
        (as the bridge holds back its inbox); what they hold waits there. Tiers without
        edges need not implement it."""

    def share_edge_bound(self, replicas: int) -> None:  # noqa: B027
        """This actor is one of ``replicas`` of a pool: each direct edge into it holds
        its share of the kernel's bound (rounded up), as the pool's bridge shares its
        slots. Tiers without edges into them need not implement it."""

    # -- what is left ----------------------------------------------------------------------

    @abc.abstractmethod
    def take_undelivered(self) -> list[Any]:
        """After `stop` (or a failure): the messages the actor did not finish, each once.

        The one in the actor's hands when it was stopped by force or raised comes first,
        then those it never took, in the order they were offered. Every later call returns
        `[]`.
        """

    @property
    @abc.abstractmethod
    def failure(self) -> BaseException | None:
        """Why the actor failed (its exception, or the death of its process), or None."""

    @property
    def failed_on(self) -> Any:
        """After a failure, until `take_undelivered`: the message in the actor's hands
        when it failed (it raised on it, or its process died), or None (it held none, or
        the tier cannot tell). A tracing runtime marks that message's span failed."""
        return None


# -- the actor kind: the one check --------------------------------------------------------


def actor_kind(func: Any) -> ActorKind | None:
    """What kind of actor ``func`` is: ``"async"`` (a coroutine or async generator
    function), ``"sync"`` (a plain function or method), or None for another callable (a
    class instance with ``__call__``: judged on first use). ``functools.partial`` is seen
    through."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target):
        return "async"
    if inspect.isfunction(target) or inspect.ismethod(target):
        return "sync"
    return None


def check_actor_kind(
    kernel_id: str,
    tier: str,
    func: Any,
    kind: str | None,
    *,
    runs: str | None = None,
    advice: str | None = None,
) -> None:
    """Refuse, at launch, an actor of the kind tier ``tier`` does not run: the one
    actor-kind check of every tier (the runtime, the Ray tier and the standalone kernels
    call it).

    Args:
        kernel_id: The kernel, for the message.
        tier: The tier's name, for the message.
        func: The actor.
        kind: The tier's ``CAPABILITIES.actor_kind``: ``"async"``, ``"sync"``, or None
            (not checked).
        runs: What the tier runs, replacing "the {tier} tier runs ..." in the message.
        advice: What to do instead, replacing the default advice.

    Raises:
        TypeValidationError: ``func`` is async on a ``"sync"`` tier, or a plain function on
            an ``"async"`` tier (other callables pass, and fail on first use if wrong).
    """
    if kind is None or not callable(func):
        return
    found = actor_kind(func)
    if found is None or found == kind:
        return
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    name = getattr(target, "__qualname__", repr(target))
    if kind == "async":
        what = runs or f"the {tier} tier runs async functions (async def actor(ctx))"
        todo = "; make it async, or launch it with tier='thread' or tier='process'"
        found_as = "a plain function"
    else:
        what = runs or f"the {tier} tier runs plain functions"
        todo = "; make it a plain def, or launch it on the asyncio tier"
        found_as = "async"
    raise TypeValidationError(
        f"kernel {kernel_id!r}: {what}, but {name!r} is {found_as}"
        f"{todo if advice is None else advice}"
    )
