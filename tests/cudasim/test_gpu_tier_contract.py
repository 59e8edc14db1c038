"""The tier contract on the GPU tier: ``tests/tier_scenarios.py``'s scenarios, under the
Numba CUDA simulator.

Every scenario of the shared module runs here on ``tier="gpu"``, on both event loops,
listed by ``tests/scenario_base.py`` as for every other tier. A GPU actor is a device
function over fixed-layout messages, so this process runs the scenarios with fixed-layout
twins of their ``Job`` and ``Done`` (same constructor: ``seq``, ``payload``, ``priority``;
the payload's instruction is encoded into two numbers on construction) and a device echo
handler that reads them. Scenarios the GPU tier cannot run skip, naming why (`SKIPS`).
Run in its own process: ``NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cudasim``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime, message
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    QueueTimeoutError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import KernelState
from pydotcompute.testing import all_loops
from tests import tier_scenarios as sc
from tests.gpu_ring_kernel_suite import Add, Sum, add_handler, launch_gpu
from tests.scenario_base import scenario_params

pytest.importorskip("numba.cuda")

pytestmark = all_loops()

# payload instructions, as the device handler reads them: payload[0] is the operation
_ECHO, _BOOM, _SLEEP, _RETURN = 0.0, 1.0, 2.0, 3.0


def _encode(payload: Any) -> np.ndarray:
    """A scenario's payload string as ``[operation, argument]``."""
    if isinstance(payload, np.ndarray):
        return payload
    text = str(payload)
    if text == "boom":
        return np.array([_BOOM, 0.0])
    for prefix, op in (("sleep:", _SLEEP), ("return:", _RETURN)):
        if text.startswith(prefix):
            return np.array([op, float(text[len(prefix) :])])
    return np.array([_ECHO, 0.0])  # any other payload is data: echoed


@message
class GpuJob:
    seq: int
    payload: Annotated[np.ndarray, (2,), np.float64] = ""  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.payload = _encode(self.payload)


@message
class GpuDone:
    seq: int


def gpu_echo(inp: Any, out: Any, state: Any) -> int:
    """The device echo actor: ``boom`` faults (under the simulator, the device function
    raises), ``sleep:<s>`` takes that long; every other message is answered with its seq."""
    op = inp.payload[0]
    if op == _BOOM:
        raise ValueError("boom")
    if op == _SLEEP:
        time.sleep(inp.payload[1])  # the simulator runs the device function in Python
    out.seq = inp.seq
    return 0


async def _async_actor(ctx: Any) -> None:  # not a device handler
    await ctx.receive()


GPU = sc.TierCase("gpu", gpu_echo, _async_actor, options=(("block_size", 1),))

#: Scenarios the GPU tier cannot run, and why: each needs an actor a device handler cannot
#: be (`scenario_base` adds the rules of every tier file: the restart policy, pools).
#: Everything else (the bridge's delivery, correlation, forwarding, accounting, batched
#: hand-over) is the same code on every hosted tier and runs here.
SKIPS: dict[str, dict[str, str]] = {
    "gpu": {
        "actor_returns_by_itself": (
            "a device handler cannot end the persistent kernel: it runs until terminated"
        ),
        "abandoned_requests_bounded": (
            "needs an actor that never replies: the device answers every message, with a "
            "reply or a rejection that ends its request"
        ),
        "producer_actor_yields": (
            "a device handler answers each message with exactly one reply, never a burst"
        ),
        "factory_message_keeps_its_class": (
            "the factory's message classes carry str fields: no fixed layout for the GPU rings"
        ),
        "value_too_deep_refused_at_send": (
            "nested values have no fixed layout: the GPU tier refuses such a class at launch"
        ),
        "failed_message_spans_say_so": (
            "a device handler cannot raise on a message (it rejects it: a counted drop, not "
            "an actor failure), so no process span is failed"
        ),
        "typed_kernel_gets_its_own_class": (
            "the factory's message classes carry str fields: no fixed layout for the GPU "
            "rings (a replaced class is refused at launch on every tier: "
            "test_replaced_class_refused_at_launch below)"
        ),
        "reload_is_one_rule_on_every_tier": (
            "needs a Python actor that sends back what it receives; a device handler is "
            "compiled for one input and one output class"
        ),
        "answered_message_in_hand_is_not_handed_back": (
            "a device handler's reply is the end of its message: it cannot hold a message "
            "after answering it"
        ),
        "wrong_field_type_refused_in_ctx_send": (
            "a device handler writes its reply into a fixed-layout record: it has no ctx.send"
        ),
    },
}

#: Scenarios the GPU tier does not pass yet, and why (strict: a pass is reported).
GAPS: dict[str, dict[str, str]] = {}


@pytest.fixture(autouse=True)
def _fixed_layout_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenarios build ``Job``/``Done`` from their module: use the fixed-layout twins."""
    monkeypatch.setattr(sc, "Job", GpuJob)
    monkeypatch.setattr(sc, "Done", GpuDone)


@pytest.mark.parametrize(("scenario", "case", "kwargs"), scenario_params({"gpu": GPU}, SKIPS, GAPS))
async def test_scenario(scenario: Any, case: sc.TierCase, kwargs: dict[str, Any]) -> None:
    await scenario(case, **kwargs)


# --- GPU-only: what the shared scenarios do not cover ----------------------------------------


def _state() -> np.ndarray:
    return np.zeros(1, np.int64)


async def test_restart_is_refused_at_launch_with_a_device_handler() -> None:
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        with pytest.raises(
            InvalidConfigurationError, match="restart='on_failure' is not supported on the gpu"
        ):
            await launch_gpu(rt, "add", add_handler, Add, Sum, state=_state(), restart="on_failure")
        assert "add" not in rt


async def test_abandoned_replies_of_a_deactivated_kernel_are_dropped_and_counted() -> None:
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        await launch_gpu(rt, "add", add_handler, Add, Sum, state=_state(), queue_size=8)
        await rt.deactivate("add")  # no reply can come while it waits
        for i in range(8):
            try:
                await rt.send_and_receive("add", Add(a=float(i), b=0.0), timeout=0.01)
            except QueueTimeoutError:
                pass
        await rt.reactivate("add")
        reply = await rt.send_and_receive("add", Add(a=1.0, b=2.0), timeout=20)
        assert reply.total == 3.0
        assert rt.receive_nowait("add") is None  # no stale reply in the outbox
        assert rt.get_telemetry("add").messages_dropped == 8  # counted as they came
        assert rt.get_kernel_state("add") is KernelState.ACTIVE


# --- round 4: message types ---


async def test_replaced_class_refused_at_launch() -> None:
    """A fixed-layout class another class of its name took the wire tag from is refused
    as the GPU kernel's input_type, as on every tier."""

    def make() -> type:
        @message
        class Reading:
            value: float

        return Reading

    first, second = make(), make()  # one name and layout: the second takes the tag
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        with pytest.raises(TypeValidationError, match=r"input_type .*Reading .*reloaded"):
            await launch_gpu(rt, "g", add_handler, first, Sum, state=_state())
        assert "g" not in rt
    assert second is not first


async def test_unchecked_fields_are_refused_when_packed() -> None:
    """check_fields=False: the GPU tier still refuses a wrongly typed field where NumPy
    packs the record (behind the bridge, as the process tier where it encodes): dropped,
    counted and logged, and the kernel keeps serving; the default refuses it at send with
    the field check's words, as every tier does."""
    async with asyncio.timeout(sc.BOUND_S), RingKernelRuntime() as rt:
        await launch_gpu(rt, "add", add_handler, Add, Sum, state=_state())
        with pytest.raises(TypeValidationError, match=r"field 'a' expects float, got str"):
            await rt.send("add", Add(a="x", b=1.0))  # type: ignore[arg-type]
        await launch_gpu(rt, "raw", add_handler, Add, Sum, state=_state(), check_fields=False)
        await rt.send("raw", Add(a="x", b=1.0))  # type: ignore[arg-type]
        reply = await rt.send_and_receive("raw", Add(a=1.0, b=2.0), timeout=20)
        assert reply.total == 3.0
        tel = rt.get_telemetry("raw")
        assert tel.messages_dropped == 1, tel
        assert "cannot pack Add" in (tel.last_error or ""), tel.last_error
