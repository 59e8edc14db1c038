"""Message forms and rules: `@message` on `@dataclass`, subclasses, by-reference arrays opted
into, priority through replies, field paths in decode errors, the wrong-field-type rule."""

from __future__ import annotations

import dataclasses
import pickle
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgpack
import msgspec
import numpy as np
import pytest

from pydotcompute.exceptions import (
    MessageDeserializationError,
    MessageSerializationError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.message import (
    ArrayMessage,
    BufferRegistry,
    RingKernelMessage,
    array_message,
    deserialize_message,
    frame_header,
    get_buffer_registry,
    message,
    message_decoder,
    message_field_names,
    register_buffer,
    release_buffer,
)

# --- @message stacked on @dataclass (the 0.2 idiom) --------------------------------------


@message
@dataclass
class Plain02:
    name: str
    tags: list[str] = field(default_factory=list)
    weight: float = 1.0

    def describe(self) -> str:
        return f"{self.name}:{len(self.tags)}"


@message
@dataclass
class HandHeader02:
    value: int
    label: str = "x"
    extras: dict[str, int] = field(default_factory=dict)
    message_id: uuid.UUID = field(default_factory=uuid.uuid4)
    priority: int = 128
    correlation_id: uuid.UUID | None = None


def test_message_on_dataclass_defines_a_working_message() -> None:
    a = Plain02("a")
    b = Plain02("b")
    assert isinstance(a, RingKernelMessage)
    assert isinstance(a, msgspec.Struct)
    assert a.tags == []
    assert a.tags is not b.tags
    assert a.describe() == "a:0"  # methods survive
    assert message_field_names(Plain02) == ("name", "tags", "weight")
    back = Plain02.deserialize(Plain02("c", ["t"], 2.0, priority=9).serialize())
    assert (back.name, back.tags, back.weight, back.priority) == ("c", ["t"], 2.0, 9)


def test_message_on_dataclass_with_hand_written_header_fields() -> None:
    m = HandHeader02(3)
    assert message_field_names(HandHeader02) == ("value", "label", "extras")
    assert isinstance(m.message_id, uuid.UUID)
    assert m.priority == 128
    assert m.correlation_id is None
    assert m.extras == {}
    assert m.extras is not HandHeader02(4).extras
    assert HandHeader02(1).message_id != HandHeader02(1).message_id
    req = HandHeader02(1, priority=200)
    rep = req.reply(value=2)
    assert rep.correlation_id == req.message_id
    assert rep.priority == 200
    back = deserialize_message(rep.serialize())
    assert back == rep
    with pytest.raises(ValueError, match=r"priority must be an int in 0\.\.255"):
        HandHeader02(1, priority=256)


def test_dataclass_helpers_have_msgspec_equivalents() -> None:
    m = Plain02("a", ["x"])
    assert not dataclasses.is_dataclass(m)
    copy = msgspec.structs.replace(m, name="b")
    assert (copy.name, copy.tags) == ("b", ["x"])
    assert msgspec.structs.asdict(m)["tags"] == ["x"]
    assert [f.name for f in msgspec.structs.fields(Plain02)][:3] == ["name", "tags", "weight"]


# --- subclasses --------------------------------------------------------------------------


@message
class Base1:
    a: int


@message
class Child1(Base1):
    b: str = "b"

    def both(self) -> str:
        return f"{self.a}{self.b}"


@message
class Grandchild1(Child1):
    c: list[float] = msgspec.field(default_factory=list)

    def both(self) -> str:
        return super().both() + "!"  # zero-argument super() reaches the class made here


@pytest.mark.parametrize(
    "msg",
    [Base1(1), Child1(2, "x"), Grandchild1(3, "y", [1.5]), Grandchild1(4, priority=7)],
    ids=["base", "child", "grandchild", "grandchild-defaults"],
)
def test_subclass_round_trips_keep_the_class_and_every_field(msg: Base1) -> None:
    for decode in (deserialize_message, message_decoder(), type(msg).deserialize):
        back = decode(msg.serialize())
        assert type(back) is type(msg)
        assert back == msg
        assert back.message_id == msg.message_id
    assert isinstance(msg, Base1)


def test_subclass_methods_and_super() -> None:
    g = Grandchild1(1, "z")
    assert g.both() == "1z!"
    assert isinstance(g, Child1)
    assert Base1.deserialize(g.serialize()) == g  # a subclass is a Base1


def test_undecorated_subclass_cannot_be_serialized_with_its_parent_tag() -> None:
    class Loose(Base1):  # a Struct subclass that skipped @message
        extra: int = 0

    with pytest.raises(TypeValidationError, match=r"Loose is not a @message class.*@message"):
        Loose(1).serialize()


# --- by-reference arrays: opt-in, unguessable ids ---------------------------------------


@message
class AnyPayload:
    payload: Any


@array_message
class Pixels:
    data: np.ndarray


def _frame(cls: type, *fields: Any) -> bytes:
    return msgpack.packb([f"{cls.__module__}.{cls.__qualname__}", *fields, None, 128, None])


def test_a_plain_message_refuses_a_by_reference_array() -> None:
    secret = np.arange(4)
    handle = register_buffer(secret)
    try:
        ref = msgpack.ExtType(2, handle.buffer_id.to_bytes(16, "big"))
        with pytest.raises(MessageDeserializationError, match="only ArrayMessage"):
            deserialize_message(_frame(AnyPayload, ref))
        with pytest.raises(MessageDeserializationError, match="only ArrayMessage"):
            message_decoder()(_frame(AnyPayload, ref))
        assert get_buffer_registry().refcount(handle) == 1  # nothing was taken
    finally:
        release_buffer(handle)


def test_buffer_ids_are_unguessable() -> None:
    reg = BufferRegistry()
    ids = [reg.register(np.zeros(1)).buffer_id for _ in range(64)]
    assert len(set(ids)) == 64
    assert all(0 < i < 2**128 for i in ids)
    assert min(ids) > 2**64  # not a small counter (a miss here is a 2**-64 chance per id)
    assert sorted(ids) != ids or sorted(ids, reverse=True) != ids  # not in counting order
    other = BufferRegistry()
    assert other.register(np.zeros(1)).buffer_id not in ids  # another key, other ids


def test_a_guessed_reference_is_refused_by_an_array_message() -> None:
    for guess in (1, 2, 3):
        data = _frame(Pixels, msgpack.ExtType(2, guess.to_bytes(16, "big")))
        with pytest.raises(MessageDeserializationError, match="no buffer with id"):
            deserialize_message(data)


def test_an_array_message_takes_its_array_back() -> None:
    arr = np.ones(8)
    back = Pixels.deserialize(Pixels(arr).serialize())
    assert back.data is arr
    assert isinstance(back, ArrayMessage)


# --- priority through a pipeline ---------------------------------------------------------


def test_reply_inherits_the_request_priority_unless_given() -> None:
    req = Base1(1, priority=230)
    assert req.reply(a=2).priority == 230
    assert req.reply(Child1, a=2).priority == 230
    assert req.reply(a=2, priority=5).priority == 5
    built = Child1(3, priority=40)
    assert req.reply(built).priority == 40  # a message passed in keeps its own


# --- errors name the field path ----------------------------------------------------------


@message
class Outer:
    inner: Child1
    items: list[Base1]


def test_decode_errors_name_the_field_path() -> None:
    child = [f"{__name__}.Child1", 1, 2, None, 128, None]  # b must be a str
    data = _frame(Outer, child, [])
    with pytest.raises(MessageDeserializationError, match=r"cannot decode Outer: .*`inner\.b`"):
        deserialize_message(data)
    item = [f"{__name__}.Base1", "no", None, 128, None]
    data = _frame(Outer, [f"{__name__}.Child1", 1, "b", None, 128, None], [item])
    with pytest.raises(MessageDeserializationError, match=r"`items\[0\]\.a`"):
        deserialize_message(data)


def test_nested_message_ids_travel() -> None:
    o = Outer(Child1(1), [Base1(2), Base1(3)])
    back = Outer.deserialize(o.serialize())
    assert back.inner.message_id == o.inner.message_id
    assert [b.message_id for b in back.items] == [b.message_id for b in o.items]


# --- the wrong-field-type rule -----------------------------------------------------------


def test_in_process_objects_pass_as_they_are_and_decoding_checks_types() -> None:
    wrong = Base1("not an int")  # type: ignore[arg-type]
    assert wrong.a == "not an int"  # construction does not check field types
    with pytest.raises(MessageDeserializationError, match=r"Expected `int`, got `str` - at `a`"):
        deserialize_message(wrong.serialize())  # every hop that decodes bytes does


def test_repr_and_equality_read_ids_as_uuids() -> None:
    m = Base1(1)
    m.serialize()  # the id is now made, stored as wire bytes
    assert f"message_id={m.message_id!r}" in repr(m)
    assert deserialize_message(m.serialize()) == m
    assert Base1(1) != Base1(1)  # two messages: two ids


# --- fixed-layout records: the GPU rings' host side checks field types -------------------


@message
class Tick:
    seq: int
    value: np.float32
    window: Annotated[np.ndarray, (3,), np.float32]
    small: Annotated[int, np.int16] = 0


def _tick(**kw: Any) -> Tick:
    fields: dict[str, Any] = {"seq": 1, "value": np.float32(0.5), "window": np.zeros(3, np.float32)}
    fields.update(kw)
    return Tick(**fields)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"seq": 1.5}, r"Tick #1: field `seq` .*float64.* int64"),
        ({"seq": "7"}, r"Tick #1: field `seq`"),
        ({"value": "x"}, r"Tick #1: field `value`"),
        ({"window": np.zeros(4, np.float32)}, r"Tick #1: field `window` .*shape \(4,\).*\(3,\)"),
        ({"small": 70_000}, r"Tick #1: field `small` .*70000.* int16"),
    ],
    ids=["float-in-int", "str-in-int", "str-in-float32", "wrong-shape", "out-of-range"],
)
def test_to_records_refuses_a_field_of_the_wrong_type(bad: dict[str, Any], why: str) -> None:
    with pytest.raises(MessageSerializationError, match=why):
        Tick.to_records([_tick(), _tick(**bad)])


def test_to_records_accepts_what_converts_without_loss() -> None:
    msgs = [_tick(seq=np.int32(3), value=1, small=-5), _tick(value=2.5, window=[1, 2, 3])]
    records = Tick.to_records(msgs)
    assert records["seq"].tolist() == [3, 1]
    assert records["value"].tolist() == [1.0, 2.5]
    assert records["window"][1].tolist() == [1.0, 2.0, 3.0]
    back = Tick.from_records(records)
    assert [b.message_id for b in back] == [m.message_id for m in msgs]
    assert back[0].small == -5


def test_a_pickled_message_keeps_its_id_and_fields() -> None:
    req = Base1(1)
    rep = req.reply(Child1, a=2, b="z", priority=9)
    back = pickle.loads(pickle.dumps(rep))
    assert back == rep
    assert back.correlation_id == req.message_id
    assert (back.a, back.b, back.priority) == (2, "z", 9)


def test_frame_header_reads_the_header_of_a_frame_whose_fields_do_not_decode() -> None:
    req = Base1(1)
    bad = Child1("not an int", priority=201, correlation_id=req.message_id)  # type: ignore[arg-type]
    data = bad.serialize()
    with pytest.raises(MessageDeserializationError, match="at `a`"):
        deserialize_message(data)
    head = frame_header(data)
    assert head.message_type is Child1
    assert head.message_id == bad.message_id
    assert head.priority == 201
    assert head.correlation_id == req.message_id
    with pytest.raises(MessageDeserializationError, match="not a pydotcompute message"):
        frame_header(b"junk")
