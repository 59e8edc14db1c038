"""The tier-1 hot paths take shortcuts; each must give what the general path gives.

Every shortcut here is checked against the code it stands in for: the per-queue decoder
against ``deserialize_message``, a class's generated ``serialize`` against its codec's
general ``encode``, the latency table against ``LatencyHistogram.record``, the one-pass
config check against the per-field validators, and the inline reply stamping against a
message class that forbids attribute writes.
"""

from __future__ import annotations

import enum
import random
import uuid
from typing import Any

import msgspec
import numpy as np
import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.decorators.validators import (
    check_block_size,
    check_grid_size,
    check_queue_size,
    validate_backpressure_strategy,
    validate_kernel_id,
    validate_restart,
)
from pydotcompute.decorators.validators import validate_config as fast_validate_config
from pydotcompute.exceptions import InvalidConfigurationError
from pydotcompute.ring_kernels.config import RingKernelConfig
from pydotcompute.ring_kernels.message import codec_of, deserialize_message, message_decoder
from pydotcompute.ring_kernels.message.codec import python_message_decoder
from pydotcompute.ring_kernels.telemetry import LatencyHistogram, RingKernelTelemetry


@message
class Sample:
    x: int
    label: str = "s"


@message
class Grid:
    cells: np.ndarray
    scale: float = 1.0


@message
class HandRolled:
    x: int

    def serialize(self) -> bytes:
        return b"hand-rolled"


@message
class HandRolledChild(HandRolled):
    y: int = 0


def _outcome(fn: Any, data: Any) -> tuple[Any, ...]:
    try:
        msg = fn(data)
    except Exception as exc:
        return ("error", type(exc), str(exc))
    fields = {f.name: getattr(msg, f.name) for f in msgspec.structs.fields(msg)}
    fields = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in fields.items()}
    return ("ok", type(msg), fields)


# --- decoding ----------------------------------------------------------------------------


# the decoder in use (compiled when built) and its Python twin
DECODERS = [
    pytest.param(message_decoder, id="in-use"),
    pytest.param(python_message_decoder, id="python"),
]


@pytest.mark.parametrize("make_decoder", DECODERS)
def test_queue_decoder_matches_deserialize_message_on_good_and_bad_bytes(
    make_decoder: Any,
) -> None:
    rng = random.Random(7)
    good = []
    for i in range(60):
        good.append(Sample(x=i, label="y" * (i % 5), priority=rng.randrange(256)).serialize())
        good.append(Grid(cells=np.arange(i % 4, dtype=np.int16)).serialize())
    bad = []
    for data in good:
        flipped = bytearray(data)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        bad += [bytes(flipped), data[: rng.randrange(len(data))], data + b"\x00"]
    stream = good + bad + [b"", b"\x92", b"\xdc\x00\x02", bytearray(good[0]), 12]
    rng.shuffle(stream)
    decode = make_decoder()
    for data in stream:
        assert _outcome(decode, data) == _outcome(deserialize_message, data), data


@pytest.mark.parametrize("make_decoder", DECODERS)
def test_queue_decoder_follows_a_class_registered_again_under_the_same_name(
    make_decoder: Any,
) -> None:
    namespace: dict[str, Any] = {"message": message, "__name__": "tier1_fast_paths_again"}
    # compiled on its own: this module's ``from __future__ import annotations`` stays out
    source = compile("@message\nclass Again:\n    x: int\n", "<again>", "exec", dont_inherit=True)
    exec(source, namespace)
    first = namespace["Again"]
    data = first(x=1).serialize()
    decode = make_decoder()
    assert type(decode(data)) is first
    assert type(decode(data)) is first  # the cached path
    exec(source, namespace)  # same qualified name: the registry now maps to the new class
    assert namespace["Again"] is not first
    assert type(decode(data)) is namespace["Again"]


# --- encoding ----------------------------------------------------------------------------


def test_serialize_writes_what_the_class_codec_writes() -> None:
    request = Sample(x=1)
    seen = Sample(x=2)
    _ = seen.message_id  # an id made as a UUID
    for msg in (
        Sample(x=5),
        Sample(x=5, message_id=uuid.uuid4(), correlation_id=uuid.uuid4()),
        Sample(x=5, correlation_id=request),  # stamped with a request (no id made yet)
        Sample(x=5, correlation_id=seen),
        Grid(cells=np.ones((2, 3)), correlation_id=request),
    ):
        data = msg.serialize()
        assert data == codec_of(type(msg)).encode(msg)  # ids are fixed by now
        back = deserialize_message(data)
        assert (back.message_id, back.correlation_id) == (msg.message_id, msg.correlation_id)
    assert request.message_id == Sample(x=0, correlation_id=request).correlation_id


def test_a_serialize_the_class_defines_stays() -> None:
    assert HandRolled(x=1).serialize() == b"hand-rolled"
    assert HandRolledChild(x=1).serialize() == b"hand-rolled"


# --- telemetry ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        list(range(-3, 300)),
        [127, 128, 129, 4095, 4096, 65535, 65536, 65537, 2**40, 2**70],
        [random.Random(3).randrange(1 << 24) for _ in range(3000)],
    ],
    ids=["small", "edges", "random"],
)
def test_record_latency_bins_like_the_histogram(values: list[int]) -> None:
    tel = RingKernelTelemetry("k")
    ref = LatencyHistogram()
    for v in values:
        tel.record_latency(v)
        ref.record(v)
    assert tel.histogram._buckets == ref._buckets
    assert tel.histogram.count == ref.count == len(values)
    assert (tel.min_latency_ns, tel.max_latency_ns) == (min(values), max(values))
    assert tel.total_latency_ns == sum(values)


# --- config validation -------------------------------------------------------------------


class _Two(enum.IntEnum):
    TWO = 2


def _per_field(config: RingKernelConfig) -> None:
    validate_kernel_id(config.kernel_id)
    check_grid_size(config.grid_size)
    check_block_size(config.block_size)
    check_queue_size(config.input_queue_size, "input_queue_size")
    check_queue_size(config.output_queue_size, "output_queue_size")
    validate_backpressure_strategy(config.backpressure_strategy)
    validate_restart(config.restart, config.max_restarts)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"grid_size": _Two.TWO, "block_size": 1024, "input_queue_size": 1 << 24},
        {"backpressure_strategy": "DROP_OLDEST", "restart": "on_failure", "max_restarts": 0},
        {"grid_size": True},
        {"block_size": 1025},
        {"input_queue_size": 0},
        {"output_queue_size": 2.0},
        {"backpressure_strategy": "sometimes"},
        {"backpressure_strategy": ["block"]},
        {"restart": "always"},
        {"max_restarts": -1},
        {"kernel_id": "  "},
    ],
)
def test_one_pass_config_check_agrees_with_the_field_validators(changes: dict[str, Any]) -> None:
    config = RingKernelConfig(kernel_id="k")
    for name, value in changes.items():  # assigned: a config checks itself when made
        setattr(config, name, value)

    def outcome(check: Any) -> tuple[Any, ...]:
        try:
            check(config)
        except InvalidConfigurationError as exc:
            return ("error", str(exc))
        return ("ok",)

    assert outcome(fast_validate_config) == outcome(_per_field)


# --- reply stamping ----------------------------------------------------------------------


SETATTR_CALLS: list[str] = []


@message
class Watched:
    """A reply class with its own ``__setattr__``: stamping must not go through it."""

    x: int

    def __setattr__(self, name: str, value: Any) -> None:
        SETATTR_CALLS.append(name)
        object.__setattr__(self, name, value)


@message
class Ask:
    x: int


async def _replier(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Watched(x=msg.x) if msg.x % 2 else Sample(x=msg.x))


async def test_replies_are_stamped_through_the_slot_whatever_the_class() -> None:
    Watched(x=0)
    writes_to_build_one = len(SETATTR_CALLS)
    async with RingKernelRuntime() as rt:
        await rt.launch("r", _replier, input_type=Ask)
        await rt.activate("r")
        for i in range(6):  # both reply classes, each taking the short path after the first
            ask = Ask(x=i)
            SETATTR_CALLS.clear()
            reply = await rt.send_and_receive("r", ask, timeout=5)
            assert reply.correlation_id == ask.message_id
            assert type(reply) is (Watched if i % 2 else Sample)
            assert len(SETATTR_CALLS) == (writes_to_build_one if i % 2 else 0)


async def test_undelivered_is_one_list_made_on_demand() -> None:
    async with RingKernelRuntime() as rt:
        kernel = await rt.launch("idle", _replier, input_type=Ask)
        left = kernel.undelivered
        assert left == []
        assert kernel.undelivered is left
        await rt.send("idle", Ask(x=1))
        returned = await rt.terminate("idle")
        assert len(returned) == 1
        assert kernel.undelivered is left
        assert left == returned
