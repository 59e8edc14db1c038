"""FastSPSCQueue and SharedByteRing, on the extension and on its pure-Python twin.

Both implementations are tested in every run (the extension when it is built); the suite
also runs once more with ``PYDOTCOMPUTE_PUREPYTHON=1``, which changes what
``pydotcompute.ring_kernels._native`` exports.
"""

from __future__ import annotations

import hashlib
import importlib
import multiprocessing
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydotcompute.exceptions import (
    InvalidConfigurationError,
    QueueClosedError,
    QueueError,
    RingCorruptedError,
)
from pydotcompute.ring_kernels import _native as _cython
from pydotcompute.ring_kernels._native import spsc_py as _spsc_py


def _extension() -> Any:
    try:
        return importlib.import_module("pydotcompute.ring_kernels._native.fast_spsc")
    except ImportError:
        return None


EXT = _extension()
IMPLS = [pytest.param(_spsc_py, id="python")]
if EXT is not None:
    IMPLS.append(pytest.param(EXT, id="cython"))
else:  # keep the id visible in the report
    IMPLS.append(pytest.param(None, id="cython", marks=pytest.mark.skip("extension not built")))


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture
def ring_pair(impl: Any) -> Any:
    """(writer, reader) over one fresh segment; both closed and unlinked afterwards."""
    writer = impl.SharedByteRing(256)
    reader = impl.SharedByteRing.attach(writer.name)
    yield writer, reader
    reader.close()
    writer.close()
    writer.unlink()


def _shm_names() -> set[str]:
    """This process's segments (``/dev/shm`` is the machine's: other test processes, the
    suite's other workers among them, create and unlink theirs meanwhile)."""
    mine = f"pdc_{os.getpid()}_"
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(mine)}
    except OSError:
        return set()


# --- selection ------------------------------------------------------------------------------


def test_selection_follows_the_environment() -> None:
    forced = os.environ.get("PYDOTCOMPUTE_PUREPYTHON", "") not in ("", "0")
    assert _cython.is_cython_available() is _cython.CYTHON_AVAILABLE
    if forced or EXT is None:
        assert not _cython.CYTHON_AVAILABLE
        assert _cython.FastSPSCQueue is _spsc_py.FastSPSCQueue
        assert _cython.extension_import_error()
    else:
        assert _cython.CYTHON_AVAILABLE
        assert _cython.FastSPSCQueue is EXT.FastSPSCQueue
        assert _cython.SharedByteRing is EXT.SharedByteRing
        assert _cython.extension_import_error() is None


def test_purepython_env_forces_the_twin() -> None:
    code = (
        "import pydotcompute.ring_kernels._native as c;"
        "print(c.CYTHON_AVAILABLE, c.IMPLEMENTATION, c.SharedByteRing.implementation)"
    )
    env = {**os.environ, "PYDOTCOMPUTE_PUREPYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "python", "python"]


# --- FastSPSCQueue --------------------------------------------------------------------------


def test_fast_queue_fifo_and_bounds(impl: Any) -> None:
    q = impl.FastSPSCQueue(3)
    assert q.capacity == 3
    assert q.empty
    assert len(q) == 0
    assert q.get() is None
    assert [q.put(i) for i in range(4)] == [True, True, True, False]
    assert q.full
    assert q.qsize() == 3
    assert [q.get() for _ in range(4)] == [0, 1, 2, None]


def test_fast_queue_batches_and_clear(impl: Any) -> None:
    q = impl.FastSPSCQueue(5)
    assert q.put_batch(range(10)) == 5
    assert q.get_batch(2) == [0, 1]
    assert q.clear() == 3
    assert q.empty


def test_fast_queue_refuses_none_and_bad_capacity(impl: Any) -> None:
    q = impl.FastSPSCQueue(2)
    with pytest.raises(TypeError, match="cannot hold None"):
        q.put(None)
    for bad in (0, -3, 2.5):
        with pytest.raises(InvalidConfigurationError, match="capacity must be an int >= 1"):
            impl.FastSPSCQueue(bad)


def test_fast_queue_releases_references(impl: Any) -> None:
    import gc
    import weakref

    class Box:
        pass

    q = impl.FastSPSCQueue(4)
    b = Box()
    ref = weakref.ref(b)
    q.put(b)
    del b
    assert ref() is not None  # the queue holds it
    got = q.get()
    assert got is ref()
    del got
    gc.collect()
    assert ref() is None
    q.put(Box())
    del q  # dropping a queue with items must free them too
    gc.collect()


def test_fast_queue_two_threads(impl: Any) -> None:
    import time

    q = impl.FastSPSCQueue(64)
    n = 20_000
    got: list[int] = []

    def consume() -> None:
        while len(got) < n:
            item = q.get()
            if item is None:
                time.sleep(0)  # let the producer have the GIL
            else:
                got.append(item)

    t = threading.Thread(target=consume, name="test-consumer")
    t.start()
    i = 0
    while i < n:
        if q.put(i):
            i += 1
        else:
            time.sleep(0)
    t.join(30)
    assert got == list(range(n))


# --- SharedByteRing basics ------------------------------------------------------------------


def test_ring_roundtrip(ring_pair: Any) -> None:
    w, r = ring_pair
    assert r.try_read() is None
    assert w.try_write(b"hello") == 1
    assert w.try_write(bytearray(b"")) == 1  # empty records are records too
    assert w.try_write(memoryview(b"world")) == 1
    assert len(r) == 3
    assert [r.try_read(), r.try_read(), r.try_read(), r.try_read()] == [
        b"hello",
        b"",
        b"world",
        None,
    ]
    assert r.stats()["records_read"] == 3


def test_ring_capacity_error_names_sizes(ring_pair: Any) -> None:
    w, _ = ring_pair
    assert w.capacity == 256
    assert w.max_record_size == 248
    with pytest.raises(
        InvalidConfigurationError,
        match=r"a record of 249 bytes can never fit shared ring .* of 256 bytes "
        r"\(largest record: 248 bytes\)",
    ):
        w.try_write(b"x" * 249)
    assert w.try_write(b"y" * 248) == 1  # the largest record fits an empty ring


def test_ring_full_then_space(ring_pair: Any) -> None:
    w, r = ring_pair
    n = 0
    while w.try_write(b"z" * 20):  # 8 + 24 bytes each
        n += 1
    assert n == 8
    assert not w.writable(20)
    assert r.try_read() == b"z" * 20
    assert w.writable(20)
    assert w.try_write(b"z" * 20) == 1


def test_ring_wraps_around_with_split_payloads(ring_pair: Any) -> None:
    w, r = ring_pair
    for i in range(2000):
        data = struct.pack("<I", i) * (1 + i % 13)  # 4..52 bytes: offsets drift, payloads split
        assert w.try_write(data), i
        assert r.try_read() == data
    assert w.stats()["records_written"] == 2000


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 200), min_size=1, max_size=60), seed=st.integers(0, 10**6))
def test_ring_matches_a_fifo_model(sizes: list[int], seed: int) -> None:
    impls = [_spsc_py] + ([EXT] if EXT is not None else [])
    for mod in impls:
        w = mod.SharedByteRing(256)
        r = mod.SharedByteRing.attach(w.name)
        try:
            model: list[bytes] = []
            for k, size in enumerate(sizes):
                data = bytes((seed + k + j) % 251 for j in range(size))
                if w.try_write(data):
                    model.append(data)
                elif model:
                    assert r.try_read() == model.pop(0)
                if (seed >> (k % 16)) & 1 and model:
                    assert r.try_read() == model.pop(0)
            while model:
                assert r.try_read() == model.pop(0)
            assert r.try_read() is None
        finally:
            r.close()
            w.close()
            w.unlink()


def test_ring_max_records(impl: Any) -> None:
    w = impl.SharedByteRing(4096, max_records=2)
    r = impl.SharedByteRing.attach(w.name)
    try:
        assert r.max_records == 2
        assert w.try_write(b"a")
        assert w.try_write(b"b")
        assert w.try_write(b"c") == 0
        assert r.try_read() == b"a"
        assert w.try_write(b"c") == 1
    finally:
        r.close()
        w.close()
        w.unlink()


def test_ring_parking_flags_and_wake_code(ring_pair: Any) -> None:
    w, r = ring_pair
    assert not w.reader_waiting
    r.set_reader_waiting(True)
    assert w.reader_waiting
    assert w.try_write(b"x") == 2  # written, and the reader is parked: ring its bell
    r.set_reader_waiting(False)
    assert w.try_write(b"y") == 1
    w.set_writer_waiting(True)
    assert r.writer_waiting
    w.set_writer_waiting(False)
    assert not r.writer_waiting


def test_a_read_rings_the_doorbell_of_a_parked_writer(ring_pair: Any) -> None:
    w, r = ring_pair
    bell_r, bell_w = os.pipe()
    os.set_blocking(bell_r, False)
    try:
        for rec in (b"a", b"b", b"c", b"d"):
            w.try_write(rec)
        assert r.spin_read(0, bell_w) == b"a"  # the writer is not parked: no byte
        with pytest.raises(BlockingIOError):
            os.read(bell_r, 16)
        w.set_writer_waiting(True)
        assert r.spin_read(0, bell_w) == b"b"  # it is parked: one byte on its doorbell
        assert os.read(bell_r, 16) == b"\x00"
        assert r.spin_read(1.0, bell_w) == b"c"  # the same after a spin
        assert os.read(bell_r, 16) == b"\x00"
        assert r.spin_read(0) == b"d"  # no doorbell given: nothing is written
        with pytest.raises(BlockingIOError):
            os.read(bell_r, 16)
        assert r.spin_read(0, bell_w) is None  # nothing read: nothing rung
        with pytest.raises(BlockingIOError):
            os.read(bell_r, 16)
        os.close(bell_r)
        w.try_write(b"e")
        assert r.spin_read(0, bell_w) == b"e"  # a doorbell nobody reads is no error
    finally:
        for fd in (bell_r, bell_w):
            try:
                os.close(fd)
            except OSError:
                pass


def test_a_long_spin_read_lets_other_threads_run(ring_pair: Any) -> None:
    """The first microseconds of a spin keep the GIL; the rest of the budget must not."""
    _, r = ring_pair
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    thread = threading.Thread(target=count)
    thread.start()
    try:
        while ticks == 0:  # the counter runs before the spin starts
            pass
        before = ticks
        assert r.spin_read(0.2) is None
        during = ticks - before
    finally:
        stop.set()
        thread.join()
    assert during > 1000


def test_the_flags_have_a_cache_line_of_their_own() -> None:
    """Each side reads the other's flags on every record; beside the positions they would
    move the busiest lines across cores once per record."""
    per_record = {_spsc_py.H_TAIL, _spsc_py.H_WCOUNT, _spsc_py.H_HEAD, _spsc_py.H_RCOUNT}
    flags = {_spsc_py.H_WWAIT, _spsc_py.H_WCLOSED, _spsc_py.H_RWAIT, _spsc_py.H_RCLOSED}
    assert {i // 8 for i in flags}.isdisjoint({i // 8 for i in per_record})


def test_ring_close_writer_and_reader(ring_pair: Any) -> None:
    w, r = ring_pair
    w.try_write(b"last")
    w.close_writer()
    assert r.writer_closed
    assert r.spin_read(1.0) == b"last"  # drains first
    assert r.spin_read(5.0) is None  # then returns at once: the writer is gone
    r.close_reader()
    with pytest.raises(QueueClosedError, match="the reader has closed it"):
        w.try_write(b"more")


def test_records_done_trails_records_read_until_marked(ring_pair: Any) -> None:
    w, r = ring_pair
    for rec in (b"a", b"b", b"c"):
        w.try_write(rec)
    assert (w.records_read, w.records_done) == (0, 0)
    r.try_read()
    r.try_read()
    assert (w.records_read, w.records_done) == (2, 0)  # taken, not finished
    r.mark_done()
    assert (w.records_read, w.records_done) == (2, 2)
    r.try_read()
    assert w.stats()["records_done"] == 2
    assert w.stats()["records_read"] == 3


def test_spin_read_and_write_give_up_after_the_budget(ring_pair: Any) -> None:
    w, r = ring_pair
    assert r.spin_read(0.002) is None
    while w.try_write(b"q" * 100):
        pass
    assert w.spin_write(b"q" * 100, 0.002) == 0


def test_spin_read_sees_a_record_from_another_thread(ring_pair: Any) -> None:
    w, r = ring_pair
    timer = threading.Timer(0.02, lambda: w.try_write(b"late"))
    timer.start()
    try:
        assert r.spin_read(5.0) == b"late"
    finally:
        timer.join()


def test_corrupt_length_is_detected(ring_pair: Any) -> None:
    w, r = ring_pair
    w.try_write(b"abc")
    seg = _spsc_py.SharedSegment(w.name, create=False)
    try:
        struct.pack_into("<Q", seg.buf, _spsc_py.HEADER_BYTES, 10_000)  # forge the length word
    finally:
        seg.close()
    with pytest.raises(RingCorruptedError, match="is corrupt: a record at position 0"):
        r.try_read()


def _scribble(name: str, offset: int, value: int) -> None:
    """Overwrite one uint64 of a ring's segment, as a stray writer would."""
    seg = _spsc_py.SharedSegment(name, create=False)
    try:
        struct.pack_into("<Q", seg.buf, offset, value)
    finally:
        seg.close()


_TAIL = _spsc_py.H_TAIL * 8
_HEAD = _spsc_py.H_HEAD * 8
_DATA = _spsc_py.HEADER_BYTES


@pytest.mark.parametrize(
    ("offset", "value", "what"),
    [
        # a tail far past the capacity with a length that fits it: reading would copy far
        # past the mapping
        (_TAIL, 1 << 40, "committed"),
        # a tail less than one record header past the head: the committed count would
        # underflow to 2**64 - 4
        (_TAIL, 4, "record boundary"),
        # a head that is not on a record boundary
        (_HEAD, 3, "record boundary"),
    ],
)
def test_a_scribbled_header_is_reported_never_read_past(
    ring_pair: Any, offset: int, value: int, what: str
) -> None:
    w, r = ring_pair
    w.try_write(b"abc")
    _scribble(w.name, offset, value)
    _scribble(w.name, _DATA, 1 << 30)  # and a length word that would read 1 GiB
    with pytest.raises(RingCorruptedError, match=f"shared ring '{w.name}' is corrupt: .*{what}"):
        r.try_read()
    with pytest.raises(RingCorruptedError):
        r.read_all()
    with pytest.raises(RingCorruptedError):
        r.spin_read(0.001)


def test_a_huge_length_word_is_corruption_not_memory_error(ring_pair: Any) -> None:
    w, r = ring_pair
    w.try_write(b"abcdefgh" * 4)
    _scribble(w.name, _DATA, (1 << 64) - 8)
    with pytest.raises(RingCorruptedError, match="claims 18446744073709551608 bytes"):
        r.try_read()


@pytest.mark.parametrize(("offset", "value"), [(_HEAD, 1 << 40), (_TAIL, 5)])
def test_the_writer_checks_the_positions_it_reads(ring_pair: Any, offset: int, value: int) -> None:
    w, _ = ring_pair
    while w.try_write(b"x" * 40):
        pass  # full: the writer must look at the reader's head again
    _scribble(w.name, offset, value)
    with pytest.raises(RingCorruptedError, match=f"shared ring '{w.name}' is corrupt"):
        w.try_write(b"y" * 40)


@pytest.mark.parametrize("capacity", [(1 << 64) - 64, 1 << 20, 13, 0])
def test_attach_refuses_a_capacity_the_segment_cannot_hold(impl: Any, capacity: int) -> None:
    ring = impl.SharedByteRing(256)
    try:
        _scribble(ring.name, _spsc_py.H_CAPACITY * 8, capacity)
        with pytest.raises(InvalidConfigurationError, match="is not a pydotcompute ring"):
            impl.SharedByteRing.attach(ring.name)
    finally:
        ring.close()
        ring.unlink()


_WORDS = [_spsc_py.H_TAIL, _spsc_py.H_WCOUNT, _spsc_py.H_HEAD, _spsc_py.H_RCOUNT]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 120), min_size=1, max_size=8),
    scribbles=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(_WORDS), st.integers(32, 32 + 256 // 8 - 1)),
            st.one_of(st.integers(0, 1 << 10), st.integers(0, (1 << 64) - 1)),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_scribbles_anywhere_never_read_past_the_ring(
    sizes: list[int], scribbles: list[tuple[int, int]]
) -> None:
    # header words (positions, counters) and data words (length words among them) get
    # arbitrary values; every read and write must stay inside the ring or say it is corrupt
    for mod in [_spsc_py] + ([EXT] if EXT is not None else []):
        w = mod.SharedByteRing(256)
        r = mod.SharedByteRing.attach(w.name)
        try:
            for n in sizes:
                w.try_write(b"x" * n)
            for word, value in scribbles:
                _scribble(w.name, word * 8, value)
            for _ in range(len(sizes) + 2):
                try:
                    rec = r.try_read()
                except RingCorruptedError:
                    break
                assert rec is None or len(rec) <= r.max_record_size
                try:
                    w.try_write(b"y" * 24)
                except RingCorruptedError:
                    break
        finally:
            r.close()
            w.close()
            w.unlink()


def test_corruption_is_a_queue_error() -> None:
    assert issubclass(RingCorruptedError, QueueError)
    assert issubclass(RingCorruptedError, RuntimeError)


def test_attach_errors(impl: Any) -> None:
    with pytest.raises(FileNotFoundError, match="no shared-memory segment named 'pdc_nope'"):
        impl.SharedByteRing.attach("pdc_nope")
    seg = _spsc_py.SharedSegment(None, 4096, create=True)
    try:
        with pytest.raises(InvalidConfigurationError, match="is not a pydotcompute ring"):
            impl.SharedByteRing.attach(seg.name)
    finally:
        seg.close()
        seg.unlink()
    with pytest.raises(InvalidConfigurationError, match="between 64 bytes and 1 TiB"):
        impl.SharedByteRing(8)


def test_closed_ring_refuses_use(impl: Any) -> None:
    w = impl.SharedByteRing(256)
    w.close()
    w.unlink()
    assert w.closed
    with pytest.raises(ValueError, match="closed"):
        w.try_write(b"x")


def test_context_manager_unlinks(impl: Any) -> None:
    before = _shm_names()
    with impl.SharedByteRing(256) as ring:
        assert ring.name in _shm_names()
        name = ring.name
    assert name not in _shm_names()
    assert _shm_names() == before


@pytest.mark.skipif(EXT is None, reason="extension not built")
@pytest.mark.parametrize("writer_mod", ["python", "cython"])
def test_implementations_share_the_layout(writer_mod: str) -> None:
    assert EXT is not None
    wmod, rmod = (_spsc_py, EXT) if writer_mod == "python" else (EXT, _spsc_py)
    w = wmod.SharedByteRing(512)
    r = rmod.SharedByteRing.attach(w.name)
    try:
        for i in range(500):
            data = os.urandom(i % 61)
            assert w.try_write(data)
            assert r.try_read() == data
    finally:
        r.close()
        w.close()
        w.unlink()


# --- two processes: a reader never sees a torn record --------------------------------------


def _produce(name: str, count: int, pure: bool, attached: Any) -> None:
    mod = _spsc_py if pure else _cython
    ring = mod.SharedByteRing.attach(name)
    attached.set()
    try:
        for i in range(count):
            size = 8 + (i * 7919) % 900
            body = (struct.pack("<I", i) * (size // 4 + 1))[:size]
            record = hashlib.blake2b(body, digest_size=8).digest() + body
            while not ring.spin_write(record, 0.01):
                pass
        ring.close_writer()
    finally:
        ring.close()


@pytest.mark.parametrize("pure", [True, False], ids=["python", "cython"])
def test_two_processes_never_see_a_torn_record(pure: bool) -> None:
    if not pure and EXT is None:
        pytest.skip("extension not built")
    mod = _spsc_py if pure else _cython
    count = 2000 if not pure else 800
    ring = mod.SharedByteRing(4096)  # small: constant wrap-around and full-ring waits
    ctx = multiprocessing.get_context("spawn")
    attached = ctx.Event()
    proc = ctx.Process(
        target=_produce, args=(ring.name, count, pure, attached), name="pydotcompute-test"
    )
    proc.start()
    try:
        while not attached.wait(0.1):
            assert proc.is_alive(), "the producer could not attach"
        ring.unlink()  # both sides have it mapped: the name is no longer needed
        seen = 0
        while True:
            rec = ring.spin_read(0.01)
            if rec is None:
                if ring.writer_closed and not ring.readable():
                    break
                if not proc.is_alive() and not ring.readable():
                    break
                continue
            digest, body = rec[:8], rec[8:]
            assert hashlib.blake2b(body, digest_size=8).digest() == digest, f"torn record {seen}"
            assert struct.unpack_from("<I", body)[0] == seen
            seen += 1
        assert seen == count
    finally:
        proc.join(30)
        ring.close()
        ring.unlink()
    assert proc.exitcode == 0


def test_segment_created_in_a_process_is_removed_by_its_tracker_on_crash(tmp_path: Path) -> None:
    # A creator killed before unlink(): the resource tracker removes the segment.
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, sys\n"
        "from pydotcompute.ring_kernels._native import SharedByteRing\n"
        "r = SharedByteRing(4096)\n"
        "print(r.name, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    name = out.stdout.strip()
    assert name.startswith("pdc_")
    import time

    deadline = time.monotonic() + 10
    while name in _shm_names() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert name not in _shm_names()


# --- FastLock: the process tier's send and receive lock ---------------------------------------


def test_lock_acquire_release_and_refusals(impl: Any) -> None:
    lock = impl.FastLock()
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.acquire(False) is False  # held: a non-blocking try fails at once
    assert lock.acquire(True, 0.02) is False  # and a timed one when the time is up
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(ValueError):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError):
        lock.acquire(True, -5)
    with pytest.raises(OverflowError):
        lock.acquire(True, 1e300)
    assert not lock.locked()
    assert lock.acquire(False, -1.0) is True  # -1 means "no timeout" in any form
    lock.release()


def test_lock_hands_over_to_a_waiting_thread(impl: Any) -> None:
    lock = impl.FastLock()
    lock.acquire()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(True, 10)))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive()  # waiting
    lock.release()
    waiter.join(10)
    assert got == [True]
    assert lock.locked()  # held by the waiter now
    lock.release()


def test_lock_keeps_a_counter_exact_under_contention(impl: Any) -> None:
    lock = impl.FastLock()
    counter = [0]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work() -> None:
        for _ in range(3000):
            with lock:
                value = counter[0]
                if value % 7 == 0:
                    threading.Event().wait(0)  # give the GIL away inside the lock
                counter[0] = value + 1

    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
    assert counter[0] == 12000
    assert not lock.locked()


def test_a_signal_interrupts_a_waiting_acquire(impl: Any) -> None:
    import signal

    if not hasattr(signal, "pthread_kill"):
        pytest.skip("no pthread_kill on this platform")
    lock = impl.FastLock()
    lock.acquire()
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    timer = threading.Timer(0.1, signal.pthread_kill, args=(main, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            lock.acquire(True, 10)  # the default SIGINT handler raises here
    finally:
        timer.join()
    lock.release()
    assert lock.acquire(False)  # still usable
    lock.release()


# --- batches: many records in one call ------------------------------------------------------


def test_spin_read_quiet_withdraws_the_flag_and_reports_records_behind(impl: Any) -> None:
    w = impl.SharedByteRing(4096)
    r = impl.SharedByteRing.attach(w.name)
    try:
        # armed, empty: nothing read, the flag set again
        r.set_reader_waiting(True)
        assert r.spin_read_quiet(0.0) == (None, False)
        assert r.reader_waiting
        # armed, one record: it is read, none behind, the flag set again
        w.try_write(b"one")
        assert r.spin_read_quiet(0.0) == (b"one", False)
        assert r.reader_waiting
        # armed, two records: the first is read and the second reported behind it
        w.try_write(b"two")
        w.try_write(b"three")
        assert r.spin_read_quiet(0.0) == (b"two", True)
        assert r.reader_waiting
        assert r.try_read() == b"three"
        # not armed (a burst under way, its reader polls on): nothing reported, flag left off
        r.set_reader_waiting(False)
        w.try_write(b"four")
        w.try_write(b"five")
        assert r.spin_read_quiet(0.0) == (b"four", False)
        assert not r.reader_waiting
        # armed again: after an empty poll the flag is back, so the next record rings
        r.set_reader_waiting(True)
        assert r.spin_read_quiet(0.0) == (b"five", False)
        assert r.spin_read_quiet(0.001) == (None, False)
        assert w.try_write(b"six") == 2  # WRITE_WAKE: the flag is back, the writer rings
    finally:
        r.close()
        w.close()
        w.unlink()


def test_write_many_publishes_a_prefix_that_fits(impl: Any) -> None:
    w = impl.SharedByteRing(4096, max_records=3)
    r = impl.SharedByteRing.attach(w.name)
    try:
        assert w.write_many([]) == (0, False)
        assert w.write_many([b"a", bytearray(b"bc")]) == (2, False)  # any bytes-like record
        assert w.records_written == 2
        assert w.write_many([b"d", b"e", b"f"]) == (1, False)  # the record bound stops it
        r.set_reader_waiting(True)
        assert w.write_many([b"e"]) == (0, False)  # nothing written: nothing to ring
        assert r.read_many(10) == [b"a", b"bc", b"d"]
        assert w.write_many([b"e", b"f"]) == (2, True)  # the reader is parked: ring once
        r.set_reader_waiting(False)
        assert r.read_many(1) == [b"e"]
        assert r.read_many(0) == []
        assert r.read_many(5) == [b"f"]
        assert r.read_many(5) == []
    finally:
        r.close()
        w.close()
        w.unlink()


def test_write_many_wraps_and_refuses_what_never_fits(ring_pair: Any) -> None:
    w, r = ring_pair  # 256 data bytes
    recs = [bytes([i]) * (20 + i) for i in range(30)]
    got: list[bytes] = []
    sent = 0
    while sent < len(recs):  # wraps around the end several times, payloads split
        n, _ = w.write_many(recs[sent:])
        assert n > 0
        sent += n
        got += r.read_many(3)
    got += r.read_many(100)
    assert got == recs
    with pytest.raises(InvalidConfigurationError, match="larger"):
        w.write_many([b"x" * 300, b"y"])  # the first never fits: an error, nothing written
    assert w.write_many([b"y", b"x" * 300, b"z"]) == (1, False)  # a later one: stops there
    assert r.read_many(5) == [b"y"]
    r.close_reader()
    with pytest.raises(QueueClosedError):
        w.write_many([b"z"])


def test_read_many_rings_a_parked_writer_once(ring_pair: Any) -> None:
    w, r = ring_pair
    bell_r, bell_w = os.pipe()
    os.set_blocking(bell_r, False)
    try:
        w.write_many([b"a", b"b", b"c"])
        assert r.read_many(2, bell_w) == [b"a", b"b"]  # not parked: no byte
        with pytest.raises(BlockingIOError):
            os.read(bell_r, 16)
        w.set_writer_waiting(True)
        assert r.read_many(5, bell_w) == [b"c"]
        assert os.read(bell_r, 16) == b"\x00"  # one byte for the batch
        assert r.read_many(5, bell_w) == []  # nothing read: nothing rung
        with pytest.raises(BlockingIOError):
            os.read(bell_r, 16)
    finally:
        os.close(bell_r)
        os.close(bell_w)


def test_mark_done_stores_the_answer_rings_count_first(impl: Any) -> None:
    inbox = impl.SharedByteRing(4096)
    outbox = impl.SharedByteRing(4096)
    child_in = impl.SharedByteRing.attach(inbox.name)
    bell_r, bell_w = os.pipe()
    os.set_blocking(bell_r, False)
    try:
        inbox.write_many([b"m1", b"m2"])
        assert (inbox.records_done, inbox.done_mark) == (0, 0)
        child_in.try_read()
        outbox.write_many([b"r1a", b"r1b"])  # two answers to the first message
        child_in.mark_done(outbox, bell_w)  # finished it: the writer is not parked
        assert (inbox.records_done, inbox.done_mark) == (1, 2)
        with pytest.raises(BlockingIOError):
            os.read(bell_r, 16)
        inbox.set_writer_waiting(True)
        child_in.mark_done(outbox, bell_w)  # parked, but a record is left: a read rings
        with pytest.raises(BlockingIOError):
            os.read(bell_r, 16)
        child_in.try_read()
        outbox.try_write(b"r2")
        child_in.mark_done(outbox, bell_w)  # parked and the ring is empty: rung here
        assert os.read(bell_r, 16) == b"\x00"
        assert (inbox.records_done, inbox.done_mark) == (2, 3)
        child_in.mark_done()  # without an answer ring the mark stays
        assert inbox.done_mark == 3
    finally:
        os.close(bell_r)
        os.close(bell_w)
        for ring in (child_in, inbox, outbox):
            ring.close()
        inbox.unlink()
        outbox.unlink()
