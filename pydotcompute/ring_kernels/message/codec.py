"""The wire codec and the message registry.

Design notes:
- A message class is a tagged, array-like `msgspec.Struct`, so its frame is the one
  MessagePack array msgspec writes: `[type_tag, field_1, ..., field_n, message_id,
  priority, correlation_id]` (the header fields are keyword-only, and msgspec puts those
  last). The tag is the class's fully qualified name. Encoding and decoding are one call
  into msgspec's C core with a typed `Decoder` per class, which also validates every field
  (and the priority range) while decoding.
- The registry maps tags to classes for `deserialize_message`; it also holds each class's
  `Codec` (decoder, encoder, whether arrays travel by reference).
- A tag names one wire layout. Registering a class under a tag another class holds is
  refused unless both have the same layout (field names and types, in order, and whether
  arrays travel by reference): that is a class defined again (a module reloaded, a class
  shipped by value), and the newer class takes the tag. Otherwise a frame of one would
  decode as the other, as two classes of one factory function would (same qualified name).
  Even with the same layout the takeover is refused while a live kernel declares the
  class holding the tag (`declared.declared_by`): that kernel's frames would decode as the
  new class. The replaced class's codec says so (`Codec.holds_tag`), which is how sends
  of its messages are refused (`fields`, `identity`).
- Past 600 lines: the wire format and the registry share the tag table and its lock, so
  they stay in one module; what builds on them (field checks, declared types) does not.
- A stream of frames (a queue's, a process ring's) is decoded by `message_decoder()`: it
  tries the previous frame's class first (msgspec checks the tag itself) and falls back to
  the dispatching path, so results and errors are the same. `Cls.deserialize` does the
  same with `Cls` (`DIRECT_DECODERS`): no tag is read and no registry lookup is made.
- Errors name the field path: msgspec's positional paths (`$[3][1]`) are turned into
  field names (`inner.y`).
"""

from __future__ import annotations

import re
import threading
import types
import typing
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from ...exceptions import (
    MessageDeserializationError,
    MessageSerializationError,
    TypeValidationError,
)
from .._native import message_extension
from .arrays import dec_hook, enc_hook, enc_hook_by_reference, ext_hook, release_references
from .declared import check_not_declared

__all__ = (
    "DIRECT_DECODERS",
    "DIRECT_ENCODERS",
    "HEADER_NAMES",
    "Codec",
    "FrameHeader",
    "WireId",
    "codec_of",
    "deserialize_message",
    "frame_header",
    "frame_priority",
    "get_message_type",
    "holds_its_tag",
    "message_decoder",
    "message_field_names",
    "message_tag",
    "python_deserialize_message",
    "register_message_type",
    "registered_message_types",
    "release_frame",
)

#: The header fields every message carries, in wire order (after the fields).
HEADER_NAMES: tuple[str, str, str] = ("message_id", "priority", "correlation_id")

_ENCODER = msgspec.msgpack.Encoder(enc_hook=enc_hook, uuid_format="bytes")
_REF_ENCODER = msgspec.msgpack.Encoder(enc_hook=enc_hook_by_reference, uuid_format="bytes")
_Priority = Annotated[int, msgspec.Meta(ge=0, le=255)]
#: How a message id is typed for decoding: its 16 bytes (`uuid.UUID` values encode as those).
WireId = Annotated[bytes, msgspec.Meta(min_length=16, max_length=16)]


def message_tag(cls: type) -> str:
    """The type tag of a message class: its fully qualified name.

    A script's main module is `__mp_main__` in a multiprocessing child; its classes are
    the same classes as in the parent's `__main__`, so they get the same tag.
    """
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    return f"{module}.{cls.__qualname__}"


class Codec:
    """The encoder and typed decoder of one message class."""

    __slots__ = (
        "_header",
        "by_reference",
        "check",
        "cls",
        "decode",
        "encode",
        "holds_tag",
        "names",
        "nested",
        "tag",
    )

    def __init__(self, cls: type[msgspec.Struct], tag: str, *, by_reference: bool) -> None:
        self.cls = cls
        self.tag = tag
        self.by_reference = by_reference
        self.names: tuple[str, ...] = cls.__struct_fields__
        #: fields whose annotation mentions a message class: their ids are made before
        #: encoding (msgspec writes the slots as stored, and a new message stores None)
        self.nested: tuple[str, ...] = tuple(
            f.name for f in msgspec.structs.fields(cls) if _mentions_message(f.type)
        )
        self.encode: Callable[[Any], bytes] = (_REF_ENCODER if by_reference else _ENCODER).encode
        decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
            cls, ext_hook=ext_hook(by_reference=by_reference), dec_hook=dec_hook
        )
        self.decode: Callable[[Any], Any] = decoder.decode
        self._header: Callable[[Any], Any] | None = None
        #: ``[True]`` while the class holds its tag; ``[False]`` once another class of
        #: its name took the tag over (a cell: checks built from it see the change)
        self.holds_tag: list[bool] = [True]
        #: the cheap check of an instance's fields (built on first use by `fields`)
        self.check: Callable[[Any], bool] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # a class pickled by value (Ray ships classes defined in `__main__` so) carries
        # its codec attribute: rebuilt where it lands, from the class
        return (_rebuilt_codec, (self.cls, self.by_reference))

    def header_of(self, data: Any) -> Any:
        """The header of a frame of this class, its fields skipped undecoded (not checked)."""
        if self._header is None:
            n = len(self.names) - len(HEADER_NAMES)
            fields: list[Any] = [(f"f{i}", msgspec.Raw) for i in range(n)]
            # the header is required here: a queue must not guess the band of a frame
            fields += [
                ("message_id", WireId | None),
                ("priority", _Priority),
                ("correlation_id", WireId | None),
            ]
            head = msgspec.defstruct(
                "FrameHeader", fields, tag=self.tag, array_like=True, forbid_unknown_fields=False
            )
            head_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(head)
            self._header = head_decoder.decode
        return self._header(data)


def _mentions_message(tp: Any) -> bool:
    if isinstance(tp, type) and "message_id" in getattr(tp, "__struct_fields__", ()):
        return True
    # an `Any` field is left alone: a message in it decodes as a plain list, ids unused
    return any(_mentions_message(a) for a in typing.get_args(tp))


_TYPES: dict[str, type] = {}
_CODECS: dict[type, Codec] = {}
#: Class -> the encode function `serialize` may call as it is: every registered class but
#: those with nested messages (their ids are made in Python first). Read by the compiled
#: `serialize`; written here under the lock.
DIRECT_ENCODERS: dict[type, Callable[[Any], bytes]] = {}
#: Class -> the typed decode function `Cls.deserialize` tries first: every registered class
#: that holds its tag, but by-reference ones (decoding those takes arrays out of the
#: registry, which a failed try must not do). Written here under the lock.
DIRECT_DECODERS: dict[type, Callable[[Any], Any]] = {}
_LOCK = threading.Lock()
_version = 0  # bumped on every registration: a stream decoder's cached class checks it
_ext = message_extension()  # the compiled stream decoder, when built


def register_message_type(cls: type, *, by_reference: bool | None = None) -> Codec:
    """Register a message class for `deserialize_message` and build its codec.

    `@message` calls this; call it yourself only for a class that arrived by value (a Ray
    worker unpickling a class defined in `__main__`). Registering again is harmless.

    Raises:
        TypeValidationError: `cls` is not a `@message` class (its tag is not its own name,
            as for a subclass of a message left undecorated) or has a field type msgspec
            cannot decode.
    """
    config = getattr(cls, "__struct_config__", None)
    tag = message_tag(cls)
    if config is not None and config.tag is None and "message_id" in cls.__struct_fields__:  # type: ignore[attr-defined]
        raise TypeValidationError(
            f"message class {tag} arrived without its msgspec configuration: it was pickled "
            "by value (as Ray ships classes defined in __main__ or in a function), which "
            "does not carry a Struct's fields; define message classes at module level in a "
            "module the receiving process can import"
        )
    if config is None or config.tag != tag:
        raise TypeValidationError(
            f"{cls.__qualname__} is not a @message class (its wire tag is "
            f"{getattr(config, 'tag', None)!r}, expected {tag!r}); decorate it with @message, "
            "subclasses of a message class included"
        )
    if by_reference is None:
        known = _CODECS.get(cls)
        by_reference = known.by_reference if known is not None else False
    try:
        codec = Codec(cls, tag, by_reference=by_reference)
    except TypeError as exc:
        raise TypeValidationError(
            f"message class {cls.__name__} has a field type msgspec cannot decode: {exc}"
        ) from exc
    global _version
    with _LOCK:
        held = _TYPES.get(tag)
        if held is not None and held is not cls:
            _check_same_layout(tag, _CODECS[held], codec)
            check_not_declared(tag, held)
            DIRECT_DECODERS.pop(held, None)  # its frames now decode as the new class
            _CODECS[held].holds_tag[0] = False
        known = _CODECS.get(cls)
        if known is not None:  # registered again: checks built before see one cell
            codec.holds_tag = known.holds_tag
            codec.holds_tag[0] = True
        type.__setattr__(cls, "_pdc_codec", codec)  # what `serialize` reads first
        _CODECS[cls] = codec
        _TYPES[tag] = cls
        if codec.nested:
            DIRECT_ENCODERS.pop(cls, None)
        else:
            DIRECT_ENCODERS[cls] = codec.encode
        if by_reference:
            DIRECT_DECODERS.pop(cls, None)
        else:
            DIRECT_DECODERS[cls] = codec.decode
        _version += 1
        if _ext is not None:
            _ext.registry_changed()
    return codec


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return (
            tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
        )
    return repr(tp)


def _layout(codec: Codec) -> tuple[Any, ...]:
    """What decides how a frame of the class reads: its fields, their types, by reference."""
    fields = msgspec.structs.fields(codec.cls)  # type: ignore[arg-type]
    return (codec.by_reference, tuple((f.name, _type_name(f.type)) for f in fields))


def _describe(codec: Codec) -> str:
    """`Order(account: str, amount: int)`: the class by its fields (header left out)."""
    fields = msgspec.structs.fields(codec.cls)  # type: ignore[arg-type]
    body = ", ".join(
        f"{f.name}: {_type_name(f.type)}" for f in fields if f.name not in HEADER_NAMES
    )
    kind = "@array_message " if codec.by_reference else ""
    return f"{kind}{codec.cls.__name__}({body})"


def _check_same_layout(tag: str, held: Codec, new: Codec) -> None:
    """Refuse `new` a tag that `held` (another class) has, unless their layouts agree."""
    if _layout(held) == _layout(new):
        return  # the same class defined again: the newer one takes the tag
    raise TypeValidationError(
        f"message type tag {tag!r} is taken: {_describe(held)} is registered under it, and "
        f"another class of the same qualified name, {_describe(new)}, cannot be (a frame of "
        "one would decode as the other). Give each message class its own name: define it "
        "at module level under a distinct name or, in a function that makes several "
        "(a factory), set a distinct __qualname__ on the class before decorating it. A class "
        "redefined with the same fields (a module reloaded) takes the tag over instead"
    )


def holds_its_tag(cls: type) -> bool:
    """True unless ``cls`` is a message class whose tag another class took over since (a
    module reloaded, a factory that made the class twice): frames of the tag decode into
    that other class. A class that is not a message holds no tag: True."""
    codec = _CODECS.get(cls)
    return codec is None or codec.holds_tag[0]


def _rebuilt_codec(cls: type, by_reference: bool) -> Codec:
    known = _CODECS.get(cls)
    return known if known is not None else register_message_type(cls, by_reference=by_reference)


def codec_of(cls: type) -> Codec:
    """The codec of a registered message class (registered now if it was not)."""
    codec = _CODECS.get(cls)
    return codec if codec is not None else register_message_type(cls)


def message_field_names(cls: type) -> tuple[str, ...]:
    """The fields of a message class in declaration (and wire) order, header left out.

    The msgspec equivalent of `[f.name for f in dataclasses.fields(cls)]` without the
    header is `msgspec.structs.fields(cls)`; this is the names alone.
    """
    fields: tuple[str, ...] = cls.__struct_fields__  # type: ignore[attr-defined]
    return tuple(n for n in fields if n not in HEADER_NAMES)


def get_message_type(name: str) -> type | None:
    """Look up a registered message class by fully qualified or (unique) short name."""
    cls = _TYPES.get(name)
    if cls is not None:
        return cls
    matches = [c for tag, c in _TYPES.items() if tag.rsplit(".", 1)[-1] == name]
    return matches[0] if len(matches) == 1 else None


def registered_message_types() -> dict[str, type]:
    """A snapshot of the registry: fully qualified name -> class."""
    return dict(_TYPES)


# --- reading frames --------------------------------------------------------------------------

_MIN_ITEMS = 1 + len(HEADER_NAMES)  # the tag and the header


def _truncated(what: str) -> MessageDeserializationError:
    return MessageDeserializationError(f"truncated message: {what} is cut short")


def _uint_at(data: memoryview, i: int, size: int, what: str) -> int:
    end = i + size
    if end > len(data):
        raise _truncated(what)
    return int.from_bytes(data[i:end], "big")


class _Head(msgspec.Struct, array_like=True):
    """The first item of a frame (its type tag); msgspec skips the rest in C."""

    tag: str


_head = msgspec.msgpack.Decoder(_Head).decode


def _codec_of_frame(data: Any) -> Codec:
    """The codec of a frame's class: its tag read in one msgspec call; when that finds no
    registered class, the checks of `_read_tag` say what is wrong with the bytes."""
    try:
        cls = _TYPES.get(_head(data).tag)
    except Exception:  # not a frame, or cut short
        cls = None
    if cls is None:
        cls = _class_of(_read_tag(_view(data)))
    return _CODECS[cls]


def _read_tag(data: memoryview) -> str:
    """The type tag of a frame, after checking the array header around it."""
    n = len(data)
    b = data[0] if n else -1
    if 0x90 <= b <= 0x9F:
        items, i = b & 0x0F, 1
    elif b == 0xDC:
        items, i = _uint_at(data, 1, 2, "the message array"), 3
    elif b == 0xDD:
        items, i = _uint_at(data, 1, 4, "the message array"), 5
    else:
        raise MessageDeserializationError(
            f"not a pydotcompute message: expected a MessagePack array, "
            f"got {bytes(data[:8])!r}{'...' if n > 8 else ''}"
        )
    if items < _MIN_ITEMS:
        raise MessageDeserializationError(
            f"malformed message: the array has {items} items, expected at least "
            f"{_MIN_ITEMS} (type tag, message_id, priority, correlation_id)"
        )
    b = _uint_at(data, i, 1, "the type tag")
    if 0xA0 <= b <= 0xBF:
        size, i = b & 0x1F, i + 1
    elif b == 0xD9:
        size, i = _uint_at(data, i + 1, 1, "the type tag"), i + 2
    elif b == 0xDA:
        size, i = _uint_at(data, i + 1, 2, "the type tag"), i + 3
    else:
        raise MessageDeserializationError("malformed message: the type tag is not a string")
    if i + size > n:
        raise _truncated("the type tag")
    try:
        return str(data[i : i + size], "utf-8")
    except UnicodeDecodeError as exc:
        raise MessageDeserializationError("malformed message: the type tag is not UTF-8") from exc


def _view(data: Any) -> memoryview:
    try:
        return memoryview(data)
    except TypeError as exc:
        raise MessageDeserializationError(
            f"expected bytes to deserialize, got {type(data).__name__}"
        ) from exc


def _class_of(tag: str) -> type:
    cls = _TYPES.get(tag)
    if cls is None:
        raise MessageDeserializationError(
            f"unknown message type {tag!r}: import the module that defines it before "
            "deserializing (message classes register when they are defined)"
        )
    return cls


def python_deserialize_message(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes written by `RingKernelMessage.serialize` into the right class.

    `deserialize_message` in Python: with the extension built, `deserialize_message` is
    `fast_message.decode_frame`, which finds a class whose tag it has seen by the tag's
    bytes and calls this for the rest (the same results and errors).

    The class is found through the registry by its fully qualified name; every field is
    validated against its annotation; array fields decode as read-only views on `data`
    (no copy).

    Raises:
        MessageDeserializationError: bytes are malformed or truncated, name an unknown type,
            or a field does not validate (the message names the field path).
    """
    codec = _codec_of_frame(data)
    try:
        return codec.decode(data)
    except Exception as exc:  # hooks and __post_init__ may raise anything on hostile input
        raise decode_error(codec, exc) from exc


deserialize_message: Callable[[bytes | bytearray | memoryview], Any] = python_deserialize_message
if _ext is not None:
    _ext.bind_decoding(DIRECT_DECODERS, python_deserialize_message)
    deserialize_message = _ext.decode_frame


def frame_priority(data: bytes | bytearray | memoryview) -> int:
    """The `priority` in the header of a serialized message, its fields left undecoded.

    A serializing queue uses it to put raw bytes in the band their message asked for.

    Raises:
        MessageDeserializationError: the bytes are not a frame of a registered message,
            are cut short, or carry a priority outside 0..255.
    """
    codec = _codec_of_frame(data)
    try:
        return int(codec.header_of(data).priority)
    except Exception as exc:
        raise decode_error(codec, exc) from exc


class FrameHeader(typing.NamedTuple):
    """What `frame_header` reads from a frame: its class and header."""

    message_type: type
    message_id: uuid.UUID | None
    priority: int
    correlation_id: uuid.UUID | None


def frame_header(data: bytes | bytearray | memoryview) -> FrameHeader:
    """The class and header of a serialized message, its fields skipped, not checked.

    A frame whose fields do not decode still has a readable header: a runtime that meets
    a `MessageDeserializationError` decoding a frame reads this to report the error for
    that one message (its `message_id` is what a waiting `send_and_receive` caller is
    keyed by; its `correlation_id` says which request a bad reply answers).

    Raises:
        MessageDeserializationError: the bytes are not a frame of a registered message, or
            its header itself is malformed.
    """
    codec = _codec_of_frame(data)
    try:
        head = codec.header_of(data)
    except Exception as exc:
        raise decode_error(codec, exc) from exc
    mid, cid = head.message_id, head.correlation_id
    return FrameHeader(
        codec.cls,
        None if mid is None else uuid.UUID(bytes=bytes(mid)),
        int(head.priority),
        None if cid is None else uuid.UUID(bytes=bytes(cid)),
    )


def release_frame(data: Any) -> int:
    """Give back the array references held by a serialized `ArrayMessage` that will
    never be decoded (a queue dropped or cleared it); returns how many were released.

    Decoding such a frame takes its arrays out of the registry; a frame thrown away unread
    must release them instead, or they stay pinned for the life of the process. Bytes of
    any other kind (a plain message, not a message at all) are left alone, and nothing
    here raises: it runs while a queue discards messages.
    """
    try:
        view = memoryview(data)
        cls = _TYPES.get(_read_tag(view))
    except (TypeError, MessageDeserializationError):
        return 0
    codec = _CODECS.get(cls) if cls is not None else None
    if codec is None or not codec.by_reference:
        return 0
    return release_references(view)


def message_decoder() -> Callable[[Any], Any]:
    """`deserialize_message` for one stream of frames (a queue's, a process ring's).

    The class of the previous frame is tried first: its typed decoder checks the tag
    itself, so a stream of one class decodes in one msgspec call. Anything it does not
    accept goes through `deserialize_message`, so results and errors are the same.
    By-reference classes always take that path: decoding them takes arrays out of the
    registry, which must not happen twice. With the extension built this is
    `fast_message.StreamDecoder`; `python_message_decoder` is its twin.
    """
    if _ext is not None:
        stream = _ext.StreamDecoder(deserialize_message, _fast_decode_of)
        decode: Callable[[Any], Any] = stream.decode
        return decode
    return python_message_decoder()


def _fast_decode_of(cls: type) -> Callable[[Any], Any] | None:
    """The typed decode function a stream may call directly for frames of `cls`."""
    codec = _CODECS[cls]
    return None if codec.by_reference else codec.decode


def python_message_decoder() -> Callable[[Any], Any]:
    """`message_decoder` in Python (used when the extension is not built)."""
    fast: Callable[[Any], Any] | None = None
    last: type | None = None
    seen = -1

    def decode(data: Any) -> Any:
        nonlocal fast, last, seen
        if fast is not None and seen == _version:
            try:
                return fast(data)
            except Exception:  # another class, or bad bytes: the general path says which
                pass
        msg = deserialize_message(data)
        t = type(msg)
        if t is not last or seen != _version:
            last, seen = t, _version
            fast = _fast_decode_of(t)
        return msg

    return decode


# --- errors ----------------------------------------------------------------------------------

_PATH = re.compile(r"\$((?:\[\d+\])+)")
_INDEX = re.compile(r"\[(\d+)\]")


def _message_in(tp: Any) -> type | None:
    """The message class `tp` is (or an `Optional`/union of), else None."""
    if isinstance(tp, type) and tp in _CODECS:
        return tp
    for arg in (
        typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ()
    ):
        if isinstance(arg, type) and arg in _CODECS:
            return arg
    return None


def _item_type(tp: Any, i: int) -> Any:
    """The type of item `i` of a container annotated `tp`, or None."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, set, frozenset) and args:
        return args[0]
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return args[i] if i < len(args) else None
    return None


def _field_path(cls: type, indices: list[int]) -> str:
    """`inner.y`, `items[0].a` for the positional path `[i, j, ...]` into a frame of `cls`."""
    out = ""
    tp: Any = cls
    for i in indices:
        msg_cls = _message_in(tp)
        if msg_cls is not None:
            fields = msgspec.structs.fields(msg_cls)  # type: ignore[arg-type]
            if 1 <= i <= len(fields):  # item 0 is the tag
                f = fields[i - 1]
                out = f"{out}.{f.name}" if out else f.name
                tp = f.type
                continue
            if i == 0:
                out = f"{out}.<type tag>" if out else "<type tag>"
                tp = None
                continue
        out += f"[{i}]"
        tp = _item_type(tp, i)
    return out


def decode_error(codec: Codec, exc: BaseException) -> MessageDeserializationError:
    """A `MessageDeserializationError` for a failed decode, naming the field path."""
    name = codec.cls.__name__
    if isinstance(exc, msgspec.DecodeError):
        text = _PATH.sub(
            lambda m: _field_path(codec.cls, [int(x) for x in _INDEX.findall(m.group(1))]),
            str(exc),
        )
        return MessageDeserializationError(f"cannot decode {name}: {text}")
    return MessageDeserializationError(f"cannot decode {name}: {type(exc).__name__}: {exc}")


def _too_deep_field(msg: Any) -> str | None:
    """The field path (`inner.payload`) of `msg` whose value cannot be encoded for depth."""
    for name in message_field_names(type(msg)):
        value = getattr(msg, name, None)
        if isinstance(value, msgspec.Struct) and "message_id" in value.__struct_fields__:
            inner = _too_deep_field(value)
            if inner is not None:
                return f"{name}.{inner}"
            continue
        try:
            _ENCODER.encode(value)  # a copy of any array: no reference registered
        except RecursionError:
            return name
        except Exception:  # another fault: not the one looked for
            continue
    return None


def serialize_error(msg: Any, exc: BaseException) -> MessageSerializationError:
    """A `MessageSerializationError` for a failed encode."""
    if isinstance(exc, RecursionError):
        field = _too_deep_field(msg)
        where = f"field {field!r}" if field is not None else "a field"
        return MessageSerializationError(
            f"cannot serialize {type(msg).__name__}: {where} is nested too deeply or contains "
            f"itself ({exc}); MessagePack carries trees of limited depth: break the loop or "
            "flatten the value"
        )
    return MessageSerializationError(
        f"cannot serialize {type(msg).__name__}: {exc}; fields must be MessagePack "
        "types, NumPy arrays or nested @message classes"
    )
