"""What a thread-tier actor sees: `ThreadedKernelContext`.

Design notes:
- The context is built from what a `ContextSource` exposes (the worker's queues, its stop
  signal and its latency recorder), so this module does not import the worker, and the
  worker reads the context only through public attributes (``handling``, ``current``).
- ``receive`` and ``receive_nowait`` are written out separately: they are the actor's
  per-message path.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from ....exceptions import TypeValidationError
from ...message import stamp_reply  # correlates a reply to the request being handled
from ...telemetry import PyLatencyRecorder
from .sync_queue import SPSCQueue, SyncQueue

__all__ = ("ContextSource", "ThreadedKernelContext", "wrong_type")


class ContextSource(Protocol):
    """What a context is built from (a `ThreadWorker` provides it)."""

    @property
    def kernel_id(self) -> str: ...

    @property
    def inbox(self) -> SPSCQueue[Any] | SyncQueue[Any]: ...

    @property
    def outbox(self) -> SPSCQueue[Any] | SyncQueue[Any]: ...

    @property
    def output_type(self) -> type | None: ...

    @property
    def stop_signal(self) -> threading.Event: ...

    @property
    def latency_recorder(self) -> PyLatencyRecorder | None: ...


def wrong_type(kernel_id: str, msg: object, expected: type, what: str) -> TypeValidationError:
    """The error for ``msg`` that is not an ``expected`` (``what``: "expects", "must send")."""
    return TypeValidationError(
        f"kernel {kernel_id!r} {what} {expected.__name__}, got {type(msg).__name__}"
    )


class ThreadedKernelContext:
    """What a thread-tier actor sees: its inbox, its outbox and the stop signal.

    Every method is called from the actor's own thread.
    """

    __slots__ = (
        "_current",
        "_inbox",
        "_outbox",
        "_output_type",
        "_rec",
        "_stop",
        "handling",
        "kernel_id",
    )

    def __init__(self, worker: ContextSource) -> None:
        self.kernel_id = worker.kernel_id
        self._inbox = worker.inbox
        self._outbox = worker.outbox
        self._output_type = worker.output_type
        self._stop = worker.stop_signal
        self._current: Any = None  # the last message received: replies are correlated to it
        self._rec = worker.latency_recorder  # times each message (None: not timed)
        #: True from the moment the actor takes a message until it asks for the next one
        #: (read by hosts to tell an idle actor from a busy one).
        self.handling = False

    @property
    def should_terminate(self) -> bool:
        """True once a stop was requested *and* the inbox is drained."""
        return self._stop.is_set() and not self._inbox

    @property
    def is_active(self) -> bool:
        """True until a stop is requested."""
        return not self._stop.is_set()

    @property
    def current(self) -> Any:
        """The message the actor took last (None before the first); replies answer it."""
        return self._current

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
            raise wrong_type(self.kernel_id, msg, self._output_type, "must send")
        stamp_reply(msg, self._current)
        return self._outbox.put(msg, timeout)

    def send_nowait(self, msg: Any) -> bool:
        """Put a reply into the outbox if there is room; False when full."""
        return self.send(msg, 0)

    def wait_shutdown(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested; True if it was, False on timeout."""
        return self._stop.wait(timeout)
