"""PageRank on synthetic power-law graphs: dense, sparse, GPU and actors, in edges/s.

What it measures, for graphs from 1 K to 2 M nodes (8 edges per node on average, power-law
in- and out-degrees, Chung-Lu style; ``--quick`` stops at 100 K):

- ``scipy SpMV (floor)``: one bare ``A @ x`` with ``scipy.sparse`` CSR, the floor every
  PageRank iteration must pay;
- ``CPU sparse``: a full PageRank iteration (sparse product, dangling-node mass, teleport)
  on the damped, column-scaled CSR matrix; the product accumulates into a preallocated
  vector already holding the teleport term, so the extra work is one fill and one dot;
  target: >= 0.9 x the floor's edges/s (ratio column);
- ``CPU dense``: the same iteration with a dense NumPy matrix (small graphs only), to find
  the size from which sparse wins (the crossover);
- ``GPU sparse``: the same iteration with ``cupyx.scipy.sparse`` (timed with CUDA events;
  skipped without a GPU; target on an H100: >= 1 G edges/s at 1 M+ nodes);
- ``actors``: one ring kernel per core (``tier="thread"``), each owning a block of rows for
  the whole run and writing its slice of the next vector; the driver sends one message per
  worker per iteration (arrays travel by reference) and adds the dangling and teleport terms.

Time per iteration is the median over several iterations after a warm-up, the CPU
implementations timed in interleaved rounds so that load changes hit them alike; edges/s =
edges of the graph / time per iteration. CPU implementations run on one core (BLAS threads
pinned to 1, as SciPy's sparse product is single-threaded); the actor version uses one
worker per core. Correctness: every implementation's converged ranks are
compared with ``networkx.pagerank`` on the small graphs (L1 distance).

Run ``python benchmarks/pagerank_benchmark.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Per-core comparison: BLAS (dense) runs single-threaded like SciPy's sparse product; the
# actor version is the one that uses several cores (one worker per core).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np
import scipy.sparse as sp
from _common import print_table, save_json
from _suite import chart_path, cuda_device_reason, pyplot, save_figure, summary_row

from pydotcompute import RingKernelRuntime, message, run

DAMPING = 0.85

try:  # the in-place product (y += A @ x) behind scipy's own ``A @ x``
    from scipy.sparse import _sparsetools

    _csr_matvec: Callable[..., None] | None = _sparsetools.csr_matvec
except (ImportError, AttributeError):  # pragma: no cover - other SciPy layouts
    _csr_matvec = None


# --- graphs ----------------------------------------------------------------------------------


def power_law_graph(n: int, avg_degree: int = 8, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Directed edges (src, dst): node i is an endpoint with probability ~ (i + 1) ** -a."""
    rng = np.random.default_rng(seed)
    m = n * avg_degree

    def endpoints(a: float) -> np.ndarray:
        u = rng.random(m)
        i = (1.0 + u * (n ** (1 - a) - 1.0)) ** (1.0 / (1 - a))
        return rng.permutation(n).astype(np.int32)[np.minimum(i.astype(np.int64) - 1, n - 1)]

    dst, src = endpoints(0.8), endpoints(0.5)
    keep = src != dst
    return src[keep], dst[keep]


def link_matrix(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """``A = damping * P^T`` as CSR (row = destination; duplicate edges counted once) and the
    indices of the dangling nodes (no out-link), whose rank is spread over every node."""
    a = sp.csr_matrix((np.ones(len(src)), (dst, src)), shape=(n, n))
    a.sum_duplicates()
    a.data[:] = 1.0
    out_degree = np.bincount(a.indices, minlength=n).astype(np.float64)
    scale = np.divide(DAMPING, out_degree, out=np.zeros(n), where=out_degree > 0)
    a.data *= scale[a.indices]
    return a, np.flatnonzero(out_degree == 0)


# --- implementations: each returns step(x) -> next x ------------------------------------------


def cpu_sparse_step(a: sp.csr_matrix, dangling: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    n = a.shape[0]
    bufs = [np.empty(n), np.empty(n)]
    flip = [0]
    indptr, indices, data = a.indptr, a.indices, a.data

    def step(x: np.ndarray) -> np.ndarray:
        y = bufs[flip[0]]
        flip[0] ^= 1
        y.fill((DAMPING * float(x[dangling].sum()) + (1.0 - DAMPING)) / n)
        if _csr_matvec is not None:
            _csr_matvec(n, n, indptr, indices, data, x, y)
        else:
            y += a @ x
        return y

    return step


def dense_step(a: sp.csr_matrix, dangling: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    n = a.shape[0]
    m = a.toarray()

    def step(x: np.ndarray) -> np.ndarray:
        y = m @ x
        y += (DAMPING * float(x[dangling].sum()) + (1.0 - DAMPING)) / n
        return y

    return step


def gpu_step(a: sp.csr_matrix, dangling: np.ndarray) -> Callable[[Any], Any]:
    import cupy as cp
    import cupyx.scipy.sparse as csp

    n = a.shape[0]
    ga = csp.csr_matrix(a)
    gd = cp.asarray(dangling)

    def step(x: Any) -> Any:
        y = ga @ x
        y += (DAMPING * x[gd].sum() + (1.0 - DAMPING)) / n
        return y

    return step


@message
class Iterate:
    x: np.ndarray
    y: np.ndarray


@message
class Done:
    lo: int


def block_worker(block: sp.csr_matrix, lo: int) -> Callable[[Any], None]:
    """A thread-tier actor owning rows [lo, lo + block.shape[0]) for the whole run."""
    rows = block.shape[0]
    n = block.shape[1]
    indptr, indices, data = block.indptr, block.indices, block.data

    def worker(ctx: Any) -> None:
        while not ctx.should_terminate:
            req = ctx.receive()
            if req is None:
                continue
            out = req.y[lo : lo + rows]
            out.fill(0.0)
            if _csr_matvec is not None:  # releases the GIL: the blocks run in parallel
                _csr_matvec(rows, n, indptr, indices, data, req.x, out)
            else:
                out += block @ req.x
            ctx.send(Done(lo=lo))

    return worker


async def actor_iterations(
    a: sp.csr_matrix, dangling: np.ndarray, iters: int, workers: int
) -> tuple[list[float], np.ndarray]:
    """Per-iteration times of the actor version and its final vector."""
    n = a.shape[0]
    bounds = np.linspace(0, n, workers + 1).astype(int)
    ids = [f"pagerank-{i}" for i in range(workers)]
    times = []
    async with RingKernelRuntime() as rt:
        for kid, lo, hi in zip(ids, bounds[:-1], bounds[1:], strict=True):
            await rt.launch(
                kid,
                block_worker(a[lo:hi], int(lo)),
                input_type=Iterate,
                output_type=Done,
                tier="thread",
            )
            await rt.activate(kid)
        x = np.full(n, 1.0 / n)
        bufs = [np.empty(n), np.empty(n)]
        for i in range(iters + 1):
            y = bufs[i % 2]
            t0 = time.perf_counter()
            for kid in ids:
                await rt.send(kid, Iterate(x=x, y=y))
            for kid in ids:
                await rt.receive(kid, timeout=60.0)
            y += (DAMPING * float(x[dangling].sum()) + (1.0 - DAMPING)) / n
            if i:  # the first iteration warms up
                times.append(time.perf_counter() - t0)
            x = y
    return times, x


# --- measurement -----------------------------------------------------------------------------


def time_interleaved(
    steps: dict[str, tuple[Callable[[Any], Any], Any]],
    iters: int,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each step, timed in rounds (one call of each per round)
    so that a change in machine load affects every implementation alike."""
    state = {name: step(x0) for name, (step, x0) in steps.items()}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(iters):
        for name, (step, _) in steps.items():
            t0 = time.perf_counter()
            state[name] = step(state[name])
            if sync:
                sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def converge(
    step: Callable[[Any], Any],
    n: int,
    to_host: Callable[[Any], np.ndarray],
    x0: Any,
    tol: float = 1e-12,
    max_iter: int = 500,
) -> np.ndarray:
    x = x0
    for _ in range(max_iter):
        y = step(x)
        done = float(abs(to_host(y) - to_host(x)).sum()) < tol
        x = y
        if done:
            break
    return to_host(x).copy()


def networkx_ranks(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    try:
        import networkx as nx
    except ImportError:
        return None
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    ref = nx.pagerank(g, alpha=DAMPING, tol=1e-13, max_iter=1000)
    return np.array([ref[i] for i in range(n)])


def measure(quick: bool) -> dict[str, Any]:
    sizes = [1_000, 10_000, 100_000] if quick else [1_000, 10_000, 100_000, 1_000_000, 2_000_000]
    dense_sizes = (
        [25, 50, 100, 250, 500, 1_000, 2_000]
        if quick
        else [25, 50, 100, 250, 500, 1_000, 2_000, 4_000]
    )
    check_sizes = [1_000] if quick else [1_000, 10_000]
    workers = max(2, min(4, os.cpu_count() or 2))
    gpu_reason = cuda_device_reason()
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []

    def iters_for(n: int) -> int:
        return 5 if n >= 1_000_000 else (10 if quick else 20)

    for n in sorted(set(sizes) | set(dense_sizes)):
        t_gen = time.perf_counter()
        src, dst = power_law_graph(n)
        a, dangling = link_matrix(n, src, dst)
        edges = a.nnz
        iters = iters_for(n)
        x0 = np.full(n, 1.0 / n)
        spmv = lambda x, a=a: a @ x  # noqa: E731
        steps = {"scipy SpMV (floor)": (spmv, x0), "CPU sparse": (cpu_sparse_step(a, dangling), x0)}
        if n in dense_sizes:
            steps["CPU dense"] = (dense_step(a, dangling), x0)
        res: dict[str, float] = time_interleaved(steps, iters)
        if n in sizes:
            if gpu_reason is None:
                import cupy as cp

                gx0 = cp.asarray(x0)
                res.update(
                    {
                        k if k != "CPU sparse" else "GPU sparse": v
                        for k, v in time_interleaved(
                            {"CPU sparse": (gpu_step(a, dangling), gx0)},
                            iters,
                            cp.cuda.Device().synchronize,
                        ).items()
                    }
                )
            actor_times, _ = run(actor_iterations(a, dangling, iters, workers))
            res["actors"] = statistics.median(actor_times)
        for impl, t in res.items():
            if t is None:
                continue
            rows.append(
                {
                    "nodes": n,
                    "edges": edges,
                    "impl": impl,
                    "ms/iter": t * 1e3,
                    "edges/s": edges / t,
                    "ratio": res["scipy SpMV (floor)"] / t,
                }
            )  # edges/s over the floor's
        print(
            f"  {n:>9,} nodes, {edges:>10,} edges: "
            + ", ".join(f"{k} {edges / v / 1e6:,.1f} M edges/s" for k, v in res.items() if v)
            + f"  ({time.perf_counter() - t_gen:.1f} s)",
            flush=True,
        )

        if n in check_sizes:
            ref = networkx_ranks(n, src, dst)
            impls: dict[str, Callable[[], np.ndarray]] = {
                "CPU sparse": lambda a=a, d=dangling, n=n: converge(
                    cpu_sparse_step(a, d), n, np.asarray, np.full(n, 1.0 / n)
                ),
                "CPU dense": lambda a=a, d=dangling, n=n: converge(
                    dense_step(a, d), n, np.asarray, np.full(n, 1.0 / n)
                ),
                "actors": lambda a=a, d=dangling: run(actor_iterations(a, d, 200, workers))[1],
            }
            if gpu_reason is None:
                import cupy as cp

                impls["GPU sparse"] = lambda a=a, d=dangling, n=n: converge(
                    gpu_step(a, d), n, cp.asnumpy, cp.full(n, 1.0 / n)
                )
            for impl, fn in impls.items():
                ranks = fn()
                checks.append(
                    {
                        "nodes": n,
                        "impl": impl,
                        "L1 vs networkx": float(np.abs(ranks - ref).sum())
                        if ref is not None
                        else None,
                        "sum": float(ranks.sum()),
                    }
                )

    return {"rows": rows, "checks": checks, "workers": workers, "gpu": gpu_reason or "available"}


def crossover(rows: list[dict[str, Any]], fast: str, slow: str) -> int | None:
    """Smallest size from which ``fast`` beats ``slow`` at every larger size measured."""
    by_n: dict[int, dict[str, float]] = {}
    for r in rows:
        by_n.setdefault(r["nodes"], {})[r["impl"]] = r["ms/iter"]
    both = [(n, v[fast] < v[slow]) for n, v in sorted(by_n.items()) if fast in v and slow in v]
    if not both or not both[-1][1]:
        return None
    first = both[-1][0]
    for n, wins in reversed(both):
        if not wins:
            break
        first = n
    return first


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="graphs up to 100 K nodes (seconds)")
    ap.add_argument("--json", default=None, help="where to save results")
    args = ap.parse_args(argv)

    print("PageRank iterations per implementation (progress):")
    r = measure(args.quick)
    rows, checks = r["rows"], r["checks"]
    print_table(
        f"PageRank, time per iteration; ratio = edges/s over the scipy SpMV floor's "
        f"(CPU sparse target >= 0.9); actors: {r['workers']} thread-tier workers; GPU: {r['gpu']}",
        rows,
        ["nodes", "edges", "impl", "ms/iter", "edges/s", "ratio"],
    )
    print_table(
        "Correctness: L1 distance from networkx.pagerank (converged, tol 1e-12)",
        checks,
        ["nodes", "impl", "L1 vs networkx", "sum"],
    )
    dense_x = crossover(rows, "CPU sparse", "CPU dense")
    gpu_x = crossover(rows, "GPU sparse", "CPU sparse")
    smallest = min(row["nodes"] for row in rows)
    for label, x, fast, slow in (
        ("dense", dense_x, "CPU sparse", "CPU dense"),
        ("gpu", gpu_x, "GPU sparse", "CPU sparse"),
    ):
        if label == "gpu" and r["gpu"] != "available":
            continue
        if x is None:
            print(f"crossover: {fast} did not overtake {slow} in the sizes measured")
        elif x == smallest:
            print(
                f"crossover: {fast} is faster than {slow} at every size measured (from {x:,} nodes)"
            )
        else:
            print(f"crossover: {fast} is faster than {slow} from {x:,} nodes on")

    largest = max(row["nodes"] for row in rows)
    at = {row["impl"]: row for row in rows if row["nodes"] == largest}
    floor = at["scipy SpMV (floor)"]["edges/s"]
    summary = [
        summary_row(
            f"CPU sparse at {largest:,} nodes",
            at["CPU sparse"]["edges/s"],
            "edges/s",
            higher_is_better=True,
            baseline=floor,
            baseline_name="scipy SpMV",
            target="ratio >= 0.9",
        ),
        summary_row(
            f"actors at {largest:,} nodes",
            at["actors"]["edges/s"],
            "edges/s",
            higher_is_better=True,
            baseline=floor,
            baseline_name="scipy SpMV",
        ),
        summary_row(
            f"GPU sparse at {largest:,} nodes",
            at["GPU sparse"]["edges/s"] if "GPU sparse" in at else None,
            "edges/s",
            higher_is_better=True,
            baseline=floor,
            baseline_name="scipy SpMV",
            target=">= 1e9 edges/s on an H100 at 1M+ nodes",
            note=None if "GPU sparse" in at else f"not available: {r['gpu']}",
        ),
    ]
    worst = max(
        (c["L1 vs networkx"] for c in checks if c["L1 vs networkx"] is not None), default=None
    )
    summary.append(
        summary_row(
            "worst L1 distance from networkx",
            worst,
            "L1",
            higher_is_better=False,
            target="< 1e-9",
            compare=False,
        )
    )
    _chart(rows, args.json)
    save_json(
        "pagerank",
        {
            "quick": args.quick,
            **r,
            "crossover_sparse_over_dense": dense_x,
            "crossover_gpu_over_cpu": gpu_x,
            "summary": summary,
        },
        args.json,
    )
    return r


def _chart(rows: list[dict[str, Any]], json_path: str | None) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for impl in dict.fromkeys(r["impl"] for r in rows):
        pts = sorted((r["nodes"], r["edges/s"]) for r in rows if r["impl"] == impl)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 edges per node on average)")
    ax.set_ylabel("edges/s per iteration")
    ax.set_title("PageRank scaling")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, chart_path("pagerank", json_path))


if __name__ == "__main__":
    main()
