"""Which persistent GPU ring kernels run, and the guard that keeps device-wide syncs away.

A persistent ring kernel never finishes on its own: it ends when the host writes TERMINATE
into its control block. Anything that waits for *all* work on the device
(`cudaDeviceSynchronize`, `cupy.cuda.Device.synchronize`, `numba.cuda.synchronize`) or that
CUDA may turn into an implicit device synchronization (`cudaFree` of cached pool blocks)
therefore waits for every running ring kernel. Called from the event loop, it blocks the
very thread that would write TERMINATE, and the process hangs for good.

So the GPU tier records each kernel it starts here (`kernel_started` / `kernel_stopped`),
and every device-wide wait in the package calls `refuse_device_sync` first, which raises a
`CUDAError` naming the running kernels and the stream-scoped alternative. Callers that can
do with less (an orchestrator's own streams, a buffer's copy) wait on a stream instead when
`ring_kernels_running()` is true.

This module imports nothing heavy (no CuPy, no Numba): `import pydotcompute` stays light.
"""

from __future__ import annotations

import threading
from collections import Counter

from ..exceptions import CUDAError

__all__ = (
    "kernel_started",
    "kernel_stopped",
    "refuse_device_sync",
    "ring_kernels_running",
    "running_ring_kernels",
)

_running: Counter[str] = Counter()
_lock = threading.Lock()


def kernel_started(name: str) -> None:
    """Record that the persistent kernel ``name`` was launched (it may now be running)."""
    with _lock:
        _running[name] += 1


def kernel_stopped(name: str) -> None:
    """Record that the persistent kernel ``name`` ended (or its record is given up)."""
    with _lock:
        if _running[name] <= 1:
            _running.pop(name, None)
        else:
            _running[name] -= 1


def running_ring_kernels() -> list[str]:
    """The names of the persistent kernels that may be running now, sorted."""
    with _lock:
        return sorted(_running.elements())


def ring_kernels_running() -> bool:
    """True while any persistent ring kernel of this process may be running."""
    return bool(_running)


def refuse_device_sync(operation: str, alternative: str) -> None:
    """Raise if a device-wide synchronization would now wait for a persistent kernel.

    Args:
        operation: What was asked (``"CUDABackend.synchronize()"``).
        alternative: What to do instead (named in the error).

    Raises:
        CUDAError: persistent ring kernels are running; the message names them.
    """
    if not _running:
        return
    names = running_ring_kernels()
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise CUDAError(
        f"{operation} refused: it waits for all work on the device, and {len(names)} "
        f"persistent GPU ring kernel(s) are running ({shown}); they end only when told to, "
        f"so it would never return. {alternative}, or terminate the GPU actors first"
    )
