"""Public classes report the module users import them from.

`RingKernelRuntime` is defined in ``pydotcompute.ring_kernels.runtime`` but imported from
``pydotcompute``; `expose` sets its ``__module__`` to ``"pydotcompute"``, so that
``repr(cls)``, ``help()``, tracebacks and pickles name the path a user knows (as msgspec
and trio do). Each package ``__init__`` calls it for the classes it exports.

Design notes:
- A class moves only up, to an ancestor package that exports it under its own name
  (``__qualname__``), so the path it reports always resolves (pickle looks it up there) and
  the calls may run in any order: the shallowest public namespace wins.
- ``typing.get_type_hints`` evaluates a class's string annotations in the module named by
  ``__module__``; the class's own annotations are therefore resolved first, in the module
  that defined them, and stored as objects (a class whose annotations cannot be resolved
  at import time stays where it is).
- Message classes (msgspec Structs) are never moved: their wire tag and the check of their
  fields' types name the defining module.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable
from typing import Any

__all__ = ("expose",)


def expose(namespace: str, names: Iterable[str], scope: dict[str, Any]) -> None:
    """Report `namespace` as the module of each class in `names` (looked up in `scope`, the
    exporting package's globals) that lives in a submodule of it and is exported under its
    own name.

    Args:
        namespace: The public package, e.g. ``"pydotcompute"``.
        names: The names it exports (its ``__all__``).
        scope: Where those names are bound (the package's ``globals()``); names not bound
            yet (loaded on first access) are skipped.
    """
    for name in names:
        cls = scope.get(name)
        if not isinstance(cls, type) or cls.__qualname__ != name:
            continue
        if not cls.__module__.startswith(namespace + "."):
            continue  # already public here or higher up, or not ours
        if hasattr(cls, "__struct_fields__"):
            continue  # a message class: see the module's notes
        own = inspect.get_annotations(cls)
        if own:
            try:
                hints = typing.get_type_hints(cls, include_extras=True)
            except Exception:  # a name only imported for type checkers: leave it where it is
                continue
            cls.__annotations__ = {key: hints[key] for key in own}
        cls.__module__ = namespace
