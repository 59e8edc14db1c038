"""The driver's side of one ring kernel in a Ray actor: batching, prefetching, faults.

Design notes:
- Outbound, messages are encoded at once (so a bad message fails in the caller) and
  appended to the open batch; a single pump task per kernel sends one batch per Ray call,
  one call in flight at a time. Whatever is sent while a call flies joins the next batch,
  so concurrent senders share calls without any timer, and the order of messages is the
  order of ``send`` calls (Ray does not promise an order for calls to threaded actors).
- Each batch carries a future that its senders wait on: the actor answers how many it
  accepted, so each sender learns whether its own message got in.
- Inbound, one fetch task per kernel brings back everything the outbox holds (up to
  ``prefetch``); receivers are served from the driver-side buffer. A fetch is never
  cancelled because a receiver gave up: what it brings back is kept for the next receive.
- Faults: a ``watch`` call stays parked in the actor. When the actor dies, that call and
  every other call in flight fail; ``_lost`` then either waits for Ray to restart the
  actor (``restart="on_failure"``, Ray's ``max_restarts``) and relaunches the kernel in it
  (``_restore``), or marks the kernel FAILED with the Ray error as its cause. Either way the
  caller gets an error at once instead of waiting on a dead actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from ..decorators.validators import check_message
from ..exceptions import (
    KernelFailedError,
    KernelStateError,
    QueueTimeoutError,
    TypeValidationError,
)
from ..ring_kernels.config import RingKernelConfig
from ..ring_kernels.message import RingKernelMessage, deserialize_message
from ..ring_kernels.states import KernelState
from ..ring_kernels.telemetry import RingKernelTelemetry
from ._support import errors, reason
from ._wire import unpack_cause, unpack_error

if TYPE_CHECKING:
    from .driver import RayDriver

__all__ = ("RayKernel",)

logger = logging.getLogger("pydotcompute")

_RUNNING = (KernelState.LAUNCHED, KernelState.ACTIVE, KernelState.DEACTIVATED)
_ENDED = (KernelState.TERMINATED, KernelState.FAILED)


def _min_timeout(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


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


class RayKernel:
    """The driver's handle on a ring kernel that runs in a Ray actor.

    Attributes:
        kernel_id: The kernel's id.
        actor: The Ray actor handle (``ray.kill(kernel.actor)`` simulates a lost node).
        actor_name: The Ray actor's name (unique per runtime).
        config: The `RingKernelConfig` the kernel was launched with.
        error: Why the kernel FAILED (the actor's exception, or the Ray error when the
            actor died).
        undelivered: Messages that were sent but never processed (left in the inbox at
            terminate, or refused on their way).
        restarts: How many times Ray restarted the actor.
        telemetry: The last snapshot fetched with ``runtime.refresh_telemetry(id)``, plus
            the driver's own counts of refused messages, errors and restarts.
    """

    def __init__(
        self,
        kernel_id: str,
        actor: Any,
        name: str,
        config: RingKernelConfig,
        input_type: type | None,
        output_type: type | None,
        ray_options: dict[str, Any],
        runtime: RayDriver,
    ) -> None:
        self._rt = runtime
        self.kernel_id = kernel_id
        self.actor = actor
        self.actor_name = name
        self.config = config
        self.input_type = input_type
        self.output_type = output_type
        self.ray_options = ray_options
        self.error: BaseException | None = None
        self.undelivered: list[Any] = []
        self.restarts = 0
        self.telemetry = RingKernelTelemetry(kernel_id)
        self._state = KernelState.CREATED
        self._push = actor.push
        self._request = actor.request
        self._fetch_method = actor.fetch
        # outbound
        self._batches: deque[_Batch] = deque()
        self._queued = 0
        self._pump: asyncio.Task[None] | None = None
        self._async_error: BaseException | None = None
        # inbound
        self._replies: deque[Any] = deque()
        self._fetch: asyncio.Task[None] | None = None
        self._fetch_error: BaseException | None = None
        self._end_error: BaseException | None = None
        # control
        self._watch: asyncio.Task[None] | None = None
        self._restoring: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._setup: asyncio.Task[None] | None = None
        self._forward_to: str | None = None
        self._dead = False
        self._released = False

    @property
    def state(self) -> KernelState:
        return self._state

    @property
    def is_active(self) -> bool:
        return self._state is KernelState.ACTIVE

    @property
    def pending(self) -> int:
        """Messages sent from the driver and not yet acknowledged by the actor."""
        return self._queued

    @property
    def buffered(self) -> int:
        """Replies already fetched to the driver and not yet received."""
        return len(self._replies)

    def drop_buffered(self) -> int:
        """Drop the replies fetched to the driver and not yet received; how many."""
        n = len(self._replies)
        self._replies.clear()
        return n

    def __repr__(self) -> str:
        return f"<RayKernel {self.kernel_id!r} {self._state.name} actor={self.actor_name!r}>"

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

    # -- outbound -------------------------------------------------------------------

    def _encode(self, msg: Any) -> bytes:
        state = self._state
        if state is not KernelState.ACTIVE and state not in _RUNNING:
            raise self._refuse("send to")
        in_t = self.input_type
        if in_t is not None and type(msg) is not in_t and not isinstance(msg, in_t):
            check_message(msg, in_t, self.kernel_id, "expects")
        if not isinstance(msg, RingKernelMessage):
            raise TypeValidationError(
                f"kernel {self.kernel_id!r} runs in a Ray actor, so its messages cross as "
                f"MessagePack and must be @message objects; got {type(msg).__name__}"
            )
        return msg.serialize()

    def _enqueue(
        self, datas: list[bytes], timeout: float | None, waited: bool
    ) -> list[tuple[_Batch, int]]:
        """Append encoded messages to the kernel's outgoing batches; start the pump."""
        parts: list[tuple[_Batch, int]] = []
        batches = self._batches
        max_batch = self._rt.max_batch
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
        self._queued += n
        if self._pump is None:
            assert self._rt._loop is not None
            self._pump = self._rt._loop.create_task(self._run_pump())
        return parts

    async def _run_pump(self) -> None:
        """Push the kernel's batches one Ray call at a time (the order is kept)."""
        batches = self._batches
        try:
            while batches:
                if self._restoring is not None:
                    await asyncio.wait({self._restoring})
                b = batches[0]
                b.sent = True
                err: BaseException | None
                try:
                    if b.timeout is None:
                        answer = await self._push.remote(b.items)
                    else:
                        answer = await self._push.remote(b.items, b.timeout)
                    if type(answer) is int:
                        accepted, err = answer, None
                    else:
                        accepted, err = answer[0], unpack_error(answer[1])
                except errors().actor as exc:
                    accepted, err = 0, self._lost(exc, "send to")
                except Exception as exc:
                    accepted, err = 0, exc
                batches.popleft()
                self._queued -= len(b.items)
                b.accepted = accepted
                b.error = err
                if accepted < len(b.items):
                    unwaited = sum(1 for i in b.nowait if i >= accepted)
                    self._refused(b.items[accepted:], err, unwaited)
                    if b.unwaited and self._async_error is None:
                        self._async_error = err
                if b.done is not None and not b.done.done():
                    b.done.set_result(None)
        finally:
            self._pump = None

    def _refused(self, items: list[bytes], err: BaseException | None, unwaited: int) -> None:
        """Keep refused messages in `undelivered`; count as dropped those whose sender
        was not told (`send_nowait`): a send that raised accepted nothing."""
        msgs: list[Any] = []
        for data in items:
            try:
                msgs.append(deserialize_message(data))
            except Exception:
                msgs.append(data)
        self.undelivered.extend(msgs)
        if unwaited:
            self.telemetry.record_drop(unwaited)
        logger.warning(
            "kernel %r refused %d message(s): %s (kept in kernel.undelivered)",
            self.kernel_id,
            len(msgs),
            err,
        )

    async def _wait_parts(self, parts: list[tuple[_Batch, int]]) -> None:
        for b, end in parts:
            if b.accepted is None:
                if b.done is None:
                    assert self._rt._loop is not None
                    b.done = self._rt._loop.create_future()
                await asyncio.shield(b.done)
            if b.accepted is not None and b.accepted < end:
                assert b.error is not None
                raise b.error

    def _raise_async_error(self) -> None:
        err = self._async_error
        if err is not None:
            self._async_error = None
            raise err

    async def _room(self, timeout: float | None) -> None:
        """Driver-side backpressure: wait while ``input_queue_size`` messages are in flight."""
        limit = self.config.input_queue_size
        if self._queued < limit:
            return
        assert self._rt._loop is not None
        deadline = None if timeout is None else self._rt._loop.time() + timeout
        while self._queued >= limit and self._batches:
            head = self._batches[0]
            if head.done is None:
                head.done = self._rt._loop.create_future()
            remaining = None if deadline is None else deadline - self._rt._loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueTimeoutError(
                    f"timed out after {timeout}s: {self._queued} messages to kernel "
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
        if self._batches:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._wait_parts([(self._batches[-1], 0)]), timeout)
        self._async_error = None

    # -- messaging: receives -------------------------------------------------------------

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
            and self._rt._loop is not None
        ):
            self._fetch = self._rt._loop.create_task(
                self._fetch_replies(self._rt.prefetch, None, background=True)
            )

    async def _fetch_replies(self, n: int, wait: float | None, *, background: bool = False) -> None:
        """One ``fetch`` call: replies go to the buffer, a terminal error to ``_end_error``.

        A transient error (a reply that cannot be encoded, a restarting actor) is kept for
        the next receiver, unless nobody asked for this fetch (``background``).
        """
        try:
            answer = await (
                self._fetch_method.remote(n) if wait is None else self._fetch_method.remote(n, wait)
            )
            items, packed = (answer, None) if type(answer) is list else answer
            if items:
                self._replies.extend(deserialize_message(b) for b in items)
            if packed is not None:
                err = unpack_error(packed)
                if isinstance(err, KernelStateError):
                    self._end_error = err  # closed and drained: terminated or failed
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
        """Return once ``self._replies`` is non-empty; raise the kernel's end or a timeout."""
        loop = self._rt._loop
        assert loop is not None
        deadline = None if timeout is None else loop.time() + timeout
        while not self._replies:
            if self._fetch_error is not None:
                err, self._fetch_error = self._fetch_error, None
                raise err
            waiting: asyncio.Future[Any] | None = self._stopping or self._restoring
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
                        self._fetch_replies(max(n, self._rt.prefetch), wait)
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

    # -- faults -------------------------------------------------------------------------

    def _start_watch(self) -> None:
        assert self._rt._loop is not None
        self._watch = self._rt._loop.create_task(
            self._watch_actor(), name=f"pydotcompute:ray-watch:{self.kernel_id}"
        )

    async def _watch_actor(self) -> None:
        """Wait in the actor until the kernel ends; notice the actor dying."""
        try:
            value, _ = await self.actor.watch.remote()
        except errors().actor as exc:
            if self._stopping is None and self._state is not KernelState.TERMINATED:
                self._lost(exc, "use")
            return
        if self._stopping is not None or self._state in _ENDED:
            return
        if not isinstance(value, tuple):
            return
        state, cause = value
        if state == "FAILED":
            self._mark_failed(unpack_cause(cause), dead=False)
        elif state == "TERMINATED":
            self._state = KernelState.TERMINATED  # its actor function returned on its own

    def _lost(self, exc: BaseException, operation: str) -> BaseException:
        """The actor behind ``k`` is gone: restart it or mark FAILED; the caller's error."""
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
                assert self._rt._loop is not None
                self._restoring = self._rt._loop.create_task(self._restore(exc))
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

    def _mark_failed(self, cause: BaseException | None, *, dead: bool) -> None:
        if self._state is KernelState.FAILED:
            return
        self._state = KernelState.FAILED
        self._dead = self._dead or dead
        self.error = cause
        self.telemetry.record_error(cause or "failed")
        self._rt._failures.append((self.kernel_id, cause))
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
        else:
            logger.error("kernel %r failed: %r", self.kernel_id, cause)

    async def _restore(self, cause: BaseException) -> None:
        """Wait for Ray to restart the actor, relaunch the kernel there, resume its state.

        Ray refuses calls while the actor is restarting (``ActorUnavailableError``), so the
        restore call is retried until ``restart_timeout`` seconds have passed.
        """
        assert self._rt._loop is not None
        deadline = self._rt._loop.time() + self._rt.restart_timeout
        delay = 0.05
        try:
            while True:
                forward = None
                if self._forward_to is not None and self._forward_to in self._rt._kernels:
                    forward = (self._forward_to, self._rt._kernels[self._forward_to].actor)
                try:
                    value, err = await self.actor.restore.remote(self._state.name, forward)
                    break
                except errors().unavailable as exc:
                    if self._rt._loop.time() >= deadline:
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


def _limit(max_restarts: int | None) -> str:
    return "no limit" if max_restarts is None else str(max_restarts)
