"""The thread tier: the actor is a plain function running in a thread of its own.

- `worker.py`: `ThreadWorker`, the mechanism and the `TierWorker` at once, and its
  `ThreadedKernelConfig`;
- `context.py`: `ThreadedKernelContext`, what the actor sees;
- `sync_queue.py`: the blocking queues it moves messages through (`SPSCQueue`,
  `SyncQueue`);
- `hosted.py`: `ThreadHostedKernel`, what `runtime.launch(..., tier="thread")` builds;
- `standalone.py`: `ThreadedRingKernel` and `ThreadedKernelPool`, the synchronous face
  for use without a runtime.
"""

from __future__ import annotations

from ...._public import expose
from .context import ThreadedKernelContext
from .hosted import ThreadHostedKernel
from .standalone import ThreadedKernelPool, ThreadedKernelState, ThreadedRingKernel
from .sync_queue import SPSCQueue, SyncQueue
from .worker import ThreadedKernelConfig, ThreadWorker

__all__ = (
    "SPSCQueue",
    "SyncQueue",
    "ThreadHostedKernel",
    "ThreadWorker",
    "ThreadedKernelConfig",
    "ThreadedKernelContext",
    "ThreadedKernelPool",
    "ThreadedKernelState",
    "ThreadedRingKernel",
)

# The names `pydotcompute.ring_kernels` exports report it as their module.
expose(
    "pydotcompute.ring_kernels",
    (
        "SPSCQueue",
        "SyncQueue",
        "ThreadedKernelConfig",
        "ThreadedKernelContext",
        "ThreadedKernelPool",
        "ThreadedKernelState",
        "ThreadedRingKernel",
    ),
    globals(),
)
