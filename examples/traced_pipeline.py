"""One message, one trace: a traced 3-stage pipeline across three tiers, drawn as a picture.

``parse`` runs on the asyncio tier, ``score`` in a child process, ``store`` on a thread;
``RingKernelRuntime(tracing=True)`` records a ``send`` and a ``process`` span per hop with
the OpenTelemetry SDK (an in-memory exporter here; OTLP in production). The script prints
each trace as an indented waterfall and, with ``--svg PATH``, draws the last one as an SVG
timeline (the picture in docs/guides/observability.md comes from this script).

    python examples/traced_pipeline.py --messages 5 --svg trace.svg

Needs the ``observability`` extra (``pip install '.[observability]'`` from a clone: it has
the OpenTelemetry API and SDK).
"""

from __future__ import annotations

import argparse
import asyncio
import html
from pathlib import Path
from typing import Any

from pydotcompute import RingKernelRuntime, message


@message
class Reading:
    sensor: int
    value: float


async def parse(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Reading(sensor=msg.sensor, value=msg.value * 2.0))


def score(ctx: Any) -> None:  # off-loop tiers run a plain function with a blocking context
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.05)
        if msg is not None:
            ctx.send(Reading(sensor=msg.sensor, value=msg.value + 1.0))


def store(ctx: Any) -> None:
    while not ctx.should_terminate:
        msg = ctx.receive(timeout=0.05)
        if msg is not None:
            ctx.send(msg)


STAGES = (("parse", parse, "asyncio"), ("score", score, "process"), ("store", store, "thread"))


async def run(n: int) -> list[Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    async with RingKernelRuntime(tracing=True) as runtime:
        for kid, fn, tier in STAGES:
            await runtime.launch(kid, fn, input_type=Reading, output_type=Reading, tier=tier)
            await runtime.activate(kid)
        runtime.connect("parse", "score")
        # process -> thread could be a direct edge, which carries the trace context in its
        # records but records no `send` span (the runtime never sees the hop): keep this
        # hop on the loop so the picture shows a send and a process span per hop
        runtime.connect("score", "store", direct=False)
        for i in range(n):
            await runtime.send("parse", Reading(sensor=i, value=float(i)))
            await runtime.receive("store", timeout=30)
    return list(exporter.get_finished_spans())


def by_trace(spans: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for span in sorted(spans, key=lambda s: s.start_time):
        out.setdefault(span.context.trace_id, []).append(span)
    return out


def depths(spans: list[Any]) -> dict[int, int]:
    """Each span's depth in its trace (0 for the root)."""
    parent = {s.context.span_id: (s.parent.span_id if s.parent else None) for s in spans}
    out: dict[int, int] = {}
    for s in spans:
        d, p = 0, parent[s.context.span_id]
        while p in parent:
            d, p = d + 1, parent[p]
        out[s.context.span_id] = d
    return out


def waterfall(spans: list[Any]) -> str:
    t0 = min(s.start_time for s in spans)
    depth = depths(spans)
    lines = []
    for s in spans:
        start_us = (s.start_time - t0) / 1e3
        dur_us = (s.end_time - s.start_time) / 1e3
        name = "  " * depth[s.context.span_id] + s.name
        lines.append(f"  {name:<22} {s.kind.name:<8} +{start_us:8.1f} us  {dur_us:8.1f} us")
    return "\n".join(lines)


_TIER = {kid: tier for kid, _, tier in STAGES}
_COLOUR = {"asyncio": "#4C78A8", "process": "#F58518", "thread": "#54A24B"}


def svg(spans: list[Any]) -> str:
    """The trace as an SVG timeline: one row per span, bars placed by start and length."""
    t0 = min(s.start_time for s in spans)
    total = max(s.end_time for s in spans) - t0 or 1
    depth = depths(spans)
    label_w, bar_w, row_h, top = 230, 560, 26, 46
    width, height = label_w + bar_w + 110, top + row_h * len(spans) + 62
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="13">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="22" font-size="15" font-weight="bold">one message through '
        f"parse (asyncio) → score (process) → store (thread): 1 trace, "
        f"{len(spans)} spans</text>",
    ]
    for j, (tier, colour) in enumerate(_COLOUR.items()):  # legend: tier colours
        x = 10 + 170 * j
        out.append(
            f'<rect x="{x}" y="{height - 22}" width="12" height="12" fill="{colour}" rx="2"/>'
        )
        out.append(f'<text x="{x + 18}" y="{height - 12}">process span, {tier} tier</text>')
    out.append(f'<text x="{10 + 170 * 3}" y="{height - 12}" fill="#555">(hollow: send span)</text>')
    for k in range(5):  # a time axis: five ticks
        x = label_w + bar_w * k / 4
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 8}" x2="{x:.1f}" y2="{height - 52}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{height - 36}" text-anchor="middle" fill="#555">'
            f"{total * k / 4 / 1e3:.0f} µs</text>"
        )
    for i, s in enumerate(spans):
        y = top + i * row_h
        kernel = s.name.split(" ", 1)[1]
        colour = _COLOUR[_TIER.get(kernel, "asyncio")]
        x = label_w + bar_w * (s.start_time - t0) / total
        w = max(2.0, bar_w * (s.end_time - s.start_time) / total)
        fill = colour if s.name.startswith("process") else "white"
        indent = 10 + 14 * depth[s.context.span_id]
        out.append(f'<text x="{indent}" y="{y + 17}">{html.escape(s.name)}</text>')
        out.append(
            f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" '
            f'fill="{fill}" stroke="{colour}" stroke-width="2" rx="3"/>'
        )
        dur = (s.end_time - s.start_time) / 1e3
        out.append(f'<text x="{x + w + 6:.1f}" y="{y + 17}" fill="#333">{dur:.1f} µs</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--svg", type=Path, help="draw the last trace here")
    args = parser.parse_args()
    spans = asyncio.run(run(args.messages))
    traces = by_trace(spans)
    for i, group in enumerate(traces.values()):
        kernels = sorted({s.name.split(" ", 1)[1] for s in group if s.name.startswith("process")})
        print(f"trace {i + 1}: {len(group)} spans, process spans of {', '.join(kernels)}")
        print(waterfall(group))
    print(f"{len(traces)} traces for {args.messages} messages")
    if args.svg:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(svg(list(traces.values())[-1]))  # the last: warm
        print(f"picture {args.svg}")


if __name__ == "__main__":
    main()
