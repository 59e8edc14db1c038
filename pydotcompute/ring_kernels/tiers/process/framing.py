"""The wire between the parent and its child: record framing, values, reports.

Design notes:
- Record framing. A ``@message`` travels as its own serialized bytes, which always start
  with a MessagePack array header (``0x90``-``0x9F``, ``0xDC`` or ``0xDD``: the message is
  an array), so the common case costs nothing extra.
  Anything else starts with ``0xC1``, the one byte MessagePack never produces, and a kind
  byte: ``V`` a plain value (any MessagePack-able object, NumPy arrays as an extension
  type), ``E`` a per-message error (a frame the child could not decode, reported as data
  with the message's id so the caller waiting for it gets the error).
- Trace context (a tracing runtime only). ``0xC1 'T'``, the W3C trace context of the span
  the record belongs to (16-byte trace id, 8-byte span id, both big-endian, and the 1-byte
  trace flags: 27 bytes in all), then the ordinary record (a message or a ``V`` value).
  A frame prefix, not a message field: the message's wire layout and its codec's speed do
  not change, and an untraced runtime writes exactly the bytes it wrote before (zero extra
  bytes, no extra branch on a message's read path, which already switches on byte 0).
- Nothing crosses as a pickle from the child: the status pipe carries MessagePack lists
  (``["ready", pid]``, ``["error", ...]``) sent with ``send_bytes``, and exceptions cross
  as their module, name, text, simple ``args`` and formatted traceback. `rebuild_error`
  turns such a report back into an exception without instantiating any class the child
  named, other than a builtin exception.
"""

from __future__ import annotations

import builtins
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from ....decorators.validators import wrong_message_type
from ....exceptions import (
    MessageDeserializationError,
    MessageRejectedError,
    MessageSerializationError,
    RemoteActorError,
    TypeValidationError,
)
from ...message import RingKernelMessage, check_fields, fields_check, frame_header

__all__ = (
    "ERROR_FRAME",
    "FRAME_TAG",
    "STATUS_MAX_BYTES",
    "TRACE_FRAME",
    "TRACE_HEADER_BYTES",
    "VALUE_FRAME",
    "check_type",
    "decode_value",
    "encode_value",
    "encoder_for",
    "error_frame",
    "exception_data",
    "frame_id",
    "no_encoder",
    "pack_report",
    "rebuild_error",
    "rejection",
    "reply_correlation",
    "split_trace",
    "too_large",
    "trace_header",
    "unpack_report",
)

FRAME_TAG = 0xC1  # never produced by MessagePack; a message frame starts with an array
VALUE_FRAME = b"\xc1V"
ERROR_FRAME = b"\xc1E"
TRACE_FRAME = b"\xc1T"
TRACE_HEADER_BYTES = 27  # TRACE_FRAME, trace id (16), span id (8), trace flags (1)
STATUS_MAX_BYTES = 1 << 20  # the parent refuses longer status reports
_TEXT_MAX = 16_000
_EXT_ARRAY = 1
_SIMPLE_ARGS = (str, int, float, bool, type(None))

_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.Decoder().decode


def _value_enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        dt = obj.dtype
        if dt.hasobject or dt.names is not None or dt.subdtype is not None:
            raise TypeError(
                f"a NumPy array of dtype {dt} cannot travel as a plain value (numeric, bool, "
                "bytes, str and datetime dtypes can); put structured data in a @message"
            )
        arr = np.ascontiguousarray(obj)
        head = _pack((dt.str, list(arr.shape)))
        flat = arr.reshape(-1).view(np.uint8)
        return msgspec.msgpack.Ext(
            _EXT_ARRAY, b"".join((len(head).to_bytes(2, "little"), head, flat.data))
        )
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__qualname__} has no MessagePack form")


def _value_ext_hook(code: int, data: memoryview) -> Any:
    if code != _EXT_ARRAY:
        raise ValueError(f"unknown MessagePack extension type {code}")
    size = int.from_bytes(data[:2], "little")
    dtype_str, shape = _unpack(data[2 : 2 + size])
    dt = np.dtype(dtype_str)
    if dt.hasobject:
        raise ValueError("object arrays are not accepted")
    # a copy: a plain value is the receiver's own, writable, as on the in-process tiers
    return np.frombuffer(data[2 + size :], dtype=dt).reshape(shape).copy()


_value_encode = msgspec.msgpack.Encoder(enc_hook=_value_enc_hook).encode
_value_decode = msgspec.msgpack.Decoder(ext_hook=_value_ext_hook).decode


def encode_value(kernel_id: str, value: Any) -> bytes:
    """A plain value's record: ``0xC1 'V'`` and the value as MessagePack.

    Raises:
        MessageSerializationError: ``value`` (or something inside it) has no MessagePack
            form; the message names its type.
    """
    try:
        return VALUE_FRAME + _value_encode(value)
    except RecursionError as exc:
        raise MessageSerializationError(
            f"kernel {kernel_id!r} runs in a child process, so what it carries must encode "
            f"as MessagePack; a {type(value).__name__} nested too deeply or containing itself "
            f"does not ({exc}); break the loop or flatten the value"
        ) from exc
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise MessageSerializationError(
            f"kernel {kernel_id!r} runs in a child process, so what it carries must encode "
            f"as MessagePack; a {type(value).__name__} does not ({exc}). Send @message "
            "instances or MessagePack values: int, float, str, bytes, bool, None, lists and "
            "dicts of them, NumPy arrays"
        ) from exc


def decode_value(kernel_id: str, data: bytes) -> Any:
    """The value of a ``0xC1 'V'`` record (tuples come back as lists, as MessagePack has it).

    Raises:
        MessageDeserializationError: the record is not a value record or is malformed.
    """
    if data[1:2] != b"V":
        raise MessageDeserializationError(
            f"kernel {kernel_id!r}: unknown record kind {bytes(data[:2])!r}"
        )
    try:
        return _value_decode(memoryview(data)[2:])
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise MessageDeserializationError(
            f"kernel {kernel_id!r}: a plain value record is malformed ({exc})"
        ) from exc


def trace_header(trace_id: int, span_id: int, flags: int) -> bytes:
    """The ``0xC1 'T'`` prefix that puts a record in trace context (see the module notes)."""
    return b"".join(
        (TRACE_FRAME, trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big"), bytes((flags,)))
    )


def split_trace(kernel_id: str, data: bytes) -> tuple[int, int, int, bytes]:
    """``(trace id, span id, trace flags, the record)`` of a ``0xC1 'T'`` frame.

    Raises:
        MessageDeserializationError: the frame is too short to hold a record after the
            header, or is not a trace frame.
    """
    if len(data) <= TRACE_HEADER_BYTES or data[:2] != TRACE_FRAME:
        raise MessageDeserializationError(
            f"kernel {kernel_id!r}: a trace context frame needs {TRACE_HEADER_BYTES} header "
            f"bytes starting with {TRACE_FRAME!r} and a record after them; got "
            f"{len(data)} bytes starting with {bytes(data[:2])!r}"
        )
    return (
        int.from_bytes(data[2:18], "big"),
        int.from_bytes(data[18:26], "big"),
        data[26],
        bytes(data[TRACE_HEADER_BYTES:]),
    )


def encoder_for(
    kernel_id: str, msg: object, expected: type | None, what: str, *, fields: bool = False
) -> Callable[[Any], bytes]:
    """Check ``msg`` against ``expected`` and return the encoder for its type.

    A ``@message`` encodes with its class's ``serialize``; anything else as a plain value.
    With ``fields``, the encoder first checks each message's field values (`check_fields`:
    msgspec's encoder writes whatever a field holds, and only the decoder would refuse it).
    """
    check_type(kernel_id, msg, expected, what)
    if isinstance(msg, RingKernelMessage):
        serialize: Callable[[Any], bytes] = type(msg).serialize
        if not fields:
            return serialize
        ok = fields_check(type(msg))

        def checked(value: Any) -> bytes:
            if not ok(value):
                check_fields(value, kernel_id, what)
            return serialize(value)

        return checked

    def encode(value: Any) -> bytes:
        return encode_value(kernel_id, value)

    return encode


def too_large(kernel_id: str, msg: object, size: int, limit: int, which: str) -> Exception:
    """The error for a record that can never fit a ring (``which``: "inbox" or "outbox")."""
    need = 8 + ((size + 7) & ~7)  # the ring capacity that holds it
    what = type(msg).__name__
    if which == "inbox":
        fix = (
            f"launch(..., ring_bytes={need}) in the runtime, or "
            f"CythonKernelConfig(ring_bytes={need}) (or input_ring_bytes=) used directly"
        )
    else:
        fix = (
            f"launch(..., ring_bytes={need}) in the runtime, or "
            f"CythonKernelConfig(ring_bytes={need}) (or output_ring_bytes=) used directly"
        )
    return MessageSerializationError(
        f"a {what} that encodes to {size} bytes can never fit the {which} of kernel "
        f"{kernel_id!r}, which takes at most {limit} bytes per message; make the rings "
        f"larger with {fix}, or send smaller messages"
    )


def exception_data(exc: BaseException) -> list[Any]:
    """``[module, qualname, text, args, traceback]`` for an exception: plain data only.

    ``args`` is None unless every argument is a str, int, float, bool or None.
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(tb) > _TEXT_MAX:
        tb = "...\n" + tb[-_TEXT_MAX:]
    try:
        text = str(exc)[:_TEXT_MAX]
    except Exception:  # a broken __str__
        text = f"<{type(exc).__qualname__}: str() failed>"
    args = list(exc.args) if all(type(a) in _SIMPLE_ARGS for a in exc.args) else None
    return [type(exc).__module__, type(exc).__qualname__, text, args, tb]


def pack_report(kind: str, *fields: Any) -> bytes:
    """A status or error report as MessagePack; ``args`` too big for it are dropped."""
    try:
        return _pack([kind, *fields])
    except (OverflowError, TypeError, ValueError, msgspec.EncodeError):
        clean = [_packable(f) for f in fields]
        return _pack([kind, *clean])


def _packable(field: Any) -> Any:
    """``field`` as something MessagePack takes: ``args`` (the one list) dropped, an int
    out of range or any other odd object as its text."""
    if isinstance(field, list):
        return None
    if isinstance(field, (str, bytes, float, bool, type(None))):
        return field
    if isinstance(field, int) and -(2**63) <= field < 2**64:
        return field
    return str(field)


def unpack_report(data: bytes) -> list[Any]:
    """A report from the child: a list starting with its kind (``[]`` when malformed)."""
    try:
        report = _unpack(data)
    except (msgspec.DecodeError, ValueError, TypeError):
        return []
    return report if isinstance(report, list) and report else []


def error_frame(correlation: bytes | None, exc: BaseException, max_bytes: int) -> bytes:
    """An outbox record reporting that the message with id ``correlation`` failed.

    Cut to ``max_bytes`` (the ring's largest record): the traceback goes first, then the
    text is shortened, so the report always fits.
    """
    module, qualname, text, args, tb = exception_data(exc)
    frame = ERROR_FRAME + pack_report("rejected", correlation, module, qualname, text, args, tb)
    if len(frame) <= max_bytes:
        return frame
    room = max(max_bytes - 200 - len(module) - len(qualname), 0)
    short = text[: room // 4]  # a UTF-8 character takes at most 4 bytes
    return ERROR_FRAME + pack_report("rejected", correlation, module, qualname, short, None, "")


def frame_id(data: bytes) -> bytes | None:
    """The 16-byte message id in a message frame whose fields may not decode (None if absent)."""
    try:
        mid = frame_header(data).message_id
    except MessageDeserializationError:  # not even a readable header: no id to report
        return None
    return None if mid is None else mid.bytes


_RAW_ITEMS: msgspec.msgpack.Decoder[list[msgspec.Raw]] = msgspec.msgpack.Decoder(list[msgspec.Raw])
_WIRE_ID: msgspec.msgpack.Decoder[bytes | None] = msgspec.msgpack.Decoder(bytes | None)


def reply_correlation(data: bytes) -> uuid.UUID | None:
    """The ``correlation_id`` of a message frame whose class this process does not know
    (None if the bytes do not say). A frame is a flat array that ends with its header,
    ``message_id, priority, correlation_id``; only that last item is decoded."""
    try:
        items = _RAW_ITEMS.decode(data)
        cid = _WIRE_ID.decode(items[-1]) if len(items) >= 4 else None
    except (msgspec.DecodeError, ValueError, TypeError):
        return None
    return uuid.UUID(bytes=cid) if cid is not None and len(cid) == 16 else None


def rebuild_error(report: list[Any], kernel_id: str, pid: int | None) -> BaseException:
    """The exception an ``["error", phase, module, qualname, text, args, traceback]`` report
    describes, built from data: a builtin exception type is rebuilt as itself, anything
    else as ``RemoteActorError`` (no class of the child's choosing is ever instantiated)."""
    fields = [*report[2:7], None, None, None, None, None][:5]
    module, qualname, text, args, tb_text = (
        str(fields[0] or "?"),
        str(fields[1] or "?"),
        str(fields[2] or ""),
        fields[3],
        str(fields[4] or ""),
    )
    exc: BaseException | None = None
    if module == "builtins":
        cls = getattr(builtins, qualname, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(*args) if isinstance(args, list) else cls(text)
            except Exception:
                exc = None
    if exc is None:
        exc = RemoteActorError(qualname, module, text, tb_text)
    exc.add_note(f"raised in the child process (pid {pid}) of kernel {kernel_id!r}:\n{tb_text}")
    return exc


def rejection(kernel_id: str, data: bytes) -> MessageRejectedError:
    """The error an ``ERROR_FRAME`` record carries (a message the child could not decode)."""
    report = unpack_report(bytes(data[len(ERROR_FRAME) :]))
    fields = [*report[1:7], None, None, None, None, None, None][:6]
    mid, module, qualname, text, _, tb_text = fields
    cid = uuid.UUID(bytes=mid) if type(mid) is bytes and len(mid) == 16 else None
    if not isinstance(qualname, str):
        what = "the child's report of what did not decode was itself malformed"
    elif qualname == "MessageDeserializationError":
        what = str(text)
    elif module == "builtins":
        what = f"{qualname}: {text}"
    else:
        what = f"{module}.{qualname}: {text}"
    return MessageRejectedError(kernel_id, cid, what, str(tb_text or ""))


def check_type(kernel_id: str, msg: object, expected: type | None, what: str) -> None:
    """Refuse ``msg`` when it is not an ``expected`` (``what``: "expects", "must send"),
    in the runtime's words (`wrong_message_type`)."""
    if expected is not None and not isinstance(msg, expected):
        raise wrong_message_type(msg, expected, kernel_id, what)


def no_encoder(msg: Any) -> bytes:  # pragma: no cover - replaced before first use
    """The encoder slot's value before the first message chose one."""
    raise TypeValidationError(f"no encoder chosen for {type(msg).__name__}")
