"""The host's half of a GPU actor's rings: publish requests, take replies, read counters.

Everything here runs on the event loop thread and never blocks: it is NumPy slicing over
mapped memory plus one fence per publish. The ordering argument is in ``kernel.py``. The
doorbell word (inbox tail and both flags) is the one word two host threads write (the loop
publishing, a worker's `stop` setting TERMINATE from its thread): it is composed and stored
under ``bell``, a lock whose acquire is also the fence before the tail store.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import layout as L

__all__ = ("HostRings", "Liveness", "fence")

_FENCE = threading.Lock()
_IN_TAIL, _OUT_HEAD, _DOORBELL, _SHIFT = L.IN_TAIL, L.OUT_HEAD, L.DOORBELL, L.DOORBELL_SHIFT


def fence() -> None:
    """A full host memory barrier (a locked instruction on x86-64), as close as Python gets."""
    _FENCE.acquire()
    _FENCE.release()


class HostRings:
    """Host views of one kernel's inbox, outbox, status, latency and control arrays.

    Args:
        views: ``inbox``, ``outbox`` (ring + scratch slot), ``ostat``, ``lat``, ``ctl``.
    """

    __slots__ = (
        "bell",
        "ctl",
        "flags",
        "in_tail",
        "inbox",
        "lat",
        "ostat",
        "out_bytes",
        "out_head",
        "outbox",
    )

    def __init__(self, views: dict[str, np.ndarray[Any, Any]]) -> None:
        self.inbox = views["inbox"]
        self.outbox = views["outbox"]
        self.ostat = views["ostat"]
        self.lat = views["lat"]
        self.ctl = views["ctl"]
        out = self.outbox
        self.out_bytes = out.view(np.uint8).reshape(len(out), out.dtype.itemsize)
        self.in_tail = 0  # requests published (the host's copy of ctl[IN_TAIL])
        self.out_head = 0  # replies taken (the host's copy of ctl[OUT_HEAD])
        self.flags = 0  # the doorbell's TERMINATE / ACTIVE bits
        self.bell = threading.Lock()  # held while the doorbell is composed and stored

    @property
    def capacity_in(self) -> int:
        return len(self.inbox)

    @property
    def capacity_out(self) -> int:
        return len(self.outbox) - 1

    def word(self, index: int) -> int:
        """One control-block word (a device counter or flag)."""
        return int(self.ctl[index])

    def set_word(self, index: int, value: int) -> None:
        """Store a host-written word; ACTIVE and TERMINATE also ring the doorbell."""
        with self.bell:  # (a fence as well)
            self.ctl[index] = value
            bit = L.DOORBELL_ACTIVE if index == L.ACTIVE else 0
            bit = L.DOORBELL_TERMINATE if index == L.TERMINATE else bit
            if bit:
                self.flags = self.flags | bit if value else self.flags & ~bit
                self.ctl[L.DOORBELL] = (self.in_tail << L.DOORBELL_SHIFT) | self.flags

    # -- inbox --------------------------------------------------------------------------

    def in_flight(self) -> int:
        """Requests published and not yet taken by the kernel."""
        return self.in_tail - int(self.ctl[L.IN_HEAD])

    def room(self) -> int:
        """Free inbox slots."""
        return len(self.inbox) - (self.in_tail - int(self.ctl[L.IN_HEAD]))

    def publish(self, recs: np.ndarray[Any, Any]) -> None:
        """Copy records into free slots, then publish them with one tail store.

        The caller checked ``room()``. Written for few bytecodes: one message per publish is
        the round-trip path.
        """
        ring = self.inbox
        cap = len(ring)
        n = len(recs)
        tail = self.in_tail
        i = tail % cap
        end = i + n
        if end <= cap:
            ring[i:end] = recs
        else:
            ring[i:] = recs[: cap - i]
            ring[: end - cap] = recs[cap - i :]
        tail += n
        ctl = self.ctl
        bell = self.bell
        bell.acquire()  # the fence: the slot bytes are stored before the tail
        self.in_tail = tail
        ctl[_IN_TAIL] = tail
        ctl[_DOORBELL] = (tail << _SHIFT) | self.flags
        bell.release()

    def unconsumed(self) -> np.ndarray[Any, Any]:
        """Copies of the requests the kernel never took (call once it stopped), and forget
        them."""
        head = int(self.ctl[L.IN_HEAD])
        n = self.in_tail - head
        if n <= 0:
            return self.inbox[:0].copy()
        recs = _take(self.inbox, head, n, len(self.inbox))
        self.in_tail = head
        return recs

    # -- outbox -------------------------------------------------------------------------

    def ready(self) -> int:
        """Replies published by the kernel and not yet taken."""
        return int(self.ctl[L.OUT_TAIL]) - self.out_head

    def take(self, n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Copy ``n`` replies and their statuses out, zero the slots and hand them back."""
        cap = len(self.outbox) - 1
        start = self.out_head
        i = start % cap
        end = i + n
        if end <= cap:
            recs = self.outbox[i:end].copy()
            stats = self.ostat[i:end].copy()
            self.out_bytes[i:end] = 0
        else:
            recs = _take(self.outbox, start, n, cap)
            stats = _take(self.ostat, start, n, cap)
            self.out_bytes[i:cap] = 0
            self.out_bytes[: end - cap] = 0
        start += n
        self.out_head = start
        _FENCE.acquire()
        _FENCE.release()
        self.ctl[_OUT_HEAD] = start
        return recs, stats

    def latencies(self, since: int, upto: int) -> np.ndarray[Any, Any]:
        """Per-message device latencies (ns) of messages ``since..upto`` still in the ring."""
        nlat = len(self.lat)
        since = max(since, upto - nlat)
        if upto <= since:
            return self.lat[:0].copy()
        return _take(self.lat, since, upto - since, nlat)


def _take(ring: np.ndarray[Any, Any], start: int, n: int, cap: int) -> np.ndarray[Any, Any]:
    i = start % cap
    if i + n <= cap:
        return ring[i : i + n].copy()
    return np.concatenate((ring[i:cap], ring[: n - (cap - i)]))


class Liveness:
    """Tells a kernel's progress from mere life, for the pump's watchdog.

    Progress is the kernel taking messages (``IN_HEAD``) or learning of new ones
    (``TAIL_SEEN``). A heartbeat counts as progress only while the kernel has seen every
    message the host published (it idles, or waits for room in the outbox). A heartbeat
    that advances while published messages stay unseen is a live kernel that does not see
    the doorbell: not progress, and `describe` says which of the two failures it is.

    Args:
        now: The current ``time.monotonic()``.
    """

    __slots__ = ("_beat", "_seen", "_taken", "blind_beats", "last_blind_beat", "since")

    def __init__(self, now: float) -> None:
        self._taken = -1  # IN_HEAD at the last reading (-1: none yet)
        self._seen = -1  # TAIL_SEEN at the last reading
        self._beat = -1  # HEARTBEAT at the last reading
        self.since = now  # when the kernel last progressed
        self.blind_beats = 0  # heartbeats since then while published messages went unseen
        self.last_blind_beat = now  # when the last of those was read

    def observe(self, now: float, *, published: int, taken: int, seen: int, beat: int) -> bool:
        """Record one reading of the control block; True when the kernel progressed."""
        first = self._taken < 0
        moved = taken != self._taken or seen != self._seen
        beat_moved = beat != self._beat
        unseen = seen < published
        self._taken, self._seen, self._beat = taken, seen, beat
        if first or moved or (beat_moved and not unseen):
            self.since = now
            self.blind_beats = 0
            return not first
        if beat_moved:
            self.blind_beats += 1
            self.last_blind_beat = now
        return False

    def stalled_for(self, now: float) -> float:
        """Seconds since the kernel last progressed."""
        return now - self.since

    def deaf(self, now: float) -> bool:
        """Whether the kernel still beats while published messages stay unseen: it lives
        but does not see the doorbell (a handler stuck on a message stops beating)."""
        recent = now - self.last_blind_beat <= max(0.5 * (now - self.since), 1e-3)
        return self.blind_beats >= 2 and recent

    def describe(
        self, kernel_id: str, seconds: float, pending: int, processed: int, now: float
    ) -> str:
        """Why the kernel is declared hung, in words (``pending`` messages not taken)."""
        taken, seen = self._taken, self._seen
        if self.deaf(now):
            return (
                f"GPU kernel {kernel_id!r} is alive (its heartbeat advanced {self.blind_beats} "
                f"time(s)) but saw no new message for {seconds}s: it read inbox tail {seen}, "
                f"the host published {taken + pending} ({pending} pending, processed "
                f"{processed}); the doorbell does not reach the device (is the mapped control "
                "block visible to the GPU?)"
            )
        return (
            f"GPU kernel {kernel_id!r} made no progress for {seconds}s with {pending} "
            f"message(s) pending (processed {processed}); its handler may be stuck (raise "
            "watchdog_timeout for slow handlers)"
        )
