"""`WakerSet`: the callbacks a tier's queue or ring runs when it may have become readable or
writable. One primitive shared by the thread and process tiers (tiers never import each
other, so it lives beside the policy modules)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from ..exceptions import InvalidConfigurationError

__all__ = ("WakeOn", "Waker", "WakerSet")

Waker = Callable[[], None]
WakeOn = Literal["readable", "writable"]


class WakerSet:
    """Callbacks run after a queue may have become readable or writable."""

    __slots__ = ("readable", "writable")

    def __init__(self) -> None:
        self.readable: tuple[Waker, ...] = ()
        self.writable: tuple[Waker, ...] = ()

    def add(self, callback: Waker, when: WakeOn) -> None:
        if when == "readable":
            self.readable = (*self.readable, callback)
        elif when == "writable":
            self.writable = (*self.writable, callback)
        else:
            raise InvalidConfigurationError(
                f"a waker runs when a queue becomes 'readable' or 'writable', got {when!r}"
            )

    def remove(self, callback: Waker) -> None:
        self.readable = tuple(c for c in self.readable if c != callback)
        self.writable = tuple(c for c in self.writable if c != callback)
