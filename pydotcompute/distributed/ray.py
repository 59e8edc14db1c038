"""Ring kernels on a Ray cluster: `RayRingKernelRuntime`, a compatibility name.

The way to run a kernel in a Ray actor is the `"ray"` tier of the ordinary runtime:
`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)`. This module keeps
the name older code imports; the machinery lives in `driver.py` (`RayDriver`).
"""

from __future__ import annotations

from .driver import RAY_ACTOR_OPTIONS, RayDriver
from .driver import RayKernel as RayKernel
from .driver import is_ray_available as is_ray_available

__all__ = ("RAY_ACTOR_OPTIONS", "RayKernel", "RayRingKernelRuntime", "is_ray_available")


class RayRingKernelRuntime(RayDriver):
    """Launches, routes and supervises ring kernels placed in Ray actors.

    Every kernel of this runtime runs in its own Ray actor; the constructor arguments are
    those of `RayDriver`.
    """
