"""Compile every CUDA kernel the package ships to PTX, without a GPU.

CI has no GPU, so a typo in a kernel would otherwise surface only on hardware. Each module
that ships CUDA kernels exposes ``shipped_kernels() -> list[ShippedKernel]``; the modules are
listed in `KERNEL_PROVIDERS` (a provider that does not exist yet, or has no such
function, is skipped). `check_ptx` compiles Python kernels with
``numba.cuda.compile_ptx`` for an explicit compute capability and CUDA C kernels with NVRTC;
`cuda_ptx_check` raises if any fails. Neither needs a GPU, but both need the ``cuda``
extra and cannot run while the Numba CUDA simulator is on.

Assembling the PTX with `ptxas` also checks inline PTX, but only a `ptxas` at least as new
as the NVVM (or NVRTC) that emitted the PTX accepts it: the PTX names its ISA version
(`.version 8.8` is CUDA 12.9, `.version 9.0` CUDA 13.0) and an older `ptxas` rejects a newer
ISA. A machine often has several (a system toolkit, the `nvidia-cuda-nvcc` wheel beside
Numba's NVVM), so `find_ptxas` picks, for a given PTX text, the first that is new enough,
trying the one beside Numba's NVVM first.
"""

from __future__ import annotations

import functools
import glob
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..exceptions import KernelCompilationError

__all__ = (
    "KERNEL_PROVIDERS",
    "PtxCheckResult",
    "ShippedKernel",
    "check_ptx",
    "cuda_ptx_check",
    "cuda_release_for_ptx_isa",
    "find_ptxas",
    "ptx_isa_version",
    "ptxas_candidates",
    "ptxas_release",
    "shipped_kernels",
)

#: Modules whose ``shipped_kernels()`` list CUDA kernels to check.
KERNEL_PROVIDERS: list[str] = [
    "pydotcompute.backends._cuda_kernels",
    "pydotcompute.ring_kernels.tiers.gpu.prepare",
]


@dataclass(frozen=True, slots=True)
class ShippedKernel:
    """A CUDA kernel shipped with the package.

    Attributes:
        name: a dotted, unique name (``"backends.cuda.vector_add"``).
        kind: ``"numba"`` (a Python function) or ``"cuda-c"`` (CUDA C source).
        load: returns the Python function or the source text (called lazily).
        signatures: Numba signatures to compile (``"numba"`` kernels).
        entry: the ``extern "C"`` entry point (``"cuda-c"`` kernels).
        nvrtc_options: extra NVRTC flags.
    """

    name: str
    kind: Literal["numba", "cuda-c"]
    load: Callable[[], Any]
    signatures: tuple[str, ...] = ()
    entry: str | None = None
    nvrtc_options: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class PtxCheckResult:
    """The outcome of compiling one kernel (and one signature) to PTX."""

    name: str
    signature: str | None
    ok: bool
    ptx_bytes: int = 0
    error: str | None = None


def shipped_kernels(providers: Iterable[str] | None = None) -> list[ShippedKernel]:
    """Collect the kernels of every provider module that exists."""
    found: list[ShippedKernel] = []
    for module_name in providers if providers is not None else KERNEL_PROVIDERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        provider = getattr(module, "shipped_kernels", None)
        if callable(provider):
            found.extend(provider())
    return found


def check_ptx(
    cc: tuple[int, int] = (8, 0),
    kernels: Iterable[ShippedKernel] | None = None,
) -> list[PtxCheckResult]:
    """Compile each kernel (each signature) to PTX for ``cc``; never raises for a bad kernel.

    Raises:
        BackendNotAvailableError: Numba CUDA / CuPy is missing or the simulator is on.
    """
    from .compiler import numba_compile_ptx, nvrtc_compile_ptx

    results: list[PtxCheckResult] = []
    for k in kernels if kernels is not None else shipped_kernels():
        if k.kind == "cuda-c":
            try:
                ptx = nvrtc_compile_ptx(k.load(), k.entry or k.name, cc, k.nvrtc_options)
            except KernelCompilationError as exc:
                results.append(PtxCheckResult(k.name, None, False, error=str(exc)))
            else:
                ok = f".entry {k.entry}" in ptx if k.entry else True
                results.append(
                    PtxCheckResult(
                        k.name, None, ok, len(ptx), None if ok else f"no entry {k.entry!r} in PTX"
                    )
                )
            continue
        func = k.load()
        for sig in k.signatures:
            try:
                ptx = numba_compile_ptx(func, sig, cc)
            except KernelCompilationError as exc:
                results.append(PtxCheckResult(k.name, sig, False, error=str(exc)))
            else:
                results.append(PtxCheckResult(k.name, sig, ".entry" in ptx, len(ptx)))
    return results


def cuda_ptx_check(cc: tuple[int, int] = (8, 0)) -> list[PtxCheckResult]:
    """``check_ptx`` that raises ``KernelCompilationError`` listing every failure.

    Returns:
        The (all successful) results.
    """
    results = check_ptx(cc)
    failed = [r for r in results if not r.ok]
    if failed:
        lines = "\n".join(f"  {r.name} [{r.signature}]: {r.error}" for r in failed)
        raise KernelCompilationError(
            f"{len(failed)} of {len(results)} shipped CUDA kernels failed to compile to PTX for "
            f"cc {cc[0]}.{cc[1]}:\n{lines}"
        )
    return results


# --- picking a ptxas -----------------------------------------------------------------------------

_VERSION_LINE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def ptx_isa_version(ptx: str) -> tuple[int, int] | None:
    """The PTX ISA version a PTX text declares (``.version 8.8`` -> ``(8, 8)``)."""
    m = _VERSION_LINE.search(ptx)
    return (int(m.group(1)), int(m.group(2))) if m else None


def cuda_release_for_ptx_isa(isa: tuple[int, int]) -> tuple[int, int]:
    """The first CUDA release whose ``ptxas`` accepts PTX ISA ``isa``.

    ISA 7.x is CUDA 11.x; 8.0-8.5 are 12.0-12.5 (12.6 kept 8.5), 8.6 is 12.7, 8.7 12.8,
    8.8 12.9; 9.x is 13.x. Later ISAs are assumed to keep that last step.
    """
    major, minor = isa
    if major < 7:
        return (10, 0)
    if major == 7:
        return (11, minor)
    if major == 8:
        return (12, minor) if minor <= 5 else (12, minor + 1)
    return (major + 4, minor)


@functools.cache
def ptxas_release(path: str) -> tuple[int, int] | None:
    """The CUDA release of a ``ptxas`` (from ``--version``), or None when it does not run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _RELEASE.search(out.stdout + out.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _nvvm_sibling() -> str | None:
    """The ``ptxas`` of the toolkit whose NVVM Numba uses (``<root>/nvvm/lib64/libnvvm.so``
    -> ``<root>/bin/ptxas``)."""
    try:
        paths: Any = importlib.import_module("numba.cuda.cuda_paths")
        nvvm = paths.get_cuda_paths()["nvvm"]
        lib = getattr(nvvm, "info", None)
    except Exception:
        return None
    if not lib:
        return None
    root = os.path.dirname(os.path.dirname(os.path.dirname(str(lib))))
    cand = os.path.join(root, "bin", "ptxas")
    return cand if os.path.isfile(cand) else None


def ptxas_candidates() -> list[str]:
    """Every ``ptxas`` found, most likely match for Numba's NVVM first, no duplicates."""
    found: list[str | None] = [_nvvm_sibling()]
    try:  # the CUDA wheels: nvidia/cuda_nvcc/bin (CUDA 12), nvidia/cu13/bin (CUDA 13)
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            found += sorted(glob.glob(os.path.join(root, "*", "bin", "ptxas")))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            found.append(os.path.join(os.environ[env], "bin", "ptxas"))
    found.append(shutil.which("ptxas"))
    found += sorted(glob.glob("/usr/local/cuda*/bin/ptxas"), reverse=True)
    seen: set[str] = set()
    out = []
    for cand in found:
        if cand and os.path.isfile(cand):
            real = os.path.realpath(cand)
            if real not in seen:
                seen.add(real)
                out.append(cand)
    return out


def find_ptxas(ptx: str | None = None, candidates: Iterable[str] | None = None) -> str | None:
    """A ``ptxas`` that accepts ``ptx`` (any that runs when ``ptx`` is None), else None.

    Candidates are tried in order (``ptxas_candidates()`` by default); one older than the
    CUDA release of the PTX's ISA version is skipped, since it would reject the PTX.
    """
    isa = ptx_isa_version(ptx) if ptx is not None else None
    need = cuda_release_for_ptx_isa(isa) if isa is not None else (0, 0)
    for cand in candidates if candidates is not None else ptxas_candidates():
        release = ptxas_release(cand)
        if release is not None and release >= need:
            return cand
    return None
