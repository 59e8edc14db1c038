"""Which message classes live kernels declare as their ``input_type`` / ``output_type``.

Design notes:
- A frame names its class by its tag alone, so a class redefined under the same tag (a
  module reloaded, a factory run twice) takes the tag over and frames decode into the new
  class. While a kernel declares the older class that would hand the kernel (and its
  callers) objects of another class, so the registry refuses the takeover while any live
  kernel declares the class holding the tag (`codec.register_message_type` asks
  `declared_by`). Refusing every redefinition was rejected: reloading a module of
  messages (a notebook cell run again) is how people work, and is harmless once no
  kernel uses the older class.
- Kernels are held weakly and counted live by the name of their state (launched, active,
  deactivated or terminating): this module imports no kernel module, and a kernel that
  ends, fails or is dropped stops holding its classes without a call of its own.
- Ended kernels are forgotten when a class's list has doubled since it was last pruned,
  not at every declaration: pruning each time made launching n kernels of one class
  O(n^2) (10,000 launches: 45 s instead of 0.3 s).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ...exceptions import TypeValidationError

__all__ = ("check_not_declared", "declare_message_types", "declared_by")

#: The states in which a kernel holds the classes it declares.
_LIVE = frozenset({"LAUNCHED", "ACTIVE", "DEACTIVATED", "TERMINATING"})
#: class -> (the kernel, weakly; the role it declares the class in), pruned as they end
_DECLARED: dict[type, list[tuple[weakref.ref[Any], str]]] = {}
#: class -> the length of its list at which ended kernels are pruned next
_PRUNE_AT: dict[type, int] = {}
_LOCK = threading.Lock()


def _state_name(kernel: Any) -> str:
    state = getattr(kernel, "state", None)
    return str(getattr(state, "name", state))


def declare_message_types(kernel: Any, **roles: type | None) -> None:
    """Record that ``kernel`` (an object with ``kernel_id`` and ``state``) declares the
    given classes, by role (``input_type=A, output_type=B``; None: no class).

    While the kernel's state is live, `declared_by` names it for these classes.
    """
    ref = weakref.ref(kernel)
    with _LOCK:
        for role, cls in roles.items():
            if cls is None:
                continue
            held = _DECLARED.setdefault(cls, [])
            if len(held) >= _PRUNE_AT.get(cls, 0):  # forget ended kernels (amortised)
                held[:] = [(r, n) for r, n in held if _holds(r)]
                _PRUNE_AT[cls] = 2 * len(held) + 8
            held.append((ref, role))


def _holds(ref: weakref.ref[Any]) -> bool:
    kernel = ref()
    return kernel is not None and _state_name(kernel) in _LIVE


def declared_by(cls: type) -> list[str]:
    """How live kernels declare ``cls``: ``["kernel 'k' (ACTIVE) as its input_type"]``,
    one entry per kernel; empty when none does."""
    with _LOCK:
        held = _DECLARED.get(cls, [])
        roles: dict[int, tuple[Any, list[str]]] = {}
        for ref, role in held:
            kernel = ref()
            if kernel is None or _state_name(kernel) not in _LIVE:
                continue
            roles.setdefault(id(kernel), (kernel, []))[1].append(role)
    return [
        f"kernel {getattr(k, 'kernel_id', '?')!r} ({_state_name(k)}) as its {' and '.join(names)}"
        for k, names in roles.values()
    ]


def check_not_declared(tag: str, held: type) -> None:
    """Refuse another class the tag ``tag`` while a live kernel declares ``held``, the
    class holding it (`codec.register_message_type` asks, under its lock).

    Raises:
        TypeValidationError: a live kernel declares ``held``; the text names it.
    """
    users = declared_by(held)
    if users:
        raise TypeValidationError(
            f"cannot redefine {tag}: it is declared by {'; '.join(users)}, which would be "
            "handed messages of the new class (frames decode into the class holding the "
            "tag). Terminate the kernel first, then reload the module or define the class "
            "again; or give the new class a name of its own"
        )
