"""Kernel compilation: compile once per (source, signature, device, options), PTX on disk."""

from __future__ import annotations

from .cache import CacheEntry as CacheEntry
from .cache import CacheStats as CacheStats
from .cache import KernelCache as KernelCache
from .cache import get_kernel_cache as get_kernel_cache
from .compiler import CompilationOptions as CompilationOptions
from .compiler import CompiledKernel as CompiledKernel
from .compiler import CompilerStats as CompilerStats
from .compiler import KernelCompiler as KernelCompiler
from .compiler import compile_kernel as compile_kernel
from .compiler import get_compiler as get_compiler
from .compiler import warmup_kernels as warmup_kernels
from .ptx_check import PtxCheckResult as PtxCheckResult
from .ptx_check import ShippedKernel as ShippedKernel
from .ptx_check import check_ptx as check_ptx
from .ptx_check import cuda_ptx_check as cuda_ptx_check

__all__ = (
    "CacheEntry",
    "CacheStats",
    "CompilationOptions",
    "CompiledKernel",
    "CompilerStats",
    "KernelCache",
    "KernelCompiler",
    "PtxCheckResult",
    "ShippedKernel",
    "check_ptx",
    "compile_kernel",
    "cuda_ptx_check",
    "get_compiler",
    "get_kernel_cache",
    "warmup_kernels",
)
