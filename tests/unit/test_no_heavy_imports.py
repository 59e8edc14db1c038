"""``import pydotcompute`` (and tier-1 use) imports no CuPy, Numba, MLX, NVML or Ray, and
none of the observability packages (Prometheus client, OpenTelemetry, rich).

Each check runs in a fresh interpreter and compares ``sys.modules`` before and after, so
modules a site hook loads at start-up do not count against the package.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from foundation_helpers import run_python

HEAVY = (
    "cupy",
    "numba",
    "numba_cuda",
    "mlx",
    "pynvml",
    "ray",
    "prometheus_client",
    "opentelemetry",
    "rich",
)

PROLOGUE = """
    import json, sys
    HEAVY = {heavy!r}
    before = set(sys.modules)
"""
EPILOGUE = """
    new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in HEAVY)
    print(json.dumps(new))
"""

SCENARIOS = {
    "import": "import pydotcompute",
    "ring_kernels": "import pydotcompute.ring_kernels, pydotcompute.decorators",
    "observability package": "import pydotcompute.observability",
    "tier-1 round trip": """
        import asyncio
        import numpy as np
        from pydotcompute import RingKernelRuntime, message, ring_kernel
        from pydotcompute.ring_kernels import FastMessageQueue, MessageQueue, deserialize_message

        @message
        class Req:
            values: list[float]
            arr: np.ndarray

        @message
        class Resp:
            result: float

        @ring_kernel(kernel_id="sum", input_type=Req, output_type=Resp)
        async def actor(ctx):
            while not ctx.should_terminate:
                msg = await ctx.receive()
                await ctx.send(Resp(result=sum(msg.values) + float(msg.arr.sum())))

        async def main():
            async with RingKernelRuntime() as rt:
                await rt.launch("sum")
                await rt.activate("sum")
                req = Req(values=[1.0, 2.0], arr=np.ones(3))
                deserialize_message(req.serialize())
                reply = await rt.send_and_receive("sum", req, timeout=10)
                assert reply.result == 6.0, reply
                rt.get_telemetry("sum")

        asyncio.run(main())
        FastMessageQueue(4)
        MessageQueue(4)
    """,
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_heavy_modules_are_imported(scenario: str) -> None:
    code = (
        textwrap.dedent(PROLOGUE.format(heavy=HEAVY))
        + textwrap.dedent(SCENARIOS[scenario])
        + textwrap.dedent(EPILOGUE)
    )
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"{scenario} imported {loaded}"
