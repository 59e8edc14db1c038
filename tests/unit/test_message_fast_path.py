"""The compiled message fast paths (`fast_message`) against their Python twins.

Each test runs against whichever implementation is in use (the test-purepython step runs
them with the extension switched off); the `compiled` ones need the extension built.
"""

from __future__ import annotations

import multiprocessing
import uuid
from typing import Any

import msgspec
import numpy as np
import pytest

from pydotcompute import message
from pydotcompute.exceptions import MessageSerializationError
from pydotcompute.ring_kernels._native import message_extension
from pydotcompute.ring_kernels.message import RingKernelMessage, deserialize_message
from pydotcompute.ring_kernels.message.ids import ID_SOURCE, next_id_bytes

FAST = message_extension()
compiled = pytest.mark.skipif(FAST is None, reason="the fast_message extension is not built")


@message
class FPing:
    value: int


@message
class FAny:
    value: Any


@message
class FOuter:
    inner: FPing


def _is_v4(raw: bytes) -> bool:
    u = uuid.UUID(bytes=raw)
    return u.version == 4 and u.variant == uuid.RFC_4122


def test_ids_from_every_source_are_v4_and_never_repeat() -> None:
    seen: set[bytes] = set()
    for i in range(3000):
        m = FPing(value=i)
        if i % 3 == 0:
            raw = m.message_id.bytes  # read first: made as a UUID
        elif i % 3 == 1:
            raw = deserialize_message(m.serialize()).message_id.bytes  # made by serialize
        else:
            raw = next_id_bytes()
        assert _is_v4(raw)
        seen.add(raw)
    assert len(seen) == 3000


def test_serialize_keeps_the_id_it_made() -> None:
    m = FPing(value=1)
    data = m.serialize()
    assert m.serialize() == data
    assert deserialize_message(data).message_id == m.message_id


@pytest.mark.parametrize("bad", [-1, 256, 1 << 70, 3.0, True, "7", None])
def test_priority_out_of_range_or_not_an_int_raises(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"priority must be an int in 0\.\.255"):
        FPing(value=1, priority=bad)


@pytest.mark.parametrize("good", [0, 63, 128, 255])
def test_priority_in_range_builds(good: int) -> None:
    assert FPing(value=1, priority=good).priority == good


def test_check_and_serialize_refuse_what_is_not_a_message() -> None:
    with pytest.raises((TypeError, AttributeError)):
        RingKernelMessage.__post_init__(42)  # type: ignore[arg-type]
    with pytest.raises((TypeError, AttributeError)):
        RingKernelMessage.serialize(42)  # type: ignore[arg-type]


def test_reply_correlation_resolves_through_serialize() -> None:
    req = FPing(value=1)
    rep = req.reply(value=2)  # the slot holds the request until it is sent
    out = deserialize_message(rep.serialize())
    assert out.correlation_id == req.message_id


def test_nested_messages_get_their_ids_made() -> None:
    outer = FOuter(inner=FPing(value=3))
    back = deserialize_message(outer.serialize())
    assert back.inner.message_id == outer.inner.message_id


def test_an_unencodable_field_names_the_class() -> None:
    with pytest.raises(MessageSerializationError, match="FAny"):
        FAny(value=object()).serialize()


def test_arrays_round_trip() -> None:
    arr = np.arange(10, dtype=np.float32)
    back = deserialize_message(FAny(value=[1, 2]).serialize())
    assert back.value == [1, 2]

    @message
    class FArr:
        a: np.ndarray

    got = deserialize_message(FArr(a=arr).serialize())
    np.testing.assert_array_equal(got.a, arr)


def test_a_decoded_message_is_checked_too() -> None:
    data = msgspec.msgpack.encode([FPing.__struct_config__.tag, 1, None, 300, None])
    with pytest.raises(ValueError):
        deserialize_message(data)


def _child_ids(conn: Any) -> None:
    conn.send([next_id_bytes(), FPing(value=1).serialize()])
    conn.close()


def test_a_forked_child_makes_other_ids() -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    ctx = multiprocessing.get_context("fork")
    before = next_id_bytes()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child_ids, args=(child,))
    proc.start()
    raw, data = parent.recv()
    proc.join(10)
    sent = deserialize_message(FPing(value=1).serialize())
    mine = {before, next_id_bytes(), sent.message_id.bytes}
    theirs = {raw, deserialize_message(data).message_id.bytes}
    assert not mine & theirs


@compiled
def test_compiled_ids_follow_the_python_layout() -> None:
    # the compiled source is the Python base XOR its counter: reseeding both from one base
    # gives the same ids as the Python formula
    assert FAST is not None
    ID_SOURCE.reseed()
    base = ID_SOURCE.base
    first = next_id_bytes()
    assert first == (base ^ 1).to_bytes(16, "big")
    assert next_id_bytes() == (base ^ 2).to_bytes(16, "big")


@compiled
def test_bind_refuses_a_slot_of_another_class() -> None:
    assert FAST is not None

    class Other(msgspec.Struct):
        x: int

    with pytest.raises(TypeError, match="expected a slot"):
        FAST.bind(
            RingKernelMessage,
            Other.__dict__["x"],
            Other.__dict__["x"],
            Other.__dict__["x"],
            ValueError,
            print,
            uuid.UUID,
            {},
        )


@compiled
def test_the_compiled_functions_are_installed() -> None:
    assert FAST is not None
    assert RingKernelMessage.serialize is FAST.serialize
    assert RingKernelMessage.__post_init__ is FAST.check_priority
    assert isinstance(RingKernelMessage.__dict__["deserialize"], FAST.ClassDeserialize)


# --- output buffer and error handling ------------------------------------------------------


@message
class FBlob:
    data: bytes


def test_frames_small_and_large_in_any_order_match_the_plain_encoder() -> None:
    # small frames share one reused buffer and large ones do not: every frame must be the
    # bytes msgspec itself writes, whatever size came before it
    plain = msgspec.msgpack.Encoder(uuid_format="bytes")
    for n in (0, 10, 5000, 3, 70_000, 1024, 1100, 900, 2, 2000, 5):
        m = FBlob(data=bytes(range(256)) * (n // 256) + b"x" * (n % 256))
        frame = m.serialize()
        assert frame == plain.encode(m)
        assert deserialize_message(frame) == m


def test_threads_serializing_at_once_keep_their_frames_apart() -> None:
    # array fields run the encoder's Python hook, where another thread may take the GIL
    # and serialize in turn: no frame may carry another message's bytes
    import sys
    import threading

    @message
    class FMixed:
        tag: int
        a: np.ndarray

    errors: list[str] = []

    def work(k: int) -> None:
        try:
            for i in range(300):
                if i % 2:
                    a = np.full(i % 7 + 1, k, dtype=np.int64)
                    back = deserialize_message(FMixed(tag=k * 1000 + i, a=a).serialize())
                    same = back.tag == k * 1000 + i and np.array_equal(back.a, a)
                else:
                    m = FBlob(data=bytes([k]) * (i % 40 if i % 10 else 3000))
                    back = deserialize_message(m.serialize())
                    same = back == m
                if not same:
                    errors.append(f"thread {k}, message {i}: got {back!r}")
        except Exception as exc:  # reported by the assertion below, not lost in the thread
            errors.append(f"thread {k}: {exc!r}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []


class _FailingEncoder:
    """Stands in for a class's msgspec encoder: raises ``exc`` from both entry points."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    def encode(self, msg: Any) -> bytes:
        self.calls += 1
        raise self.exc

    def encode_into(self, msg: Any, buf: bytearray) -> None:
        self.calls += 1
        raise self.exc


@compiled
@pytest.mark.parametrize("small", [True, False])
def test_an_encoder_exception_takes_the_python_path_and_others_propagate(small: bool) -> None:
    from pydotcompute.ring_kernels.message.codec import DIRECT_ENCODERS

    assert FAST is not None

    @message
    class FEnc:
        value: int

    good = DIRECT_ENCODERS[FEnc]
    expected = FEnc(value=7)
    frame = expected.serialize()
    try:
        cases: list[tuple[BaseException, Any]] = [
            (ValueError("refused"), None),
            (KeyboardInterrupt(), KeyboardInterrupt),
        ]
        for exc, raised in cases:
            fake = _FailingEncoder(exc)
            if small:
                DIRECT_ENCODERS[FEnc] = fake.encode
            else:  # an encoder without encode_into: its frames are never buffered
                DIRECT_ENCODERS[FEnc] = lambda m, f=fake: f.encode(m)  # type: ignore[misc]
            FAST.registry_changed()
            if raised is None:  # the Python path encodes it (and would name a bad field)
                assert expected.serialize() == frame
            else:
                with pytest.raises(raised):
                    expected.serialize()
            assert fake.calls == 1
    finally:
        DIRECT_ENCODERS[FEnc] = good
        FAST.registry_changed()
    assert expected.serialize() == frame


@compiled
def test_a_stream_decoder_falls_back_on_an_exception_and_propagates_others() -> None:
    assert FAST is not None
    calls: list[str] = []
    raise_next: list[BaseException] = []

    def fast(data: Any) -> Any:
        calls.append("fast")
        raise raise_next[0]

    def general(data: Any) -> Any:
        calls.append("general")
        return deserialize_message(data)

    stream = FAST.StreamDecoder(general, lambda cls: fast)
    frame = FPing(value=3).serialize()
    assert stream.decode(frame).value == 3  # the first frame: the general path
    raise_next.append(ValueError("another class"))
    assert stream.decode(frame).value == 3
    assert calls == ["general", "fast", "general"]
    raise_next[0] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        stream.decode(frame)
    assert calls[-1] == "fast"


# --- Cls.deserialize: the class's own decoder first -----------------------------------------


@message
class FPingMore(FPing):
    extra: int = 0


def test_class_deserialize_takes_its_frames_and_refuses_or_reroutes_the_rest() -> None:
    from pydotcompute.exceptions import MessageDeserializationError

    ping, more = FPing(value=1, priority=9), FPingMore(value=2, extra=3)
    back = FPing.deserialize(ping.serialize())
    assert type(back) is FPing
    assert back == ping
    assert type(ping.deserialize(memoryview(ping.serialize()))) is FPing  # on an instance
    # a subclass's frame read through its base: the registry finds the subclass
    assert type(FPing.deserialize(more.serialize())) is FPingMore
    with pytest.raises(
        MessageDeserializationError, match="hold a FPing message, expected FPingMore"
    ):
        FPingMore.deserialize(ping.serialize())
    bad = msgspec.msgpack.encode([f"{__name__}.FPing", "one", b"\x01" * 16, 128, None])
    with pytest.raises(MessageDeserializationError, match=r"cannot decode FPing: .* at `value`"):
        FPing.deserialize(bad)
    with pytest.raises(MessageDeserializationError, match="expected bytes to deserialize"):
        FPing.deserialize("text")  # type: ignore[arg-type]

    class Undecorated(FPing):  # inherits the tag of FPing: never a class of its own frames
        pass

    with pytest.raises(MessageDeserializationError, match="expected Undecorated"):
        Undecorated.deserialize(ping.serialize())


def test_class_deserialize_of_a_by_reference_message_takes_its_arrays_once() -> None:
    from pydotcompute.exceptions import MessageDeserializationError
    from pydotcompute.ring_kernels.message import array_message

    @array_message
    class FRef:
        arr: np.ndarray

    frame = FRef(arr=np.arange(4)).serialize()
    np.testing.assert_array_equal(FRef.deserialize(frame).arr, np.arange(4))
    with pytest.raises(MessageDeserializationError):
        FRef.deserialize(frame)  # its array was taken out of the registry by the first


@compiled
def test_class_deserialize_falls_back_on_an_exception_and_propagates_others() -> None:
    from pydotcompute.ring_kernels.message.codec import DIRECT_DECODERS

    assert FAST is not None
    good = DIRECT_DECODERS[FPing]
    frame = FPing(value=5).serialize()
    calls: list[BaseException] = []

    def failing(data: Any) -> Any:
        calls.append(raise_next)
        raise raise_next

    try:
        DIRECT_DECODERS[FPing] = failing
        FAST.registry_changed()
        raise_next: BaseException = ValueError("refused")
        assert FPing.deserialize(frame).value == 5  # the Python path decoded it
        raise_next = KeyboardInterrupt()
        with pytest.raises(KeyboardInterrupt):
            FPing.deserialize(frame)
        assert len(calls) == 2
    finally:
        DIRECT_DECODERS[FPing] = good
        FAST.registry_changed()
    assert FPing.deserialize(frame).value == 5


# --- deserialize_message: the class found by its tag ------------------------------------------


def _named(qualname: str, fields: int = 1) -> type:
    """A message class of `fields` int fields under the qualified name `qualname`."""
    cls = type(qualname, (), {"__annotations__": {f"f{i}": int for i in range(fields)}})
    cls.__qualname__ = qualname
    return message(cls)


def test_frames_of_many_classes_in_any_order_decode_into_their_classes() -> None:
    from pydotcompute.exceptions import MessageDeserializationError

    # more classes than a table of tags could hold without sharing slots; tags of every
    # MessagePack string size (up to 31 bytes, up to 255, longer) and arrays of 16+ items
    classes = [_named(f"FMany.c{i}") for i in range(150)]
    classes += [_named("FLong" + "x" * 40), _named("FLonger" + "y" * 300), _named("FWide", 14)]
    frames = [
        (cls, cls(**{f: i for i, f in enumerate(cls.__struct_fields__[:-3])}).serialize())
        for cls in classes
    ]
    assert frames[-1][1][0] == 0xDC  # 18 items: the array header with a 16-bit count
    for round_ in range(3):
        for cls, frame in frames if round_ != 1 else reversed(frames):
            for data in (frame, bytearray(frame), memoryview(frame)):
                back = deserialize_message(data)
                assert type(back) is cls
    # a class met before, its frame then spoiled: the error names the field
    cls, frame = frames[0]
    bad = msgspec.msgpack.encode([cls.__struct_config__.tag, "x", b"\x01" * 16, 128, None])
    with pytest.raises(MessageDeserializationError, match=r"cannot decode FMany\.c0: .* at `f0`"):
        deserialize_message(bad)
    with pytest.raises(MessageDeserializationError, match=r"truncated|malformed|cannot decode"):
        deserialize_message(frame[:-1])


@compiled
def test_the_compiled_paths_check_they_were_handed_a_message_every_time() -> None:
    assert FAST is not None

    class NotAMessage(msgspec.Struct):
        x: int = 1
        y: int = 2
        z: int = 3

    for _ in range(2):  # after a message was handled too (the checks keep the last class)
        FPing(value=1).serialize()
        with pytest.raises(TypeError, match="expected a message, got NotAMessage"):
            FAST.check_priority(NotAMessage())
        with pytest.raises((TypeError, AttributeError)):  # refused, not read as a message
            FAST.serialize(NotAMessage())


def test_class_deserialize_pickles_and_decodes_where_it_lands() -> None:
    import pickle

    frame = FPing(value=4).serialize()
    for decode in (FPing.deserialize, FPing(value=1).deserialize):
        back = pickle.loads(pickle.dumps(decode))
        assert type(back(frame)) is FPing
        assert back(frame).value == 4


def test_a_stream_of_alternating_classes_decodes_each_into_its_class() -> None:
    from pydotcompute.exceptions import MessageDeserializationError
    from pydotcompute.ring_kernels.message import message_decoder

    stream = message_decoder()
    ping, more = FPing(value=1), FPingMore(value=2, extra=3)
    frames = [ping.serialize(), more.serialize(), FOuter(inner=ping).serialize()]
    bad = msgspec.msgpack.encode([f"{__name__}.FPing", "one", b"\x01" * 16, 128, None])
    for _ in range(3):
        for frame in frames:
            for data in (frame, bytearray(frame), memoryview(frame)):
                assert type(stream(data)) is type(deserialize_message(frame))
        with pytest.raises(MessageDeserializationError, match=r"cannot decode FPing: .* `value`"):
            stream(bad)  # the stream's own class, spoiled: the error names the field
        with pytest.raises(MessageDeserializationError):
            stream(frames[1][:-2])  # another class, cut short
        with pytest.raises(MessageDeserializationError, match="expected bytes"):
            stream("text")
