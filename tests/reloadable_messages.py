"""A message class that ``tests/tier_scenarios.py`` reloads with ``importlib.reload``.

Its own module, so that reloading it (a notebook cell run again) redefines nothing else;
every process that runs an actor imports it afresh by its module path.
"""

from __future__ import annotations

from pydotcompute import message


@message
class Pong:
    value: int
