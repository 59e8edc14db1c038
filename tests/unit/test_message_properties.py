"""Property tests for the message codec (hypothesis).

- Every supported field type round-trips, and the bytes decode with the ``msgpack`` package.
- Random, truncated and mutated bytes only ever raise ``MessageDeserializationError``, from
  every decoder: ``deserialize_message``, ``Class.deserialize``, a stream decoder
  (``message_decoder()``) and ``frame_priority``.
"""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any

import msgpack
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pydotcompute.exceptions import MessageDeserializationError
from pydotcompute.ring_kernels.message import (
    array_message,
    deserialize_message,
    frame_priority,
    message,
    message_decoder,
    release_frame,
)


@message
class Leaf:
    name: str
    weight: float


@message
class Mixed:
    i: int
    f: float
    s: str
    b: bytes
    flag: bool
    nothing: None
    maybe: int | None
    ints: list[int]
    table: dict[str, list[float]]
    leaf: Leaf
    leaves: list[Leaf]


@message
class WithArray:
    arr: np.ndarray


@message
class Fixed:
    a: np.int32
    b: np.float64
    v: Annotated[np.ndarray, (3,), np.float32]
    ok: bool


@message
class Untyped:
    value: Any


@array_message
class ByReference:
    arr: np.ndarray
    note: str


ints64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
floats = st.floats(allow_nan=False)
texts = st.text(max_size=40)
headers = {
    "priority": st.integers(min_value=0, max_value=255),
    "correlation_id": st.none() | st.uuids(),
    "message_id": st.uuids(version=4),
}
leaves = st.builds(Leaf, name=texts, weight=floats, **headers)
mixed = st.builds(
    Mixed,
    i=ints64,
    f=floats,
    s=texts,
    b=st.binary(max_size=64),
    flag=st.booleans(),
    nothing=st.none(),
    maybe=st.none() | ints64,
    ints=st.lists(ints64, max_size=8),
    table=st.dictionaries(texts, st.lists(floats, max_size=4), max_size=4),
    leaf=leaves,
    leaves=st.lists(leaves, max_size=3),
    **headers,
)
dtypes = (
    hnp.integer_dtypes(endianness="=")
    | hnp.unsigned_integer_dtypes(endianness="=")
    | hnp.floating_dtypes(endianness="=")
    | hnp.complex_number_dtypes(endianness="=")
    | hnp.boolean_dtypes()
    | hnp.datetime64_dtypes(endianness="=")
    | hnp.byte_string_dtypes(max_len=4)
    | hnp.unicode_string_dtypes(max_len=4)
)
arrays = hnp.arrays(dtypes, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
plain = st.recursive(
    st.none() | st.booleans() | ints64 | floats | texts | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)


def _fields(cls: type, frame: Any) -> dict[str, Any]:
    """The encoded fields by name: a frame is ``[tag, *fields, *header]``."""
    assert frame[0] == f"{cls.__module__}.{cls.__qualname__}"
    names = [f.name for f in msgspec.structs.fields(cls)]
    assert names[-3:] == ["message_id", "priority", "correlation_id"]
    assert len(frame) == 1 + len(names)
    return dict(zip(names, frame[1:], strict=True))


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@given(mixed)
def test_round_trip_of_generated_messages(msg: Mixed) -> None:
    back = deserialize_message(msg.serialize())
    assert type(back) is Mixed
    assert back == msg
    assert Mixed.deserialize(msg.serialize()) == msg


@given(mixed)
def test_generated_bytes_decode_with_msgpack(msg: Mixed) -> None:
    frame = msgpack.unpackb(msg.serialize(), raw=False, strict_map_key=False)
    assert frame[0] == f"{__name__}.Mixed"
    fields = _fields(Mixed, frame)
    assert fields["message_id"] == msg.message_id.bytes
    assert fields["priority"] == msg.priority
    cid = msg.correlation_id
    assert fields["correlation_id"] == (None if cid is None else cid.bytes)
    for name in ("i", "f", "s", "b", "flag", "nothing", "maybe", "ints", "table"):
        assert fields[name] == getattr(msg, name), name
    leaf = _fields(Leaf, fields["leaf"])
    assert (leaf["name"], leaf["weight"]) == (msg.leaf.name, msg.leaf.weight)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(arrays)
def test_round_trip_of_generated_arrays(arr: np.ndarray) -> None:
    back = WithArray.deserialize(WithArray(arr=arr).serialize()).arr
    assert _same_array(back, arr)


@given(arrays)
def test_non_contiguous_views_round_trip(arr: np.ndarray) -> None:
    assume(arr.ndim >= 1)
    view = arr[::-1]
    if arr.ndim >= 2:
        view = view.T
    back = WithArray.deserialize(WithArray(arr=view).serialize()).arr
    assert _same_array(back, np.ascontiguousarray(view))


@given(plain)
def test_untyped_fields_round_trip_plain_values(value: Any) -> None:
    assert Untyped.deserialize(Untyped(value=value).serialize()).value == value


@given(
    st.builds(
        Fixed,
        a=st.integers(-(2**31), 2**31 - 1).map(np.int32),
        b=st.floats(allow_nan=False).map(np.float64),
        v=hnp.arrays(np.float32, (3,), elements=st.floats(width=32, allow_nan=False)),
        ok=st.booleans(),
        **headers,
    )
)
def test_fixed_layout_codec_and_records_agree(msg: Fixed) -> None:
    via_bytes = Fixed.deserialize(msg.serialize())
    (via_records,) = Fixed.from_records(Fixed.to_records([msg]))
    for back in (via_bytes, via_records):
        assert back.message_id == msg.message_id
        assert back.correlation_id == msg.correlation_id
        assert back.priority == msg.priority
        assert (back.a, back.b, back.ok) == (msg.a, msg.b, msg.ok)
        np.testing.assert_array_equal(back.v, msg.v)


# --- fuzz: hostile bytes never escape as anything but MessageDeserializationError --------


SAMPLES = [
    Mixed(
        i=-1,
        f=math.pi,
        s="s",
        b=b"\x00",
        flag=False,
        nothing=None,
        maybe=3,
        ints=[1, 2],
        table={"k": [1.0]},
        leaf=Leaf(name="l", weight=1.0),
        leaves=[Leaf(name="m", weight=2.0)],
        correlation_id=uuid.uuid4(),
    ).serialize(),
    WithArray(arr=np.arange(12, dtype=np.float32).reshape(3, 4)).serialize(),
    Fixed(a=np.int32(1), b=np.float64(2), v=np.ones(3, np.float32), ok=True).serialize(),
    # decoding takes its array out of the registry once; later decodes find it gone
    ByReference(arr=np.arange(3), note="n").serialize(),
]


def _only_deserialization_errors(data: bytes) -> None:
    stream = message_decoder()
    stream(SAMPLES[0])  # its fast path primed with a class
    for decode in (deserialize_message, Mixed.deserialize, stream, frame_priority):
        try:
            decode(data)
        except MessageDeserializationError:
            pass
    assert release_frame(data) >= 0  # never raises


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _only_deserialization_errors(data)


@settings(max_examples=300)
@given(st.sampled_from(range(len(SAMPLES))), st.binary(max_size=120))
def test_valid_tag_with_random_body(which: int, tail: bytes) -> None:
    data = SAMPLES[which]
    # keep the array header and type tag, replace the body
    tag_end = 2 + data[1] - 0xA0 if 0xA0 <= data[1] <= 0xBF else 3 + data[2]
    _only_deserialization_errors(data[:tag_end] + tail)


@settings(max_examples=300)
@given(st.sampled_from(range(len(SAMPLES))), st.data())
def test_truncated_messages(which: int, data: st.DataObject) -> None:
    full = SAMPLES[which]
    cut = data.draw(st.integers(min_value=0, max_value=len(full) - 1))
    with pytest.raises(MessageDeserializationError):
        deserialize_message(full[:cut])


@settings(max_examples=1000)
@given(
    st.sampled_from(range(len(SAMPLES))),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_mutated_messages(which: int, edits: list[tuple[int, int]]) -> None:
    data = bytearray(SAMPLES[which])
    for pos, value in edits:
        data[pos % len(data)] = value
    _only_deserialization_errors(bytes(data))


@settings(max_examples=300)
@given(
    st.sampled_from(range(len(SAMPLES))),
    st.integers(min_value=0),
    st.binary(min_size=1, max_size=8),
)
def test_inserted_bytes(which: int, pos: int, insert: bytes) -> None:
    data = SAMPLES[which]
    pos %= len(data)
    _only_deserialization_errors(data[:pos] + insert + data[pos:])
