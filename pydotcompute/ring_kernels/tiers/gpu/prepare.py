"""What a GPU actor needs before it runs: declaration checks, memory reservation, eager
compiling and loading, and compile-only checks to PTX (no GPU needed).

Kept apart from the kernel's host state machine (`kernel.py`): these run at decoration
time, before the first launch, or in CI without a device.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import numpy as np

from ....exceptions import InvalidConfigurationError
from .spec import check_spec, normalize_state

__all__ = (
    "check_gpu_kernel_spec",
    "compile_gpu_kernel_cuda_c",
    "compile_gpu_kernel_ptx",
    "compile_within",
    "prepare_gpu_kernel",
    "reserve_gpu_memory",
    "state_host",
)


class Declaration(Protocol):
    """What `check_gpu_kernel_spec` reads of a ``@ring_kernel`` declaration
    (`decorators.ring_kernel.RingKernelMeta` is one; the decorator imports this module,
    so this one names the fields rather than importing the class back)."""

    @property
    def kernel_id(self) -> str: ...
    @property
    def input_type(self) -> type | None: ...
    @property
    def output_type(self) -> type | None: ...
    @property
    def grid_size(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def restart(self) -> str: ...
    @property
    def extra(self) -> dict[str, Any]: ...


def check_gpu_kernel_spec(meta: Declaration, fn: Any) -> None:
    """Validate a ``@ring_kernel(..., backend="cuda")`` declaration at decoration time.

    Raises:
        TypeValidationError: a message type without a fixed layout, or a handler that is
            not ``handler(inp, out, state) -> int``.
        InvalidConfigurationError: unknown or invalid GPU options, ``grid_size != 1``.

    Ray placement options (``num_gpus``, ...) are not GPU-tier options: they are left to
    the runtime (a Ray runtime uses them, an in-process one ignores them).
    """
    from ...runtime import PLACEMENT_OPTIONS

    check_spec(
        meta.kernel_id,
        fn,
        meta.input_type,
        meta.output_type,
        grid_size=meta.grid_size,
        block_size=meta.block_size,
        extra={k: v for k, v in meta.extra.items() if k not in PLACEMENT_OPTIONS},
        restart=meta.restart,
    )


def reserve_gpu_memory(mapped_mb: float, device_mb: float = 0.0, device_id: int = 0) -> None:
    """Set aside ring (mapped host) and state (device) memory for GPU actors up front.

    GPU actors take their rings and state from two slabs that grow only while no GPU actor
    runs (allocating may synchronize the device, which would wait for the running kernels
    forever). The slabs grow by ``PYDOTCOMPUTE_GPU_SLAB_MB`` MiB (default 64) on demand;
    call this before the first actor starts when more actors must start beside running
    ones than that holds.

    Raises:
        CUDAError: GPU actors are running already.
        InvalidConfigurationError: a negative size.
    """
    if mapped_mb < 0 or device_mb < 0:
        raise InvalidConfigurationError(
            f"reserve_gpu_memory sizes must be >= 0 MiB, got mapped_mb={mapped_mb!r}, "
            f"device_mb={device_mb!r}"
        )
    from .resources import reserve_memory

    reserve_memory(int(mapped_mb * (1 << 20)), int(device_mb * (1 << 20)), device_id)


def prepare_gpu_kernel(
    handler: Any,
    input_type: type,
    output_type: type,
    *,
    state: Any = None,
    cooperative: bool = False,
    block_size: int = 32,
    device_id: int = 0,
    cuda_source: str | None = None,
    handler_name: str = "handle",
) -> str:
    """Compile a handler's persistent kernel and load it onto the GPU now.

    Loading a module beside running persistent kernels may synchronize the device, which
    waits for them forever. Call this for every handler (with a state of the same dtype
    and shape as the actors will use) before the first GPU actor starts; actors launched
    later with the same handler and layouts reuse the loaded kernel. Under the CUDA
    simulator it only checks the declaration.

    Returns:
        The flavour: ``"numba"``, ``"cuda_c"`` or ``"simulator"``.

    Raises:
        KernelCompilationError: the handler does not compile.
        BackendNotAvailableError: no GPU (and the simulator is off).
    """
    extra: dict[str, Any] = {"cooperative": cooperative, "device_id": device_id}
    if cuda_source is not None:
        extra.update(cuda_source=cuda_source, handler_name=handler_name)
    opts, in_dt, out_dt = check_spec(
        "<prepare>",
        handler,
        input_type,
        output_type,
        grid_size=1,
        block_size=block_size,
        extra=extra,
    )
    from .resources import DeviceActor

    dev = DeviceActor(
        name="pydotcompute-gpu:<prepare>",
        handler=handler,
        cuda_source=opts.cuda_source,
        handler_name=opts.handler_name,
        in_name=input_type.__name__,
        out_name=output_type.__name__,
        in_dtype=in_dt,
        out_dtype=out_dt,
        state=normalize_state("<prepare>", state),
        cooperative=opts.cooperative,
        block_size=block_size,
        ring_in=1,
        ring_out=1,
        max_backoff_ns=opts.max_backoff_ns,
        drop_when_full=False,
        device_id=opts.device_id,
    )
    try:
        dev.compile()
    finally:
        dev.release()
    return dev.flavour


def compile_gpu_kernel_ptx(
    handler: Any,
    input_type: type,
    output_type: type,
    *,
    state: Any = None,
    cooperative: bool = False,
    cc: tuple[int, int] = (8, 0),
) -> str:
    """Compile the persistent kernel around a Python handler to PTX, without a GPU.

    Run it outside the simulator (Numba's ``compile_ptx`` is not available there); CI uses
    it to prove that a handler compiles for the device.

    Raises:
        KernelCompilationError: Numba rejected the handler (the text carries its error).
    """
    _, in_dt, out_dt = check_spec(
        "<compile>", handler, input_type, output_type, grid_size=1, block_size=32, extra={}
    )
    from . import build

    arr = state_host(normalize_state("<compile>", state))
    return build.compile_ptx(handler, in_dt, out_dt, arr, cooperative=cooperative, cc=cc)


def compile_gpu_kernel_cuda_c(
    cuda_source: str,
    input_type: type,
    output_type: type,
    *,
    handler_name: str = "handle",
    state: Any = None,
    cooperative: bool = False,
    cc: tuple[int, int] = (8, 0),
) -> tuple[str, str]:
    """Generate the CUDA C persistent kernel around ``cuda_source`` and compile it to PTX
    with NVRTC (no GPU needed). Returns ``(source, ptx)``.

    Raises:
        KernelCompilationError: NVRTC rejected the source (the text carries its log).
    """
    extra = {"cuda_source": cuda_source, "handler_name": handler_name}
    _, in_dt, out_dt = check_spec(
        "<compile>", None, input_type, output_type, grid_size=1, block_size=32, extra=extra
    )
    from . import cuda_c

    arr = state_host(normalize_state("<compile>", state))
    src = cuda_c.generate_source(
        cuda_source,
        handler_name,
        input_type.__name__,
        in_dt,
        output_type.__name__,
        out_dt,
        arr.dtype,
        arr.size,
        cooperative=cooperative,
    )
    return src, cuda_c.ptx(src, cc)


async def compile_within(dev: Any, limit: float | None) -> bool:
    """Run ``dev.compile()`` in a worker thread; False when it outlasts ``limit`` seconds.

    A thread cannot be stopped: past the limit the compile runs on, marked
    (``mark_compiling``) so that ``release`` waits, and ``dev.release()`` runs once it ends.
    """
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(None, dev.compile)
    done, _ = await asyncio.wait({fut}, timeout=limit)
    if done:
        fut.result()  # the compile's own error, if any
        return True
    dev.mark_compiling(True)

    def finished(f: asyncio.Future[Any]) -> None:
        dev.mark_compiling(False)
        if not f.cancelled():
            f.exception()  # retrieved: the launch already failed with the timeout
        dev.release()

    fut.add_done_callback(finished)
    return False


def state_host(state: Any) -> np.ndarray[Any, Any]:
    """The host array describing a state (a buffer's host side, or the array itself)."""
    return np.asarray(state.host) if hasattr(state, "ensure_on_device") else np.asarray(state)
