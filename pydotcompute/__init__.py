"""pydotcompute: a GPU-native actor model for async Python.

Persistent actors ("ring kernels") own state, receive typed messages and reply; a runtime
launches, routes and supervises them on asyncio, threads, processes, CUDA or Ray.
Importing the package installs uvloop's event-loop policy when uvloop is available
(opt out with ``PYDOTCOMPUTE_NO_UVLOOP=1``) and imports no GPU or cluster library.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import exceptions as exceptions
from ._info import show_config as show_config
from ._public import expose as _expose
from ._version import __version__ as __version__
from .decorators.ring_kernel import ring_kernel as ring_kernel
from .ring_kernels._loop import install_uvloop as _install_uvloop
from .ring_kernels._loop import run as run
from .ring_kernels.context import KernelContext as KernelContext
from .ring_kernels.message import RingKernelMessage as RingKernelMessage
from .ring_kernels.message import message as message
from .ring_kernels.runtime import RingKernelRuntime as RingKernelRuntime
from .ring_kernels.states import KernelState as KernelState

_install_uvloop()

# Memory, devices and compute kernels load on first access (they pull in NumPy-side
# machinery and probe for CuPy / MLX lazily).
_LAZY = {
    "Accelerator": "pydotcompute.core",
    "UnifiedBuffer": "pydotcompute.core",
    "BufferState": "pydotcompute.core",
    "MemoryPool": "pydotcompute.core",
    "ComputeOrchestrator": "pydotcompute.core",
    "kernel": "pydotcompute.decorators.kernel",
    "gpu_kernel": "pydotcompute.decorators.kernel",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pydotcompute' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = (
    "Accelerator",
    "BufferState",
    "ComputeOrchestrator",
    "KernelContext",
    "KernelState",
    "MemoryPool",
    "RingKernelMessage",
    "RingKernelRuntime",
    "UnifiedBuffer",
    "__version__",
    "exceptions",
    "gpu_kernel",
    "kernel",
    "message",
    "ring_kernel",
    "run",
    "show_config",
)

_expose(__name__, __all__, globals())  # repr and pickles name `pydotcompute.X`
