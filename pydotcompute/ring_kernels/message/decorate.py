"""`@message` and `@array_message`: a message class made from a plain annotated class.

Design notes:
- `@message` builds a tagged, array-like `msgspec.Struct` subclass of `RingKernelMessage`
  (or of the message class it subclasses) with `msgspec.defstruct`, from a plain annotated
  class, a `@dataclass` or a subclass of another message, and registers it.
- A class whose fields are all scalars (numbers, strings, bytes, ids, dates, enums, and
  tuples or unions of them) is made with ``gc=False``: the cycle collector never tracks
  its instances, which makes building, decoding and freeing one cheaper. No cycle can
  pass through such a message: its fields hold no containers, and a reply holds its
  request object only when the request is of such a class and the two form no loop
  (`base.correlation_to`). A value of the wrong type stored in a scalar field is the one
  way around that, and the one case where a loop through it would not be freed.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import inspect
import sys
import types
import typing
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar, overload

import msgspec

from ...exceptions import TypeValidationError
from . import layout
from .base import ArrayMessage, RingKernelMessage, check_priority
from .codec import HEADER_NAMES, message_tag, register_message_type

__all__ = ("array_message", "is_scalar_type", "message")

_T = TypeVar("_T")
_STRUCT_META = type(msgspec.Struct)

# what a class body may hold that the Struct built from it must not copy
_NOT_COPIED = frozenset(
    {
        "__dict__",
        "__weakref__",
        "__annotations__",
        "__slots__",
        "__module__",
        "__qualname__",
        "__match_args__",
        "__dataclass_fields__",
        "__dataclass_params__",
        "__signature__",
    }
)
_DATACLASS_METHODS = frozenset(
    {
        "__init__",
        "__repr__",
        "__eq__",
        "__hash__",
        "__setattr__",
        "__delattr__",
        "__getstate__",
        "__setstate__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
    }
)


def _generated(value: Any) -> bool:
    """True for a method `@dataclass` wrote (compiled from a string, not from a file)."""
    code = getattr(value, "__code__", None)
    return code is not None and code.co_filename == "<string>"


def _resolve_hints(cls: type, names: Sequence[str]) -> dict[str, Any]:
    """The annotations of `names` on `cls`, evaluated; `Any` where one cannot be."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # a name only a function's locals know: per field, Any if unknown
        hints = {}
        module = sys.modules.get(cls.__module__)
        globalns = dict(vars(module)) if module is not None else {}
        for klass in reversed(cls.__mro__):
            for name, ann in getattr(klass, "__annotations__", {}).items():
                if isinstance(ann, str):
                    try:
                        ann = eval(ann, globalns, dict(vars(cls)))
                    except Exception:
                        ann = Any
                hints[name] = ann
    return {n: hints.get(n, Any) for n in names}


def _is_classvar(tp: Any) -> bool:
    return tp is ClassVar or typing.get_origin(tp) is ClassVar


def _spec_fields(cls: type) -> list[tuple[str, Any]]:
    """`(name, default)` of the fields `cls` itself declares (its header fields left out).

    The default is `msgspec.NODEFAULT`, a value, or a `msgspec.field(...)`.
    """
    if dataclasses.is_dataclass(cls):
        out: list[tuple[str, Any]] = []
        for f in dataclasses.fields(cls):
            if f.name in HEADER_NAMES:
                continue
            if f.default_factory is not dataclasses.MISSING:
                out.append((f.name, msgspec.field(default_factory=f.default_factory)))
            elif f.default is not dataclasses.MISSING:
                out.append((f.name, f.default))
            else:
                out.append((f.name, msgspec.NODEFAULT))
        return out
    own = inspect.get_annotations(cls)
    if hasattr(cls, "__struct_fields__"):
        info = {i.name: i for i in msgspec.structs.fields(cls)}  # type: ignore[arg-type]
        out = []
        for name in own:
            got = info.get(name)
            if got is None or name in HEADER_NAMES:
                continue
            if got.default_factory is not msgspec.NODEFAULT:
                out.append((name, msgspec.field(default_factory=got.default_factory)))
            else:
                out.append((name, got.default))
        return out
    out = []
    for name in own:
        if name in HEADER_NAMES:
            continue
        value = cls.__dict__.get(name, msgspec.NODEFAULT)
        if isinstance(value, dataclasses.Field):
            if value.default_factory is not dataclasses.MISSING:
                value = msgspec.field(default_factory=value.default_factory)
            elif value.default is not dataclasses.MISSING:
                value = value.default
            else:
                value = msgspec.NODEFAULT
        out.append((name, value))
    return out


def _rebind_class_cell(ns: dict[str, Any], old: type, new: type) -> None:
    """Point zero-argument `super()` in the copied methods at the new class."""
    for value in ns.values():
        fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        fns = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [fn]
        for f in fns:
            if not isinstance(f, types.FunctionType) or f.__closure__ is None:
                continue
            for name, cell in zip(f.__code__.co_freevars, f.__closure__, strict=True):
                if name == "__class__" and cell.cell_contents is old:
                    cell.cell_contents = new


def _make_message_class(cls: type, base: type[RingKernelMessage]) -> type:
    if not isinstance(cls, type):
        raise TypeValidationError(f"@message decorates a class, got {type(cls).__name__}")
    is_struct = issubclass(cls, RingKernelMessage)
    by_reference = base is ArrayMessage or (is_struct and issubclass(cls, ArrayMessage))
    if is_struct and getattr(cls, "__struct_config__").tag == message_tag(cls):  # noqa: B009
        register_message_type(cls, by_reference=by_reference)  # decorated twice
        return cls
    spec = _spec_fields(cls)
    hints = _resolve_hints(cls, [n for n, _ in spec])
    fields: list[Any] = []
    for name, default in spec:
        tp = hints[name]
        if _is_classvar(tp):
            continue
        fields.append((name, tp) if default is msgspec.NODEFAULT else (name, tp, default))
    names = {n for n, *_ in fields}
    generated_ok = dataclasses.is_dataclass(cls)
    ns: dict[str, Any] = {}
    for key, value in vars(cls).items():
        if key in _NOT_COPIED or key in names or key in HEADER_NAMES:
            continue
        if key.startswith("__struct_") or (key == "__hash__" and value is None):
            continue
        if generated_ok and key in _DATACLASS_METHODS and _generated(value):
            continue
        ns[key] = value
    user_post = ns.get("__post_init__")
    if user_post is not None:
        ns["__post_init__"] = _with_priority_check(user_post)
    bases: tuple[type, ...] = cls.__bases__ if is_struct else (base,)
    if base is ArrayMessage and not any(issubclass(b, ArrayMessage) for b in bases):
        bases = (ArrayMessage,) if bases == (RingKernelMessage,) else bases
    field_types = [f[1] for f in fields] + [
        info.type
        for b in bases
        if isinstance(b, _STRUCT_META)
        for info in msgspec.structs.fields(b)  # type: ignore[arg-type]
        if info.name not in HEADER_NAMES
    ]
    try:
        new_cls = msgspec.defstruct(
            cls.__name__,
            fields,
            bases=bases,
            module=cls.__module__,
            namespace=ns,
            tag=message_tag(cls),
            gc=not all(is_scalar_type(tp) for tp in field_types),  # see the module notes
        )
    except TypeError as exc:
        raise TypeValidationError(
            f"cannot make a message of {cls.__qualname__}: {exc} (fields without a default "
            "come before fields with one; msgspec Structs define no __init__ of their own: "
            "use __post_init__)"
        ) from exc
    new_cls.__qualname__ = cls.__qualname__
    new_cls.__doc__ = cls.__doc__
    _rebind_class_cell(ns, cls, new_cls)
    register_message_type(new_cls, by_reference=by_reference)
    all_hints = _resolve_hints(
        new_cls, [n for n in new_cls.__struct_fields__ if n not in HEADER_NAMES]
    )
    dtype = layout.compute_dtype(list(all_hints.items()))
    layout.set_fixed_layout_dtype(new_cls, dtype)
    if dtype is not None and "dtype" not in new_cls.__struct_fields__:
        new_cls.dtype = dtype  # type: ignore[attr-defined]
    return new_cls


def _with_priority_check(post: Callable[[Any], None]) -> Callable[[Any], None]:
    def __post_init__(self: Any) -> None:
        check_priority(self)
        post(self)

    __post_init__.__doc__ = post.__doc__
    return __post_init__


@overload
@typing.dataclass_transform(field_specifiers=(dataclasses.field, msgspec.field))
def message(cls: type[_T], /) -> type[_T]: ...
@overload
@typing.dataclass_transform(field_specifiers=(dataclasses.field, msgspec.field))
def message(cls: None = None, /) -> Callable[[type[_T]], type[_T]]: ...


@typing.dataclass_transform(field_specifiers=(dataclasses.field, msgspec.field))
def message(cls: type[_T] | None = None, /) -> type[_T] | Callable[[type[_T]], type[_T]]:
    """Turn a class with annotated fields into a message (bare `@message` or `@message()`).

    The result is a `msgspec.Struct` subclass of `RingKernelMessage` (or of the message
    class it subclasses), registered for `deserialize_message` under its fully qualified
    name. A `@dataclass` works too: its fields, defaults and `default_factory`s are kept,
    and header fields written by hand are replaced by the standard header.
    """
    if cls is None:
        return lambda c: _make_message_class(c, RingKernelMessage)  # type: ignore[return-value]
    return _make_message_class(cls, RingKernelMessage)  # type: ignore[return-value]


@typing.dataclass_transform(field_specifiers=(dataclasses.field, msgspec.field))
def array_message(cls: type[_T] | None = None, /) -> Any:
    """Like `message`, but the class inherits `ArrayMessage` (arrays travel by reference)."""
    if cls is None:
        return lambda c: _make_message_class(c, ArrayMessage)
    return _make_message_class(cls, ArrayMessage)


# the base class carries its own tag (`base.py`): a message of the header alone is a message
register_message_type(RingKernelMessage)


# --- which classes the cycle collector may skip ----------------------------------------------

#: Field types that hold no reference to another object a program could change.
_SCALARS: frozenset[Any] = frozenset(
    {
        int,
        float,
        bool,
        str,
        bytes,
        type(None),
        None,
        uuid.UUID,
        decimal.Decimal,
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
    }
)
_UNIONS = (typing.Union, types.UnionType)


def is_scalar_type(tp: Any) -> bool:
    """True when a field of type `tp` can only hold values that refer to nothing mutable:
    the types above, enums, `Literal`s, `Annotated` scalars, and unions, fixed tuples and
    variable tuples or frozensets of scalars."""
    if tp in _SCALARS or (isinstance(tp, type) and issubclass(tp, enum.Enum)):
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return True
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return is_scalar_type(args[0])
    if origin in _UNIONS or origin in (tuple, frozenset):
        return bool(args) and all(a is Ellipsis or is_scalar_type(a) for a in args)
    return False
