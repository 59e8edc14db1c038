"""The host half of a GPU actor's rings (``_gpu/host.py``) on plain NumPy arrays."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np

from pydotcompute.ring_kernels.tiers.gpu import layout as L
from pydotcompute.ring_kernels.tiers.gpu.host import HostRings, Liveness
from pydotcompute.ring_kernels.tiers.gpu.prepare import compile_within

IN = np.dtype([("_mid_hi", np.uint64), ("_mid_lo", np.uint64), ("x", np.int64)])


def _rings(cap: int = 8) -> HostRings:
    views: dict[str, Any] = {
        "inbox": np.zeros(cap, IN),
        "outbox": np.zeros(cap + 1, IN),
        "ostat": np.zeros(cap + 1, np.int64),
        "lat": np.zeros(cap, np.int64),
        "ctl": np.zeros(L.CTL_WORDS, np.int64),
    }
    return HostRings(views)


def _doorbell(r: HostRings) -> tuple[int, int, int]:
    w = r.word(L.DOORBELL)
    return (
        w >> L.DOORBELL_SHIFT,
        int(bool(w & L.DOORBELL_TERMINATE)),
        int(bool(w & L.DOORBELL_ACTIVE)),
    )


def test_the_doorbell_carries_tail_terminate_and_active() -> None:
    r = _rings()
    recs = np.zeros(3, IN)
    recs["x"] = [1, 2, 3]
    r.publish(recs)
    assert r.word(L.IN_TAIL) == 3
    assert _doorbell(r) == (3, 0, 0)
    r.set_word(L.ACTIVE, 1)
    assert _doorbell(r) == (3, 0, 1)
    r.publish(recs[:2])
    assert _doorbell(r) == (5, 0, 1)
    r.set_word(L.TERMINATE, 1)
    assert _doorbell(r) == (5, 1, 1)
    r.set_word(L.ACTIVE, 0)
    assert _doorbell(r) == (5, 1, 0)
    assert (r.word(L.ACTIVE), r.word(L.TERMINATE)) == (0, 1)  # readable words stay in step


def test_the_doorbell_is_on_a_host_written_line() -> None:
    assert L.DOORBELL // 8 == L.IN_TAIL // 8
    device_words = (L.IN_HEAD, L.OUT_TAIL, L.STARTED, L.PROCESSED)
    assert all(w // 8 != L.DOORBELL // 8 for w in device_words)


def test_publish_and_take_wrap_around_the_rings() -> None:
    r = _rings(cap=4)
    seen: list[int] = []
    sent = 0
    for batch in (3, 3, 2, 4, 1, 3):  # every offset, every wrap
        recs = np.zeros(batch, IN)
        recs["x"] = np.arange(sent, sent + batch)
        r.publish(recs)
        sent += batch
        head = r.word(L.IN_HEAD)  # the device's part: echo every request
        for k in range(head, r.in_tail):
            slot = r.inbox[k % 4]
            r.outbox[r.word(L.OUT_TAIL) % 4] = slot
            r.ostat[r.word(L.OUT_TAIL) % 4] = 0
            r.ctl[L.OUT_TAIL] += 1
        r.ctl[L.IN_HEAD] = r.in_tail
        got, stats = r.take(r.ready())
        assert stats.tolist() == [0] * batch
        seen += got["x"].tolist()
        assert r.word(L.OUT_HEAD) == sent
        assert not r.outbox.view(np.uint8).any()  # taken slots are zeroed
    assert seen == list(range(sent))
    assert r.word(L.DOORBELL) >> L.DOORBELL_SHIFT == sent


# --- liveness: progress, not mere life -------------------------------------------------------


def test_the_seen_tail_sits_with_the_heartbeat_on_a_device_written_line() -> None:
    assert L.TAIL_SEEN // 8 == L.HEARTBEAT // 8
    host_words = (L.IN_TAIL, L.DOORBELL, L.OUT_HEAD, L.ACTIVE, L.TERMINATE)
    assert all(w // 8 != L.TAIL_SEEN // 8 for w in host_words)
    assert L.TAIL_SEEN not in {v for k, v in L.constants().items() if k != "TAIL_SEEN"} - {
        L.CMD_IDLE,
        L.CMD_PROCESS,
        L.CMD_PROCESS_DROP,
        L.CMD_STALL,
        L.CMD_EXIT,
        L.DOORBELL_SHIFT,
        L.DOORBELL_ACTIVE,
        L.DOORBELL_TERMINATE,
    }


def test_a_heartbeat_alone_is_not_progress_while_published_messages_go_unseen() -> None:
    live = Liveness(0.0)
    assert not live.observe(0.0, published=0, taken=0, seen=0, beat=0)
    # the host publishes 3 messages; the kernel idles on (its heartbeat advances) but its
    # doorbell reads still say tail 0
    for t, beat in ((1.0, 1), (2.0, 2), (3.0, 3)):
        assert not live.observe(t, published=3, taken=0, seen=0, beat=beat)
    assert live.stalled_for(3.5) == 3.5
    assert live.blind_beats == 3
    assert live.deaf(3.5)
    text = live.describe("k", 3.0, pending=3, processed=0, now=3.5)
    assert "is alive (its heartbeat advanced 3 time(s))" in text
    assert "read inbox tail 0, the host published 3" in text
    assert "doorbell" in text


def test_seeing_or_taking_messages_is_progress_and_an_idle_heartbeat_too() -> None:
    live = Liveness(0.0)
    live.observe(0.0, published=0, taken=0, seen=0, beat=0)
    assert live.observe(1.0, published=0, taken=0, seen=0, beat=1)  # idle: nothing unseen
    assert live.observe(2.0, published=2, taken=0, seen=2, beat=1)  # saw the new tail
    assert live.observe(3.0, published=2, taken=2, seen=2, beat=1)  # took them
    assert live.observe(4.0, published=2, taken=2, seen=2, beat=2)  # stalls on a full outbox
    assert live.stalled_for(4.5) == 0.5


def test_a_stuck_handler_is_told_apart_from_a_deaf_kernel() -> None:
    live = Liveness(0.0)
    live.observe(0.0, published=0, taken=0, seen=0, beat=5)
    # one idle heartbeat lands after the publish, before the kernel takes the message; then
    # it sits in the handler and beats no more
    live.observe(0.1, published=1, taken=0, seen=0, beat=6)
    live.observe(9.0, published=1, taken=0, seen=0, beat=6)
    assert not live.deaf(9.0)
    text = live.describe("k", 5.0, pending=1, processed=0, now=9.0)
    assert "made no progress for 5.0s with 1 message(s) pending" in text
    assert "handler may be stuck" in text


class _SlowCompile:
    """What ``compile_within`` needs of a device actor: a compile that takes a while."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.compiling = False
        self.released = threading.Event()

    def compile(self) -> None:
        time.sleep(self.seconds)

    def mark_compiling(self, compiling: bool) -> None:
        self.compiling = compiling

    def release(self) -> None:
        assert not self.compiling
        self.released.set()


async def test_a_compile_past_its_limit_is_reported_and_released_when_it_ends() -> None:
    slow = _SlowCompile(0.5)
    t0 = time.monotonic()
    assert not await compile_within(slow, 0.05)
    assert time.monotonic() - t0 < 0.5  # the caller did not wait for the compile
    assert slow.compiling  # release waits for the thread
    assert not slow.released.is_set()
    await asyncio.wait_for(asyncio.to_thread(slow.released.wait, 10), 20)
    assert not slow.compiling


async def test_a_compile_within_its_limit_passes() -> None:
    fast = _SlowCompile(0.0)
    assert await compile_within(fast, 10.0)
    assert await compile_within(fast, None)
    assert not fast.released.is_set()  # the caller owns it
