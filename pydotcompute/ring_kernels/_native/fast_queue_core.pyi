"""Type stubs of the compiled ``fast_queue_core`` extension (``fast_queue_core.pyx``).

Its pure-Python twin, ``queue_core_py.py``, has the same attributes, methods and results;
`FastMessageQueue` subclasses whichever core is in use and supplies the hooks
(``_band_of``, ``_not_a_message``, ``_closed_error``).
"""

import asyncio
from collections import deque
from typing import Any, Final, Literal, Self

from typing_extensions import disjoint_base

IMPLEMENTATION: Final[Literal["cython"]]

@disjoint_base
class QueueCore:
    """The per-message state and calls of a `FastMessageQueue` (compiled)."""

    _bands: list[deque[Any] | None] | tuple[None, ...]
    _closed: bool
    _count: int
    _decode: Any
    _dequeued: int
    _getters: deque[asyncio.Future[None]] | None
    _limit: int
    _loop: asyncio.AbstractEventLoop | None
    _peak: int
    _putters: deque[asyncio.Future[None]] | None
    _serialize: bool
    def __new__(cls, *args: Any, **kwargs: Any) -> Self: ...
    @property
    def qsize(self) -> int: ...
    def _append(self, item: Any) -> None: ...
    def offer(self, item: Any) -> bool: ...
    def _offer(self, item: Any) -> bool: ...
    def _new_band(self, band: int) -> deque[Any]: ...
    def take(self) -> Any: ...
    def _pop(self) -> Any: ...
    def park_getter(self) -> asyncio.Future[None]: ...
    def _park_getter(self) -> asyncio.Future[None]: ...
    def _bind_loop(self) -> asyncio.AbstractEventLoop: ...
