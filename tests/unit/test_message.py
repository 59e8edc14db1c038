"""Messages: ``@message``, headers, the MessagePack codec, fixed layouts, by-reference arrays."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import sys
import textwrap
import typing
import uuid
from pathlib import Path
from typing import Annotated, Any

import msgpack
import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydotcompute.exceptions import (
    MessageDeserializationError,
    MessageSerializationError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.message import (
    ArrayMessage,
    BufferHandle,
    BufferRegistry,
    RingKernelMessage,
    array_message,
    deserialize_message,
    fixed_layout_dtype,
    get_buffer,
    get_buffer_registry,
    get_message_type,
    is_fixed_layout,
    message,
    message_field_names,
    raw_correlation_get,
    register_buffer,
    registered_message_types,
    release_buffer,
    serialize_message,
    stamp_reply,
)


@message
class Point:
    x: float
    y: float


@message()
class Tagged:
    name: str
    tags: list[str] = dataclasses.field(default_factory=list)


@message
class Envelope:
    point: Point
    points: list[Point]
    label: str | None = None


@message
class Everything:
    i: int
    f: float
    s: str
    b: bytes
    flag: bool
    nothing: None
    maybe: int | None
    ints: list[int]
    table: dict[str, list[float]]
    inner: Point
    arr: np.ndarray


@message
class Sample:
    seq: int
    value: np.float32
    vec: Annotated[np.ndarray, (4,), np.float32]
    ok: bool
    count: Annotated[int, np.int16]


@message
class Blob:
    payload: Any


@message
class Nest:
    inner: Blob
    label: str = ""


@array_message
class Frame:
    pixels: np.ndarray
    index: int


def _everything(**kw: Any) -> Everything:
    fields: dict[str, Any] = {
        "i": -(2**63),
        "f": -1.25e-300,
        "s": "héllo ✓",
        "b": b"\x00\xff\x80",
        "flag": True,
        "nothing": None,
        "maybe": None,
        "ints": [0, 1, 2**64 - 1],
        "table": {"a": [1.5, -2.0], "": []},
        "inner": Point(x=1.0, y=2.0, priority=7),
        "arr": np.arange(6, dtype=np.int16).reshape(2, 3),
    }
    fields.update(kw)
    return Everything(**fields)


# --- the class -------------------------------------------------------------------------


def test_message_builds_a_struct_inheriting_the_base() -> None:
    p = Point(x=1.0, y=2.0)
    assert isinstance(p, RingKernelMessage)
    assert isinstance(p, msgspec.Struct)
    assert not hasattr(p, "__dict__")
    assert Point.__name__ == "Point"
    assert Point.__module__ == __name__
    names = [f.name for f in msgspec.structs.fields(Point)]
    assert names == ["x", "y", "message_id", "priority", "correlation_id"]
    assert message_field_names(Point) == ("x", "y")


def test_called_form_and_defaults() -> None:
    t = Tagged(name="n")
    assert t.tags == []
    assert isinstance(t, RingKernelMessage)


def test_header_fields_are_keyword_only_with_defaults() -> None:
    p = Point(1.0, 2.0)
    assert p.priority == 128
    assert p.correlation_id is None
    assert isinstance(p.message_id, uuid.UUID)
    with pytest.raises(TypeError):
        Point(1.0, 2.0, 5)  # type: ignore[misc]


def test_message_ids_are_unique_v4_uuids() -> None:
    ids = [Point(x=0.0, y=0.0).message_id for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in ids[:100])


def test_message_id_is_stable_once_read() -> None:
    p = Point(x=0.0, y=0.0)
    assert p.message_id == p.message_id
    explicit = uuid.uuid4()
    assert Point(x=0.0, y=0.0, message_id=explicit).message_id == explicit


@pytest.mark.parametrize("bad", [-1, 256, 1000, True, 1.0, "1", None])
def test_priority_outside_0_255_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"priority must be an int in 0\.\.255, got "):
        Point(x=0.0, y=0.0, priority=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("ok", [0, 63, 64, 159, 160, 223, 224, 255])
def test_priority_band_edges_are_accepted(ok: int) -> None:
    assert Point(x=0.0, y=0.0, priority=ok).priority == ok


def test_subclass_of_a_message_is_a_message() -> None:
    @message
    class Point3(Point):
        z: float

    p = Point3(x=1.0, y=2.0, z=3.0)
    assert isinstance(p, Point)
    back = deserialize_message(p.serialize())
    assert type(back) is Point3
    assert (back.x, back.y, back.z) == (1.0, 2.0, 3.0)


# --- correlation -----------------------------------------------------------------------


def test_reply_with_fields_builds_the_same_type_correlated() -> None:
    req = Point(x=1.0, y=2.0)
    rep = req.reply(x=3.0, y=4.0)
    assert type(rep) is Point
    assert rep.correlation_id == req.message_id
    assert rep.message_id != req.message_id


def test_reply_with_a_class_builds_that_class() -> None:
    req = Point(x=1.0, y=2.0)
    rep = req.reply(Tagged, name="answer")
    assert isinstance(rep, Tagged)
    assert rep.correlation_id == req.message_id


def test_reply_with_an_instance_stamps_it() -> None:
    req = Point(x=1.0, y=2.0)
    answer = Tagged(name="a")
    assert req.reply(answer) is answer
    assert answer.correlation_id == req.message_id


def test_with_correlation_returns_a_copy() -> None:
    p = Point(x=1.0, y=2.0)
    cid = uuid.uuid4()
    q = p.with_correlation(cid)
    assert q is not p
    assert q.correlation_id == cid
    assert p.correlation_id is None
    assert (q.x, q.y, q.priority) == (p.x, p.y, p.priority)


# --- codec round trips -----------------------------------------------------------------


def test_round_trip_of_every_supported_field_type() -> None:
    msg = _everything(priority=201, correlation_id=uuid.uuid4())
    back = deserialize_message(msg.serialize())
    assert type(back) is Everything
    for f in msgspec.structs.fields(Everything):
        if f.name != "arr":
            assert getattr(back, f.name) == getattr(msg, f.name), f.name
    assert back.arr.dtype == msg.arr.dtype
    np.testing.assert_array_equal(back.arr, msg.arr)
    assert back.inner.priority == 7


def test_class_deserialize_and_function_forms() -> None:
    p = Point(x=1.5, y=-2.5, priority=3)
    data = serialize_message(p)
    assert data == p.serialize()
    back = Point.deserialize(data)
    assert back == p
    assert Point.deserialize(bytearray(data)) == p
    assert Point.deserialize(memoryview(data)) == p


def test_nested_messages_round_trip() -> None:
    env = Envelope(point=Point(x=1.0, y=2.0), points=[Point(x=float(i), y=0.0) for i in range(3)])
    back = Envelope.deserialize(env.serialize())
    assert back == env
    assert type(back.point) is Point
    assert all(type(p) is Point for p in back.points)


def test_any_field_carries_plain_msgpack_values_and_arrays() -> None:
    payload = {"k": [1, "two", 3.0, None, True, b"x"], "n": {"deep": [[]]}}
    assert Blob.deserialize(Blob(payload=payload).serialize()).payload == payload
    arr = np.arange(3.0)
    np.testing.assert_array_equal(Blob.deserialize(Blob(payload=arr).serialize()).payload, arr)


ARRAYS = {
    "f64-1d": np.linspace(0, 1, 7),
    "f32-2d": np.arange(12, dtype=np.float32).reshape(3, 4),
    "i8-3d": np.arange(24, dtype=np.int8).reshape(2, 3, 4),
    "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "bool": np.array([True, False, True]),
    "complex64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "0-d": np.array(5.5),
    "empty-1d": np.zeros(0, dtype=np.float32),
    "empty-2d": np.zeros((0, 3), dtype=np.int32),
    "empty-inner": np.zeros((2, 0)),
    "big-endian": np.arange(4, dtype=">i4"),
    "non-contiguous": np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2],
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "unicode": np.array(["ab", "c"]),
    "structured": np.array([(1.0, 2), (3.0, 4)], dtype=[("x", "<f4"), ("n", "<i8")]),
    "datetime": np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]"),
}


@pytest.mark.parametrize("arr", list(ARRAYS.values()), ids=list(ARRAYS))
def test_numpy_arrays_round_trip_with_dtype_and_shape(arr: np.ndarray) -> None:
    back = Blob.deserialize(Blob(payload=arr).serialize()).payload
    assert isinstance(back, np.ndarray)
    assert back.dtype == arr.dtype
    assert back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


def test_decoded_arrays_are_read_only_views_of_the_bytes() -> None:
    arr = np.arange(1000, dtype=np.float64)
    data = Blob(payload=arr).serialize()
    back = Blob.deserialize(data).payload
    assert not back.flags.owndata
    assert not back.flags.writeable
    assert np.shares_memory(back, np.frombuffer(data, dtype=np.uint8))


def test_numpy_scalars_in_untyped_fields_become_python_values() -> None:
    back = Blob.deserialize(Blob(payload=[np.int32(3), np.float64(2.5)]).serialize()).payload
    assert back == [3, 2.5]


def test_typed_numpy_scalar_fields_decode_to_that_type() -> None:
    s = Sample(seq=1, value=np.float32(0.5), vec=np.ones(4, np.float32), ok=True, count=3)
    back = Sample.deserialize(s.serialize())
    assert type(back.value) is np.float32
    assert back.value == np.float32(0.5)


# --- the wire format is MessagePack ----------------------------------------------------


def test_bytes_are_readable_by_the_msgpack_package() -> None:
    msg = _everything(priority=9)
    decoded = msgpack.unpackb(msg.serialize(), raw=False, strict_map_key=False)
    assert isinstance(decoded, list)
    # one array: [type_tag, *fields in declaration order, message_id, priority, correlation_id]
    assert len(decoded) == 1 + 11 + 3
    tag, *body, mid, priority, cid = decoded
    assert tag == f"{__name__}.Everything"
    assert mid == msg.message_id.bytes
    assert priority == 9
    assert cid is None
    fields = dict(
        zip(
            ("i", "f", "s", "b", "flag", "nothing", "maybe", "ints", "table", "inner", "arr"),
            body,
            strict=True,
        )
    )
    for name in ("i", "f", "s", "b", "flag", "nothing", "maybe", "ints", "table"):
        assert fields[name] == getattr(msg, name), name
    # nested messages travel as frames of their own
    assert fields["inner"][:3] == [f"{__name__}.Point", 1.0, 2.0]
    assert fields["inner"][4] == 7
    ext = fields["arr"]
    assert isinstance(ext, msgpack.ExtType)
    assert ext.code == 1
    assert ext.data.endswith(msg.arr.tobytes())


def test_correlation_id_is_written_as_16_bytes() -> None:
    req = Point(x=0.0, y=0.0)
    rep = req.reply(x=1.0, y=1.0)
    frame = msgpack.unpackb(rep.serialize())
    assert frame[-1] == req.message_id.bytes


# --- the registry ----------------------------------------------------------------------


def test_classes_register_under_their_fully_qualified_name() -> None:
    assert get_message_type(f"{__name__}.Point") is Point

    @message
    class LookupByShortNameProbe:
        n: int

    assert get_message_type("LookupByShortNameProbe") is LookupByShortNameProbe
    assert registered_message_types()[f"{__name__}.Point"] is Point
    assert get_message_type("NoSuchMessage") is None


def _write_module(root: Path, name: str, body: str) -> None:
    (root / f"{name}.py").write_text(textwrap.dedent(body))


def test_same_short_name_in_two_modules_does_not_collide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for mod, field_type in (("pdc_msgs_alpha", "int"), ("pdc_msgs_beta", "str")):
        _write_module(
            tmp_path,
            mod,
            f"""
            from pydotcompute import message

            @message
            class Ping:
                value: {field_type}
            """,
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        alpha = importlib.import_module("pdc_msgs_alpha")
        beta = importlib.import_module("pdc_msgs_beta")
        a = deserialize_message(alpha.Ping(value=1).serialize())
        b = deserialize_message(beta.Ping(value="one").serialize())
        assert type(a) is alpha.Ping
        assert type(b) is beta.Ping
        assert (a.value, b.value) == (1, "one")
        assert get_message_type("pdc_msgs_alpha.Ping") is alpha.Ping
        assert get_message_type("pdc_msgs_beta.Ping") is beta.Ping
        assert get_message_type("Ping") is None  # ambiguous short name
        with pytest.raises(  # one short name: the modules tell them apart
            MessageDeserializationError,
            match=r"bytes hold a pdc_msgs_alpha\.Ping message, expected pdc_msgs_beta\.Ping$",
        ):
            beta.Ping.deserialize(alpha.Ping(value=1).serialize())
    finally:
        sys.modules.pop("pdc_msgs_alpha", None)
        sys.modules.pop("pdc_msgs_beta", None)


def _order_class(kind: str) -> type:
    """A factory: every class it makes has the qualified name `_order_class.<locals>.Order`."""
    if kind == "order":

        @message
        class Order:
            account: str
            amount: int

        return Order
    if kind == "str-amount":

        @message
        class Order:  # type: ignore[no-redef]
            account: str
            amount: str

        return Order
    if kind == "array":

        @array_message
        class Order:  # type: ignore[no-redef]
            account: str
            amount: int

        return Order

    @message
    class Order:  # type: ignore[no-redef]
        user: str
        level: int

    return Order


def test_a_tag_taken_by_another_class_is_refused() -> None:
    order = _order_class("order")
    tag = f"{__name__}._order_class.<locals>.Order"
    with pytest.raises(TypeValidationError) as info:
        _order_class("user")
    text = str(info.value)
    assert f"message type tag {tag!r} is taken" in text
    assert "Order(account: str, amount: int)" in text  # both classes, by their fields
    assert "Order(user: str, level: int)" in text
    assert "__qualname__" in text  # how to fix it
    for kind in ("str-amount", "array"):  # another field type, or arrays by reference
        with pytest.raises(TypeValidationError, match="is taken"):
            _order_class(kind)
    assert registered_message_types()[tag] is order
    back = deserialize_message(order(account="a-1", amount=5).serialize())
    assert type(back) is order
    assert (back.account, back.amount) == ("a-1", 5)


def test_distinct_qualified_names_let_a_factory_make_several_classes() -> None:
    def make(name: str, field: str) -> type:
        cls = type(name, (), {"__annotations__": {field: int}})
        cls.__qualname__ = f"make.{name}"  # what the refusal suggests
        return message(cls)

    first, second = make("OrderA", "amount"), make("OrderB", "level")
    assert type(deserialize_message(first(amount=1).serialize())) is first
    assert type(deserialize_message(second(level=2).serialize())) is second


def test_a_class_redefined_with_the_same_fields_replaces_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_module(
        tmp_path,
        "pdc_msgs_reloaded",
        """
        from pydotcompute import message

        @message
        class Ping:
            value: int

            def double(self) -> int:
                return 2 * self.value
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mod = importlib.import_module("pdc_msgs_reloaded")
        old = mod.Ping
        assert message(old) is old  # decorated again: the same class, still registered
        assert type(deserialize_message(old(value=1).serialize())) is old  # its tag met
        mod = importlib.reload(mod)  # a module reloaded (a notebook cell run again)
        assert mod.Ping is not old
        assert get_message_type("pdc_msgs_reloaded.Ping") is mod.Ping
        back = deserialize_message(old(value=3).serialize())
        assert type(back) is mod.Ping  # frames decode into the class defined last
        assert back.double() == 6
        with pytest.raises(  # the old class no longer decodes them, and says why
            MessageDeserializationError,
            match=r"bytes hold a pdc_msgs_reloaded\.Ping message of another definition "
            r"\(the class was reloaded or redefined: .*\), expected pdc_msgs_reloaded\.Ping",
        ):
            old.deserialize(old(value=3).serialize())
        # a factory making the same fields twice: the same rule
        first, second = _order_class("order"), _order_class("order")
        assert type(deserialize_message(first(account="x", amount=1).serialize())) is second
    finally:
        sys.modules.pop("pdc_msgs_reloaded", None)


def test_deserialize_into_the_wrong_class_is_refused() -> None:
    with pytest.raises(
        MessageDeserializationError, match="bytes hold a Point message, expected Tagged"
    ):
        Tagged.deserialize(Point(x=0.0, y=0.0).serialize())


def test_unknown_type_tag_says_how_to_fix_it() -> None:
    data = msgpack.packb(["nowhere.Missing", 1, b"\x01" * 16, 128, None])
    with pytest.raises(
        MessageDeserializationError, match=r"unknown message type 'nowhere\.Missing'.*import"
    ):
        deserialize_message(data)


# --- clear errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"\x92", b"\x91\xa1x", b"\x93\xa1x\x01\x02", b"\xc0", b"garbage!", b"\x92\x01\x02"],
    ids=["empty", "array-only", "one-element", "three-elements", "nil", "text", "int-tag"],
)
def test_malformed_bytes_raise_message_deserialization_error(data: bytes) -> None:
    with pytest.raises(MessageDeserializationError, match=r"not a pydotcompute message|malformed"):
        deserialize_message(data)


def test_every_truncation_of_a_valid_message_is_refused() -> None:
    data = _everything().serialize()
    for n in range(len(data)):
        with pytest.raises(MessageDeserializationError):
            deserialize_message(data[:n])


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(MessageDeserializationError, match="cannot decode Point"):
        deserialize_message(Point(x=0.0, y=0.0).serialize() + b"\x00")


def test_field_of_the_wrong_type_is_refused_naming_the_class() -> None:
    data = msgpack.packb([f"{__name__}.Point", "one", 2.0, b"\x01" * 16, 128, None])
    with pytest.raises(
        MessageDeserializationError, match=r"cannot decode Point: Expected `float`.* at `x`"
    ):
        deserialize_message(data)


def test_out_of_range_priority_in_bytes_is_refused() -> None:
    data = msgpack.packb([f"{__name__}.Point", 1.0, 2.0, b"\x01" * 16, 300, None])
    with pytest.raises(MessageDeserializationError, match="at `priority`"):
        deserialize_message(data)


def test_out_of_range_numpy_scalar_in_bytes_is_refused() -> None:
    frame = msgpack.unpackb(
        Sample(
            seq=1, value=np.float32(1), vec=np.ones(4, np.float32), ok=True, count=1
        ).serialize(),
        strict_map_key=False,
    )
    frame[2] = 1e300  # "value" does not fit a float32
    data = msgpack.packb(frame)
    with pytest.raises(MessageDeserializationError, match=r"cannot decode Sample: .*`value`"):
        deserialize_message(data)


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan, 3.4028234663852886e38, -1e-45])
def test_infinities_and_extremes_of_a_float32_field_round_trip(value: float) -> None:
    s = Sample(seq=1, value=np.float32(value), vec=np.ones(4, np.float32), ok=True, count=1)
    back = Sample.deserialize(s.serialize()).value
    np.testing.assert_equal(back, np.float32(value))


@pytest.mark.parametrize("data", [None, 5, "text", [1, 2]], ids=type)
def test_non_bytes_input_is_refused(data: object) -> None:
    with pytest.raises(MessageDeserializationError, match="expected bytes to deserialize"):
        deserialize_message(data)  # type: ignore[arg-type]


def test_unsupported_field_value_raises_serialization_error() -> None:
    with pytest.raises(MessageSerializationError, match=r"cannot serialize Blob: .*object"):
        Blob(payload=object()).serialize()


def _nested(depth: int) -> list[Any]:
    top: list[Any] = []
    cur = top
    for _ in range(depth):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return top


def _looped() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


def _looped_dict() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


@pytest.mark.parametrize(
    "value", [_nested(100_000), _looped(), _looped_dict()], ids=["deep", "loop", "dict-loop"]
)
def test_a_value_too_deep_to_encode_names_its_field(value: Any) -> None:
    with pytest.raises(
        MessageSerializationError,
        match=r"cannot serialize Blob: field 'payload' is nested too deeply or contains itself",
    ):
        Blob(payload=value).serialize()
    with pytest.raises(MessageSerializationError, match=r"field 'inner\.payload' is nested"):
        Nest(inner=Blob(payload=value)).serialize()
    assert deserialize_message(Blob(payload=_nested(50)).serialize()).payload == _nested(50)


def test_int_too_large_for_msgpack_raises_serialization_error() -> None:
    with pytest.raises(MessageSerializationError, match="cannot serialize Blob"):
        Blob(payload=2**64).serialize()


def test_object_arrays_cannot_be_serialized() -> None:
    with pytest.raises(MessageSerializationError, match=r"dtype object"):
        Blob(payload=np.array([object()])).serialize()


def test_object_array_in_bytes_is_refused() -> None:
    header = msgpack.packb(("|O", [1]))
    ext = msgpack.ExtType(1, bytes([len(header)]) + header + b"\x00" * 8)
    data = msgpack.packb([f"{__name__}.Blob", ext, b"\x01" * 16, 128, None])
    with pytest.raises(MessageDeserializationError, match="object arrays are not accepted"):
        deserialize_message(data)


def test_unknown_extension_type_is_refused() -> None:
    data = msgpack.packb([f"{__name__}.Blob", msgpack.ExtType(42, b""), b"\x01" * 16, 128, None])
    with pytest.raises(MessageDeserializationError, match="unknown MessagePack extension type 42"):
        deserialize_message(data)


# --- fixed layout ----------------------------------------------------------------------


def test_fixed_layout_dtype_has_header_then_fields() -> None:
    dt = Sample.dtype
    assert is_fixed_layout(Sample)
    assert fixed_layout_dtype(Sample) == dt
    assert dt.names == (
        "_mid_hi",
        "_mid_lo",
        "_cid_hi",
        "_cid_lo",
        "_priority",
        "seq",
        "value",
        "vec",
        "ok",
        "count",
    )
    assert dt["seq"] == np.dtype(np.int64)
    assert dt["value"] == np.dtype(np.float32)
    assert dt["vec"].shape == (4,)
    assert dt["vec"].base == np.dtype(np.float32)
    assert dt["ok"] == np.dtype(np.bool_)
    assert dt["count"] == np.dtype(np.int16)
    assert dt.isalignedstruct


def test_variable_size_messages_have_no_fixed_layout() -> None:
    for cls in (Tagged, Envelope, Everything, Blob):
        assert not is_fixed_layout(cls)
        assert fixed_layout_dtype(cls) is None
    with pytest.raises(TypeValidationError, match="Tagged is not a fixed-layout message"):
        Tagged.to_records([Tagged(name="x")])


def test_to_records_from_records_round_trip() -> None:
    req = Point(x=0.0, y=0.0)
    msgs = [
        Sample(
            seq=i,
            value=np.float32(i / 4),
            vec=np.arange(4, dtype=np.float32) * i,
            ok=bool(i % 2),
            count=-i,
            priority=i * 50,
            correlation_id=req.message_id if i == 2 else None,
        )
        for i in range(5)
    ]
    records = Sample.to_records(msgs)
    assert records.dtype == Sample.dtype
    assert records.shape == (5,)
    np.testing.assert_array_equal(records["seq"], np.arange(5))
    back = Sample.from_records(records)
    for a, b in zip(msgs, back, strict=True):
        assert type(b) is Sample
        assert b.message_id == a.message_id
        assert b.correlation_id == a.correlation_id
        assert b.priority == a.priority
        assert (b.seq, b.ok, b.count) == (a.seq, a.ok, a.count)
        assert b.value == a.value
        np.testing.assert_array_equal(b.vec, a.vec)


def test_records_refuse_the_wrong_class_or_dtype() -> None:
    with pytest.raises(TypeValidationError, match="to_records expects Sample, got Point"):
        Sample.to_records([Point(x=0.0, y=0.0)])  # type: ignore[list-item]
    with pytest.raises(TypeValidationError, match="records have dtype"):
        Sample.from_records(np.zeros(3, dtype=np.float64))


def test_fixed_layout_records_travel_inside_a_message() -> None:
    msgs = [
        Sample(seq=i, value=np.float32(i), vec=np.full(4, i, np.float32), ok=True, count=i)
        for i in range(3)
    ]
    records = Sample.to_records(msgs)
    back = Blob.deserialize(Blob(payload=records).serialize()).payload
    assert back.dtype == Sample.dtype  # offsets and padding survive
    assert [m.seq for m in Sample.from_records(back)] == [0, 1, 2]


def test_empty_record_batch() -> None:
    records = Sample.to_records([])
    assert records.shape == (0,)
    assert Sample.from_records(records) == []


# --- by-reference arrays ---------------------------------------------------------------


@pytest.fixture
def registry_baseline() -> dict[str, int]:
    return get_buffer_registry().get_stats()


def test_array_message_is_a_message(registry_baseline: dict[str, int]) -> None:
    f = Frame(pixels=np.zeros(3), index=1)
    assert isinstance(f, ArrayMessage)
    assert isinstance(f, RingKernelMessage)


def test_array_message_passes_arrays_by_reference(registry_baseline: dict[str, int]) -> None:
    reg = get_buffer_registry()
    pixels = np.arange(1 << 16, dtype=np.uint8)
    data = Frame(pixels=pixels, index=3).serialize()
    assert len(data) < 200  # the array itself is not in the bytes
    assert reg.get_stats()["live_buffers"] == registry_baseline["live_buffers"] + 1
    back = Frame.deserialize(data)
    assert back.pixels is pixels
    assert back.index == 3
    # the decoder consumed the reference the encoder made
    assert reg.get_stats()["live_buffers"] == registry_baseline["live_buffers"]
    with pytest.raises(MessageDeserializationError, match="no buffer with id"):
        Frame.deserialize(data)


def test_array_message_refcounts_per_serialization(registry_baseline: dict[str, int]) -> None:
    reg = get_buffer_registry()
    pixels = np.ones(10)
    frame = Frame(pixels=pixels, index=0)
    first, second = frame.serialize(), frame.serialize()
    assert reg.get_stats()["live_buffers"] == registry_baseline["live_buffers"] + 1
    bid = int.from_bytes(msgpack.unpackb(first)[1].data, "big")
    assert reg.refcount(bid) == 2
    assert Frame.deserialize(first).pixels is pixels
    assert reg.refcount(bid) == 1
    assert Frame.deserialize(second).pixels is pixels
    assert reg.refcount(bid) == 0
    assert reg.get_stats()["live_buffers"] == registry_baseline["live_buffers"]


def test_buffer_registry_register_get_release() -> None:
    reg = BufferRegistry()
    a = np.zeros((2, 3), dtype=np.float32)
    h = reg.register(a)
    assert h == BufferHandle(h.buffer_id, (2, 3), "float32", "cpu")
    assert reg.get(h) is a
    assert reg.get(h.buffer_id) is a
    assert reg.register(a).buffer_id == h.buffer_id
    assert reg.refcount(h) == 2
    assert len(reg) == 1
    assert reg.get_stats() == {
        "live_buffers": 1,
        "live_bytes": a.nbytes,
        "total_registered": 2,
        "total_released": 0,
    }
    assert reg.release(h) is False
    assert reg.release(h) is True
    assert len(reg) == 0
    assert reg.refcount(h) == 0
    with pytest.raises(KeyError, match=f"no buffer with id {h.buffer_id}"):
        reg.get(h)
    with pytest.raises(KeyError, match="released or never made"):
        reg.release(h)
    b = np.zeros(1)
    assert reg.register(b).buffer_id != h.buffer_id
    reg.clear()
    assert len(reg) == 0


def test_distinct_arrays_get_distinct_ids() -> None:
    reg = BufferRegistry()
    ids = {reg.register(np.zeros(1)).buffer_id for _ in range(5)}
    assert len(ids) == 5


def test_module_level_buffer_functions_use_the_process_registry() -> None:
    a = np.arange(3)
    h = register_buffer(a)
    try:
        assert get_buffer(h) is a
        assert get_buffer_registry().refcount(h) == 1
    finally:
        assert release_buffer(h) is True
    with pytest.raises(KeyError):
        get_buffer(h)


@message
class AMessageClassWhoseQualifiedNameIsLongerThanThirtyOneCharacters:
    x: int = 0


@given(st.integers(0, 255), st.integers(-(2**40), 2**40))
def test_frame_priority_reads_the_header_without_decoding(priority: int, x: int) -> None:
    from pydotcompute.ring_kernels.message import frame_priority

    long_tag = AMessageClassWhoseQualifiedNameIsLongerThanThirtyOneCharacters
    for msg in (Point(x=float(x), y=1.0, priority=priority), long_tag(x=x, priority=priority)):
        assert frame_priority(msg.serialize()) == priority
    # another encoder may write the priority in a wider int: still read, same as decoding
    tag, px, py, mid, _, cid = msgpack.unpackb(
        Point(x=float(x), y=1.0, priority=priority).serialize()
    )
    wide = b"\x96" + b"".join(msgpack.packb(v) for v in (tag, px, py, mid))
    wide += b"\xcd" + priority.to_bytes(2) + msgpack.packb(cid)
    assert frame_priority(wide) == priority
    assert deserialize_message(wide).priority == priority


def test_release_frame_gives_back_what_a_dropped_array_frame_pinned() -> None:
    from pydotcompute.ring_kernels.message import release_frame

    reg = get_buffer_registry()
    pixels = np.arange(6)
    data = Frame(pixels=pixels, index=1).serialize()
    bid = int.from_bytes(msgpack.unpackb(data)[1].data, "big")
    assert reg.refcount(bid) == 1
    assert release_frame(Point(x=1, y=2.0).serialize()) == 0  # not by reference
    assert release_frame(b"\x00junk") == 0
    assert release_frame(data) == 1
    assert reg.refcount(bid) == 0
    assert release_frame(data) == 0  # released once only


def test_stamp_reply_correlates_only_an_uncorrelated_message() -> None:
    request = Point(x=1.0, y=2.0)
    reply = Point(x=3.0, y=4.0)
    stamp_reply(reply, request)
    assert reply.correlation_id == request.message_id  # resolved from the request
    decoded = deserialize_message(reply.serialize())
    assert decoded.correlation_id == request.message_id

    other = Point(x=5.0, y=6.0)
    stamp_reply(reply, other)  # already correlated: kept
    assert reply.correlation_id == request.message_id
    own = uuid.uuid4()
    explicit = Point(x=0.0, y=0.0, correlation_id=own)
    stamp_reply(explicit, request)
    assert explicit.correlation_id == own

    loose = Point(x=0.0, y=0.0)
    stamp_reply(loose, None)  # nothing being handled
    assert loose.correlation_id is None
    stamp_reply({"plain": 1}, request)  # not a message: left alone, no error


# --- correlation never makes a reference cycle ------------------------------------------------
# A message's correlation slot may hold the request object itself (its id is made only if
# read or sent). A message holding itself, or two holding each other, would never be freed:
# a message of scalar fields is not tracked by the cycle collector.


def test_a_message_forwarded_as_its_own_reply_does_not_hold_itself() -> None:
    msg = Point(x=1.0, y=2.0)
    stamp_reply(msg, msg)  # an actor sending on the message it is handling
    assert raw_correlation_get(msg) is not msg
    assert msg.correlation_id == msg.message_id  # still reads as correlated to itself
    assert sys.getrefcount(msg) == 2  # the name and the call's argument: nothing else


def test_reply_with_itself_does_not_hold_itself() -> None:
    msg = Point(x=1.0, y=2.0)
    assert msg.reply(msg) is msg
    assert raw_correlation_get(msg) is not msg
    assert msg.correlation_id == msg.message_id
    assert sys.getrefcount(msg) == 2


def test_stamping_never_closes_a_loop_of_requests() -> None:
    first = Point(x=1.0, y=2.0)
    second = Point(x=3.0, y=4.0)
    stamp_reply(second, first)  # second answers first (holds it)
    stamp_reply(first, second)  # first sent again while second is handled
    assert raw_correlation_get(second) is first
    assert raw_correlation_get(first) is not second  # holds second's id, not second
    assert first.correlation_id == second.message_id
    assert second.correlation_id == first.message_id
    del first
    assert sys.getrefcount(second) == 2


def test_a_chain_of_replies_is_kept_as_objects_up_to_the_limit() -> None:
    from pydotcompute.ring_kernels.message.base import CHAIN_LIMIT

    chain = [Point(x=float(i), y=0.0) for i in range(CHAIN_LIMIT + 2)]
    for request, reply in itertools.pairwise(chain[: CHAIN_LIMIT + 1]):
        stamp_reply(reply, request)
    for request, reply in itertools.pairwise(chain[: CHAIN_LIMIT + 1]):
        assert raw_correlation_get(reply) is request  # no id made before it is needed
    # the next request has a chain longer than is followed: its id is stored instead
    last, beyond = chain[CHAIN_LIMIT], chain[CHAIN_LIMIT + 1]
    stamp_reply(beyond, last)
    assert raw_correlation_get(beyond) == last.message_id.bytes
    for request, reply in itertools.pairwise(chain):
        assert reply.correlation_id == request.message_id


def test_a_message_with_containers_is_answered_by_its_id() -> None:
    # an Envelope can hold other messages: a reply that held it could close a loop the
    # cycle collector cannot see (unwrapping an envelope and sending its inner message on)
    inner = Point(x=1.0, y=2.0)
    env = Envelope(point=inner, points=[inner])
    stamp_reply(inner, env)
    assert not isinstance(raw_correlation_get(inner), RingKernelMessage)  # an id
    assert inner.correlation_id == env.message_id
    reply = Envelope(point=Point(x=0.0, y=0.0), points=[])
    assert env.reply(reply) is reply
    assert not isinstance(raw_correlation_get(reply), RingKernelMessage)
    assert reply.correlation_id == env.message_id
    refs = sys.getrefcount(env)
    del reply
    assert sys.getrefcount(env) == refs  # nothing held it


@pytest.mark.parametrize(
    ("tp", "scalar"),
    [
        (int, True),
        (str | None, True),
        (Annotated[float, msgspec.Meta(ge=0)], True),
        (tuple[int, ...], True),
        (tuple[int, str], True),
        (frozenset[uuid.UUID], True),
        (typing.Literal["a", "b"], True),
        (list[int], False),
        (dict[str, int], False),
        (tuple[list[int], ...], False),
        (Any, False),
        (np.ndarray, False),
        (Point, False),
        (int | list[int], False),
    ],
)
def test_which_field_types_count_as_scalars(tp: Any, scalar: bool) -> None:
    from pydotcompute.ring_kernels.message.decorate import is_scalar_type

    assert is_scalar_type(tp) is scalar


def test_only_classes_of_scalar_fields_skip_the_cycle_collector() -> None:
    import gc

    @message
    class Plain:
        a: int
        b: str = ""

    @message
    class WithList(Plain):
        items: list[int] = msgspec.field(default_factory=list)

    @message
    class BackToScalars(WithList):
        c: float = 0.0

    assert Plain.__struct_config__.gc is False
    assert WithList.__struct_config__.gc is True
    assert BackToScalars.__struct_config__.gc is True  # inherits the list
    assert Everything.__struct_config__.gc is True  # lists, dicts, a message
    assert Point.__struct_config__.gc is False
    m = WithList(a=1)
    m.items.append(m)  # a loop through a container: the collector frees it
    before = len([o for o in gc.get_objects() if type(o) is WithList])
    del m
    gc.collect()
    assert len([o for o in gc.get_objects() if type(o) is WithList]) == before - 1
    decoded = deserialize_message(Plain(a=1, b="x").serialize())
    assert decoded == Plain(a=1, b="x", message_id=decoded.message_id)
    assert not gc.is_tracked(decoded)


# --- the keys callers are filed under -------------------------------------------------


def test_request_and_reply_keys_are_the_id_bytes() -> None:
    from pydotcompute.ring_kernels.message import id_key, reply_key, request_key

    @message
    class KeyReq:
        x: int

    req = KeyReq(x=1)
    key = request_key(req)  # made now, as wire bytes: no UUID built
    assert type(key) is bytes
    assert len(key) == 16
    assert req.message_id.bytes == key  # the same id when read afterwards
    assert request_key(req) == key
    stamped = req.reply(KeyReq(x=2))
    assert reply_key(stamped) == key  # a reply stamped with the request itself
    decoded = KeyReq.deserialize(KeyReq(x=3, correlation_id=req.message_id).serialize())
    assert reply_key(decoded) == key  # a reply read from the wire
    assert reply_key(KeyReq(x=4)) is None
    assert id_key(req.message_id) == id_key(key) == id_key(bytearray(key)) == id_key(req) == key
    assert id_key(None) is None
    assert id_key("other") == "other"  # matches nothing filed by request_key


def test_reply_to_a_request_without_an_id_answers_no_caller() -> None:
    """A reply stamped with a request whose id was never made (a plain send's) has no
    caller's key: `reply_key` says None (a caller's request has its id made before it is
    sent); the id, made when read, is the one its key is then."""
    from pydotcompute.ring_kernels.message import raw_correlation_get, reply_key

    @message
    class KeyLazy:
        x: int

    req = KeyLazy(x=1)
    stamped = req.reply(KeyLazy(x=2))
    assert raw_correlation_get(stamped) is req
    assert reply_key(stamped) is None
    assert stamped.correlation_id == req.message_id  # made when read, the same id
    assert reply_key(stamped) == req.message_id.bytes


def test_keys_of_duck_typed_messages() -> None:
    from pydotcompute.ring_kernels.message import reply_key, request_key

    class Plain:
        def __init__(self, mid: Any = None, cid: Any = None) -> None:
            self.message_id = mid
            self.correlation_id = cid

    mid = uuid.uuid4()
    assert request_key(Plain(mid)) == mid.bytes
    assert reply_key(Plain(cid=mid)) == mid.bytes
    assert reply_key(object()) is None
    with pytest.raises(AttributeError):
        request_key(object())


def test_request_ids_are_recognisable_by_kernel_without_being_remembered() -> None:
    from pydotcompute.ring_kernels.message import (
        claim_request_key,
        in_request_space,
        next_request_id,
        request_key,
        request_space,
    )

    @message
    class Ask:
        x: int

    space = request_space("k")
    assert space == request_space("k")  # the same in every process: a hash of the id
    assert space != request_space("j")
    keys = {next_request_id(space) for _ in range(10_000)}
    assert len(keys) == 10_000
    for key in list(keys)[:50]:
        made = uuid.UUID(bytes=key)
        assert (made.version, made.variant) == (4, uuid.RFC_4122)
        assert in_request_space(key, space)
        assert not in_request_space(key, request_space("j"))
    # an id not made yet is made in the space; one made already (read, set) is kept
    fresh = Ask(x=1)
    key = claim_request_key(fresh, space)
    assert in_request_space(key, space)
    assert fresh.message_id.bytes == key
    read = Ask(x=2)
    known = read.message_id
    assert claim_request_key(read, space) == known.bytes == request_key(read)
    assert not in_request_space(known.bytes, space)
    assert not in_request_space(None, space)
    assert not in_request_space(uuid.uuid4().bytes, space)
    assert not in_request_space(key[:8], space)
