"""The host half of a GPU actor's rings (``_gpu/host.py``) on plain NumPy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from pydotcompute.ring_kernels._gpu import layout as L
from pydotcompute.ring_kernels._gpu.host import HostRings

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
