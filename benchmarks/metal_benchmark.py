"""MLX (the ``metal`` backend) against NumPy: matrix multiply and elementwise kernels.

What it measures, float32 throughout:

- matrix multiply ``a @ b`` for square sizes (GFLOP/s = 2 n^3 / time): NumPy (BLAS) against
  the backend's ``get_matrix_multiply_kernel()`` on MLX arrays;
- elementwise ``x * 2 + 1`` over 1 M to 16 M elements (GB/s = bytes read + written / time):
  NumPy against the same lambda compiled by ``MetalBackend.compile_kernel`` (``mx.compile``,
  which fuses the two operations into one pass) and against uncompiled MLX;
- the cost of moving the input in (``copy_to_device``) and the result out
  (``copy_to_host``), which a kernel launched per call would pay every time.

Every MLX timing forces evaluation (``mx.eval``), so the time is the work, not the graph
construction. Each figure is the best of several runs (timings of NumPy and MLX alternate).
The ratio column is MLX / NumPy (higher is better). On Linux MLX runs on the CPU (the
``mlx[cpu]`` build); on Apple silicon it runs on the GPU through Metal, and the table says
which.

Run ``python benchmarks/metal_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from _common import print_table, save_json
from _suite import chart_path, pyplot, save_figure, summary_row

from pydotcompute.backends import MetalBackend


def best_of(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Best wall time of each function, calls alternating between them."""
    for fn in fns.values():
        fn()  # warm-up (and compilation)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def measure(quick: bool) -> dict[str, Any]:
    backend = MetalBackend()
    if not backend.is_available:
        return {"available": False, "reason": backend.unavailable_reason or "MLX is missing"}
    import mlx.core as mx

    repeats = 3 if quick else 5
    rng = np.random.default_rng(0)
    matmul_rows = []
    mm = backend.get_matrix_multiply_kernel()
    for n in [128, 256, 512] if quick else [256, 512, 1024]:
        a = rng.random((n, n), dtype=np.float32)
        b = rng.random((n, n), dtype=np.float32)
        ma, mb = backend.copy_to_device(a), backend.copy_to_device(b)
        t = best_of(
            {"numpy": lambda a=a, b=b: a @ b, "mlx": lambda ma=ma, mb=mb: mx.eval(mm(ma, mb))},
            repeats,
        )
        check = np.allclose(np.asarray(mm(ma, mb)), a @ b, rtol=1e-3, atol=1e-2)
        flops = 2.0 * n**3
        matmul_rows.append(
            {
                "n": n,
                "numpy GFLOP/s": flops / t["numpy"] / 1e9,
                "mlx GFLOP/s": flops / t["mlx"] / 1e9,
                "ratio": t["numpy"] / t["mlx"],
                "matches numpy": check,
            }
        )

    elem_rows = []
    fused = backend.compile_kernel(lambda x: x * 2 + 1)
    for size in [1 << 20, 1 << 22] if quick else [1 << 20, 1 << 22, 1 << 24]:
        x = rng.random(size, dtype=np.float32)
        mxx = backend.copy_to_device(x)
        t = best_of(
            {
                "numpy": lambda x=x: x * 2 + 1,
                "mlx": lambda m=mxx: mx.eval(m * 2 + 1),
                "mlx compiled": lambda m=mxx: mx.eval(fused(m)),
                "copy in": lambda x=x: mx.eval(backend.copy_to_device(x)),
                "copy out": lambda m=mxx: backend.copy_to_host(m),
            },
            repeats,
        )
        check = np.allclose(np.asarray(fused(mxx)), x * 2 + 1)
        nbytes = 2.0 * x.nbytes
        elem_rows.append(
            {
                "elements": size,
                "numpy GB/s": nbytes / t["numpy"] / 1e9,
                "mlx GB/s": nbytes / t["mlx"] / 1e9,
                "compiled GB/s": nbytes / t["mlx compiled"] / 1e9,
                "ratio": t["numpy"] / t["mlx compiled"],
                "copy in+out us": (t["copy in"] + t["copy out"]) * 1e6,
                "matches numpy": check,
            }
        )
    return {
        "available": True,
        "device": backend.device_description,
        "metal_gpu": backend.uses_metal_gpu,
        "mlx": mx.__version__,
        "matmul": matmul_rows,
        "elementwise": elem_rows,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (seconds)")
    ap.add_argument("--json", default=None, help="where to save results")
    args = ap.parse_args(argv)
    r = measure(args.quick)
    if not r["available"]:
        print(f"MLX not available: {r['reason']}")
        save_json(
            "metal",
            {
                "quick": args.quick,
                **r,
                "summary": [
                    summary_row(
                        "matmul, largest size",
                        None,
                        "GFLOP/s",
                        higher_is_better=True,
                        note=f"not available: {r['reason']}",
                    ),
                    summary_row(
                        "x * 2 + 1, largest size",
                        None,
                        "GB/s",
                        higher_is_better=True,
                        note=f"not available: {r['reason']}",
                    ),
                ],
            },
            args.json,
        )
        return r
    print_table(
        f"Matrix multiply, float32, MLX {r['mlx']} on {r['device']} vs NumPy; "
        "ratio = MLX / NumPy throughput",
        r["matmul"],
        ["n", "numpy GFLOP/s", "mlx GFLOP/s", "ratio", "matches numpy"],
    )
    print_table(
        "Elementwise x * 2 + 1, float32; ratio = compiled MLX / NumPy throughput",
        r["elementwise"],
        [
            "elements",
            "numpy GB/s",
            "mlx GB/s",
            "compiled GB/s",
            "ratio",
            "copy in+out us",
            "matches numpy",
        ],
    )
    big_mm, big_el = r["matmul"][-1], r["elementwise"][-1]
    summary = [
        summary_row(
            f"MLX matmul n={big_mm['n']}",
            big_mm["mlx GFLOP/s"],
            "GFLOP/s",
            higher_is_better=True,
            baseline=big_mm["numpy GFLOP/s"],
            baseline_name="NumPy",
        ),
        summary_row(
            f"MLX compiled x*2+1, {big_el['elements']:,} elements",
            big_el["compiled GB/s"],
            "GB/s",
            higher_is_better=True,
            baseline=big_el["numpy GB/s"],
            baseline_name="NumPy",
        ),
    ]
    _chart(r, args.json)
    save_json("metal", {"quick": args.quick, **r, "summary": summary}, args.json)
    return r


def _chart(r: dict[str, Any], json_path: str | None) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ns = [row["n"] for row in r["matmul"]]
    ax1.plot(ns, [row["numpy GFLOP/s"] for row in r["matmul"]], marker="o", label="NumPy")
    ax1.plot(ns, [row["mlx GFLOP/s"] for row in r["matmul"]], marker="o", label="MLX")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("n (n x n float32)")
    ax1.set_ylabel("GFLOP/s")
    ax1.set_title("matmul")
    ax1.legend()
    es = [row["elements"] for row in r["elementwise"]]
    for key, label in (
        ("numpy GB/s", "NumPy"),
        ("mlx GB/s", "MLX"),
        ("compiled GB/s", "MLX compiled"),
    ):
        ax2.plot(es, [row[key] for row in r["elementwise"]], marker="o", label=label)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("elements")
    ax2.set_ylabel("GB/s")
    ax2.set_title("x * 2 + 1")
    ax2.legend()
    fig.suptitle(f"MLX on {r['device']} vs NumPy")
    save_figure(fig, chart_path("metal", json_path))


if __name__ == "__main__":
    main()
