"""Ring kernels beyond one machine.

``pydotcompute.distributed.ray`` places each ``@ring_kernel`` actor in a Ray actor and
drives it with the usual lifecycle and messaging API (`RayRingKernelRuntime`).
Importing this package does not import Ray; Ray loads when a runtime starts
(``pip install "pydotcompute[ray]"``).
"""

from __future__ import annotations

from .ray import RayKernel as RayKernel
from .ray import RayRingKernelRuntime as RayRingKernelRuntime
from .ray import is_ray_available as is_ray_available

__all__ = ("RayKernel", "RayRingKernelRuntime", "is_ray_available")
