"""Ray, reached lazily: ``import pydotcompute`` must never import it.

The package module that drives Ray is itself called ``ray`` (``pydotcompute.distributed.ray``),
so the real library is always fetched through `importlib` by absolute name.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from ..exceptions import BackendNotAvailableError
from ._host import KernelHost

__all__ = ("errors", "host_class", "is_ray_available", "ray_module", "reason")


def is_ray_available() -> bool:
    """True when the ``ray`` package can be imported (``pip install "pydotcompute[ray]"``)."""
    try:
        importlib.import_module("ray")
    except ImportError:
        return False
    return True


def ray_module() -> Any:
    """The ``ray`` package, or ``BackendNotAvailableError`` naming the extra to install."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise BackendNotAvailableError(
            f"the Ray runtime needs the 'ray' package ({exc}); "
            'install it with: pip install "pydotcompute[ray]"'
        ) from exc


class _RayErrors:
    """The Ray exception classes this module catches, looked up once."""

    actor: type[BaseException]
    unavailable: tuple[type[BaseException], ...]

    def __init__(self) -> None:
        mod = importlib.import_module("ray.exceptions")
        self.actor = mod.RayActorError
        unavailable = getattr(mod, "ActorUnavailableError", None)
        self.unavailable = (unavailable,) if unavailable is not None else ()


_ERRORS: _RayErrors | None = None


def errors() -> _RayErrors:
    global _ERRORS
    if _ERRORS is None:
        _ERRORS = _RayErrors()
    return _ERRORS


_HOST_CLASS: Any = None


def host_class() -> Any:
    """``ray.remote(KernelHost)``, built once per process."""
    global _HOST_CLASS
    if _HOST_CLASS is None:
        _HOST_CLASS = ray_module().remote(KernelHost)
    return _HOST_CLASS


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def reason(exc: BaseException) -> str:
    """The telling line of a Ray actor error: the exception that broke it, or why it died."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line) and not line.startswith("ray."):
            return line
    for line in reversed(lines):
        if line.lower().startswith(("the actor is dead because", "the actor died because")):
            return line
    return lines[0] if lines else type(exc).__name__
