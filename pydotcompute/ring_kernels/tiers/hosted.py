"""The old path of the hosting bridge, which is policy and lives in
`pydotcompute.ring_kernels.hosted` (kept so that existing imports work)."""

from __future__ import annotations

from ..hosted import HostedKernel as HostedKernel

__all__ = ("HostedKernel",)
