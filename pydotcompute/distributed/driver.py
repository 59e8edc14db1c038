"""Older import path of the Ray tier's names (see `pydotcompute.distributed.ray`).

The driver is no longer a runtime of its own: `RayRingKernelRuntime` (a
`RingKernelRuntime` on the Ray tier) takes its place, and `RayDriver` names it.
"""

from __future__ import annotations

from ..ring_kernels.tiers.ray import (
    RAY_ACTOR_OPTIONS,
    RayKernel,
    RayRingKernelRuntime,
    is_ray_available,
)

__all__ = ("RAY_ACTOR_OPTIONS", "RayDriver", "RayKernel", "is_ray_available")

RayDriver = RayRingKernelRuntime
