"""Field checks at the door: does a message hold what its class's decoder accepts?

Design notes:
- msgspec checks field types only while it decodes bytes, and an in-process hop passes
  the object itself: without a check here a wrongly typed field reached an asyncio or
  thread actor as it was, and was refused on a hop that decodes. The runtime checks each
  message where it enters a kernel (``send``, ``ctx.send``) on every tier, so the rule is
  one: refused at the call, naming the field. ``check_fields=False`` on a kernel skips
  the check; hops that decode bytes still refuse such a message (counted as dropped).
- Two stages. `fields_ok` runs on every message: one function per class, built once,
  that compares the exact class of each scalar field's value (``int``, ``str``, an enum,
  a union of such), walks containers by their annotation (a long list of scalars through
  ``msgspec.convert``, in C), hands nested messages to their own class's check, arrays to
  the array hook's rule, and constrained or NumPy scalar types to ``msgspec.convert``. It
  never says True for a value the decoder refuses; it may say False for one the decoder
  takes (a NumPy integer in an ``int`` field: only the encoder turns it into an int).
  `field_problem` is then the exact verdict: the field's value encoded, then decoded as
  its annotation says, as a hop that decodes does. ``msgspec.convert`` is not used where
  it reads a value differently from a decoder (bytes from base64 text, a Struct instance
  without looking into its fields); an annotation this stage does not know (a plain
  msgspec Struct) always takes the exact way.
- A message of a class whose wire tag another class took over (see `identity`) fails the
  check as well: the check reads the codec's `holds_tag` cell.
- Cost: one call per message. For a class whose fields are all scalars (the common case)
  that call is compiled (`fast_message.fields_ok`: a class comparison per field, read from
  its slot); otherwise one Python function per class. Checking at construction was
  rejected: msgspec builds a Struct without calling Python code (but the priority
  check), and code that fills a message in steps would break.
"""

from __future__ import annotations

import collections.abc
import datetime
import decimal
import enum
import operator
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from ...exceptions import TypeValidationError
from .._native import message_extension
from .arrays import dec_hook, enc_hook, ext_hook
from .base import RingKernelMessage, make_ids
from .codec import HEADER_NAMES, Codec, codec_of
from .identity import superseded_text

__all__ = ("check_fields", "field_problem", "fields_check", "fields_ok", "python_fields_ok")

_NONE = type(None)
_UNIONS = (typing.Union, types.UnionType)
#: annotation -> the classes a value may have, exactly, to pass the cheap stage
_EXACT: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({float, int}),  # an int decodes into a float field
    str: frozenset({str}),
    bytes: frozenset({bytes}),
    bool: frozenset({bool}),
    _NONE: frozenset({_NONE}),
    None: frozenset({_NONE}),
    uuid.UUID: frozenset({uuid.UUID}),
    decimal.Decimal: frozenset({decimal.Decimal}),
    datetime.datetime: frozenset({datetime.datetime}),
    datetime.date: frozenset({datetime.date}),
    datetime.time: frozenset({datetime.time}),
    datetime.timedelta: frozenset({datetime.timedelta}),
}
_ENCODER = msgspec.msgpack.Encoder(enc_hook=enc_hook, uuid_format="bytes")
_ext = message_extension()  # the compiled common case of `fields_ok`, when built
_convert = msgspec.convert


class _Field:
    """One field of a class: its name, annotation, cheap check (None: exact only) and a
    decoder for its annotation (made when first needed)."""

    __slots__ = ("_decoder", "cheap", "name", "tp")

    def __init__(self, name: str, tp: Any, cheap: Callable[[Any], bool] | None) -> None:
        self.name = name
        self.tp = tp
        self.cheap = cheap
        self._decoder: msgspec.msgpack.Decoder[Any] | None = None

    def decoder(self) -> msgspec.msgpack.Decoder[Any]:
        if self._decoder is None:
            self._decoder = msgspec.msgpack.Decoder(
                self.tp, dec_hook=dec_hook, ext_hook=ext_hook(by_reference=False)
            )
        return self._decoder


#: class -> its checked fields (header and ``Any`` fields left out)
_SPECS: dict[type, tuple[_Field, ...]] = {}
#: class -> its cheap check (`fields_check`)
_CHECKS: dict[type, Callable[[Any], bool]] = {}


def _accepted(tp: Any) -> frozenset[type] | None:
    """The exact classes a value of a field annotated ``tp`` may have to pass the cheap
    stage, when ``tp`` is a scalar (or a union of scalars); else None."""
    try:
        exact = _EXACT.get(tp)
    except TypeError:  # an unhashable annotation
        return None
    if exact is not None:
        return exact
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return frozenset({tp})  # a member (a raw value takes the exact way)
    if typing.get_origin(tp) in _UNIONS:
        out: set[type] = set()
        for arg in typing.get_args(tp):
            part = _accepted(arg)
            if part is None:
                return None
            out |= part
        return frozenset(out)
    return None


def _is_message_class(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, RingKernelMessage)


_SEQUENCES = frozenset({list, tuple, set, frozenset})  # each encodes as a MessagePack array
#: above this many items, scalars are checked by msgspec (it reads no bytes from text for
#: these types: int, float, str, bool, None, ids, dates and decimals read the same)
_CONVERT_FROM = 32
_SEQUENCE_ORIGINS = (list, set, frozenset, collections.abc.Sequence, collections.abc.Set)


def _is_array(v: Any) -> bool:
    # what `arrays.dec_hook` takes for an array field as it is (others take the exact way)
    return isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__")


def _converted(tp: Any, *, hook: bool = True) -> Callable[[Any], bool]:
    """A check by ``msgspec.convert`` into a one-field Struct of ``tp`` (whose type
    information msgspec keeps, where a bare annotation is worked out again each call);
    ``hook``: NumPy types are involved (`arrays.dec_hook`)."""
    box = msgspec.defstruct("Box", [("v", tp)], array_like=True)
    hook_fn = dec_hook if hook else None

    def converts(v: Any) -> bool:
        try:
            _convert((v,), box, dec_hook=hook_fn)
        except Exception:  # refused, or a hook raised: the exact way says what and why
            return False
        return True

    return converts


def _cheap(tp: Any) -> Callable[[Any], bool] | None:
    """The cheap check of a value of a field annotated ``tp`` (see the module notes), or
    None where only the exact way can tell."""
    if tp is Any or tp is object:
        return lambda v: True
    accepted = _accepted(tp)
    if accepted is not None:
        return lambda v: v.__class__ in accepted
    if _is_message_class(tp):
        return lambda v: v.__class__ is tp and fields_ok(v)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        if any(isinstance(m, msgspec.Meta) for m in args[1:]):  # bounds, lengths, patterns
            return _converted(tp, hook=_accepted(args[0]) is None)
        return _cheap(args[0])  # metadata msgspec ignores (a GPU field's shape)
    if tp is np.ndarray or origin is np.ndarray:
        return _is_array
    if isinstance(tp, type) and issubclass(tp, np.generic):
        return _converted(tp)  # the range check of `arrays.dec_hook`
    if origin is typing.Literal:
        kinds = frozenset(type(a) for a in args)
        return lambda v: v.__class__ in kinds and v in args
    if origin in _UNIONS:
        parts = [_cheap(a) for a in args if a is not _NONE]
        if any(p is None for p in parts):
            return None
        if len(parts) == 1:  # X | None
            (part,) = parts
            return lambda v: v is None or part(v)  # type: ignore[misc]
        nullable = _NONE in args

        def either(v: Any) -> bool:
            if v is None:
                return nullable
            for p in parts:  # noqa: SIM110 (a loop: no generator made per message)
                if p(v):  # type: ignore[misc]
                    return True
            return False

        return either
    if tp in _SEQUENCES:  # a bare list, tuple, set: any items
        return lambda v: v.__class__ in _SEQUENCES
    if tp is dict:
        return lambda v: v.__class__ is dict
    if origin in _SEQUENCE_ORIGINS or (origin is tuple and len(args) == 2 and args[1] is ...):
        return _items(_cheap(args[0]) if args else _cheap(Any), args[0] if args else Any)
    if origin is tuple and args:
        items = [_cheap(a) for a in args]
        if any(p is None for p in items):
            return None
        n = len(items)
        return lambda v: (
            v.__class__ in _SEQUENCES
            and len(v) == n
            and all(p(x) for p, x in zip(items, v, strict=True))  # type: ignore[misc]
        )
    if origin is dict:
        keys, values = (_cheap(a) for a in args) if args else (_cheap(Any), _cheap(Any))
        if keys is None or values is None:
            return None
        return lambda v: v.__class__ is dict and all(map(keys, v)) and all(map(values, v.values()))
    return None


def _items(item: Callable[[Any], bool] | None, tp: Any) -> Callable[[Any], bool] | None:
    """The check of a sequence (list, set, variable tuple) whose items are checked by
    ``item``; items of scalar types are checked by class in C (`frozenset.issuperset`)."""
    if item is None:
        return None
    accepted = _accepted(tp)
    if accepted is None:
        return lambda v: v.__class__ in _SEQUENCES and all(map(item, v))
    converts = None if bytes in accepted else _converted(list[tp], hook=False)

    def scalars(v: Any) -> bool:
        if v.__class__ not in _SEQUENCES:
            return False
        if converts is not None and len(v) > _CONVERT_FROM:  # msgspec's loop is quicker
            return converts(v)
        return accepted.issuperset(map(type, v))

    return scalars


def _spec(cls: type) -> tuple[_Field, ...]:
    spec = _SPECS.get(cls)
    if spec is None:
        spec = _SPECS[cls] = tuple(
            _Field(f.name, f.type, _cheap(f.type))
            for f in msgspec.structs.fields(cls)  # type: ignore[arg-type]
            if f.name not in HEADER_NAMES and f.type is not Any and f.type is not object
        )
    return spec


def _slot_of(cls: type, name: str) -> Any:
    """The member descriptor of field ``name`` (on ``cls`` or the base declaring it)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(name)


def _compiled(codec: Codec, spec: tuple[_Field, ...]) -> Callable[[Any], bool] | None:
    """The compiled check (`fast_message.fields_ok`) for a class whose every field takes
    one or two exact classes, registered with it; else None."""
    if _ext is None:
        return None
    kinds = [_accepted(f.tp) for f in spec]
    if any(k is None or len(k) > 2 for k in kinds):
        return None
    pairs = [sorted(k, key=lambda c: c is _NONE) for k in kinds]  # type: ignore[arg-type]
    first = tuple(p[0] for p in pairs)
    second = tuple(p[1] if len(p) > 1 else None for p in pairs)
    try:
        slots = tuple(_slot_of(codec.cls, f.name) for f in spec)
        _ext.add_field_shape(codec.cls, codec.holds_tag, slots, first, second)
    except (TypeError, AttributeError):  # not plain slots: the Python check serves it
        return None
    check: Callable[[Any], bool] = _ext.fields_ok
    return check


def _build(codec: Codec) -> Callable[[Any], bool]:
    """The cheap check of ``codec``'s class, shaped for the common cases."""
    live = codec.holds_tag
    spec = _spec(codec.cls)
    compiled = _compiled(codec, spec)
    if compiled is not None:
        return compiled
    if not spec:
        return lambda m: live[0]
    if len(spec) == 1:
        get = operator.attrgetter(spec[0].name)
        accepted = _accepted(spec[0].tp)
        if accepted is not None and len(accepted) == 1:
            (t,) = accepted
            return lambda m: live[0] and get(m).__class__ is t
        cheap = spec[0].cheap
        if cheap is None:
            return lambda m: False
        return lambda m: live[0] and cheap(get(m))
    if any(f.cheap is None for f in spec):
        return lambda m: False
    checks = tuple((operator.attrgetter(f.name), f.cheap) for f in spec)

    def check(m: Any) -> bool:
        if not live[0]:
            return False
        for get, ok in checks:  # noqa: SIM110 (a loop: no generator made per message)
            if not ok(get(m)):  # type: ignore[misc]
                return False
        return True

    return check


def fields_check(cls: type) -> Callable[[Any], bool]:
    """The cheap check of instances of the message class ``cls``: True when every field
    holds a value its decoder accepts (and the class still holds its wire tag); False
    when `field_problem` must give the verdict. Built once per class.

    Raises:
        TypeValidationError: ``cls`` is not a ``@message`` class.
    """
    check = _CHECKS.get(cls)
    if check is None:
        codec = codec_of(cls)
        check = codec.check
        if check is None:
            check = codec.check = _build(codec)
        _CHECKS[cls] = check
    return check


def python_fields_ok(msg: Any) -> bool:
    """`fields_ok` in Python (the compiled one calls it for a class it has no shape of)."""
    check = _CHECKS.get(msg.__class__)
    if check is not None:
        return check(msg)
    if not isinstance(msg, RingKernelMessage):
        return True
    return fields_check(type(msg))(msg)


#: `fields_check` of ``msg``'s class applied to ``msg``; True for a value that is not a
#: message (plain values are not checked). Compiled when the extension is built.
fields_ok: Callable[[Any], bool] = python_fields_ok
if _ext is not None:
    _ext.bind_field_checks(python_fields_ok)
    fields_ok = _ext.fields_ok


def _type_text(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__qualname__ if tp.__module__ == "builtins" else tp.__name__
    return repr(tp).replace("typing.", "")


def _exact_problem(field: _Field, value: Any) -> str | None:
    """What is wrong with ``value`` in ``field``, as a decoder of the field sees it."""
    got = f"{type(value).__name__} ({value!r:.40})"
    want = f"field {field.name!r} expects {_type_text(field.tp)}, got {got}"
    try:
        make_ids(value)  # nested messages' ids, as `serialize` makes them
        data = _ENCODER.encode(value)
    except RecursionError:
        return None  # too deep or holding itself: `serialize` says so where a hop encodes
    except Exception as exc:
        return f"{want}, which MessagePack cannot carry ({exc})"
    try:
        field.decoder().decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if " - at `$" in text:  # inside the value: where
            return f"{want}: {text.replace('`$', f'`{field.name}')}"
        return want if ", got `" in text else f"{want}: {text}"  # (a bound: which)
    except Exception as exc:  # a hook refused it (an array field, a NumPy scalar)
        return f"{want}: {exc}"
    return None


def field_problem(msg: Any) -> str | None:
    """What makes ``msg`` unfit to send, exactly as a hop that decodes would see it:
    ``"field 'seq' expects int, got str ('1')"``, or that its class was reloaded or
    redefined; None when nothing is (always None for a value that is not a message)."""
    if not isinstance(msg, RingKernelMessage):
        return None
    cls = type(msg)
    if not codec_of(cls).holds_tag[0]:
        return superseded_text(cls)
    for field in _spec(cls):
        value = getattr(msg, field.name)
        if field.cheap is not None and field.cheap(value):
            continue
        problem = _exact_problem(field, value)
        if problem is not None:
            return problem
    return None


def check_fields(msg: Any, kernel_id: str, direction: str = "expects") -> None:
    """Refuse ``msg`` unless its fields are what its class decodes (`fields_ok`, then
    `field_problem` for the verdict). ``direction``: "expects" (a message sent to the
    kernel) or "must send" (one its actor sends).

    Raises:
        TypeValidationError: ``kernel 'k' refused Job: field 'seq' expects int, got str
            ('1'); ...`` (or that its class was reloaded or redefined).
    """
    if fields_ok(msg):
        return
    problem = field_problem(msg)
    if problem is None:
        return
    verb = "refused" if direction == "expects" else "cannot send"
    text = f"kernel {kernel_id!r} {verb} {type(msg).__name__}: {problem}"
    if problem.startswith("field "):
        text += (
            "; give each field a value of its annotated type (a hop that decodes bytes "
            "refuses it too), or launch the kernel with check_fields=False to pass "
            "in-process messages as they are"
        )
    raise TypeValidationError(text)
