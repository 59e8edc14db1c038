"""Typed messages: ``@message``, the MessagePack wire format and fixed-layout records.

Design notes:
- ``@message`` builds a *slotted dataclass* that inherits :class:`RingKernelMessage`, so
  ``isinstance`` works and header fields (``message_id``, ``priority``, ``correlation_id``)
  are keyword-only. In-process hops pass the object itself; bytes exist only when a message
  crosses a process, a device or a machine.
- The wire format is a MessagePack array ``[type_tag, body]`` where ``body`` is the map
  msgspec writes for the dataclass. The tag prefix is pre-packed per class and the body is
  decoded straight from a zero-copy slice, so a decode is a single msgspec call that also
  validates field types. NumPy arrays travel as extension type 1 (dtype, shape, raw bytes)
  and decode as read-only views on the input buffer (no copy).
- Message ids come from a per-process random 128-bit base plus a counter (re-seeded after
  ``fork``) instead of ``uuid4()``, which costs an ``os.urandom`` syscall per message.
- Hot paths work on the header slots themselves (aliased as ``_pdc_mid``/``_pdc_cid`` for
  plain attribute access): generated ``__init__``s always write them, so an unset slot (an
  AttributeError, far dearer than the slot store) never shows up per message; ids never read
  are made as 16 bytes when first serialized; each class gets a generated ``serialize``
  with its fields unrolled, and each serializing queue a decoder that checks the previous
  class's tag prefix and decodes the whole frame in one msgspec call.
- Fixed-layout messages (every field a fixed-size scalar or a fixed-shape array) also get a
  NumPy structured ``dtype``; that layout is what GPU rings carry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import re
import struct
import threading
import typing
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, TypeVar, overload

import msgspec
import numpy as np

from ..exceptions import (
    MessageDeserializationError,
    MessageSerializationError,
    TypeValidationError,
)

__all__ = (
    "ArrayMessage",
    "BufferHandle",
    "BufferRegistry",
    "RingKernelMessage",
    "array_message",
    "deserialize_message",
    "fixed_layout_dtype",
    "frame_priority",
    "get_buffer",
    "get_buffer_registry",
    "get_message_type",
    "is_fixed_layout",
    "message",
    "register_buffer",
    "registered_message_types",
    "release_buffer",
    "release_frame",
    "serialize_message",
)

_T = TypeVar("_T")
_M = TypeVar("_M", bound="RingKernelMessage")

_EXT_NDARRAY = 1
_EXT_BUFFER_REF = 2

# --- fast message ids ------------------------------------------------------------------------

_UUID_VERSION_MASK = ~(0xF000 << 64) & ~(0xC000 << 48) & ((1 << 128) - 1)
_UUID_VERSION_BITS = (0x4000 << 64) | (0x8000 << 48)
_uuid_new = object.__new__
_uuid_set = object.__setattr__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


class _IdSource:
    """Unique RFC-4122-shaped v4 UUIDs: a random base (read once) XOR a counter."""

    __slots__ = ("base", "counter")

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        # the version and variant bits are set in the base once: the counter stays far
        # below bit 62, so XOR-ing it in never touches them
        raw = int.from_bytes(os.urandom(16), "big")
        self.base = (raw & _UUID_VERSION_MASK) | _UUID_VERSION_BITS
        self.counter = itertools.count(1)

    def next_uuid(self) -> uuid.UUID:
        value = self.base ^ next(self.counter)
        u = _uuid_new(uuid.UUID)
        _uuid_set(u, "int", value)
        _uuid_set(u, "is_safe", _SAFE_UNKNOWN)
        return u

    def next_bytes(self) -> bytes:
        """The next id as its 16 big-endian bytes (what the wire carries)."""
        return (self.base ^ next(self.counter)).to_bytes(16, "big")


_ids = _IdSource()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.reseed)
new_message_id: Callable[[], uuid.UUID] = _ids.next_uuid
_new_id_bytes = _ids.next_bytes


# --- the base class --------------------------------------------------------------------------


def _check_priority(value: object) -> None:
    if type(value) is not int or not 0 <= value <= 255:
        raise ValueError(
            f"message priority must be an int in 0..255, got {value!r}; "
            "use 224..255 for SYSTEM, 160..223 HIGH, 64..159 NORMAL, 0..63 LOW"
        )


@dataclass(slots=True)
class RingKernelMessage:
    """Base class of every message; ``@message`` classes inherit it.

    Attributes:
        message_id: Unique id of this message (a v4-shaped UUID).
        priority: 0..255; 224+ SYSTEM, 160+ HIGH, 64+ NORMAL, below LOW. Queues serve the
            bands strictly in that order, FIFO within a band.
        correlation_id: The ``message_id`` of the request this message answers, if any.
    """

    message_id: uuid.UUID = field(default=None, kw_only=True)  # type: ignore[assignment]
    priority: int = field(default=128, kw_only=True)
    correlation_id: uuid.UUID | None = field(default=None, kw_only=True)

    _pdc_tag: ClassVar[str] = ""
    _pdc_prefix: ClassVar[bytes] = b""
    _pdc_decoder: ClassVar[msgspec.msgpack.Decoder[Any] | None] = None
    _pdc_codec: ClassVar[_Codec | None] = None
    _pdc_dtype: ClassVar[np.dtype[Any] | None] = None
    _pdc_by_reference: ClassVar[bool] = False

    def __post_init__(self) -> None:
        p = self.priority
        if type(p) is not int or p < 0 or p > 255:
            _check_priority(p)

    # -- wire format --------------------------------------------------------------------

    def serialize(self) -> bytes:
        """Encode this message as MessagePack bytes (``[type_tag, [header..., fields...]]``).

        Raises:
            MessageSerializationError: a field holds a value MessagePack cannot carry.
        """
        codec = type(self)._pdc_codec
        if codec is None:
            _finalize(type(self))
            codec = type(self)._pdc_codec
            assert codec is not None
        return codec.encode(self)

    @classmethod
    def deserialize(cls: type[_M], data: bytes | bytearray | memoryview) -> _M:
        """Decode bytes written by :meth:`serialize` into an instance of this class.

        Raises:
            MessageDeserializationError: malformed or truncated bytes, or bytes of another type.
        """
        msg = deserialize_message(data)
        if not isinstance(msg, cls):
            raise MessageDeserializationError(
                f"bytes hold a {type(msg).__name__} message, expected {cls.__name__}"
            )
        return msg

    # -- correlation --------------------------------------------------------------------

    def with_correlation(self: _M, correlation_id: uuid.UUID | None) -> _M:
        """Return a copy of this message carrying ``correlation_id``."""
        return dataclasses.replace(self, correlation_id=correlation_id)

    @overload
    def reply(self, response: _M, /) -> _M: ...
    @overload
    def reply(self, response: type[_M], /, **fields: Any) -> _M: ...
    @overload
    def reply(self: _M, /, **fields: Any) -> _M: ...

    def reply(self, response: Any = None, /, **fields: Any) -> Any:
        """Build the answer to this message; its ``correlation_id`` is this ``message_id``.

        ``msg.reply(result=1.0)`` builds another message of this type,
        ``msg.reply(ComputeResponse, result=1.0)`` builds a ``ComputeResponse``, and
        ``msg.reply(ComputeResponse(result=1.0))`` stamps an existing message.
        """
        if isinstance(response, RingKernelMessage):
            response.correlation_id = self.message_id
            return response
        cls = type(self) if response is None else response
        fields.setdefault("correlation_id", self.message_id)
        return cls(**fields)

    # -- fixed layout -------------------------------------------------------------------

    @classmethod
    def to_records(cls, messages: Sequence[RingKernelMessage]) -> np.ndarray[Any, Any]:
        """Pack messages of this fixed-layout class into a NumPy structured array."""
        return _to_records(cls, messages)

    @classmethod
    def from_records(cls: type[_M], records: np.ndarray[Any, Any]) -> list[_M]:
        """Unpack a structured array (``cls.dtype`` layout) into messages."""
        return _from_records(cls, records)


class _LazyMessageId:
    """``message_id`` is made on first read: most replies are never asked for theirs.

    Wraps the slot descriptor dataclasses created; a stored None means "not made yet".
    """

    __slots__ = ("_get", "_set")

    def __init__(self, slot: Any) -> None:
        self._get = slot.__get__
        self._set = slot.__set__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            value = self._get(obj)
        except AttributeError:  # never set: made on first read
            value = None
        if type(value) is not uuid.UUID:
            # None: never made; otherwise 16 bytes from the wire
            value = new_message_id() if value is None else uuid.UUID(bytes=bytes(value))
            self._set(obj, value)
        return value

    def __set__(self, obj: Any, value: uuid.UUID | None) -> None:
        self._set(obj, value)


class _LazyCorrelationId:
    """``correlation_id`` may hold the *request* until first read, then its ``message_id``.

    The runtime stamps replies with the message being handled without forcing that
    message's id into existence; reading ``reply.correlation_id`` (or serializing the
    reply) resolves it, so ``reply.correlation_id == request.message_id`` always holds.
    """

    __slots__ = ("_get", "_set")

    def __init__(self, slot: Any) -> None:
        self._get = slot.__get__
        self._set = slot.__set__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            value = self._get(obj)
        except AttributeError:  # never set: no correlation
            return None
        if value is not None and type(value) is not uuid.UUID and not isinstance(value, uuid.UUID):
            if isinstance(value, (bytes, bytearray)):  # 16 bytes from the wire
                value = uuid.UUID(bytes=bytes(value))
            else:  # the request this message answers
                value = value.message_id
            self._set(obj, value)
        return value

    def __set__(self, obj: Any, value: uuid.UUID | None) -> None:
        self._set(obj, value)


_base_serialize = RingKernelMessage.serialize
_id_slot = RingKernelMessage.__dict__["message_id"]
_cid_slot = RingKernelMessage.__dict__["correlation_id"]
RingKernelMessage.message_id = _LazyMessageId(_id_slot)  # type: ignore[assignment,misc]
RingKernelMessage.correlation_id = _LazyCorrelationId(_cid_slot)  # type: ignore[assignment,misc]
# The same two slot descriptors under private names: ``msg._pdc_mid = x`` is a plain slot
# store (specialized by the interpreter), where calling ``_id_slot.__set__`` goes through a
# method wrapper at several times the cost. Generated ``__init__``s and the runtime's reply
# stamping use them; they read and write exactly what the lazy descriptors wrap.
RingKernelMessage._pdc_mid = _id_slot  # type: ignore[attr-defined]
RingKernelMessage._pdc_cid = _cid_slot  # type: ignore[attr-defined]
#: Raw slot access for the runtime's hot path (no id is created, no request resolved).
_raw_cid_slot_get = _cid_slot.__get__


def raw_correlation_get(obj: Any) -> Any:
    """The correlation slot as stored (None when unset); no request is resolved."""
    try:
        return _raw_cid_slot_get(obj)
    except AttributeError:
        return None


raw_correlation_set = _cid_slot.__set__
_id_set = _id_slot.__set__
_cid_raw_set = _cid_slot.__set__
_prio_set = RingKernelMessage.__dict__["priority"].__set__
_MemberDescriptor = type(_id_slot)


# --- encoding hooks --------------------------------------------------------------------------

_ARRAY_HEADER = struct.Struct("<B")  # length of the msgpack-encoded (dtype, shape) header


def _encode_ndarray(arr: np.ndarray[Any, Any]) -> msgspec.msgpack.Ext:
    if arr.dtype.hasobject:
        raise TypeError(f"arrays of dtype {arr.dtype} (Python objects) cannot be serialized")
    header = _RAW_ENCODER.encode((_dtype_to_spec(arr.dtype), arr.shape))
    if len(header) > 255:
        raise TypeError(f"array header too large ({len(header)} bytes)")
    # a flat byte view: the buffer protocol refuses datetime64/timedelta64 items
    payload = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return msgspec.msgpack.Ext(
        _EXT_NDARRAY, b"".join((_ARRAY_HEADER.pack(len(header)), header, payload.data))
    )


def _dtype_to_spec(dt: np.dtype[Any]) -> Any:
    """A MessagePack-able dtype description that keeps offsets and padding.

    ``dtype.descr`` is lossy for aligned structs (padding comes back as extra void fields),
    so structured dtypes travel as numpy's dict form and subarrays as ``{base, shape}``.
    """
    if dt.names is not None:
        fields = dt.fields
        assert fields is not None
        return {
            "names": list(dt.names),
            "formats": [_dtype_to_spec(fields[n][0]) for n in dt.names],
            "offsets": [fields[n][1] for n in dt.names],
            "itemsize": dt.itemsize,
            "aligned": dt.isalignedstruct,
        }
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return {"base": _dtype_to_spec(base), "shape": list(shape)}
    return dt.str


def _spec_to_dtype(spec: Any) -> np.dtype[Any]:
    if isinstance(spec, str):
        return np.dtype(spec)
    if isinstance(spec, dict) and "base" in spec:
        return np.dtype((_spec_to_dtype(spec["base"]), tuple(int(s) for s in spec["shape"])))
    if isinstance(spec, dict):
        return np.dtype(
            {
                "names": [str(n) for n in spec["names"]],
                "formats": [_spec_to_dtype(f) for f in spec["formats"]],
                "offsets": [int(o) for o in spec["offsets"]],
                "itemsize": int(spec["itemsize"]),
                "aligned": bool(spec.get("aligned", False)),
            }
        )
    raise ValueError(f"malformed array dtype description {spec!r:.60}")


def _device_to_host(obj: Any) -> np.ndarray[Any, Any] | None:
    if hasattr(obj, "__cuda_array_interface__") and hasattr(obj, "get"):
        return np.asarray(obj.get())
    if type(obj).__module__.startswith("mlx"):
        return np.asarray(obj)
    return None


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _encode_ndarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    host = _device_to_host(obj)
    if host is not None:
        return _encode_ndarray(host)
    raise TypeError(f"unsupported field value of type {type(obj).__name__}")


def _ref_enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        handle = _registry.register(obj)
        return msgspec.msgpack.Ext(_EXT_BUFFER_REF, handle.buffer_id.to_bytes(8, "little"))
    return _enc_hook(obj)


def _decode_ndarray(data: memoryview) -> np.ndarray[Any, Any]:
    (hlen,) = _ARRAY_HEADER.unpack_from(data, 0)
    dtype_spec, shape = _RAW_DECODER.decode(data[1 : 1 + hlen])
    dtype = _spec_to_dtype(dtype_spec)
    if dtype.hasobject:
        raise ValueError("object arrays are not accepted")
    shape = tuple(int(s) for s in shape)
    arr = np.frombuffer(data[1 + hlen :], dtype=dtype)
    return arr.reshape(shape)


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _EXT_NDARRAY:
        return _decode_ndarray(data)
    if code == _EXT_BUFFER_REF:
        if len(data) != 8:
            raise ValueError("malformed buffer reference")
        return _registry.take(int.from_bytes(data, "little"))
    raise ValueError(f"unknown MessagePack extension type {code}")


def _dec_hook(tp: Any, obj: Any) -> Any:
    origin = typing.get_origin(tp) or tp
    if origin is np.ndarray:
        if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
            return obj
        raise TypeError(f"expected an array, got {type(obj).__name__}")
    if isinstance(origin, type) and issubclass(origin, np.generic):
        if (
            type(obj) is float
            and issubclass(origin, np.floating)
            and abs(obj) > _float_max(origin)  # type: ignore[arg-type]
            and abs(obj) != _INF
        ):
            # numpy would only warn and store inf: a value that does not fit is an error
            raise ValueError(f"{obj!r} does not fit a {origin.__name__} field")
        return origin(obj)
    if isinstance(obj, origin if isinstance(origin, type) else object):
        return obj
    raise NotImplementedError(f"unsupported field type {tp!r}")


_INF = float("inf")


@functools.cache
def _float_max(tp: type) -> float:
    return float(np.finfo(tp).max)


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook, uuid_format="bytes")
_REF_ENCODER = msgspec.msgpack.Encoder(enc_hook=_ref_enc_hook, uuid_format="bytes")
_RAW_ENCODER = msgspec.msgpack.Encoder()
_RAW_DECODER: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder()


def _pack_str(s: str) -> bytes:
    raw = s.encode()
    n = len(raw)
    if n < 32:
        return bytes((0xA0 | n,)) + raw
    if n < 256:
        return b"\xd9" + bytes((n,)) + raw
    return b"\xda" + n.to_bytes(2, "big") + raw


# --- registry --------------------------------------------------------------------------------

_TYPES: dict[str, type[RingKernelMessage]] = {}
_TYPES_LOCK = threading.Lock()
_types_version = 0  # bumped on every registration: caches of _TYPES lookups check it


def _tag_of(cls: type) -> str:
    # A script's main module is "__mp_main__" in a multiprocessing child: same classes.
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    return f"{module}.{cls.__qualname__}"


_Priority = Annotated[int, msgspec.Meta(ge=0, le=255)]
_new_object = object.__new__


class _Codec:
    """The wire codec of one message class: positional header + fields.

    The body is a MessagePack array ``[message_id(16 bytes), priority, correlation_id(16
    bytes or nil), field_1, ...]`` decoded by a typed msgspec tuple decoder (so field types
    and the priority range are validated in C); the object is then filled through its slot
    descriptors. Ids stay as bytes until read (see ``_LazyMessageId``).
    """

    __slots__ = (
        "build",
        "by_ref",
        "cls",
        "decode_frame",
        "decoder",
        "framed",
        "names",
        "pack",
        "plain",
        "post_init",
        "prefix",
        "serialize",
        "setters",
    )

    def __init__(self, cls: type[RingKernelMessage], prefix: bytes) -> None:
        self.cls = cls
        self.prefix = prefix
        self.by_ref = cls._pdc_by_reference
        names = tuple(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in ("message_id", "priority", "correlation_id")
        )
        self.names = names
        self.setters = tuple(_slot_setter(cls, n) for n in names)
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception:  # unresolvable forward references: accept any value
            hints = {}
        types: list[Any] = [bytes, _Priority, bytes | None]
        types += [hints.get(n, Any) for n in names]
        self.decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
            tuple[tuple(types)],  # type: ignore[misc]
            ext_hook=_ext_hook,
            dec_hook=_dec_hook,
        )
        # the whole ``[tag, body]`` frame, the tag checked by msgspec (message_decoder)
        self.framed: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
            tuple[Literal[cls._pdc_tag], tuple[tuple(types)]],  # type: ignore[misc,name-defined]
            ext_hook=_ext_hook,
            dec_hook=_dec_hook,
        )
        custom = cls.__post_init__ is not RingKernelMessage.__post_init__
        self.post_init = cls.__post_init__ if custom else None
        self.plain = cls.__setattr__ is object.__setattr__
        self.build = self._make_builder()
        self.pack = self._make_packer()
        self.serialize = self._make_serializer()

    def _make_builder(self) -> Callable[[Any], RingKernelMessage]:
        """An unrolled ``values -> message`` function for this class (no loop, no kwargs).

        Slots are filled with plain attribute stores where that is the same thing as the
        slot descriptor's ``__set__`` (no custom ``__setattr__``, a real slot): the
        interpreter specializes those, a method-wrapper call costs several times more.
        """
        cls = self.cls
        plain = cls.__setattr__ is object.__setattr__
        env: dict[str, Any] = {
            "_new": _new_object,
            "_cls": cls,
            "_s0": _id_set,
            "_s1": _prio_set,
            "_s2": _cid_raw_set,
            "_post": self.post_init,
            "_framed": self.framed.decode,
            "_MISS": _MISS,
            "_codec": self,
            "_error": _decode_error,
        }
        n = len(self.setters)
        unpack = ", ".join(["mid", "prio", "cid", *(f"v{i}" for i in range(n))])
        fill = ["o = _new(_cls)"]
        if plain:
            fill += ["o._pdc_mid = mid", "o.priority = prio", "o._pdc_cid = cid"]
        else:
            fill += ["_s0(o, mid)", "_s1(o, prio)", "_s2(o, cid)"]
        for i, (name, setter) in enumerate(zip(self.names, self.setters, strict=True)):
            if plain and _is_plain_slot(cls, name):
                fill.append(f"o.{name} = v{i}")
            else:
                env[f"_f{i}"] = setter
                fill.append(f"_f{i}(o, v{i})")
        build = ["def build(v):", f"    {unpack} = v", *(f"    {x}" for x in fill)]
        if self.post_init is not None:
            build.append("    _post(o)")
        build.append("    return o")
        # decode_frame: the framed decoder and build in one function, for message_decoder;
        # _MISS when msgspec does not accept the bytes (the general path then words why)
        frame = [
            "def decode_frame(data):",
            "    try:",
            f"        {unpack} = _framed(data)[1]",
            "    except Exception:",
            "        return _MISS",
            "    try:",
            *(f"        {x}" for x in fill),
            *(["        _post(o)"] if self.post_init is not None else []),
            "    except Exception as exc:  # __post_init__ or a setter may raise anything",
            "        raise _error(_cls, _codec, exc) from exc",
            "    return o",
        ]
        exec("\n".join(build) + "\n\n" + "\n".join(frame), env)
        self.decode_frame = env["decode_frame"]
        return env["build"]  # type: ignore[no-any-return]

    def _make_packer(self) -> Callable[[Any, Any, Any], tuple[Any, ...]]:
        """An unrolled ``(msg, id, correlation) -> body tuple`` function for this class."""
        fields = "".join(f", msg.{name}" for name in self.names)
        env: dict[str, Any] = {}
        exec(f"def pack(msg, mid, cid):\n    return (mid, msg.priority, cid{fields})", env)
        return env["pack"]  # type: ignore[no-any-return]

    def _make_serializer(self) -> Callable[[Any], bytes]:
        """``cls.serialize``, unrolled for this class: the common cases (ids not made yet
        or already bytes, a reply stamped with a request whose id is bytes) inline; all
        else through :meth:`encode`, the general path."""
        cls = self.cls
        env: dict[str, Any] = {
            "_cls": cls,
            "_encode": self.encode,
            "_ids": _ids,
            "_id_set": _id_set,
            "_prefix": self.prefix,
            "_enc": (_REF_ENCODER if self.by_ref else _ENCODER).encode,
            "_UUID": uuid.UUID,
            "_RKM": RingKernelMessage,
            "_errors": (TypeError, ValueError, OverflowError, msgspec.EncodeError),
            "_error": _serialize_error,
        }
        store = "self._pdc_mid = mid" if self.plain else "_id_set(self, mid)"
        fields = "".join(f", self.{name}" for name in self.names)
        src = f"""
def serialize(self):
    if type(self) is not _cls:  # a subclass without a codec of its own
        return _encode(self)
    try:
        mid = self._pdc_mid
        cid = self._pdc_cid
    except AttributeError:
        return _encode(self)
    if mid is None:
        mid = (_ids.base ^ next(_ids.counter)).to_bytes(16, "big")
        {store}
    elif type(mid) is not bytes or len(mid) != 16:
        return _encode(self)
    if cid is not None and (type(cid) is not bytes or len(cid) != 16):
        if type(cid) is _UUID:
            cid = cid.int.to_bytes(16, "big")
        elif isinstance(cid, _RKM):
            try:
                cid = cid._pdc_mid
            except AttributeError:
                return _encode(self)
            if type(cid) is not bytes or len(cid) != 16:
                return _encode(self)
        else:
            return _encode(self)
    try:
        return _prefix + _enc((mid, self.priority, cid{fields}))
    except _errors as exc:
        raise _error(self, exc) from exc
"""
        exec(src, env)
        fn = env["serialize"]
        fn.__qualname__ = f"{cls.__qualname__}.serialize"
        fn.__module__ = cls.__module__
        fn.__doc__ = _base_serialize.__doc__
        fn._pdc_generated = True
        return fn  # type: ignore[no-any-return]

    def encode(self, msg: RingKernelMessage) -> bytes:
        # ids go out as the 16 bytes in their slots: an id never made is made as bytes
        # (read back as the same UUID), and a reply stamped with its request takes the
        # request's id bytes, without building UUID objects only to take them apart
        try:
            mid = msg._pdc_mid  # type: ignore[attr-defined]
            cid = msg._pdc_cid  # type: ignore[attr-defined]
        except AttributeError:  # a slot never set (built without __init__)
            mid, cid = msg.message_id, msg.correlation_id
        if type(mid) is not bytes or len(mid) != 16:
            if mid is None and self.plain and type(msg) is self.cls:
                mid = (_ids.base ^ next(_ids.counter)).to_bytes(16, "big")  # _new_id_bytes()
                msg._pdc_mid = mid  # type: ignore[attr-defined]
            else:
                mid = _wire_id(msg)
        if cid is not None and (type(cid) is not bytes or len(cid) != 16):
            if type(cid) is uuid.UUID:
                cid = cid.int.to_bytes(16, "big")
            elif isinstance(cid, RingKernelMessage):  # the request this message answers
                try:
                    rid = cid._pdc_mid  # type: ignore[attr-defined]
                except AttributeError:
                    rid = None
                cid = rid if type(rid) is bytes and len(rid) == 16 else _wire_id(cid)
            else:
                cid = msg.correlation_id.int.to_bytes(16, "big")  # type: ignore[union-attr]
        encoder = _REF_ENCODER if self.by_ref else _ENCODER
        try:
            return self.prefix + encoder.encode(self.pack(msg, mid, cid))
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            raise _serialize_error(msg, exc) from exc

    def decode(self, body: memoryview) -> RingKernelMessage:
        return self.build(self.decoder.decode(body))


def _serialize_error(msg: Any, exc: BaseException) -> MessageSerializationError:
    return MessageSerializationError(
        f"cannot serialize {type(msg).__name__}: {exc}; fields must be MessagePack "
        "types, NumPy arrays or nested @message classes"
    )


def _wire_id(msg: Any) -> bytes:
    """``msg``'s id as 16 bytes; an id not made yet is made now (and kept, as bytes)."""
    try:
        mid = msg._pdc_mid
    except AttributeError:
        mid = None
    if type(mid) is bytes and len(mid) == 16:
        return mid
    if mid is None:
        raw = _new_id_bytes()
        _id_set(msg, raw)
        return raw
    if type(mid) is uuid.UUID:
        return mid.int.to_bytes(16, "big")
    return msg.message_id.int.to_bytes(16, "big")  # type: ignore[no-any-return]


def _is_plain_slot(cls: type, name: str) -> bool:
    """True when ``obj.name = v`` on an instance of ``cls`` writes a slot and nothing else."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return type(klass.__dict__[name]) is _MemberDescriptor
    return False


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    for klass in cls.__mro__:
        desc = klass.__dict__.get(name)
        if desc is not None and hasattr(desc, "__set__"):
            return desc.__set__  # type: ignore[no-any-return]
    return lambda obj, value: object.__setattr__(obj, name, value)


def _finalize(cls: type[RingKernelMessage]) -> None:
    """Register ``cls`` and build its tag prefix and codec (lazily, on first use)."""
    tag = _tag_of(cls)
    cls._pdc_tag = tag
    prefix = b"\x92" + _pack_str(tag)
    try:
        codec = _Codec(cls, prefix)
    except TypeError as exc:
        raise TypeValidationError(
            f"message class {cls.__name__} has a field type msgspec cannot decode: {exc}"
        ) from exc
    cls._pdc_codec = codec
    cls._pdc_decoder = codec.decoder
    cls._pdc_prefix = prefix
    # a serialize the class defines (or inherits from a class that defined one) stays
    inherited = getattr(cls, "serialize", None)
    if inherited is _base_serialize or getattr(inherited, "_pdc_generated", False):
        cls.serialize = codec.serialize  # type: ignore[method-assign,assignment]
    global _types_version
    with _TYPES_LOCK:
        _TYPES[tag] = cls
        _types_version += 1


def _read_tag(data: memoryview) -> tuple[str, int]:
    start, end = _tag_span(data)
    try:
        return str(data[start:end], "utf-8"), end
    except UnicodeDecodeError as exc:
        raise MessageDeserializationError("malformed message: the type tag is not UTF-8") from exc


def _tag_span(data: bytes | memoryview) -> tuple[int, int]:
    """Where a frame's type tag (UTF-8 bytes) starts and ends, after checking the header."""
    n = len(data)
    if n < 2 or data[0] != 0x92:
        raise MessageDeserializationError(
            f"not a pydotcompute message: expected a 2-element MessagePack array, "
            f"got {bytes(data[:8])!r}{'...' if n > 8 else ''}"
        )
    b = data[1]
    if 0xA0 <= b <= 0xBF:
        size, start = b & 0x1F, 2
    elif b == 0xD9 and n >= 3:
        size, start = data[2], 3
    elif b == 0xDA and n >= 4:
        size, start = int.from_bytes(data[2:4], "big"), 4
    else:
        raise MessageDeserializationError("malformed message: the type tag is not a string")
    end = start + size
    if end > n:
        raise _truncated("the type tag")
    return start, end


def _truncated(what: str) -> MessageDeserializationError:
    return MessageDeserializationError(f"truncated message: {what} is cut short")


def _uint_at(data: bytes, i: int, size: int, what: str) -> int:
    """The ``size``-byte big-endian unsigned int at ``data[i:i + size]``."""
    end = i + size
    if end > len(data):
        raise _truncated(what)
    return int.from_bytes(data[i:end], "big")


def frame_priority(data: bytes) -> int:
    """The ``priority`` in the header of a serialized message, read without decoding it.

    The wire body is ``[tag, [message_id, priority, correlation_id, fields...]]``; this
    walks the type tag, the body's array header and the id, then reads the priority. A
    serializing queue uses it to put raw bytes in the band their message asked for.

    Raises:
        MessageDeserializationError: the bytes are not a message frame, are cut short
            before the priority, or carry a priority outside 0..255.
    """
    _, i = _tag_span(data)
    # the body: an array [message_id, priority, correlation_id, fields...]
    b = _uint_at(data, i, 1, "the message body")
    if 0x90 <= b <= 0x9F:
        size, i = b & 0x0F, i + 1
    elif b == 0xDC:
        size, i = _uint_at(data, i + 1, 2, "the message body"), i + 3
    elif b == 0xDD:
        size, i = _uint_at(data, i + 1, 4, "the message body"), i + 5
    else:
        raise MessageDeserializationError("malformed message: the message body is not an array")
    if size < 3:
        raise MessageDeserializationError(
            f"malformed message: the message body has {size} items, expected at least 3 "
            "(message_id, priority, correlation_id)"
        )
    b = _uint_at(data, i, 1, "the message id")
    if 0xC4 <= b <= 0xC6:  # bin 8 / 16 / 32
        width = 1 << (b - 0xC4)
        i += 1 + width + _uint_at(data, i + 1, width, "the message id")
    else:
        raise MessageDeserializationError("malformed message: the message id is not bytes")
    b = _uint_at(data, i, 1, "the priority")
    if b <= 0x7F:  # positive fixint
        priority = b
    elif b >= 0xE0:  # negative fixint
        priority = b - 0x100
    elif 0xCC <= b <= 0xCF:  # uint 8 / 16 / 32 / 64
        priority = _uint_at(data, i + 1, 1 << (b - 0xCC), "the priority")
    elif 0xD0 <= b <= 0xD3:  # int 8 / 16 / 32 / 64
        width = 1 << (b - 0xD0)
        priority = _uint_at(data, i + 1, width, "the priority")
        if priority >= 1 << (8 * width - 1):
            priority -= 1 << (8 * width)
    else:
        raise MessageDeserializationError("malformed message: the priority is not an int")
    if not 0 <= priority <= 255:
        raise MessageDeserializationError(
            f"malformed message: priority {priority} is outside 0..255"
        )
    return priority


def deserialize_message(data: bytes | bytearray | memoryview) -> RingKernelMessage:
    """Decode bytes written by :meth:`RingKernelMessage.serialize` into the right class.

    The class is found through the registry by its fully qualified name; array fields decode
    as read-only views on ``data`` (no copy).

    Raises:
        MessageDeserializationError: bytes are malformed or truncated, name an unknown type,
            or a field does not validate against the class.
    """
    try:
        view = memoryview(data)
    except TypeError as exc:
        raise MessageDeserializationError(
            f"expected bytes to deserialize, got {type(data).__name__}"
        ) from exc
    tag, offset = _read_tag(view)
    cls = _TYPES.get(tag)
    if cls is None:
        raise MessageDeserializationError(
            f"unknown message type {tag!r}: import the module that defines it before "
            "deserializing (message classes register when they are first used or defined)"
        )
    codec = cls._pdc_codec
    assert codec is not None
    try:
        return codec.build(codec.decoder.decode(view[offset:]))
    except Exception as exc:  # hooks and __post_init__ may raise anything on hostile input
        raise _decode_error(cls, codec, exc) from exc


def _decode_error(cls: type, codec: _Codec, exc: Exception) -> MessageDeserializationError:
    if isinstance(exc, msgspec.DecodeError):
        return MessageDeserializationError(
            f"cannot decode {cls.__name__}: {_name_fields(str(exc), codec.names)}"
        )
    return MessageDeserializationError(f"cannot decode {cls.__name__}: {type(exc).__name__}: {exc}")


_MISS = object()  # decode_frame: "not this class's frame"


def message_decoder() -> Callable[[Any], RingKernelMessage]:
    """:func:`deserialize_message` for one stream of messages (a queue's).

    The class of the previous message is tried first: its framed decoder checks the type
    tag itself (a ``Literal``), so while no class was registered since, the frame is
    decoded in one msgspec call, without parsing the tag, looking it up or slicing the
    body. Anything it does not accept goes through :func:`deserialize_message`, so results
    and errors are the same. By-reference classes (:class:`ArrayMessage`) always take that
    path: their decoding takes arrays out of the registry, which must not happen twice.
    """
    frame: Callable[[Any], Any] = _no_frame
    cls: type[RingKernelMessage] | None = None
    seen = -1

    def decode(data: Any) -> RingKernelMessage:
        nonlocal frame, cls, seen
        if seen == _types_version:
            msg = frame(data)
            if msg is not _MISS:
                return msg  # type: ignore[no-any-return]
            # not accepted: the general path decodes it or words the error
        msg = deserialize_message(data)
        t = type(msg)
        if t is not cls or seen != _types_version:
            found = t._pdc_codec
            usable = found is not None and not found.by_ref and _TYPES.get(t._pdc_tag) is t
            if usable:
                assert found is not None
                cls, frame, seen = t, found.decode_frame, _types_version
            else:
                cls, frame, seen = None, _no_frame, -1
        return msg

    return decode


def _no_frame(data: Any) -> Any:
    return _MISS


_PATH = re.compile(r"`\$\[(\d+)\]")
_HEADER = ("message_id", "priority", "correlation_id")


def _name_fields(text: str, names: tuple[str, ...]) -> str:
    """Turn msgspec's positional paths (``$[1]``) into field names (``priority``)."""

    def repl(m: re.Match[str]) -> str:
        i = int(m.group(1))
        all_names = _HEADER + names
        return f"`{all_names[i]}" if i < len(all_names) else m.group(0)

    return _PATH.sub(repl, text)


def serialize_message(msg: RingKernelMessage) -> bytes:
    """Function form of :meth:`RingKernelMessage.serialize`."""
    return msg.serialize()


def get_message_type(name: str) -> type[RingKernelMessage] | None:
    """Look up a registered message class by fully qualified or (unique) short name."""
    cls = _TYPES.get(name)
    if cls is not None:
        return cls
    matches = [c for tag, c in _TYPES.items() if tag.rsplit(".", 1)[-1] == name]
    return matches[0] if len(matches) == 1 else None


def registered_message_types() -> dict[str, type[RingKernelMessage]]:
    """A snapshot of the registry: fully qualified name -> class."""
    return dict(_TYPES)


# --- the decorators --------------------------------------------------------------------------


def _make_message_class(cls: type[_T], base: type[RingKernelMessage]) -> type[_T]:
    if isinstance(cls, type) and issubclass(cls, RingKernelMessage) and "__slots__" in vars(cls):
        new_cls: type[Any] = cls
    else:
        ns = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
        bases = cls.__bases__ if issubclass(cls, base) else (base,)
        if bases == (object,):
            bases = (base,)
        new_cls = type(cls.__name__, bases, ns)
        new_cls.__qualname__ = cls.__qualname__
        new_cls.__module__ = cls.__module__
        new_cls = dataclass(slots=True)(new_cls)
    if base is ArrayMessage:
        new_cls._pdc_by_reference = True
    _install_fast_init(new_cls)
    _finalize(new_cls)
    dtype = _compute_dtype(new_cls)
    new_cls._pdc_dtype = dtype
    if dtype is not None and "dtype" not in {f.name for f in dataclasses.fields(new_cls)}:
        new_cls.dtype = dtype
    return new_cls


_HAS_FACTORY = object()
_HEADER_DEFAULTS = {"message_id": "None", "priority": "128", "correlation_id": "None"}


def _bad_priority(value: object) -> None:
    _check_priority(value)


def _install_fast_init(cls: type) -> None:
    """Replace the dataclass ``__init__`` with an equivalent generated one.

    Same signature and semantics (defaults, factories, keyword-only header, ``init=False``
    fields, a user ``__post_init__``), but the header goes straight into its slots and the
    priority check is inline: building a message is the hot path of every actor.
    """
    env: dict[str, Any] = {
        "_P128": 128,
        "_bad_priority": _bad_priority,
        "_HAS_FACTORY": _HAS_FACTORY,
    }
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):
        name = f.name
        if name in _HEADER_DEFAULTS:
            keyword.append(f"{name}={_HEADER_DEFAULTS[name]}")
            continue
        has_factory = f.default_factory is not dataclasses.MISSING
        if has_factory:
            env[f"_fact_{name}"] = f.default_factory
        if f.default is not dataclasses.MISSING:
            env[f"_dflt_{name}"] = f.default
        if not f.init:
            if has_factory:
                body.append(f"    self.{name} = _fact_{name}()")
            elif f.default is not dataclasses.MISSING:
                body.append(f"    self.{name} = _dflt_{name}")
            continue
        if has_factory:
            param = f"{name}=_HAS_FACTORY"
            body.append(f"    self.{name} = _fact_{name}() if {name} is _HAS_FACTORY else {name}")
        else:
            param = name if f.default is dataclasses.MISSING else f"{name}=_dflt_{name}"
            body.append(f"    self.{name} = {name}")
        (keyword if f.kw_only else positional).append(param)
    body += [
        # every header slot is written (None reads as "no id yet" / "no correlation"), so
        # the runtime never meets an unset slot (an AttributeError) on its hot path
        "    self._pdc_mid = message_id",
        # the default priority (the small-int singleton) skips the range check
        "    if priority is not _P128 and (",
        "        priority.__class__ is not int or priority < 0 or priority > 255",
        "    ):",
        "        _bad_priority(priority)",
        "    self.priority = priority",
        "    self._pdc_cid = correlation_id",
    ]
    post = cls.__post_init__  # type: ignore[attr-defined]
    if post is not RingKernelMessage.__post_init__:
        body.append("    self.__post_init__()")
    params = ", ".join(["self", *positional, "*", *keyword])
    src = f"def __init__({params}) -> None:\n" + "\n".join(body or ["    pass"])
    exec(src, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__  # type: ignore[misc]
    cls.__init__ = init  # type: ignore[misc]


@overload
@typing.dataclass_transform(field_specifiers=(dataclasses.field, field))
def message(cls: type[_T], /) -> type[_T]: ...
@overload
@typing.dataclass_transform(field_specifiers=(dataclasses.field, field))
def message(cls: None = None, /) -> Callable[[type[_T]], type[_T]]: ...


@typing.dataclass_transform(field_specifiers=(dataclasses.field, field))
def message(cls: type[_T] | None = None, /) -> type[_T] | Callable[[type[_T]], type[_T]]:
    """Turn a class with annotated fields into a message (bare ``@message`` or ``@message()``).

    The result is a slotted dataclass inheriting :class:`RingKernelMessage`, registered for
    :func:`deserialize_message` under its fully qualified name.
    """
    if cls is None:
        return lambda c: _make_message_class(c, RingKernelMessage)
    return _make_message_class(cls, RingKernelMessage)


# --- fixed layout ----------------------------------------------------------------------------

_HEADER_FIELDS: list[tuple[str, Any]] = [
    ("_mid_hi", np.uint64),
    ("_mid_lo", np.uint64),
    ("_cid_hi", np.uint64),
    ("_cid_lo", np.uint64),
    ("_priority", np.uint32),
]
_HEADER_NAMES = frozenset(n for n, _ in _HEADER_FIELDS)
_SCALARS: dict[Any, Any] = {int: np.int64, float: np.float64, bool: np.bool_}
_MASK64 = (1 << 64) - 1


def _field_layout(tp: Any) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
    if tp in _SCALARS:
        return np.dtype(_SCALARS[tp]), ()
    if isinstance(tp, type) and issubclass(tp, np.generic) and tp not in (np.generic, np.number):
        dt = np.dtype(tp)
        return (dt, ()) if dt.itemsize > 0 and not dt.hasobject else None
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        shape = next((m for m in meta if isinstance(m, tuple)), None)
        dt_meta = next((m for m in meta if _is_dtype_like(m)), None)
        if (typing.get_origin(base) or base) is np.ndarray and shape is not None and dt_meta:
            return np.dtype(dt_meta), tuple(int(s) for s in shape)
        if base in _SCALARS and dt_meta is not None and shape is None:
            return np.dtype(dt_meta), ()
    return None


def _is_dtype_like(obj: Any) -> bool:
    if isinstance(obj, (np.dtype, str)):
        return True
    return isinstance(obj, type) and issubclass(obj, np.generic)


def _compute_dtype(cls: type) -> np.dtype[Any] | None:
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # unresolved forward references: not a fixed layout
        return None
    entries: list[tuple[str, Any, tuple[int, ...]]] = []
    for f in dataclasses.fields(cls):
        if f.name in ("message_id", "priority", "correlation_id"):
            continue
        layout = _field_layout(hints.get(f.name))
        if layout is None or f.name in _HEADER_NAMES:
            return None
        entries.append((f.name, layout[0], layout[1]))
    spec = [(n, t) for n, t in _HEADER_FIELDS] + [(n, t, s) if s else (n, t) for n, t, s in entries]
    return np.dtype(spec, align=True)


def fixed_layout_dtype(cls: type) -> np.dtype[Any] | None:
    """The structured dtype of a fixed-layout message class, or None."""
    return getattr(cls, "_pdc_dtype", None)


def is_fixed_layout(cls: type) -> bool:
    """True when every field of the message class has a fixed size (GPU-ring capable)."""
    return fixed_layout_dtype(cls) is not None


def _require_dtype(cls: type) -> np.dtype[Any]:
    dtype = fixed_layout_dtype(cls)
    if dtype is None:
        raise TypeValidationError(
            f"{cls.__name__} is not a fixed-layout message: every field must be a fixed-size "
            "scalar (int, float, bool, np.float32, ...) or Annotated[np.ndarray, (shape,), dtype]"
        )
    return dtype


def _to_records(cls: type, messages: Sequence[RingKernelMessage]) -> np.ndarray[Any, Any]:
    dtype = _require_dtype(cls)
    out = np.zeros(len(messages), dtype=dtype)
    names = [n for n in dtype.names or () if n not in _HEADER_NAMES]
    for i, m in enumerate(messages):
        if not isinstance(m, cls):
            raise TypeValidationError(f"to_records expects {cls.__name__}, got {type(m).__name__}")
        rec = out[i]
        mid = m.message_id.int
        rec["_mid_hi"], rec["_mid_lo"] = mid >> 64, mid & _MASK64
        cid = 0 if m.correlation_id is None else m.correlation_id.int
        rec["_cid_hi"], rec["_cid_lo"] = cid >> 64, cid & _MASK64
        rec["_priority"] = m.priority
        for n in names:
            rec[n] = getattr(m, n)
    return out


def _uuid_from(hi: Any, lo: Any) -> uuid.UUID | None:
    value = (int(hi) << 64) | int(lo)
    return uuid.UUID(int=value) if value else None


def _from_records(cls: type[_M], records: np.ndarray[Any, Any]) -> list[_M]:
    dtype = _require_dtype(cls)
    if records.dtype != dtype:
        raise TypeValidationError(
            f"records have dtype {records.dtype}, expected {cls.__name__}.dtype {dtype}"
        )
    names = [n for n in dtype.names or () if n not in _HEADER_NAMES]
    shapes = {n: dtype.fields[n][0].shape for n in names}  # type: ignore[index]
    out: list[_M] = []
    for rec in records:
        kwargs: dict[str, Any] = {}
        for n in names:
            v = rec[n]
            kwargs[n] = np.array(v) if shapes[n] else v.item()
        mid = _uuid_from(rec["_mid_hi"], rec["_mid_lo"])
        if mid is not None:
            kwargs["message_id"] = mid
        kwargs["correlation_id"] = _uuid_from(rec["_cid_hi"], rec["_cid_lo"])
        kwargs["priority"] = int(rec["_priority"])
        out.append(cls(**kwargs))
    return out


# --- by-reference arrays ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BufferHandle:
    """A reference to an array held by the process-wide :class:`BufferRegistry`."""

    buffer_id: int
    shape: tuple[int, ...]
    dtype: str
    device: str


class BufferRegistry:
    """Process-wide table of arrays passed by reference, with reference counts.

    ``register`` pins an array (count + 1) and returns a handle; ``get`` looks it up;
    ``release`` unpins it (count - 1) and forgets it at zero. Serializing an
    :class:`ArrayMessage` registers its arrays; deserializing it takes them back (the
    decoder releases the reference the encoder made), so a serialize/deserialize pair
    leaves the registry as it was. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, list[Any]] = {}  # id -> [array, refcount]
        self._by_object: dict[int, int] = {}  # id(array) -> buffer id
        self._next = itertools.count(1)
        self._registered = 0
        self._released = 0

    def register(self, array: Any) -> BufferHandle:
        """Pin ``array`` and return its handle (the same id if it is already pinned)."""
        with self._lock:
            bid = self._by_object.get(id(array))
            if bid is None or self._entries[bid][0] is not array:
                bid = next(self._next)
                self._entries[bid] = [array, 0]
                self._by_object[id(array)] = bid
            self._entries[bid][1] += 1
            self._registered += 1
        device = "cuda" if hasattr(array, "__cuda_array_interface__") else "cpu"
        return BufferHandle(bid, tuple(array.shape), str(array.dtype), device)

    def get(self, buffer_id: int | BufferHandle) -> Any:
        """The array behind ``buffer_id``; KeyError (with the id) if it was released."""
        bid = buffer_id.buffer_id if isinstance(buffer_id, BufferHandle) else buffer_id
        with self._lock:
            entry = self._entries.get(bid)
        if entry is None:
            raise KeyError(f"no buffer with id {bid} in the registry (released or never made)")
        return entry[0]

    def release(self, buffer_id: int | BufferHandle) -> bool:
        """Drop one reference; returns True when the array was forgotten."""
        bid = buffer_id.buffer_id if isinstance(buffer_id, BufferHandle) else buffer_id
        with self._lock:
            entry = self._entries.get(bid)
            if entry is None:
                raise KeyError(f"no buffer with id {bid} in the registry (released or never made)")
            entry[1] -= 1
            self._released += 1
            if entry[1] <= 0:
                del self._entries[bid]
                self._by_object.pop(id(entry[0]), None)
                return True
            return False

    def take(self, buffer_id: int) -> Any:
        """``get`` then ``release``: how the decoder consumes a reference."""
        array = self.get(buffer_id)
        self.release(buffer_id)
        return array

    def refcount(self, buffer_id: int | BufferHandle) -> int:
        bid = buffer_id.buffer_id if isinstance(buffer_id, BufferHandle) else buffer_id
        with self._lock:
            entry = self._entries.get(bid)
            return 0 if entry is None else int(entry[1])

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_object.clear()

    def get_stats(self) -> dict[str, int]:
        with self._lock:
            nbytes = sum(int(getattr(a, "nbytes", 0)) for a, _ in self._entries.values())
            return {
                "live_buffers": len(self._entries),
                "live_bytes": nbytes,
                "total_registered": self._registered,
                "total_released": self._released,
            }


_registry = BufferRegistry()


def get_buffer_registry() -> BufferRegistry:
    """The process-wide :class:`BufferRegistry`."""
    return _registry


def register_buffer(array: Any) -> BufferHandle:
    """Pin ``array`` in the process-wide registry."""
    return _registry.register(array)


def get_buffer(buffer_id: int | BufferHandle) -> Any:
    """Look up a pinned array."""
    return _registry.get(buffer_id)


def release_buffer(buffer_id: int | BufferHandle) -> bool:
    """Unpin an array; True when it was forgotten."""
    return _registry.release(buffer_id)


def release_frame(data: Any) -> int:
    """Give back the array references held by a serialized :class:`ArrayMessage` that will
    never be decoded (a queue dropped or cleared it); returns how many were released.

    Decoding such a frame takes its arrays out of the registry; a frame thrown away unread
    must release them instead, or they stay pinned for the life of the process. Bytes of
    any other kind (a plain message, not a message at all) are left alone, and nothing
    here raises: it runs while a queue discards messages.
    """
    if not _registry._entries:  # nothing pinned: nothing a frame could hold
        return 0
    try:
        view = memoryview(data)
        tag, offset = _read_tag(view)
    except (TypeError, MessageDeserializationError):
        return 0
    cls = _TYPES.get(tag)
    if cls is None or not cls._pdc_by_reference:
        return 0
    ids: list[int] = []

    def collect(code: int, payload: memoryview) -> None:
        if code == _EXT_BUFFER_REF and len(payload) == 8:
            ids.append(int.from_bytes(payload, "little"))

    # an untyped walk of the body: every reference the encoder wrote, wherever it is
    with contextlib.suppress(Exception):  # malformed: release what was read before it
        msgspec.msgpack.Decoder(ext_hook=collect).decode(view[offset:])
    released = 0
    for bid in ids:
        with contextlib.suppress(KeyError):  # already taken (decoded elsewhere)
            _registry.release(bid)
            released += 1
    return released


@dataclass(slots=True)
class ArrayMessage(RingKernelMessage):
    """A message whose array fields (NumPy or CuPy) cross serialization *by reference*.

    Serializing registers each array in the :class:`BufferRegistry` and writes only its id;
    deserializing in the same process takes the array back. Use it for large arrays moving
    between actors of one process with ``serialize=True`` queues; across processes use a
    plain ``@message`` (arrays are copied into the bytes). A frame that is never decoded
    must give its arrays back with :func:`release_frame`; queues do so for the frames they
    drop (``drop_oldest``) or clear.
    """

    _pdc_by_reference: ClassVar[bool] = True


@typing.dataclass_transform(field_specifiers=(dataclasses.field, field))
def array_message(cls: type[_T] | None = None, /) -> Any:
    """Like :func:`message`, but the class inherits :class:`ArrayMessage`."""
    if cls is None:
        return lambda c: _make_message_class(c, ArrayMessage)
    return _make_message_class(cls, ArrayMessage)
