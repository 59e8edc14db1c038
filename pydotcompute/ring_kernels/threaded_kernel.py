"""Tier 2: a ring kernel whose actor runs in a dedicated thread.

Use it for actors that block (file or socket I/O, C code that releases the GIL) and would
stall an event loop. The actor is a plain function taking a `ThreadedKernelContext`:

```python
def worker(ctx):
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.1)
        if msg is not None:
            ctx.send(Reply(value=msg.value * 2))

with ThreadedRingKernel("worker", worker) as kernel:
    kernel.send(Request(value=21))
    print(kernel.receive(timeout=1.0).value)
```

Design notes:
- Inbox and outbox are `SPSCQueue` (default)
  or `SyncQueue`. The kernel thread is the
  only consumer of the inbox and the only producer of the outbox; callers of ``send`` and
  ``receive`` on the kernel serialize through one lock per direction, which keeps the SPSC
  contract with any number of caller threads.
- Graceful stop drains: ``stop()`` shuts the inbox, so ``ctx.should_terminate`` turns True
  only once the inbox is empty, and a ``receive`` blocked on an empty, stopped inbox raises
  ``QueueClosedError``, which ends the actor cleanly. If the actor does not finish within
  the timeout, what is still queued is moved to `ThreadedRingKernel.unprocessed`
  (counted as dropped), never silently lost. Replies stay receivable after the stop.
- Failure: an exception escaping the actor is stored in ``error``, the state becomes
  STOPPED with ``failed`` True, the outbox is shut down, and every caller blocked in (or
  later calling) ``receive`` gets `KernelFailedError` once
  the replies sent before the failure are drained.
- Length: the kernel, its context and the pool share one file because the pool is built
  on the kernel's private stop signal and outbox wakers.
- Hosting from an event loop: ``send_nowait``/``receive_nowait`` never block, and
  ``kernel.outbox.add_waker(cb)`` / ``kernel.inbox.add_waker(cb, when="writable")`` run
  ``cb`` in the kernel thread whenever a reply arrives or space frees up (wrap it with
  ``loop.call_soon_threadsafe``), so an async adapter waits without a thread of its own.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any

from ..exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    QueueClosedError,
)
from ._kernel_common import (
    KernelBase,
    check_actor,
    check_kernel_config,
    check_type,
    resolve_config,
    stamp_reply,
)
from .sync_queue import SPSCQueue, SyncQueue
from .telemetry import LatencyRecorder, PyLatencyRecorder

__all__ = (
    "ThreadedKernelConfig",
    "ThreadedKernelContext",
    "ThreadedKernelPool",
    "ThreadedKernelState",
    "ThreadedRingKernel",
)

ThreadedKernelFunc = Callable[["ThreadedKernelContext"], Any]


class ThreadedKernelState(enum.Enum):
    """Lifecycle of a threaded (or process) kernel: CREATED -> RUNNING -> STOPPING -> STOPPED.

    A kernel whose actor raised is STOPPED with ``failed`` True and ``error`` set.
    """

    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass
class ThreadedKernelConfig:
    """Settings of a `ThreadedRingKernel`.

    Attributes:
        kernel_id: The kernel's name (errors and the thread name use it).
        input_queue_size: Inbox capacity (>= 1); ``send`` waits (or times out) when full.
        output_queue_size: Outbox capacity (>= 1); the actor's ``ctx.send`` waits when full.
        use_spsc: Use the mutex-free `SPSCQueue` (default) instead of `SyncQueue`.
        thread_name: Name of the actor thread; default ``"pydotcompute-<kernel_id>"``.
        daemon: Run the actor in a daemon thread (an actor stuck in user code cannot keep
            the interpreter alive at exit).
        record_latency: Time each message the actor handles (from taking it to asking for
            the next); `ThreadedRingKernel.drain_latencies` hands the statistics over.
    """

    kernel_id: str
    input_queue_size: int = 4096
    output_queue_size: int = 4096
    use_spsc: bool = True
    thread_name: str | None = None
    daemon: bool = True
    record_latency: bool = False

    def __post_init__(self) -> None:
        check_kernel_config(self)


def _acquire(lock: threading.Lock, timeout: float | None) -> bool:
    if timeout is None:
        return lock.acquire()
    return lock.acquire(True, max(timeout, 0.0))


class ThreadedKernelContext:
    """What a threaded actor sees: its inbox, its outbox and the stop signal.

    Every method is called from the actor's own thread.
    """

    __slots__ = (
        "_current",
        "_inbox",
        "_kernel",
        "_outbox",
        "_output_type",
        "_rec",
        "handling",
        "kernel_id",
    )

    def __init__(self, kernel: ThreadedRingKernel) -> None:
        self._kernel = kernel
        self.kernel_id = kernel.kernel_id
        self._inbox = kernel._inbox
        self._outbox = kernel._outbox
        self._output_type = kernel._output_type
        self._current: Any = None  # the last message received: replies are correlated to it
        self._rec = kernel.latency_recorder  # times each message (None: not timed)
        #: True from the moment the actor takes a message until it asks for the next one
        #: (read by hosts to tell an idle actor from a busy one).
        self.handling = False

    @property
    def should_terminate(self) -> bool:
        """True once a stop was requested *and* the inbox is drained."""
        return self._kernel._stop_event.is_set() and not self._inbox

    @property
    def is_active(self) -> bool:
        """True until a stop is requested."""
        return not self._kernel._stop_event.is_set()

    def receive(self, timeout: float | None = None) -> Any:
        """The next message, waiting up to ``timeout`` seconds (None = until one arrives).

        Returns:
            The message, or None when the timeout expired.

        Raises:
            QueueClosedError: the kernel is stopping and the inbox is drained (letting it
                escape ends the actor cleanly).
        """
        self.handling = False
        rec = self._rec
        if rec is not None:
            rec.idle()  # asking for the next message finishes the previous one
        msg = self._inbox.get(timeout)
        if msg is not None:
            self._current = msg
            self.handling = True
            if rec is not None:
                rec.took()
        return msg

    def receive_nowait(self) -> Any:
        """The next message or None, without waiting."""
        self.handling = False
        rec = self._rec
        if rec is not None:
            rec.idle()
        msg = self._inbox.get(0)
        if msg is not None:
            self._current = msg
            self.handling = True
            if rec is not None:
                rec.took()
        return msg

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Put a reply into the outbox, waiting while it is full.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            TypeValidationError: ``msg`` is not the kernel's ``output_type``.
        """
        if self._output_type is not None and not isinstance(msg, self._output_type):
            check_type(self.kernel_id, msg, self._output_type, "must send")
        stamp_reply(msg, self._current)
        return self._outbox.put(msg, timeout)

    def send_nowait(self, msg: Any) -> bool:
        """Put a reply into the outbox if there is room; False when full."""
        return self.send(msg, 0)

    def wait_shutdown(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested; True if it was, False on timeout."""
        return self._kernel._stop_event.wait(timeout)


class ThreadedRingKernel(KernelBase[ThreadedKernelConfig, ThreadedKernelState]):
    """A persistent actor in its own thread, driven with ``send``/``receive``.

    Args:
        kernel_id: The kernel's name.
        kernel_func: ``fn(ctx)``, a plain (not async) function; it usually loops until
            ``ctx.should_terminate``.
        config: Queue sizes and thread settings; defaults to ``ThreadedKernelConfig(kernel_id)``.
        input_type: When given, ``send`` refuses other types (``TypeValidationError``).
        output_type: When given, ``ctx.send`` refuses other types.
    """

    _CREATED = ThreadedKernelState.CREATED
    _RUNNING = ThreadedKernelState.RUNNING

    def __init__(
        self,
        kernel_id: str,
        kernel_func: ThreadedKernelFunc,
        *,
        config: ThreadedKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
    ) -> None:
        config = resolve_config(kernel_id, config, ThreadedKernelConfig)
        check_actor(
            kernel_id,
            kernel_func,
            "ThreadedRingKernel runs plain functions",
            "; use RingKernelRuntime (tier 1) for async actors or make it a plain def",
        )
        super().__init__(kernel_id, config, input_type, output_type)
        self._func = kernel_func
        queue_type: type[SPSCQueue[Any]] | type[SyncQueue[Any]]
        queue_type = SPSCQueue if config.use_spsc else SyncQueue
        self._inbox: SPSCQueue[Any] | SyncQueue[Any] = queue_type(
            config.input_queue_size, name=f"the inbox of kernel {kernel_id!r}"
        )
        self._outbox: SPSCQueue[Any] | SyncQueue[Any] = queue_type(
            config.output_queue_size, name=f"the outbox of kernel {kernel_id!r}"
        )
        self._stop_event = threading.Event()
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        self._context: ThreadedKernelContext | None = None
        self._taken_n = 0  # how many of ``_unprocessed`` take_undelivered handed out
        #: times the actor's messages when ``config.record_latency`` (else None)
        self.latency_recorder: PyLatencyRecorder | None = (
            LatencyRecorder() if config.record_latency else None
        )

    # -- properties -------------------------------------------------------------------

    @property
    def inbox(self) -> SPSCQueue[Any] | SyncQueue[Any]:
        """The inbox queue (for adapters: ``add_waker(cb, when="writable")``)."""
        return self._inbox

    @property
    def outbox(self) -> SPSCQueue[Any] | SyncQueue[Any]:
        """The outbox queue (for adapters: ``add_waker(cb)`` fires when a reply arrives)."""
        return self._outbox

    @property
    def is_idle(self) -> bool:
        """True when the actor waits for a message and no message or reply is queued."""
        ctx = self._context
        if self._state is not ThreadedKernelState.RUNNING or ctx is None:
            return True
        return not ctx.handling and not len(self._inbox) and not len(self._outbox)

    @property
    def thread(self) -> threading.Thread | None:
        """The actor thread once started."""
        return self._thread

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> ThreadedRingKernel:
        """Start the actor thread (CREATED -> RUNNING); returns the kernel.

        Raises:
            KernelStateError: the kernel was already started.
        """
        with self._state_lock:
            if self._state is not ThreadedKernelState.CREATED:
                raise self._start_error()
            self._thread = threading.Thread(
                target=self._run,
                name=self._config.thread_name or f"pydotcompute-{self._kernel_id}",
                daemon=self._config.daemon,
            )
            self._state = ThreadedKernelState.RUNNING
            self._started_at = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        ctx = self._context = ThreadedKernelContext(self)
        error: BaseException | None = None
        try:
            self._func(ctx)
        except QueueClosedError as exc:
            if not self._stop_event.is_set():
                error = exc  # a closed queue that is not our stop: the actor failed
        except BaseException as exc:  # the actor's failure is data, reported to callers
            error = exc
        rec = self.latency_recorder
        if error is not None and ctx.handling:
            # the message it raised on was not finished: handed back first
            ctx.handling = False
            self._unprocessed.append(ctx._current)
            if rec is not None:
                rec.cancel()
        elif rec is not None:
            rec.idle()  # returning finishes the message it held
        self._finish(error)

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        """The latencies timed since the last call, as `LatencyRecorder.drain` gives them
        (None when nothing was timed, or ``config.record_latency`` is off)."""
        rec = self.latency_recorder
        return None if rec is None else rec.drain()

    def _finish(self, error: BaseException | None) -> None:
        with self._state_lock:
            self._error = error
            self._state = ThreadedKernelState.STOPPED
            self._stopped_at = time.monotonic()
        leftover = self._inbox.drain()
        self._unprocessed.extend(leftover)
        self._inbox.shutdown()
        self._outbox.shutdown()
        self._stop_event.set()
        self._finished.set()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop gracefully: refuse new messages, let the actor drain the inbox, join it.

        Args:
            timeout: Seconds to wait for the actor to finish. After that, whatever is still
                queued moves to `unprocessed` and the kernel waits a little longer.

        Returns:
            True when the actor thread has ended (also if it had already ended or never
            started); False when it is stuck in user code (it is a daemon thread by default).
        """
        with self._state_lock:
            state = self._state
            if state is ThreadedKernelState.CREATED:
                self._state = ThreadedKernelState.STOPPED
                self._stop_event.set()
                self._inbox.shutdown()
                self._outbox.shutdown()
                self._finished.set()
                return True
            if state is ThreadedKernelState.RUNNING:
                self._state = ThreadedKernelState.STOPPING
        self._stop_event.set()
        self._inbox.shutdown()
        thread = self._thread
        assert thread is not None
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

    @property
    def pending_input(self) -> int:
        """Messages sent and not yet taken by the actor (at most ``input_queue_size``)."""
        return len(self._inbox)

    def take_undelivered(self) -> list[Any]:
        """The messages the actor never took, oldest first; each is returned only once.

        Filled by a stop whose grace period ran out and by a failure (see
        `unprocessed`, which keeps reporting them); every later call returns ``[]``.
        A thread cannot be interrupted, so a message the actor still holds is not here:
        its reply (if any) arrives late, on the outbox.
        """
        with self._state_lock:
            if self._finished.is_set():  # a send that raced the actor's end stays queued
                self._unprocessed.extend(self._inbox.drain())
            out = self._unprocessed[self._taken_n :]
            self._taken_n = len(self._unprocessed)
        return out

    def drain_replies(self) -> list[Any]:
        """Every reply readable now, oldest first, without waiting or raising for failures."""
        with self._recv_lock:
            return list(self._outbox.drain())

    # -- caller side ------------------------------------------------------------------

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Queue ``msg`` for the actor, waiting while the inbox is full.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            KernelStateError: the kernel is not running (``KernelFailedError`` if it failed).
            TypeValidationError: ``msg`` is not the kernel's ``input_type``.
        """
        if self._state is not ThreadedKernelState.RUNNING:
            raise self._state_error("send to")
        if self._input_type is not None and not isinstance(msg, self._input_type):
            check_type(self._kernel_id, msg, self._input_type, "expects")
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

    def receive(self, timeout: float | None = None) -> Any:
        """The next reply, waiting up to ``timeout`` seconds (None = until one arrives).

        Replies already sent stay receivable after the kernel stopped or failed.

        Returns:
            The reply, or None when the timeout expired.

        Raises:
            KernelFailedError: the actor raised and every earlier reply has been received.
            KernelStateError: the kernel never started, or stopped and is drained.
        """
        if self._state is ThreadedKernelState.CREATED:
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

    def statistics(self) -> dict[str, Any]:
        """State, error and queue counters in one dictionary."""
        return {
            **self._statistics_head(),
            "uptime_seconds": self._uptime(),
            "unprocessed": len(self._unprocessed),
            "inbox": self._inbox.get_stats(),
            "outbox": self._outbox.get_stats(),
        }

    def __repr__(self) -> str:
        return f"<ThreadedRingKernel {self._kernel_id!r} {self._state.name}{self._failure_note()}>"


class ThreadedKernelPool:
    """Several threaded kernels running the same actor, fed round-robin.

    Args:
        prefix: Worker ids are ``"<prefix>_0"``, ``"<prefix>_1"``, ...
        kernel_func: The actor every worker runs.
        num_workers: How many workers (>= 1).
        **config: ``ThreadedKernelConfig`` fields (``input_queue_size``, ``use_spsc``, ...)
            plus ``input_type``/``output_type``.
    """

    def __init__(
        self,
        prefix: str,
        kernel_func: ThreadedKernelFunc,
        num_workers: int = 4,
        **config: Any,
    ) -> None:
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise InvalidConfigurationError(
                f"pool {prefix!r} needs num_workers >= 1, got {num_workers!r}"
            )
        input_type = config.pop("input_type", None)
        output_type = config.pop("output_type", None)
        known = {f.name for f in fields(ThreadedKernelConfig)} - {"kernel_id", "thread_name"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise InvalidConfigurationError(
                f"pool {prefix!r}: unknown option(s) {unknown}; "
                f"valid: {sorted(known | {'input_type', 'output_type'})}"
            )
        self._prefix = prefix
        self._workers = [
            ThreadedRingKernel(
                f"{prefix}_{i}",
                kernel_func,
                config=ThreadedKernelConfig(f"{prefix}_{i}", **config),
                input_type=input_type,
                output_type=output_type,
            )
            for i in range(num_workers)
        ]
        self._send_counter = itertools.count()
        self._recv_start = 0
        self._recv_lock = threading.Lock()
        self._waiting = False
        self._signal = threading.Lock()
        self._signal.acquire()
        self._reported: set[str] = set()
        for worker in self._workers:
            worker.outbox.add_waker(self._wake)

    def _wake(self) -> None:
        if self._waiting:
            self._waiting = False
            try:
                self._signal.release()
            except RuntimeError:
                pass  # a wake-up is already pending

    @property
    def workers(self) -> list[ThreadedRingKernel]:
        """The worker kernels, in id order."""
        return list(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def __iter__(self) -> Iterator[ThreadedRingKernel]:
        return iter(self._workers)

    def __getitem__(self, index: int) -> ThreadedRingKernel:
        return self._workers[index]

    def start_all(self) -> None:
        """Start every worker that has not started yet."""
        for worker in self._workers:
            if worker.state is ThreadedKernelState.CREATED:
                worker.start()

    def stop_all(self, timeout: float = 5.0) -> bool:
        """Stop every worker (in parallel: all are asked first); True if all ended."""
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker._stop_event.set()
            worker.inbox.shutdown()
        results = [w.stop(max(deadline - time.monotonic(), 0.0)) for w in self._workers]
        return all(results)  # every worker is stopped, even after one fails to

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Send ``msg`` to the next running worker (round-robin).

        Raises:
            KernelStateError: no worker is running.
        """
        n = len(self._workers)
        for _ in range(n):
            worker = self._workers[next(self._send_counter) % n]
            if worker.state is ThreadedKernelState.RUNNING:
                return worker.send(msg, timeout)
        raise KernelStateError(
            self._prefix, "not running", "send to pool", "no worker is running; start_all()"
        )

    def receive_any(self, timeout: float | None = None) -> Any:
        """The next reply from whichever worker has one, waiting on all of them.

        Returns:
            A reply, or None when the timeout expired.

        Raises:
            KernelFailedError: a worker failed (reported once per worker, after its earlier
                replies); later calls keep serving the other workers.
            KernelStateError: every worker has stopped and been drained.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not _acquire(self._recv_lock, timeout):
            return None
        try:
            while True:
                self._waiting = True  # announce before scanning: a put now wakes us
                msg, failure, all_done = self._scan()
                if msg is not None or failure is not None or all_done:
                    self._waiting = False
                    if failure is not None:
                        raise failure
                    if all_done:
                        raise KernelStateError(
                            self._prefix,
                            "stopped",
                            "receive from pool",
                            "every worker has stopped and been drained",
                        )
                    return msg
                if deadline is None:
                    self._signal.acquire()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._signal.acquire(True, remaining):
                        self._waiting = False
                        return None
        finally:
            self._recv_lock.release()

    def _scan(self) -> tuple[Any, BaseException | None, bool]:
        n = len(self._workers)
        start = self._recv_start
        done = 0
        for k in range(n):
            worker = self._workers[(start + k) % n]
            try:
                msg = worker.receive_nowait()
            except KernelFailedError as exc:
                if worker.kernel_id not in self._reported:
                    self._reported.add(worker.kernel_id)
                    return None, exc, False
                done += 1
                continue
            except KernelStateError:
                done += 1
                continue
            if msg is not None:
                self._recv_start = (start + k + 1) % n
                return msg, None, False
        return None, None, done == n

    def __enter__(self) -> ThreadedKernelPool:
        self.start_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def __repr__(self) -> str:
        running = sum(w.is_running for w in self._workers)
        return f"<ThreadedKernelPool {self._prefix!r} {running}/{len(self._workers)} running>"
