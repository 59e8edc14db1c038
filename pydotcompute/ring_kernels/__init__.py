"""Ring kernels: messages, queues, the lifecycle, the runtime and the execution tiers.

``__all__`` holds the names a program uses. What it takes to write a tier of your own (the
tier contract, the hosting bridge, the registry, the queues and rings the built-in tiers
are made of) is in `pydotcompute.ring_kernels.extend`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._public import expose as _expose
from ._loop import create_optimized_loop as create_optimized_loop
from ._loop import get_loop_info as get_loop_info
from ._loop import install_eager_task_factory as install_eager_task_factory
from ._loop import install_uvloop as install_uvloop
from ._loop import is_eager_tasks_installed as is_eager_tasks_installed
from ._loop import is_uvloop_available as is_uvloop_available
from ._loop import is_uvloop_installed as is_uvloop_installed
from ._loop import optimize_current_loop as optimize_current_loop
from .config import RingKernelConfig as RingKernelConfig
from .context import KernelContext as KernelContext
from .fast_queue import BackpressureStrategy as BackpressureStrategy
from .fast_queue import FastMessageQueue as FastMessageQueue
from .fast_queue import PriorityBand as PriorityBand
from .fast_queue import QueueStats as QueueStats
from .fast_queue import RingBuffer as RingBuffer
from .fast_queue import get_priority_band as get_priority_band
from .instruments import Instrument as Instrument
from .kernel import RingKernel as RingKernel
from .kernel import managed_kernel as managed_kernel
from .message import ArrayMessage as ArrayMessage
from .message import BufferHandle as BufferHandle
from .message import BufferRegistry as BufferRegistry
from .message import RingKernelMessage as RingKernelMessage
from .message import array_message as array_message
from .message import deserialize_message as deserialize_message
from .message import get_buffer as get_buffer
from .message import get_buffer_registry as get_buffer_registry
from .message import get_message_type as get_message_type
from .message import message as message
from .message import register_buffer as register_buffer
from .message import release_buffer as release_buffer
from .queue import MessageQueue as MessageQueue
from .registry import get_registered_kernel as get_registered_kernel
from .registry import register_ring_kernel as register_ring_kernel
from .runtime import RingKernelRuntime as RingKernelRuntime
from .states import KernelState as KernelState
from .telemetry import GPUMonitor as GPUMonitor
from .telemetry import RingKernelTelemetry as RingKernelTelemetry

# Tier-2/3 names load on first access so that importing the runtime starts no threads,
# processes or extension modules (type checkers see them below).
if TYPE_CHECKING:
    from .tiers.gpu import GPUKernelOptions, GPUKernelStatistics, GPURingKernel
    from .tiers.process.kernel import (
        CythonKernelConfig,
        CythonKernelContext,
        CythonKernelState,
        CythonRingKernel,
        is_cython_kernel_available,
    )
    from .tiers.thread import (
        SPSCQueue,
        SyncQueue,
        ThreadedKernelConfig,
        ThreadedKernelContext,
        ThreadedKernelPool,
        ThreadedKernelState,
        ThreadedRingKernel,
    )

_LAZY = {
    "ThreadedRingKernel": "tiers.thread",
    "ThreadedKernelContext": "tiers.thread",
    "ThreadedKernelConfig": "tiers.thread",
    "ThreadedKernelState": "tiers.thread",
    "ThreadedKernelPool": "tiers.thread",
    "SyncQueue": "tiers.thread",
    "SPSCQueue": "tiers.thread",
    "CythonRingKernel": "tiers.process.kernel",
    "CythonKernelContext": "tiers.process.kernel",
    "CythonKernelConfig": "tiers.process.kernel",
    "CythonKernelState": "tiers.process.kernel",
    "is_cython_kernel_available": "tiers.process.kernel",
    "GPURingKernel": "tiers.gpu",
    "GPUKernelOptions": "tiers.gpu",
    "GPUKernelStatistics": "tiers.gpu",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = (
    "ArrayMessage",
    "BackpressureStrategy",
    "BufferHandle",
    "BufferRegistry",
    "CythonKernelConfig",
    "CythonKernelContext",
    "CythonKernelState",
    "CythonRingKernel",
    "FastMessageQueue",
    "GPUKernelOptions",
    "GPUKernelStatistics",
    "GPUMonitor",
    "GPURingKernel",
    "Instrument",
    "KernelContext",
    "KernelState",
    "MessageQueue",
    "PriorityBand",
    "QueueStats",
    "RingBuffer",
    "RingKernel",
    "RingKernelConfig",
    "RingKernelMessage",
    "RingKernelRuntime",
    "RingKernelTelemetry",
    "SPSCQueue",
    "SyncQueue",
    "ThreadedKernelConfig",
    "ThreadedKernelContext",
    "ThreadedKernelPool",
    "ThreadedKernelState",
    "ThreadedRingKernel",
    "array_message",
    "create_optimized_loop",
    "deserialize_message",
    "get_buffer",
    "get_buffer_registry",
    "get_loop_info",
    "get_message_type",
    "get_priority_band",
    "get_registered_kernel",
    "install_eager_task_factory",
    "install_uvloop",
    "is_cython_kernel_available",
    "is_eager_tasks_installed",
    "is_uvloop_available",
    "is_uvloop_installed",
    "managed_kernel",
    "message",
    "optimize_current_loop",
    "register_buffer",
    "register_ring_kernel",
    "release_buffer",
)

_expose(__name__, __all__, globals())  # repr and pickles name `pydotcompute.ring_kernels.X`
