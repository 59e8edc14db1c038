"""Turning a handler into a persistent kernel: resolution, caching and compile-only PTX.

Imports Numba; loaded lazily. ``compile_ptx`` works without a GPU only with an explicit
compute capability, and only outside the simulator.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda as _numba_cuda
from numba import types as _numba_types
from numba.np.numpy_support import from_dtype

from ....backends.base import error_text
from ....exceptions import KernelCompilationError, TypeValidationError
from . import device

__all__ = (
    "SIMULATOR",
    "argument_types",
    "build_kernel",
    "compile_ptx",
    "python_handler",
    "record_types",
)

SIMULATOR = device.SIMULATOR
cuda: Any = _numba_cuda  # Numba ships no type stubs
types: Any = _numba_types
_cache: dict[tuple[Any, ...], Any] = {}
_cache_lock = threading.Lock()


def python_handler(handler: Any) -> Callable[..., Any]:
    """The plain Python function behind ``handler`` (a function or a Numba dispatcher)."""
    return getattr(handler, "py_func", handler)  # type: ignore[no-any-return]


def _device_function(handler: Any) -> Any:
    """A fresh ``cuda.jit(device=True)`` dispatcher for ``handler``'s Python function."""
    opts: dict[str, Any] = {}
    target = getattr(handler, "targetoptions", None)
    if isinstance(target, dict):
        if target.get("device") is False:
            raise TypeValidationError(
                f"the handler {python_handler(handler).__name__!r} is a CUDA kernel "
                "(@cuda.jit); a GPU ring kernel needs a device function: decorate it with "
                "@cuda.jit(device=True) or leave it undecorated"
            )
        for key in ("fastmath", "debug", "lineinfo", "opt"):
            if key in target:
                opts[key] = target[key]
    return cuda.jit(device=True, **opts)(python_handler(handler))


def record_types(in_dtype: np.dtype[Any], out_dtype: np.dtype[Any], state: Any) -> tuple[Any, ...]:
    """Numba argument types of the persistent kernel for these layouts and state array."""
    state_ty = state if isinstance(state, types.Type) else _state_type(state)
    return (
        from_dtype(in_dtype)[::1],
        from_dtype(out_dtype)[::1],
        types.int64[::1],
        types.int64[::1],
        types.int64[::1],
        state_ty,
        from_dtype(in_dtype)[::1],
        from_dtype(out_dtype)[::1],  # the reply bound for a device edge
        types.uint8[::1],  # the stage as bytes
        types.uint8[::1],  # that reply as bytes
        types.uint8[::1],  # the device's edge arena
        types.int64[::1],  # the edge headers
    )


def argument_types(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Numba types of the kernel's arguments, as the CUDA dispatcher will type them.

    Core ``numba.typeof`` raises on objects that only export ``__cuda_array_interface__``
    (a CuPy array as an actor's state); the CUDA typing module types them as device arrays.
    """
    return tuple(_typeof_argument(a) for a in args)


def _typeof_argument(value: Any) -> Any:
    try:
        typing_mod: Any = importlib.import_module("numba.cuda.typing.typeof")
    except ImportError:  # an older numba-cuda: core typing plus the interface by hand
        cai = getattr(value, "__cuda_array_interface__", None)
        if cai is None or hasattr(value, "_numba_type_"):
            numba: Any = importlib.import_module("numba")
            return numba.typeof(value)
        return _typeof_interface(cai)
    return typing_mod.typeof(value, typing_mod.Purpose.argument)


def _typeof_interface(cai: dict[str, Any]) -> Any:
    dtype = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    layout = "C"
    if strides is not None:
        expected = []
        step = dtype.itemsize
        for n in reversed(shape):
            expected.append(step)
            step *= n
        layout = "C" if tuple(strides) == tuple(reversed(expected)) else "A"
    return types.Array(from_dtype(dtype), len(shape), layout)


def _state_type(state: Any) -> Any:
    dtype = np.dtype(state.dtype)
    layout = "C"
    return types.Array(from_dtype(dtype), len(state.shape), layout)


def build_kernel(handler: Any, *, cooperative: bool) -> Any:
    """The ``cuda.jit`` dispatcher of the persistent loop around ``handler`` (cached)."""
    key = ("jit", python_handler(handler), cooperative)
    with _cache_lock:
        disp = _cache.get(key)
        if disp is None:
            dev = _device_function(handler)
            disp = cuda.jit(device.make_ring_kernel(dev, cooperative=cooperative))
            _cache[key] = disp
    return disp


def _precompile_handler(dev: Any, argtypes: tuple[Any, ...], cc: tuple[int, int]) -> None:
    """Compile the device handler for ``cc`` without asking a GPU for its capability.

    A device dispatcher normally compiles for the current device; with no GPU that lookup
    fails, so compile-only checks put the overload in place first.
    """
    from numba.cuda.compiler import compile_cuda

    if argtypes in dev.overloads:
        return
    opts = dev.targetoptions
    cres = compile_cuda(
        dev.py_func,
        None,
        argtypes,
        debug=opts.get("debug"),
        lineinfo=opts.get("lineinfo"),
        forceinline=opts.get("forceinline"),
        inline=opts.get("inline", "never"),
        fastmath=opts.get("fastmath"),
        nvvm_options={"opt": 3 if opts.get("opt", True) else 0, "fastmath": opts.get("fastmath")},
        cc=cc,
    )
    dev.overloads[argtypes] = cres
    cres.target_context.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])


def compile_ptx(
    handler: Any,
    in_dtype: np.dtype[Any],
    out_dtype: np.dtype[Any],
    state: Any,
    *,
    cooperative: bool,
    cc: tuple[int, int],
) -> str:
    """PTX of the persistent kernel around ``handler`` for compute capability ``cc``."""
    if SIMULATOR:
        raise KernelCompilationError(
            "compile-only PTX checks cannot run under the CUDA simulator "
            "(NUMBA_ENABLE_CUDASIM=1); run them in a separate process without it"
        )
    argtypes = record_types(in_dtype, out_dtype, state)
    dev = _device_function(handler)
    try:
        _precompile_handler(dev, (argtypes[0].dtype, argtypes[1].dtype, argtypes[5]), cc)
        ptx, _ = cuda.compile_ptx(
            device.make_ring_kernel(dev, cooperative=cooperative), argtypes, cc=cc
        )
    except Exception as exc:
        raise KernelCompilationError(
            f"the handler {python_handler(handler).__name__!r} does not compile for the GPU "
            f"(sm_{cc[0]}{cc[1]}): {type(exc).__name__}: {error_text(exc)}"
        ) from exc
    return ptx  # type: ignore[no-any-return]
