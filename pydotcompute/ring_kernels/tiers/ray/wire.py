"""What crosses the Ray boundary besides message bytes: errors and kernel states.

Design notes:
- Messages cross as MessagePack bytes (``msg.serialize()`` / ``deserialize_message``); this
  module never touches them.
- Errors do not cross as pickled exception objects. pydotcompute errors build their text
  in ``__init__`` from structured arguments (``KernelStateError(kernel_id, state, op)``), so
  unpickling one (which calls ``cls(*args)`` with the finished text) would garble or fail.
  Instead an error travels as ``(class name, text, attributes, cause)`` and is rebuilt
  with the same class and the very same text on the other side. Non-pydotcompute causes
  (the exception an actor raised) travel as themselves when they pickle, else as a
  ``RuntimeError`` carrying their type and text.
- Trace context (a tracing runtime only): an item of a ``push`` or ``request`` may start
  with ``0xC1 'T'``, the W3C context it travels in (16-byte trace id, 8-byte span id,
  big-endian, 1-byte flags; the process tier's frame header), then its message bytes.
  ``0xC1`` is the one byte MessagePack never writes, so a message can never be mistaken
  for it; an untraced runtime ships exactly the message bytes, and reads them as before.
- Every remote method of the kernel host returns ``(value, error)`` instead of raising:
  expected failures (a full queue, a terminated kernel) are answers, not Ray task errors.
"""

from __future__ import annotations

import pickle
from typing import Any

from .... import exceptions as _exc
from ...states import KernelState

__all__ = (
    "TRACED",
    "PackedError",
    "pack_cause",
    "pack_error",
    "split_traced",
    "state_from_name",
    "traced_item",
    "unpack_error",
)

# (class name, text, attributes, packed cause or None)
PackedError = tuple[str, str, dict[str, Any], Any]

_ATTRS = ("kernel_id", "operation", "known")

TRACED = b"\xc1T"
_TRACE_HEAD = 27  # TRACED, trace id (16), span id (8), flags (1)


def traced_item(ids: tuple[int, int, int] | None, data: bytes) -> bytes:
    """``data`` (a message's bytes) in trace context ``ids`` = (trace id, span id, flags);
    ``data`` itself when there is none."""
    if ids is None:
        return data
    trace_id, span_id, flags = ids
    return b"".join(
        (TRACED, trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big"), bytes((flags,)), data)
    )


def split_traced(data: bytes) -> tuple[tuple[int, int, int] | None, bytes]:
    """``(ids or None, the message bytes)`` of an item `traced_item` made."""
    if data[:2] != TRACED or len(data) <= _TRACE_HEAD:
        return None, data  # a malformed header is left to the message decoder to refuse
    ids = (int.from_bytes(data[2:18], "big"), int.from_bytes(data[18:26], "big"), data[26])
    return ids, data[_TRACE_HEAD:]


def pack_cause(error: BaseException | None) -> Any:
    """A picklable stand-in for ``error`` (itself when it pickles cleanly)."""
    if error is None:
        return None
    if isinstance(error, _exc.PyDotComputeError):
        return pack_error(error)
    try:
        clone = pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    if type(clone) is not type(error) or str(clone) != str(error):
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def pack_error(error: BaseException) -> PackedError:
    """Flatten an exception for the trip across Ray (see the module notes)."""
    if not isinstance(error, _exc.PyDotComputeError):
        return ("", str(error), {}, pack_cause(error))
    attrs: dict[str, Any] = {name: getattr(error, name) for name in _ATTRS if hasattr(error, name)}
    state = getattr(error, "state", None)
    if state is not None:
        attrs["state"] = getattr(state, "name", str(state))
    cause = getattr(error, "error", None)
    if cause is None:
        cause = error.__cause__
    return (type(error).__name__, str(error), attrs, pack_cause(cause))


def unpack_cause(packed: Any) -> BaseException | None:
    if packed is None:
        return None
    if isinstance(packed, BaseException):
        return packed
    return unpack_error(packed)


def unpack_error(packed: PackedError) -> BaseException:
    """Rebuild the exception `pack_error` flattened, with identical text."""
    name, text, attrs, cause_packed = packed
    cause = unpack_cause(cause_packed)
    cls = getattr(_exc, name, None) if name else None
    if not (isinstance(cls, type) and issubclass(cls, _exc.PyDotComputeError)):
        if cause is not None:
            return cause
        return RuntimeError(text)
    err = cls.__new__(cls)
    BaseException.__init__(err, text)
    for key, value in attrs.items():
        if key == "state":
            value = state_from_name(value)
        setattr(err, key, value)
    if isinstance(err, _exc.KernelFailedError):
        err.error = cause
    if cause is not None:
        err.__cause__ = cause
    return err


def state_from_name(name: str) -> KernelState | str:
    """``KernelState[name]``, or the name itself for pseudo-states such as RESTARTING."""
    try:
        return KernelState[name]
    except KeyError:
        return name
