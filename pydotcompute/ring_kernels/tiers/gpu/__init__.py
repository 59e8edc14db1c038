"""The GPU tier: the actor is a persistent CUDA kernel polling rings in mapped memory.

Its room holds the whole mechanism:

- `worker`: `GPUWorker`, the tier's `TierWorker` (the persistent kernel, its rings and
  control block, the task that watches them);
- `kernel`: `GPURingKernel`, what ``tier="gpu"`` builds: the hosting bridge
  (`HostedKernel`, which owns delivery, correlation, forwarding and drop accounting, as
  for the thread and process tiers) around a `GPUWorker`, with the device's side of
  launch, deactivate/reactivate and terminate, and the GPU's batch and record calls;
- `prepare`: declaration checks, memory reservation, eager compiling, compile-only PTX;
- `spec` (options, validation), `layout` (the control block), `host` (the host half of the
  rings), `slab` and `resources` (memory, streams, the device actor), `build`, `device`
  and `cuda_c` (the persistent kernel in Numba and in CUDA C), `simlaunch` (the Numba
  CUDA simulator).

The tier registry imports this package only when `tier="gpu"` is first launched. It loads
no CUDA library itself: `device`, `simlaunch` and `resources` import Numba and are loaded
only when a GPU actor is launched or compiled.
"""

from __future__ import annotations

from .kernel import STATUS_OK, GPUKernel, GPUKernelOptions, GPUKernelStatistics, GPURingKernel
from .prepare import (
    check_gpu_kernel_spec,
    compile_gpu_kernel_cuda_c,
    compile_gpu_kernel_ptx,
    prepare_gpu_kernel,
    reserve_gpu_memory,
)
from .worker import GPUWorker, HandlerRejectedError

__all__ = (
    "STATUS_OK",
    "GPUKernel",
    "GPUKernelOptions",
    "GPUKernelStatistics",
    "GPURingKernel",
    "GPUWorker",
    "HandlerRejectedError",
    "check_gpu_kernel_spec",
    "compile_gpu_kernel_cuda_c",
    "compile_gpu_kernel_ptx",
    "prepare_gpu_kernel",
    "reserve_gpu_memory",
)
