"""The shared backend instances, one per (kind, device), and the classes that make them.

A leaf (it imports only ``base``): device discovery and the compiler look backends up here,
while the backend modules use the compiler, so a lookup through the package would loop.
The package ``__init__`` registers the built-in classes on import, before anyone can ask.
"""

from __future__ import annotations

import threading

from ..exceptions import InvalidConfigurationError
from .base import Backend, BackendType

__all__ = ("backend_instance", "register_backend", "reset_backends")

_classes: dict[BackendType, type[Backend]] = {}
_instances: dict[tuple[BackendType, int], Backend] = {}
_lock = threading.Lock()


def register_backend(cls: type[Backend]) -> None:
    """Make ``cls`` the class that `backend_instance` builds for ``cls.backend_type``."""
    with _lock:
        _classes[cls.backend_type] = cls


def backend_instance(backend: BackendType | str, device_id: int = 0) -> Backend:
    """The shared instance of ``backend`` (a kind or its name) for ``device_id``.

    The instance may be unavailable; call ``require()`` or check ``is_available``.

    Raises:
        InvalidConfigurationError: ``backend`` names no backend, or ``device_id`` is not a
            non-negative int.
    """
    try:
        kind = BackendType.parse(backend)
    except ValueError as exc:
        raise InvalidConfigurationError(str(exc)) from None
    key = (kind, device_id)
    with _lock:
        inst = _instances.get(key)
        if inst is None:
            cls = _classes.get(kind)
            if cls is None:
                raise InvalidConfigurationError(
                    f"no class is registered for the {kind.value} backend; importing "
                    "pydotcompute.backends registers the built-in ones"
                )
            inst = cls(device_id)
            _instances[key] = inst
        return inst


def reset_backends() -> None:
    """Forget the shared instances (tests use this after changing the environment)."""
    with _lock:
        _instances.clear()
