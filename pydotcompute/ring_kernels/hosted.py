"""Old home of the hosted thread and process tiers (kept so existing imports work).

They live in `pydotcompute.ring_kernels.tiers` now: the bridge in `tiers/hosted.py`,
the tiers in `tiers/thread.py` and `tiers/process.py`.
"""

from __future__ import annotations

from .tiers.hosted import HostedKernel
from .tiers.process import ProcessHostedKernel
from .tiers.thread import ThreadHostedKernel

__all__ = ("HostedKernel", "ProcessHostedKernel", "ThreadHostedKernel")
