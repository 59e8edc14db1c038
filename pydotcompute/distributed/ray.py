"""Ring kernels on a Ray cluster: the public entry point.

`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)` runs a kernel in a
Ray actor; `RayRingKernelRuntime` is the runtime whose kernels all go there. The tier
lives in `pydotcompute.ring_kernels.tiers.ray`; this module re-exports its public names.
Importing it does not import Ray.
"""

from __future__ import annotations

from ..ring_kernels.tiers.ray import (
    RAY_ACTOR_OPTIONS,
    RayActorLostError,
    RayKernel,
    RayRingKernelRuntime,
    RaySession,
    RayTierKernel,
    is_ray_available,
)

__all__ = (
    "RAY_ACTOR_OPTIONS",
    "RayActorLostError",
    "RayKernel",
    "RayRingKernelRuntime",
    "RaySession",
    "RayTierKernel",
    "is_ray_available",
)
