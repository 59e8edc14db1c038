"""Message costs against a bare ``msgspec.Struct`` with the same fields, measured in the same run.

What it measures (best of several repeats, nanoseconds per operation):

- construction: ``Ping(value=i)`` (a one-field ``@message``) against ``BarePing(value=i)``, a
  ``msgspec.Struct`` with the same field, and against ``BarePingHeader``, the same Struct
  with the three header fields added (defaults, no checks), and against ``BarePingNoGC``,
  the bare Struct made with ``gc=False`` as ``@message`` makes a class of scalar fields
  (the like-for-like reference: the target is set against the default Struct);
- build + encode: ``Ping(value=i).serialize()`` (its id is made on the way) against the
  bare Struct through a ``msgspec.msgpack.Encoder``;
- decode: ``deserialize_message(data)`` (dispatch on the type tag) and a stream decoder
  (``message_decoder()``, what queues and process rings use) against a typed
  ``msgspec.msgpack.Decoder(BarePing)``;
- build + encode + decode, the per-message cost of a serialized hop, against the same for
  the bare Struct;
- the codec alone, ``Ping.deserialize(m.serialize())`` of a message already built, against
  ``LikePing``: a Struct carrying the same information (the same type tag, array-like, the
  16-byte id, the priority and the correlation slot, ``gc=False``) through a typed encoder
  and decoder, with no checks (the like-for-like reference; target: 1.5x);
- an array payload (1 MiB of float32) serialized and decoded, in GB/s.

Ratios are ours / bare (lower is better; GB/s: ours / bare, higher is better). Run
``python benchmarks/message_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec
import numpy as np
from _common import print_table, save_json
from _suite import summary_row

from pydotcompute import message
from pydotcompute.ring_kernels import deserialize_message
from pydotcompute.ring_kernels.message import message_decoder


@message
class Ping:
    value: int


@message
class Blob:
    payload: np.ndarray


class BarePing(msgspec.Struct):
    value: int


class BarePingNoGC(msgspec.Struct, gc=False):
    value: int


class BarePingHeader(msgspec.Struct):
    """The same field plus the header's three fields with their defaults."""

    value: int
    message_id: Any = None
    priority: int = 128
    correlation_id: Any = None


#: What a `Ping` frame carries, as a plain Struct: the same tag, fields and header slots.
LikePing: Any = msgspec.defstruct(
    "LikePing",
    [
        ("value", int, 0),
        ("message_id", bytes | None, None),
        ("priority", int, 128),
        ("correlation_id", bytes | None, None),
    ],
    array_like=True,
    kw_only=True,
    gc=False,
    tag=Ping.__struct_config__.tag,  # type: ignore[attr-defined]
)


class BareBlob(msgspec.Struct):
    payload: np.ndarray


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return msgspec.msgpack.Ext(1, obj.tobytes())
    raise TypeError(type(obj).__name__)


def _ext_hook(code: int, data: memoryview) -> Any:
    return np.frombuffer(data, dtype=np.float32)


def _dec_hook(tp: Any, obj: Any) -> Any:
    return obj


#: the summary row of the codec alone against the like-for-like Struct (the target's row)
CODEC_METRIC = "codec: deserialize(serialize()), one field"


def _per_op_ns(stmt: str, env: dict[str, Any], number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=repeat)) / number * 1e9


def run(quick: bool) -> dict[str, Any]:
    number = 20_000 if quick else 200_000
    repeat = 5 if quick else 9
    enc = msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(BarePing)
    stream = message_decoder()
    data = Ping(value=7).serialize()
    bare_data = enc.encode(BarePing(value=7))
    stream(data)  # warm the stream decoder on this class
    built = Ping(value=7)
    like_dec = msgspec.msgpack.Decoder(LikePing)
    # its id made by serializing (not read: that stores a UUID); the Struct gets the same
    like = like_dec.decode(built.serialize())
    assert enc.encode(like) == built.serialize()  # byte for byte the same frame
    env: dict[str, Any] = {
        "Ping": Ping,
        "BarePing": BarePing,
        "BarePingHeader": BarePingHeader,
        "BarePingNoGC": BarePingNoGC,
        "enc": enc.encode,
        "dec": dec.decode,
        "des": deserialize_message,
        "stream": stream,
        "data": data,
        "bare_data": bare_data,
        "built": built,
        "like": like,
        "like_dec": like_dec.decode,
    }
    pairs = [
        ("construction", "Ping(value=7)", "BarePing(value=7)"),
        ("construction vs Struct + header", "Ping(value=7)", "BarePingHeader(value=7)"),
        ("construction vs Struct(gc=False)", "Ping(value=7)", "BarePingNoGC(value=7)"),
        ("build + encode", "Ping(value=7).serialize()", "enc(BarePing(value=7))"),
        ("decode, deserialize_message", "des(data)", "dec(bare_data)"),
        ("decode, stream decoder", "stream(data)", "dec(bare_data)"),
        (
            "build + encode + decode",
            "stream(Ping(value=7).serialize())",
            "dec(enc(BarePing(value=7)))",
        ),
        (
            "codec, Ping.deserialize(m.serialize())",
            "Ping.deserialize(built.serialize())",
            "like_dec(enc(like))",
        ),
    ]
    rows: list[dict[str, Any]] = []
    for what, ours_stmt, bare_stmt in pairs:
        # interleaved, one repeat of each in turn, so both sides see the same machine
        ours = bare = float("inf")
        for _ in range(repeat):
            ours = min(ours, _per_op_ns(ours_stmt, env, number, 1))
            bare = min(bare, _per_op_ns(bare_stmt, env, number, 1))
        rows.append({"what": what, "ours_ns": ours, "bare_ns": bare, "ratio": ours / bare})
    arr = np.ones(1 << 18, dtype=np.float32)  # 1 MiB
    blob = Blob(payload=arr)
    bare_blob = BareBlob(payload=arr)
    benc = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
    bdec = msgspec.msgpack.Decoder(BareBlob, ext_hook=_ext_hook, dec_hook=_dec_hook)
    n_arr = 200 if quick else 2000

    def ours_arr() -> None:
        deserialize_message(blob.serialize())

    def bare_arr() -> None:
        bdec.decode(benc.encode(bare_blob))

    t0 = time.perf_counter()
    for _ in range(n_arr):
        ours_arr()
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_arr):
        bare_arr()
    bare_s = time.perf_counter() - t0
    gb = arr.nbytes * n_arr / 1e9
    rows.append(
        {
            "what": "1 MiB array encode+decode, GB/s",
            "ours_ns": gb / ours_s,
            "bare_ns": gb / bare_s,
            "ratio": bare_s / ours_s,
        }
    )
    by_name = {r["what"]: r for r in rows}
    summary = [
        summary_row(
            "construction, one field",
            by_name["construction"]["ours_ns"],
            "ns",
            higher_is_better=False,
            baseline=by_name["construction"]["bare_ns"],
            baseline_name="msgspec.Struct",
            target="ratio <= 1.5",
        ),
        summary_row(
            "build + encode + decode, one field",
            by_name["build + encode + decode"]["ours_ns"],
            "ns",
            higher_is_better=False,
            baseline=by_name["build + encode + decode"]["bare_ns"],
            baseline_name="msgspec.Struct",
        ),
        summary_row(
            CODEC_METRIC,
            by_name["codec, Ping.deserialize(m.serialize())"]["ours_ns"],
            "ns",
            higher_is_better=False,
            baseline=by_name["codec, Ping.deserialize(m.serialize())"]["bare_ns"],
            baseline_name="like-for-like msgspec.Struct",
            target="ratio <= 1.5",
        ),
        summary_row(
            "1 MiB array encode+decode",
            rows[-1]["ours_ns"],
            "GB/s",
            higher_is_better=True,
            baseline=rows[-1]["bare_ns"],
            baseline_name="msgspec.Struct + Ext",
            target=">= 1 GB/s",
        ),
    ]
    return {"rows": rows, "summary": summary, "number": number, "repeat": repeat}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (seconds)")
    ap.add_argument("--json", default=None, help="where to save the JSON results")
    args = ap.parse_args(argv)
    results = run(args.quick)
    print_table(
        "Messages against a bare msgspec.Struct (ns per operation; last row GB/s)",
        results["rows"],
        ["what", "ours_ns", "bare_ns", "ratio"],
    )
    save_json("message", results, args.json)
    return results


if __name__ == "__main__":
    main()
