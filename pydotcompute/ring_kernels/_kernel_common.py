"""What the threaded (tier 2) and process (tier 3) kernels have in common.

Design notes:
- Both tiers drive a plain-function actor with ``send``/``receive``, follow the same
  lifecycle (CREATED -> RUNNING -> STOPPING -> STOPPED, ``failed`` with ``error`` set when
  the actor raised) and word their errors the same way; only the transport differs (queues
  in one process, shared-memory rings to a child process). What does not touch the
  transport lives here: the config and actor checks, reply correlation, and
  `KernelBase` with the state properties, the state errors and the context manager.
- Each tier keeps its own public state enum (``state`` returns it), so `KernelBase`
  is generic over the config and the enum, and each tier names its CREATED and RUNNING
  members in ``_CREATED``/``_RUNNING``.
- ``send``/``receive`` stay in the tiers: they are the per-message path, written flat so
  that a message costs no call the transport does not need.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from ..exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    TypeValidationError,
)
from .message import stamp_reply  # correlates a reply to the request being handled
from .tiers.contract import check_actor_kind

__all__ = (
    "KernelBase",
    "check_actor",
    "check_kernel_config",
    "check_type",
    "resolve_config",
    "stamp_reply",
)


class _KernelConfig(Protocol):
    kernel_id: str
    input_queue_size: int
    output_queue_size: int


_ConfigT = TypeVar("_ConfigT", bound=_KernelConfig)
_StateT = TypeVar("_StateT", bound=enum.Enum)

# what a caller can do about a kernel in each state (keyed by the member name, which both
# tiers' enums share)
_STATE_HINTS = {
    "CREATED": "call start() first or use it as a context manager",
    "STOPPING": "it is stopping",
    "STOPPED": "it has stopped",
}


def check_kernel_config(config: _KernelConfig) -> None:
    """Check the fields every kernel config has: a name and two queue sizes."""
    if not isinstance(config.kernel_id, str) or not config.kernel_id:
        raise InvalidConfigurationError(
            f"kernel_id must be a non-empty string, got {config.kernel_id!r}"
        )
    for name in ("input_queue_size", "output_queue_size"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidConfigurationError(
                f"{name} of kernel {config.kernel_id!r} must be an int >= 1, got {value!r}"
            )


def resolve_config(
    kernel_id: str, config: _ConfigT | None, default: Callable[[str], _ConfigT]
) -> _ConfigT:
    """``config``, or ``default(kernel_id)`` when None; refuses a config for another kernel."""
    if config is None:
        return default(kernel_id)
    if config.kernel_id != kernel_id:
        raise InvalidConfigurationError(
            f"kernel id {kernel_id!r} does not match its config's {config.kernel_id!r}"
        )
    return config


def check_actor(kernel_id: str, kernel_func: object, runs: str, advice: str = "") -> None:
    """Refuse an actor that is not callable, or is async.

    Args:
        kernel_id: The kernel's name, for the message.
        kernel_func: The actor.
        runs: What the tier runs (``"ThreadedRingKernel runs plain functions"``).
        advice: Appended to the message about an async actor.
    """
    if not callable(kernel_func):
        raise TypeValidationError(
            f"kernel {kernel_id!r} needs a callable actor taking one context argument, "
            f"got {type(kernel_func).__name__}"
        )
    check_actor_kind(kernel_id, "", kernel_func, "sync", runs=runs, advice=advice)


def check_type(kernel_id: str, msg: object, expected: type | None, what: str) -> None:
    """Refuse ``msg`` when it is not an ``expected`` (``what``: "expects", "must send")."""
    if expected is not None and not isinstance(msg, expected):
        raise TypeValidationError(
            f"kernel {kernel_id!r} {what} {expected.__name__}, got {type(msg).__name__}"
        )


class KernelBase(Generic[_ConfigT, _StateT]):
    """The state, errors and context manager shared by the threaded and process kernels.

    A tier sets ``_CREATED``/``_RUNNING`` to its enum's members, calls
    ``KernelBase.__init__`` once its arguments are checked, and defines ``start``,
    ``stop``, ``send`` and ``receive``.
    """

    _CREATED: ClassVar[Any]
    #: Makes the send and receive locks (a subclass may use a cheaper lock, same methods).
    _IO_LOCK: ClassVar[type[Any]] = threading.Lock
    _RUNNING: ClassVar[Any]

    def __init__(
        self,
        kernel_id: str,
        config: _ConfigT,
        input_type: type | None,
        output_type: type | None,
    ) -> None:
        self._kernel_id = kernel_id
        self._config = config
        self._input_type = input_type
        self._output_type = output_type
        self._state: _StateT = self._CREATED
        self._error: BaseException | None = None
        self._state_lock = threading.Lock()
        self._send_lock = self._IO_LOCK()
        self._recv_lock = self._IO_LOCK()
        self._unprocessed: list[Any] = []
        self._started_at = 0.0
        self._stopped_at = 0.0

    # -- properties -------------------------------------------------------------------

    @property
    def kernel_id(self) -> str:
        """The kernel's name."""
        return self._kernel_id

    @property
    def config(self) -> _ConfigT:
        """The configuration it was created with."""
        return self._config

    @property
    def state(self) -> _StateT:
        """Where the kernel is in its lifecycle."""
        return self._state

    @property
    def is_running(self) -> bool:
        """True while the actor (thread or child process) runs and no stop was requested."""
        return self._state is self._RUNNING

    @property
    def error(self) -> BaseException | None:
        """Why the kernel failed: the actor's exception (or a child process's death)."""
        return self._error

    @property
    def failed(self) -> bool:
        """True when the actor raised (or a child process died unexpectedly)."""
        return self._error is not None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> object:
        """Start the actor; each tier defines it."""
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the actor gracefully; each tier defines it."""
        raise NotImplementedError

    # -- caller side ------------------------------------------------------------------

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Queue ``msg`` for the actor; each tier defines it."""
        raise NotImplementedError

    def send_nowait(self, msg: Any) -> bool:
        """Queue ``msg`` if the inbox has room; False when full (same errors as ``send``)."""
        return self.send(msg, 0)

    def receive(self, timeout: float | None = None) -> Any:
        """The next reply; each tier defines it."""
        raise NotImplementedError

    def receive_nowait(self) -> Any:
        """The next reply or None, without waiting (same errors as ``receive``)."""
        return self.receive(0)

    def unprocessed(self) -> list[Any]:
        """Messages sent but never handed to the actor (stop timeout, failure, crash)."""
        return list(self._unprocessed)

    # -- errors and reports -----------------------------------------------------------

    def _start_error(self) -> KernelStateError:
        return KernelStateError(
            self._kernel_id,
            self._state,
            "start",
            "a kernel runs once; create a new one to run again",
        )

    def _state_error(self, operation: str) -> KernelStateError:
        if self._error is not None:
            err = KernelFailedError(self._kernel_id, self._error)
            err.__cause__ = self._error
            return err
        hint = _STATE_HINTS.get(self._state.name, "")
        return KernelStateError(self._kernel_id, self._state, operation, hint)

    def _statistics_head(self) -> dict[str, Any]:
        """The first entries of ``statistics()``: name, state and failure."""
        return {
            "kernel_id": self._kernel_id,
            "state": self._state.value,
            "failed": self._error is not None,
            "error": repr(self._error) if self._error is not None else None,
        }

    def _uptime(self) -> float:
        """Seconds from start to stop (or to now while it runs); 0.0 if never started."""
        end = self._stopped_at or time.monotonic()
        return end - self._started_at if self._started_at else 0.0

    def _failure_note(self) -> str:
        return f" failed: {self._error!r}" if self._error is not None else ""

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> Self:
        if self._state is self._CREATED:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
