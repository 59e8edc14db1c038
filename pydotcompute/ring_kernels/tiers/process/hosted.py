"""`ProcessHostedKernel`: what ``runtime.launch(..., tier="process")`` builds.

The runtime's policy (accounting, supervision, correlation, backpressure) comes from the
hosting bridge `HostedKernel`; this class only builds the tier's `ProcessWorker`.

Design notes:
- The child's inbox ring is bounded by message count as well as bytes: the runtime gives
  it `bridge_queue_size` as its `input_queue_size`, so the user's inbox bound and
  priority bands act on everything the child has not yet been handed.
"""

from __future__ import annotations

from typing import Any

from ...hosted import HostedKernel
from ..contract import TierWorker
from .config import ProcessKernelConfig
from .worker import ProcessWorker

__all__ = ("ProcessHostedKernel",)


class ProcessHostedKernel(HostedKernel):
    """Tier 3 in the runtime: the actor runs in a child process over shared-memory rings.

    The actor function must be importable by the child (a module-level function).
    Extra options: ``bridge_queue_size``, ``ring_bytes`` (each ring's capacity; a message
    must encode to at most ``ring_bytes - 8``), ``spin_us`` (how long the child polls for
    its next message before parking; default ``HOSTED_SPIN_US``).
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "ring_bytes", "spin_us"})
    # The child spins this long for its next message before parking (direct use: 50 us).
    # Hosted, the next message comes a loop round trip later (30-50 us here): with 50 us
    # the child often just missed it, parked, and each message then paid a wake-up
    # (round trips 80-110 us instead of ~50). Adaptive spinning still shrinks it when idle.
    HOSTED_SPIN_US = 200.0
    __slots__ = ()

    def _make_worker(self, bridge: int) -> TierWorker:
        kwargs: dict[str, Any] = {
            "spin_us": self.config.extra.get("spin_us", self.HOSTED_SPIN_US),
            "input_queue_size": bridge,
            "record_latency": self._timed,
        }
        ring_bytes = self.config.extra.get("ring_bytes")
        if ring_bytes is not None:
            kwargs["ring_bytes"] = ring_bytes
        return ProcessWorker(
            self.kernel_id,
            self._func,
            config=ProcessKernelConfig(self.kernel_id, **kwargs),
            input_type=self.input_type,
            output_type=self.output_type,
        )
