"""The child side of the process tier, the wire both sides share, and their waiting.

Kept apart from `cython_kernel` (the parent side) because
this is the code a ``spawn`` child imports to run an actor: the doorbells, the waiting
helpers, the record framing, `CythonKernelContext` and the child's entry point. See
``cython_kernel`` for the design (transport, parking, liveness, shutdown).

Design notes:
- Record framing. A ``@message`` travels as its own serialized bytes, which always start
  with ``0x92`` (a two-element MessagePack array), so the common case costs nothing extra.
  Anything else starts with ``0xC1``, the one byte MessagePack never produces, and a kind
  byte: ``V`` a plain value (any MessagePack-able object, NumPy arrays as an extension
  type), ``E`` a per-message error (a frame the child could not decode, reported as data
  with the message's id so the caller waiting for it gets the error).
- Nothing crosses as a pickle from the child: the status pipe carries MessagePack lists
  (``["ready", pid]``, ``["error", ...]``) sent with ``send_bytes``, and exceptions cross
  as their module, name, text, simple ``args`` and formatted traceback.
- The two blocking receives (the child's here, the parent's in ``cython_kernel``) inline
  `read_wait`'s spin and call `read_parked` on a miss: a call per message is 5 % of a trip.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from ..exceptions import (
    InvalidConfigurationError,
    MessageDeserializationError,
    MessageSerializationError,
    QueueClosedError,
    TypeValidationError,
)
from . import _cython
from ._cython import SharedByteRing
from ._kernel_common import check_type, stamp_reply
from ._spsc_py import SharedSegment
from .message import RingKernelMessage, frame_header, message_decoder
from .telemetry import LatencyRecorder, SharedLatencyBlock

__all__ = (
    "ChildSpec",
    "CythonKernelContext",
    "Waiter",
    "child_main",
    "drain_bell",
    "read_parked",
    "read_wait",
    "reply_correlation",
    "ring_bell",
    "write_wait",
)

WRITE_OK, WRITE_WAKE = 1, 2  # SharedByteRing.try_write's codes
SLICE_S = 0.05  # longest single sleep; a safety net, doorbells and sentinels wake sooner
_monotonic = time.monotonic


# --- doorbells and parking (both processes) -------------------------------------------------


def ring_bell(fd: int) -> None:
    try:
        os.write(fd, b"\x00")
    except (BlockingIOError, BrokenPipeError):
        pass  # full: a wake-up is already pending; broken: the peer is gone (seen elsewhere)


def drain_bell(fd: int) -> None:
    try:
        os.read(fd, 4096)
    except (BlockingIOError, InterruptedError):
        pass


def _poll_ms(remaining: float | None) -> int:
    if remaining is None or remaining > SLICE_S:
        return int(SLICE_S * 1000)
    return max(int(remaining * 1000 + 0.999), 0)


PROBE_EVERY = 8  # an adaptive waiter that keeps parking still tries a full spin this often
_MIN_SPIN_S = 1e-6
FLUSH_EVERY = 256  # a timing child hands its latencies over at least this often (messages)


class Waiter:
    """Waits for one role (reader or writer of one ring): spin, then park on a doorbell.

    Parking polls the doorbell plus a liveness fd and returns when the bell rang, the
    liveness fd fired (child exited in the parent, parent hung up in the child) or the
    slice ended; callers re-check.

    The spin budget adapts when ``adaptive``: a wait that ended while spinning restores the
    full budget (``max_spin_s``); one that had to park quarters it, down to zero, and every
    ``PROBE_EVERY``-th consecutive park tries the full budget again. So a busy peer on a
    quiet machine is met by spinning (microsecond round trips), while a slow peer, or a
    machine so loaded that the peer is rarely on a core, stops costing a core per wait.
    """

    __slots__ = ("adaptive", "bell_fd", "live_fd", "max_spin_s", "misses", "poller", "spin_s")

    def __init__(
        self, bell_fd: int, live_fd: int | None, max_spin_s: float = 0.0, adaptive: bool = True
    ) -> None:
        self.bell_fd = bell_fd
        self.live_fd = live_fd
        self.max_spin_s = self.spin_s = max_spin_s
        self.adaptive = adaptive
        self.misses = 0
        self.poller = select.poll()
        self.poller.register(bell_fd, select.POLLIN)
        if live_fd is not None:
            self.poller.register(live_fd, select.POLLIN)

    def hit(self) -> None:
        """The wait ended while spinning: spinning pays off, use the full budget."""
        self.spin_s = self.max_spin_s
        self.misses = 0

    def miss(self) -> None:
        """The wait had to park: spin less next time (but probe now and then)."""
        if not self.adaptive:
            return
        self.misses += 1
        if self.misses % PROBE_EVERY == 0:
            self.spin_s = self.max_spin_s
        else:
            quarter = self.spin_s / 4
            self.spin_s = quarter if quarter >= _MIN_SPIN_S else 0.0

    def park(self, remaining: float | None) -> bool:
        """Sleep; True when the liveness fd fired or the bell hung up (peer gone)."""
        gone = False
        for fd, events in self.poller.poll(_poll_ms(remaining)):
            if fd == self.bell_fd:
                if events & select.POLLIN:
                    drain_bell(fd)
                if events & (select.POLLHUP | select.POLLERR) and not events & select.POLLIN:
                    gone = True
            else:
                gone = True
        return gone


def read_wait(
    ring: Any, waiter: Waiter, timeout: float | None, gone: Any, wake_fd: int = -1
) -> bytes | None:
    """Spin, then park, until a record arrives, ``gone()`` is true, or the timeout ends.

    ``spin_read`` tries at once, so callers need no ``try_read`` of their own first.
    ``gone`` is consulted before each park; it returns True when the peer has exited (the
    caller then drains what is committed and reports the error). Returns None on timeout
    or when the writer closed the ring and it is empty. With a ``wake_fd`` (the writer's
    space doorbell), a read that frees space for a parked writer rings it.
    """
    budget = waiter.spin_s if timeout is None else min(waiter.spin_s, timeout)
    data: bytes | None = ring.spin_read(budget, wake_fd)
    if data is not None:
        if budget > 0 and waiter.misses:  # a shrunken budget paid off: restore it
            waiter.hit()
        return data
    if timeout is not None and timeout <= 0:
        return None
    return read_parked(ring, waiter, timeout, gone, wake_fd)


def read_parked(
    ring: Any, waiter: Waiter, timeout: float | None, gone: Any, wake_fd: int = -1
) -> bytes | None:
    """The rest of `read_wait` once its spin found nothing: park until a record, ``gone()``,
    a closed ring or the timeout. Hot paths inline the spin and call this on a miss."""
    data: bytes | None = None
    deadline = None if timeout is None else _monotonic() + timeout
    waiter.miss()
    while data is None:
        if gone() or ring.writer_closed:
            last: bytes | None = ring.spin_read(0, wake_fd)
            return last
        remaining = None if deadline is None else deadline - _monotonic()
        if remaining is not None and remaining <= 0:
            return None
        ring.set_reader_waiting(True)
        data = ring.spin_read(0, wake_fd)
        if data is None:
            if waiter.park(remaining):
                gone(True)
            data = ring.spin_read(0, wake_fd)
        ring.set_reader_waiting(False)
    return data


def write_wait(ring: Any, data: bytes, waiter: Waiter, timeout: float | None, gone: Any) -> int:
    """Spin, then park, until ``data`` fits (returns the write code) or the timeout ends (0).

    Raises ``QueueClosedError`` through ``try_write`` when the reader has closed the ring;
    returns 0 early when ``gone()`` says the peer exited.
    """
    budget = waiter.spin_s if timeout is None else min(waiter.spin_s, timeout)
    result: int = ring.spin_write(data, budget)
    if result:
        if budget > 0:
            waiter.hit()
        return result
    if timeout is not None and timeout <= 0:
        return 0
    deadline = None if timeout is None else _monotonic() + timeout
    waiter.miss()
    while not result:
        if gone():
            return 0
        remaining = None if deadline is None else deadline - _monotonic()
        if remaining is not None and remaining <= 0:
            return 0
        ring.set_writer_waiting(True)
        result = ring.try_write(data)
        if not result:
            if waiter.park(remaining):
                gone(True)
            result = ring.try_write(data)
        ring.set_writer_waiting(False)
    return result


# --- the wire ------------------------------------------------------------------------------

FRAME_TAG = 0xC1  # never produced by MessagePack; a message frame starts with 0x92
VALUE_FRAME = b"\xc1V"
ERROR_FRAME = b"\xc1E"
STATUS_MAX_BYTES = 1 << 20  # the parent refuses longer status reports
_TEXT_MAX = 16_000
_EXT_ARRAY = 1
_SIMPLE_ARGS = (str, int, float, bool, type(None))

_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.Decoder().decode
_REJECTED = object()  # `_take`: the record was reported back, read the next one


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


def encoder_for(
    kernel_id: str, msg: object, expected: type | None, what: str
) -> Callable[[Any], bytes]:
    """Check ``msg`` against ``expected`` and return the encoder for its type.

    A ``@message`` encodes with its class's ``serialize``; anything else as a plain value.
    """
    check_type(kernel_id, msg, expected, what)
    if isinstance(msg, RingKernelMessage):
        return type(msg).serialize  # type: ignore[return-value]

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


# --- the child side ------------------------------------------------------------------------


@dataclass
class ChildSpec:
    """Everything the child needs; pickled into it by multiprocessing."""

    kernel_id: str
    func: bytes
    output_type: type | None
    in_name: str
    out_name: str
    spin_s: float
    adaptive: bool
    in_data: Any  # Connection: read end, the parent rings it when the inbox has data
    in_space: Any  # write end: we ring it when we freed inbox space
    out_data: Any  # write end: we ring it when the outbox has data
    out_space: Any  # read end: the parent rings it when it freed outbox space
    status: Any  # write end: ready/error reports (MessagePack bytes)
    stderr: Any = None  # the parent's stderr: ours is a file the parent reads while we start
    lat_name: str | None = None  # a SharedLatencyBlock segment: time each message into it


class CythonKernelContext:
    """What a process actor sees, inside the child process.

    Same methods as `ThreadedKernelContext`;
    call them from the actor's own thread. A message is *finished* once the actor asks for
    its next one (``receive``/``receive_nowait``) or returns; the parent keeps it until then
    and hands it back (``take_undelivered``) if the child ends before.
    """

    __slots__ = (
        "_codec",
        "_current",
        "_decode",
        "_gone",
        "_in",
        "_in_space_fd",
        "_lat",
        "_out",
        "_out_data_fd",
        "_out_max",
        "_output_type",
        "_read_waiter",
        "_rec",
        "_spin_s",
        "_timed",
        "_write_waiter",
        "kernel_id",
    )

    def __init__(self, spec: ChildSpec, in_ring: Any, out_ring: Any) -> None:
        self.kernel_id = spec.kernel_id
        self._in = in_ring
        self._out = out_ring
        self._spin_s = spec.spin_s
        self._output_type = spec.output_type
        self._in_space_fd = spec.in_space.fileno()
        self._out_data_fd = spec.out_data.fileno()
        self._read_waiter = Waiter(spec.in_data.fileno(), None, spec.spin_s, spec.adaptive)
        self._write_waiter = Waiter(spec.out_space.fileno(), None, spec.spin_s, spec.adaptive)
        self._gone = False
        # (type, encoder, is a message) of the last type sent, replaced as one object
        self._codec: tuple[type | None, Callable[[Any], bytes], bool] = (None, _no_encoder, False)
        self._out_max: int = out_ring.max_record_size
        self._current: Any = None  # the last message received: replies are correlated to it
        self._decode = message_decoder()  # the inbox's stream: its type's fast path
        # message timing (when the parent asked for it): a recorder, flushed into the
        # shared block every FLUSH_EVERY messages and whenever the actor is about to park
        self._lat: SharedLatencyBlock | None = None
        self._rec: Any = None
        self._timed = 0

    def time_into(self, block: SharedLatencyBlock) -> None:
        """Time every message from now on into ``block`` (the parent reads it)."""
        self._lat = block
        self._rec = LatencyRecorder()

    def flush_timing(self) -> None:
        """Hand what was timed to the parent (the shared block)."""
        self._timed = 0
        part = self._rec.drain()
        if part is not None and self._lat is not None:
            self._lat.add(part)

    def end_timing(self, finished: bool) -> None:
        """The actor ended: its running message is finished (``finished``) or not timed."""
        rec = self._rec
        if rec is None:
            return
        if finished:
            rec.idle()
        else:
            rec.cancel()
        self.flush_timing()

    def _parent_gone(self, value: bool = False) -> bool:
        if value:
            self._gone = True
        return self._gone

    @property
    def should_terminate(self) -> bool:
        """True once a stop was requested *and* the inbox is drained (or the parent died)."""
        return self._gone or (self._in.writer_closed and not self._in.readable())

    @property
    def is_active(self) -> bool:
        """True until a stop is requested."""
        return not (self._gone or self._in.writer_closed)

    @property
    def using_cython(self) -> bool:
        """True when the compiled ring is in use in this process."""
        return _cython.is_cython_available()

    def _closed(self) -> QueueClosedError:
        if self._gone:
            return QueueClosedError(f"the parent process of kernel {self.kernel_id!r} has gone")
        return QueueClosedError(f"kernel {self.kernel_id!r} is stopping and its inbox is drained")

    def receive(self, timeout: float | None = None) -> Any:
        """The next message, waiting up to ``timeout`` seconds (None = until one arrives).

        Asking for the next message marks the previous one finished. A record that does not
        decode (a field of the wrong type, for example) is not handed to the actor: it goes
        back to the parent as that message's error and the wait goes on (the timeout
        starts again).

        Returns:
            The message (a ``@message`` instance or a plain value), or None when the
            timeout expired.

        Raises:
            QueueClosedError: the kernel is stopping and the inbox is drained, or the parent
                process died (letting it escape ends the actor cleanly).
        """
        ring = self._in
        waiter = self._read_waiter
        wake = self._in_space_fd  # the reads ring it when they free space for a parked parent
        rec = self._rec
        if rec is not None:  # asking for the next message finishes the previous one
            rec.idle()
            self._timed += 1
            if self._timed >= FLUSH_EVERY:
                self.flush_timing()
        while True:
            ring.mark_done()
            if timeout is None:  # read_wait inlined: this is every message's path
                data = ring.spin_read(waiter.spin_s, wake)
                if data is None:
                    if rec is not None:
                        self.flush_timing()
                    data = read_parked(ring, waiter, None, self._parent_gone, wake)
                elif waiter.misses and waiter.spin_s > 0:
                    waiter.hit()
            else:
                if rec is not None and not ring.readable():
                    self.flush_timing()
                data = read_wait(ring, waiter, timeout, self._parent_gone, wake)
            if data is None:
                if self._gone or ring.writer_closed:
                    raise self._closed()
                return None
            if data[0] != FRAME_TAG:
                try:
                    msg = self._current = self._decode(data)
                except MessageDeserializationError as exc:
                    self._reject(data, exc)
                    continue
                if rec is not None:
                    rec.took()
                return msg
            msg = self._take(data)
            if msg is not _REJECTED:
                if rec is not None:
                    rec.took()
                return msg

    def receive_nowait(self) -> Any:
        """The next message or None, without waiting (marks the previous one finished)."""
        ring = self._in
        rec = self._rec
        if rec is not None:
            rec.idle()
        while True:
            ring.mark_done()
            data = ring.spin_read(0, self._in_space_fd)  # rings a parked parent
            if data is None:
                if rec is not None:
                    self.flush_timing()
                if ring.writer_closed and not ring.readable():
                    raise self._closed()
                return None
            msg = self._take(data)
            if msg is not _REJECTED:
                if rec is not None:
                    rec.took()
                return msg

    def _take(self, data: bytes) -> Any:
        """One record read from the inbox: the message it holds (now in the actor's hands),
        or `_REJECTED` once an undecodable record was reported back as its message's error.
        (`receive` decodes a ``@message`` record itself, the same way.)"""
        try:
            if data[0] != FRAME_TAG:
                msg = self._current = self._decode(data)
                return msg
            self._current = None
            return decode_value(self.kernel_id, data)
        except MessageDeserializationError as exc:
            self._reject(data, exc)
            return _REJECTED

    def _reject(self, data: bytes, exc: BaseException) -> None:
        """Report an undecodable record to the parent as its message's error."""
        self._current = None
        cid = frame_id(data) if data[0] != FRAME_TAG else None
        frame = error_frame(cid, exc, self._out_max)
        self._write_rest(frame, self._out.try_write(frame), None)

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Encode ``msg`` into the outbox, waiting while it is full.

        ``msg`` is a ``@message`` (a reply without a ``correlation_id`` is correlated to
        the message being handled) or any MessagePack-able value.

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            TypeValidationError: ``msg`` is not the ``output_type``.
            MessageSerializationError: ``msg`` cannot be encoded, or its encoding can never
                fit the outbox ring.
            QueueClosedError: the parent process has gone.
        """
        codec = self._codec
        if type(msg) is not codec[0]:  # validate each new type once
            encode = encoder_for(self.kernel_id, msg, self._output_type, "must send")
            codec = self._codec = (type(msg), encode, isinstance(msg, RingKernelMessage))
        if codec[2]:
            stamp_reply(msg, self._current)
        data = codec[1](msg)
        try:
            result = self._out.try_write(data)
        except InvalidConfigurationError:  # the ring says it can never hold the record
            raise too_large(self.kernel_id, msg, len(data), self._out_max, "outbox") from None
        if result == WRITE_OK:
            return True
        return self._write_rest(data, result, timeout)

    def _write_rest(self, data: bytes, result: int, timeout: float | None) -> bool:
        """Finish a write that `try_write` answered with ``result``: wait for room when it
        was full, ring the parent's doorbell when it is parked."""
        ring = self._out
        if not result:
            result = write_wait(ring, data, self._write_waiter, timeout, self._parent_gone)
            if not result:
                if self._gone:
                    raise self._closed()
                return False
        if result == WRITE_WAKE:
            ring_bell(self._out_data_fd)
        return True

    def send_nowait(self, msg: Any) -> bool:
        """Encode ``msg`` into the outbox if there is room; False when full."""
        return self.send(msg, 0)

    def wait_shutdown(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (or the parent dies); False on timeout."""
        deadline = None if timeout is None else _monotonic() + timeout
        while not (self._gone or self._in.writer_closed):
            remaining = None if deadline is None else deadline - _monotonic()
            if remaining is not None and remaining <= 0:
                return False
            time.sleep(min(SLICE_S, remaining if remaining is not None else SLICE_S))
        return True


def _no_encoder(msg: Any) -> bytes:  # pragma: no cover - replaced before first use
    raise TypeValidationError(f"no encoder chosen for {type(msg).__name__}")


def child_main(spec: ChildSpec) -> None:
    """Entry point of the child process (module level so ``spawn`` can import it).

    Reports ``["ready", pid]`` once the actor is loaded and the rings attached, or
    ``["error", phase, module, qualname, text, args, traceback]`` (phase ``"load"``: the
    actor could not be unpickled, ``"start"``: the rings could not be attached, ``"run"``:
    the actor raised).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    if spec.stderr is not None:  # started: stderr back to where the parent's goes
        try:
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.dup2(spec.stderr.fileno(), 2)
        spec.stderr.close()
    for conn in (spec.in_data, spec.in_space, spec.out_data, spec.out_space):
        os.set_blocking(conn.fileno(), False)
    status = spec.status
    in_ring = out_ring = None
    ctx: CythonKernelContext | None = None
    lat_seg: SharedSegment | None = None
    lat: SharedLatencyBlock | None = None
    finished = False
    exit_code = 0
    phase = "load"
    try:
        func = pickle.loads(spec.func)
        phase = "start"
        in_ring = SharedByteRing.attach(spec.in_name)
        out_ring = SharedByteRing.attach(spec.out_name)
        ctx = CythonKernelContext(spec, in_ring, out_ring)
        if spec.lat_name is not None:
            lat_seg = SharedSegment(spec.lat_name, create=False)
            lat = SharedLatencyBlock(lat_seg.buf)
            ctx.time_into(lat)
        status.send_bytes(pack_report("ready", os.getpid()))
        phase = "run"
        try:
            func(ctx)
        except QueueClosedError:
            if not (ctx._gone or in_ring.writer_closed):
                raise
        in_ring.mark_done()  # the actor ended cleanly: what it took is finished
        finished = True
    except BaseException as exc:  # reported to the parent, which raises it to callers
        try:
            status.send_bytes(pack_report("error", phase, *exception_data(exc)))
        except OSError:
            pass  # the parent is gone
        exit_code = 1
    finally:
        if ctx is not None:
            ctx.end_timing(finished)
        if lat is not None:
            lat.release()
        if lat_seg is not None:
            lat_seg.close()
        if out_ring is not None:
            out_ring.close_writer()
            ring_bell(spec.out_data.fileno())
            out_ring.close()
        if in_ring is not None:
            in_ring.close_reader()
            ring_bell(spec.in_space.fileno())
            in_ring.close()
        for conn in (spec.in_data, spec.in_space, spec.out_data, spec.out_space, status):
            conn.close()
    if exit_code:
        sys.exit(exit_code)


# the names these had before they were public (kept for code that imported them)
_drain_bell = drain_bell
_ring_bell = ring_bell
