"""The settings of a process kernel, checked when they are made.

Design note: the spin budgets (``spin_us``, and the hosted kernel's ``reply_spin_us``) are
capped at `MAX_SPIN_US` rather than left to the caller: past a few milliseconds a spin saves
nothing a wake-up would cost and only holds a core (or the event loop), so a larger value
is a mistake (microseconds read as seconds), refused at once rather than run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ....exceptions import InvalidConfigurationError

__all__ = (
    "MAX_SPIN_US",
    "ProcessKernelConfig",
    "check_kernel_config",
    "check_spin_us",
    "resolve_config",
)

#: The most microseconds a spin budget (``spin_us``, ``reply_spin_us``) may be: 10 ms.
#: A parked wait's wake-up costs tens of microseconds (docs/concepts/tiers.md), so spinning
#: past a millisecond or two buys no latency and holds a core the whole time (the event
#: loop too, for ``reply_spin_us``). 10 ms leaves room above the largest budget measured
#: (1 ms, the benchmarks' spin sweep) and used (5 ms, the tests), and is about a scheduler
#: time slice: a spinner descheduled for that long stalls its peer anyway.
MAX_SPIN_US = 10_000.0


class _KernelConfig(Protocol):
    kernel_id: str
    input_queue_size: int
    output_queue_size: int


_ConfigT = TypeVar("_ConfigT", bound=_KernelConfig)


def check_kernel_config(config: _KernelConfig) -> None:
    """Check the fields every kernel config has: a name and two queue sizes."""
    if not isinstance(config.kernel_id, str) or not config.kernel_id:
        raise InvalidConfigurationError(
            f"kernel_id must be a non-empty string, got {config.kernel_id!r}"
        )
    for name in ("input_queue_size", "output_queue_size"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidConfigurationError(
                f"{name} of kernel {config.kernel_id!r} must be an int >= 1, got {value!r}"
            )


def check_spin_us(option: str, kernel_id: str, value: Any) -> float:
    """``value`` when it is a spin budget in microseconds: a real number from 0 to
    `MAX_SPIN_US`; anything else raises, naming the option, the value and the cap.

    Raises:
        InvalidConfigurationError: not an int or float, negative, not finite, or above the cap.
    """
    if type(value) not in (int, float) or not 0 <= value <= MAX_SPIN_US:
        raise InvalidConfigurationError(
            f"{option} of kernel {kernel_id!r} must be >= 0 and at most {MAX_SPIN_US:g} "
            f"microseconds (MAX_SPIN_US, 10 ms: past that, parking costs less than "
            f"spinning; 0: park at once), got {value!r}"
        )
    return float(value)


def resolve_config(
    kernel_id: str, config: _ConfigT | None, default: Callable[[str], _ConfigT]
) -> _ConfigT:
    """``config``, or ``default(kernel_id)`` when None; refuses a config for another kernel."""
    if config is None:
        return default(kernel_id)
    if config.kernel_id != kernel_id:
        raise InvalidConfigurationError(
            f"kernel id {kernel_id!r} does not match its config's {config.kernel_id!r}"
        )
    return config


@dataclass
class ProcessKernelConfig:
    """Settings of a process kernel (`ProcessKernel`, the runtime's ``tier="process"``).

    Attributes:
        kernel_id: The kernel's name.
        input_queue_size: Most messages sent and not yet taken by the actor (>= 1): a hard
            bound, ``send`` waits (``send_nowait`` returns False) beyond it. With the one
            in the actor's hands, at most this plus one messages are in flight.
        output_queue_size: Most replies queued in the outbox ring (>= 1); the actor's
            ``ctx.send`` waits beyond it.
        input_ring_bytes: Inbox ring capacity in bytes (>= 1024, default 1 MiB); a
            message must encode to at most this minus 8 bytes (``max_message_bytes``).
        output_ring_bytes: Outbox ring capacity in bytes (same rule for replies).
        spin_us: Most microseconds a waiting side polls before parking on its doorbell (0 =
            park at once; at most `MAX_SPIN_US`, 10 ms). Higher keeps round trips in
            microseconds through longer gaps and costs CPU while idle.
        start_method: ``"spawn"`` (default) or ``"forkserver"`` (faster starts on POSIX).
        startup_timeout: Seconds to wait for the child to import the actor and report ready.
        daemon: Kill the child when the parent exits without stopping it.
        ring_bytes: Shorthand that sets both ring capacities (the runtime's
            ``launch(..., ring_bytes=N)`` option passes it here).
        adaptive_spin: Let each waiting side shrink its spin (down to none) while spinning
            does not pay off, probing with the full ``spin_us`` now and then; False spins
            the full budget on every wait.
        record_latency: The child times each message its actor handles (from taking it to
            asking for the next) into a small shared-memory block;
            `ProcessWorker.drain_latencies` hands the statistics over.
        check_fields: ``send`` (here) and ``ctx.send`` (in the child) refuse a message
            whose field values are not of their annotated types with a
            ``TypeValidationError`` at the call, as every tier does; False leaves it to
            the decoder on the other side (the message is rejected there, as one that
            does not decode).
    """

    kernel_id: str
    input_queue_size: int = 4096
    output_queue_size: int = 4096
    input_ring_bytes: int = 1 << 20
    output_ring_bytes: int = 1 << 20
    spin_us: float = 50.0
    start_method: str | None = None
    startup_timeout: float = 30.0
    daemon: bool = True
    ring_bytes: int | None = None
    adaptive_spin: bool = True
    record_latency: bool = False
    check_fields: bool = True

    def __post_init__(self) -> None:
        if self.ring_bytes is not None:  # shorthand for both rings
            self.input_ring_bytes = self.output_ring_bytes = self.ring_bytes
        check_kernel_config(self)
        if type(self.check_fields) is not bool:
            raise InvalidConfigurationError(
                f"check_fields of kernel {self.kernel_id!r} must be True or False, "
                f"got {self.check_fields!r}"
            )
        for name in ("input_ring_bytes", "output_ring_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1024:
                raise InvalidConfigurationError(
                    f"{name} of kernel {self.kernel_id!r} must be an int >= 1024, got {value!r}"
                )
        check_spin_us("spin_us", self.kernel_id, self.spin_us)
        if self.start_method not in (None, "spawn", "forkserver"):
            raise InvalidConfigurationError(
                f"start_method of kernel {self.kernel_id!r} must be 'spawn' or 'forkserver', "
                f"got {self.start_method!r} ('fork' would copy the parent's threads and locks)"
            )
