"""The process tier: the actor runs in a child process, fed through shared-memory rings.

- `worker`: the parent side, `ProcessWorker` (the tier's `TierWorker`).
- `child`: the child process's entry point and the actor's context.
- `framing`: the wire (record framing, plain values, reports); `waiting`: spin, then park.
- `launch`: starting and ending a child (stderr while it starts, exit codes, forks).
- `config`: `ProcessKernelConfig`; `kernel`: `ProcessKernel` (public name
  ``CythonRingKernel``), the synchronous façade; `hosted`: `ProcessHostedKernel`, what
  ``tier="process"`` builds.
- `edge`: direct ``shm-ring`` edges (band rings in shared memory); `edge_child` the
  child's side, `edge_worker` the parent's (`HostedProcessWorker`), `edge_local` a thread
  actor's in-process ends.

Names load on first use, so that the child, which imports `child`, loads neither the
parent side nor the runtime's hosting bridge.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ProcessHostedKernel": "hosted",
    "ProcessWorker": "worker",
    "ProcessKernel": "kernel",
    "ProcessKernelConfig": "config",
    "ProcessKernelContext": "child",
    "CythonKernelState": "kernel",
    "is_process_kernel_compiled": "kernel",
}

__all__ = tuple(sorted(_LAZY))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
