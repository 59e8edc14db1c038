"""`ProcessHostedKernel`: what ``runtime.launch(..., tier="process")`` builds.

The runtime's policy (accounting, supervision, correlation, backpressure) comes from the
hosting bridge `HostedKernel`; this class only builds the tier's `ProcessWorker`.

Design notes:
- The child's inbox ring is bounded by message count as well as bytes: the runtime gives
  it `bridge_queue_size` as its `input_queue_size`, so the user's inbox bound and
  priority bands act on everything the child has not yet been handed. That alone let the
  child run ahead (replies waiting in the outbox come out before anything handed over
  later), so the worker also counts a message until its replies were read here
  (`ProcessWorker.bound_in_flight`): an urgent message waits behind at most the bridge.
- One encode per message: the size check at the edge serializes the message anyway, so
  the worker is handed those bytes (`ProcessWorker.keep_encoded`) and writes them.
- ``reply_spin_us`` spins on the event loop's thread, blocking the loop for up to that
  long per request: it trades the loop's time (and a core) for a reply without a
  wake-up, and only ever when a caller waits for that reply (``send_and_receive``).
"""

from __future__ import annotations

import math
from typing import Any

from ....exceptions import InvalidConfigurationError
from ...hosted import HostedKernel
from ...message import request_key
from ..contract import TierWorker
from .config import ProcessKernelConfig
from .waiting import PROBE_EVERY
from .worker import ProcessWorker

__all__ = ("ProcessHostedKernel",)


class ProcessHostedKernel(HostedKernel):
    """Tier 3 in the runtime: the actor runs in a child process over shared-memory rings.

    The actor function must be importable by the child (a module-level function).
    Extra options: ``bridge_queue_size``, ``ring_bytes`` (each ring's capacity; a message
    must encode to at most ``ring_bytes - 8``), ``spin_us`` (how long the child polls for
    its next message before parking; default ``HOSTED_SPIN_US``), ``reply_spin_us``
    (default 0: park at once): while a ``send_and_receive`` caller waits for its reply,
    the event loop polls the reply ring for up to this many microseconds before it parks,
    so a quick actor's reply needs no wake-up. The loop runs nothing else meanwhile, and
    the spin costs CPU (see the performance guide's table); a finite number ``>= 0``.
    The budget adapts: spins that miss shrink it (down to parking at once), with a full
    try every few requests.
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "ring_bytes", "spin_us", "reply_spin_us"})
    # The child spins this long for its next message before parking (direct use: 50 us).
    # Hosted, the next message comes a loop round trip later (30-50 us here): with 50 us
    # the child often just missed it, parked, and each message then paid a wake-up
    # (round trips 80-110 us instead of ~50). Adaptive spinning still shrinks it when idle.
    HOSTED_SPIN_US = 200.0
    __slots__ = ("_process_worker", "_reply_misses", "_reply_spin_max", "_reply_spin_s")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reply_spin_max = 0.0  # reply_spin_us, in seconds
        self._reply_spin_s = 0.0  # the budget now (adaptive, as the child's spin is)
        self._reply_misses = 0
        self._process_worker: ProcessWorker | None = None  # unwrapped (see `wrap_worker`)

    def _check_size(self, msg: Any) -> bytes | None:
        data = super()._check_size(msg)
        worker = self._process_worker
        if worker is not None:
            if data is None:  # a plain value: measured (and refused) here too, not by
                data = worker.encode_checked(msg)  # the pump, which could only drop it
            worker.keep_encoded(msg, data)  # the send writes these bytes
        return data

    def _hand_over(self, msg: Any) -> bool:
        worker = self._process_worker
        if not super()._hand_over(msg):
            if worker is not None:
                worker.keep_encoded(msg, None)  # the pump encodes it when it hands it over
            return False
        if (  # a caller waits for this reply: poll for it before the loop parks
            self._reply_spin_max and worker is not None and self._awaited(msg)
        ):
            self._spin_for_reply(worker)
        return True

    def _awaited(self, msg: Any) -> bool:
        """Whether a caller waits for the reply to ``msg``."""
        try:
            return request_key(msg) in self._waiters
        except AttributeError:  # a plain value
            return False

    def _spin_for_reply(self, worker: ProcessWorker) -> None:
        """Poll for the reply, adapting the budget as the child's waits do: a reply caught
        while spinning restores the full budget; a miss quarters it, down to none, and
        every `PROBE_EVERY`-th miss in a row tries the full budget again. A slow actor,
        or a machine too loaded for the child to answer within the budget, so stops
        costing the loop its budget on every request."""
        spin = self._reply_spin_s
        if spin and worker.spin_for_reply(spin):
            self._reply_spin_s = self._reply_spin_max
            self._reply_misses = 0
            self._drain_ready_replies()
            return
        self._reply_misses += 1
        if self._reply_misses % PROBE_EVERY == 0:
            self._reply_spin_s = self._reply_spin_max
        else:
            quarter = spin / 4
            self._reply_spin_s = quarter if quarter >= 1e-6 else 0.0

    def _make_worker(self, bridge: int) -> TierWorker:
        kwargs: dict[str, Any] = {
            "spin_us": self.config.extra.get("spin_us", self.HOSTED_SPIN_US),
            "input_queue_size": bridge,
            "record_latency": self._timed,
        }
        ring_bytes = self.config.extra.get("ring_bytes")
        if ring_bytes is not None:
            kwargs["ring_bytes"] = ring_bytes
        spin = self.config.extra.get("reply_spin_us", 0.0)
        if type(spin) not in (int, float) or not 0 <= spin < math.inf:
            raise InvalidConfigurationError(
                f"reply_spin_us of kernel {self.kernel_id!r} must be >= 0 and finite "
                f"(microseconds; 0: park at once), got {spin!r}"
            )
        worker = ProcessWorker(
            self.kernel_id,
            self._func,
            config=ProcessKernelConfig(self.kernel_id, **kwargs),
            input_type=self.input_type,
            output_type=self.output_type,
        )
        worker.bound_in_flight(bridge)  # replies not yet read count against the bridge
        self._reply_spin_max = self._reply_spin_s = spin / 1e6
        self._process_worker = worker
        return worker
