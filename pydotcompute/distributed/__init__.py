"""Ring kernels beyond one machine.

`RingKernelRuntime().launch(..., tier="ray")` places a `@ring_kernel` actor in a Ray actor
(the tier lives in `pydotcompute.ring_kernels.tiers.ray`); `ray.py` is the public entry
point, with `RayRingKernelRuntime`. Importing this package does not import Ray; Ray loads
on the first Ray launch (`pip install "pydotcompute[ray]"`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ray import RayKernel, RayRingKernelRuntime, is_ray_available

__all__ = ("RayKernel", "RayRingKernelRuntime", "is_ray_available")


def __getattr__(name: str) -> Any:
    # lazy: the Ray tier imports the runtime, which importing this package must not load
    if name in __all__:
        from . import ray

        return getattr(ray, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
