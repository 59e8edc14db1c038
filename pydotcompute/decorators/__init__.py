"""Decorators: ``@ring_kernel`` (actors), ``@kernel`` / ``@gpu_kernel`` (compute kernels)."""

from __future__ import annotations

import importlib
from typing import Any

from .ring_kernel import RingKernelBuilder as RingKernelBuilder
from .ring_kernel import RingKernelMeta as RingKernelMeta
from .ring_kernel import get_ring_kernel_meta as get_ring_kernel_meta
from .ring_kernel import is_ring_kernel as is_ring_kernel
from .ring_kernel import ring_kernel as ring_kernel
from .validators import RuntimeValidator as RuntimeValidator
from .validators import get_validator as get_validator
from .validators import validate_backpressure_strategy as validate_backpressure_strategy
from .validators import validate_block_size as validate_block_size
from .validators import validate_config as validate_config
from .validators import validate_grid_size as validate_grid_size
from .validators import validate_message as validate_message
from .validators import validate_priority as validate_priority
from .validators import validate_queue_size as validate_queue_size

_LAZY = {
    "kernel": "kernel",
    "gpu_kernel": "kernel",
    "KernelRegistry": "kernel",
    "get_kernel_registry": "kernel",
    "cuda_source": "kernel",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = (
    "KernelRegistry",
    "RingKernelBuilder",
    "RingKernelMeta",
    "RuntimeValidator",
    "cuda_source",
    "get_kernel_registry",
    "get_ring_kernel_meta",
    "get_validator",
    "gpu_kernel",
    "is_ring_kernel",
    "kernel",
    "ring_kernel",
    "validate_backpressure_strategy",
    "validate_block_size",
    "validate_config",
    "validate_grid_size",
    "validate_message",
    "validate_priority",
    "validate_queue_size",
)
