"""Compile-only checks of every generated GPU ring kernel (no GPU needed).

Each persistent kernel the tests and the benchmark launch is compiled to PTX for sm_80 and
sm_90 (Numba's ``compile_ptx`` with an explicit compute capability; the CUDA C flavour with
NVRTC), checked for the memory-order instructions the design relies on, and assembled by
``ptxas`` when it is installed (the ``nvidia-cuda-nvcc`` wheel ships it), which also checks
the inline PTX. Numba's ``compile_ptx`` does not exist under the CUDA simulator, so this
module skips itself in a simulator process.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.skip(
        "compile-only PTX checks cannot run under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)",
        allow_module_level=True,
    )
if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
    pytest.skip(
        'numba-cuda is not installed; pip install "pydotcompute[cuda]"', allow_module_level=True
    )

from pydotcompute.compilation.ptx_check import find_ptxas
from pydotcompute.exceptions import KernelCompilationError
from pydotcompute.ring_kernels.tiers.gpu import (
    compile_gpu_kernel_cuda_c,
    compile_gpu_kernel_ptx,
    cuda_c,
)
from tests import gpu_ring_kernel_suite as suite

CCS = [(8, 0), (9, 0)]
ORDERING = (
    "ld.acquire.sys.global.b64",
    "st.release.sys.global.b64",
    "st.relaxed.sys.global.b64",
    "nanosleep.u32",
    "%globaltimer",
    "bar.sync",
)

I64 = np.zeros(2, np.int64)
F64 = np.zeros(1, np.float64)
HANDLERS: dict[str, tuple[Any, type, type, np.ndarray[Any, Any], bool]] = {
    "add": (suite.add_handler, suite.Add, suite.Sum, I64, False),
    "seq": (suite.seq_handler, suite.Seq, suite.SeqOut, I64, False),
    "picky": (suite.picky_handler, suite.Add, suite.Sum, F64, False),
    "double": (suite.double_handler, suite.Sum, suite.Sum, F64, False),
    "vec (cooperative)": (suite.vec_handler, suite.Vec, suite.VecOut, F64, True),
    "stuck": (suite.stuck_handler, suite.Add, suite.Sum, I64, False),
}


def assemble(ptx: str, cc: tuple[int, int], tmp_path: Path) -> None:
    """Assemble with a ptxas new enough for this PTX (skip the step, not the test, when
    none is installed)."""
    ptxas = find_ptxas(ptx)
    if ptxas is None:
        return
    src = tmp_path / f"k_{cc[0]}{cc[1]}.ptx"
    src.write_text(ptx)
    out = subprocess.run(
        [ptxas, f"-arch=sm_{cc[0]}{cc[1]}", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def has_nvrtc() -> bool:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(not has_nvrtc(), reason="NVRTC (through CuPy) is not available")


@pytest.mark.parametrize("cc", CCS, ids=lambda c: f"sm_{c[0]}{c[1]}")
@pytest.mark.parametrize("name", sorted(HANDLERS))
def test_python_handler_kernels_compile(name: str, cc: tuple[int, int], tmp_path: Path) -> None:
    handler, in_t, out_t, state, coop = HANDLERS[name]
    ptx = compile_gpu_kernel_ptx(handler, in_t, out_t, state=state, cooperative=coop, cc=cc)
    assert f".target sm_{cc[0]}{cc[1]}" in ptx
    assert ".entry" in ptx
    missing = [op for op in ORDERING if op not in ptx]
    assert not missing, f"{name}: the PTX lacks {missing}"
    assemble(ptx, cc, tmp_path)


def test_a_handler_that_does_not_type_check_is_reported() -> None:
    def bad(inp: Any, out: Any, state: Any) -> int:
        out.total = inp.no_such_field
        return 0

    with pytest.raises(
        KernelCompilationError, match=r"handler 'bad' does not compile for the GPU \(sm_80\)"
    ):
        compile_gpu_kernel_ptx(bad, suite.Add, suite.Sum, cc=(8, 0))


C_HANDLER = r"""
__device__ int handle(const Add* in, Sum* out, pdc_state_t* state) {
    state[0] += 1;
    out->total = in->a + in->b;
    out->count = state[0];
    return in->a < 0 ? 3 : 0;
}
"""


@needs_nvrtc
@pytest.mark.parametrize("coop", [False, True], ids=["single", "cooperative"])
@pytest.mark.parametrize("cc", CCS, ids=lambda c: f"sm_{c[0]}{c[1]}")
def test_cuda_c_handler_kernel_compiles(cc: tuple[int, int], coop: bool, tmp_path: Path) -> None:
    src, ptx = compile_gpu_kernel_cuda_c(
        C_HANDLER, suite.Add, suite.Sum, state=I64, cooperative=coop, cc=cc
    )
    size = suite.Add.dtype.itemsize
    assert f'static_assert(sizeof(Add) == {size}, "Add must match its NumPy layout");' in src
    assert "typedef long long pdc_state_t;" in src
    assert f".target sm_{cc[0]}{cc[1]}" in ptx
    assert ".entry pdc_ring_kernel_c" in ptx
    missing = [op for op in ORDERING if op not in ptx]
    assert not missing, f"the PTX lacks {missing}"
    assemble(ptx, cc, tmp_path)


@needs_nvrtc
def test_cuda_c_errors_carry_the_nvrtc_log() -> None:
    broken = "__device__ int handle(const Add* in, Sum* out, pdc_state_t* s) { return nope; }"
    with pytest.raises(KernelCompilationError, match=r"(?s)NVRTC could not compile.*nope"):
        compile_gpu_kernel_cuda_c(broken, suite.Add, suite.Sum, cc=(8, 0))


@needs_nvrtc
def test_c_structs_have_the_numpy_layout() -> None:
    """Odd alignments and nested arrays: NVRTC checks ``sizeof`` against NumPy's itemsize."""
    dt = np.dtype(
        [
            ("_mid_hi", np.uint64),
            ("flag", np.bool_),
            ("m", np.float32, (3, 2)),
            ("b", np.int8),
            ("d", np.float64),
            ("h", np.uint16),
        ],
        align=True,
    )
    struct = cuda_c.c_struct("Odd", dt)
    assert "float m[3][2];" in struct
    assert "_pdc_pad" in struct
    cuda_c.ptx(struct + "\n__global__ void k(Odd* o) { o->m[2][1] = 1.0f; }", (8, 0))


def test_unsupported_field_types_are_refused_for_c() -> None:
    with pytest.raises(TypeError, match="has no CUDA C equivalent"):
        cuda_c.c_struct("C", np.dtype([("z", np.complex64)], align=True))


@pytest.mark.parametrize("cc", CCS, ids=lambda c: f"sm_{c[0]}{c[1]}")
def test_benchmark_kernels_compile(cc: tuple[int, int], tmp_path: Path) -> None:
    if not has_nvrtc():
        pytest.skip("NVRTC (through CuPy) is not available for the CUDA C kernels")
    bench = _benchmark_module()
    kernels = bench.compile_check(cc)
    assert sorted(kernels) == [
        "per message (CUDA C)",
        "per message (Numba)",
        "ring (CUDA C)",
        "ring (Numba)",
    ]
    for name, ptx in kernels.items():
        assert f".target sm_{cc[0]}{cc[1]}" in ptx, name
        assemble(ptx, cc, tmp_path)


@functools.cache
def _benchmark_module() -> Any:
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    spec = importlib.util.spec_from_file_location(
        "gpu_ring_kernel_benchmark", root / "gpu_ring_kernel_benchmark.py"
    )
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # @message classes resolve their module
    sys.path.insert(0, str(root))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(root))
    return sys.modules[spec.name]


def test_the_poll_loop_reads_one_control_word(tmp_path: Path) -> None:
    """TERMINATE, ACTIVE and the inbox tail arrive in one word (the doorbell): the loop
    issues one system-scope acquire load for them, plus the one for the outbox head. The
    Numba kernel also takes device edges (the CUDA C one does not): one load of its route
    word (every 16th idle poll and between batches), four when a route turns on, the
    in-edge's tail (only while it reads an edge) and the out-edge's head (when full)."""
    ptx = compile_gpu_kernel_ptx(suite.add_handler, suite.Add, suite.Sum, state=I64, cc=(9, 0))
    kernels = [("numba", ptx)]
    if has_nvrtc():
        _, cptx = compile_gpu_kernel_cuda_c(C_HANDLER, suite.Add, suite.Sum, state=I64)
        kernels.append(("cuda_c", cptx))
    for name, text in kernels:
        assert text.count("ld.relaxed.sys") == 0, name
        edges = 7 if name == "numba" else 0
        assert text.count("ld.acquire.sys") == 2 + edges, name
