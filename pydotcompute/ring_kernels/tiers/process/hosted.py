"""`ProcessHostedKernel`: what ``runtime.launch(..., tier="process")`` builds.

The runtime's policy (accounting, supervision, correlation, backpressure, and the inline
request of ``reply_spin_us``) comes from the hosting bridge `HostedKernel`; this class only
reads the tier's options and builds its `ProcessWorker`, which the bridge drives through the
tier contract alone.

Design notes:
- The child's inbox ring is bounded by message count as well as bytes: the runtime gives
  it `bridge_queue_size` as its `input_queue_size`, so the user's inbox bound and
  priority bands act on everything the child has not yet been handed. That alone let the
  child run ahead (replies waiting in the outbox come out before anything handed over
  later), so the worker is built to count a message until its replies were read here
  (``room``: `ProcessWorker.bound_in_flight`): an urgent message waits behind at most the
  bridge. Without a ``bridge_queue_size`` of the user's, the ring holds the widest
  bridge's records (`BRIDGE_WIDEST`) and that bound starts at 64, for the bridge to widen.
- ``reply_spin_us`` is the bridge's reply spin (see `HostedKernel`), which this tier's
  worker can do (`ProcessWorker.reply_within` polls the reply ring with the child's
  doorbell muted). It blocks the loop for up to that long per request, so it is capped
  (`MAX_SPIN_US`) here, where the option is read.
- Without it, a request a caller waits for still makes the loop poll its descriptors
  once more, without blocking, before it parks (a no-op callback scheduled at the
  hand-over): a child that spins answers within a couple of microseconds, and a reply
  caught by that poll costs no wake-up of the loop (on this kind of machine 10-20 us).
  Until timed waits shared one timer per loop, the close of each request's own timer
  made that extra poll by accident.
"""

from __future__ import annotations

from typing import Any

from ...hosted import BRIDGE_WIDEST, HostedKernel
from ..contract import TierWorker
from .config import ProcessKernelConfig, check_spin_us
from .edge_worker import HostedProcessWorker

__all__ = ("ProcessHostedKernel",)


def _look_again() -> None:
    """Nothing: scheduled, it makes the loop poll its descriptors once more, without
    blocking, before it parks (see the module notes)."""


class ProcessHostedKernel(HostedKernel):
    """Tier 3 in the runtime: the actor runs in a child process over shared-memory rings.

    The actor function must be importable by the child (a module-level function).
    Extra options: ``bridge_queue_size``, ``ring_bytes`` (each ring's capacity; a message
    must encode to at most ``ring_bytes - 8``), ``spin_us`` (how long the child polls for
    its next message before parking; default ``HOSTED_SPIN_US``), ``reply_spin_us``
    (default 0: park at once): while a ``send_and_receive`` caller waits for its reply,
    the event loop polls the reply ring for up to this many microseconds before it parks,
    so a quick actor's reply needs no wake-up. The loop runs nothing else meanwhile, and
    the spin costs CPU (see the performance guide's table); a number from 0 to
    `MAX_SPIN_US` (10 ms; ``spin_us`` too), and never spun past the caller's timeout.
    The budget adapts: spins that miss shrink it (down to parking at once), with a full
    try every few requests. A pool (``replicas`` > 1) does not spin: its replies come
    from several rings.
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "ring_bytes", "spin_us", "reply_spin_us"})
    WORKER = HostedProcessWorker
    # The child spins this long for its next message before parking (direct use: 50 us).
    # Hosted, the next message comes a loop round trip later (30-50 us here): with 50 us
    # the child often just missed it, parked, and each message then paid a wake-up
    # (round trips 80-110 us instead of ~50). Adaptive spinning still shrinks it when idle.
    HOSTED_SPIN_US = 200.0
    __slots__ = ()

    def _reply_spin_budget(self) -> float:
        spin = check_spin_us(
            "reply_spin_us", self.kernel_id, self.config.extra.get("reply_spin_us", 0.0)
        )
        return spin / 1e6

    def try_accept(self, msg: Any, timeout: float | None = None) -> bool:
        """`HostedKernel.try_accept`; a message a caller waits for, handed over without
        a reply spin, has the loop look at the reply doorbell once more before it parks."""
        if not super().try_accept(msg, timeout):
            return False
        if self._spinner is None and self._waiters and self._awaited(msg):
            loop = self._loop
            if loop is not None:
                loop.call_soon(_look_again)
        return True

    def _make_worker(self, bridge: int) -> TierWorker:
        given = "bridge_queue_size" in self.config.extra  # else the bridge may widen
        kwargs: dict[str, Any] = {
            "spin_us": self.config.extra.get("spin_us", self.HOSTED_SPIN_US),
            "input_queue_size": bridge if given else max(bridge, BRIDGE_WIDEST),
            "record_latency": self._timed,
            "check_fields": self.config.check_fields,
        }
        ring_bytes = self.config.extra.get("ring_bytes")
        if ring_bytes is not None:
            kwargs["ring_bytes"] = ring_bytes
        return HostedProcessWorker(
            self.kernel_id,
            self._func,
            config=ProcessKernelConfig(self.kernel_id, **kwargs),
            input_type=self.input_type,
            output_type=self.output_type,
            room=bridge,  # replies not yet read count against the bridge
            edge_bound=(self.config.input_queue_size, str(self.config.backpressure_strategy)),
        )
