"""Messages and ring kernels the Ray tests launch.

Ray workers import this module by name (the session fixture ships it with
``runtime_env={"py_modules": [...]}``), so every actor here is a module-level function.
"""

from __future__ import annotations

import asyncio
import os

from pydotcompute import message, ring_kernel


@message
class Num:
    value: int


@message
class Doubled:
    value: int


@message
class Text:
    text: str


@ring_kernel(kernel_id="rt_double", input_type=Num, output_type=Doubled)
async def double_actor(ctx):
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Doubled(value=msg.value * 2))


@ring_kernel(kernel_id="rt_inc", input_type=Doubled, output_type=Num)
async def inc_actor(ctx):
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Num(value=msg.value + 1))


async def slow_double(ctx):
    """Doubles, taking a little time per message (to build queues)."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await asyncio.sleep(0.002)
        await ctx.send(Doubled(value=msg.value * 2))


async def replies_plain(ctx):
    """Untyped: answers with a plain dict, which cannot cross to the driver."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send({"value": msg.value})


async def fail_on_negative(ctx):
    """Raises ValueError on a negative number."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        if msg.value < 0:
            raise ValueError(f"negative value {msg.value}")
        await ctx.send(Doubled(value=msg.value * 2))


async def crash_on_negative(ctx):
    """Takes the whole worker process down on a negative number (a lost node)."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        if msg.value < 0:
            os._exit(3)
        await ctx.send(Doubled(value=msg.value * 2))


async def relay_to_sink(ctx):
    """Sends every Num on to the kernel called 'sink' with ctx.send_to."""
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send_to("sink", Num(value=msg.value + 1000))


async def return_after_one(ctx):
    """Answers one message, then returns."""
    msg = await ctx.receive()
    await ctx.send(Doubled(value=msg.value * 2))


@ring_kernel(
    kernel_id="rt_where", input_type=Num, output_type=Text, num_cpus=1, resources={"pdc_slot": 1}
)
async def where_am_i(ctx):
    """Replies with the Ray node id, the worker's pid and the resources Ray assigned."""
    import ray

    context = ray.get_runtime_context()
    node = context.get_node_id()
    while not ctx.should_terminate:
        await ctx.receive()
        assigned = dict(sorted(context.get_assigned_resources().items()))
        await ctx.send(Text(text=f"{node}|{os.getpid()}|{assigned}"))


async def numbering(ctx):
    """Answers each message with how many it took before it: the order of admission."""
    taken = 0
    while not ctx.should_terminate:
        await ctx.receive()
        await ctx.send(Num(value=taken))
        taken += 1


# --- trace context ---


@message
class SeenTrace:
    """The trace context current while an actor handled message ``value`` (W3C hex)."""

    value: int
    trace_id: str
    span_id: str


async def report_trace(ctx):
    """Answers each Num with the trace context current while handling it."""
    from opentelemetry import trace

    while not ctx.should_terminate:
        msg = await ctx.receive()
        sc = trace.get_current_span().get_span_context()
        await ctx.send(
            SeenTrace(value=msg.value, trace_id=f"{sc.trace_id:032x}", span_id=f"{sc.span_id:016x}")
        )


async def pass_num(ctx):
    """Sends on each Num it receives (to the kernel it is connected to)."""
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


async def hogs_its_loop(ctx):
    """Blocks its actor's event loop ``value`` milliseconds per message (a busy actor that
    answers no Ray call meanwhile), then doubles it."""
    import time

    while not ctx.should_terminate:
        msg = await ctx.receive()
        time.sleep(msg.value / 1000)
        await ctx.send(Doubled(value=msg.value * 2))
