"""Compute backends: CPU (NumPy/Numba), CUDA (CuPy/Numba CUDA) and Metal (MLX).

Importing this package imports none of CuPy, Numba or MLX; each backend loads its library the
first time it is probed or used. The shared instances live in `_registry`, a leaf that device
discovery and the compiler use too; this module registers the three classes there on import.
"""

from __future__ import annotations

from ._registry import backend_instance as _backend_instance
from ._registry import register_backend as _register_backend
from ._registry import reset_backends as reset_backends
from .base import Backend as Backend
from .base import BackendType as BackendType
from .base import KernelExecutionResult as KernelExecutionResult
from .cpu import CPUBackend as CPUBackend
from .cuda import CUDABackend as CUDABackend
from .metal import MetalBackend as MetalBackend

__all__ = (
    "Backend",
    "BackendType",
    "CPUBackend",
    "CUDABackend",
    "KernelExecutionResult",
    "MetalBackend",
    "available_backends",
    "get_backend",
)

for _cls in (CPUBackend, CUDABackend, MetalBackend):
    _register_backend(_cls)


def get_backend(backend: BackendType | str | None = None, device_id: int = 0) -> Backend:
    """The shared backend instance for ``backend`` and ``device_id``.

    ``None`` means the accelerator's choice (honouring ``PYDOTCOMPUTE_BACKEND``). The
    instance may be unavailable; call ``require()`` or check ``is_available``.

    Raises:
        InvalidConfigurationError: ``backend`` names no backend.
    """
    if backend is None:
        from ..core.accelerator import get_accelerator

        accelerator = get_accelerator()
        kind = BackendType(accelerator.backend_type.value)
        device_id = accelerator.current_device_id if kind is not BackendType.CPU else 0
        return _backend_instance(kind, device_id)
    return _backend_instance(backend, device_id)


def available_backends() -> list[str]:
    """Names of the usable backends, e.g. ``["cpu", "metal"]``. Never raises."""
    names = []
    for kind in BackendType:
        try:
            if get_backend(kind).is_available:
                names.append(kind.value)
        except Exception:
            continue
    return names


_reset_backends = reset_backends  # the earlier private name
