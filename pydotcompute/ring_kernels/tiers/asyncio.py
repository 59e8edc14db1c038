"""The asyncio tier (the default): the actor is a task on the runtime's event loop.

Its kernel is the runtime's own `RingKernel`:
the actor takes messages straight from the banded inbox and replies straight into the
outbox, so no bridge stands between them and the policy of the tier contract is applied
on the queues themselves.
"""

from __future__ import annotations

from ..kernel import RingKernel

__all__ = ("AsyncioKernel",)

#: The kernel class `tier="asyncio"` builds.
AsyncioKernel = RingKernel
