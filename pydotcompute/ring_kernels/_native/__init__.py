"""The compiled extensions, when built: the SPSC rings (``fast_spsc``, else its pure-Python
twin), the messages' fast paths (``fast_message``, else Python code in the message package),
the actors' latency recorder (``fast_telemetry``, else `telemetry.PyLatencyRecorder`) and the
tier-1 queues' hot core (``fast_queue_core``, else ``_native.queue_core_py.QueueCore``).

Both implementations expose the same names (`FastLock`, `FastSPSCQueue`,
`SharedByteRing`, `SharedSegment`) with the same semantics and the same
shared-memory layout, so a process using the extension can talk to one using the twin.
``PYDOTCOMPUTE_PUREPYTHON=1`` (set before import) forces the twin; tests and CI run the
queue and tier suites both ways.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = (
    "CYTHON_AVAILABLE",
    "IMPLEMENTATION",
    "FastLock",
    "FastSPSCQueue",
    "SharedByteRing",
    "SharedSegment",
    "extension_import_error",
    "is_cython_available",
    "message_extension",
    "queue_extension",
    "telemetry_extension",
)

_FORCED_PURE = os.environ.get("PYDOTCOMPUTE_PUREPYTHON", "") not in ("", "0")
_import_error: str | None = None
CYTHON_AVAILABLE: bool

if TYPE_CHECKING:  # both implementations have the twin's signatures
    from .spsc_py import FastLock, FastSPSCQueue, SharedByteRing, SharedSegment
elif _FORCED_PURE:
    from .spsc_py import FastLock, FastSPSCQueue, SharedByteRing, SharedSegment

    _import_error = "disabled by PYDOTCOMPUTE_PUREPYTHON"
else:
    try:
        from .fast_spsc import FastLock, FastSPSCQueue, SharedByteRing, SharedSegment
    except ImportError as exc:  # not built (no compiler at install time)
        from .spsc_py import FastLock, FastSPSCQueue, SharedByteRing, SharedSegment

        _import_error = f"{exc} (build it with: python setup_cython.py build_ext --inplace)"

CYTHON_AVAILABLE = _import_error is None
IMPLEMENTATION = "cython" if CYTHON_AVAILABLE else "python"

_fast_message: ModuleType | None = None
if not _FORCED_PURE:
    try:
        from . import fast_message
    except ImportError:  # not built: the message package runs its Python code
        pass
    else:
        _fast_message = fast_message


_fast_telemetry: ModuleType | None = None
if not _FORCED_PURE:
    try:
        from . import fast_telemetry
    except ImportError:  # not built: telemetry uses its Python recorder
        pass
    else:
        _fast_telemetry = fast_telemetry


_fast_queue_core: ModuleType | None = None
if not _FORCED_PURE:
    try:
        from . import fast_queue_core
    except ImportError:  # not built: the queues use their Python core
        pass
    else:
        _fast_queue_core = fast_queue_core


def message_extension() -> ModuleType | None:
    """The compiled ``fast_message`` module, or None (not built, or PYDOTCOMPUTE_PUREPYTHON)."""
    return _fast_message


def telemetry_extension() -> ModuleType | None:
    """The compiled ``fast_telemetry`` module, or None (not built, or PYDOTCOMPUTE_PUREPYTHON)."""
    return _fast_telemetry


def queue_extension() -> ModuleType | None:
    """The compiled ``fast_queue_core`` module, or None (not built, or PYDOTCOMPUTE_PUREPYTHON)."""
    return _fast_queue_core


def is_cython_available() -> bool:
    """True when the compiled ``fast_spsc`` extension is in use (not the pure-Python twin)."""
    return CYTHON_AVAILABLE


def extension_import_error() -> str | None:
    """Why the extension is not in use (None when it is); for ``show_config()``."""
    return _import_error
