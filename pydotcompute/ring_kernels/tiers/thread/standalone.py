"""The thread tier used directly, without a runtime: `ThreadedRingKernel` and its pool.

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
- `ThreadedRingKernel` is a synchronous façade over the same `ThreadWorker` the runtime
  hosts: each method forwards, so the standalone kernel and ``tier="thread"`` share one
  mechanism, one set of states and one wording of errors.
- `ThreadedKernelState` keeps the 0.2 API's state names as aliases of the shared
  `KernelState` members (RUNNING is ACTIVE, STOPPED is TERMINATED), so that
  ``kernel.state is ThreadedKernelState.RUNNING`` keeps working.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import fields
from types import TracebackType
from typing import Any, ClassVar, Self

from ....exceptions import InvalidConfigurationError, KernelFailedError, KernelStateError
from ...states import KernelState
from .sync_queue import SPSCQueue, SyncQueue
from .worker import ThreadedKernelConfig, ThreadedKernelFunc, ThreadWorker

__all__ = ("ThreadedKernelPool", "ThreadedKernelState", "ThreadedRingKernel")


_NAMES = ("CREATED", "RUNNING", "STOPPING", "STOPPED")


class _StateNames(type):
    """Lets the names be listed and looked up as an enum's are (``list(...)``, ``[name]``)."""

    def __iter__(cls) -> Iterator[KernelState]:
        return (getattr(cls, name) for name in _NAMES)

    def __len__(cls) -> int:
        return len(_NAMES)

    def __getitem__(cls, name: str) -> KernelState:
        if name not in _NAMES:
            raise KeyError(name)
        state: KernelState = getattr(cls, name)
        return state


class ThreadedKernelState(metaclass=_StateNames):
    """The 0.2 API's names for a thread-tier kernel's states, as `KernelState` members.

    CREATED -> RUNNING -> STOPPING -> STOPPED; a kernel whose actor raised is STOPPED with
    ``failed`` True and ``error`` set.
    """

    CREATED: ClassVar[KernelState] = KernelState.CREATED
    RUNNING: ClassVar[KernelState] = KernelState.ACTIVE
    STOPPING: ClassVar[KernelState] = KernelState.TERMINATING
    STOPPED: ClassVar[KernelState] = KernelState.TERMINATED


class ThreadedRingKernel:
    """A persistent actor in its own thread, driven with ``send``/``receive``.

    Args:
        kernel_id: The kernel's name.
        kernel_func: ``fn(ctx)``, a plain (not async) function taking a
            `ThreadedKernelContext`; it usually loops until ``ctx.should_terminate``.
        config: Queue sizes and thread settings; defaults to ``ThreadedKernelConfig(kernel_id)``.
        input_type: When given, ``send`` refuses other types (``TypeValidationError``).
        output_type: When given, ``ctx.send`` refuses other types.
    """

    def __init__(
        self,
        kernel_id: str,
        kernel_func: ThreadedKernelFunc,
        *,
        config: ThreadedKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
    ) -> None:
        self._worker = ThreadWorker(
            kernel_id, kernel_func, config=config, input_type=input_type, output_type=output_type
        )

    # -- properties ---------------------------------------------------------------------

    @property
    def worker(self) -> ThreadWorker:
        """The worker doing the work (the tier contract's face of this kernel)."""
        return self._worker

    @property
    def kernel_id(self) -> str:
        """The kernel's name."""
        return self._worker.kernel_id

    @property
    def config(self) -> ThreadedKernelConfig:
        """The configuration it was created with."""
        return self._worker.config

    @property
    def state(self) -> KernelState:
        """Where the kernel is: a `ThreadedKernelState` (CREATED, RUNNING, ...)."""
        return self._worker.state

    @property
    def is_running(self) -> bool:
        """True while the actor thread runs and no stop was requested."""
        return self._worker.is_running

    @property
    def error(self) -> BaseException | None:
        """Why the kernel failed: the actor's exception, or None."""
        return self._worker.failure

    @property
    def failed(self) -> bool:
        """True when the actor raised."""
        return self._worker.failure is not None

    @property
    def thread(self) -> threading.Thread | None:
        """The actor thread once started."""
        return self._worker.thread

    @property
    def inbox(self) -> SPSCQueue[Any] | SyncQueue[Any]:
        """The inbox queue (``add_waker(cb, when="writable")`` runs ``cb`` as room frees)."""
        return self._worker.inbox

    @property
    def outbox(self) -> SPSCQueue[Any] | SyncQueue[Any]:
        """The outbox queue (``add_waker(cb)`` runs ``cb`` when a reply arrives)."""
        return self._worker.outbox

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Self:
        """Start the actor thread (CREATED -> RUNNING); returns the kernel.

        Raises:
            KernelStateError: the kernel was already started.
        """
        self._worker.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop gracefully; True when the actor thread has ended (see `ThreadWorker.stop`)."""
        return self._worker.stop(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the actor thread to end without asking it to; True if it has."""
        return self._worker.join(timeout)

    # -- caller side --------------------------------------------------------------------

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Queue ``msg`` for the actor, waiting while the inbox is full.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            KernelStateError: the kernel is not running (``KernelFailedError`` if it failed).
            TypeValidationError: ``msg`` is not the kernel's ``input_type``.
        """
        return self._worker.put(msg, timeout)

    def send_nowait(self, msg: Any) -> bool:
        """Queue ``msg`` if the inbox has room; False when full (same errors as ``send``)."""
        return self._worker.offer(msg)

    def receive(self, timeout: float | None = None) -> Any:
        """The next reply, waiting up to ``timeout`` seconds (None = until one arrives).

        Replies already sent stay receivable after the kernel stopped or failed.

        Returns:
            The reply, or None when the timeout expired.

        Raises:
            KernelFailedError: the actor raised and every earlier reply has been received.
            KernelStateError: the kernel never started, or stopped and is drained.
        """
        return self._worker.get(timeout)

    def receive_nowait(self) -> Any:
        """The next reply or None, without waiting (same errors as ``receive``)."""
        return self._worker.poll_reply()

    def unprocessed(self) -> list[Any]:
        """Messages sent but never finished by the actor (stop timeout, failure)."""
        return self._worker.unprocessed()

    def take_undelivered(self) -> list[Any]:
        """What `unprocessed` holds that was not taken yet, oldest first; each once."""
        return self._worker.take_undelivered()

    def drain_replies(self) -> list[Any]:
        """Every reply readable now, oldest first, without waiting or raising."""
        return self._worker.drain_replies()

    def statistics(self) -> dict[str, Any]:
        """State, error and queue counters in one dictionary."""
        return self._worker.statistics()

    def __enter__(self) -> Self:
        if self._worker.state is KernelState.CREATED:
            self._worker.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._worker.stop()

    def __repr__(self) -> str:
        worker = self._worker
        note = f" failed: {worker.failure!r}" if worker.failure is not None else ""
        return f"<ThreadedRingKernel {worker.kernel_id!r} {worker.state.name}{note}>"


def _acquire(lock: threading.Lock, timeout: float | None) -> bool:
    if timeout is None:
        return lock.acquire()
    return lock.acquire(True, max(timeout, 0.0))


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
            if worker.state is KernelState.CREATED:
                worker.start()

    def stop_all(self, timeout: float = 5.0) -> bool:
        """Stop every worker (in parallel: all are asked first); True if all ended."""
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.worker.request_stop()
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
            if worker.is_running:
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
