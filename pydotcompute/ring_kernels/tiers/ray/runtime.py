"""`RayRingKernelRuntime`: a `RingKernelRuntime` whose kernels run on the Ray tier.

The way to run a kernel in a Ray actor is the `"ray"` tier of the ordinary runtime:
`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)`. This class keeps the
name older code uses, and adds only what is particular to Ray: its constructor arguments
(a `RaySession`: `address`, `init_options`, `max_batch`, `prefetch`, ...), Ray-only verbs
(`send_batch`, `receive_batch`, `flush`, `refresh_telemetry`), and the Ray placement
options of `launch`. Registry, lifecycle, routing and ordered shutdown are the runtime's.

Design notes:
- `tier=` keeps its old meaning here, the tier *inside* the Ray actor (for example
  `"gpu"`, which also asks Ray for a GPU); it becomes the `actor_tier` option of the Ray
  tier.
- What differed in the old class and code relies on stays: `connect`/`disconnect` return
  the task that applies the change in the actor, `get_telemetry` returns the last fetched
  snapshot without a Ray call (`refresh_telemetry` fetches), and `shutdown` kills every
  actor and shuts Ray down if this runtime started it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any, cast

from ....exceptions import KernelNotFoundError
from ...config import RingKernelConfig
from ...kernel import KernelFunc
from ...registry import get_registered_kernel
from ...runtime import RingKernelRuntime
from ...shutdown import ShutdownReport
from ...telemetry import RingKernelTelemetry
from .. import canonical_tier
from .kernel import RayTierKernel
from .session import RaySession, use_session

__all__ = ("RayRingKernelRuntime",)


class RayRingKernelRuntime(RingKernelRuntime):
    """A `RingKernelRuntime` whose kernels all run on the Ray tier.

    New code: `RingKernelRuntime().launch(kernel_id, fn, tier="ray", ...)`.

    ```python
    async with RayRingKernelRuntime() as runtime:
        await runtime.launch("compute", num_cpus=1)
        await runtime.activate("compute")
        reply = await runtime.send_and_receive("compute", ComputeRequest(values=[1.0]))
    ```

    Args:
        address: Passed to `ray.init(address=...)` when Ray is not initialized yet.
        init_options: More `ray.init` keyword arguments. A runtime that initialized Ray
            shuts it down again in `shutdown`.
        max_batch: The most messages one Ray call carries (sends and forwards).
        prefetch: The most replies one fetch brings back to the driver.
        actor_options: Default `ActorClass.options(...)` for every kernel (per-kernel
            launch options override them).
        enable_telemetry: Time every message inside the actors.
        restart_timeout: Seconds to wait for Ray to bring a restarting actor back before
            the kernel is declared FAILED.
        read_ahead: Keep one fetch parked in an actor once its replies were received.
        name: Prefix of the Ray actor names (default: unique per runtime).
    """

    RUNTIME_NAME = "Ray runtime"

    def __init__(
        self,
        *,
        address: str | None = None,
        init_options: dict[str, Any] | None = None,
        max_batch: int = 1024,
        prefetch: int = 1024,
        actor_options: dict[str, Any] | None = None,
        enable_telemetry: bool = True,
        restart_timeout: float = 60.0,
        read_ahead: bool = True,
        name: str | None = None,
    ) -> None:
        self.session = RaySession(
            address=address,
            init_options=init_options,
            max_batch=max_batch,
            prefetch=prefetch,
            actor_options=actor_options,
            enable_telemetry=enable_telemetry,
            restart_timeout=restart_timeout,
            read_ahead=read_ahead,
            name=name,
        )
        super().__init__(enable_telemetry=enable_telemetry)
        use_session(self, self.session)

    # -- lifecycle of the runtime -------------------------------------------------------

    async def start(self) -> RayRingKernelRuntime:
        """Bind to the running loop and make sure Ray is initialized (idempotent)."""
        await super().start()
        self.session.start()
        return self

    async def shutdown(self, timeout: float = 10.0, *, ordered: bool = True) -> ShutdownReport:
        """Terminate every kernel (sources first unless ``ordered=False``), kill every
        actor, and shut Ray down if this runtime started it."""
        try:
            return await super().shutdown(timeout, ordered=ordered)
        finally:
            for kid in [*self.kernel_ids, *self.terminated_ids]:
                await self.get_kernel(kid).release()
            self.session.close()

    # -- kernels --------------------------------------------------------------------------

    async def launch(  # type: ignore[override]
        self,
        kernel_id: str,
        kernel_func: KernelFunc | None = None,
        *,
        config: RingKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
        tier: str | None = None,
        ray_options: dict[str, Any] | None = None,
        check_resources: bool = True,
        **options: Any,
    ) -> RayTierKernel:
        """Launch a kernel in a Ray actor (`RingKernelRuntime.launch` with `tier="ray"`).

        `tier` (or the registered or configured tier) is the tier inside the actor;
        `ray_options` are extra `ActorClass.options(...)`; `check_resources=False` skips
        the check that the cluster has the resources asked for.
        """
        inner = tier
        if inner is None and kernel_func is None:
            with contextlib.suppress(KernelNotFoundError):
                inner = get_registered_kernel(kernel_id).options.get("tier")
        if inner is None and config is not None:
            inner = config.tier
        if inner is not None and canonical_tier(inner) != "ray":
            options["actor_tier"] = inner
        if ray_options:
            options["ray_options"] = ray_options
        options["check_resources"] = check_resources
        kernel = await super().launch(
            kernel_id,
            kernel_func,
            config=config,
            input_type=input_type,
            output_type=output_type,
            tier="ray",
            **options,
        )
        return cast(RayTierKernel, kernel)

    def get_kernel(self, kernel_id: str) -> Any:
        """The kernel (`RayTierKernel`: state, error, actor, undelivered, restarts)."""
        return super().get_kernel(kernel_id)

    # -- Ray-only messaging ------------------------------------------------------------------

    async def send_batch(
        self, kernel_id: str, msgs: Iterable[Any], *, timeout: float | None = None
    ) -> int:
        """Send many messages in as few Ray calls as possible (`max_batch` per call)."""
        kernel: RayTierKernel = self.get_kernel(kernel_id)
        return await kernel.send_batch(msgs, timeout)

    async def receive_batch(
        self, kernel_id: str, max_count: int = 1024, *, timeout: float | None = None
    ) -> list[Any]:
        """Up to `max_count` replies (waiting up to `timeout` for the first); `[]` when the
        timeout passes first."""
        kernel: RayTierKernel = self.get_kernel(kernel_id)
        return await kernel.receive_batch(max_count, timeout)

    async def flush(self, kernel_id: str) -> None:
        """Wait until every message sent to the kernel so far has reached its actor."""
        kernel: RayTierKernel = self.get_kernel(kernel_id)
        await kernel.flush()

    # -- routing -------------------------------------------------------------------------

    def connect(  # type: ignore[override]
        self, source_id: str, target_id: str
    ) -> asyncio.Task[None] | None:
        """As `RingKernelRuntime.connect`; returns the task that applies it in the source
        actor (`await runtime.connect(...)` to wait for it)."""
        super().connect(source_id, target_id)
        setup: asyncio.Task[None] | None = self.get_kernel(source_id).setup
        return setup

    def disconnect(self, source_id: str) -> asyncio.Task[None] | None:  # type: ignore[override]
        """As `RingKernelRuntime.disconnect`; returns the task that applies it."""
        super().disconnect(source_id)
        setup: asyncio.Task[None] | None = self.get_kernel(source_id).setup
        return setup

    # -- telemetry -------------------------------------------------------------------------

    def get_counters(self, kernel_id: str) -> RingKernelTelemetry:
        """The kernel's telemetry as last fetched (see `refresh_telemetry`); no Ray call
        (`get_telemetry` reads it through this)."""
        tel: RingKernelTelemetry = self.get_kernel(kernel_id).telemetry
        tel.queue_depth = max(tel.queue_depth, 0)
        return tel

    async def refresh_telemetry(self, kernel_id: str) -> RingKernelTelemetry:
        """Fetch the kernel's telemetry from its actor (one Ray call)."""
        kernel: RayTierKernel = self.get_kernel(kernel_id)
        return await kernel.fetch_telemetry()

    def get_summary(self) -> dict[str, Any]:
        """As `RingKernelRuntime.get_summary` (telemetry as last fetched), plus the Ray
        restarts per kernel."""
        summary = super().get_summary()
        kernels = [self.get_kernel(kid) for kid in self.kernel_ids]
        summary["restarts"] = {k.kernel_id: k.restarts for k in kernels if k.restarts}
        return summary
