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
  Without a ``bridge_queue_size`` of the user's, the ring holds the widest bridge's
  records (`BRIDGE_WIDEST`) and that bound starts at 64, for the bridge to widen.
- One encode per message: the size check at the edge serializes the message anyway, so
  the worker is handed those bytes (`ProcessWorker.keep_encoded`) and writes them.
- ``reply_spin_us`` spins on the event loop's thread, blocking the loop for up to that
  long per request: it trades the loop's time (and a core) for a reply without a
  wake-up, and only ever when a caller waits for that reply (``send_and_receive``).
  It is capped (`MAX_SPIN_US`), and a spin never runs past what is left of the caller's
  timeout: on the bridge's path that timeout reaches the hand-over through
  ``_spin_limit_s``, set right before the call whose first, synchronous steps hand the
  message over (nothing else runs on the loop in between).
- With it, a request that finds the bridge idle is made inline: handed over, spun for,
  and its own reply returned straight from the poll, with no future, registration or
  delivery (they cost 1.7 us a trip, more than the child's whole round trip). Nothing
  else runs on the loop meanwhile, so the request is registered only when something
  else came first; that reply or error then goes the bridge's way, in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ....exceptions import TypeValidationError
from ...context import SEND_YIELD_EVERY
from ...hosted import BRIDGE_WIDEST, HostedKernel
from ...message import reply_key, request_key
from ..contract import TierWorker
from .config import ProcessKernelConfig, check_spin_us
from .waiting import PROBE_EVERY
from .worker import ProcessWorker

__all__ = ("ProcessHostedKernel",)

_NOT_YET: Any = object()  # `_spin_for_reply`: the caller has not polled yet


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
    try every few requests.
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "ring_bytes", "spin_us", "reply_spin_us"})
    WORKER = ProcessWorker
    # The child spins this long for its next message before parking (direct use: 50 us).
    # Hosted, the next message comes a loop round trip later (30-50 us here): with 50 us
    # the child often just missed it, parked, and each message then paid a wake-up
    # (round trips 80-110 us instead of ~50). Adaptive spinning still shrinks it when idle.
    HOSTED_SPIN_US = 200.0
    __slots__ = (
        "_inline_turn",
        "_process_worker",
        "_reply_misses",
        "_reply_spin_max",
        "_reply_spin_s",
        "_spin_limit_s",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reply_spin_max = 0.0  # reply_spin_us, in seconds
        self._reply_spin_s = 0.0  # the budget now (adaptive, as the child's spin is)
        self._reply_misses = 0
        self._spin_limit_s: float | None = None  # the next hand-over's caller's timeout
        self._inline_turn = SEND_YIELD_EVERY  # inline requests until the loop gets a turn
        self._process_worker: ProcessWorker | None = None  # (a pool's worker is not one)

    def _admit(self, msg: Any) -> None:
        worker = self._process_worker
        # (not a pool's member; uninstrumented: no trace header to add)
        if worker is not None and worker is self._worker and not self._instruments:
            try:  # type, size and the bytes kept in one call: every send comes here
                worker.encode_checked(msg, keep=True)
                return
            except Exception:  # raised below in the runtime's words (or the worker's)
                pass
        super()._admit(msg)

    def _check_size(self, msg: Any) -> bytes | None:
        worker = self._process_worker
        data = super()._check_size(msg)
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
        if self._reply_spin_max and worker is not None and self._awaited(msg):
            # a caller waits for this reply: poll for it before the loop parks (no longer
            # than its timeout, which `send_and_receive` left here just before)
            limit, self._spin_limit_s = self._spin_limit_s, None
            try:
                reply = self._spin_for_reply(worker, limit=limit)
            except Exception as exc:
                self._polled_error(exc)
            else:
                if reply is not None:
                    self._reply_polled(reply)
        return True

    async def send_and_receive(self, msg: Any, timeout: float | None = None) -> Any:
        """`RingKernel.send_and_receive`; with ``reply_spin_us``, a request that finds the
        bridge idle is made inline: handed over, its reply polled for and, when the reply
        caught is its own, returned without a future or a delivery in between."""
        worker = self._process_worker
        if (
            self._reply_spin_s  # (its state, like the rest, is `_hand_over`'s to check)
            and type(msg) is self.input_type
            and worker is self._worker  # (not a pool's member)
            and not self._instruments  # (an instrumented bridge reports: the general path)
            and worker is not None
        ):
            try:
                key = self.claim_request(msg)  # (its id made in the kernel's request space)
            except TypeValidationError:
                key = None
            if key is not None and key not in self._waiters:
                try:
                    data = worker.encode_checked(msg, True)  # kept: the send writes these
                except Exception:  # the general path raises it, in the runtime's words
                    data = None
                if data is not None:
                    budget = self._reply_spin_s
                    deadline = 0.0
                    if timeout is not None:  # the clock starts now: the spin counts
                        deadline = asyncio.get_running_loop().time() + timeout
                        budget = min(budget, max(timeout, 0.0))
                    # the bridge's hand-over (not this class's: this path spins, below)
                    if self._bridge_hand_over(msg):
                        reply = error = None
                        try:
                            # (`_spin_for_reply` inline while replies come in time)
                            reply = worker.reply_within(budget)
                            if reply is None or self._reply_misses:
                                reply = self._spin_for_reply(worker, reply)
                        except Exception as exc:
                            error = exc
                        else:
                            try:
                                mine = reply is not None and reply_key(reply) == key
                            except AttributeError:  # a plain value: nobody's reply
                                mine = False
                            if mine:
                                if self._timed:
                                    self.telemetry.messages_sent += 1
                                self._inline_turn -= 1
                                if not self._inline_turn:
                                    await self._give_the_loop_a_turn()
                                return reply
                        fut = self._register_inline(msg, reply, error)
                        return await self.await_reply(msg, key, fut, timeout, deadline)
                    worker.keep_encoded(msg, None)
        if self._reply_spin_max:
            self._spin_limit_s = timeout  # for `_hand_over`, reached before any await
        return await super().send_and_receive(msg, timeout)

    async def _give_the_loop_a_turn(self) -> None:
        """An inline request never suspends: a caller looping on them would keep every
        other task off the loop, so every `SEND_YIELD_EVERY`-th yields once (as a tier-1
        actor's ``ctx.send`` does). A caller cancelled there loses the reply it was
        given: counted as lost, as a reply to a caller who gave up always is."""
        self._inline_turn = SEND_YIELD_EVERY
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.count_lost_reply()
            raise

    def _register_inline(
        self, msg: Any, polled: Any, error: Exception | None
    ) -> asyncio.Future[Any]:
        """An inline request whose own reply did not come first: register it
        (`expect_reply`), then pass on in order what was polled instead (another reply,
        an error). Nothing else ran on the loop since the hand-over, so no reply could
        have been delivered to this caller before it was registered."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.expect_reply(msg, fut)  # (the key is free: ``msg`` goes as it is)
        if error is not None:
            self._polled_error(error)
        elif polled is not None:
            self._reply_polled(polled)
        return fut

    def _awaited(self, msg: Any) -> bool:
        """Whether a caller waits for the reply to ``msg``."""
        try:
            return request_key(msg) in self._waiters
        except AttributeError:  # a plain value
            return False

    def _spin_for_reply(
        self, worker: ProcessWorker, polled: Any = _NOT_YET, limit: float | None = None
    ) -> Any:
        """Poll for the next reply (`ProcessWorker.reply_within`; None: none came; a
        caller that polled already passes what it got as ``polled``; ``limit``: the most
        seconds the caller may still wait, None for no limit), adapting the budget
        as the child's waits do: a reply caught while spinning restores the full budget;
        a miss quarters it, down to none, and every `PROBE_EVERY`-th miss in a row tries
        the full budget again. A slow actor, or a machine too loaded for the child to
        answer within the budget, so stops costing the loop its budget on every request."""
        spin = self._reply_spin_s
        if spin:
            if polled is _NOT_YET:
                reply = worker.reply_within(spin if limit is None else min(spin, max(limit, 0.0)))
            else:
                reply = polled
            if reply is not None:
                self._reply_spin_s = self._reply_spin_max
                self._reply_misses = 0
                return reply
        self._reply_misses += 1
        if self._reply_misses % PROBE_EVERY == 0:
            self._reply_spin_s = self._reply_spin_max
        else:
            quarter = spin / 4
            self._reply_spin_s = quarter if quarter >= 1e-6 else 0.0
        return None

    def _make_worker(self, bridge: int) -> TierWorker:
        given = "bridge_queue_size" in self.config.extra  # else the bridge may widen
        kwargs: dict[str, Any] = {
            "spin_us": self.config.extra.get("spin_us", self.HOSTED_SPIN_US),
            "input_queue_size": bridge if given else max(bridge, BRIDGE_WIDEST),
            "record_latency": self._timed,
        }
        ring_bytes = self.config.extra.get("ring_bytes")
        if ring_bytes is not None:
            kwargs["ring_bytes"] = ring_bytes
        spin = check_spin_us(
            "reply_spin_us", self.kernel_id, self.config.extra.get("reply_spin_us", 0.0)
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
