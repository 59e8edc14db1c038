"""The Ray tier's worker: the driver's side of one Ray actor, behind the tier contract.

`RayWorker` is the `TierWorker` of a Ray-tier kernel: the hosting bridge
(`pydotcompute.ring_kernels.hosted.HostedKernel`) keeps the runtime's policy on the driver
(the banded inbox with the user's bound and backpressure, correlation, accounting, ordered
shutdown) and hands this worker batches; the worker moves them to the Ray actor
(``host.KernelHost``) that runs the actor function, and brings its replies back.

Design notes:
- Everything asynchronous runs as tasks on the driver's event loop (awaiting Ray's object
  refs): no thread of its own. `offer` and `poll_reply` are called on that loop; `start`
  and `stop`, which the bridge runs in a worker thread, hand their coroutine to the loop
  and wait for it.
- Sends: what `offer` takes leaves in ``put`` calls of up to ``max_batch`` messages, up to
  `MAX_IN_FLIGHT` calls at once, numbered so that the actor admits them in order whichever
  arrives first. A message counts as taken by the actor (it leaves `pending_input`) once
  its call answered, that is once it is in the actor's inbox.
- The bridge's room is split: ``bridge_queue_size // 2`` (at least 1) is the actor's
  inbox, which blocks (the driver's inbox holds the user's policy), the rest the
  messages on their way. So the actor's side never holds more than the bridge, and an
  urgent message waits behind at most that many.
- Replies: one ``collect`` call stays parked in the actor and brings back up to
  ``prefetch`` replies at once, with what the driver's telemetry counts (restarts,
  errors, drops, requests the actor raised on) when anything happened. No more is
  fetched while ``prefetch`` replies wait on the driver: the actor's outbox bound then
  holds its actor back.
- Telemetry never blocks the loop: `drain_latencies` hands over what the last ``stats``
  call brought and starts the next one in the background.
- Faults: a ``watch`` call stays parked in the actor. Its answer says the actor function
  returned (with what it left) or failed; its failure (a Ray error) says the actor died.
  With ``restart="on_failure"`` Ray restarts the actor and the worker launches the kernel
  in it again, while `offer` says there is no room (the runtime's backpressure: senders
  and connected stages wait, they do not fail). What died with the actor is counted as
  dropped, reason ``actor_lost``: messages it had taken (from the driver or, over direct
  edges, from other actors) and not finished and replies it had made and not handed over,
  by the counts it last reported (at-most-once for those; a direct edge's producer counts
  the push that was on its way, see ``host.RemotePeer``, and waits for the restart;
  messages it finished after its last report are counted too, so the count errs high,
  never low).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ....exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    MessageRejectedError,
    ReplyDecodeError,
    TypeValidationError,
)
from ...config import RingKernelConfig
from ...message import deserialize_message
from ...states import KernelState
from ..contract import Capabilities, TierWorker
from .host import KernelHost, frame_ask, frame_id
from .session import RaySession, errors, ray_module, reason
from .wire import split_traced, traced_item, unpack_cause, unpack_error

__all__ = ("MAX_IN_FLIGHT", "RayActorLostError", "RayWorker")

logger = logging.getLogger("pydotcompute")

#: ``put`` calls on their way to one actor at once.
MAX_IN_FLIGHT = 4
_EXIT_S = 5.0  # how long an actor whose kernel ended may take to exit before it is killed
_SETTLE_S = 5.0  # how long a stop waits for calls still on their way

_HOST_CLASS: Any = None


def _host_class() -> Any:
    """``ray.remote(KernelHost)``, built once per process."""
    global _HOST_CLASS
    if _HOST_CLASS is None:
        _HOST_CLASS = ray_module().remote(KernelHost)
    return _HOST_CLASS


class RayActorLostError(RuntimeError):
    """A kernel's Ray actor died (its node was lost, its process crashed, or it was killed)
    and was not restarted; ``__cause__`` is Ray's error."""


class _Raise:
    """An error to raise from `RayWorker.poll_reply` in its place among the replies."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class RayWorker(TierWorker):
    """The place a Ray-tier kernel's actor runs, as the runtime sees it: one Ray actor.

    Args:
        kernel_id: The kernel's id.
        func: The actor function (shipped to Ray).
        input_type, output_type: The kernel's message classes (shipped to Ray).
        config: The config of the kernel inside the actor.
        options: Launch options for the kernel inside the actor.
        actor_opts: ``ActorClass.options(...)`` (placement, resources).
        session: The runtime's `RaySession`.
        room: Messages on their way to the actor at most (`pending_input`).
        on_events: Called on the loop with what the driver's telemetry counts (a dict:
            ``restarts``, ``errors``, ``drops``, ``failed``).
        tracing: The driver traces (the actor's runtime then reads trace context).
        edge_backpressure: The kernel's ``backpressure``, applied in the actor to what
            other actors push over direct edges (its inbox blocks for the driver).
    """

    #: The actor's kind is checked by the kernel, against the tier inside the Ray actor;
    #: the actor's runtime restarts its function and Ray the actor; one kernel is one Ray
    #: actor (no pools: launch several kernels); trace context crosses with each message
    #: (`trace_wire`); what the actor timed comes back with `drain_latencies`.
    CAPABILITIES = Capabilities(
        actor_kind=None, restart=True, replicas=False, trace_wire=True, telemetry_refresh=True
    )

    def __init__(
        self,
        kernel_id: str,
        func: Any,
        *,
        input_type: type | None,
        output_type: type | None,
        config: RingKernelConfig,
        options: dict[str, Any],
        actor_opts: dict[str, Any],
        session: RaySession,
        room: int,
        on_events: Callable[[dict[str, Any]], None],
        tracing: bool = False,
        edge_backpressure: str = "block",
    ) -> None:
        self.kernel_id = kernel_id
        self._func = func
        self._input_type = input_type
        self._output_type = output_type
        self._config = config
        self._options = options
        self.ray_options = actor_opts
        self.session = session
        self._room = max(1, room)
        self._on_events = on_events
        self._tracing = tracing
        self._edge_backpressure = edge_backpressure
        self.actor: Any = None
        self.actor_name = ""
        self.restarts = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        # messages in: (bytes, message) offered and not sent yet; calls on their way
        self._out: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._flying: dict[int, list[tuple[bytes, Any]]] = {}
        self._unacked = 0
        self._seq = 0
        self._refused: dict[int, list[Any]] = {}  # what a call's kernel did not take
        self._puts: set[asyncio.Task[None]] = set()
        # messages out
        self._replies: collections.deque[Any] = collections.deque()
        self._collect: asyncio.Task[None] | None = None
        self._more = asyncio.Event()  # the driver took replies: fetch again
        # faults and ending
        self._watch: asyncio.Task[None] | None = None
        self._restoring: asyncio.Task[None] | None = None
        self._stats: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._left: list[Any] = []  # what the actor handed back when its books closed
        self._returned = False  # its function returned by itself (and the books closed)
        self._started = False
        self._stopping = False
        self._stopped = False
        self._down = False  # this incarnation of the actor died
        self._released = False
        self._handed = False  # `take_undelivered` was called
        # what this incarnation was given, and what it last said it did (see the notes)
        self._acked = 0
        self._taken = 0
        self._pushed = 0  # messages other actors pushed into it, over direct edges
        self._made = 0
        self._fetched = 0
        self._fetched_total = 0
        self._unsure = 0  # calls that failed with the actor: their fate is unknown
        self._sender: str | None = None  # the actor's stand-in of its direct edge
        self._latency: tuple[int, int, int, int, list[tuple[int, int]]] | None = None
        # callbacks
        self._readable: Callable[[], None] | None = None
        self._writable: Callable[[], None] | None = None
        self._want_room = False
        # `trace_wire`: each message's context, and where a reply's is reported
        self._trace_header: Callable[[Any], tuple[int, int, int] | None] | None = None
        self._received: Callable[[Any, int, int, int], None] | None = None
        # a direct edge: (target id, its actor, how long to wait for it to restart)
        self._direct: tuple[str, Any, float] | None = None
        self._edge: asyncio.Task[None] | None = None  # the last change of it, on its way

    def __repr__(self) -> str:
        return f"<RayWorker {self.kernel_id!r} actor={self.actor_name!r}>"

    # -- launch (on the loop, before `start`) ----------------------------------------------

    async def create(self) -> None:
        """Create the Ray actor and launch the kernel in it (the kernel is LAUNCHED).

        Raises:
            InvalidConfigurationError: Ray refused the options, the function cannot be
                shipped, or the actor could not start (its module not importable there).
        """
        self._loop = asyncio.get_running_loop()
        session = self.session
        config = self._config
        name = session.actor_name(self.kernel_id)
        restartable = config.restart == "on_failure"
        settings = {
            "enable_telemetry": session.enable_telemetry,
            "max_batch": session.max_batch,
            "peer_limit": config.output_queue_size,
            "tracing": self._tracing,
            "edge_backpressure": self._edge_backpressure,
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
                    **self.ray_options,
                )
                .remote(
                    self.kernel_id,
                    self._func,
                    self._input_type,
                    self._output_type,
                    config,
                    self._options,
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
        self.actor = actor
        self.actor_name = name
        self._watch = self._task(self._run_watch(), "watch")

    def _task(self, coro: Any, what: str) -> asyncio.Task[Any]:
        assert self._loop is not None
        return self._loop.create_task(coro, name=f"pydotcompute:ray-{what}:{self.kernel_id}")

    def _on_loop(self, coro: Any) -> Any:
        """Run ``coro`` on the driver's loop from the bridge's worker thread; its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- the contract: limits and lifecycle -------------------------------------------------

    @property
    def pending_input(self) -> int:
        return self._unacked

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def start(self) -> None:
        self._on_loop(self._activate())

    async def _activate(self) -> None:
        if self._failure is not None:
            raise KernelFailedError(self.kernel_id, self._failure)
        try:
            _, err = await self.actor.activate.remote()
        except errors().actor as exc:
            raise KernelFailedError(self.kernel_id, self._lost_error(exc)) from exc
        if err is not None:
            raise unpack_error(err)
        self._started = True
        self._collect = self._task(self._run_collect(), "collect")
        self._kick()

    def stop(self, timeout: float) -> bool:
        result: bool = self._on_loop(self._stop(timeout))
        return result

    async def _stop(self, timeout: float) -> bool:
        """Terminate the kernel in the actor (graceful within ``timeout``), take what it
        left, and end the actor."""
        if self._stopped:
            return True
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        finished = True
        if self._restoring is not None:
            await asyncio.wait({self._restoring}, timeout=max(0.1, timeout))
        # what is on its way goes first (bounded: a full actor takes it only as it drains)
        while (self._out or self._flying) and not self._down and self._started:
            self._kick()
            if loop.time() >= deadline:
                break
            await asyncio.sleep(0.005)
        if self.actor is not None and not self._down and not self._released and not self._returned:
            try:
                value, err = await self.actor.terminate.remote(max(0.0, deadline - loop.time()))
            except errors().actor as exc:
                self._failure = self._failure or self._lost_error(exc)
                logger.error(
                    "kernel %r: its Ray actor died while terminating: %s", self.kernel_id, exc
                )
                finished = False
            else:
                if err is not None:
                    error = unpack_error(err)
                    if getattr(error, "state", None) is not KernelState.TERMINATED:
                        self._failure = self._failure or error
                else:
                    await self._take_handover(value)
        await self._settle(self._flying_tasks())
        await self.release()
        self._stopped = True
        return finished

    def _flying_tasks(self) -> list[asyncio.Task[Any]]:
        return [t for t in (self._collect, self._stats) if t is not None and not t.done()]

    async def _settle(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Wait (bounded) for the calls still on their way to answer."""
        tasks = tasks + list(self._puts)
        if tasks:
            await asyncio.wait(tasks, timeout=_SETTLE_S)

    async def _take_handover(self, value: Any) -> None:
        """What the actor handed over when the kernel's books closed: the messages it never
        finished, its last replies (after every reply fetched before), what its telemetry
        counted since the last report, its log lines."""
        left_b, rest_b, _state, (events, lines) = value
        collect = self._collect
        if collect is not None and not collect.done():
            await asyncio.wait({collect}, timeout=_SETTLE_S)
        self._left = [deserialize_message(b) for b in left_b]
        for data in rest_b:
            self._replies.append(self._decode(data))
        _replay(lines)
        if events:
            self._events(events)
        self._wake()

    async def release(self) -> None:
        """End the Ray actor (idempotent): it exits once the calls it answers are done
        (another actor's push refused at close must learn what was taken), or is killed
        after `_EXIT_S` seconds."""
        tasks = [
            t for t in (self._watch, self._restoring, self._collect, self._stats, self._edge) if t
        ]
        me = asyncio.current_task()
        for task in tasks:
            if not task.done() and task is not me:
                task.cancel()
        if tasks:
            await asyncio.wait([t for t in tasks if t is not me])
        if self._released or self.actor is None:
            return
        self._released = True
        actor = self.actor
        if not self._down:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_EXIT_S):
                    await actor.__ray_terminate__.remote()
        with contextlib.suppress(Exception):
            ray_module().kill(actor, no_restart=True)

    # -- messages in ------------------------------------------------------------------------

    def _encode(self, msg: Any) -> bytes:
        serialize = getattr(msg, "serialize", None)
        if serialize is None:
            raise TypeValidationError(
                f"kernel {self.kernel_id!r} runs in a Ray actor, so its messages cross as "
                f"MessagePack and must be @message objects; got {type(msg).__name__}"
            )
        data: bytes = serialize()
        header = self._trace_header
        if header is not None:  # (a tracing runtime: each message goes in its context)
            return traced_item(header(msg), data)
        return data

    def _closed(self) -> BaseException | None:
        if self._failure is not None and self._collect_done():
            return KernelFailedError(self.kernel_id, self._failure)
        if self._stopping or self._returned:
            return KernelStateError(self.kernel_id, KernelState.TERMINATED, "send to")
        return None

    def offer(self, msg: Any) -> bool:
        return self.offer_many([msg]) == 1

    def offer_many(self, msgs: list[Any]) -> int:
        if self._failure is not None or self._stopping or self._returned:
            err = self._closed()
            if err is not None:
                raise err
            return 0
        if self._restoring is not None or self._down:
            self._want_room = True
            return 0
        room = self._room - self._unacked
        if room <= 0:
            self._want_room = True
            return 0
        out = self._out
        encode = self._encode
        n = 0
        for msg in msgs[:room]:
            try:
                data = encode(msg)
            except Exception:
                if n:
                    break
                raise
            out.append((data, msg))
            n += 1
        self._unacked += n
        self._kick()
        return n

    def set_room(self, n: int) -> bool:
        return False  # fixed at launch: half of it is the actor's inbox (see the notes)

    def on_writable(self, callback: Callable[[], None]) -> None:
        self._writable = callback

    def _room_freed(self) -> None:
        if self._want_room and self._unacked < self._room and self._restoring is None:
            self._want_room = False
            if self._writable is not None:
                self._writable()

    def _kick(self) -> None:
        """Start ``put`` calls for what waits, up to `MAX_IN_FLIGHT` on their way (after a
        change of the direct edge, once the actor applied it)."""
        if not self._started or self._down or self._restoring is not None or self._released:
            return
        edge = self._edge
        if edge is not None and not edge.done():
            edge.add_done_callback(lambda _t: self._kick())
            return
        out = self._out
        most = self.session.max_batch
        while out and len(self._flying) < MAX_IN_FLIGHT:
            n = min(most, len(out))
            batch = [out.popleft() for _ in range(n)]
            self._seq += 1
            self._flying[self._seq] = batch
            task = self._task(self._put(self._seq, batch), "put")
            self._puts.add(task)
            task.add_done_callback(self._puts.discard)

    async def _put(self, seq: int, batch: list[tuple[bytes, Any]]) -> None:
        try:
            accepted, err, rejected, progress, events = await self.actor.put.remote(
                [data for data, _ in batch], seq
            )
        except errors().actor as exc:
            # its fate is unknown: counted with what died with the actor (at most once)
            self._flying.pop(seq, None)
            self._unacked -= len(batch)
            self._unsure += len(batch)
            self._actor_down(exc)
            return
        except asyncio.CancelledError:
            self._flying.pop(seq, None)
            self._unacked -= len(batch)
            self._refused[seq] = [msg for _, msg in batch]
            raise
        self._flying.pop(seq, None)
        self._unacked -= len(batch)
        self._acked += accepted - len(rejected or ())
        self._progress(progress)
        if events:
            self._events(events)
        for cid, text in rejected or ():
            self._replies.append(_Raise(MessageRejectedError(self.kernel_id, cid, text)))
        if rejected:
            self._wake()
        if accepted < len(batch):
            self._refused[seq] = [msg for _, msg in batch[accepted:]]
            if err is not None:
                error = unpack_error(err)
                if not isinstance(error, KernelStateError):
                    logger.warning("kernel %r refused messages: %s", self.kernel_id, error)
        self._kick()
        self._room_freed()

    @property
    def can_request(self) -> bool:
        """True when a request may go as one Ray call now (`request`): the actor runs and
        nothing waits on the driver to be sent before it."""
        return (
            self._started
            and not self._out
            and self._restoring is None
            and not self._down
            and not self._stopping
            and not self._returned
            and self._failure is None
            and self._unacked < self._room
        )

    async def request(self, msg: Any, timeout: float | None) -> Any:
        """``msg`` and its correlated reply in one Ray call, admitted in order after every
        batch sent before it; the reply (the kernel's `send_and_receive` fast path).

        Raises:
            What the actor answers (its refusal, `QueueTimeoutError` after ``timeout``,
            `KernelFailedError` for a request its actor raised on), or `KernelFailedError`
            when the actor died (the request counted as lost with it).
        """
        data = self._encode(msg)
        self._seq += 1
        seq = self._seq
        self._flying[seq] = [(data, msg)]
        self._unacked += 1
        ref = self.actor.ask.remote(frame_ask(data, seq, timeout))  # one argument: cheaper
        try:
            answer = await ref
        except errors().actor as exc:
            self._unsure += 1
            self._actor_down(exc)
            err = KernelFailedError(self.kernel_id, self._lost_error(exc))
            err.__cause__ = exc
            raise err from exc
        except asyncio.CancelledError:
            self._task(self._abandoned(ref), "abandoned")
            raise
        finally:
            self._flying.pop(seq, None)
            self._unacked -= 1
            self._room_freed()
        self._acked += 1
        if type(answer) is bytes:
            return deserialize_message(answer)
        if len(answer) == 3:  # the reply, with what the actor counted since its last report
            self._events(answer[2])
            return deserialize_message(answer[0])
        raise unpack_error(answer[1])

    async def _abandoned(self, ref: Any) -> None:
        """A request whose caller went away: its reply, when one comes, is counted lost."""
        with contextlib.suppress(Exception):
            if type(await ref) is bytes:
                self._on_events({"drops": {"reply_lost": 1}})

    # -- a direct edge (to another Ray kernel's actor) ---------------------------------------

    @property
    def replies_fetched(self) -> int:
        """Replies brought back from the actor to the driver so far (not those it handed
        to another actor directly)."""
        return self._fetched_total

    @property
    def direct_target(self) -> str | None:
        """The kernel this actor forwards into directly, or None."""
        return None if self._direct is None else self._direct[0]

    def forward_direct(
        self, target_id: str | None, handle: Any, *, restarted: bool = False
    ) -> None:
        """Have the actor hand what it sends to ``target_id``'s actor (``handle``) in
        batches, or (None) to its outbox again. Applied by the actor before the next
        batch this worker sends it (the call goes first; Ray keeps a caller's order to
        a threaded actor only for calls it admits in turn, so the batches wait for it).
        ``restarted``: Ray restarts the target's actor, so the actor waits for it (up to
        the session's ``restart_timeout``) when it dies, instead of giving up."""
        wait = self.session.restart_timeout if restarted else 0.0
        self._direct = None if target_id is None else (target_id, handle, wait)
        if self.actor is None or self._released:
            return
        call = (
            self.actor.disconnect.remote()
            if target_id is None
            else self.actor.connect.remote(target_id, handle, wait)
        )
        self._edge = self._task(self._apply_edge(call, self._edge), "connect")

    async def _apply_edge(self, call: Any, before: asyncio.Task[None] | None) -> None:
        if before is not None and not before.done():
            await asyncio.wait({before})
        try:
            _, err = await call
        except errors().actor:
            return  # the actor is gone: its restore applies `_direct`
        except Exception as exc:  # never silently: the edge would run through the driver
            logger.warning("kernel %r: the direct edge was not made: %s", self.kernel_id, exc)
            return
        if err is not None:
            logger.warning(
                "kernel %r: the direct edge was not made: %s", self.kernel_id, unpack_error(err)
            )

    # -- messages out -----------------------------------------------------------------------

    def _decode(self, data: bytes) -> Any:
        received = self._received
        try:
            if received is not None:  # a traced reply: its context goes on with it
                ids, data = split_traced(data)
                reply = deserialize_message(data)
                if ids is not None:
                    received(reply, *ids)
                return reply
            return deserialize_message(data)
        except Exception as exc:
            return _Raise(
                ReplyDecodeError(self.kernel_id, frame_id(data, "correlation_id"), str(exc))
            )

    async def _run_collect(self) -> None:
        """Keep one ``collect`` call parked in the actor; replies land in ``_replies``."""
        prefetch = self.session.prefetch
        collect = self.actor.collect
        replies = self._replies
        try:
            while True:
                while len(replies) >= prefetch:
                    self._more.clear()
                    await self._more.wait()
                try:
                    items, err, events, progress, closed = await collect.remote(prefetch, None)
                except errors().actor as exc:
                    self._actor_down(exc)
                    return
                if events:
                    self._events(events)
                self._progress(progress)
                if items:
                    self._fetched += len(items)
                    self._fetched_total += len(items)
                    decode = self._decode
                    replies.extend(decode(data) for data in items)
                if closed:
                    return  # its outbox is closed and drained: the watch says why
                if err is not None:  # a reply that cannot cross: the kernel fails on it
                    replies.append(_Raise(unpack_error(err)))
                if items or err is not None:
                    self._wake()
        finally:
            self._wake()

    def _collect_done(self) -> bool:
        collect = self._collect
        return collect is None or collect.done()

    def poll_reply(self) -> Any:
        replies = self._replies
        if replies:
            item = replies.popleft()
            if len(replies) < self.session.prefetch:
                self._more.set()
            if type(item) is _Raise:
                raise item.error
            return item
        if self._failure is not None and self._collect_done():
            raise KernelFailedError(self.kernel_id, self._failure)
        if self._returned:
            raise KernelStateError(
                self.kernel_id, KernelState.TERMINATED, "receive from", "its function returned"
            )
        if self._stopped:
            raise KernelStateError(self.kernel_id, KernelState.TERMINATED, "receive from")
        return None

    def poll_replies(self, max_count: int) -> list[Any]:
        replies = self._replies
        if not replies or type(replies[0]) is _Raise:
            reply = self.poll_reply()
            return [] if reply is None else [reply]
        out: list[Any] = []
        while replies and len(out) < max_count and type(replies[0]) is not _Raise:
            out.append(replies.popleft())
        if len(replies) < self.session.prefetch:
            self._more.set()
        return out

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._readable = callback

        def undo() -> None:
            self._readable = None

        return undo

    def watch(self, loop: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
        # replies land on this very loop: the callback runs there directly
        return self.on_readable(callback)

    def _wake(self) -> None:
        callback = self._readable
        if callback is not None:
            callback()

    def drain_replies(self) -> list[Any]:
        out = [item.error if type(item) is _Raise else item for item in self._replies]
        self._replies.clear()
        return out

    def take_undelivered(self) -> list[Any]:
        if self._handed:
            return []
        self._handed = True
        left, self._left = self._left, []
        for seq in sorted(self._refused):
            left += self._refused[seq]
        self._refused.clear()
        for batch in self._flying.values():  # (a stop that gave up on them)
            left += [msg for _, msg in batch]
        self._flying.clear()
        left += [msg for _, msg in self._out]
        self._out.clear()
        self._unacked = 0
        return left

    def trace_wire(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """Ship each message in the trace context ``header(msg)`` gives: the actor's
        runtime (told at launch that the driver traces) makes it current while the actor
        handles the message. Each reply comes back with the context the actor sent it in,
        reported through ``received``."""
        self._trace_header = header
        self._received = received
        return True

    # -- telemetry -------------------------------------------------------------------------

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        """What the last ``stats`` call brought; starts the next one (never waits)."""
        part, self._latency = self._latency, None
        if (
            self._stats is None
            and self.actor is not None  # launched is enough: a direct edge may drop into it
            and not self._stopping
            and not self._down
            and self._loop is not None
        ):
            self._stats = self._task(self._run_stats(), "stats")
        return part

    async def _run_stats(self) -> None:
        try:
            events, progress = await self.actor.stats.remote()
        except Exception:  # a dying actor: its watch reports it
            return
        finally:
            self._stats = None
        if events:
            self._events(events)
        self._progress(progress)

    def _events(self, events: dict[str, Any]) -> None:
        part = events.pop("latency", None)
        if part is not None:
            held = self._latency
            if held is None:
                self._latency = part
            else:  # two reports before the telemetry was read: add them
                n, total, lo, hi, pairs = held
                merged = dict(pairs)
                for b, c in part[4]:
                    merged[b] = merged.get(b, 0) + c
                self._latency = (
                    n + part[0],
                    total + part[1],
                    min(lo, part[2]),
                    max(hi, part[3]),
                    sorted(merged.items()),
                )
        if events:
            self._on_events(events)

    def _progress(self, progress: tuple[int, int, str | None, int]) -> None:
        """The actor's latest report (`host._KernelCore.progress`): one snapshot, kept
        whole (an older answer arriving late makes the loss count err high, never low)."""
        self._taken, self._made, self._sender, self._pushed = progress

    def _count_lost(self, n: int) -> None:
        if n > 0:
            self._on_events({"drops": {"actor_lost": n}})

    # -- faults ------------------------------------------------------------------------------

    async def _run_watch(self) -> None:
        """Wait in the actor until the kernel ends; notice the actor dying."""
        try:
            value, _ = await self.actor.watch.remote()
        except errors().actor as exc:
            if not self._stopping:
                self._actor_down(exc)
            return
        if not isinstance(value, tuple) or self._stopping:
            return
        state, cause, handover, lines = value
        _replay(lines)
        if state == "FAILED":
            self._failure = unpack_cause(cause) or RuntimeError("the actor failed")
            self._wake()
        elif state == "TERMINATED" and handover is not None:
            await self._take_handover(handover)
            self._returned = True
            self._wake()

    def _lost_error(self, exc: BaseException) -> RayActorLostError:
        err = RayActorLostError(
            f"its Ray actor died ({reason(exc)}); launch it again, or launch it with "
            "restart='on_failure' to let Ray restart it"
        )
        err.__cause__ = exc
        return err

    def _actor_down(self, exc: BaseException) -> None:
        """This incarnation of the actor died: count what it took with it, then restart it
        (``restart="on_failure"``, within its budget) or fail."""
        if self._down or self._released:
            return
        self._down = True
        self._task(
            self._count_dead(
                list(self._puts),
                self._acked + self._pushed - self._taken + max(0, self._made - self._fetched),
                self._acked - self._fetched,
                self._sender,
                self._direct,
            ),
            "loss",
        )
        cfg = self._config
        restartable = cfg.restart == "on_failure" and (
            cfg.max_restarts is None or self.restarts < cfg.max_restarts
        )
        if restartable and not self._stopping:
            logger.warning(
                "kernel %r: its Ray actor stopped (%s); waiting for Ray to restart it",
                self.kernel_id,
                reason(exc),
            )
            self._restoring = self._task(self._restore(exc), "restore")
            return
        self._fail(self._lost_error(exc))

    async def _count_dead(
        self,
        calls: list[asyncio.Task[None]],
        reported: int,
        unanswered: int,
        sender: str | None,
        direct: tuple[str, Any, float] | None,
    ) -> None:
        """Count, once, what died with an actor (reason ``actor_lost``): the messages it
        had taken and not finished and the replies it had not handed over, by its last
        report (``reported``), plus the calls that were on their way to it. Over a direct
        edge the target says exactly how many of the dead actor's messages it took, which
        bounds the count too: a message each answered once is then counted exactly."""
        if calls:  # the calls on their way to the dead actor fail too: their word first
            await asyncio.wait(calls, timeout=_SETTLE_S)
        unsure, self._unsure = self._unsure, 0
        lost = max(0, reported) + unsure
        if direct is not None and sender is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_SETTLE_S):
                    took = await direct[1].taken_from.remote(sender)
                lost = min(lost, max(0, unanswered + unsure - took))
        if lost:
            self._count_lost(lost)
            logger.warning(
                "kernel %r: %d message(s) or replies were lost with its Ray actor (counted "
                "as dropped, reason actor_lost)",
                self.kernel_id,
                lost,
            )

    def _fail(self, err: BaseException) -> None:
        if self._failure is None:
            self._failure = err
            if not self._started:  # no bridge polls it yet: the kernel hears it this way
                self._on_events({"failed_before_start": err})
        if self._collect is not None and not self._collect.done():
            self._collect.cancel()
        self._wake()
        self._want_room = True
        if self._writable is not None:  # a pump waiting for room learns of the end
            self._writable()

    async def _restore(self, cause: BaseException) -> None:
        """Wait for Ray to restart the actor, launch the kernel there, resume.

        Ray refuses calls while the actor is restarting (``ActorUnavailableError``), so
        the call is retried until ``restart_timeout`` seconds have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.session.restart_timeout
        delay = 0.05
        state = "ACTIVE" if self._started else "LAUNCHED"
        for task in (self._collect, self._watch):
            if task is not None and not task.done():
                task.cancel()
        while True:
            try:
                # the batches lost with it will never come: the next is admitted at once
                value, err = await self.actor.restore.remote(state, self._direct, {-1: self._seq})
                break
            except errors().unavailable as exc:
                if loop.time() >= deadline:
                    self._restoring = None
                    self._fail(self._lost_error(exc))
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except errors().actor as exc:
                self._restoring = None
                self._fail(self._lost_error(exc))
                return
        self._restoring = None
        if err is not None:
            self._fail(unpack_error(err))
            return
        if value == "restored":
            self.restarts += 1
            self._on_events({"restarts": 1, "errors": (1, f"{type(cause).__name__}: {cause}")})
            logger.warning("kernel %r: Ray restarted its actor", self.kernel_id)
        self._down = False
        self._acked = self._taken = self._made = self._fetched = self._pushed = 0
        if self._stopping:
            return
        self._watch = self._task(self._run_watch(), "watch")
        if self._started:
            self._collect = self._task(self._run_collect(), "collect")
        self._kick()
        self._room_freed()


def _replay(lines: list[tuple[int, str]] | None) -> None:
    """Write the actor's log lines (its warnings and errors) into this process's log."""
    for level, text in lines or ():
        logger.log(level, "%s", text)
