"""Compile every CUDA kernel the package ships to PTX, without a GPU.

CI has no GPU, so a typo in a kernel would otherwise surface only on hardware. Each module
that ships CUDA kernels exposes ``shipped_kernels() -> list[ShippedKernel]``; the modules are
listed in `KERNEL_PROVIDERS` (a provider that does not exist yet, or has no such
function, is skipped). `check_ptx` compiles Python kernels with
``numba.cuda.compile_ptx`` for an explicit compute capability and CUDA C kernels with NVRTC;
`cuda_ptx_check` raises if any fails. Neither needs a GPU, but both need the ``cuda``
extra and cannot run while the Numba CUDA simulator is on.
"""

from __future__ import annotations

import importlib
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
    "shipped_kernels",
)

#: Modules whose ``shipped_kernels()`` list CUDA kernels to check.
KERNEL_PROVIDERS: list[str] = [
    "pydotcompute.backends._cuda_kernels",
    "pydotcompute.ring_kernels.gpu_kernel",
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
