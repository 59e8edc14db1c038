"""Ring kernels beyond one machine.

`RingKernelRuntime().launch(..., tier="ray")` places a `@ring_kernel` actor in a Ray actor;
`driver.py` is the machinery behind that tier, `ray.py` keeps the older
`RayRingKernelRuntime` as a compatibility name. Importing this package does not import
Ray; Ray loads on the first Ray launch (`pip install "pydotcompute[ray]"`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ray import RayKernel, RayRingKernelRuntime, is_ray_available

__all__ = ("RayKernel", "RayRingKernelRuntime", "is_ray_available")


def __getattr__(name: str) -> Any:
    # lazy: `ring_kernels/tiers/ray.py` imports `driver.py` from this package, and `ray.py`
    # imports that tier; importing `ray.py` here would make the two packages a cycle
    if name in __all__:
        from . import ray

        return getattr(ray, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
