"""``@ring_kernel``: declare a persistent actor and register it for ``runtime.launch(id)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from ..exceptions import InvalidConfigurationError
from ..ring_kernels.registry import register_ring_kernel
from ..ring_kernels.tiers.contract import actor_kind
from .validators import (
    check_block_size,
    check_grid_size,
    check_queue_size,
    validate_backpressure_strategy,
    validate_kernel_id,
    validate_message_type,
    validate_restart,
)

__all__ = (
    "RingKernelBuilder",
    "RingKernelMeta",
    "get_ring_kernel_meta",
    "is_ring_kernel",
    "ring_kernel",
)

F = TypeVar("F", bound=Callable[..., Any])
_META_ATTR = "__ring_kernel_meta__"
BACKENDS = ("cpu", "cuda", "metal")


@dataclass(frozen=True)
class RingKernelMeta:
    """What ``@ring_kernel`` recorded about a function."""

    kernel_id: str
    input_type: type | None
    output_type: type | None
    input_queue_size: int
    output_queue_size: int
    grid_size: int
    block_size: int
    backpressure: str
    backend: str
    serialize: bool
    restart: str
    max_restarts: int | None
    tier: str
    extra: dict[str, Any] = field(default_factory=dict)

    # PyDotCompute 0.2 returned a plain dict from get_ring_kernel_meta(); the read-only
    # mapping view below serves its keys, with "config" a dict of the launch options.
    _MAPPING_KEYS = ("kernel_id", "input_type", "output_type", "config")

    def __getitem__(self, key: str) -> Any:
        if key == "config":
            opts = self.launch_options()
            return {
                "input_queue_size": opts["input_queue_size"],
                "output_queue_size": opts["output_queue_size"],
                "grid_size": opts["grid_size"],
                "block_size": opts["block_size"],
                "backpressure_strategy": opts["backpressure_strategy"],
            }
        if key in self._MAPPING_KEYS:
            return getattr(self, key)
        raise KeyError(key)

    def keys(self) -> tuple[str, ...]:
        """The 0.2 dict keys: ``kernel_id``, ``input_type``, ``output_type``, ``config``."""
        return self._MAPPING_KEYS

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return key in self._MAPPING_KEYS

    def launch_options(self) -> dict[str, Any]:
        """Keyword options for ``runtime.launch`` / ``RingKernelConfig``."""
        return {
            "input_queue_size": self.input_queue_size,
            "output_queue_size": self.output_queue_size,
            "grid_size": self.grid_size,
            "block_size": self.block_size,
            "backpressure_strategy": self.backpressure,
            "backend": self.backend,
            "serialize": self.serialize,
            "restart": self.restart,
            "max_restarts": self.max_restarts,
            "tier": self.tier,
            **self.extra,
        }


@overload
def ring_kernel(func: F, /) -> F: ...
@overload
def ring_kernel(
    func: None = None,
    *,
    kernel_id: str | None = None,
    input_type: type | None = None,
    output_type: type | None = None,
    queue_size: int = 4096,
    input_queue_size: int | None = None,
    output_queue_size: int | None = None,
    grid_size: int = 1,
    block_size: int = 256,
    backpressure: str = "block",
    auto_register: bool = True,
    backend: str = "cpu",
    serialize: bool = False,
    restart: str = "never",
    max_restarts: int | None = 3,
    tier: str | None = None,
    **extra: Any,
) -> Callable[[F], F]: ...


def ring_kernel(
    func: F | None = None,
    *,
    kernel_id: str | None = None,
    input_type: type | None = None,
    output_type: type | None = None,
    queue_size: int = 4096,
    input_queue_size: int | None = None,
    output_queue_size: int | None = None,
    grid_size: int = 1,
    block_size: int = 256,
    backpressure: str = "block",
    auto_register: bool = True,
    backend: str = "cpu",
    serialize: bool = False,
    restart: str = "never",
    max_restarts: int | None = 3,
    tier: str | None = None,
    **extra: Any,
) -> Any:
    """Declare an actor: ``async def actor(ctx)`` looping on ``ctx.receive()``.

    The function is returned unchanged (metadata is attached) and, with
    ``auto_register``, registered so ``runtime.launch(kernel_id)`` needs no function.

    Args:
        kernel_id: Defaults to the function's name.
        input_type, output_type: Message classes checked on every send / reply.
        queue_size: Both queue capacities unless ``input_queue_size`` /
            ``output_queue_size`` say otherwise.
        backpressure: ``block``, ``reject`` or ``drop_oldest`` (the inbox's policy).
        backend: ``cpu`` (default), ``cuda`` (a GPU-resident kernel: ``tier`` becomes
            ``gpu``), or ``metal``.
        serialize: Queues carry MessagePack bytes, as a cross-process hop would.
        restart: ``never`` or ``on_failure`` (up to ``max_restarts`` times within
            ``restart_window`` seconds, given as an extra option; None: no limit).
        tier: ``asyncio`` (default), ``thread``, ``process`` or ``gpu``.
        extra: Tier-specific options (the GPU tier's ``handler``, ``state``, ...).
    """

    def decorate(fn: F) -> F:
        kid = validate_kernel_id(kernel_id or getattr(fn, "__name__", ""))
        if backend not in BACKENDS:
            raise InvalidConfigurationError(
                f"ring kernel {kid!r}: backend must be one of {BACKENDS}, got {backend!r}"
            )
        chosen_tier = tier or ("gpu" if backend == "cuda" else "asyncio")
        if chosen_tier == "asyncio" and actor_kind(fn) != "async":
            raise InvalidConfigurationError(
                f"ring kernel {kid!r} must be an 'async def' function taking a KernelContext "
                f"on the asyncio tier, got {fn!r}"
            )
        validate_message_type(input_type, "input_type")
        validate_message_type(output_type, "output_type")
        strategy = validate_backpressure_strategy(backpressure).value
        policy, restarts = validate_restart(restart, max_restarts)
        meta = RingKernelMeta(
            kernel_id=kid,
            input_type=input_type,
            output_type=output_type,
            # 0 (any falsy size) means "use queue_size", as in PyDotCompute 0.2.
            input_queue_size=check_queue_size(input_queue_size or queue_size, "input_queue_size"),
            output_queue_size=check_queue_size(
                output_queue_size or queue_size, "output_queue_size"
            ),
            grid_size=check_grid_size(grid_size),
            block_size=check_block_size(block_size),
            backpressure=strategy,
            backend=backend,
            serialize=serialize,
            restart=policy,
            max_restarts=restarts,
            tier=chosen_tier,
            extra=dict(extra),
        )
        if chosen_tier == "gpu":
            from ..ring_kernels.tiers.gpu.prepare import check_gpu_kernel_spec

            check_gpu_kernel_spec(meta, fn)
        try:
            setattr(fn, _META_ATTR, meta)
        except AttributeError as exc:
            raise InvalidConfigurationError(
                f"cannot attach ring kernel metadata to {fn!r}: {exc}"
            ) from exc
        if auto_register:
            register_ring_kernel(
                kid,
                fn,
                input_type=input_type,
                output_type=output_type,
                **meta.launch_options(),
            )
        return fn

    if func is not None:
        return decorate(func)
    return decorate


def get_ring_kernel_meta(fn: Any) -> RingKernelMeta | None:
    """The metadata ``@ring_kernel`` attached to ``fn``, or None."""
    return getattr(fn, _META_ATTR, None)


def is_ring_kernel(fn: Any) -> bool:
    return get_ring_kernel_meta(fn) is not None


class RingKernelBuilder:
    """Fluent construction of a ring kernel declaration:

    ```python
    RingKernelBuilder("compute").input(Req).output(Resp).queue_size(1024).build(actor)
    ```

    The PyDotCompute 0.2 chain works too: ``with_input_type``, ``with_output_type``,
    ``with_queue_size``, ``with_input_queue_size``, ``with_output_queue_size``,
    ``with_grid_size``, ``with_block_size``, ``with_backpressure``, ``with_handler`` and a
    ``build()`` without arguments.
    """

    def __init__(self, kernel_id: str) -> None:
        self._kernel_id = validate_kernel_id(kernel_id)
        self._opts: dict[str, Any] = {}
        self._handler: Callable[..., Any] | None = None

    def _set(self, **kw: Any) -> RingKernelBuilder:
        self._opts.update(kw)
        return self

    def input(self, message_type: type) -> RingKernelBuilder:
        return self._set(input_type=message_type)

    def output(self, message_type: type) -> RingKernelBuilder:
        return self._set(output_type=message_type)

    with_input_type = input
    with_output_type = output

    def queue_size(self, size: int) -> RingKernelBuilder:
        return self._set(queue_size=size)

    with_queue_size = queue_size

    def with_input_queue_size(self, size: int) -> RingKernelBuilder:
        return self._set(input_queue_size=size)

    def with_output_queue_size(self, size: int) -> RingKernelBuilder:
        return self._set(output_queue_size=size)

    def backpressure(self, strategy: str) -> RingKernelBuilder:
        return self._set(backpressure=strategy)

    with_backpressure = backpressure

    def grid(self, grid_size: int, block_size: int | None = None) -> RingKernelBuilder:
        """Set the grid size, and the block size when given (else it is left as set)."""
        if block_size is None:
            return self._set(grid_size=grid_size)
        return self._set(grid_size=grid_size, block_size=block_size)

    def with_grid_size(self, grid_size: int) -> RingKernelBuilder:
        return self._set(grid_size=grid_size)

    def with_block_size(self, block_size: int) -> RingKernelBuilder:
        return self._set(block_size=block_size)

    def with_handler(self, func: Callable[..., Any]) -> RingKernelBuilder:
        """The actor function ``build()`` applies the declaration to."""
        self._handler = func
        return self

    def backend(self, name: str) -> RingKernelBuilder:
        return self._set(backend=name)

    def tier(self, name: str) -> RingKernelBuilder:
        return self._set(tier=name)

    def restart(self, policy: str, max_restarts: int | None = 3) -> RingKernelBuilder:
        return self._set(restart=policy, max_restarts=max_restarts)

    def serialize(self, enabled: bool = True) -> RingKernelBuilder:
        return self._set(serialize=enabled)

    def options(self, **extra: Any) -> RingKernelBuilder:
        return self._set(**extra)

    def build(self, func: Any = None, *, register: bool = True) -> Any:
        """Apply ``@ring_kernel`` with the collected options to ``func`` (default: the
        ``with_handler`` function) and return it.

        Raises:
            InvalidConfigurationError: neither ``func`` nor a handler was given (a
                ``ValueError``).
        """
        fn = func if func is not None else self._handler
        if fn is None:
            raise InvalidConfigurationError(
                f"Handler function is required: ring kernel {self._kernel_id!r} has none; "
                "pass it to build(func) or call with_handler(func) first"
            )
        decorate = ring_kernel(kernel_id=self._kernel_id, auto_register=register, **self._opts)
        return decorate(fn)

    def __repr__(self) -> str:
        def name(tp: Any) -> str:
            return getattr(tp, "__name__", repr(tp))

        return (
            f"RingKernelBuilder(id={self._kernel_id!r}, "
            f"input={name(self._opts.get('input_type'))}, "
            f"output={name(self._opts.get('output_type'))})"
        )
