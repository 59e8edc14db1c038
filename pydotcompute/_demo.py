"""The quick-start actor from the README, runnable as ``python -m pydotcompute demo``."""

from __future__ import annotations

import time
from typing import Any

from . import RingKernelRuntime, message, ring_kernel, run


@message
class ComputeRequest:
    values: list[float]


@message
class ComputeResponse:
    result: float


@ring_kernel(kernel_id="demo_compute", input_type=ComputeRequest, output_type=ComputeResponse)
async def compute_actor(ctx) -> None:  # type: ignore[no-untyped-def]
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(ComputeResponse(result=sum(msg.values)))


async def _main() -> None:
    async with RingKernelRuntime() as runtime:
        await runtime.launch("demo_compute")
        await runtime.activate("demo_compute")
        await runtime.send("demo_compute", ComputeRequest(values=[1.0, 2.0, 3.0]))
        response = await runtime.receive("demo_compute")
        print(f"sum([1.0, 2.0, 3.0]) computed by the actor: {response.result}")
        n = 10_000
        t0 = time.perf_counter()
        for i in range(n):
            await runtime.send("demo_compute", ComputeRequest(values=[float(i)]))
            await runtime.receive("demo_compute")
        dt = time.perf_counter() - t0
        print(f"{n} request/response round trips: {dt / n * 1e6:.1f} us each")
        tel = runtime.get_counters("demo_compute")
        print(
            f"telemetry: processed={tel.messages_processed} "
            f"p50={tel.p50_latency_ns / 1000:.1f} us p99={tel.p99_latency_ns / 1000:.1f} us"
        )
        print(f"loop: {describe_loop(runtime.get_loop_info())}")


def describe_loop(info: dict[str, Any]) -> str:
    """``"uvloop (Loop)"`` or ``"asyncio (_UnixSelectorEventLoop)"``: which event loop runs,
    by its module (uvloop's class is just called ``Loop``)."""
    module = str(info.get("loop_module") or "")
    kind = "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"
    return f"{kind} ({info.get('loop_type')})"


def main() -> int:
    run(_main())
    return 0
