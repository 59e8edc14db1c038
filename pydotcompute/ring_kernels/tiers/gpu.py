"""The GPU tier: the actor is a persistent CUDA kernel polling rings in mapped memory.

The mechanism lives in `pydotcompute.ring_kernels.gpu_kernel` (and `_gpu/`); this
module states the tier's capabilities for the runtime. The registry imports it only when
`tier="gpu"` is first launched, so `import pydotcompute` loads no CUDA library.
"""

from __future__ import annotations

from typing import Any

from ..gpu_kernel import GPURingKernel
from ..states import KernelState

__all__ = ("GPUKernel",)


class GPUKernel(GPURingKernel):
    """`GPURingKernel` with the tier's capabilities stated for the runtime."""

    #: The handler is a device function (or none), not a Python actor: not checked.
    ACTOR_KIND = None
    #: A persistent device kernel is not restarted by the runtime: refused at launch.
    SUPPORTS_RESTART = False
    __slots__ = ()

    async def receive(self, timeout: float | None = None) -> Any:
        """As `GPURingKernel.receive`, but a kernel never activated raises at once (no
        reply can come), as on every tier."""
        if self._state is KernelState.LAUNCHED:
            raise self._not_active("receive from")
        return await super().receive(timeout)
