"""Configuration and message validation shared by the decorators and the runtime.

Each validator returns the (normalized) value or raises a pydotcompute error whose text
names the offending value and the accepted range, so mistakes surface where they are made.

The public ``validate_*`` names keep the PyDotCompute 0.2 signatures and results (grid and
block sizes as tuples, ``validate_message`` / ``validate_config`` as decorators when given a
class); the runtime's own int-returning checks live under ``check_*`` names.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import threading
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from ..exceptions import InvalidConfigurationError, TypeValidationError
from ..ring_kernels.fast_queue import BackpressureStrategy
from ..ring_kernels.message import class_names, redefinition_note

__all__ = (
    "RuntimeValidator",
    "check_block_size",
    "check_grid_size",
    "check_kernel_config",
    "check_message",
    "check_queue_size",
    "get_validator",
    "validate_backpressure_strategy",
    "validate_block_size",
    "validate_config",
    "validate_grid_size",
    "validate_kernel_id",
    "validate_message",
    "validate_message_type",
    "validate_priority",
    "validate_queue_size",
    "validate_seconds",
    "wrong_message_type",
)

MAX_QUEUE_SIZE = 1 << 24
MAX_BLOCK_SIZE = 1024
#: The bound of the public ``validate_queue_size`` (0.2's); the runtime allows MAX_QUEUE_SIZE.
COMPAT_MAX_QUEUE_SIZE = 1_000_000
RESTART_POLICIES = ("never", "on_failure")

_T = TypeVar("_T")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_kernel_id(kernel_id: object) -> str:
    """A kernel id is a non-empty string."""
    if not isinstance(kernel_id, str) or not kernel_id.strip():
        raise InvalidConfigurationError(f"kernel_id must be a non-empty string, got {kernel_id!r}")
    return kernel_id


def check_queue_size(size: object, name: str = "queue_size") -> int:
    """The runtime's queue-size check: an int (not a bool) in 1..2**24."""
    if not _is_int(size) or not 1 <= size <= MAX_QUEUE_SIZE:  # type: ignore[operator]
        raise InvalidConfigurationError(
            f"{name} must be an int in 1..{MAX_QUEUE_SIZE}, got {size!r}"
        )
    return size  # type: ignore[return-value]


def check_grid_size(size: object) -> int:
    """The runtime's grid-size check: an int >= 1; returns the int."""
    if not _is_int(size) or size < 1:  # type: ignore[operator]
        raise InvalidConfigurationError(f"grid_size must be an int >= 1, got {size!r}")
    return size  # type: ignore[return-value]


def check_block_size(size: object) -> int:
    """The runtime's block-size check: an int in 1..1024 (the CUDA limit); returns the int."""
    if not _is_int(size) or not 1 <= size <= MAX_BLOCK_SIZE:  # type: ignore[operator]
        raise InvalidConfigurationError(
            f"block_size must be an int in 1..{MAX_BLOCK_SIZE}, got {size!r}"
        )
    return size  # type: ignore[return-value]


def validate_queue_size(size: object, name: str = "queue_size") -> int:
    """A queue size: an int in 1..1,000,000 (PyDotCompute 0.2's range; ``True`` counts as 1).

    The runtime itself accepts up to 2**24 (see ``check_queue_size``).
    """
    if not isinstance(size, int) or not 1 <= size <= COMPAT_MAX_QUEUE_SIZE:
        raise InvalidConfigurationError(
            f"{name} must be an int in 1..{COMPAT_MAX_QUEUE_SIZE}, got {size!r}"
        )
    return int(size)


def _dims(size: object, name: str) -> tuple[int, ...]:
    if _is_int(size):
        dims: tuple[object, ...] = (size,)
    elif isinstance(size, tuple):
        dims = size
    else:
        raise InvalidConfigurationError(
            f"{name} must be an int or a tuple of up to 3 positive ints, got {size!r}"
        )
    if len(dims) > 3:
        raise InvalidConfigurationError(
            f"{name} has at most 3 dimensions, got {len(dims)}: {size!r}"
        )
    for d in dims:
        if not _is_int(d) or d < 1:  # type: ignore[operator]
            raise InvalidConfigurationError(
                f"{name} dimensions must be positive ints, got {d!r} in {size!r}"
            )
    return dims  # type: ignore[return-value]


def validate_grid_size(size: object, name: str = "grid_size") -> tuple[int, ...]:
    """A grid size: an int or a tuple of up to 3 positive ints; returns the tuple.

    ``1 -> (1,)``, ``(2, 3) -> (2, 3)``; ``()`` is accepted and returned as is.
    """
    return _dims(size, name)


def validate_block_size(
    size: object, name: str = "block_size", max_threads: int = MAX_BLOCK_SIZE
) -> tuple[int, ...]:
    """A block size: an int or a tuple of up to 3 positive ints whose product is at most
    ``max_threads``; returns the tuple."""
    dims = _dims(size, name)
    total = 1
    for d in dims:
        total *= d
    if total > max_threads:
        raise InvalidConfigurationError(
            f"{name} {size!r} has {total} threads; at most {max_threads} are allowed"
        )
    return dims


def validate_priority(priority: object) -> int:
    """Priorities are ints in 0..255 (``True`` counts as 1, as in 0.2).

    Raises:
        InvalidConfigurationError: out of range or not an int (a ``ValueError``).
    """
    if not isinstance(priority, int) or not 0 <= priority <= 255:
        raise InvalidConfigurationError(
            f"message priority must be an int in 0..255, got {priority!r}"
        )
    return int(priority)


def validate_backpressure_strategy(strategy: object) -> BackpressureStrategy:
    """One of ``block``, ``reject``, ``drop_oldest`` (string or enum)."""
    if not isinstance(strategy, (str, BackpressureStrategy)):
        raise InvalidConfigurationError(
            f"backpressure must be 'block', 'reject' or 'drop_oldest', got {strategy!r}"
        )
    return BackpressureStrategy.parse(strategy)


def validate_restart(policy: object, max_restarts: object) -> tuple[str, int | None]:
    """Restart policies are 'never' or 'on_failure' with ``max_restarts >= 0`` (or None:
    no limit)."""
    if policy not in RESTART_POLICIES:
        raise InvalidConfigurationError(
            f"restart must be one of {RESTART_POLICIES}, got {policy!r}"
        )
    if max_restarts is not None and (not _is_int(max_restarts) or max_restarts < 0):  # type: ignore[operator]
        raise InvalidConfigurationError(
            f"max_restarts must be an int >= 0, got {max_restarts!r} (None: no limit)"
        )
    return policy, max_restarts  # type: ignore[return-value]


def _is_seconds(value: object) -> bool:
    return (type(value) is float or type(value) is int) and 0 <= value < math.inf  # type: ignore[operator]


def validate_seconds(value: object, name: str, *, allow_none: bool = False) -> float | None:
    """A duration option (``drain_timeout``, ``restart_window``, a ``timeout``): a finite
    number of seconds >= 0 (or None where ``allow_none``). NaN, infinities, negative
    numbers, bools and strings are refused, naming the option and the value."""
    if value is None and allow_none:
        return None
    if not _is_seconds(value):
        raise InvalidConfigurationError(
            f"{name} must be a finite number of seconds >= 0"
            f"{' or None' if allow_none else ''}, got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


#: The config's duration fields, and whether None is allowed.
SECONDS_FIELDS = (
    ("drain_timeout", False),
    ("restart_window", True),
    ("restart_backoff", False),
    ("restart_backoff_max", False),
)


def _type_name(tp: object) -> str:
    return getattr(tp, "__name__", repr(tp))


def check_message(
    msg: object, expected: type | None, kernel_id: str = "", direction: str = "expects"
) -> Any:
    """The runtime's message check: ``msg`` is an instance of ``expected`` (None accepts anything).

    Raises:
        TypeValidationError: ``kernel 'compute' expects ComputeRequest, got dict``.
    """
    if expected is None or type(msg) is expected or isinstance(msg, expected):
        return msg
    raise wrong_message_type(msg, expected, kernel_id, direction)


def wrong_message_type(
    msg: object, expected: type, kernel_id: str = "", direction: str = "expects"
) -> TypeValidationError:
    """The error for ``msg`` that is not an ``expected``, the same on every tier.

    Classes are named by their short names, or by module and qualified name when those
    are the same; two classes of one message name (a module reloaded, a factory that made
    the class twice) are said to be so.
    """
    who = f"kernel {kernel_id!r}" if kernel_id else "kernel"
    got = type(msg)
    if isinstance(expected, type) and got.__name__ == expected.__name__:
        got_name, want = class_names(got, expected)
        return TypeValidationError(
            f"{who} {direction} {want}, got {got_name}{redefinition_note(got, expected)}; "
            "build the message from the class the kernel declares"
        )
    return TypeValidationError(
        f"{who} {direction} {_type_name(expected)}, got {got.__name__}"
        + (f" ({msg!r:.80})" if not hasattr(msg, "message_id") else "")
    )


def validate_message_type(message_type: object, name: str = "input_type") -> type | None:
    """A kernel's ``input_type`` / ``output_type`` is a class (or None: anything goes)."""
    if message_type is not None and not isinstance(message_type, type):
        raise TypeValidationError(
            f"{name} must be a class (an @message type) or None, got {message_type!r:.80} "
            f"of type {type(message_type).__name__}"
        )
    return message_type


_STRATEGY_NAMES = frozenset(s.value for s in BackpressureStrategy)


def check_kernel_config(config: Any) -> Any:
    """Validate every field of a RingKernelConfig-like object; returns it."""
    # Launching many actors validates many configs: first one pass over exact types and
    # ranges; anything it does not accept goes through the validators below, in order,
    # for the error (a value it accepts, they accept too).
    kid = config.kernel_id
    grid = config.grid_size
    block = config.block_size
    q_in = config.input_queue_size
    q_out = config.output_queue_size
    strategy = config.backpressure_strategy
    restarts = config.max_restarts
    if (
        type(kid) is str
        and kid.strip()
        and type(grid) is int
        and grid >= 1
        and type(block) is int
        and 1 <= block <= MAX_BLOCK_SIZE
        and type(q_in) is int
        and 1 <= q_in <= MAX_QUEUE_SIZE
        and type(q_out) is int
        and 1 <= q_out <= MAX_QUEUE_SIZE
        and (
            type(strategy) is BackpressureStrategy
            or (type(strategy) is str and strategy in _STRATEGY_NAMES)
        )
        and config.restart in RESTART_POLICIES
        and (restarts is None or (type(restarts) is int and restarts >= 0))
        and _is_seconds(config.drain_timeout)
        and (config.restart_window is None or _is_seconds(config.restart_window))
        and _is_seconds(config.restart_backoff)
        and _is_seconds(config.restart_backoff_max)
        and type(getattr(config, "check_fields", True)) is bool
    ):
        return config
    validate_kernel_id(config.kernel_id)
    check_grid_size(config.grid_size)
    check_block_size(config.block_size)
    check_queue_size(config.input_queue_size, "input_queue_size")
    check_queue_size(config.output_queue_size, "output_queue_size")
    validate_backpressure_strategy(config.backpressure_strategy)
    validate_restart(config.restart, config.max_restarts)
    for name, allow_none in SECONDS_FIELDS:
        validate_seconds(getattr(config, name), name, allow_none=allow_none)
    check_fields = getattr(config, "check_fields", True)
    if type(check_fields) is not bool:
        raise InvalidConfigurationError(f"check_fields must be True or False, got {check_fields!r}")
    return config


_MISSING: Any = object()


def validate_message(
    msg: Any,
    expected: Any = _MISSING,
    kernel_id: str = "",
    direction: str = "expects",
) -> Any:
    """Two forms, told apart by the arguments.

    ``@validate_message`` on a class (PyDotCompute 0.2's decorator): the class must be a
    dataclass or an ``@message`` class; a class without a ``serialize`` method gets a
    ``UserWarning``. Returns the class.

    ``validate_message(msg, expected, kernel_id="", direction="expects")``: ``msg`` must be
    an instance of ``expected`` (None accepts anything); returns ``msg``. See ``check_message``.

    Raises:
        TypeValidationError: the class is not a dataclass, or ``msg`` has the wrong type.
    """
    if expected is not _MISSING:
        return check_message(msg, expected, kernel_id, direction)
    if not isinstance(msg, type):
        raise TypeValidationError(
            "validate_message takes a message class (as a decorator) or (msg, expected_type), "
            f"got only {msg!r:.80}"
        )
    if not _is_message_class(msg):
        raise TypeValidationError(
            f"{msg.__name__} must be a dataclass (or an @message class) to be a message type"
        )
    if not callable(getattr(msg, "serialize", None)):
        warnings.warn(
            f"{msg.__name__} has no serialize() method; it cannot cross a process boundary",
            UserWarning,
            stacklevel=2,
        )
    return msg


def _is_message_class(cls: type) -> bool:
    """A dataclass, or an ``@message`` / ``RingKernelMessage`` class (msgspec-based)."""
    if dataclasses.is_dataclass(cls):
        return True
    import msgspec

    return issubclass(cls, msgspec.Struct)


def _matches(value: object, annotation: Any) -> bool:
    """Whether ``value`` fits ``annotation`` (classes, unions, Optional, generics by origin)."""
    if annotation is Any or annotation is inspect.Parameter.empty or annotation is object:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin is not None:
        return isinstance(origin, type) and isinstance(value, origin)
    if isinstance(annotation, type):
        if annotation is float and isinstance(value, int) and not isinstance(value, bool):
            return True
        return isinstance(value, annotation)
    return True  # a TypeVar, a forward reference left unresolved, ...: not checked


def _check_type(name: str, value: object, annotation: Any) -> None:
    if not _matches(value, annotation):
        raise TypeValidationError(
            f"parameter {name!r} must be {getattr(annotation, '__name__', annotation)}, "
            f"got {type(value).__name__} ({value!r:.60})"
        )


def _config_decorator(config_cls: type) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # unresolvable string annotations: check what is there
        hints = dict(getattr(config_cls, "__annotations__", {}))

    def decorate(func: Callable[..., _T]) -> Callable[..., _T]:
        sig = inspect.signature(func)

        def check(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            bound = sig.bind(*args, **kwargs)
            for name, value in bound.arguments.items():
                if name in hints:
                    _check_type(name, value, hints[name])

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                check(args, kwargs)
                return await func(*args, **kwargs)  # type: ignore[misc]

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> _T:
            check(args, kwargs)
            return func(*args, **kwargs)

        return wrapper

    return decorate


def validate_config(config: Any) -> Any:
    """Two forms, told apart by the argument.

    ``@validate_config(ConfigClass)`` (PyDotCompute 0.2's decorator factory): the decorated
    function's arguments are bound and every parameter named in ``ConfigClass``'s
    annotations is type-checked on each call (``TypeValidationError`` on a mismatch).

    ``validate_config(config)`` with a RingKernelConfig-like *instance*: every field is
    validated (see ``check_kernel_config``) and the instance is returned.
    """
    if isinstance(config, type):
        return _config_decorator(config)
    return check_kernel_config(config)


_KNOWN_CONFIG_KEYS = (
    "queue_size",
    "input_queue_size",
    "output_queue_size",
    "grid_size",
    "block_size",
    "backpressure_strategy",
)


class RuntimeValidator:
    """The checks the runtime applies on its API boundary, bundled for reuse by tiers.

    ``strict`` (PyDotCompute 0.2's name) and ``strict_types`` are the same switch: when
    True, a wrong message type raises; when False, it is let through (or, for
    ``validate_message_type``, recorded in ``warnings``).
    """

    def __init__(self, strict: bool = True, *, strict_types: bool | None = None) -> None:
        self.strict_types = strict if strict_types is None else strict_types
        self._warnings: list[str] = []
        self._lock = threading.Lock()

    @property
    def strict(self) -> bool:
        return self.strict_types

    @strict.setter
    def strict(self, value: bool) -> None:
        self.strict_types = value

    @property
    def warnings(self) -> list[str]:
        """A copy of the warnings recorded in non-strict mode."""
        with self._lock:
            return list(self._warnings)

    def clear_warnings(self) -> None:
        with self._lock:
            self._warnings.clear()

    def validate_message_type(self, message_type: type) -> bool:
        """True when ``message_type`` is a dataclass or an ``@message`` class.

        Raises:
            TypeValidationError: it is not, and the validator is strict.
        """
        if isinstance(message_type, type) and _is_message_class(message_type):
            return True
        text = f"{getattr(message_type, '__name__', message_type)!s} is not a dataclass"
        if self.strict_types:
            raise TypeValidationError(f"{text}; message types must be dataclasses")
        with self._lock:
            self._warnings.append(text)
        return False

    def validate_kernel_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Validate the known keys present in ``config``; returns them normalized.

        Grid and block sizes come back as tuples; keys other than ``queue_size``,
        ``input_queue_size``, ``output_queue_size``, ``grid_size``, ``block_size`` and
        ``backpressure_strategy`` are left out.
        """
        out: dict[str, Any] = {}
        for key in _KNOWN_CONFIG_KEYS:
            if key not in config:
                continue
            value = config[key]
            if key == "grid_size":
                out[key] = validate_grid_size(value)
            elif key == "block_size":
                out[key] = validate_block_size(value)
            elif key == "backpressure_strategy":
                out[key] = validate_backpressure_strategy(value)
            else:
                out[key] = validate_queue_size(value, key)
        return out

    def check_input(self, kernel_id: str, expected: type | None, msg: object) -> None:
        if self.strict_types:
            check_message(msg, expected, kernel_id, "expects")

    def check_output(self, kernel_id: str, expected: type | None, msg: object) -> None:
        if self.strict_types:
            check_message(msg, expected, kernel_id, "must send")

    def check_config(self, config: Any) -> Any:
        return check_kernel_config(config)

    def __repr__(self) -> str:
        return f"RuntimeValidator(strict={self.strict_types})"


_validator: RuntimeValidator | None = None
_validator_lock = threading.Lock()


def get_validator(strict: bool = True) -> RuntimeValidator:
    """The process-wide ``RuntimeValidator``; ``strict`` applies only when it is created."""
    global _validator
    with _validator_lock:
        if _validator is None:
            _validator = RuntimeValidator(strict)
        return _validator
