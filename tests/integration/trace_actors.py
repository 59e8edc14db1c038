"""Actors of the trace-context tests (module-level so a child process can import them).

Importing this module in a child process installs an SDK tracer provider there (when
the SDK is present), the way a user records spans of their own inside a process actor.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from pydotcompute import message

from .tier_actors import Job  # the child decodes the Jobs these actors take

__all__ = ("Job", "Seen", "idle", "report_context", "report_then_idle", "span_of_its_own")

try:
    from opentelemetry.sdk.trace import TracerProvider
except ImportError:  # pragma: no cover - the SDK is a test dependency
    TracerProvider = None

if TracerProvider is not None and not isinstance(trace.get_tracer_provider(), TracerProvider):
    trace.set_tracer_provider(TracerProvider())  # records spans; this child exports none


@message
class Seen:
    """What an actor saw while handling the message ``seq``: ids as hex, as W3C writes
    them (``parent``: the parent span id of a span the actor made, else empty)."""

    seq: int
    trace_id: str
    span_id: str
    parent: str = ""


def _seen(seq: int, span: Any, parent: str = "") -> Seen:
    ctx = span.get_span_context()
    return Seen(
        seq=seq, trace_id=f"{ctx.trace_id:032x}", span_id=f"{ctx.span_id:016x}", parent=parent
    )


def report_context(ctx: Any) -> None:
    """Answers each Job with the trace context current while handling it."""
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is not None:
            ctx.send(_seen(job.seq, trace.get_current_span()))


def span_of_its_own(ctx: Any) -> None:
    """Handles each Job in a span of its own and answers inside it: the answer carries
    that span's context, and says which span it was and what its parent was."""
    tracer = trace.get_tracer("trace_actors")
    while not ctx.should_terminate:
        job = ctx.receive(timeout=0.05)
        if job is None:
            continue
        with tracer.start_as_current_span("work") as span:
            parent = span.parent  # type: ignore[attr-defined]
            ctx.send(_seen(job.seq, span, "" if parent is None else f"{parent.span_id:016x}"))


def idle(ctx: Any) -> None:
    """Takes nothing: what is sent stays in the inbox ring."""
    ctx.wait_shutdown()


def report_then_idle(ctx: Any) -> None:
    """Answers its first Job with the context current while handling it; then, once a
    receive finds nothing, answers ``seq=-1`` with the context current then."""
    job = None
    while job is None:
        job = ctx.receive(timeout=0.05)
    ctx.send(_seen(job.seq, trace.get_current_span()))
    while ctx.receive(timeout=0.05) is not None:
        pass
    ctx.send(_seen(-1, trace.get_current_span()))
    ctx.wait_shutdown()
