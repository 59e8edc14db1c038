"""Testing tools for projects that build on pydotcompute (and for pydotcompute itself).

- Drive actors deterministically: `run_actor`, `ScriptedKernel`,
  `wait_until_idle`, `collect_replies`, `assert_no_drops`,
  `assert_no_failures`.
- Record what code moves between host and device: `RecordingBackend`.
- Run one test everywhere: `all_tiers`, `all_loops`, `event_loop_kinds`,
  `loop_factory`, and the ``*_unavailable_reason`` probes behind the skip markers.
- Catch leftovers: `LeakGuard`.

The pytest plugin (`pydotcompute.testing.plugin`, loaded automatically once
pydotcompute is installed) provides the fixtures and markers; see the "Testing your actors"
guide. Importing this module imports neither pytest nor any GPU library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .actors import ScriptedKernel as ScriptedKernel
from .actors import assert_no_drops as assert_no_drops
from .actors import assert_no_failures as assert_no_failures
from .actors import collect_replies as collect_replies
from .actors import run_actor as run_actor
from .actors import wait_until_idle as wait_until_idle
from .environment import LOOP_KINDS as LOOP_KINDS
from .environment import PYTHON_TIERS as PYTHON_TIERS
from .environment import all_loops as all_loops
from .environment import all_tiers as all_tiers
from .environment import cuda_unavailable_reason as cuda_unavailable_reason
from .environment import current_loop_kind as current_loop_kind
from .environment import event_loop_kinds as event_loop_kinds
from .environment import gpu_unavailable_reason as gpu_unavailable_reason
from .environment import loop_factory as loop_factory
from .environment import loop_unavailable_reason as loop_unavailable_reason
from .environment import metal_unavailable_reason as metal_unavailable_reason
from .environment import ray_unavailable_reason as ray_unavailable_reason
from .environment import selected_loop_kinds as selected_loop_kinds
from .environment import tier_unavailable_reason as tier_unavailable_reason
from .leaks import LeakGuard as LeakGuard

if TYPE_CHECKING:
    from .backend import BackendCall as BackendCall
    from .backend import RecordingBackend as RecordingBackend

# The recording backend builds on pydotcompute.backends; load it on first use.
_LAZY = {"RecordingBackend": ".backend", "BackendCall": ".backend"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = (
    "LOOP_KINDS",
    "PYTHON_TIERS",
    "BackendCall",
    "LeakGuard",
    "RecordingBackend",
    "ScriptedKernel",
    "all_loops",
    "all_tiers",
    "assert_no_drops",
    "assert_no_failures",
    "collect_replies",
    "cuda_unavailable_reason",
    "current_loop_kind",
    "event_loop_kinds",
    "gpu_unavailable_reason",
    "loop_factory",
    "loop_unavailable_reason",
    "metal_unavailable_reason",
    "ray_unavailable_reason",
    "run_actor",
    "selected_loop_kinds",
    "tier_unavailable_reason",
    "wait_until_idle",
)
