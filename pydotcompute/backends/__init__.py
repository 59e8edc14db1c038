"""Compute backends: CPU (NumPy/Numba), CUDA (CuPy/Numba CUDA) and Metal (MLX).

Importing this package imports none of CuPy, Numba or MLX; each backend loads its library the
first time it is probed or used.
"""

from __future__ import annotations

import threading

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

_CLASSES: dict[BackendType, type[Backend]] = {
    BackendType.CPU: CPUBackend,
    BackendType.CUDA: CUDABackend,
    BackendType.METAL: MetalBackend,
}
_instances: dict[tuple[BackendType, int], Backend] = {}
_lock = threading.Lock()


def get_backend(backend: BackendType | str | None = None, device_id: int = 0) -> Backend:
    """The shared backend instance for ``backend`` and ``device_id``.

    ``None`` means the accelerator's choice (honouring ``PYDOTCOMPUTE_BACKEND``). The
    instance may be unavailable; call ``require()`` or check ``is_available``.

    Raises:
        InvalidConfigurationError: ``backend`` names no backend.
    """
    if backend is None:
        from ..core.accelerator import get_accelerator

        kind = BackendType(get_accelerator().backend_type.value)
        device_id = get_accelerator().current_device_id if kind is not BackendType.CPU else 0
    else:
        try:
            kind = BackendType.parse(backend)
        except ValueError as exc:
            from ..exceptions import InvalidConfigurationError

            raise InvalidConfigurationError(str(exc)) from None
    key = (kind, device_id)
    with _lock:
        inst = _instances.get(key)
        if inst is None:
            inst = _CLASSES[kind](device_id)
            _instances[key] = inst
        return inst


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


def reset_backends() -> None:
    """Forget the shared instances (tests use this after changing the environment)."""
    with _lock:
        _instances.clear()


_reset_backends = reset_backends  # the earlier private name
