"""The inside of a Ray actor that hosts one ring kernel.

Each ring kernel placed on a Ray cluster lives in its own Ray actor (`KernelHost`),
which runs an ordinary tier-1 `RingKernelRuntime` on an event loop of its own, in a
thread of the actor process. The driver's side (`RayTierKernel`, ``kernel.py``)
calls the methods below; Ray runs them on the actor's thread pool (a threaded actor, so a
long-poll ``fetch`` or ``watch`` never blocks a ``push``) and each hands its work to the
kernel's loop.

Design notes:
- Batches, not messages, cross the network: ``push`` takes a list of MessagePack byte
  strings, ``fetch`` returns up to ``n`` replies at once. One Ray call costs about a
  millisecond here, decoding a message about a microsecond.
- Kernel-to-kernel traffic goes actor to actor. ``connect`` installs a `RemotePeer`
  as the tier-1 kernel's forward target, and ``ctx.send_to(other_id, ...)`` resolves other
  kernels of the same runtime by their Ray actor name. A peer coalesces whatever the actor
  sends while the previous batch is in flight into the next ``push`` (one call in flight
  per peer keeps the order), and pushes back on the actor once ``limit`` messages wait.
- A peer is a bridge: a message handed to it counts as sent. One the target refuses (a
  full ``reject`` inbox: only that one, the rest of the batch is tried) or can never reach
  is counted by the forwarding kernel as a lost reply, in this actor. When the kernel's
  books close, what still waits in a peer is counted too and the push on its way is
  withdrawn (``withdraw``): the target answers how many it took, so each message ends
  exactly once, taken downstream or counted here, even while the target is full.
- The actor's inbox blocks (the driver's batches wait there: its own inbox holds the
  user's policy), so what another actor pushes over a direct edge meets the user's
  ``backpressure`` in ``_push`` (``settings["edge_backpressure"]``), exactly as on the
  loop path: ``reject`` refuses the message when the inbox is full (the forwarding
  kernel counts it, reason ``reply_lost``), ``drop_oldest`` evicts the inbox's oldest
  (counted here, reason ``backpressure``).
- A target that Ray restarts (``restart="on_failure"``: the peer is told how long to wait,
  ``restart_wait``) is waited for, not given up on: the peer stops pushing, its bound
  holds the forwarding kernel back (backpressure), and it resumes once the target's
  kernel is launched again. The batch on its way when the target died has an unknown
  fate (Ray does not say how much of it the dead actor took): it is counted here as
  lost, reason ``actor_lost``, never pushed twice (at most once for it); the target's
  driver counts what its last report said waited in its inbox. Pushes to such a target
  carry at most `RESTART_BATCH` messages, which bounds how far the two counts can be off
  (the part of the batch the target finished before dying is counted too). A push on its
  way to an actor that Ray restarts does not always fail (seen: never answered), so a
  push that takes long asks the target for its incarnation (`KernelHost.alive`, one id
  per actor process): a new one means the push died with the old.
- The package's warnings and errors in this process (a restart, a failure, a drop) go to
  the driver's log: `_LogLines` keeps them and the telemetry, watch and terminate answers
  carry them over.
- Every method answers a value or ``(value, packed_error)`` (see ``_wire``): expected
  failures are data, so the driver can rebuild the exact pydotcompute error (``wire.py``). The hot
  methods (``push``, ``request``, ``fetch``) answer a bare value on success: a tuple costs
  Ray more to carry than bytes, an int or a list. For the same reason the driver's
  ``send_and_receive`` calls `KernelHost.ask`, its turn and timeout framed in front of the
  request's bytes: each argument of a Ray call costs (four cost about 100 us more than one
  here, an eighth of the call).
- One file for the whole actor side (peer stand-ins, the in-actor runtime, the loop-side
  core and the Ray-facing class), which is why it runs past 600 lines: the pieces only
  make sense together and nothing else imports them.
- Trace context (the driver's runtime traces): the actor's runtime traces too, and each
  item pushed or requested may carry the context it was sent in (``wire.traced_item``):
  the item's message is then carried in it, so the actor's ``process`` span hangs under
  the driver's ``send`` and is the current span while the actor handles the message
  (spans go to this process's tracer provider: configure one here, e.g. when the actor's
  module is imported). What the actor forwards to another actor carries its ``send``
  span's context the same way. An untraced host decodes with ``deserialize_message``
  itself, as before.
- Nothing here imports Ray at module level (the package must import without Ray); the Ray
  API is reached through ``importlib`` on the rare paths that need it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import itertools
import logging
import struct
import threading
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ....exceptions import (
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    MessageDeserializationError,
    PyDotComputeError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from ..._loop import create_optimized_loop
from ...kernel import RingKernel
from ...message import RingKernelMessage, deserialize_message, request_key
from ...runtime import RingKernelRuntime
from ...states import KernelState
from ...supervision import BurstLog
from .session import actor_name, errors, ray_module
from .wire import PackedError, pack_cause, pack_error, split_traced, traced_item, unpack_error

if TYPE_CHECKING:
    from ...config import RingKernelConfig

__all__ = ("KernelHost", "RemotePeer", "frame_ask", "frame_id")

logger = logging.getLogger("pydotcompute")

Answer = tuple[Any, PackedError | None]
_TURN_S = 30.0  # the longest a driver's call waits for an earlier one that never arrives
_ALIVE_S = 1.0  # a push to a target that Ray restarts: how often to ask if it is the same
#: The largest push to a target that Ray restarts: bounds the error of the loss count.
RESTART_BATCH = 64
_T = TypeVar("_T")


def _register_message_type(cls: type | None) -> None:
    """Make sure ``deserialize_message`` knows ``cls`` in this worker.

    Classes imported by reference registered themselves when their module was imported;
    classes Ray shipped by value (defined in ``__main__``) did not run ``@message`` here.
    """
    if cls is None or not isinstance(cls, type) or not issubclass(cls, RingKernelMessage):
        return
    message_module = importlib.import_module("pydotcompute.ring_kernels.message")
    tag = f"{cls.__module__}.{cls.__qualname__}"
    if message_module.registered_message_types().get(tag) is not cls:
        message_module.register_message_type(cls)


class RemotePeer:
    """Stand-in for a kernel in another Ray actor: what ``ctx.send`` / ``send_to`` reach.

    It has the methods a kernel calls on a forward target (``accept`` and
    ``accept_nowait``; the asyncio tier's ``ctx.send`` calls them by their underscored
    names). Runs on the hosting actor's event loop.
    """

    def __init__(
        self,
        kernel_id: str,
        handle: Any,
        *,
        limit: int,
        max_batch: int,
        on_lost: Callable[[int, str], None] | None = None,
        header: Callable[[Any], tuple[int, int, int] | None] | None = None,
        restart_wait: float = 0.0,
    ) -> None:
        self.kernel_id = kernel_id
        self._restart_wait = restart_wait  # > 0: the target is restarted by Ray
        self.incarnation: str | None = None  # of the target's actor process, when known
        self.input_type: type | None = None
        self.handle = handle
        self._push = handle.push
        self._limit = max(1, limit)
        self._max_batch = max(1, max_batch)
        if restart_wait > 0:  # what is counted lost with it is off by one batch at most
            self._max_batch = min(self._max_batch, RESTART_BATCH)
        self._pending: list[bytes] = []
        self._pump: asyncio.Task[None] | None = None
        self._space: asyncio.Event | None = None
        self._on_lost = on_lost
        self._tokens = itertools.count(1)
        self._token_prefix = uuid.uuid4().hex
        self._in_flight: str | None = None  # the token of the push on its way
        self._refusals = BurstLog(
            logger,
            logging.WARNING,
            "%d more message(s) refused by the kernel they were forwarded to since the "
            "last line (counted as dropped)",
        )
        self.error: BaseException | None = None
        self.delivered = 0
        self.dropped = 0
        self._flying = 0  # messages in the push on its way
        if header is not None:  # a tracing runtime: each message goes in its context
            plain = self._encode

            def encode(msg: Any) -> bytes:
                return traced_item(header(msg), plain(msg))

            self._encode = encode  # type: ignore[method-assign]

    @property
    def sender(self) -> str:
        """This stand-in's name on the target's side (`_KernelCore.taken_from`)."""
        return self._token_prefix

    @property
    def backlog(self) -> int:
        """Messages handed to this peer and not yet taken by the target (nor dropped)."""
        return len(self._pending) + self._flying

    def _encode(self, msg: Any) -> bytes:
        if self.error is not None:
            raise self.error
        serialize = getattr(msg, "serialize", None)
        if serialize is None:
            raise TypeValidationError(
                f"kernel {self.kernel_id!r} runs in another Ray actor, so messages to it "
                f"must be @message objects (they cross as MessagePack); got "
                f"{type(msg).__name__}"
            )
        data: bytes = serialize()
        return data

    async def _accept(self, msg: Any, timeout: float | None) -> None:
        data = self._encode(msg)
        if len(self._pending) >= self._limit:
            await self._wait_for_space(timeout)
        self._pending.append(data)
        self._kick()

    async def accept(self, msg: Any, timeout: float | None = None) -> None:
        """Queue ``msg`` to cross to the kernel (waits for room up to ``timeout``)."""
        await self._accept(msg, timeout)

    def accept_nowait(self, msg: Any) -> None:
        """Queue ``msg`` to cross, or raise ``QueueFullError`` when too many wait."""
        self._accept_nowait(msg)

    def _accept_nowait(self, msg: Any) -> None:
        data = self._encode(msg)
        if len(self._pending) >= self._limit:
            raise QueueFullError(
                f"{len(self._pending)} messages already wait to cross to kernel "
                f"{self.kernel_id!r} in another Ray actor; use send() to wait for room"
            )
        self._pending.append(data)
        self._kick()

    async def _wait_for_space(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while len(self._pending) >= self._limit:
            if self.error is not None:
                raise self.error
            if self._space is None:
                self._space = asyncio.Event()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueTimeoutError(
                    f"timed out after {timeout}s waiting to send to kernel {self.kernel_id!r} "
                    f"in another Ray actor ({len(self._pending)} messages waiting)"
                )
            try:
                async with asyncio.timeout(remaining):  # not wait_for: see lifecycle.py
                    await self._space.wait()
            except TimeoutError:
                continue
        if self.error is not None:
            raise self.error

    def _kick(self) -> None:
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(
                self._run(), name=f"pydotcompute:peer:{self.kernel_id}"
            )

    async def _run(self) -> None:
        try:
            while self._pending:
                n = self._max_batch
                batch = self._pending[:n]
                del self._pending[:n]
                token = f"{self._token_prefix}:{next(self._tokens)}"
                self._in_flight = token
                self._flying = len(batch)
                try:
                    # skip_full: a full reject-policy inbox refuses one message, not the rest
                    call = self._push.remote(batch, None, token, True)
                    answer = await (call if self._restart_wait <= 0 else self._answer(call))
                    accepted, err = (answer, None) if type(answer) is int else answer
                except (errors().actor, _Restarted) as exc:
                    self._in_flight = None
                    self._flying = 0
                    if await self._wait_for_restart():  # its fate unknown: at most once
                        self._count_lost(len(batch), "actor_lost")
                        continue
                    accepted, err = 0, None
                    self._set_error(
                        KernelStateError(
                            self.kernel_id,
                            "UNREACHABLE",
                            "send to",
                            f"its Ray actor is gone ({type(exc).__name__})",
                        ),
                        exc,
                    )
                finally:
                    self._in_flight = None
                    self._flying = 0
                if err is not None and accepted == 0 and self._relaunching(err):
                    # Ray restarted the target; its kernel is not launched yet: again
                    self._pending[:0] = batch
                    if await self._wait_for_restart():
                        continue
                    del self._pending[: len(batch)]
                self.delivered += accepted
                lost = len(batch) - accepted
                if err is not None:
                    error = unpack_error(err)
                    if isinstance(error, QueueFullError):  # transient: the next may fit
                        self._refusals.event(
                            "a message forwarded to kernel %r was refused: %s",
                            self.kernel_id,
                            error,
                        )
                    else:
                        self._set_error(error, None)
                if self.error is not None and self._pending:
                    lost += len(self._pending)
                    self._pending.clear()
                self._count_lost(lost)
                if self._space is not None:
                    self._space.set()
                    self._space = None
        finally:
            self._pump = None
            if self._space is not None:
                self._space.set()
                self._space = None

    def _count_lost(self, n: int, why: str = "reply_lost") -> None:
        """Messages that will never reach the target: counted by the forwarding kernel
        (reason ``reply_lost``; ``actor_lost`` for a batch that died with the target),
        once."""
        if n > 0:
            self.dropped += n
            if self._on_lost is not None:
                self._on_lost(n, why)

    def _relaunching(self, err: PackedError) -> bool:
        """The target answered that its kernel is not launched: a restarted actor whose
        driver has not launched it again yet."""
        if self._restart_wait <= 0:
            return False
        error = unpack_error(err)
        return isinstance(error, KernelStateError) and error.state is KernelState.CREATED

    async def _answer(self, call: Any) -> Any:
        """The answer of a push to a target that Ray restarts; `_Restarted` when the
        target's actor was restarted while the push was on its way (it never answers)."""
        fut = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=_ALIVE_S)
                if done:
                    return fut.result()
                try:
                    async with asyncio.timeout(_ALIVE_S):
                        _, incarnation = await self.handle.alive.remote()
                except (TimeoutError, errors().actor):
                    continue
                if self.incarnation is None:
                    self.incarnation = incarnation
                elif incarnation != self.incarnation:
                    raise _Restarted(self.kernel_id)
        finally:
            if not fut.done():
                fut.cancel()

    async def _wait_for_restart(self) -> bool:
        """Wait (up to ``restart_wait`` seconds) until Ray restarted the target and its
        kernel runs again; False when the target is not restarted (or not in time). The
        messages handed to this peer meanwhile wait here, up to its bound."""
        wait = self._restart_wait
        if wait <= 0 or self.error is not None:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        delay = 0.05
        logger.warning(
            "the Ray actor of kernel %r stopped; waiting up to %ss for Ray to restart it",
            self.kernel_id,
            wait,
        )
        while loop.time() < deadline and self.error is None:
            try:
                async with asyncio.timeout(_ALIVE_S):  # a call to a restarting actor may hang
                    state, incarnation = await self.handle.alive.remote()
                if state not in ("CREATED", "TERMINATING", "TERMINATED", "FAILED"):
                    self.incarnation = incarnation
                    return True
            except (TimeoutError, errors().actor):
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        return False

    def _set_error(
        self, error: BaseException, cause: BaseException | None, *, log: bool = True
    ) -> None:
        if cause is not None:
            error.__cause__ = cause
        if self.error is None:
            self.error = error
            if log:
                logger.error("forwarding to kernel %r failed: %s", self.kernel_id, error)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every pending message has been pushed (or refused)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._pump is not None:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait({self._pump}, timeout=remaining)
            if not done:
                return

    async def abort(self, timeout: float = 5.0) -> None:
        """Stop forwarding (the kernel is closing its books): what waits here is counted
        as lost, and the push on its way is withdrawn from the target, which answers how
        many of it it took; the rest is counted as lost too. Every message therefore ends
        once: taken by the target, or counted here."""
        self._set_error(
            KernelStateError(self.kernel_id, "UNREACHABLE", "send to", "the sender stopped"),
            None,
            log=False,
        )
        lost = len(self._pending)
        self._pending.clear()
        self._count_lost(lost)
        token, pump = self._in_flight, self._pump
        if token is None or pump is None:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await self.handle.withdraw.remote(token)
        with contextlib.suppress(Exception):
            await asyncio.wait({pump}, timeout=timeout)

    def log_summary(self) -> None:
        """The closing line of the rate-limited refusal log, if lines were held back."""
        left = self._refusals.take_pending()
        if left:
            logger.warning(
                "%d more message(s) forwarded to kernel %r were refused (counted as dropped)",
                left,
                self.kernel_id,
            )


class _Restarted(Exception):
    """The target's actor was restarted while a push was on its way to it."""


class _LogLines(logging.Handler):
    """The package's warnings and errors in this actor's process, kept for the driver,
    which writes them into its own log (a restart, a drop, a failure in the actor must be
    seen where the program runs). Bounded: beyond ``limit`` lines waiting, the oldest go
    and a line says how many."""

    def __init__(self, limit: int = 200) -> None:
        super().__init__(logging.WARNING)
        self._lines: deque[tuple[int, str]] = deque(maxlen=limit)
        self._lost = 0
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format: say so instead
            text = f"{record.msg!r} (its arguments did not format)"
        with self._guard:
            if len(self._lines) == self._lines.maxlen:
                self._lost += 1
            self._lines.append((record.levelno, text))

    def take(self) -> list[tuple[int, str]]:
        """The lines since the last call, oldest first."""
        with self._guard:
            out = list(self._lines)
            self._lines.clear()
            lost, self._lost = self._lost, 0
        if lost:
            out.insert(
                0, (logging.WARNING, f"{lost} earlier log line(s) of this Ray actor were dropped")
            )
        return out


def _withdrawn(kernel_id: str) -> KernelStateError:
    return KernelStateError(
        kernel_id, "WITHDRAWN", "send to", "the sending kernel stopped and withdrew the rest"
    )


#: The tier name the actor's own runtime launches an asyncio-tier kernel under (`_HostKernel`).
HOST_TIER = "ray-host"


class _HostKernel(RingKernel):
    """The asyncio-tier kernel inside a Ray actor. Its one addition: a request the actor
    raised on and was restarted after is noted (`failed_requests`), so that the driver,
    which holds the caller's waiter, can tell that caller why no reply comes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed_requests: list[tuple[Any, PackedError]] = []

    def _fail_request(self, request: Any, exc: BaseException, note: str) -> None:
        super()._fail_request(request, exc, note)
        try:
            key = request_key(request)
        except AttributeError:
            return
        err = KernelFailedError(
            self.kernel_id, exc, state=KernelState.ACTIVE, note=note, restarted=True
        )
        self.failed_requests.append((key, pack_error(err)))


class _HostRuntime(RingKernelRuntime):
    """The tier-1 runtime inside the actor; unknown ids resolve to kernels in other actors."""

    def __init__(self, host: _KernelCore, enable_telemetry: bool, tracing: bool) -> None:
        super().__init__(enable_telemetry=enable_telemetry, tracing=tracing)
        self._host = host

    def get_kernel(self, kernel_id: str) -> RingKernel:
        """A kernel of this actor, or the stand-in of one in another actor (what
        ``ctx.send_to`` reaches through the kernel's ``lookup``)."""
        kernel = self._kernels.get(kernel_id) if isinstance(kernel_id, str) else None
        if kernel is not None:
            return kernel
        return self._host.peer(kernel_id)  # type: ignore[return-value]


class _ReplyWaiter:
    """A ``send_and_receive`` waiter that hands the reply straight to a Ray thread.

    The tier-1 kernel resolves waiters by calling ``done()`` / ``set_result()`` /
    ``set_exception()`` on what it finds in ``kernel._waiters`` (from its event loop);
    this one forwards to a `concurrent.futures.Future` the Ray thread blocks on, so
    the reply needs no further turn of the loop.
    """

    __slots__ = ("future", "key")

    def __init__(self, cf: concurrent.futures.Future[Any]) -> None:
        self.future = cf  # what the Ray thread blocks on
        self.key: Any = None  # the correlation key the kernel gave it (`expect_reply`)

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, msg: Any) -> None:
        if not self.future.done():
            self.future.set_result(msg)

    def set_exception(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def cancel(self) -> bool:
        return self.future.cancel()


class _KernelCore:
    """The kernel's side of a `KernelHost`: everything that runs on its event loop.

    Kept apart from the Ray-facing class on purpose: Ray turns a class with *any*
    ``async def`` method into an async actor, whose sync methods would then block Ray's
    single event loop.
    """

    def __init__(
        self,
        kernel_id: str,
        kernel_func: Any,
        input_type: type | None,
        output_type: type | None,
        config: RingKernelConfig | None,
        options: dict[str, Any],
        name_prefix: str,
        settings: dict[str, Any],
    ) -> None:
        self._kernel_id = kernel_id
        self._func = kernel_func
        self._input_type = input_type
        self._output_type = output_type
        self._config = config
        self._options = options
        self._prefix = name_prefix
        self._settings = settings
        self._runtime: _HostRuntime | None = None
        self._kernel: RingKernel | None = None
        self._marks = _Marks()
        self._ended: asyncio.Event | None = None
        self._peers: dict[str, RemotePeer] = {}
        self._forward: RemotePeer | None = None
        # what the kernel left when its books closed (computed once: terminate and watch
        # may both ask for it)
        self._handover: asyncio.Task[Any] | None = None
        self._terminating = False  # the driver asked: its answer carries the hand-over
        # pushes running on the loop by the token of their caller, and tokens withdrawn
        # before their push started
        self._pushes: dict[str, asyncio.Task[Any]] = {}
        self._withdrawn: set[str] = set()
        self._taken_from: dict[str, int] = {}  # messages delivered by each stand-in
        # the driver's calls carry (band, seq): they are admitted in that order per band,
        # whichever arrives first (Ray does not order the calls to a threaded actor)
        self._turns: dict[int, int] = {}
        self._turn_waiters: dict[tuple[int, int], asyncio.Future[None]] = {}
        self.log_lines = _LogLines()
        self._tracing = bool(settings.get("tracing", False))
        # the user's backpressure, for what other actors push over direct edges
        self._edge_policy = str(settings.get("edge_backpressure", "block"))
        #: bytes from the driver or another actor -> the message (and its trace context)
        self.decode: Callable[[bytes], Any] = (
            self._decode_traced if self._tracing else deserialize_message
        )

    def _decode_traced(self, data: bytes) -> Any:
        ids, record = split_traced(data)
        msg = deserialize_message(record)
        runtime = self._runtime
        if ids is not None and runtime is not None:
            runtime.tracer.carry_remote(msg, *ids)
        return msg

    def _peer_header(self, msg: Any) -> tuple[int, int, int] | None:
        runtime = self._runtime
        return None if runtime is None else runtime.tracer.take_ids(msg)  # type: ignore[no-any-return]

    @property
    def kernel(self) -> RingKernel | None:
        """The tier-1 kernel (None before `launch`)."""
        return self._kernel

    def require(self, operation: str) -> RingKernel:
        """The tier-1 kernel, or `KernelStateError` when it was not launched yet."""
        if self._kernel is None:
            raise KernelStateError(
                self._kernel_id, KernelState.CREATED, operation, "launch it first"
            )
        return self._kernel

    def peer(self, kernel_id: str) -> RemotePeer:
        """The stand-in for another kernel of the same runtime (resolved by actor name)."""
        peer = self._peers.get(kernel_id)
        if peer is not None:
            return peer
        if not isinstance(kernel_id, str):
            raise KernelNotFoundError(repr(kernel_id), [self._kernel_id], where="Ray runtime")
        ray = ray_module()
        try:
            handle = ray.get_actor(actor_name(self._prefix, kernel_id))
        except ValueError:
            raise KernelNotFoundError(kernel_id, self._known_ids(), where="Ray runtime") from None
        return self._add_peer(kernel_id, handle)

    def _add_peer(self, kernel_id: str, handle: Any, restart_wait: float = 0.0) -> RemotePeer:
        peer = RemotePeer(
            kernel_id,
            handle,
            limit=int(self._settings.get("peer_limit", 4096)),
            max_batch=int(self._settings.get("max_batch", 1024)),
            on_lost=self._count_lost,
            header=self._peer_header if self._tracing else None,
            restart_wait=restart_wait,
        )
        self._peers[kernel_id] = peer
        return peer

    def _known_ids(self) -> list[str]:
        try:
            names = ray_module().util.list_named_actors()
        except Exception:
            return [self._kernel_id]
        n = len(self._prefix)
        return sorted(name[n:] for name in names if name.startswith(self._prefix))

    def _count_lost(self, n: int, why: str = "reply_lost") -> None:
        """Replies forwarded to another actor that never got there: the kernel's drops
        (``actor_lost``: they died with the actor they were pushed to)."""
        kernel = self._kernel
        if kernel is None:
            return
        if why != "reply_lost":
            kernel.telemetry.record_drop(n, why)
            return
        for _ in range(n):
            kernel.count_lost_reply()

    def _watch_task(self, kernel: RingKernel) -> None:
        ended = self._ended
        if ended is not None:
            kernel.add_done_callback(lambda _k: ended.set())

    # -- lifecycle (Ray threads) ----------------------------------------------------------

    async def launch(self) -> Answer:
        try:
            if self._kernel is not None:
                raise KernelStateError(
                    self._kernel_id, self._kernel.state, "launch", "it is already launched"
                )
            telemetry = bool(self._settings.get("enable_telemetry", True))
            runtime = _HostRuntime(self, telemetry, self._tracing)
            await runtime.start()
            self._ended = asyncio.Event()
            config = self._config
            if config is not None and config.tier == "asyncio":
                # the asyncio tier, noting requests it restarts after (`_HostKernel`)
                importlib.import_module("pydotcompute.ring_kernels.tiers").register_tier(
                    HOST_TIER, _HostKernel
                )
                config.tier = HOST_TIER
            self._kernel = await runtime.launch(
                self._kernel_id,
                self._func,
                config=self._config,
                input_type=self._input_type,
                output_type=self._output_type,
                **self._options,
            )
            self._runtime = runtime
            return self._kernel.state.name, None
        except PyDotComputeError as exc:
            return None, pack_error(exc)

    async def restore(
        self,
        state: str,
        forward: tuple[str, Any] | None,
        turns: list[int] | dict[int, int] | None = None,
    ) -> Answer:
        if self._kernel is not None:
            return "alive", None
        if turns is not None:  # the calls before the restart will never come
            self._turns = dict(turns) if isinstance(turns, dict) else dict(enumerate(turns))
        value, err = await self.launch()
        if err is not None:
            return value, err
        if forward is not None:
            await self.connect(*forward)
        if state in ("ACTIVE", "DEACTIVATED"):
            value, err = await self.transition("activate")
            if err is None and state == "DEACTIVATED":
                value, err = await self.transition("deactivate")
        return ("restored" if err is None else value), err

    async def transition(self, operation: str) -> Answer:
        try:
            kernel = self.require(operation)
            await getattr(kernel, operation)()
            if operation == "activate":
                self._watch_task(kernel)
            return kernel.state.name, None
        except PyDotComputeError as exc:
            return None, pack_error(exc)

    async def terminate(self, timeout: float | None) -> Answer:
        try:
            kernel = self.require("terminate")
            assert self._runtime is not None
            if self._handover is not None:
                pass  # it returned by itself: its books are being closed already
            elif kernel.state is KernelState.TERMINATED:  # returned, not yet watched
                self._close_books(list(kernel.undelivered), timeout)
            else:
                failed = kernel.state is KernelState.FAILED
                self._terminating = True
                left = await self._runtime.terminate(self._kernel_id, timeout)
                if failed:  # what the failure left (the message it raised on first) goes back too
                    left = list(kernel.undelivered)
                self._close_books(left, timeout)
            assert self._handover is not None
            value = await asyncio.shield(self._handover)
            if self._ended is not None:
                self._ended.set()
            return value, None
        except PyDotComputeError as exc:
            return None, pack_error(exc)

    def _close_books(self, left: list[Any], timeout: float | None) -> None:
        """Start handing over what the kernel left (once): replies forwarded to other
        actors are pushed (up to the grace period), the rest of them withdrawn and counted;
        then the messages handed back, the replies still in the outbox, the telemetry and
        the log lines leave for the driver together."""
        if self._handover is None:
            self._handover = asyncio.get_running_loop().create_task(self._hand_over(left, timeout))

    async def _hand_over(self, left: list[Any], timeout: float | None) -> Any:
        kernel = self.require("terminate")
        grace = kernel.config.drain_timeout if timeout is None else timeout
        peers = list(self._peers.values())
        for peer in peers:
            await peer.flush(grace)
        for peer in peers:
            await peer.abort()
            peer.log_summary()
        rest = kernel.outbox.drain() if kernel.outbox is not None else []
        return (
            _encode_all(left, self._kernel_id),
            _encode_all(rest, self._kernel_id),
            kernel.state.name,
            (self.events(latencies=True), self.log_lines.take()),
        )

    async def watch(self) -> Answer:
        if self._ended is None:
            self._ended = asyncio.Event()
        await self._ended.wait()
        kernel = self._kernel
        if kernel is None:
            return "CREATED", None
        if self._terminating:  # the terminate's answer carries the hand-over and the lines
            return (kernel.state.name, pack_cause(kernel.error), None, []), None
        handover = None
        if kernel.state is KernelState.TERMINATED:  # its function returned by itself
            self._close_books(list(kernel.undelivered), None)
            assert self._handover is not None
            handover = await asyncio.shield(self._handover)
        return (kernel.state.name, pack_cause(kernel.error), handover, self.log_lines.take()), None

    async def connect(self, target_id: str, handle: Any, restart_wait: float = 0.0) -> Answer:
        try:
            kernel = self.require("connect")
            peer = self._peers.get(target_id)
            if peer is None or peer.handle != handle:
                peer = self._add_peer(target_id, handle, restart_wait)
                if restart_wait > 0:  # the target's incarnation: a restart changes it
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(_ALIVE_S):
                            _, peer.incarnation = await handle.alive.remote()
            kernel.forward_to(peer)  # type: ignore[arg-type]
            self._forward = peer
            return True, None
        except PyDotComputeError as exc:
            return None, pack_error(exc)

    async def disconnect(self) -> Answer:
        if self._kernel is not None:
            self._kernel.forward_to(None)
        if self._forward is not None:
            await self._forward.flush()
        self._forward = None
        return True, None

    # -- messaging ------------------------------------------------------------------------

    async def _wait_turn(self, band: int, seq: int) -> None:
        """Wait until the driver's earlier calls of ``band`` have been admitted."""
        if seq <= self._turns.get(band, 0) + 1:
            return
        fut = asyncio.get_running_loop().create_future()
        self._turn_waiters[(band, seq)] = fut
        try:
            async with asyncio.timeout(_TURN_S):
                await fut
        except TimeoutError:  # a call lost on its way: never wait for it for ever
            logger.warning(
                "kernel %r: a call from the driver did not arrive within %ss; going on",
                self._kernel_id,
                _TURN_S,
            )
        finally:
            self._turn_waiters.pop((band, seq), None)

    def done_turn(self, band: int, seq: int) -> None:
        """Loop thread: the driver's call ``seq`` of ``band`` was admitted (or refused)."""
        if seq > self._turns.get(band, 0):
            self._turns[band] = seq
        fut = self._turn_waiters.get((band, seq + 1))
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def push(
        self,
        batch: list[bytes],
        timeout: float | None,
        token: str | None,
        skip_full: bool,
        band: int | None = None,
        seq: int | None = None,
    ) -> Any:
        if band is None or seq is None:
            return await self._push(batch, timeout, token, skip_full)
        try:
            await self._wait_turn(band, seq)
            return await self._push(batch, timeout, token, skip_full)
        finally:
            self.done_turn(band, seq)

    async def _push(
        self, batch: list[bytes], timeout: float | None, token: str | None, skip_full: bool
    ) -> Any:
        accepted = 0
        if token is not None:
            if token in self._withdrawn:
                self._withdrawn.discard(token)
                return 0, pack_error(_withdrawn(self._kernel_id))
            task = asyncio.current_task()
            assert task is not None
            self._pushes[token] = task
        refused: PyDotComputeError | None = None
        try:
            kernel = self.require("send to")
            accept = kernel.accept
            decode = self.decode
            inbox = kernel.inbox
            policy = self._edge_policy if skip_full and inbox is not None else "block"
            for data in batch:
                try:
                    msg = decode(data)
                    if policy != "block" and inbox is not None and 0 < inbox.maxsize <= len(inbox):
                        if policy == "reject":
                            raise QueueFullError(
                                f"the inbox of kernel {self._kernel_id!r} is full "
                                f"({len(inbox)}/{inbox.maxsize} messages) and its backpressure "
                                "is 'reject'; receive faster, raise queue_size, or choose "
                                "backpressure='block' or 'drop_oldest'"
                            )
                        inbox.evict_oldest()  # counted as this kernel's drop (its on_drop)
                    await accept(msg, timeout)
                except QueueFullError as exc:
                    if not skip_full:
                        raise
                    refused = exc  # a reject-policy inbox refused this one; go on
                    continue
                accepted += 1
            return accepted if refused is None else (accepted, pack_error(refused))
        except PyDotComputeError as exc:
            return accepted, pack_error(exc)
        except asyncio.CancelledError:
            if token is None or token not in self._withdrawn:
                raise
            self._withdrawn.discard(token)
            return accepted, pack_error(_withdrawn(self._kernel_id))
        finally:
            if token is not None:
                self._pushes.pop(token, None)
                sender = token.rpartition(":")[0]  # what each stand-in delivered, exactly
                self._taken_from[sender] = self._taken_from.get(sender, 0) + accepted

    def taken_from(self, sender: str) -> int:
        """How many messages the stand-in ``sender`` (`RemotePeer.sender`) delivered here:
        exact even after the actor that forwarded them died."""
        return self._taken_from.get(sender, 0)

    def withdraw(self, token: str) -> None:
        """Loop thread: the sender of push ``token`` gives up on what it has not delivered."""
        self._withdrawn.add(token)
        task = self._pushes.get(token)
        if task is not None:
            task.cancel()

    def start_request(
        self,
        kernel: RingKernel,
        msg: Any,
        waiter: _ReplyWaiter,
        timeout: float | None,
        turn: tuple[int, int] | None,
    ) -> None:
        """Loop thread: register the waiter and enqueue, in its turn; slow path when the
        inbox is full or earlier calls of its band have not been admitted yet."""
        inbox = kernel.inbox
        if (inbox is not None and inbox.maxsize and len(inbox) >= inbox.maxsize) or (
            turn is not None and turn[1] > self._turns.get(turn[0], 0) + 1
        ):
            asyncio.get_running_loop().create_task(
                self._admit_request(kernel, msg, waiter, timeout, turn)
            )
            return
        try:
            msg, waiter.key = kernel.expect_reply(msg, waiter)
            kernel.accept_nowait(msg)
        except BaseException as exc:
            kernel.forget_request(waiter.key, waiter)
            if not waiter.future.done():
                waiter.future.set_exception(exc)
        finally:
            if turn is not None:
                self.done_turn(*turn)

    async def _admit_request(
        self,
        kernel: RingKernel,
        msg: Any,
        waiter: _ReplyWaiter,
        timeout: float | None,
        turn: tuple[int, int] | None,
    ) -> None:
        """The slow path of `start_request`: wait for its turn, then for room."""
        try:
            if turn is not None:
                await self._wait_turn(*turn)
            msg, waiter.key = kernel.expect_reply(msg, waiter)
            await kernel.accept(msg, timeout)
        except BaseException as exc:
            kernel.forget_request(waiter.key, waiter)
            if not waiter.future.done():
                waiter.future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if turn is not None:
                self.done_turn(*turn)

    async def fetch(self, n: int, wait: float | None) -> Any:
        items: list[Any] = []
        try:
            kernel = self.require("receive from")
            out = kernel.outbox
            assert out is not None
            if len(out):
                items = out.get_batch(n)
            else:
                try:
                    first = await out.get(timeout=wait)
                except QueueTimeoutError:
                    return []
                items = [first]
                if n > 1 and len(out):
                    items.extend(out.get_batch(n - 1))
            if self._tracing:  # each reply in the context it was sent in
                return [
                    traced_item(self._peer_header(m), _encode(m, self._kernel_id)) for m in items
                ]
            return _encode_all(items, self._kernel_id)
        except PyDotComputeError as exc:
            if items:  # a reply that cannot be encoded: deliver the others, report it
                return _encode_good(items, self._kernel_id), pack_error(exc)
            return [], pack_error(exc)

    # -- the driver's worker (`worker.RayWorker`) -----------------------------------------

    def progress(self) -> tuple[int, int, str | None, int]:
        """``(taken, owed, sender, pushed)`` since this actor (re)started: messages the
        actor took from its inbox, replies it made that still had to reach the driver (all
        it put in its outbox) or the actor it forwards to (what waits in the stand-in), the
        name of the stand-in of its direct edge (None: none), and the messages other
        actors pushed into its inbox over direct edges. The driver counts what a dead
        actor took with it from these."""
        kernel = self._kernel
        if kernel is None:
            return 0, 0, None, 0
        inbox, out = kernel.inbox, kernel.outbox
        taken = inbox.statistics().total_dequeued if inbox is not None else 0
        taken -= kernel.messages_in_hand  # finished: the one in hand dies with the actor
        owed = out.statistics().total_enqueued if out is not None else 0
        forward = self._forward
        for peer in list(self._peers.values()):
            owed += peer.backlog
        pushed = sum(self._taken_from.values())
        return int(taken), int(owed), None if forward is None else forward.sender, pushed

    def events(self, latencies: bool = False) -> dict[str, Any] | None:
        """What happened in the actor since the last call that the driver's telemetry
        counts (restarts, errors, drops other than those handed back, requests the actor
        raised on, messages another actor took over a direct edge), or None when nothing
        did; with ``latencies``, also the latencies timed
        since (``"latency"``, `RingKernelTelemetry.merge_summary`'s form)."""
        kernel = self._kernel
        if kernel is None:
            return None
        forwarded = sum(peer.delivered for peer in list(self._peers.values()))
        return self._marks.since(kernel, latencies, forwarded)

    async def put(self, batch: list[bytes], seq: int) -> Any:
        """The driver's batch number ``seq`` (admitted in that order): decode each message
        and put it into the inbox, waiting for room (the inbox blocks: the driver's
        inbox holds the user's policy). A message that does not decode is refused alone.

        Answers ``(accepted, packed error or None, rejected, progress, events)``: ``accepted``
        counts the messages taken or refused, from the first; the error stops the batch
        there (a kernel that ended); ``rejected`` lists ``(message id or None, text)`` of
        messages that did not decode."""
        accepted = 0
        rejected: list[tuple[Any, str]] = []
        err: PackedError | None = None
        try:
            await self._wait_turn(_PUT_BAND, seq)
            kernel = self.require("send to")
            accept = kernel.accept
            decode = self.decode
            for data in batch:
                try:
                    msg = decode(data)
                except MessageDeserializationError as exc:
                    rejected.append((frame_id(data), str(exc)))
                    accepted += 1
                    continue
                await accept(msg, None)
                accepted += 1
        except PyDotComputeError as exc:
            err = pack_error(exc)
        finally:
            self.done_turn(_PUT_BAND, seq)
        return accepted, err, rejected or None, self.progress(), self.events()

    async def collect(self, n: int, wait: float | None) -> Any:
        """Up to ``n`` replies (waiting up to ``wait`` seconds for the first), as
        ``(replies, packed error or None, events or None, progress, closed)``: the error
        once the outbox is closed and drained (``closed``), or of one reply that cannot
        cross (a plain value the actor sent)."""
        answer = await self.fetch(n, wait)
        items, err = (answer, None) if type(answer) is list else answer
        # ``closed``: the outbox is closed and drained (else the error is one reply's)
        closed = err is not None and err[0] in ("KernelStateError", "KernelFailedError")
        return items, err, self.events(), self.progress(), closed

    async def stats(self) -> Any:
        """``(events with latencies, progress)`` (`events`): what the driver's telemetry
        folds in when it is read, fetched without blocking the driver."""
        return self.events(latencies=True), self.progress()

    async def telemetry(self) -> Any:
        """The kernel's telemetry (None before launch) and the log lines since the last
        call, as ``(telemetry, lines)``."""
        kernel = self._kernel
        if kernel is None:
            return None, self.log_lines.take()
        tel = kernel.telemetry
        inbox = kernel.inbox
        tel.queue_depth = len(inbox) if inbox is not None else 0
        return tel, self.log_lines.take()


class KernelHost:
    """A Ray actor's body: one tier-1 ring kernel plus the calls the driver makes.

    Constructed by Ray in the worker with the kernel's function and types (shipped by
    reference when they live in an importable module) and its launch options.

    Threads: the kernel runs on an event loop of its own, in a thread started here (uvloop
    when installed). Ray runs the methods below on its actor thread pool
    (``max_concurrency``) and each hands its work to that loop. A threaded actor was
    chosen over an ``async def`` Ray actor: Ray's async actors pay a second thread hop on
    every call (measured: about 15% more per round trip), and the loop thread keeps the
    kernel persistent between calls either way. ``request`` takes a shorter path still: it
    schedules one callback on the loop and receives the reply from the actor's
    ``ctx.send`` directly (`_ReplyWaiter`). No method here may be ``async def``.
    """

    def __init__(
        self,
        kernel_id: str,
        kernel_func: Any,
        input_type: type | None,
        output_type: type | None,
        config: RingKernelConfig | None,
        options: dict[str, Any],
        name_prefix: str,
        settings: dict[str, Any],
    ) -> None:
        _register_message_type(input_type)
        _register_message_type(output_type)
        self._kernel_id = kernel_id
        self._incarnation = uuid.uuid4().hex  # this actor process (`alive`)
        self._core = _KernelCore(
            kernel_id,
            kernel_func,
            input_type,
            output_type,
            config,
            options,
            name_prefix,
            settings,
        )
        # the package's log lines in this process travel to the driver's log
        logging.getLogger("pydotcompute").addHandler(self._core.log_lines)
        self._loop = create_optimized_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"pydotcompute-ray:{kernel_id}", daemon=True
        )
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the kernel's loop and wait for it (called on a Ray thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- lifecycle ------------------------------------------------------------------------

    def launch(self) -> Answer:
        """Phase 1: build the tier-1 runtime and the kernel (LAUNCHED)."""
        return self._run(self._core.launch())

    def restore(
        self,
        state: str,
        forward: tuple[str, Any] | None,
        turns: list[int] | dict[int, int] | None = None,
    ) -> Answer:
        """After Ray restarted this actor: launch again and return to ``state``.

        Answers ``"alive"`` when the actor was not restarted after all (the kernel exists).
        """
        return self._run(self._core.restore(state, forward, turns))

    def activate(self) -> Answer:
        return self._run(self._core.transition("activate"))

    def deactivate(self) -> Answer:
        return self._run(self._core.transition("deactivate"))

    def reactivate(self) -> Answer:
        return self._run(self._core.transition("reactivate"))

    def terminate(self, timeout: float | None) -> Answer:
        """Drain and stop the kernel; hand back what is left in its inbox and outbox.

        Messages the kernel forwarded to other actors are pushed before this returns, so a
        graceful stop of a pipeline stage loses nothing downstream.
        """
        return self._run(self._core.terminate(timeout))

    def watch(self) -> Answer:
        """Wait until the kernel stops on its own account (its function returned or
        raised) or is terminated; answer its final state and error."""
        return self._run(self._core.watch())

    def state(self) -> Answer:
        kernel = self._core.kernel
        return (kernel.state.name if kernel is not None else "CREATED"), None

    def alive(self) -> tuple[str, str]:
        """``(kernel state, incarnation)``: the incarnation names this actor process (a
        restart by Ray makes a new one), for a `RemotePeer` pushing to it."""
        kernel = self._core.kernel
        return (kernel.state.name if kernel is not None else "CREATED"), self._incarnation

    # -- routing --------------------------------------------------------------------------

    def connect(self, target_id: str, handle: Any, restart_wait: float = 0.0) -> Answer:
        """Forward everything this kernel sends to ``target_id``'s actor (actor to actor);
        ``restart_wait`` > 0: Ray restarts that actor, wait that long for it when it dies."""
        return self._run(self._core.connect(target_id, handle, restart_wait))

    def disconnect(self) -> Answer:
        return self._run(self._core.disconnect())

    # -- messaging ------------------------------------------------------------------------

    def push(
        self,
        batch: list[bytes],
        timeout: float | None = None,
        token: str | None = None,
        skip_full: bool = False,
        band: int | None = None,
        seq: int | None = None,
    ) -> Any:
        """Decode a batch and put it into the inbox in order.

        Answers the number accepted, or ``(accepted, packed_error)`` on the first refusal
        (full queue under ``reject``, a timeout under ``block``, a terminated kernel, bad
        bytes); the rest of the batch is not taken. With ``skip_full`` (another actor
        forwarding) a full ``reject`` inbox refuses only that message and the rest is
        tried; the answer then carries the last refusal. A push given a ``token`` can be
        withdrawn by its sender (`withdraw`): it stops and answers what it took. The
        driver numbers its calls per priority band (``band``, ``seq``): they are admitted
        in that order, whichever reaches the actor first.
        """
        return self._run(self._core.push(batch, timeout, token, skip_full, band, seq))

    def taken_from(self, sender: str) -> int:
        """Messages the stand-in ``sender`` of another actor delivered here."""
        return self._core.taken_from(sender)

    def put(self, batch: list[bytes], seq: int) -> Any:
        """The driver's batch ``seq`` into the inbox, in order (see `_KernelCore.put`)."""
        return self._run(self._core.put(batch, seq))

    def collect(self, n: int, wait: float | None = None) -> Any:
        """Up to ``n`` replies and what the driver's telemetry counts (`_KernelCore.collect`)."""
        return self._run(self._core.collect(n, wait))

    def stats(self) -> Any:
        """What the driver's telemetry folds in, latencies included (`_KernelCore.stats`)."""
        return self._run(self._core.stats())

    def withdraw(self, token: str) -> None:
        """The sender of push ``token`` stops: that push takes nothing more (it answers
        how many it took); a push not started yet takes nothing."""
        self._loop.call_soon_threadsafe(self._core.withdraw, token)

    def request(
        self,
        data: bytes,
        timeout: float | None = None,
        band: int | None = None,
        seq: int | None = None,
    ) -> Any:
        """One correlated request/reply (``send_and_receive``) in a single Ray call,
        admitted in its turn among the driver's calls of its band (``seq``, see `push`).

        Answers the reply's bytes, or ``(None, packed_error)``.
        """
        turn = None if band is None or seq is None else (band, seq)
        try:
            msg = self._core.decode(data)
            kernel = self._core.require("send to")
        except PyDotComputeError as exc:
            if turn is not None:  # its turn passes: later calls need not wait for it
                self._loop.call_soon_threadsafe(self._core.done_turn, *turn)
            return None, pack_error(exc)
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        waiter = _ReplyWaiter(cf)
        self._loop.call_soon_threadsafe(
            self._core.start_request, kernel, msg, waiter, timeout, turn
        )
        try:
            try:
                reply = cf.result(timeout)
            except concurrent.futures.TimeoutError:
                # the key stays registered as abandoned (a bounded number of them): the
                # late reply is dropped and counted by the kernel instead of filling its
                # outbox
                if cf.cancel():
                    self._loop.call_soon_threadsafe(_abandon, kernel, waiter)
                    return None, pack_error(
                        QueueTimeoutError(
                            f"no reply from kernel {self._kernel_id!r} within {timeout}s "
                            f"(request {type(msg).__name__} {msg.message_id})"
                        )
                    )
                reply = cf.result()  # it arrived as we gave up
        except PyDotComputeError as exc:
            return None, pack_error(exc)
        try:
            data = _encode(reply, self._kernel_id)
        except PyDotComputeError as exc:
            return None, pack_error(exc)
        if band == _PUT_BAND:  # the driver's worker: what its telemetry counts comes along
            events = self._core.events()
            if events is not None:
                return data, None, events
        return data

    def ask(self, framed: bytes) -> Any:
        """`request` for the driver's worker, its arguments in one byte string
        (`frame_ask`): Ray's cost grows with each argument of a call, and this is the call
        ``send_and_receive`` waits for."""
        seq, timeout = _ASK.unpack_from(framed)
        data = framed[_ASK.size :]
        return self.request(data, None if timeout < 0 else timeout, _PUT_BAND, seq)

    def fetch(self, n: int, wait: float | None = None) -> Any:
        """Up to ``n`` replies from the outbox, waiting up to ``wait`` seconds for the first.

        Answers a list of bytes (empty when nothing came in time), or ``(replies,
        packed_error)`` once the outbox is closed and drained (a terminated or failed
        kernel) or a reply cannot be encoded.
        """
        return self._run(self._core.fetch(n, wait))

    def telemetry(self) -> Any:
        """``(telemetry, log lines)``: the kernel's counts and the package's log lines in
        this actor since the last call."""
        return self._run(self._core.telemetry())


_PUT_BAND = -1  # the turn numbers of the driver worker's batches (`put`)
_ASK = struct.Struct("<qd")  # `ask`'s header: the turn number and the timeout (< 0: none)


def frame_ask(data: bytes, seq: int, timeout: float | None) -> bytes:
    """The one argument of `KernelHost.ask`: the request's bytes behind its turn number
    ``seq`` (band `_PUT_BAND`) and ``timeout``."""
    return _ASK.pack(seq, -1.0 if timeout is None else timeout) + data


_RAW_ITEMS: Any = None


def frame_id(data: bytes, which: str = "message_id") -> Any:
    """``message_id`` (or ``correlation_id``) of a frame that does not decode as its class,
    or None. A frame is a flat array ending with its header (``message_id, priority,
    correlation_id``): only that item is decoded."""
    global _RAW_ITEMS
    msgspec: Any = importlib.import_module("msgspec")
    if _RAW_ITEMS is None:
        _RAW_ITEMS = msgspec.msgpack.Decoder(list[msgspec.Raw])
    try:
        items = _RAW_ITEMS.decode(split_traced(data)[1])
        at = -3 if which == "message_id" else -1
        wire = msgspec.msgpack.decode(items[at]) if len(items) >= 4 else None
    except Exception:
        return None
    return uuid.UUID(bytes=wire) if type(wire) is bytes and len(wire) == 16 else None


class _Marks:
    """What the driver was last told of a kernel's counters (`_KernelCore.events`)."""

    __slots__ = ("drops", "errors", "forwarded", "guard", "latency", "restarts")

    def __init__(self) -> None:
        self.guard = threading.Lock()  # the loop's calls and `request`'s Ray thread
        self.restarts = 0
        self.forwarded = 0
        self.errors = 0
        self.drops: dict[str, int] = {}
        self.latency: tuple[int, int, dict[int, int]] = (0, 0, {})

    def since(self, kernel: Any, latencies: bool, forwarded: int = 0) -> dict[str, Any] | None:
        with self.guard:
            return self._since(kernel, latencies, forwarded)

    def _since(self, kernel: Any, latencies: bool, forwarded: int) -> dict[str, Any] | None:
        tel = kernel.telemetry
        out: dict[str, Any] = {}
        if forwarded != self.forwarded:  # taken by another actor, over a direct edge
            out["sent"] = forwarded - self.forwarded
            self.forwarded = forwarded
        if tel.restarts != self.restarts:
            out["restarts"] = tel.restarts - self.restarts
            self.restarts = tel.restarts
        if tel.error_count != self.errors:
            out["errors"] = (tel.error_count - self.errors, tel.last_error)
            self.errors = tel.error_count
        per = tel.drops_by_reason
        if per:  # (a copy: this may run on a Ray thread while the loop counts a drop)
            per = dict(per)
            drops = {}
            for why, n in per.items():
                # handed back: the driver hands the same messages back and counts them
                if why != "undelivered" and n != self.drops.get(why, 0):
                    drops[why] = n - self.drops.get(why, 0)
                    self.drops[why] = n
            if drops:
                out["drops"] = drops
        # (the asyncio tier's kernel notes them; another tier in the actor has none)
        failed = kernel.failed_requests if isinstance(kernel, _HostKernel) else None
        if failed:
            taken = failed[:]
            del failed[: len(taken)]
            out["failed"] = taken
        if latencies:
            count, total, lo, hi, pairs = tel.latency_summary()
            seen_n, seen_total, seen = self.latency
            if count > seen_n:
                delta = [(b, c - seen.get(b, 0)) for b, c in pairs if c > seen.get(b, 0)]
                out["latency"] = (count - seen_n, total - seen_total, lo, hi, delta)
                self.latency = (count, total, dict(pairs))
        return out or None


def _abandon(kernel: RingKernel, waiter: _ReplyWaiter) -> None:
    """Loop thread: the Ray caller of ``waiter`` gave up on its request."""
    if waiter.key is not None:
        kernel.abandon_request(waiter.key, waiter)


def _encode(item: Any, kernel_id: str) -> bytes:
    """A message's bytes for the trip to another Ray actor or the driver.

    Raises:
        TypeValidationError: ``item`` is not a message (an untyped actor's plain value).
    """
    if type(item) is bytes:
        return item
    serialize = getattr(item, "serialize", None)
    if serialize is None:
        raise TypeValidationError(
            f"kernel {kernel_id!r} runs in a Ray actor, so what it sends must be @message "
            f"objects (they cross as MessagePack); got {type(item).__name__}"
        )
    data: bytes = serialize()
    return data


def _encode_all(items: list[Any], kernel_id: str) -> list[bytes]:
    return [_encode(item, kernel_id) for item in items]


def _encode_good(items: list[Any], kernel_id: str) -> list[bytes]:
    out: list[bytes] = []
    for item in items:
        with contextlib.suppress(PyDotComputeError):
            out.append(_encode(item, kernel_id))
    return out
