"""Fixed-layout messages: the NumPy structured `dtype` GPU rings carry.

A message class whose every field has a fixed size (a Python `int`/`float`/`bool`, a NumPy
scalar type, `Annotated[int, np.int16]`, or `Annotated[np.ndarray, (shape,), dtype]`) gets a
structured dtype: the header as five fixed columns (`_mid_hi`, `_mid_lo`, `_cid_hi`,
`_cid_lo`, `_priority`) then the fields in declaration order, C-aligned. `to_records` and
`from_records` convert between messages and arrays of that dtype.
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from ...exceptions import TypeValidationError

__all__ = (
    "HEADER_FIELDS",
    "HEADER_FIELD_NAMES",
    "compute_dtype",
    "field_layout",
    "fixed_layout_dtype",
    "from_records",
    "is_fixed_layout",
    "set_fixed_layout_dtype",
    "to_records",
)

_M = TypeVar("_M")

#: The header columns of every fixed-layout dtype, in order.
HEADER_FIELDS: tuple[tuple[str, Any], ...] = (
    ("_mid_hi", np.uint64),
    ("_mid_lo", np.uint64),
    ("_cid_hi", np.uint64),
    ("_cid_lo", np.uint64),
    ("_priority", np.uint32),
)
#: Their names: a message field may not use one of them.
HEADER_FIELD_NAMES: frozenset[str] = frozenset(n for n, _ in HEADER_FIELDS)
_SCALARS: dict[Any, Any] = {int: np.int64, float: np.float64, bool: np.bool_}
_MASK64 = (1 << 64) - 1
_DTYPES: dict[type, np.dtype[Any]] = {}


def _is_dtype_like(obj: Any) -> bool:
    if isinstance(obj, (np.dtype, str)):
        return True
    return isinstance(obj, type) and issubclass(obj, np.generic)


def field_layout(tp: Any) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
    """The `(dtype, shape)` a field annotation takes in a fixed layout, or None."""
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


def compute_dtype(fields: Sequence[tuple[str, Any]]) -> np.dtype[Any] | None:
    """The structured dtype of a message with these `(name, annotation)` fields, or None."""
    entries: list[tuple[str, Any, tuple[int, ...]]] = []
    for name, tp in fields:
        layout = field_layout(tp)
        if layout is None or name in HEADER_FIELD_NAMES:
            return None
        entries.append((name, layout[0], layout[1]))
    spec = [(n, t) for n, t in HEADER_FIELDS] + [(n, t, s) if s else (n, t) for n, t, s in entries]
    return np.dtype(spec, align=True)


def set_fixed_layout_dtype(cls: type, dtype: np.dtype[Any] | None) -> None:
    """Record (or, with None, forget) the fixed layout of a message class."""
    if dtype is None:
        _DTYPES.pop(cls, None)
    else:
        _DTYPES[cls] = dtype


def fixed_layout_dtype(cls: type) -> np.dtype[Any] | None:
    """The structured dtype of a fixed-layout message class, or None."""
    return _DTYPES.get(cls)


def is_fixed_layout(cls: type) -> bool:
    """True when every field of the message class has a fixed size (GPU-ring capable)."""
    return cls in _DTYPES


def _require_dtype(cls: type) -> np.dtype[Any]:
    dtype = _DTYPES.get(cls)
    if dtype is None:
        raise TypeValidationError(
            f"{cls.__name__} is not a fixed-layout message: every field must be a fixed-size "
            "scalar (int, float, bool, np.float32, ...) or Annotated[np.ndarray, (shape,), dtype]"
        )
    return dtype


def to_records(cls: type, messages: Sequence[Any]) -> np.ndarray[Any, Any]:
    """Pack messages of the fixed-layout class `cls` into a NumPy structured array."""
    dtype = _require_dtype(cls)
    out = np.zeros(len(messages), dtype=dtype)
    names = [n for n in dtype.names or () if n not in HEADER_FIELD_NAMES]
    for i, m in enumerate(messages):
        if not isinstance(m, cls):
            raise TypeValidationError(f"to_records expects {cls.__name__}, got {type(m).__name__}")
        _fill_record(out[i], m, names)
    return out


def _fill_record(rec: Any, m: Any, names: list[str]) -> None:
    mid = m.message_id.int
    rec["_mid_hi"], rec["_mid_lo"] = mid >> 64, mid & _MASK64
    cid = 0 if m.correlation_id is None else m.correlation_id.int
    rec["_cid_hi"], rec["_cid_lo"] = cid >> 64, cid & _MASK64
    rec["_priority"] = m.priority
    for n in names:
        rec[n] = getattr(m, n)


def _uuid_from(hi: Any, lo: Any) -> uuid.UUID | None:
    value = (int(hi) << 64) | int(lo)
    return uuid.UUID(int=value) if value else None


def from_records(cls: type[_M], records: np.ndarray[Any, Any]) -> list[_M]:
    """Unpack a structured array (`cls.dtype` layout) into messages of `cls`."""
    dtype = _require_dtype(cls)
    if records.dtype != dtype:
        raise TypeValidationError(
            f"records have dtype {records.dtype}, expected {cls.__name__}.dtype {dtype}"
        )
    names = [n for n in dtype.names or () if n not in HEADER_FIELD_NAMES]
    fields = dtype.fields
    assert fields is not None
    shapes = {n: fields[n][0].shape for n in names}
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
