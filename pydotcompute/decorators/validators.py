"""Configuration and message validation shared by the decorators and the runtime.

Each validator returns the (normalized) value or raises a pydotcompute error whose text
names the offending value and the accepted range, so mistakes surface where they are made.
"""

from __future__ import annotations

import math
from typing import Any

from ..exceptions import InvalidConfigurationError, TypeValidationError
from ..ring_kernels.fast_queue import BackpressureStrategy

__all__ = (
    "RuntimeValidator",
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
)

MAX_QUEUE_SIZE = 1 << 24
MAX_BLOCK_SIZE = 1024
RESTART_POLICIES = ("never", "on_failure")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_kernel_id(kernel_id: object) -> str:
    """A kernel id is a non-empty string."""
    if not isinstance(kernel_id, str) or not kernel_id.strip():
        raise InvalidConfigurationError(f"kernel_id must be a non-empty string, got {kernel_id!r}")
    return kernel_id


def validate_queue_size(size: object, name: str = "queue_size") -> int:
    """Queue sizes are ints in 1..2**24."""
    if not _is_int(size) or not 1 <= size <= MAX_QUEUE_SIZE:  # type: ignore[operator]
        raise InvalidConfigurationError(
            f"{name} must be an int in 1..{MAX_QUEUE_SIZE}, got {size!r}"
        )
    return size  # type: ignore[return-value]


def validate_grid_size(size: object) -> int:
    """Grid sizes are positive ints."""
    if not _is_int(size) or size < 1:  # type: ignore[operator]
        raise InvalidConfigurationError(f"grid_size must be an int >= 1, got {size!r}")
    return size  # type: ignore[return-value]


def validate_block_size(size: object) -> int:
    """Block sizes are ints in 1..1024 (the CUDA limit)."""
    if not _is_int(size) or not 1 <= size <= MAX_BLOCK_SIZE:  # type: ignore[operator]
        raise InvalidConfigurationError(
            f"block_size must be an int in 1..{MAX_BLOCK_SIZE}, got {size!r}"
        )
    return size  # type: ignore[return-value]


def validate_priority(priority: object) -> int:
    """Priorities are ints in 0..255."""
    if not _is_int(priority) or not 0 <= priority <= 255:  # type: ignore[operator]
        raise ValueError(f"message priority must be an int in 0..255, got {priority!r}")
    return priority  # type: ignore[return-value]


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


def validate_message(
    msg: object, expected: type | None, kernel_id: str = "", direction: str = "expects"
) -> Any:
    """Check ``msg`` is an instance of ``expected`` (None accepts anything).

    Raises:
        TypeValidationError: ``kernel 'compute' expects ComputeRequest, got dict``.
    """
    if expected is None or type(msg) is expected or isinstance(msg, expected):
        return msg
    who = f"kernel {kernel_id!r}" if kernel_id else "kernel"
    raise TypeValidationError(
        f"{who} {direction} {_type_name(expected)}, got {type(msg).__name__}"
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


def validate_config(config: Any) -> Any:
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
    ):
        return config
    validate_kernel_id(config.kernel_id)
    validate_grid_size(config.grid_size)
    validate_block_size(config.block_size)
    validate_queue_size(config.input_queue_size, "input_queue_size")
    validate_queue_size(config.output_queue_size, "output_queue_size")
    validate_backpressure_strategy(config.backpressure_strategy)
    validate_restart(config.restart, config.max_restarts)
    for name, allow_none in SECONDS_FIELDS:
        validate_seconds(getattr(config, name), name, allow_none=allow_none)
    return config


class RuntimeValidator:
    """The checks the runtime applies on its API boundary, bundled for reuse by tiers."""

    def __init__(self, *, strict_types: bool = True) -> None:
        self.strict_types = strict_types

    def check_input(self, kernel_id: str, expected: type | None, msg: object) -> None:
        if self.strict_types:
            validate_message(msg, expected, kernel_id, "expects")

    def check_output(self, kernel_id: str, expected: type | None, msg: object) -> None:
        if self.strict_types:
            validate_message(msg, expected, kernel_id, "must send")

    def check_config(self, config: Any) -> Any:
        return validate_config(config)
