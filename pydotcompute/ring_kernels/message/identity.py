"""One class per tag: the declared types of kernels, and the errors that name classes.

Design notes:
- A frame names its class by its tag (the fully qualified name) alone, so two classes of
  one name are the one thing a receiver cannot tell apart: a module reloaded, or a
  factory that made a class twice. The rule, the same on every tier: a kernel declares
  only a class that holds its tag (`check_declared_types`, at launch; the registry then
  refuses the tag to any other class while the kernel lives), and what a hop decodes for
  a kernel is checked against the class it declares (`expecting`). Accepting an older
  definition in place of the newer was rejected: the two are different classes (their
  methods, `isinstance`), and a process that never saw the reload could not tell.
- Errors name classes by their short name when that tells them apart, else by module and
  qualified name, and say when the two are one name defined twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...exceptions import MessageDeserializationError, TypeValidationError
from .codec import holds_its_tag, message_tag
from .declared import declare_message_types

__all__ = (
    "check_declared_types",
    "class_names",
    "expecting",
    "mismatch_text",
    "redefinition_note",
    "superseded_text",
)

_REDEFINED = (
    "the class was reloaded or redefined: a module reloaded, or a factory that made it "
    "twice; the two are different classes"
)


def _full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def class_names(got: type, expected: type) -> tuple[str, str]:
    """How an error names ``got`` and ``expected``: their short names, or their module and
    qualified names when the short names are the same."""
    if got.__name__ != expected.__name__:
        return got.__name__, expected.__name__
    return _full_name(got), _full_name(expected)


def redefinition_note(got: type, expected: type) -> str:
    """`` of another definition (...)`` when ``got`` and ``expected`` are two classes of
    one message name (one tag), else ``""``."""
    if got is expected or not _same_tag(got, expected):
        return ""
    return f" of another definition ({_REDEFINED})"


def _same_tag(a: type, b: type) -> bool:
    try:
        return message_tag(a) == message_tag(b)
    except AttributeError:  # not a class with a module and a qualified name
        return False


def superseded_text(cls: type) -> str:
    """Why a message of ``cls``, a class whose tag another class took over, is refused."""
    return (
        f"{_full_name(cls)} was reloaded or redefined: another class of that name and "
        "fields now holds its wire tag (a module reloaded, or a factory that made the class "
        "twice), so its messages would decode as that class; build them from the class as "
        "its module defines it now"
    )


def check_declared_types(kernel: Any, **roles: type | None) -> None:
    """Check the classes a kernel declares (``input_type=A, output_type=B``) and record
    them for it (`declared.declare_message_types`).

    Raises:
        TypeValidationError: a class does not hold its wire tag any more (reloaded or
            redefined since): the kernel's messages would decode as the class that does.
    """
    kid = getattr(kernel, "kernel_id", "?")
    for role, cls in roles.items():
        if cls is not None and not holds_its_tag(cls):
            raise TypeValidationError(
                f"kernel {kid!r}: {role} {_full_name(cls)} does not hold its wire tag: "
                f"another class of that name and fields took it over ({_REDEFINED}), so "
                "the kernel's messages would decode as that class. Declare the class as "
                "its module defines it now, or give each class a factory makes a "
                "__qualname__ of its own"
            )
    declare_message_types(kernel, **roles)


def mismatch_text(got: type, expected: type) -> str:
    """``a X message, expected Y`` for a decoded ``got`` where ``expected`` was declared."""
    g, e = class_names(got, expected)
    return f"a {g} message{redefinition_note(got, expected)}, expected {e}"


def expecting(
    decode: Callable[[Any], Any], expected: type | None, kernel_id: str
) -> Callable[[Any], Any]:
    """``decode``, checking that what it decodes is an ``expected`` (None: ``decode``).

    The decoder of a hop into (or out of) a kernel that declares a type: the decoded class
    is the one holding the frame's tag, so this is how a frame of another class is refused
    there, with a `MessageDeserializationError` (a frame that does not decode, for every
    path that handles those).
    """
    if expected is None:
        return decode

    def checked(data: Any) -> Any:
        msg = decode(data)
        if msg.__class__ is not expected and not isinstance(msg, expected):
            raise MessageDeserializationError(
                f"kernel {kernel_id!r}: bytes hold {mismatch_text(type(msg), expected)}"
            )
        return msg

    return checked
