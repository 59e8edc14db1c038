"""The Ray tier: each ring kernel runs in a Ray actor, placed and supervised by Ray.

`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)` builds a
`RayTierKernel` (``kernel.py``), a hosted kernel like the thread and process tiers': the
runtime's bridge keeps the policy on the driver and a `RayWorker` (``worker.py``, the
tier contract's `TierWorker`) moves batches to and from the Ray actor that runs the actor
function (``host.py``). ``wire.py`` is how errors cross, ``session.py`` what the kernels of
one runtime share (Ray init, actor names, placement options), ``runtime.py`` the
`RayRingKernelRuntime` constructor older code uses. Nothing here imports Ray until a kernel
launches.
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
from .worker import RayActorLostError, RayWorker

__all__ = (
    "RAY_ACTOR_OPTIONS",
    "RayActorLostError",
    "RayKernel",
    "RayRingKernelRuntime",
    "RaySession",
    "RayTierKernel",
    "RayWorker",
    "is_ray_available",
    "session_for",
    "use_session",
)

#: The name older code used for the driver's handle on a kernel in a Ray actor.
RayKernel = RayTierKernel
