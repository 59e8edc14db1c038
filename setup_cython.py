"""Declare (and optionally build) the Cython extensions ``fast_spsc``, ``fast_message``,
``fast_telemetry`` and ``fast_queue_core``.

Metadata lives in ``pyproject.toml``; this file only says which extension exists and how
to build it without making the build mandatory:

- ``pip install -e .`` (through ``setup.py``) compiles the extension when Cython and a C
  compiler are present. When either is missing, or compiling fails, it prints a warning
  and the package installs anyway; at import time
  ``pydotcompute.ring_kernels._native`` then selects the pure-Python twin.
- ``python setup_cython.py build_ext --inplace`` builds the extension next to its source
  (for a development checkout).

Set ``PYDOTCOMPUTE_REQUIRE_CYTHON=1`` to turn a failed build into an error (CI uses it to be
sure the extension job really tests the extension).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import Extension
from setuptools.command.build_ext import build_ext

#: (module name, Cython source): the rings, the messages' fast paths, the latency recorder,
#: the tier-1 queues' core
EXTENSIONS: tuple[tuple[str, str], ...] = (
    (
        "pydotcompute.ring_kernels._native.fast_spsc",
        "pydotcompute/ring_kernels/_native/fast_spsc.pyx",
    ),
    (
        "pydotcompute.ring_kernels._native.fast_message",
        "pydotcompute/ring_kernels/_native/fast_message.pyx",
    ),
    (
        "pydotcompute.ring_kernels._native.fast_telemetry",
        "pydotcompute/ring_kernels/_native/fast_telemetry.pyx",
    ),
    (
        "pydotcompute.ring_kernels._native.fast_queue_core",
        "pydotcompute/ring_kernels/_native/fast_queue_core.pyx",
    ),
)


def _required() -> bool:
    return os.environ.get("PYDOTCOMPUTE_REQUIRE_CYTHON", "") not in ("", "0")


def _extensions() -> list[Any]:
    """The extensions, cythonized when Cython is importable (else from shipped .c files).

    Each is prepared on its own, so one that fails to cythonize leaves the other built.
    """
    flags = [] if sys.platform == "win32" else ["-O3"]
    try:
        from Cython.Build import cythonize  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        shipped = []
        for name, pyx in EXTENSIONS:
            c_source = pyx[: -len(".pyx")] + ".c"
            if os.path.exists(c_source):
                shipped.append(Extension(name, [c_source], extra_compile_args=flags))
        if not shipped:
            if _required():
                raise
            print("pydotcompute: Cython is not installed; using the pure-Python fallbacks")
        return shipped
    out: list[Any] = []
    for name, pyx in EXTENSIONS:
        ext = Extension(name, [pyx], extra_compile_args=flags)
        try:
            out += cythonize(  # type: ignore[no-untyped-call,unused-ignore]
                [ext],
                compiler_directives={"language_level": "3"},
                quiet=True,
            )
        except Exception as exc:  # a Cython compile error must not break the install
            if _required():
                raise
            print(f"pydotcompute: cythonizing {pyx} failed ({exc}); using pure Python")
    return out


class OptionalBuildExt(build_ext):  # type: ignore[misc,unused-ignore]
    """``build_ext`` that warns instead of failing when the extension cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (distutils raises several types)
            self._warn(exc)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc)

    @staticmethod
    def _warn(exc: BaseException) -> None:
        if _required():
            raise exc
        print(
            f"pydotcompute: building a Cython extension failed ({exc}); the package "
            "works with its pure-Python twins (set PYDOTCOMPUTE_REQUIRE_CYTHON=1 to fail)",
            file=sys.stderr,
        )


def setup_kwargs() -> dict[str, Any]:
    """Keyword arguments for ``setuptools.setup`` (the extension and the optional builder)."""
    return {"ext_modules": _extensions(), "cmdclass": {"build_ext": OptionalBuildExt}}


def build_here(argv: list[str]) -> None:
    """Run build commands for the extension alone (``build_ext --inplace``).

    The project metadata in ``pyproject.toml`` is deliberately not read: building the
    extension in a checkout must not depend on the installed setuptools understanding
    every metadata field.
    """
    from setuptools import Distribution

    dist = Distribution(
        {
            "name": "pydotcompute-extensions",
            "script_name": "setup_cython.py",
            "script_args": argv,
            **setup_kwargs(),
        }
    )
    dist.parse_command_line()
    dist.run_commands()


if __name__ == "__main__":
    build_here(sys.argv[1:])
