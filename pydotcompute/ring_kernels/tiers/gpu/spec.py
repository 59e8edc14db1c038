"""What a GPU ring kernel is made of, checked before anything touches a device.

``check_spec`` runs at decoration time (``@ring_kernel(..., backend="cuda")``) and again
when a kernel is built, so a mistake surfaces where it is written. It imports no CUDA
library.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....exceptions import InvalidConfigurationError, TypeValidationError
from ...message import HEADER_FIELD_NAMES as _HEADER_NAMES
from ...message import field_layout as _field_layout
from ...message import fixed_layout_dtype, message_field_names
from ..contract import check_actor_kind

__all__ = ("GPUKernelOptions", "GPUKernelStatistics", "check_spec", "resolve_options")

_FIXED_LAYOUT_HINT = (
    "GPU rings carry fixed-layout messages: give every field a fixed size (int, float, bool, "
    "np.float32, ... or Annotated[np.ndarray, (16,), np.float32])"
)


@dataclass(frozen=True)
class GPUKernelOptions:
    """Options of the GPU tier (``@ring_kernel(..., backend="cuda", **options)``).

    Attributes:
        state: The actor's device state: a NumPy array (copied to the device), a
            ``(shape, dtype)`` pair (zeros), or a ``UnifiedBuffer`` whose device array the
            kernel updates in place. Default: one ``float64`` zero.
        cooperative: Every thread of a ``block_size`` block calls the handler on each
            message (split an array payload by ``cuda.threadIdx.x``); otherwise one thread.
        cuda_source: The handler as CUDA C source (compiled with NVRTC) instead of the
            decorated Python function.
        handler_name: The ``__device__`` function in ``cuda_source`` to call.
        ring_size: Slots per device ring (inbox and outbox); default
            ``min(queue size, 4096)``. The host keeps up to ``input_queue_size`` more
            messages waiting for a free slot.
        bridge_queue_size: At most this many messages published to the inbox ring and
            not yet handled (default: ``ring_size``); the rest wait in the host's banded
            staging queue, where priority and the backpressure policy apply.
        outbox_full: ``"block"`` (default: the kernel waits for the host to take replies)
            or ``"drop"`` (the handler still runs; its reply is dropped and counted).
        watchdog_timeout: Seconds without device progress, while messages are pending,
            after which the kernel is declared hung and FAILED (None: never). Set it above
            the slowest handler call.
        terminate_timeout: Seconds ``terminate`` (and ``activate``/``deactivate``) wait
            for the kernel's acknowledgement.
        compile_timeout: Seconds ``launch`` waits for the handler to compile and load
            (None: no limit); past it the launch fails with `KernelCompilationError`
            instead of hanging (a first compile takes seconds).
        max_backoff_ns: Ceiling of the idle polling back-off (``__nanosleep``); 0 spins.
        device_id: The CUDA device.
    """

    state: Any = None
    cooperative: bool = False
    cuda_source: str | None = None
    handler_name: str = "handle"
    ring_size: int | None = None
    bridge_queue_size: int | None = None
    outbox_full: str = "block"
    watchdog_timeout: float | None = 5.0
    terminate_timeout: float = 5.0
    compile_timeout: float | None = 120.0
    max_backoff_ns: int = 4096
    device_id: int = 0


OPTION_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(GPUKernelOptions))


@dataclass(frozen=True)
class GPUKernelStatistics:
    """A snapshot of a GPU ring kernel's device counters (``kernel.statistics()``).

    ``processed`` counts every message the handler ran on (replied, rejected or with its
    reply dropped); ``errors`` the non-zero statuses; ``dropped`` the replies discarded
    under ``outbox_full="drop"``; ``outbox_full_events`` how often the kernel found the
    outbox full; ``in_flight`` messages published to the device ring and not yet taken.
    """

    flavour: str
    processed: int
    replies_received: int
    errors: int
    dropped: int
    outbox_full_events: int
    last_status: int
    last_latency_ns: int
    min_latency_ns: int
    max_latency_ns: int
    total_latency_ns: int
    heartbeat: int
    in_flight: int
    staged: int
    buffered_replies: int
    ring_size: int


def _fail(kernel_id: str, text: str, exc: type[Exception] = InvalidConfigurationError) -> Exception:
    return exc(f"GPU ring kernel {kernel_id!r}: {text}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def resolve_options(kernel_id: str, extra: dict[str, Any]) -> GPUKernelOptions:
    """Validate the tier options in ``extra`` and return them with defaults filled in."""
    unknown = sorted(set(extra) - OPTION_NAMES)
    if unknown:
        raise _fail(
            kernel_id, f"unknown option(s) {unknown}; the GPU tier knows {sorted(OPTION_NAMES)}"
        )
    opts = GPUKernelOptions(**extra)
    if not isinstance(opts.cooperative, bool):
        raise _fail(kernel_id, f"cooperative must be True or False, got {opts.cooperative!r}")
    if opts.cuda_source is not None and not isinstance(opts.cuda_source, str):
        raise _fail(
            kernel_id, f"cuda_source must be a string, got {type(opts.cuda_source).__name__}"
        )
    if not isinstance(opts.handler_name, str) or not opts.handler_name.isidentifier():
        raise _fail(kernel_id, f"handler_name must be a C identifier, got {opts.handler_name!r}")
    if opts.cuda_source is not None and opts.handler_name not in opts.cuda_source:
        raise _fail(
            kernel_id,
            f"cuda_source does not define the handler {opts.handler_name!r}; write "
            f"'__device__ int {opts.handler_name}(const In* in, Out* out, pdc_state_t* state)' "
            "or pass handler_name=",
        )
    if opts.bridge_queue_size is not None and (
        not _is_int(opts.bridge_queue_size) or opts.bridge_queue_size < 1
    ):
        raise _fail(
            kernel_id, f"bridge_queue_size must be an int >= 1, got {opts.bridge_queue_size!r}"
        )
    if opts.ring_size is not None and (
        not _is_int(opts.ring_size) or not 1 <= opts.ring_size <= 1 << 24
    ):
        raise _fail(kernel_id, f"ring_size must be an int in 1..{1 << 24}, got {opts.ring_size!r}")
    if opts.outbox_full not in ("block", "drop"):
        raise _fail(kernel_id, f"outbox_full must be 'block' or 'drop', got {opts.outbox_full!r}")
    wd = opts.watchdog_timeout
    if wd is not None and (isinstance(wd, bool) or not isinstance(wd, (int, float)) or wd <= 0):
        raise _fail(kernel_id, f"watchdog_timeout must be seconds > 0 or None, got {wd!r}")
    ct = opts.compile_timeout
    if ct is not None and (isinstance(ct, bool) or not isinstance(ct, int | float) or ct <= 0):
        raise _fail(kernel_id, f"compile_timeout must be seconds > 0 or None, got {ct!r}")
    tt = opts.terminate_timeout
    if isinstance(tt, bool) or not isinstance(tt, (int, float)) or tt <= 0:
        raise _fail(kernel_id, f"terminate_timeout must be seconds > 0, got {tt!r}")
    if not _is_int(opts.max_backoff_ns) or not 0 <= opts.max_backoff_ns <= 1_000_000:
        raise _fail(
            kernel_id, f"max_backoff_ns must be an int in 0..1000000, got {opts.max_backoff_ns!r}"
        )
    if not _is_int(opts.device_id) or opts.device_id < 0:
        raise _fail(kernel_id, f"device_id must be an int >= 0, got {opts.device_id!r}")
    normalize_state(kernel_id, opts.state)
    return opts


def normalize_state(kernel_id: str, state: Any) -> Any:
    """The initial state as a contiguous numeric NumPy array, or a buffer object as is."""
    if state is None:
        return np.zeros(1, dtype=np.float64)
    if hasattr(state, "ensure_on_device") and hasattr(state, "device"):
        return state  # a UnifiedBuffer: its device array is the state
    if isinstance(state, tuple) and len(state) == 2 and not isinstance(state[0], np.ndarray):
        shape, dtype = state
        try:
            arr = np.zeros(shape, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise _fail(kernel_id, f"state=(shape, dtype) is not valid: {exc}") from exc
    elif isinstance(state, np.ndarray):
        arr = np.ascontiguousarray(state)
    else:
        raise _fail(
            kernel_id,
            f"state must be a NumPy array, a (shape, dtype) pair or a UnifiedBuffer, got "
            f"{type(state).__name__}",
            TypeValidationError,
        )
    if arr.dtype.kind not in "biuf" or arr.dtype.fields is not None:
        raise _fail(
            kernel_id,
            f"state must hold numbers (bool, int, uint, float), got dtype {arr.dtype}",
            TypeValidationError,
        )
    if arr.ndim == 0 or arr.size == 0:
        raise _fail(kernel_id, f"state must be a non-empty array, got shape {arr.shape}")
    return arr


def _unfit_fields(cls: type) -> list[str]:
    """``name: annotation`` of each field that stops ``cls`` from having a fixed layout."""
    out: list[str] = []
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = message_field_names(cls)
    except Exception:
        return out
    for name in fields:
        tp = hints.get(name)
        if name in _HEADER_NAMES or _field_layout(tp) is None:
            if isinstance(tp, str):
                shown = tp
            elif isinstance(tp, type) and not typing.get_args(tp):
                shown = tp.__name__
            else:
                shown = repr(tp).replace("typing.", "")
            out.append(f"{name}: {shown}")
    return out


def _check_message_type(kernel_id: str, role: str, tp: Any) -> np.dtype[Any]:
    if tp is None:
        raise _fail(
            kernel_id,
            f"needs an {role}: a fixed-layout @message class (its records are the ring slots)",
            TypeValidationError,
        )
    if not isinstance(tp, type):
        raise _fail(kernel_id, f"{role} must be a @message class, got {tp!r}", TypeValidationError)
    dtype = fixed_layout_dtype(tp)
    if dtype is None:
        bad = _unfit_fields(tp)
        which = ""
        if bad:
            listed = ", ".join(repr(b) for b in bad)
            which = f" (field {listed} has" if len(bad) == 1 else f" (fields {listed} have"
            which += " no fixed size)"
        raise _fail(
            kernel_id,
            f"{role} {tp.__name__} is not a fixed-layout message{which}; {_FIXED_LAYOUT_HINT}",
            TypeValidationError,
        )
    return dtype


def _check_kind(kernel_id: str, fn: Any) -> None:
    """Refuse an async actor: the tier's actor-kind check (`check_actor_kind`), worded for
    a device handler. It comes first, before the message types are looked at: a wrong kind
    of actor is the first thing to fix."""
    check_actor_kind(
        kernel_id,
        "gpu",
        getattr(fn, "py_func", fn),
        "sync",
        runs=(
            "the gpu tier runs device functions 'def handler(inp, out, state) -> int', not "
            "async actors"
        ),
        advice=(
            "; write the handler as a plain def over the message records, or drop "
            "backend='cuda' (tier='gpu') to run the async actor on the asyncio tier"
        ),
    )


def _check_handler(kernel_id: str, fn: Any) -> None:
    py = getattr(fn, "py_func", fn)
    name = getattr(py, "__name__", repr(py))
    if not callable(py):
        raise _fail(
            kernel_id,
            f"the handler must be a function, got {type(fn).__name__}",
            TypeValidationError,
        )
    _check_kind(kernel_id, fn)
    target = getattr(fn, "targetoptions", None)
    if isinstance(target, dict) and target.get("device") is False:
        raise _fail(
            kernel_id,
            f"{name!r} is a CUDA kernel (@cuda.jit); the handler must be a device function: "
            "use @cuda.jit(device=True) or no decorator",
            TypeValidationError,
        )
    try:
        sig = inspect.signature(py)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    if len(required) > 3 or (len(positional) < 3 and not varargs):
        shown = ", ".join(p.name for p in params)
        raise _fail(
            kernel_id,
            f"the handler {name!r} must take (inp, out, state) and return an int status "
            f"(0 = reply); it takes ({shown})",
            TypeValidationError,
        )


def check_spec(
    kernel_id: str,
    fn: Any,
    input_type: Any,
    output_type: Any,
    *,
    grid_size: int,
    block_size: int,
    extra: dict[str, Any],
    restart: str = "never",
) -> tuple[GPUKernelOptions, np.dtype[Any], np.dtype[Any]]:
    """Validate everything about a GPU ring kernel; returns its options and slot layouts.

    Raises:
        TypeValidationError: message types without a fixed layout, a handler of the wrong
            kind or arity, a state that is not numeric.
        InvalidConfigurationError: unknown or out-of-range options, ``grid_size != 1``.
    """
    if extra.get("cuda_source") is None:
        _check_kind(kernel_id, fn)
    in_dtype = _check_message_type(kernel_id, "input_type", input_type)
    out_dtype = _check_message_type(kernel_id, "output_type", output_type)
    opts = resolve_options(kernel_id, extra)
    if grid_size != 1:
        raise _fail(
            kernel_id,
            f"a GPU ring kernel is one persistent block, so grid_size must be 1, got {grid_size}; "
            "use cooperative=True with block_size=... to put more threads on each message",
        )
    if restart != "never":
        raise _fail(
            kernel_id,
            f"restart={restart!r} is not supported: a GPU ring kernel is not restarted after a "
            "fault (a faulted CUDA context cannot be recovered in the process); use "
            "restart='never' and relaunch it from your code",
        )
    if opts.cooperative and not 1 <= block_size <= 1024:
        raise _fail(kernel_id, f"block_size must be in 1..1024, got {block_size}")
    if opts.cuda_source is None:
        _check_handler(kernel_id, fn)
    return opts, in_dtype, out_dtype
