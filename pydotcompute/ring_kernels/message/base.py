"""`RingKernelMessage`, `ArrayMessage`, ids made lazily and correlation.

Design notes:
- A message is a `msgspec.Struct`: construction, field access, encoding and decoding run
  in msgspec's C core. `decorate` makes message classes from annotated classes.
- `==`, `repr` and pickling read the fields through their attributes (not msgspec's raw
  slots), so an id stored as wire bytes compares and prints as the UUID it is.
- Header fields are keyword-only, so msgspec places them after the user's fields.
- Ids are made lazily. A new message stores None as its `message_id`; reading the field
  makes the id, serializing makes it as the 16 bytes the wire carries (read back as the
  same UUID); a decoded message stores the 16 bytes it received. A runtime may stamp a
  reply's correlation slot with the *request* being handled (`stamp_reply`) where that
  closes no reference loop (`correlation_to`); reading `correlation_id` or serializing
  resolves it to the request's id. Both are small
  descriptors over msgspec's slots: the raw slots stay reachable for the codec, which
  must see what is stored: as `self._pdc_mid` / `self._pdc_cid` in the message's own
  methods, through the slot descriptors (`wire_id`, `raw_correlation_get`) elsewhere.
  Building a message therefore calls no Python code except the priority check.
- The priority range (0..255) is checked by `__post_init__` on construction (msgspec calls
  it) and by the typed decoder on every decode. Other field types are not checked on
  construction (msgspec does not); every hop that decodes bytes checks them.
- With the `fast_message` extension built, `__post_init__` and `serialize` are its C
  functions (same results and errors; unusual cases call back into the Python code here).
  The Python check alone costs about as much as building the Struct.
- `deserialize` tries the class's own typed decoder first (`codec.DIRECT_DECODERS`; it
  checks the tag itself) and takes the registry path only for what that refuses.
  Compiled, it is a descriptor handing out, per class, a C function bound once: a
  classmethod would make a bound method on every call.
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar, overload

import msgspec
import numpy as np

from ...exceptions import MessageDeserializationError
from .._native import message_extension
from . import layout
from .codec import (
    DIRECT_DECODERS,
    DIRECT_ENCODERS,
    Codec,
    WireId,
    codec_of,
    deserialize_message,
    serialize_error,
)
from .identity import mismatch_text
from .ids import new_message_id as _new_id
from .ids import next_id_bytes, next_request_id, uuid_from_bytes

__all__ = (
    "ArrayMessage",
    "RingKernelMessage",
    "check_priority",
    "claim_request_key",
    "correlation_to",
    "id_key",
    "make_ids",
    "raw_correlation_get",
    "raw_correlation_set",
    "reply_key",
    "request_key",
    "serialize_message",
    "stamp_reply",
    "wire_id",
)

_T = TypeVar("_T")
_M = TypeVar("_M", bound="RingKernelMessage")
_UUID = uuid.UUID
# RecursionError: a value nested too deeply, or one that contains itself
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError)
_fast = message_extension()


def _bad_priority(value: object) -> ValueError:
    return ValueError(
        f"message priority must be an int in 0..255, got {value!r}; "
        "use 224..255 for SYSTEM, 160..223 HIGH, 64..159 NORMAL, 0..63 LOW"
    )


class RingKernelMessage(
    msgspec.Struct, kw_only=True, array_like=True, tag=f"{__name__}.RingKernelMessage"
):
    """Base class of every message; `@message` classes are Struct subclasses of it.

    Attributes:
        message_id: Unique id of this message (a version-4 UUID), made on first read.
        priority: 0..255; 224+ SYSTEM, 160+ HIGH, 64+ NORMAL, below LOW. Queues serve the
            bands strictly in that order, FIFO within a band.
        correlation_id: The `message_id` of the request this message answers, if any.
    """

    if typing.TYPE_CHECKING:
        message_id: uuid.UUID = None  # type: ignore[assignment]
        priority: int = 128
        correlation_id: uuid.UUID | None = None
        _pdc_mid: Any  # the raw slots (see the module notes)
        _pdc_cid: Any
        _pdc_codec: Codec  # the class's codec, set when it is registered
    else:
        # decoded as the 16 wire bytes (a UUID object is made only if the id is read)
        message_id: WireId | None = None
        priority: Annotated[int, msgspec.Meta(ge=0, le=255)] = 128
        correlation_id: WireId | None = None

    if _fast is not None:
        __post_init__ = _fast.check_priority  # type: ignore[misc]  # the same check, compiled
    else:

        def __post_init__(self) -> None:
            p = self.priority
            if p.__class__ is not int or p < 0 or p > 255:
                raise _bad_priority(p)

    def __eq__(self, other: object) -> bool:
        # through the attributes, as `__repr__`: an id stored as bytes equals its UUID
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__struct_fields__)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle what the attributes read (ids made now), so a copy has the same id
        values = tuple(getattr(self, n) for n in self.__struct_fields__)
        return (_unpickle, (type(self), values))

    def __repr__(self) -> str:
        # through the attributes, so ids read as UUIDs (msgspec's repr shows the slots)
        body = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__struct_fields__)
        return f"{type(self).__name__}({body})"

    # -- wire format ------------------------------------------------------------------

    def serialize(self) -> bytes:
        """Encode this message as MessagePack bytes: `[type_tag, *fields, *header]`.

        Raises:
            MessageSerializationError: a field holds a value MessagePack cannot carry.
            TypeValidationError: the class is a subclass of a message that was not
                decorated with `@message`.
        """
        if self._pdc_mid is None:  # the id, made now as its wire bytes
            self._pdc_mid = next_id_bytes()
        cid = self._pdc_cid
        if cid is not None and cid.__class__ is not bytes and cid.__class__ is not _UUID:
            self._pdc_cid = _wire_correlation(cid)  # the request this message answers
        try:
            codec = self._pdc_codec
            if codec.cls is not type(self):  # inherited by a class not registered itself
                raise AttributeError
        except AttributeError:
            codec = codec_of(type(self))
        try:
            if codec.nested:
                for name in codec.nested:
                    _make_ids(getattr(self, name))
            return codec.encode(self)
        except _ENCODE_ERRORS as exc:
            raise serialize_error(self, exc) from exc

    @classmethod
    def deserialize(cls: type[_M], data: bytes | bytearray | memoryview) -> _M:
        """Decode bytes written by `serialize` into an instance of this class.

        Raises:
            MessageDeserializationError: malformed or truncated bytes, a field that does
                not validate, or bytes of another message type.
        """
        decode = DIRECT_DECODERS.get(cls)
        if decode is not None:  # the class's typed decoder checks the tag itself
            try:
                return decode(data)  # type: ignore[no-any-return]
            except Exception:  # another class's frame, or bad bytes: the path below says which
                pass
        return _deserialize_general(cls, data)

    # -- correlation --------------------------------------------------------------------

    def with_correlation(self: _M, correlation_id: uuid.UUID | None) -> _M:
        """Return a copy of this message (same id) carrying `correlation_id`."""
        return msgspec.structs.replace(
            self, message_id=self.message_id, correlation_id=correlation_id
        )

    @overload
    def reply(self, response: _M, /) -> _M: ...
    @overload
    def reply(self, response: type[_M], /, **fields: Any) -> _M: ...
    @overload
    def reply(self: _M, /, **fields: Any) -> _M: ...

    def reply(self, response: Any = None, /, **fields: Any) -> Any:
        """Build the answer to this message; its `correlation_id` is this `message_id`.

        `msg.reply(result=1.0)` builds another message of this type,
        `msg.reply(ComputeResponse, result=1.0)` builds a `ComputeResponse`, and
        `msg.reply(ComputeResponse(result=1.0))` stamps an existing message. The two
        building forms give the reply this message's `priority` unless `priority=` is
        passed, so a request's band carries through a pipeline; a message passed in
        keeps its own.
        """
        if isinstance(response, RingKernelMessage):
            # this message (resolved to its id when read), or its id if that closes a loop
            raw_correlation_set(response, correlation_to(self, response))
            return response
        cls = type(self) if response is None else response
        fields.setdefault("correlation_id", self)  # resolved when read, as above
        fields.setdefault("priority", self.priority)
        return cls(**fields)

    # -- fixed layout -------------------------------------------------------------------

    @classmethod
    def to_records(cls, messages: Sequence[RingKernelMessage]) -> np.ndarray[Any, Any]:
        """Pack messages of this fixed-layout class into a NumPy structured array."""
        return layout.to_records(cls, messages, stored_id=wire_id)

    @classmethod
    def from_records(cls: type[_M], records: np.ndarray[Any, Any]) -> list[_M]:
        """Unpack a structured array (`cls.dtype` layout) into messages."""
        return layout.from_records(cls, records)


def _deserialize_general(cls: type[_M], data: bytes | bytearray | memoryview) -> _M:
    """`deserialize` through the registry: the class named by the frame's tag, which must
    be `cls` or a subclass of it."""
    msg = deserialize_message(data)
    if not isinstance(msg, cls):
        raise MessageDeserializationError(f"bytes hold {mismatch_text(type(msg), cls)}")
    return msg


class _LazyId:
    """`message_id`: made on first read (None stored), or read back from wire bytes."""

    __slots__ = ("_get", "_set")

    def __init__(self, slot: Any) -> None:
        self._get = slot.__get__
        self._set = slot.__set__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self._get(obj)
        if value.__class__ is not _UUID:
            value = _new_id() if value is None else _as_uuid(value)
            self._set(obj, value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        self._set(obj, value)


class _LazyCorrelation:
    """`correlation_id`: a request stored by a runtime reads as that request's id."""

    __slots__ = ("_get", "_set")

    def __init__(self, slot: Any) -> None:
        self._get = slot.__get__
        self._set = slot.__set__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self._get(obj)
        if value is not None and value.__class__ is not _UUID:
            value = value.message_id if isinstance(value, RingKernelMessage) else _as_uuid(value)
            self._set(obj, value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        self._set(obj, value)


def _as_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, _UUID):
        return value
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return uuid_from_bytes(bytes(value))
    raise TypeError(f"a message id must be a uuid.UUID, got {type(value).__name__}")


def _wire_correlation(cid: Any) -> Any:
    """What a correlation slot holding a request (or id bytes) is sent as: 16 bytes."""
    if isinstance(cid, RingKernelMessage):
        return wire_id(cid)
    return cid  # bytes or a UUID subclass: msgspec writes (or refuses) it as it is


def id_key(value: Any) -> Any:
    """The key a runtime files a reply's caller under, for an id given as a `uuid.UUID`,
    its 16 bytes or the request message itself: the 16 bytes (None stays None; anything
    else is returned as it is and matches nothing filed by `request_key`).

    Bytes, not `uuid.UUID`: hashing bytes is one C call, a UUID's ``__hash__`` is Python
    code, and a decoded message holds its ids as bytes already (no UUID is built).
    """
    cls = value.__class__
    if cls is bytes or value is None:
        return value
    if cls is _UUID:
        return value.bytes
    if isinstance(value, RingKernelMessage):
        return request_key(value)
    if isinstance(value, _UUID):  # a subclass
        return value.bytes
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def request_key(msg: Any) -> Any:
    """`id_key` of ``msg``'s ``message_id`` (made now, as its wire bytes, if it has none).

    Raises:
        AttributeError: ``msg`` has no ``message_id``.
    """
    if isinstance(msg, RingKernelMessage):
        mid = wire_id(msg)
        return mid if mid.__class__ is bytes else id_key(mid)
    return id_key(msg.message_id)


def claim_request_key(msg: Any, space: bytes) -> Any:
    """`request_key` of a ``send_and_receive`` request: an id not made yet is made in
    request space ``space`` (`ids.request_space` of the kernel it goes to), so that a reply
    to it can be told apart from any other; an id already made (read, set, decoded) is
    kept, as its holder may know it.

    Raises:
        AttributeError: ``msg`` has no ``message_id``.
    """
    if isinstance(msg, RingKernelMessage):
        mid = _raw_mid_get(msg)
        if mid is None:
            mid = next_request_id(space)
            _raw_mid_set(msg, mid)
            return mid
        return mid if mid.__class__ is bytes else id_key(mid)
    return id_key(msg.message_id)


def _reply_key(reply: Any) -> Any:
    """`id_key` of ``reply``'s ``correlation_id``: the key of the caller it answers, or
    None. A reply to a request made here whose id was never made answers no caller (a
    caller's request has its id made before it is sent): None, and no id is made."""
    if isinstance(reply, RingKernelMessage):
        cid = _raw_cid_get(reply)
        if cid is None or cid.__class__ is bytes:
            return cid
        if isinstance(cid, RingKernelMessage):  # the request itself (a reply made here)
            mid = _raw_mid_get(cid)
            if mid is None or mid.__class__ is bytes:  # (`request_key`, inlined)
                return mid
        return id_key(cid)
    return id_key(getattr(reply, "correlation_id", None))


def _unpickle(cls: type, values: tuple[Any, ...]) -> Any:
    return cls(**dict(zip(cls.__struct_fields__, values, strict=True)))  # type: ignore[attr-defined]


def _make_ids(value: Any) -> None:
    """Make the ids of the messages nested in `value` (a field of a message being sent)."""
    if isinstance(value, RingKernelMessage):
        wire_id(value)
        cid = _raw_cid_get(value)
        if cid is not None and cid.__class__ is not _UUID:
            raw_correlation_set(value, _wire_correlation(cid))
        for name in codec_of(type(value)).nested:
            _make_ids(getattr(value, name))
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _make_ids(item)
    elif isinstance(value, dict):
        for item in value.values():
            _make_ids(item)


#: Make the ids of the messages nested in a value (a field of a message about to be
#: encoded), as `serialize` does: a decoder then reads them as the ids they are.
make_ids: Callable[[Any], None] = _make_ids

_MID_SLOT = RingKernelMessage.__dict__["message_id"]
_CID_SLOT = RingKernelMessage.__dict__["correlation_id"]
# the raw slots under a second name (plain attribute access for the codec), then the
# public names become the lazy views of them
type.__setattr__(RingKernelMessage, "_pdc_mid", _MID_SLOT)
type.__setattr__(RingKernelMessage, "_pdc_cid", _CID_SLOT)
type.__setattr__(RingKernelMessage, "message_id", _LazyId(_MID_SLOT))
type.__setattr__(RingKernelMessage, "correlation_id", _LazyCorrelation(_CID_SLOT))

if _fast is not None:
    _fast.bind(
        RingKernelMessage,
        _MID_SLOT,
        RingKernelMessage.__dict__["priority"],
        _CID_SLOT,
        _bad_priority,
        RingKernelMessage.serialize,  # what the C path hands unusual cases to
        _UUID,
        DIRECT_ENCODERS,
    )
    type.__setattr__(RingKernelMessage, "serialize", _fast.serialize)
    _fast.bind_class_fallback(_deserialize_general)
    type.__setattr__(RingKernelMessage, "deserialize", _fast.ClassDeserialize())
#: The priority check every message runs on construction (compiled when built).
check_priority: Callable[[Any], None] = RingKernelMessage.__post_init__

_raw_cid_get = _CID_SLOT.__get__
_raw_mid_get = _MID_SLOT.__get__
_raw_mid_set = _MID_SLOT.__set__
#: Write a message's correlation slot as stored (a UUID, or the request being answered).
raw_correlation_set: Callable[[Any, Any], None] = _CID_SLOT.__set__


def wire_id(msg: Any) -> Any:
    """``msg``'s id as stored: the 16 bytes the wire carries (or a UUID given to it),
    made now if it has none, as serializing would."""
    mid = _raw_mid_get(msg)
    if mid is None:
        mid = next_id_bytes()
        _raw_mid_set(msg, mid)
    return mid


def raw_correlation_get(obj: Any) -> Any:
    """A message's correlation slot as stored (no request is resolved); None when unset.

    Raises:
        TypeError: `obj` is not a message.
    """
    try:
        return _raw_cid_get(obj)
    except AttributeError:  # an instance made without __init__
        return None


#: How many requests back `correlation_to` looks for the reply before it gives up and
#: stores an id (a tier-1 pipeline's replies hold their requests, one link per stage).
CHAIN_LIMIT = 64
_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC: the class's instances may be tracked


def correlation_to(request: Any, reply: Any) -> Any:
    """What `reply`'s correlation slot holds to answer `request`: `request` itself (its id
    is made only when read or sent), or its id.

    The object is held only when it can close no loop: its class has scalar fields only
    (made with ``gc=False``: the cycle collector never sees it, see `decorate`), and
    `reply` is not reachable from it. Replies hold their requests, so the chain is
    followed back to its end, or `CHAIN_LIMIT` links; a message holding itself (an actor
    sending on the message it handles), or two holding each other, would never be freed.
    Anything else stores the request's id, made now if it has none.
    """
    if not isinstance(request, RingKernelMessage):
        return request  # not a message: kept as it is (serializing refuses it)
    cur: Any = request
    for _ in range(CHAIN_LIMIT):
        if cur is reply or type(cur).__flags__ & _HAVE_GC:
            break
        cur = raw_correlation_get(cur)
        if not isinstance(cur, RingKernelMessage):
            return request
    return _wire_correlation(request)  # the id itself, made now if need be


def _stamp_reply(msg: Any, current: Any) -> None:
    if current is None or not isinstance(msg, RingKernelMessage):
        return
    if raw_correlation_get(msg) is None:
        raw_correlation_set(msg, correlation_to(current, msg))


#: Correlate the reply `msg` to `current`, the request being handled, unless the reply has a
#: correlation already (or `current` is None, or `msg` is not a message). Compiled when built.
stamp_reply: Callable[[Any, Any], None] = _stamp_reply if _fast is None else _fast.stamp_reply
if _fast is not None:
    _fast.bind_reply_key(_reply_key)
#: `id_key` of a reply's ``correlation_id``: the key of the caller it answers, or None (a
#: reply to a request whose id was never made answers no caller). Compiled when built.
reply_key: Callable[[Any], Any] = _reply_key if _fast is None else _fast.reply_key


def serialize_message(msg: RingKernelMessage) -> bytes:
    """Function form of `RingKernelMessage.serialize`."""
    return msg.serialize()


class ArrayMessage(RingKernelMessage):
    """A message whose array fields (NumPy or CuPy) cross serialization *by reference*.

    Serializing registers each array in the `BufferRegistry` and writes only its id;
    deserializing in the same process takes the array back. Use it for large arrays moving
    between actors of one process with `serialize=True` queues; across processes use a
    plain `@message` (arrays are copied into the bytes). A frame that is never decoded
    must give its arrays back with `release_frame`; queues do so for the frames they drop
    (`drop_oldest`) or clear. Only classes that opted in this way decode references.
    """
