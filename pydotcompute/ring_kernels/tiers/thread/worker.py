"""The thread tier's worker: a plain-function actor running in a thread of its own.

`ThreadWorker` is the mechanism and the `TierWorker` at once: the runtime hosts it
(`runtime.launch(..., tier="thread")` builds a `ThreadHostedKernel`), and the standalone
`ThreadedRingKernel` is a synchronous façade over it. The actor takes a
`ThreadedKernelContext`:

```python
def worker(ctx):
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.1)
        if msg is not None:
            ctx.send(msg * 2)
```

Design notes:
- Inbox and outbox are `SPSCQueue` (default) or `SyncQueue`. The actor thread is the only
  consumer of the inbox and the only producer of the outbox; callers of `put`/`offer` and
  `get`/`poll_reply` serialize through one lock per direction, which keeps the SPSC
  contract with any number of caller threads.
- The runtime's bridge moves batches: `offer_many` and `poll_replies` take one lock and
  wake the other side once; `on_readable`/`on_writable` are burst wakers (once a burst,
  after a poll found nothing or an offer was refused), so the actor pays no call per item.
- Urgent messages: `offer` and `offer_many` (the runtime's bridge) put a message of
  priority `URGENT_PRIORITY` or more into the SPSC inbox's urgent lane
  (`SPSCQueue.put_urgent`), so the actor takes it before the batch it was handed earlier;
  `put` (the standalone kernel's ``send``) stays one FIFO.
- States are the shared `KernelState`: CREATED -> ACTIVE -> TERMINATING -> TERMINATED.
  They say where the thread is; `failure` says why it ended: an actor that raised leaves
  the worker TERMINATED with `failure` set (FAILED is the runtime's verdict on a kernel,
  not the thread's state), as the 0.2 API reports STOPPED with ``failed`` True.
- A graceful stop drains: `stop` shuts the inbox, so ``ctx.should_terminate`` turns True
  only once it is empty, and a ``receive`` blocked on an empty, stopped inbox raises
  `QueueClosedError`, which ends the actor cleanly. If the actor does not finish within
  the timeout, what is still queued moves to `unprocessed` (and `take_undelivered`).
- A thread cannot be interrupted: a message the actor still holds when a stop's grace
  period runs out is finished late, and its reply arrives after `stop` returned
  (`on_late_reply`), instead of being handed back as undelivered as well.
- Failure: the actor's exception is kept in `failure`, the outbox is shut down, and every
  caller blocked in (or later calling) `get` gets `KernelFailedError` once the replies
  sent before the failure are drained. The message it raised on is handed back first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ....exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    QueueClosedError,
    TypeValidationError,
)
from ...message import check_fields as check_message_fields
from ...message import fields_ok
from ...states import KernelState
from ...telemetry import LatencyRecorder, PyLatencyRecorder
from .. import check_actor_kind
from ..contract import Capabilities, TierWorker
from .context import ThreadedKernelContext, wrong_type
from .sync_queue import SPSCQueue, SyncQueue

__all__ = ("ThreadWorker", "ThreadedKernelConfig", "ThreadedKernelContext", "ThreadedKernelFunc")

ThreadedKernelFunc = Callable[[ThreadedKernelContext], Any]
Latencies = tuple[int, int, int, int, list[tuple[int, int]]]

#: The lowest priority `offer` passes ahead of what the actor was handed and has not
#: taken: the HIGH (160..223) and SYSTEM (224..255) bands.
URGENT_PRIORITY = 160

_CREATED = KernelState.CREATED
_ACTIVE = KernelState.ACTIVE
_TERMINATING = KernelState.TERMINATING
_TERMINATED = KernelState.TERMINATED

# what a caller can do about a worker in each state
_STATE_HINTS = {
    _CREATED: "call start() first or use it as a context manager",
    _TERMINATING: "it is stopping",
    _TERMINATED: "it has stopped",
}


def _urgent(msg: Any) -> bool:
    """Whether ``msg`` is of priority `URGENT_PRIORITY` or more."""
    p = getattr(msg, "priority", None)
    return p.__class__ is int and p >= URGENT_PRIORITY


@dataclass
class ThreadedKernelConfig:
    """Settings of a thread-tier worker (`ThreadWorker`, `ThreadedRingKernel`).

    Attributes:
        kernel_id: The kernel's name (errors and the thread name use it).
        input_queue_size: Inbox capacity (>= 1); ``send`` waits (or times out) when full.
        output_queue_size: Outbox capacity (>= 1); the actor's ``ctx.send`` waits when full.
        use_spsc: Use the mutex-free `SPSCQueue` (default) instead of `SyncQueue`.
        thread_name: Name of the actor thread; default ``"pydotcompute-<kernel_id>"``.
        daemon: Run the actor in a daemon thread (an actor stuck in user code cannot keep
            the interpreter alive at exit).
        record_latency: Time each message the actor handles (from taking it to asking for
            the next); `ThreadWorker.drain_latencies` hands the statistics over.
        check_fields: ``send`` and the actor's ``ctx.send`` refuse a message whose field
            values are not of their annotated types (``TypeValidationError``, at the
            call), as a hop that decodes bytes would; False passes messages as they are.
    """

    kernel_id: str
    input_queue_size: int = 4096
    output_queue_size: int = 4096
    use_spsc: bool = True
    thread_name: str | None = None
    daemon: bool = True
    record_latency: bool = False
    check_fields: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.kernel_id, str) or not self.kernel_id:
            raise InvalidConfigurationError(
                f"kernel_id must be a non-empty string, got {self.kernel_id!r}"
            )
        for name in ("input_queue_size", "output_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidConfigurationError(
                    f"{name} of kernel {self.kernel_id!r} must be an int >= 1, got {value!r}"
                )
        if type(self.check_fields) is not bool:
            raise InvalidConfigurationError(
                f"check_fields of kernel {self.kernel_id!r} must be True or False, "
                f"got {self.check_fields!r}"
            )


def _acquire(lock: threading.Lock, timeout: float | None) -> bool:
    if timeout is None:
        return lock.acquire()
    if timeout <= 0:
        return lock.acquire(False)
    return lock.acquire(True, timeout)


class ThreadWorker(TierWorker):
    """A persistent actor in a thread of its own, behind the tier contract.

    Args:
        kernel_id: The kernel's name.
        kernel_func: ``fn(ctx)``, a plain (not async) function; it usually loops until
            ``ctx.should_terminate``.
        config: Queue sizes and thread settings; defaults to ``ThreadedKernelConfig(kernel_id)``.
        input_type: When given, `put`/`offer` refuse other types (``TypeValidationError``).
        output_type: When given, ``ctx.send`` refuses other types.
    """

    #: Plain-function actors; pools; a room the bridge may widen (`set_room`); the
    #: latencies its actor took (`drain_latencies`); a short `poll_replies` emptied the
    #: outbox and armed its burst waker (`SPSCQueue` arms it there; `SyncQueue` runs its
    #: wakers at every put).
    CAPABILITIES = Capabilities(
        replicas=True, resize=True, telemetry_refresh=True, short_poll_rearms=True
    )

    def __init__(
        self,
        kernel_id: str,
        kernel_func: ThreadedKernelFunc,
        *,
        config: ThreadedKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
    ) -> None:
        if config is None:
            config = ThreadedKernelConfig(kernel_id)
        elif config.kernel_id != kernel_id:
            raise InvalidConfigurationError(
                f"kernel id {kernel_id!r} does not match its config's {config.kernel_id!r}"
            )
        if not callable(kernel_func):
            raise TypeValidationError(
                f"kernel {kernel_id!r} needs a callable actor taking one context argument, "
                f"got {type(kernel_func).__name__}"
            )
        check_actor_kind(kernel_id, "thread", kernel_func, "sync")
        self._kernel_id = kernel_id
        self._config = config
        self._func = kernel_func
        self._input_type = input_type
        self._output_type = output_type
        self._check_fields = config.check_fields
        # whether `put`/`offer` check what they are given (a host that admits every message
        # before handing it over turns this off: `HostedThreadWorker`)
        self._admits = input_type is not None or config.check_fields
        queue_type: type[SPSCQueue[Any]] | type[SyncQueue[Any]]
        queue_type = SPSCQueue if config.use_spsc else SyncQueue
        self._inbox: SPSCQueue[Any] | SyncQueue[Any] = queue_type(
            config.input_queue_size, name=f"the inbox of kernel {kernel_id!r}"
        )
        self._outbox: SPSCQueue[Any] | SyncQueue[Any] = queue_type(
            config.output_queue_size, name=f"the outbox of kernel {kernel_id!r}"
        )
        # the inbox's urgent lane `offer` uses (an SPSC inbox has one)
        self._put_urgent: Callable[[Any], bool] | None = getattr(self._inbox, "put_urgent", None)
        self._state = _CREATED
        self._error: BaseException | None = None
        self._state_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._stop = threading.Event()
        self._finished = threading.Event()
        # a runtime's callers and where their replies go (`hand_replies_to_callers`)
        self._callers: tuple[Mapping[Any, Any], Callable[[Any, Any], None]] | None = None
        self._thread: threading.Thread | None = None
        self._context: ThreadedKernelContext | None = None
        self._unprocessed: list[Any] = []
        self._taken_n = 0  # how many of ``_unprocessed`` take_undelivered handed out
        self._failed_on: Any = None  # the message in the actor's hands when it raised
        self._started_at = 0.0
        self._stopped_at = 0.0
        self._recorder: PyLatencyRecorder | None = (
            LatencyRecorder() if config.record_latency else None
        )

    # -- what it is ---------------------------------------------------------------------

    @property
    def kernel_id(self) -> str:
        """The kernel's name."""
        return self._kernel_id

    @property
    def config(self) -> ThreadedKernelConfig:
        """The configuration it was built with."""
        return self._config

    @property
    def output_type(self) -> type | None:
        """The type ``ctx.send`` accepts (None: any)."""
        return self._output_type

    @property
    def check_fields(self) -> bool:
        """Whether messages in and out have their field values checked."""
        return self._check_fields

    @property
    def state(self) -> KernelState:
        """CREATED, ACTIVE (the thread runs), TERMINATING (stop asked), TERMINATED."""
        return self._state

    @property
    def is_running(self) -> bool:
        """True while the actor thread runs and no stop was requested."""
        return self._state is _ACTIVE

    @property
    def failure(self) -> BaseException | None:
        """The actor's exception when it raised, else None."""
        return self._error

    @property
    def failed_on(self) -> Any:
        """The message the actor raised on (in its hands then), else None."""
        return self._failed_on

    @property
    def inbox(self) -> SPSCQueue[Any] | SyncQueue[Any]:
        """The inbox queue (``add_waker(cb, when="writable")`` runs ``cb`` as room frees)."""
        return self._inbox

    @property
    def outbox(self) -> SPSCQueue[Any] | SyncQueue[Any]:
        """The outbox queue (``add_waker(cb)`` runs ``cb`` when a reply arrives)."""
        return self._outbox

    @property
    def stop_signal(self) -> threading.Event:
        """Set once a stop is requested (the actor's context waits on it); read only."""
        return self._stop

    @property
    def latency_recorder(self) -> PyLatencyRecorder | None:
        """Times the actor's messages when ``config.record_latency`` (else None)."""
        return self._recorder

    @property
    def thread(self) -> threading.Thread | None:
        """The actor thread once started."""
        return self._thread

    @property
    def pending_input(self) -> int:
        """Messages handed over and not yet taken by the actor."""
        return len(self._inbox)

    @property
    def is_idle(self) -> bool:
        """True when the actor waits for a message and no message or reply is queued."""
        ctx = self._context
        if self._state is not _ACTIVE or ctx is None:
            return True
        return not ctx.handling and not len(self._inbox) and not len(self._outbox)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the actor thread (CREATED -> ACTIVE).

        Raises:
            KernelStateError: it was already started (a worker runs once).
            KernelFailedError: the thread could not be started (the reason chained).
        """
        with self._state_lock:
            if self._state is not _CREATED:
                raise KernelStateError(
                    self._kernel_id,
                    self._state,
                    "start",
                    "a kernel runs once; create a new one to run again",
                )
            self._context = self._new_context()
            self._thread = threading.Thread(
                target=self._run,
                name=self._config.thread_name or f"pydotcompute-{self._kernel_id}",
                daemon=self._config.daemon,
            )
            self._state = _ACTIVE
            self._started_at = time.monotonic()
        try:
            self._thread.start()
        except RuntimeError as exc:  # no thread to be had: the actor never ran
            self._thread = None
            self._finish(exc)
            raise KernelFailedError(self._kernel_id, exc) from exc

    def _new_context(self) -> ThreadedKernelContext:
        """The context the actor will get (`start` builds it once; a subclass may build
        another kind)."""
        ctx = ThreadedKernelContext(self)
        if self._callers is not None:
            ctx.answer_callers(*self._callers)
        return ctx

    def hand_replies_to_callers(
        self, waiters: Mapping[Any, Any], deliver: Callable[[Any, Any], None]
    ) -> bool:
        """`TierWorker.hand_replies_to_callers`: the plain context hands a caller's reply
        to ``deliver`` (one hop to the loop) instead of the outbox, which the loop would
        poll. Before `start` only (the context is built once)."""
        if self._state is not _CREATED:
            return False
        self._callers = (waiters, deliver)
        return True

    def _run(self) -> None:
        ctx = self._context
        assert ctx is not None
        error: BaseException | None = None
        try:
            self._func(ctx)
        except QueueClosedError as exc:
            if not self._stop.is_set():
                error = exc  # a closed queue that is not our stop: the actor failed
        except BaseException as exc:  # the actor's failure is data, reported to callers
            error = exc
        rec = self._recorder
        if error is not None and ctx.handling:
            # the message it raised on was not finished: handed back first
            ctx.handling = False
            self._failed_on = ctx.current
            self._unprocessed.append(ctx.current)
            if rec is not None:
                rec.cancel()
        elif rec is not None:
            rec.idle()  # returning finishes the message it held
        self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        with self._state_lock:
            self._error = error
            self._state = _TERMINATED
            self._stopped_at = time.monotonic()
        self._unprocessed.extend(self._inbox.drain())
        self._inbox.shutdown()
        self._outbox.shutdown()
        self._stop.set()
        self._finished.set()

    def request_stop(self) -> None:
        """Ask the actor to finish what it was given, without waiting (see `stop`)."""
        with self._state_lock:
            state = self._state
            if state is _CREATED:  # never started: nothing will run
                self._state = _TERMINATED
                self._stop.set()
                self._inbox.shutdown()
                self._outbox.shutdown()
                self._finished.set()
                return
            if state is _ACTIVE:
                self._state = _TERMINATING
        self._stop.set()
        self._inbox.shutdown()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop gracefully: refuse new messages, let the actor drain the inbox, join it.

        Args:
            timeout: Seconds to wait for the actor to finish. After that, whatever is still
                queued moves to `unprocessed` and the worker waits a little longer.

        Returns:
            True when the actor thread has ended (also if it had already ended or never
            started); False when it is stuck in user code (a daemon thread by default).
        """
        self.request_stop()
        thread = self._thread
        if thread is None:
            return True
        if thread is threading.current_thread():
            return False  # called by the actor itself: it ends when it returns
        thread.join(timeout)
        if thread.is_alive():
            self._unprocessed.extend(self._inbox.drain())
            thread.join(min(max(timeout, 0.0), 0.5))
        return not thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the actor thread to end without asking it to; True if it has."""
        return self._finished.wait(timeout)

    # -- messages in --------------------------------------------------------------------

    def _admit(self, msg: Any) -> None:
        """Refuse ``msg`` when it is not the ``input_type`` or its fields do not check."""
        in_t = self._input_type
        if in_t is not None and not isinstance(msg, in_t):
            raise wrong_type(self._kernel_id, msg, in_t, "expects")
        if self._check_fields and not fields_ok(msg):
            check_message_fields(msg, self._kernel_id, "expects")

    def put(self, msg: Any, timeout: float | None = None) -> bool:
        """Queue ``msg`` for the actor, waiting while the inbox is full.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            KernelStateError: the actor is not running (`KernelFailedError` if it failed).
            TypeValidationError: ``msg`` is not the ``input_type``.
        """
        if self._state is not _ACTIVE:
            raise self._state_error("send to")
        if self._admits:
            self._admit(msg)
        lock = self._send_lock
        if not _acquire(lock, timeout):
            return False
        try:
            return self._inbox.put(msg, timeout)
        except QueueClosedError:
            err = self._state_error("send to")
            raise err from err.__cause__
        finally:
            lock.release()

    def offer(self, msg: Any) -> bool:
        """Queue ``msg`` if the inbox has room; False when full (errors as `put`). One of
        priority `URGENT_PRIORITY` or more goes into an SPSC inbox's urgent lane."""
        if self._state is not _ACTIVE:
            raise self._state_error("send to")
        if self._admits:
            self._admit(msg)
        lock = self._send_lock
        if not lock.acquire(False):
            return False
        try:
            urgent = self._put_urgent
            if urgent is not None:  # (`_urgent`, inlined: every hand-over's path)
                p = getattr(msg, "priority", None)
                if p.__class__ is int and p >= URGENT_PRIORITY:
                    return urgent(msg)
            return self._inbox.put(msg, 0)
        except QueueClosedError:
            err = self._state_error("send to")
            raise err from err.__cause__
        finally:
            lock.release()

    def offer_many(self, msgs: list[Any]) -> int:
        """Queue the prefix of ``msgs`` the inbox has room for, waking the actor once;
        returns its length. A message of the wrong type ends the prefix (raised when it
        is the first, with nothing queued)."""
        if self._state is not _ACTIVE:
            raise self._state_error("send to")
        if self._admits:
            for i, msg in enumerate(msgs):
                try:
                    self._admit(msg)
                except TypeValidationError:
                    if not i:
                        raise
                    msgs = msgs[:i]
                    break
        lock = self._send_lock
        if not lock.acquire(False):
            return 0
        try:
            urgent = self._put_urgent
            if urgent is not None and msgs and _urgent(msgs[0]):
                return self._offer_urgent_first(msgs, urgent)
            return self._inbox.put_many(msgs)
        except QueueClosedError:
            err = self._state_error("send to")
            raise err from err.__cause__
        finally:
            lock.release()

    def _offer_urgent_first(self, msgs: list[Any], urgent: Callable[[Any], bool]) -> int:
        """`offer_many` of a batch that starts with urgent messages (a batch comes in
        priority order): those into the urgent lane, the rest behind what was queued.
        A refusal or a close after the first ends the prefix there."""
        n = 0
        try:
            for msg in msgs:
                if not _urgent(msg):
                    return n + self._inbox.put_many(msgs[n:])
                if not urgent(msg):
                    return n
                n += 1
        except QueueClosedError:
            if not n:
                raise
        return n

    def set_room(self, n: int) -> bool:
        """Let the inbox hold up to ``n`` messages from now on (`SPSCQueue.resize`); the
        runtime's bridge widens it for a quick actor. Always True: a thread's inbox is
        a queue in this process.

        Raises:
            InvalidConfigurationError: ``n`` is not an int >= 1.
        """
        self._inbox.resize(n)
        return True

    def on_writable(self, callback: Callable[[], None]) -> None:
        # once a burst: after `offer` was refused, as the contract asks
        self._inbox.add_burst_waker(callback, when="writable")

    # -- messages out -------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> Any:
        """The next reply, waiting up to ``timeout`` seconds (None = until one arrives).

        Replies already sent stay readable after the actor stopped or failed.

        Returns:
            The reply, or None when the timeout expired.

        Raises:
            KernelFailedError: the actor raised and every earlier reply has been read.
            KernelStateError: the worker never started, or stopped and is drained.
        """
        if self._state is _CREATED:
            raise self._state_error("receive from")
        lock = self._recv_lock
        if not _acquire(lock, timeout):
            return None
        try:
            return self._outbox.get(timeout)
        except QueueClosedError:
            err = self._state_error("receive from")
            raise err from err.__cause__
        finally:
            lock.release()

    def poll_reply(self) -> Any:
        return self.get(0)

    def poll_replies(self, max_count: int) -> list[Any]:
        """Up to ``max_count`` replies, oldest first, without waiting (errors as `get`)."""
        if self._state is _CREATED:
            raise self._state_error("receive from")
        lock = self._recv_lock
        if not lock.acquire(False):
            return []
        try:
            return self._outbox.get_many(max_count)
        except QueueClosedError:
            err = self._state_error("receive from")
            raise err from err.__cause__
        finally:
            lock.release()

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        # once a burst: the first reply after a poll found none (callers poll until none)
        outbox = self._outbox
        outbox.add_burst_waker(callback)
        return lambda: outbox.remove_burst_waker(callback)

    def drain_replies(self) -> list[Any]:
        """Every reply readable now, oldest first, without waiting or raising."""
        with self._recv_lock:
            return list(self._outbox.drain())

    def on_late_reply(self, callback: Callable[[], None]) -> None:
        self._outbox.add_waker(callback)
        callback()  # any that arrived before the waker was in place

    def drain_latencies(self) -> Latencies | None:
        """The latencies timed since the last call, as `LatencyRecorder.drain` gives them
        (None when nothing was timed, or ``config.record_latency`` is off)."""
        rec = self._recorder
        return None if rec is None else rec.drain()

    # -- what is left -------------------------------------------------------------------

    def unprocessed(self) -> list[Any]:
        """Messages sent but never finished by the actor (stop timeout, failure)."""
        return list(self._unprocessed)

    def take_undelivered(self) -> list[Any]:
        """The messages the actor did not finish, oldest first; each is returned once.

        Filled by a stop whose grace period ran out and by a failure (the message the
        actor raised on first); `unprocessed` keeps reporting them. A thread cannot be
        interrupted, so a message the actor still holds is not here: its reply (if any)
        arrives late, on the outbox.
        """
        with self._state_lock:
            if self._finished.is_set():  # a send that raced the actor's end stays queued
                self._unprocessed.extend(self._inbox.drain())
            out = self._unprocessed[self._taken_n :]
            self._taken_n = len(self._unprocessed)
        return out

    # -- reports ------------------------------------------------------------------------

    def _state_error(self, operation: str) -> KernelStateError:
        if self._error is not None:
            err = KernelFailedError(self._kernel_id, self._error)
            err.__cause__ = self._error
            return err
        hint = _STATE_HINTS.get(self._state, "")
        return KernelStateError(self._kernel_id, self._state, operation, hint)

    def statistics(self) -> dict[str, Any]:
        """State, failure and queue counters in one dictionary."""
        end = self._stopped_at or time.monotonic()
        return {
            "kernel_id": self._kernel_id,
            "state": self._state.value,
            "failed": self._error is not None,
            "error": repr(self._error) if self._error is not None else None,
            "uptime_seconds": end - self._started_at if self._started_at else 0.0,
            "unprocessed": len(self._unprocessed),
            "inbox": self._inbox.get_stats(),
            "outbox": self._outbox.get_stats(),
        }

    def __repr__(self) -> str:
        note = f" failed: {self._error!r}" if self._error is not None else ""
        return f"<{type(self).__name__} {self._kernel_id!r} {self._state.name}{note}>"
