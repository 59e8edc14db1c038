"""The pydotcompute error hierarchy.

Every error the library raises on purpose derives from `PyDotComputeError`, and each
subclass also inherits the builtin exception it refines, so ``except KeyError`` or
``except TimeoutError`` keeps working in code that does not know about pydotcompute.
Messages say what was wrong, what arrived and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = (
    "BackendNotAvailableError",
    "BufferNotAllocatedError",
    "BufferSyncError",
    "CUDAError",
    "InvalidConfigurationError",
    "KernelAlreadyExistsError",
    "KernelCompilationError",
    "KernelError",
    "KernelFailedError",
    "KernelNotFoundError",
    "KernelStateError",
    "MessageDeserializationError",
    "MessageError",
    "MessageRejectedError",
    "MessageSerializationError",
    "MetalError",
    "PyDotComputeError",
    "QueueClosedError",
    "QueueError",
    "QueueFullError",
    "QueueTimeoutError",
    "RemoteActorError",
    "ReplyDecodeError",
    "RingCorruptedError",
    "TypeValidationError",
)


class PyDotComputeError(Exception):
    """Root of every error pydotcompute raises on purpose."""


# --- kernels -------------------------------------------------------------------------------


class KernelError(PyDotComputeError):
    """Raised for problems with a ring kernel; the base of the kernel errors below."""


class KernelNotFoundError(KernelError, KeyError):
    """Raised when a kernel id is not launched (or not registered); lists the known ids."""

    def __init__(self, kernel_id: str, known: Iterable[str] = (), *, where: str = "runtime"):
        self.kernel_id = kernel_id
        self.known = sorted(known)
        listing = ", ".join(repr(k) for k in self.known) if self.known else "none"
        super().__init__(f"unknown kernel id {kernel_id!r} in the {where}; known ids: {listing}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class KernelAlreadyExistsError(KernelError, ValueError):
    """Raised when a kernel id is launched or registered twice."""


class KernelStateError(KernelError, RuntimeError):
    """Raised when an operation is not allowed in the kernel's current lifecycle state."""

    def __init__(self, kernel_id: str, state: object, operation: str, hint: str = "") -> None:
        self.kernel_id = kernel_id
        self.state = state
        self.operation = operation
        state_name = getattr(state, "name", str(state))
        text = f"cannot {operation} kernel {kernel_id!r}: it is {state_name}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class KernelFailedError(KernelStateError):
    """Raised to callers waiting on a kernel whose actor raised; ``__cause__`` is the error.

    ``state`` is FAILED when no restart was left. Under ``restart="on_failure"`` the caller
    of ``send_and_receive`` whose request made the actor raise gets this error too
    (``restarted`` True, ``state`` the state the restarted kernel is in, ACTIVE): the text
    then says the actor was restarted and goes on, not that the kernel cannot be used.
    """

    def __init__(
        self,
        kernel_id: str,
        error: BaseException | None,
        *,
        state: object = None,
        note: str = "",
        restarted: bool = False,
    ) -> None:
        from .ring_kernels.states import KernelState

        self.error = error
        self.restarted = restarted
        hint = f"the actor raised {type(error).__name__}: {error}" if error else "it failed"
        super().__init__(kernel_id, KernelState.FAILED if state is None else state, "use", hint)
        if restarted:
            text = (
                f"kernel {kernel_id!r}: {hint} while handling this request and was "
                f"restarted{f' ({note})' if note else ''}; it goes on with the next "
                "message, so this request got no reply: send it again to retry it"
            )
            self.args = (text,)
        elif note:
            self.args = (f"{self.args[0]} {note}",)


class RemoteActorError(KernelError, RuntimeError):
    """An exception raised in a child process, rebuilt in the parent from plain data.

    Nothing a child process sends is unpickled in the parent: an actor's exception crosses
    as its type's module and name, its text and its formatted traceback, and comes back as
    this error unless it was a builtin exception (rebuilt as that builtin type).

    Attributes:
        type_name: The qualified name of the original exception's class.
        module: The module that defined it.
        text: ``str()`` of the original exception.
        remote_traceback: The child's formatted traceback.
    """

    def __init__(self, type_name: str, module: str, text: str, remote_traceback: str = ""):
        self.type_name = type_name
        self.module = module
        self.text = text
        self.remote_traceback = remote_traceback
        super().__init__(f"{module}.{type_name}: {text}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.type_name, self.module, self.text, self.remote_traceback))


class KernelCompilationError(PyDotComputeError, RuntimeError):
    """Raised when a compute or GPU kernel fails to compile; carries the compiler's message."""


# --- messages ------------------------------------------------------------------------------


class MessageError(PyDotComputeError):
    """Base of the message errors."""


class MessageSerializationError(MessageError, ValueError):
    """Raised when a message cannot be encoded (an unsupported field value, for example)."""


class MessageDeserializationError(MessageError, ValueError):
    """Raised when bytes are malformed, truncated or name an unknown message type."""


class MessageRejectedError(MessageDeserializationError):
    """Raised to the caller of one message that a child process could not decode.

    The child reports the failure as data and keeps serving; ``correlation_id`` is the
    rejected message's ``message_id`` (None when its bytes did not even hold one), so a
    caller waiting for that message's reply can be given this error.

    Attributes:
        kernel_id: The kernel whose child rejected the message.
        correlation_id: The rejected message's id, or None.
        text: The child's description of what did not decode.
        remote_traceback: The child's formatted traceback of the decode error.
    """

    def __init__(
        self,
        kernel_id: str,
        correlation_id: object,
        text: str,
        remote_traceback: str = "",
    ) -> None:
        self.kernel_id = kernel_id
        self.correlation_id = correlation_id
        self.text = text
        self.remote_traceback = remote_traceback
        super().__init__(
            f"kernel {kernel_id!r} could not decode message {correlation_id} ({text}); check "
            "that its field values match the class's annotations. The kernel keeps running"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            type(self),
            (self.kernel_id, self.correlation_id, self.text, self.remote_traceback),
        )


class ReplyDecodeError(MessageDeserializationError):
    """Raised when a reply from a child process does not decode in the parent.

    Most often the reply's class was never imported in the parent: the child imported the
    module that defines it, the process that launched the kernel did not. The reply is
    counted as dropped (telemetry records this error); the kernel keeps running, and a
    caller waiting for that reply with `send_and_receive` gets this error.

    Attributes:
        kernel_id: The kernel whose child sent the reply.
        correlation_id: The id of the request the reply answers, or None when its bytes
            did not say.
        text: What did not decode.
    """

    def __init__(self, kernel_id: str, correlation_id: object, text: str) -> None:
        self.kernel_id = kernel_id
        self.correlation_id = correlation_id
        self.text = text
        super().__init__(
            f"kernel {kernel_id!r}: a reply (to message {correlation_id}) does not decode in "
            f"this process: {text}. If its class is defined in a module only the child "
            "imports, import the module that defines it in the parent too (or reply with a "
            "class both processes import); the reply was counted as dropped and the kernel "
            "keeps running"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.kernel_id, self.correlation_id, self.text))


class TypeValidationError(PyDotComputeError, TypeError):
    """Raised when a message is not of the type a kernel expects, or a field has a wrong type."""


# --- queues --------------------------------------------------------------------------------


class QueueError(PyDotComputeError):
    """Base of the queue errors."""


class QueueFullError(QueueError):
    """Raised when a bounded queue is full and its backpressure policy is ``reject``."""


class QueueTimeoutError(QueueError, TimeoutError):
    """Raised when waiting to put into or get from a queue exceeds its timeout."""


class QueueClosedError(QueueError):
    """Raised when putting into a closed queue, or getting from a closed and drained one."""


class RingCorruptedError(QueueError, RuntimeError):
    """Raised when a shared-memory ring's positions or a record's length word are impossible.

    Every reader and writer checks what it reads from the shared header against the ring's
    capacity before copying a byte, so a segment scribbled on by something other than its
    one producer and one consumer is reported instead of read past its end. The ring cannot
    be trusted afterwards; a kernel that meets this error fails with it.
    """


# --- memory and devices --------------------------------------------------------------------


class BufferNotAllocatedError(PyDotComputeError, RuntimeError):
    """Raised when a buffer is used before ``allocate()`` or after ``free()``."""


class BufferSyncError(PyDotComputeError, RuntimeError):
    """Raised when host and device copies of a buffer cannot be reconciled."""


class BackendNotAvailableError(PyDotComputeError, ImportError):
    """Raised when a backend's library or device is missing; names the extra to install."""


class CUDAError(PyDotComputeError, RuntimeError):
    """Raised for failures reported by the CUDA driver, runtime, CuPy or Numba."""


class MetalError(PyDotComputeError, RuntimeError):
    """Raised for failures reported by MLX / Metal."""


class InvalidConfigurationError(PyDotComputeError, ValueError):
    """Raised when a kernel, queue or runtime configuration value is out of range."""


class BufferMismatchError(PyDotComputeError, ValueError):
    """Raised when an array's shape or dtype does not match the buffer or array it is copied to.

    The message names both sides, for example
    ``cannot copy float64 (10,) into float32 (1000,): shapes and dtypes must match``.
    """


__all__ = (*__all__, "BufferMismatchError")  # type: ignore[assignment]
