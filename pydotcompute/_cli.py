"""Pieces every ``python -m pydotcompute`` command shares: one-line usage errors.

A usage error is one line that names the fault and where the fix is (``--help``), never
argparse's usage block followed by the error: a line a user reads at once and a script can
log whole.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ("OneLineParser",)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line that points at ``--help``."""

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after one line: the program, the fault, where the usage is."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
