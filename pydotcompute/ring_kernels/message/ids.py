"""Message ids: unique v4-shaped UUIDs made without a system call per message.

Design notes:
- `uuid.uuid4()` reads `os.urandom` for every id. Here a 128-bit random base is read once
  per process (and again in a child after `fork`) and a counter is XOR-ed into its low
  bits; the version and variant bits are set in the base and the counter never reaches
  them, so every id is a well-formed version-4 UUID and no two ids of a process repeat.
- Ids are made lazily (see `base.py`): a message stores None until its id is read or it
  is serialized. `next_id_bytes` makes the 16 bytes the wire carries without building a
  `uuid.UUID`; `uuid_from_bytes` turns them into one when someone reads the id.
- When the `fast_message` extension is built, it holds the base and the counter (one C
  call per id, no 128-bit Python int); every id of the process then comes from it, so the
  two sources never hand out the same counter value.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable

from .._native import message_extension

__all__ = ("ID_SOURCE", "IdSource", "new_message_id", "next_id_bytes", "uuid_from_bytes")

# clear the version nibble and the two variant bits, then set version 4 / RFC 4122
_VERSION_MASK = ~(0xF000 << 64) & ~(0xC000 << 48) & ((1 << 128) - 1)
_VERSION_BITS = (0x4000 << 64) | (0x8000 << 48)
_new = object.__new__
_set = object.__setattr__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown
_UUID = uuid.UUID
_LOW64 = (1 << 64) - 1
_fast = message_extension()


class IdSource:
    """Unique RFC 4122 version-4 UUIDs: a random base (read once) XOR a counter."""

    __slots__ = ("base", "counter")

    def __init__(self) -> None:
        self.base = 0
        self.counter = itertools.count(1)
        self.reseed()

    def reseed(self) -> None:
        """Read a new random base and restart the counter (a forked child calls this)."""
        raw = int.from_bytes(os.urandom(16), "big")
        self.base = (raw & _VERSION_MASK) | _VERSION_BITS
        self.counter = itertools.count(1)
        if _fast is not None:
            _fast.reseed(self.base >> 64, self.base & _LOW64)

    def next_uuid(self) -> uuid.UUID:
        """The next id as a `uuid.UUID` (built without `UUID.__init__`'s checks)."""
        u = _new(_UUID)
        _set(u, "int", int.from_bytes(self.next_bytes(), "big"))
        _set(u, "is_safe", _SAFE_UNKNOWN)
        return u

    def next_bytes(self) -> bytes:
        """The next id as its 16 big-endian bytes (what the wire carries)."""
        if _fast is not None:
            return _fast.next_id_bytes()  # type: ignore[no-any-return]
        return (self.base ^ next(self.counter)).to_bytes(16, "big")


_ids = IdSource()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.reseed)
#: The process's id source (reseeded in place after a fork, so holding it is safe).
ID_SOURCE = _ids


def new_message_id() -> uuid.UUID:
    """A fresh message id (a version-4 UUID, unique in this process and across processes)."""
    return _ids.next_uuid()


#: A fresh message id as the 16 bytes the wire carries (one C call when compiled).
next_id_bytes: Callable[[], bytes] = _fast.next_id_bytes if _fast is not None else _ids.next_bytes


def uuid_from_bytes(raw: bytes) -> uuid.UUID:
    """The `uuid.UUID` of 16 id bytes (as `uuid.UUID(bytes=raw)`, without its checks)."""
    u = _new(_UUID)
    _set(u, "int", int.from_bytes(raw, "big"))
    _set(u, "is_safe", _SAFE_UNKNOWN)
    return u
