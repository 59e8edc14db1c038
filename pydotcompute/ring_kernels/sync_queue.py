"""Kept for 0.2 code: ``from pydotcompute.ring_kernels.sync_queue import ...`` (API.md).

The thread tier's blocking queues live in `pydotcompute.ring_kernels.tiers.thread.sync_queue`.
"""

from __future__ import annotations

from .tiers.thread.sync_queue import SPSCQueue as SPSCQueue
from .tiers.thread.sync_queue import SyncQueue as SyncQueue
from .wakers import WakerSet as WakerSet

__all__ = ("SPSCQueue", "SyncQueue", "WakerSet")
