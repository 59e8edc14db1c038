"""Arrays in messages: the NumPy extension type, and arrays passed by reference.

Design notes:
- A NumPy array travels as MessagePack extension type 1: one length byte, a MessagePack
  `(dtype, shape)` header, then the raw bytes. It decodes as a read-only view on the
  received buffer (no copy). Structured dtypes travel in NumPy's dict form so offsets and
  padding survive. CuPy and MLX arrays are copied to the host and travel the same way.
- By-reference arrays (extension type 2) are for `ArrayMessage` classes only: encoding
  pins the array in the process-wide `BufferRegistry` and writes its id. Ids are 128-bit
  values from a keyed hash of a counter (the key is read from `os.urandom` once per
  registry), so a frame made elsewhere cannot name a pinned array. Only the decoders of
  classes that opted in accept extension type 2 (`ext_hook(by_reference=True)`); every
  other decoder refuses it, so a frame cannot smuggle a reference into a plain message.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import struct
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

__all__ = (
    "EXT_BUFFER_REF",
    "EXT_NDARRAY",
    "BufferHandle",
    "BufferRegistry",
    "dec_hook",
    "enc_hook",
    "enc_hook_by_reference",
    "ext_hook",
    "get_buffer",
    "get_buffer_registry",
    "register_buffer",
    "release_buffer",
)

EXT_NDARRAY = 1
EXT_BUFFER_REF = 2
_REF_SIZE = 16  # bytes of a buffer id on the wire

_ARRAY_HEADER = struct.Struct("<B")  # length of the msgpack-encoded (dtype, shape) header
_RAW_ENCODER = msgspec.msgpack.Encoder()
_RAW_DECODER: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder()


# --- arrays by value -----------------------------------------------------------------------


def _encode_ndarray(arr: np.ndarray[Any, Any]) -> msgspec.msgpack.Ext:
    if arr.dtype.hasobject:
        raise TypeError(f"arrays of dtype {arr.dtype} (Python objects) cannot be serialized")
    header = _RAW_ENCODER.encode((_dtype_to_spec(arr.dtype), arr.shape))
    if len(header) > 255:
        raise TypeError(f"array header too large ({len(header)} bytes)")
    # a flat byte view: the buffer protocol refuses datetime64/timedelta64 items
    payload = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return msgspec.msgpack.Ext(
        EXT_NDARRAY, b"".join((_ARRAY_HEADER.pack(len(header)), header, payload.data))
    )


def _dtype_to_spec(dt: np.dtype[Any]) -> Any:
    """A MessagePack-able dtype description that keeps offsets and padding.

    `dtype.descr` is lossy for aligned structs (padding comes back as extra void fields),
    so structured dtypes travel as NumPy's dict form and subarrays as `{base, shape}`.
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


def _decode_ndarray(data: memoryview) -> np.ndarray[Any, Any]:
    if len(data) < 1:
        raise ValueError("malformed array: empty extension payload")
    (hlen,) = _ARRAY_HEADER.unpack_from(data, 0)
    dtype_spec, shape = _RAW_DECODER.decode(data[1 : 1 + hlen])
    dtype = _spec_to_dtype(dtype_spec)
    if dtype.hasobject:
        raise ValueError("object arrays are not accepted")
    shape = tuple(int(s) for s in shape)
    arr = np.frombuffer(data[1 + hlen :], dtype=dtype)
    return arr.reshape(shape)


def _device_to_host(obj: Any) -> np.ndarray[Any, Any] | None:
    if hasattr(obj, "__cuda_array_interface__") and hasattr(obj, "get"):
        return np.asarray(obj.get())
    if type(obj).__module__.startswith("mlx"):
        return np.asarray(obj)
    return None


def enc_hook(obj: Any) -> Any:
    """msgspec `enc_hook` of by-value messages: arrays (NumPy, CuPy, MLX) and NumPy scalars."""
    if isinstance(obj, np.ndarray):
        return _encode_ndarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    host = _device_to_host(obj)
    if host is not None:
        return _encode_ndarray(host)
    raise TypeError(f"unsupported field value of type {type(obj).__name__}")


def enc_hook_by_reference(obj: Any) -> Any:
    """msgspec `enc_hook` of `ArrayMessage` classes: arrays are pinned and sent by id."""
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        handle = _registry.register(obj)
        return msgspec.msgpack.Ext(EXT_BUFFER_REF, handle.buffer_id.to_bytes(_REF_SIZE, "big"))
    return enc_hook(obj)


def _ext_by_value(code: int, data: memoryview) -> Any:
    if code == EXT_NDARRAY:
        return _decode_ndarray(data)
    if code == EXT_BUFFER_REF:
        raise ValueError(
            "a by-reference array (extension type 2) in a message that does not take arrays "
            "by reference: only ArrayMessage / @array_message classes accept them"
        )
    raise ValueError(f"unknown MessagePack extension type {code}")


def _ext_by_reference(code: int, data: memoryview) -> Any:
    if code == EXT_BUFFER_REF:
        if len(data) != _REF_SIZE:
            raise ValueError(f"malformed buffer reference: {len(data)} bytes, expected {_REF_SIZE}")
        return _registry.take(int.from_bytes(data, "big"))
    return _ext_by_value(code, data)


def ext_hook(*, by_reference: bool) -> Callable[[int, memoryview], Any]:
    """The msgspec `ext_hook` of a message class's decoder."""
    return _ext_by_reference if by_reference else _ext_by_value


_INF = float("inf")


@functools.cache
def _float_max(tp: type) -> float:
    return float(np.finfo(tp).max)  # type: ignore[arg-type]


def dec_hook(tp: Any, obj: Any) -> Any:
    """msgspec `dec_hook`: array fields and NumPy scalar fields (range-checked)."""
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
            # NumPy would only warn and store inf: a value that does not fit is an error
            raise ValueError(f"{obj!r} does not fit a {origin.__name__} field")
        if isinstance(obj, (list, dict, str, bytes)) and not issubclass(
            origin, (np.str_, np.bytes_)
        ):
            raise TypeError(f"expected a {origin.__name__}, got {type(obj).__name__}")
        return origin(obj)
    if isinstance(obj, origin if isinstance(origin, type) else object):
        return obj
    raise NotImplementedError(f"unsupported field type {tp!r}")


# --- arrays by reference -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BufferHandle:
    """A reference to an array held by the process-wide `BufferRegistry`."""

    buffer_id: int
    shape: tuple[int, ...]
    dtype: str
    device: str


class BufferRegistry:
    """Process-wide table of arrays passed by reference, with reference counts.

    `register` pins an array (count + 1) and returns a handle; `get` looks it up;
    `release` unpins it (count - 1) and forgets it at zero. Serializing an `ArrayMessage`
    registers its arrays; deserializing it takes them back (the decoder releases the
    reference the encoder made), so a serialize/deserialize pair leaves the registry as
    it was. Ids are unguessable 128-bit values. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, list[Any]] = {}  # id -> [array, refcount]
        self._by_object: dict[int, int] = {}  # id(array) -> buffer id
        self._key = os.urandom(32)
        self._next = itertools.count(1)
        self._registered = 0
        self._released = 0

    def _new_id(self) -> int:
        n = next(self._next).to_bytes(8, "big")
        digest = hashlib.blake2b(n, key=self._key, digest_size=_REF_SIZE).digest()
        return int.from_bytes(digest, "big") or 1

    def register(self, array: Any) -> BufferHandle:
        """Pin `array` and return its handle (the same id if it is already pinned)."""
        with self._lock:
            bid = self._by_object.get(id(array))
            if bid is None or self._entries[bid][0] is not array:
                bid = self._new_id()
                while bid in self._entries:  # pragma: no cover - 2**-128
                    bid = self._new_id()
                self._entries[bid] = [array, 0]
                self._by_object[id(array)] = bid
            self._entries[bid][1] += 1
            self._registered += 1
        device = "cuda" if hasattr(array, "__cuda_array_interface__") else "cpu"
        return BufferHandle(bid, tuple(array.shape), str(array.dtype), device)

    def get(self, buffer_id: int | BufferHandle) -> Any:
        """The array behind `buffer_id`; KeyError (with the id) if it was released."""
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
        """`get` then `release`: how the decoder consumes a reference."""
        array = self.get(buffer_id)
        self.release(buffer_id)
        return array

    def refcount(self, buffer_id: int | BufferHandle) -> int:
        """How many references to `buffer_id` are held (0 when it is not pinned)."""
        bid = buffer_id.buffer_id if isinstance(buffer_id, BufferHandle) else buffer_id
        with self._lock:
            entry = self._entries.get(bid)
            return 0 if entry is None else int(entry[1])

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every pinned array."""
        with self._lock:
            self._entries.clear()
            self._by_object.clear()

    def get_stats(self) -> dict[str, int]:
        """Live buffers and bytes, and the totals registered and released."""
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
    """The process-wide `BufferRegistry`."""
    return _registry


def register_buffer(array: Any) -> BufferHandle:
    """Pin `array` in the process-wide registry."""
    return _registry.register(array)


def get_buffer(buffer_id: int | BufferHandle) -> Any:
    """Look up a pinned array."""
    return _registry.get(buffer_id)


def release_buffer(buffer_id: int | BufferHandle) -> bool:
    """Unpin an array; True when it was forgotten."""
    return _registry.release(buffer_id)


def release_references(body: memoryview) -> int:
    """Release every by-reference array named in a MessagePack `body`; how many were.

    An untyped walk: every extension type 2 the encoder wrote, wherever it sits. Nothing
    here raises (it runs while a queue discards messages): a malformed body releases
    what was read before the damage.
    """
    ids: list[int] = []

    def collect(code: int, payload: memoryview) -> None:
        if code == EXT_BUFFER_REF and len(payload) == _REF_SIZE:
            ids.append(int.from_bytes(payload, "big"))

    with contextlib.suppress(Exception):
        msgspec.msgpack.Decoder(ext_hook=collect).decode(body)
    released = 0
    for bid in ids:
        with contextlib.suppress(KeyError):  # already taken (decoded elsewhere)
            _registry.release(bid)
            released += 1
    return released
