"""The package version, in a module that imports nothing.

`pydotcompute/__init__.py` re-exports it and modules that report it (`_info`) read it here,
so they do not import the package they are part of.
"""

from __future__ import annotations

__all__ = ("__version__",)

__version__ = "0.3.0"
