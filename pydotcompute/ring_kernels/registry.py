"""The process-wide registry that ``@ring_kernel`` fills and ``runtime.launch(id)`` reads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from ..exceptions import KernelAlreadyExistsError, KernelNotFoundError

__all__ = (
    "RingKernelSpec",
    "clear_registry",
    "get_registered_kernel",
    "list_registered_kernels",
    "register_ring_kernel",
    "unregister_ring_kernel",
)


@dataclass(frozen=True)
class RingKernelSpec:
    """Everything needed to launch a registered kernel by id."""

    kernel_id: str
    func: Any
    input_type: type | None = None
    output_type: type | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def with_options(self, **options: Any) -> RingKernelSpec:
        return replace(self, options={**self.options, **options})


_REGISTRY: dict[str, RingKernelSpec] = {}
_LOCK = threading.Lock()


def register_ring_kernel(
    kernel_id: str,
    func: Any,
    *,
    input_type: type | None = None,
    output_type: type | None = None,
    replace_existing: bool = True,
    **options: Any,
) -> RingKernelSpec:
    """Register ``func`` under ``kernel_id`` so ``runtime.launch(kernel_id)`` finds it.

    Re-registering the same id replaces the entry (module reloads, notebooks) unless
    ``replace_existing=False``, which raises ``KernelAlreadyExistsError``.
    """
    spec = RingKernelSpec(kernel_id, func, input_type, output_type, dict(options))
    with _LOCK:
        if not replace_existing and kernel_id in _REGISTRY:
            raise KernelAlreadyExistsError(
                f"a ring kernel with id {kernel_id!r} is already registered "
                f"({_REGISTRY[kernel_id].func!r}); choose another kernel_id"
            )
        _REGISTRY[kernel_id] = spec
    return spec


def get_registered_kernel(kernel_id: str) -> RingKernelSpec:
    """The registered spec of ``kernel_id``; ``KernelNotFoundError`` lists known ids."""
    spec = _REGISTRY.get(kernel_id)
    if spec is None:
        raise KernelNotFoundError(kernel_id, _REGISTRY, where="@ring_kernel registry")
    return spec


def list_registered_kernels() -> list[str]:
    return sorted(_REGISTRY)


def unregister_ring_kernel(kernel_id: str) -> bool:
    with _LOCK:
        return _REGISTRY.pop(kernel_id, None) is not None


def clear_registry() -> None:
    with _LOCK:
        _REGISTRY.clear()
