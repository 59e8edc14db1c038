"""The Ray tier: the actor runs in a Ray actor, placed and supervised by Ray.

`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)` runs `fn` in a Ray
actor that hosts an ordinary asyncio-tier kernel; the runtime drives it with the usual
verbs. The mechanism (batched pushes, prefetched replies, the watch on the actor, Ray
restarts) lives in `pydotcompute.distributed.driver`; this module adapts it to the
runtime's kernel interface.

Design notes:
- A kernel-level tier (like the GPU tier), not a `TierWorker` behind the hosting bridge:
  the actor's own runtime, inside the Ray actor, already applies the policy (accounting,
  correlation, backpressure, supervision) on its queues, and the driver batches across
  the network. A bridge on the driver would add a second set of queues, a second bound and
  a second copy of every message in flight.
- One `RayDriver` per runtime, made on the first Ray launch and kept beside the runtime
  (a weak map, so the runtime needs no Ray-specific attribute). `use_driver` lets a
  runtime choose its own (the compatibility class `RayRingKernelRuntime` passes its
  constructor arguments that way).
- Placement options (`num_cpus`, `resources`, ...) plus `ray_options`,
  `check_resources` and `actor_tier` (the tier inside the Ray actor, asyncio by default)
  are this tier's `EXTRA_OPTIONS`; they reach the driver through `config.extra`.
- Kernels of this tier forward only into kernels of the same runtime's Ray tier (actor to
  actor, the driver is not on the path); a mixed pipeline is refused at `connect`.
- The registry imports this module only when `tier="ray"` is first launched, and Ray
  itself loads when the driver starts, so `import pydotcompute` never loads Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Any, ClassVar

from ...distributed.driver import RayDriver, RayKernel
from ...exceptions import InvalidConfigurationError, KernelStateError
from ..config import RingKernelConfig
from ..kernel import KernelFunc
from ..runtime import PLACEMENT_OPTIONS
from ..states import KernelState
from ..telemetry import RingKernelTelemetry
from . import check_actor_kind, tier_class

__all__ = ("RayTierKernel", "driver_for", "use_driver")

_DRIVERS: weakref.WeakKeyDictionary[Any, RayDriver] = weakref.WeakKeyDictionary()


def use_driver(runtime: Any, driver: RayDriver) -> None:
    """Have `runtime`'s Ray-tier kernels run through `driver` (before the first launch)."""
    _DRIVERS[runtime] = driver


def driver_for(runtime: Any, *, enable_telemetry: bool = True) -> RayDriver:
    """The `RayDriver` of `runtime`, made with default settings on first use."""
    if runtime is None:
        return RayDriver(enable_telemetry=enable_telemetry)
    driver = _DRIVERS.get(runtime)
    if driver is None:
        driver = _DRIVERS[runtime] = RayDriver(enable_telemetry=enable_telemetry)
    return driver


class _Buffered:
    """The driver-side reply buffer as the runtime sees an outbox (`len`, `clear`)."""

    __slots__ = ("_kernel",)

    def __init__(self, kernel: RayTierKernel) -> None:
        self._kernel = kernel

    def __len__(self) -> int:
        handle = self._kernel.handle
        return handle.buffered if handle is not None else 0

    def clear(self) -> int:
        handle = self._kernel.handle
        return handle.drop_buffered() if handle is not None else 0


class _Depth:
    """The inbox depth as the runtime sees it: in flight on the driver plus queued in the
    actor (as last reported by its telemetry)."""

    __slots__ = ("_kernel",)

    def __init__(self, kernel: RayTierKernel) -> None:
        self._kernel = kernel

    def __len__(self) -> int:
        handle = self._kernel.handle
        if handle is None:
            return 0
        return handle.pending + max(handle.telemetry.queue_depth, 0)


class RayTierKernel:
    """A ring kernel running in a Ray actor, with the interface the runtime drives.

    Attributes:
        kernel_id: The kernel's id.
        config: The `RingKernelConfig` it was launched with.
        input_type: The message class `send` accepts (None: any `@message`).
        output_type: The message class the actor sends.
    """

    #: Checked in `launch`, against the tier inside the actor (asyncio: async functions).
    ACTOR_KIND: ClassVar[str | None] = None
    #: Ray restarts the actor (`max_restarts`) and the driver relaunches the kernel in it.
    SUPPORTS_RESTART: ClassVar[bool] = True
    EXTRA_OPTIONS: ClassVar[frozenset[str]] = PLACEMENT_OPTIONS | frozenset(
        {"ray_options", "check_resources", "actor_tier"}
    )

    def __init__(
        self,
        kernel_id: str,
        kernel_func: KernelFunc | None,
        *,
        config: RingKernelConfig,
        input_type: type | None = None,
        output_type: type | None = None,
        runtime: Any = None,
        enable_telemetry: bool = True,
    ) -> None:
        self.kernel_id = kernel_id
        self.config = config
        self.input_type = input_type
        self.output_type = output_type
        self._func = kernel_func
        self._driver = driver_for(runtime, enable_telemetry=enable_telemetry)
        self._handle: RayKernel | None = None
        self._forward: RayTierKernel | None = None
        self._setup: asyncio.Task[None] | None = None
        self._inbox = _Depth(self)
        self._outbox = _Buffered(self)

    def __repr__(self) -> str:
        return f"<RayTierKernel {self.kernel_id!r} {self.state.name}>"

    # -- what the runtime reads ---------------------------------------------------------

    @property
    def handle(self) -> RayKernel | None:
        """The driver's handle on the Ray actor (None before `launch`): its `actor`,
        `actor_name`, `restarts`, `pending` and `buffered`."""
        return self._handle

    @property
    def driver(self) -> RayDriver:
        """The `RayDriver` this kernel runs through."""
        return self._driver

    @property
    def actor(self) -> Any:
        """The Ray actor handle (`ray.kill(kernel.actor)` simulates a lost node)."""
        return self._require("use").actor

    @property
    def actor_name(self) -> str:
        """The Ray actor's name (unique per runtime)."""
        return self._require("use").actor_name

    @property
    def ray_options(self) -> dict[str, Any]:
        """The `ActorClass.options(...)` the actor was created with."""
        return self._require("use").ray_options

    @property
    def pending(self) -> int:
        """Messages sent from the driver and not yet acknowledged by the actor."""
        return self._handle.pending if self._handle is not None else 0

    @property
    def buffered(self) -> int:
        """Replies already fetched to the driver and not yet received."""
        return self._handle.buffered if self._handle is not None else 0

    @property
    def setup(self) -> asyncio.Task[None] | None:
        """The last `connect`/`disconnect` on its way to the actor (await it to wait until
        the actor applied it), or None."""
        return self._setup

    @property
    def state(self) -> KernelState:
        return self._handle.state if self._handle is not None else KernelState.CREATED

    @property
    def is_active(self) -> bool:
        return self.state is KernelState.ACTIVE

    @property
    def error(self) -> BaseException | None:
        return self._handle.error if self._handle is not None else None

    @property
    def restarts(self) -> int:
        return self._handle.restarts if self._handle is not None else 0

    @property
    def undelivered(self) -> list[Any]:
        return self._handle.undelivered if self._handle is not None else []

    @property
    def telemetry(self) -> RingKernelTelemetry:
        if self._handle is None:
            return RingKernelTelemetry(self.kernel_id)
        return self._handle.telemetry

    @property
    def inbox(self) -> _Depth:
        return self._inbox

    @property
    def outbox(self) -> _Buffered:
        return self._outbox

    @property
    def is_idle(self) -> bool:
        return False

    def is_actor_task(self, task: asyncio.Task[Any]) -> bool:
        """Never: the actor runs in a Ray actor, not in a task of the driver's loop."""
        del task
        return False

    def refresh_telemetry(self) -> RingKernelTelemetry:
        """Fetch the actor's telemetry now (one Ray call, waited for up to 5 s)."""
        if self._handle is None:
            return self.telemetry
        return self._driver.refresh_telemetry_now(self.kernel_id)

    def _require(self, operation: str) -> RayKernel:
        if self._handle is None:
            raise KernelStateError(
                self.kernel_id, KernelState.CREATED, operation, "launch it first"
            )
        return self._handle

    # -- lifecycle ----------------------------------------------------------------------

    async def launch(self) -> None:
        """Create the Ray actor and launch the kernel in it (LAUNCHED)."""
        extra = dict(self.config.extra)
        ray_options = extra.pop("ray_options", None)
        check_resources = extra.pop("check_resources", True)
        named = extra.pop("actor_tier", None)
        actor_tier = named or "asyncio"
        if actor_tier == "ray":
            raise InvalidConfigurationError(
                f"kernel {self.kernel_id!r}: actor_tier='ray' would nest a Ray actor in a Ray "
                "actor; choose the tier inside the actor: 'asyncio', 'thread' or 'process'"
            )
        inner = tier_class(actor_tier)
        kind = getattr(inner, "ACTOR_KIND", None)
        check_actor_kind(self.kernel_id, named or "ray", self._func, kind)
        config = dataclasses.replace(self.config, tier=actor_tier, extra={})
        driver = self._driver
        await driver.start()
        if self.kernel_id in driver and driver.get_kernel_state(self.kernel_id) is (
            KernelState.TERMINATED
        ):
            driver.remove(self.kernel_id)  # the runtime removed it: the id is free again
        self._handle = await driver.launch(
            self.kernel_id,
            self._func,
            config=config,
            input_type=self.input_type,
            output_type=self.output_type,
            ray_options=ray_options,
            check_resources=bool(check_resources),
            **extra,
        )

    async def activate(self) -> None:
        await self._driver.activate(self._require("activate").kernel_id)

    async def deactivate(self) -> None:
        await self._driver.deactivate(self._require("deactivate").kernel_id)

    async def reactivate(self) -> None:
        await self._driver.reactivate(self._require("reactivate").kernel_id)

    async def terminate(self, timeout: float | None = None) -> list[Any]:
        """Drain and stop the actor; returns the messages it did not process."""
        return await self._driver.terminate(self._require("terminate").kernel_id, timeout)

    # -- messages -------------------------------------------------------------------------

    async def send(self, msg: Any, timeout: float | None = None) -> bool:
        return await self._driver.send(self._require("send to").kernel_id, msg, timeout=timeout)

    def send_nowait(self, msg: Any) -> bool:
        return self._driver.send_nowait(self._require("send to").kernel_id, msg)

    async def accept(self, msg: Any, timeout: float | None = None) -> None:
        await self.send(msg, timeout)

    def accept_nowait(self, msg: Any) -> None:
        self.send_nowait(msg)

    # the names a forwarding kernel of another tier calls on its target
    _accept = accept
    _accept_nowait = accept_nowait

    async def receive(self, timeout: float | None = None) -> Any:
        return await self._driver.receive(self._require("receive from").kernel_id, timeout=timeout)

    def receive_nowait(self) -> Any:
        return self._driver.receive_nowait(self._require("receive from").kernel_id)

    async def send_and_receive(self, msg: Any, timeout: float | None = None) -> Any:
        kid = self._require("send_and_receive to").kernel_id
        return await self._driver.send_and_receive(kid, msg, timeout=timeout)

    # -- routing --------------------------------------------------------------------------

    def forward_to(self, target: Any) -> None:
        """Forward this kernel's output into `target` (actor to actor), or stop (None).

        Raises:
            InvalidConfigurationError: `target` is not a Ray-tier kernel of the same runtime.
        """
        kid = self._require("connect").kernel_id
        if target is None:
            self._forward = None
            self._setup = self._driver.disconnect(kid)
            return
        if not isinstance(target, RayTierKernel) or target.driver is not self._driver:
            raise InvalidConfigurationError(
                f"cannot connect {kid!r} -> {getattr(target, 'kernel_id', target)!r}: a kernel "
                "on the ray tier forwards only into another ray-tier kernel of the same "
                "runtime; launch the target with tier='ray', or receive from the source and "
                "send to the target yourself"
            )
        self._setup = self._driver.connect(kid, target._require("connect").kernel_id)
        self._forward = target

    @property
    def forwards_to(self) -> RayTierKernel | None:
        return self._forward
