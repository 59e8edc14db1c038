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
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from ...exceptions import MessageSerializationError, TypeValidationError

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


def to_records(
    cls: type, messages: Sequence[Any], *, stored_id: Callable[[Any], Any]
) -> np.ndarray[Any, Any]:
    """Pack messages of the fixed-layout class `cls` into a NumPy structured array.

    ``stored_id`` reads a message's id as stored (its wire bytes, made if it has none:
    the message module's `wire_id`), so no UUID object is made for it.

    This is the host side of a GPU ring, so it checks what it packs: a field value that
    does not convert to its column without loss (a float in an int field, a string, an
    array of another shape, an int out of range, a float beyond the column's range) is
    refused, naming the message and the field.

    Raises:
        TypeValidationError: a message is not an instance of `cls`, or `cls` has no fixed
            layout.
        MessageSerializationError: a field value does not fit its column.
    """
    dtype = _require_dtype(cls)
    msgs = list(messages)
    for m in msgs:
        if not isinstance(m, cls):
            raise TypeValidationError(f"to_records expects {cls.__name__}, got {type(m).__name__}")
    out = np.zeros(len(msgs), dtype=dtype)
    if not msgs:
        return out
    mids = [_id_bytes_int(stored_id(m)) for m in msgs]
    cids = [_id_int(m.correlation_id) for m in msgs]  # type: ignore[attr-defined]
    out["_mid_hi"] = [x >> 64 for x in mids]
    out["_mid_lo"] = [x & _MASK64 for x in mids]
    out["_cid_hi"] = [x >> 64 for x in cids]
    out["_cid_lo"] = [x & _MASK64 for x in cids]
    out["_priority"] = [m.priority for m in msgs]  # type: ignore[attr-defined]
    fields = dtype.fields
    assert fields is not None
    for name in dtype.names or ():
        if name in HEADER_FIELD_NAMES:
            continue
        target: np.dtype[Any] = fields[name][0]
        column = [getattr(m, name) for m in msgs]
        out[name] = _checked_column(cls, name, column, target.base, target.shape)
    return out


def _id_int(value: uuid.UUID | None) -> int:
    return 0 if value is None else value.int


def _id_bytes_int(raw: Any) -> int:
    """An id as stored (16 bytes, or a UUID) as an int."""
    return int.from_bytes(raw, "big") if isinstance(raw, bytes) else int(raw.int)


def _checked_column(
    cls: type, name: str, column: list[Any], base: np.dtype[Any], shape: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    """`column` as an array that assigns to `base` (items of `shape`) without loss."""
    try:
        arr = np.asarray(column)
    except (ValueError, TypeError):  # ragged: some item has another shape
        arr = None
    if arr is None or arr.shape[1:] != shape or not _fits(arr, base):
        for i, value in enumerate(column):  # find the message that does not fit, and say why
            why = _misfit(value, base, shape)
            if why is not None:
                raise MessageSerializationError(
                    f"cannot pack {cls.__name__} #{i}: field `{name}` {why}"
                )
        raise MessageSerializationError(  # pragma: no cover - every item fits on its own
            f"cannot pack {cls.__name__}: field `{name}` does not fit {base} {shape}"
        )
    return arr


def _fits(arr: np.ndarray[Any, Any], base: np.dtype[Any]) -> bool:
    if arr.dtype.kind in "OUSV" and arr.dtype != base:
        return False
    if not np.can_cast(arr.dtype, base, casting="same_kind"):
        return False
    if arr.size and base.kind in "iu" and arr.dtype.kind in "iub":
        info = np.iinfo(base)
        return bool(arr.min() >= info.min and arr.max() <= info.max)
    if arr.size and base.kind == "f" and arr.dtype.kind == "f":
        finite = arr[np.isfinite(arr)]
        return not finite.size or bool(np.abs(finite).max() <= np.finfo(base).max)
    return True


def _misfit(value: Any, base: np.dtype[Any], shape: tuple[int, ...]) -> str | None:
    """Why `value` does not fit a column of `base` items of `shape`, or None."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        return f"holds {value!r:.40}, which is not an array ({exc})"
    if arr.shape != shape:
        return f"has shape {arr.shape}, expected {shape} of {base}"
    if not _fits(arr, base):
        shown = repr(value) if arr.size == 1 else f"an array of {arr.dtype}"
        return f"holds {shown:.60} ({arr.dtype}), which does not fit {base} without loss"
    return None


def from_records(cls: type[_M], records: np.ndarray[Any, Any]) -> list[_M]:
    """Unpack a structured array (`cls.dtype` layout) into messages of `cls`."""
    dtype = _require_dtype(cls)
    if records.dtype != dtype:
        raise TypeValidationError(
            f"records have dtype {records.dtype}, expected {cls.__name__}.dtype {dtype}"
        )
    fields = dtype.fields
    assert fields is not None
    names = [n for n in dtype.names or () if n not in HEADER_FIELD_NAMES]
    columns: list[list[Any]] = []
    for n in names:
        col = records[n]
        # scalars as Python values; arrays as rows of one copy (not views of `records`)
        columns.append(col.tolist() if not fields[n][0].shape else list(np.array(col)))
    mids = _wire_ids(records["_mid_hi"], records["_mid_lo"])
    cids = _wire_ids(records["_cid_hi"], records["_cid_lo"])
    prios = records["_priority"].tolist()
    make: Any = cls
    out: list[_M] = []
    for i in range(len(records)):
        kwargs = {n: columns[j][i] for j, n in enumerate(names)}
        out.append(make(**kwargs, message_id=mids[i], correlation_id=cids[i], priority=prios[i]))
    return out


def _wire_ids(hi: np.ndarray[Any, Any], lo: np.ndarray[Any, Any]) -> list[bytes | None]:
    """Ids as the 16 bytes messages store (0: no id; read as UUIDs when asked for)."""
    return [
        ((h << 64) | l_).to_bytes(16, "big") if h or l_ else None
        for h, l_ in zip(hi.tolist(), lo.tolist(), strict=True)
    ]
