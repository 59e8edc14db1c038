"""The SPSC rings, compiled when possible: picks ``fast_spsc`` or its pure-Python twin.

Both implementations expose the same names (`FastSPSCQueue`,
`SharedByteRing`, `SharedSegment`) with the same semantics and the same
shared-memory layout, so a process using the extension can talk to one using the twin.
``PYDOTCOMPUTE_PUREPYTHON=1`` (set before import) forces the twin; tests and CI run the
queue and tier suites both ways.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

__all__ = (
    "CYTHON_AVAILABLE",
    "IMPLEMENTATION",
    "FastSPSCQueue",
    "SharedByteRing",
    "SharedSegment",
    "extension_import_error",
    "is_cython_available",
)

_FORCED_PURE = os.environ.get("PYDOTCOMPUTE_PUREPYTHON", "") not in ("", "0")
_import_error: str | None = None
CYTHON_AVAILABLE: bool

if TYPE_CHECKING:  # both implementations have the twin's signatures
    from .._spsc_py import FastSPSCQueue, SharedByteRing, SharedSegment
elif _FORCED_PURE:
    from .._spsc_py import FastSPSCQueue, SharedByteRing, SharedSegment

    _import_error = "disabled by PYDOTCOMPUTE_PUREPYTHON"
else:
    try:
        from .fast_spsc import FastSPSCQueue, SharedByteRing, SharedSegment
    except ImportError as exc:  # not built (no compiler at install time)
        from .._spsc_py import FastSPSCQueue, SharedByteRing, SharedSegment

        _import_error = f"{exc} (build it with: python setup_cython.py build_ext --inplace)"

CYTHON_AVAILABLE = _import_error is None
IMPLEMENTATION = "cython" if CYTHON_AVAILABLE else "python"


def is_cython_available() -> bool:
    """True when the compiled ``fast_spsc`` extension is in use (not the pure-Python twin)."""
    return CYTHON_AVAILABLE


def extension_import_error() -> str | None:
    """Why the extension is not in use (None when it is); for ``show_config()``."""
    return _import_error
