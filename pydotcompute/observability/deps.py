"""The optional packages observability needs, and the error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..exceptions import BackendNotAvailableError

__all__ = ("INSTALL_HINT", "require")

INSTALL_HINT = 'pip install "pydotcompute[observability]"'


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise `BackendNotAvailableError` naming the extra.

    Raises:
        BackendNotAvailableError: ``module`` is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendNotAvailableError(
            f"{feature} needs the {module.split('.')[0]!r} package, which is not installed: "
            f"{INSTALL_HINT}"
        ) from exc
