"""The Ray tier: each ring kernel runs in a Ray actor, placed and supervised by Ray.

`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)` builds a
`RayTierKernel` (``kernel.py``), the driver's side of one kernel; ``host.py`` is the Ray
actor that hosts it, ``wire.py`` how errors cross, ``session.py`` what the kernels of one
runtime share (Ray init, actor names, placement options), ``runtime.py`` the
`RayRingKernelRuntime` subclass. Nothing here imports Ray until a kernel launches.
"""

from __future__ import annotations

from .kernel import RayTierKernel
from .runtime import RayRingKernelRuntime
from .session import (
    RAY_ACTOR_OPTIONS,
    RaySession,
    is_ray_available,
    session_for,
    use_session,
)

__all__ = (
    "RAY_ACTOR_OPTIONS",
    "RayKernel",
    "RayRingKernelRuntime",
    "RaySession",
    "RayTierKernel",
    "is_ray_available",
    "session_for",
    "use_session",
)

#: The name older code used for the driver's handle on a kernel in a Ray actor.
RayKernel = RayTierKernel
