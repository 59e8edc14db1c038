"""Vector addition three ways: a backend kernel, a compiled ``@kernel`` and an actor.

1. ``UnifiedBuffer`` + a backend's vector-add kernel: fill the host side, mark it dirty,
   ``ensure_on_device()`` copies it over, the kernel runs on the device arrays, and reading
   ``.host`` after ``mark_device_dirty()`` copies the result back. The same code runs on every
   available backend (CPU always; MLX when the ``metal`` extra is installed; CUDA on a GPU).
2. ``@kernel``: an element-wise loop compiled once (Numba's CPU JIT when installed) and
   cached; the second call runs the compiled code.
3. A ring-kernel actor that owns its output buffer and answers ``AddRequest`` messages.
   Inside one process a message carries its arrays by reference: no serialization, no copy.

Run: ``python examples/vector_add.py [--size N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from pydotcompute import KernelContext, RingKernelRuntime, UnifiedBuffer, kernel, message, run
from pydotcompute.backends import available_backends, get_backend
from pydotcompute.backends.cpu import numba_available


async def with_backends(n: int) -> None:
    """Part 1: the backend vector-add kernel over unified buffers on each backend."""
    a_np = np.arange(n, dtype=np.float32)
    b_np = np.full(n, 2.0, dtype=np.float32)
    expected = a_np + b_np
    for name in available_backends():
        if name == "metal":
            continue  # MLX arrays are immutable (no ``out=``): see the compiled kernel below
        backend = get_backend(name)
        a = UnifiedBuffer((n,), dtype=np.float32, backend=name).allocate()
        b = UnifiedBuffer((n,), dtype=np.float32, backend=name).allocate()
        out = UnifiedBuffer((n,), dtype=np.float32, backend=name).allocate()
        a.host[:] = a_np
        b.host[:] = b_np
        a.mark_host_dirty()
        b.mark_host_dirty()
        await a.ensure_on_device()
        await b.ensure_on_device()
        add = backend.get_vector_add_kernel()
        result = backend.execute_kernel(add, (n + 255) // 256, 256, a.device, b.device, out.device)
        backend.synchronize()
        out.mark_device_dirty()
        ok = np.allclose(out.host, expected)
        print(
            f"  [{name}] a + b over {n:,} floats in {result.execution_time_ms:.3f} ms: "
            f"{'correct' if ok else 'WRONG'}; buffer state {out.state.name}"
        )
        for buf in (a, b, out):
            buf.free()
    if "metal" in available_backends():
        metal = get_backend("metal")
        twice_plus_one = metal.compile_kernel(lambda x: x * 2 + 1)
        y = np.asarray(twice_plus_one(metal.copy_to_device(a_np)))
        ok = np.allclose(y, a_np * 2 + 1)
        print(
            f"  [metal] compiled x * 2 + 1 over {n:,} floats with MLX: "
            f"{'correct' if ok else 'WRONG'}"
        )


@kernel
def saxpy(a: np.ndarray, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
    for i in range(out.shape[0]):
        out[i] = a[0] * x[i] + y[i]


def with_kernel_decorator(n: int) -> None:
    """Part 2: an explicit loop compiled once by ``@kernel``."""
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    out = np.empty_like(x)
    a = np.array([3.0], dtype=np.float32)
    t0 = time.perf_counter()
    saxpy(a, x, y, out)  # first call compiles (when Numba is installed)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    saxpy(a, x, y, out)
    second = time.perf_counter() - t0
    ok = np.allclose(out, 3.0 * x + y)
    if numba_available():
        how = f"first call {first * 1e3:.1f} ms (compile + run), second {second * 1e3:.2f} ms"
    else:
        how = (
            f"Numba is not installed, so nothing was compiled: plain Python, "
            f"{first * 1e3:.1f} ms then {second * 1e3:.1f} ms"
        )
    print(f"  @kernel saxpy over {n:,} floats: {how}: {'correct' if ok else 'WRONG'}")


@message
class AddRequest:
    a: np.ndarray
    b: np.ndarray


@message
class AddResult:
    total: float
    out: np.ndarray


async def vector_adder(ctx: KernelContext) -> None:
    """Adds the two arrays of each request into a buffer it owns across messages."""
    out = np.empty(0, dtype=np.float32)
    while not ctx.should_terminate:
        req = await ctx.receive()
        if out.shape != req.a.shape:
            out = np.empty(req.a.shape, dtype=np.result_type(req.a, req.b))
        np.add(req.a, req.b, out=out)
        await ctx.send(AddResult(total=float(out.sum()), out=out))


async def with_actor(n: int) -> None:
    """Part 3: the same addition as a request/response actor."""
    async with RingKernelRuntime() as runtime:
        await runtime.launch("adder", vector_adder, input_type=AddRequest, output_type=AddResult)
        await runtime.activate("adder")
        for size in (1, n):
            a = np.ones(size, dtype=np.float32)
            b = np.full(size, 2.0, dtype=np.float32)
            t0 = time.perf_counter()
            reply = await runtime.send_and_receive("adder", AddRequest(a=a, b=b), timeout=5.0)
            dt = time.perf_counter() - t0
            print(
                f"  actor added {size:,} elements in {dt * 1e6:.0f} us: total {reply.total:,.0f} "
                f"(expected {3.0 * size:,.0f})"
            )


async def main(n: int = 1_000_000) -> None:
    print(f"1. backend kernels on unified buffers (backends here: {available_backends()})")
    await with_backends(n)
    print("2. a compiled @kernel")
    await asyncio.to_thread(with_kernel_decorator, n)
    print("3. a ring-kernel actor")
    await with_actor(n)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1_000_000)
    args = ap.parse_args()
    run(main(args.size))
