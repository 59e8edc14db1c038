"""Execution tiers: where an actor runs, one module each, behind one contract.

`contract.py` states what a tier provides (read its docstring first); the bridge that
applies the runtime's policy to a tier whose actor runs off the loop is policy and lives
beside the runtime (`ring_kernels/hosted.py`); the other modules are the tiers. Adding a
tier: write a `TierWorker` (or, for a tier that needs no bridge, a `RingKernel`
subclass), a `HostedKernel` subclass that builds it, and register it with
`register_tier`; `pydotcompute.ring_kernels.extend` holds every name that takes.

Tiers are imported lazily by name, so the default tier never loads threads, processes,
CUDA or Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

from ...exceptions import InvalidConfigurationError
from .contract import ActorKind, Capabilities, TierWorker, actor_kind, check_actor_kind

__all__ = (
    "ActorKind",
    "Capabilities",
    "TierWorker",
    "actor_kind",
    "canonical_tier",
    "check_actor_kind",
    "edge_provider",
    "register_tier",
    "tier_class",
    "tier_names",
    "unregister_tier",
)

_TIERS: dict[str, str | type] = {
    "asyncio": "pydotcompute.ring_kernels.kernel:RingKernel",
    "thread": "pydotcompute.ring_kernels.tiers.thread:ThreadHostedKernel",
    "process": "pydotcompute.ring_kernels.tiers.process.hosted:ProcessHostedKernel",
    "gpu": "pydotcompute.ring_kernels.tiers.gpu.kernel:GPUKernel",
    "ray": "pydotcompute.ring_kernels.tiers.ray:RayTierKernel",
}
_ALIASES = {"async": "asyncio", "threaded": "thread", "cython": "process", "cuda": "gpu"}


def register_tier(name: str, target: str | type) -> None:
    """Make `tier=name` build kernels with `target`: a class, or `"module:Class"` to import
    it on first use."""
    _TIERS[name] = target


def unregister_tier(name: str) -> None:
    """Forget tier `name` (a no-op when it is not registered)."""
    _TIERS.pop(name, None)


def tier_names() -> list[str]:
    """The registered tier names (aliases not included)."""
    return sorted(_TIERS)


def canonical_tier(name: str) -> str:
    """`name` with its alias resolved (`"cython"` -> `"process"`)."""
    return _ALIASES.get(name, name)


def tier_class(tier: str) -> Any:
    """The kernel class of tier `tier` (imported on first use).

    Raises:
        InvalidConfigurationError: no such tier, or it cannot be imported here.
    """
    tier = canonical_tier(tier)
    target = _TIERS.get(tier)
    if target is None:
        raise InvalidConfigurationError(
            f"unknown execution tier {tier!r}; choose one of {sorted(_TIERS)}"
        )
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise InvalidConfigurationError(f"execution tier {tier!r} is not available: {exc}") from exc
    if _TIERS.get(tier) is target:  # imported: every later launch gets the class at once
        _TIERS[tier] = cls
    return cls


#: The module that makes each direct edge kind another tier reads or writes in its own
#: process (a thread actor's end of a ``shm-ring`` edge); loaded by name, as tiers are.
_EDGE_PROVIDERS = {"shm-ring": "pydotcompute.ring_kernels.tiers.process.edge_local"}


def edge_provider(kind: str) -> Any:
    """The module providing edges of ``kind`` to a tier that does not make them itself
    (``make_input``, ``make_output``; see ``tiers/process/edge_local.py``), imported on
    first use.

    Raises:
        InvalidConfigurationError: no tier provides ``kind`` that way.
    """
    target = _EDGE_PROVIDERS.get(kind)
    if target is None:
        raise InvalidConfigurationError(
            f"no tier provides {kind!r} edges to others; known: {sorted(_EDGE_PROVIDERS)}"
        )
    return importlib.import_module(target)
