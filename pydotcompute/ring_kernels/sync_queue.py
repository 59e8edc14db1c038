"""The old path of the thread tier's blocking queues, which live in
`pydotcompute.ring_kernels.tiers.thread.sync_queue` (kept so that existing imports work)."""

from __future__ import annotations

from .tiers.thread.sync_queue import SPSCQueue as SPSCQueue
from .tiers.thread.sync_queue import SyncQueue as SyncQueue
from .wakers import WakerSet as WakerSet

__all__ = ("SPSCQueue", "SyncQueue", "WakerSet")
