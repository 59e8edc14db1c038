"""Declared capabilities: each tier states once what it supports (`Capabilities`), the
runtime reads those flags and never probes an object for a method, and the table in
docs/concepts/tiers.md says what the classes say."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.exceptions import InvalidConfigurationError
from pydotcompute.ring_kernels.extend import (
    Capabilities,
    HostedKernel,
    RingKernel,
    TierWorker,
    register_tier,
    tier_class,
    unregister_tier,
)
from pydotcompute.ring_kernels.pool import pool_class

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("asyncio", "thread", "process", "gpu", "ray")


def docs_table() -> dict[str, dict[str, str]]:
    """The capabilities table of docs/concepts/tiers.md: tier -> column -> cell."""
    lines = (ROOT / "docs/concepts/tiers.md").read_text("utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if "capabilities table" in line) + 1
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


def as_cells(caps: Capabilities) -> dict[str, str]:
    """``caps`` written as the docs table writes it."""
    yes = {True: "yes", False: "no"}
    kind = "checked by the tier" if caps.actor_kind is None else caps.actor_kind
    return {
        "actor": kind,
        "restart": yes[caps.restart],
        "replicas": yes[caps.replicas],
        "resize": yes[caps.resize],
        "inline_request": yes[caps.inline_request],
        "edges_out": ", ".join(sorted(caps.edges_out)),
        "edges_in": ", ".join(sorted(caps.edges_in)),
        "telemetry_refresh": yes[caps.telemetry_refresh],
        "trace_wire": yes[caps.trace_wire],
    }


@pytest.mark.parametrize("tier", TIERS)
def test_the_docs_table_is_what_each_tier_states(tier: str) -> None:
    row = docs_table()[tier]
    del row["tier"]
    assert as_cells(tier_class(tier).CAPABILITIES) == row


@pytest.mark.parametrize("tier", ["asyncio", "thread", "process"])
def test_a_pool_broadcasts_reports_each_replica_and_has_its_members_edges(tier: str) -> None:
    caps = pool_class("k", tier, tier_class(tier), 2).CAPABILITIES
    on = {"broadcast", "replica_telemetry", "telemetry_refresh"}
    off = {"resize", "inline_request", "short_poll_rearms"}
    assert all(getattr(caps, flag) for flag in on)
    assert not any(getattr(caps, flag) for flag in off)
    tier_caps = tier_class(tier).CAPABILITIES
    assert (caps.actor_kind, caps.restart) == (tier_caps.actor_kind, tier_caps.restart)
    # one direct edge per replica (`pool_edges.py`): the members' kinds
    edges = (caps.edges_out, caps.edges_in, caps.edges_spread)
    assert edges == (tier_caps.edges_out, tier_caps.edges_in, tier_caps.edges_spread)


def test_a_hosted_tier_takes_its_workers_capabilities() -> None:
    class Worker(TierWorker):  # (abstract: never built here)
        CAPABILITIES = Capabilities(actor_kind="async", restart=True)

    class Kernel(HostedKernel):
        WORKER = Worker

    assert Kernel.CAPABILITIES is Worker.CAPABILITIES
    with pytest.raises(dataclasses.FrozenInstanceError):
        Kernel.CAPABILITIES.restart = False  # type: ignore[misc]


def test_the_older_attribute_names_are_folded_in_once() -> None:
    """A tier written before `Capabilities` keeps meaning what it said; the names are not
    left behind for anything to read."""

    class OldWorker(TierWorker):
        ACTOR_KIND = "async"
        SUPPORTS_RESTART = True
        EDGE_OUT = frozenset({"objects"})
        SUPPORTS_INLINE_REQUEST = True

    class OldKernel(HostedKernel):
        SUPPORTS_POOL = False

    stated = Capabilities(
        actor_kind="async", restart=True, edges_out=frozenset({"objects"}), inline_request=True
    )
    assert stated == OldWorker.CAPABILITIES
    assert not hasattr(OldWorker, "ACTOR_KIND")
    assert not hasattr(OldWorker, "SUPPORTS_INLINE_REQUEST")
    assert OldKernel.CAPABILITIES.replicas is False
    assert HostedKernel.CAPABILITIES.replicas is True  # the base is untouched


# --- the runtime reads the flags, and the base class's default applies -----------------


class Quiet(HostedKernel):
    """The thread tier's kernel, stating that it has nothing to fold into telemetry and
    cannot restart: whatever methods it has, the runtime must not call them."""

    CAPABILITIES = dataclasses.replace(
        tier_class("thread").CAPABILITIES, telemetry_refresh=False, replicas=False
    )
    refreshed = 0

    def _make_worker(self, bridge: int) -> TierWorker:
        return tier_class("thread")._make_worker(self, bridge)  # type: ignore[no-any-return]

    def refresh_telemetry(self) -> None:
        type(self).refreshed += 1


def echo(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.05)
        if msg is not None:
            ctx.send(msg)


async def test_a_flag_that_is_off_is_never_acted_on() -> None:
    register_tier("quiet", Quiet)
    try:
        async with asyncio.timeout(20), RingKernelRuntime() as rt:
            await rt.launch("q", echo, tier="quiet")
            await rt.activate("q")
            assert await rt.broadcast("q", 7) == 1  # one actor: a plain send
            assert await rt.receive("q", timeout=5) == 7
            rt.get_telemetry("q")
            assert rt.get_replica_telemetry("q") == [rt.get_telemetry("q")]
            assert Quiet.refreshed == 0
            with pytest.raises(InvalidConfigurationError, match="replicas=2 is not supported"):
                await rt.launch("p", echo, tier="quiet", replicas=2)
            with pytest.raises(InvalidConfigurationError, match="restart='on_failure'"):
                await rt.launch("r", echo, tier="quiet", restart="on_failure")
    finally:
        unregister_tier("quiet")


def test_the_defaults_of_a_kernel_without_the_capability() -> None:
    kernel = RingKernel("k", echo)
    assert kernel.worker is None
    assert kernel.replica_telemetry() == [kernel.telemetry]
    kernel.refresh_telemetry()  # nothing to fold, no error


# --- nothing probes -----------------------------------------------------------------------

#: Attribute names the runtime, the bridge and the observability modules once looked for
#: with getattr/hasattr instead of reading a declared capability.
PROBED = {
    "ACTOR_KIND",
    "SUPPORTS_RESTART",
    "SUPPORTS_POOL",
    "EDGE_OUT",
    "EDGE_IN",
    "SUPPORTS_INLINE_REQUEST",
    "SHORT_POLL_REARMS",
    "EDGE_SPREAD",
    "edge_fit",
    "edge_replicas",
    "broadcast",
    "hurry",
    "refresh_telemetry",
    "messages_received",
    "replica_telemetry",
    "member_telemetry",
    "unread_replies",
    "trace_wire",
    "wrap_worker",
    "worker",
    "offer",
    "on_drop_item",
    "tracer",
    "lost_with_actor",
    "release",
    "failed_requests",
}
POLICY = [
    "ring_kernels/runtime.py",
    "ring_kernels/kernel.py",
    "ring_kernels/context.py",
    "ring_kernels/hosted.py",
    "ring_kernels/pool.py",
    "ring_kernels/edges.py",
    "ring_kernels/tiers/process/hosted.py",
    "ring_kernels/tiers/thread/hosted.py",
    "ring_kernels/tiers/ray/kernel.py",
    "ring_kernels/tiers/ray/runtime.py",
    "ring_kernels/tiers/ray/host.py",
    "observability/metrics.py",
    "observability/tracing.py",
]


@pytest.mark.parametrize("path", POLICY)
def test_no_capability_is_probed_for(path: str) -> None:
    tree = ast.parse((ROOT / "pydotcompute" / path).read_text("utf-8"))
    probes = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in PROBED
    ]
    assert probes == [], "\n".join(probes)


def test_the_spec_documents_every_flag() -> None:
    doc = Capabilities.__doc__ or ""
    for field in dataclasses.fields(Capabilities):
        assert re.search(rf"^\s+{field.name}:", doc, re.M), field.name
