"""`RingKernelConfig`: how a ring kernel is built.

Design note: a config is checked when it is made (``__post_init__``, as in PyDotCompute
0.2, which raised ``ValueError`` there) and again at launch, since fields may be assigned
in between; the check has a fast path for valid configs, so making one stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..decorators.validators import check_kernel_config

__all__ = ("RingKernelConfig",)


@dataclass
class RingKernelConfig:
    """How a ring kernel is built.

    Attributes:
        kernel_id: Unique id within a runtime.
        grid_size, block_size: GPU launch geometry (used by the ``cuda`` backend).
        input_queue_size, output_queue_size: Queue capacities.
        backpressure_strategy: ``block`` (default), ``reject`` or ``drop_oldest`` for the inbox.
        use_fast_queue: Four-band O(1) queues (default) or exact-priority heaps.
        serialize: Store MessagePack bytes in the queues (as a cross-process hop would).
        check_fields: Refuse at send (``send``, ``ctx.send``) a message whose field values
            are not of their annotated types, as a hop that decodes bytes would, on every
            tier (the default). False: in-process hops pass messages as they are; hops
            that decode still refuse such a message, as a dropped message.
        restart: ``never`` or ``on_failure``: restart the actor when it raises.
        max_restarts: How many restarts ``on_failure`` allows within ``restart_window``
            seconds before the kernel is FAILED (None: no limit).
        restart_window: The window of ``max_restarts``, in seconds (None: the kernel's
            whole life).
        restart_backoff: Seconds to wait before a restart; doubled for each restart in a
            row after which the actor raised again before finishing a message.
        restart_backoff_max: The cap of that pause, in seconds.
        backend: Where the actor computes (``cpu``, ``cuda``, ``metal``).
        tier: Where the actor runs (``asyncio``, ``thread``, ``process``, ``gpu``).
        drain_timeout: Seconds the actor may drain its inbox when the kernel is stopped,
            however: ``terminate``, ``shutdown`` (at most), leaving ``async with``, Ctrl-C.
        extra: Tier-specific options (declared by the tier class's ``EXTRA_OPTIONS``).

    Raises:
        InvalidConfigurationError: a field is out of range or not of its type (a
            ``ValueError``): sizes below 1, as PyDotCompute 0.2 also refused, and the
            runtime's own bounds (block 1..1024, queues 1..2**24, ints that are ints).
    """

    kernel_id: str
    grid_size: int = 1
    block_size: int = 256
    input_queue_size: int = 4096
    output_queue_size: int = 4096
    backpressure_strategy: str = "block"
    use_fast_queue: bool = True
    serialize: bool = False
    check_fields: bool = True
    restart: str = "never"
    max_restarts: int | None = 3
    restart_window: float | None = 5.0
    restart_backoff: float = 0.01
    restart_backoff_max: float = 1.0
    backend: str = "cpu"
    tier: str = "asyncio"
    drain_timeout: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_kernel_config(self)
