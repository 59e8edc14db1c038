"""Devices and memory: the accelerator, unified host/device buffers, the memory pool and the
compute orchestrator."""

from __future__ import annotations

from .._public import expose as _expose
from .accelerator import Accelerator as Accelerator
from .accelerator import DeviceProperties as DeviceProperties
from .accelerator import DeviceType as DeviceType
from .accelerator import cuda_available as cuda_available
from .accelerator import get_accelerator as get_accelerator
from .accelerator import metal_available as metal_available
from .memory_pool import MemoryPool as MemoryPool
from .memory_pool import PoolStatistics as PoolStatistics
from .memory_pool import configure_memory_pool as configure_memory_pool
from .memory_pool import get_memory_pool as get_memory_pool
from .orchestrator import ComputeOrchestrator as ComputeOrchestrator
from .orchestrator import KernelExecution as KernelExecution
from .orchestrator import KernelLaunchConfig as KernelLaunchConfig
from .unified_buffer import BufferState as BufferState
from .unified_buffer import TransferStats as TransferStats
from .unified_buffer import UnifiedBuffer as UnifiedBuffer

__all__ = (
    "Accelerator",
    "BufferState",
    "ComputeOrchestrator",
    "DeviceProperties",
    "DeviceType",
    "KernelExecution",
    "KernelLaunchConfig",
    "MemoryPool",
    "PoolStatistics",
    "TransferStats",
    "UnifiedBuffer",
    "configure_memory_pool",
    "cuda_available",
    "get_accelerator",
    "get_memory_pool",
    "metal_available",
)

# The names `pydotcompute` exports report it as their module; the others report this one.
_expose(
    "pydotcompute",
    ("Accelerator", "BufferState", "MemoryPool", "ComputeOrchestrator", "UnifiedBuffer"),
    globals(),
)
_expose(__name__, __all__, globals())
