"""Instruments: the hooks the runtime calls (`ring_kernels/instruments.py`), and the
promise that observing changes nothing: no method of a live object is replaced, a plain
runtime's actors get plain contexts, and a faulty instrument cannot break a send."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import QueueFullError, TypeValidationError
from pydotcompute.ring_kernels import Instrument, KernelContext

BOUND_S = 20.0


@message
class Ping:
    n: int


class Events(Instrument):
    """Records (hook, kernel id, message n or None) for the hooks these tests look at."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def _n(self, msg: Any) -> Any:
        return getattr(msg, "n", msg)

    def message_sending(self, kernel: Any, msg: Any) -> None:
        self.seen.append(("sending", kernel.kernel_id, self._n(msg)))

    def message_sent(self, kernel: Any, msg: Any, error: BaseException | None) -> None:
        what = "sent" if error is None else f"refused:{type(error).__name__}"
        self.seen.append((what, kernel.kernel_id, self._n(msg)))

    def message_taken(self, kernel: Any, msg: Any) -> None:
        self.seen.append(("taken", kernel.kernel_id, self._n(msg)))

    def message_finished(self, kernel: Any, msg: Any) -> None:
        self.seen.append(("finished", kernel.kernel_id, self._n(msg)))


async def relay(ctx: Any) -> None:
    while True:
        await ctx.send(Ping(n=(await ctx.receive()).n + 100))


async def test_an_asyncio_pipeline_is_reported_hop_by_hop() -> None:
    events = Events()
    async with asyncio.timeout(BOUND_S), RingKernelRuntime(instruments=[events]) as rt:
        for kid in "ab":
            await rt.launch(kid, relay, input_type=Ping, output_type=Ping)
            await rt.activate(kid)
        rt.connect("a", "b")
        await rt.send("a", Ping(n=1))
        assert (await rt.receive("b", timeout=BOUND_S)).n == 201
        # a reply to a caller goes to the caller: no send into b is reported for it
        assert (await rt.send_and_receive("a", Ping(n=2), timeout=BOUND_S)).n == 102
    seen = events.seen
    for kid, n in (("a", 1), ("b", 101)):  # each hop: sent, taken, then finished
        hop = [e[0] for e in seen if e[1:] == (kid, n)]
        assert hop == ["sending", "sent", "taken", "finished"], (kid, hop)
    # a's actor sent into the kernel it is connected to while it held message 1
    at = seen.index
    assert at(("taken", "a", 1)) < at(("sending", "b", 101)) < at(("finished", "a", 1))
    assert ("sending", "b", 102) not in events.seen


async def test_a_refused_send_is_reported_with_its_error() -> None:
    events = Events()
    async with asyncio.timeout(BOUND_S), RingKernelRuntime(instruments=[events]) as rt:
        await rt.launch("k", relay, input_type=Ping, queue_size=1, backpressure="reject")
        await rt.send("k", Ping(n=1))
        with pytest.raises(QueueFullError):
            await rt.send("k", Ping(n=2))
        with pytest.raises(QueueFullError):
            rt.send_nowait("k", Ping(n=3))
    assert [e for e in events.seen if e[0] != "sending"][:3] == [
        ("sent", "k", 1),
        ("refused:QueueFullError", "k", 2),
        ("refused:QueueFullError", "k", 3),
    ]


class Faulty(Instrument):
    def message_sending(self, kernel: Any, msg: Any) -> None:
        raise RuntimeError("a bug in an instrument")


async def test_an_instrument_that_raises_is_logged_and_removed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faulty, events = Faulty(), Events()
    async with asyncio.timeout(BOUND_S), RingKernelRuntime(instruments=[faulty, events]) as rt:
        await rt.launch("k", relay, input_type=Ping, output_type=Ping)
        await rt.activate("k")
        with caplog.at_level(logging.ERROR, "pydotcompute"):
            await rt.send("k", Ping(n=1))  # the send itself goes through
        assert (await rt.receive("k", timeout=BOUND_S)).n == 101
        assert list(rt.instruments) == [events]
    assert "a bug in an instrument" in caplog.text
    assert "removed" in caplog.text
    assert ("sent", "k", 1) in events.seen  # the other instrument still heard it


async def test_installing_checks_the_type_and_adds_once() -> None:
    events = Events()
    async with RingKernelRuntime() as rt:
        with pytest.raises(TypeValidationError, match="takes an Instrument"):
            rt.add_instrument(print)  # type: ignore[arg-type]
        rt.add_instrument(events)
        rt.add_instrument(events)
        assert list(rt.instruments) == [events]
        rt.remove_instrument(events)
        rt.remove_instrument(events)
        assert list(rt.instruments) == []


async def test_observing_replaces_nothing_and_a_plain_runtime_checks_nothing() -> None:
    """A plain runtime's actor gets the plain context; an instrumented one's a subclass
    chosen at launch. Neither runtime has a method of its own instance shadowing its
    class's (tracing once replaced ``runtime.send``)."""
    contexts: dict[str, type] = {}

    async def report(ctx: Any) -> None:
        contexts[ctx.kernel_id] = type(ctx)
        await ctx.receive()

    async with asyncio.timeout(BOUND_S):
        async with RingKernelRuntime() as plain:
            await plain.launch("p", report)
            await plain.activate("p")
            await asyncio.sleep(0)
            assert not plain.instruments
            for name in ("send", "send_and_receive", "send_nowait"):
                assert name not in vars(plain)
        async with RingKernelRuntime(instruments=[Events()]) as observed:
            await observed.launch("o", report)
            await observed.activate("o")
            await asyncio.sleep(0)
            for name in ("send", "send_and_receive", "send_nowait"):
                assert name not in vars(observed)
    assert contexts["p"] is KernelContext
    assert issubclass(contexts["o"], KernelContext)
    assert contexts["o"] is not KernelContext
