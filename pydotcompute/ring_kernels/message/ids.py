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
- A `send_and_receive` request whose id is not made yet gets one from its kernel's
  *request space* (`request_space`, `next_request_id`): the high 8 bytes are fixed per
  kernel id, the low 8 are those of a fresh id (unique in the process). A runtime can so tell a
  reply correlated with one of its callers' requests from any other reply without
  remembering each request: a reply in the space that no caller waits for was abandoned.
  The space is derived from the kernel id, not drawn per process, so a request made in one
  process (a Ray driver) is recognised by the kernel in another; 60 bits of it are a hash,
  so an ordinary id falls in a given kernel's space with odds of 2**-60.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import uuid
from collections.abc import Callable

from .._native import message_extension

__all__ = (
    "ID_SOURCE",
    "IdSource",
    "in_request_space",
    "new_message_id",
    "next_id_bytes",
    "next_request_id",
    "request_space",
    "uuid_from_bytes",
)

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


# -- request spaces -------------------------------------------------------------------------

_spaces: dict[str, bytes] = {}


def request_space(kernel_id: str) -> bytes:
    """The high 8 bytes of every id `next_request_id` makes for kernel ``kernel_id``: a
    hash of the id with the version-4 nibble set (the same in every process)."""
    space = _spaces.get(kernel_id)
    if space is None:
        raw = bytearray(
            hashlib.blake2b(
                kernel_id.encode("utf-8", "surrogatepass"), digest_size=8, person=b"pdc-request"
            ).digest()
        )
        raw[6] = (raw[6] & 0x0F) | 0x40
        space = _spaces[kernel_id] = bytes(raw)
    return space


def next_request_id(space: bytes) -> bytes:
    """A fresh id, as its 16 wire bytes, in request space ``space`` (`request_space`): a
    well-formed version-4 UUID, never repeated in this process (its low 8 bytes are those
    of a fresh `next_id_bytes`: the process's base XOR its counter, variant bits set)."""
    return space + next_id_bytes()[8:]


def in_request_space(key: object, space: bytes | None) -> bool:
    """Whether ``key`` (a reply's correlation key: 16 bytes, None, or another value) is an
    id of request space ``space`` (None: a kernel that made no request has none, and
    nothing is in it)."""
    return type(key) is bytes and len(key) == 16 and key[:8] == space
