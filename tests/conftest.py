"""The project's tests use the same pytest plugin downstream projects get.

Installed (``pip install -e .``), the plugin arrives through the ``pytest11`` entry point;
from a bare checkout it is loaded here. Every test runs under the leak guard: no kernel
task, thread, child process or shared-memory segment may outlive it.
"""

from __future__ import annotations

import sys

import pytest

from pydotcompute.testing import LeakGuard

if "pydotcompute.testing.plugin" not in sys.modules:  # not loaded by the entry point
    pytest_plugins = ["pydotcompute.testing.plugin"]


@pytest.fixture(autouse=True)
def _leak_guard(pydotcompute_leak_guard: LeakGuard | None) -> LeakGuard | None:
    return pydotcompute_leak_guard
