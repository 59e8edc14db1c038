"""What it takes to write an execution tier: the names the built-in tiers are made of.

A program needs none of this (`pydotcompute` and `pydotcompute.ring_kernels` hold what it
uses). A tier is a `TierWorker`, the place one actor runs, plus a `HostedKernel` subclass
whose ``_make_worker(bridge)`` builds it, registered by name:

```python
from pydotcompute.ring_kernels.extend import Capabilities, HostedKernel, TierWorker, register_tier

class MyWorker(TierWorker):              # start/stop, offer, poll_reply, ...
    CAPABILITIES = Capabilities(resize=True)  # what it supports beyond the contract

class MyHostedKernel(HostedKernel):
    WORKER = MyWorker                     # its capabilities are the worker's
    def _make_worker(self, bridge: int) -> TierWorker:
        return MyWorker(...)

register_tier("mine", MyHostedKernel)     # runtime.launch(..., tier="mine")
```

A tier that needs no bridge (its actor runs on the event loop) subclasses `RingKernel`
instead. `TierWorker`'s docstring is the contract; ARCHITECTURE.md shows how the built-in
tiers use it. The building blocks: the blocking queues of the thread tier (`SyncQueue`,
`SPSCQueue`), the shared-memory rings of the process tier (`SharedByteRing`,
`SharedSegment`, `FastSPSCQueue`, `FastLock`: the compiled extension when built, else its
pure-Python twin) and the callbacks a queue runs when it may have become readable or
writable (`WakerSet`).

Design notes:
- A module of its own rather than more names in ``ring_kernels.__all__``: the user's
  namespace (and its reference page) lists what programs use, and tier authors get one
  import path instead of reaching into ``tiers/`` internals.
- The thread and process tiers' names load on first access, as in
  `pydotcompute.ring_kernels`, so importing this module loads no tier; nothing in the
  package imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._native import FastLock, FastSPSCQueue, SharedByteRing, SharedSegment
from .context import KernelContext
from .hosted import HostedKernel
from .kernel import KernelFunc, RingKernel
from .states import KernelState
from .tiers import (
    ActorKind,
    Capabilities,
    TierWorker,
    actor_kind,
    canonical_tier,
    check_actor_kind,
    register_tier,
    tier_class,
    tier_names,
    unregister_tier,
)
from .wakers import WakeOn, Waker, WakerSet

if TYPE_CHECKING:
    from .tiers.process import ProcessHostedKernel, ProcessWorker
    from .tiers.thread import SPSCQueue, SyncQueue, ThreadHostedKernel, ThreadWorker

__all__ = (
    "ActorKind",
    "Capabilities",
    "FastLock",
    "FastSPSCQueue",
    "HostedKernel",
    "KernelContext",
    "KernelFunc",
    "KernelState",
    "ProcessHostedKernel",
    "ProcessWorker",
    "RingKernel",
    "SPSCQueue",
    "SharedByteRing",
    "SharedSegment",
    "SyncQueue",
    "ThreadHostedKernel",
    "ThreadWorker",
    "TierWorker",
    "WakeOn",
    "Waker",
    "WakerSet",
    "actor_kind",
    "canonical_tier",
    "check_actor_kind",
    "register_tier",
    "tier_class",
    "tier_names",
    "unregister_tier",
)

_LAZY = {
    "ProcessHostedKernel": "pydotcompute.ring_kernels.tiers.process",
    "ProcessWorker": "pydotcompute.ring_kernels.tiers.process",
    "SPSCQueue": "pydotcompute.ring_kernels.tiers.thread",
    "SyncQueue": "pydotcompute.ring_kernels.tiers.thread",
    "ThreadHostedKernel": "pydotcompute.ring_kernels.tiers.thread",
    "ThreadWorker": "pydotcompute.ring_kernels.tiers.thread",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
