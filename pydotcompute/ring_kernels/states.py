"""The states of a ring kernel: a leaf module, so that anything (errors included) can name
a state without importing the kernel."""

from __future__ import annotations

import enum

__all__ = ("KernelState",)


class KernelState(enum.Enum):
    """Lifecycle states of a ring kernel."""

    CREATED = "created"
    LAUNCHED = "launched"
    ACTIVE = "active"
    DEACTIVATED = "deactivated"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"
