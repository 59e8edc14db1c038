"""`RayRingKernelRuntime`: the runtime whose kernels all run on the Ray tier.

The way to run a kernel in a Ray actor is the `"ray"` tier of the ordinary runtime:
`RingKernelRuntime().launch(kernel_id, fn, tier="ray", num_cpus=1)`. This class keeps the
name older code uses, as a constructor: its arguments make the `RaySession` its kernels
share (`address`, `init_options`, `max_batch`, `prefetch`, ...), and every launch goes to
the Ray tier. It has no API of its own: everything else is `RingKernelRuntime`'s.

Design notes:
- `tier=` at launch (or a registered or configured tier) keeps its old meaning here: the
  tier *inside* the Ray actor (for example ``"gpu"``, which also asks Ray for a GPU); it
  becomes the ``actor_tier`` option of the Ray tier.
- `shutdown` also shuts Ray down when this runtime's session started it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from ....exceptions import KernelNotFoundError
from ...config import RingKernelConfig
from ...instruments import Instrument
from ...kernel import KernelFunc, RingKernel
from ...registry import get_registered_kernel
from ...runtime import RingKernelRuntime
from ...shutdown import ShutdownReport
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
        max_batch: The most messages one Ray call carries.
        prefetch: The most replies one fetch brings back to the driver.
        actor_options: Default `ActorClass.options(...)` for every kernel (per-kernel
            launch options override them).
        enable_telemetry: Time every message inside the actors.
        restart_timeout: Seconds to wait for Ray to bring a restarting actor back before
            the kernel is declared FAILED.
        read_ahead: Kept for older code; replies are always fetched ahead now.
        name: Prefix of the Ray actor names (default: unique per runtime).
        tracing: As `RingKernelRuntime`.
        instruments: As `RingKernelRuntime`: `Instrument` objects whose hooks the runtime
            calls as messages move.
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
        tracing: bool = False,
        instruments: Iterable[Instrument] = (),
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
        super().__init__(
            enable_telemetry=enable_telemetry, tracing=tracing, instruments=instruments
        )
        use_session(self, self.session)

    async def start(self) -> RayRingKernelRuntime:
        """Bind to the running loop and make sure Ray is initialized (idempotent)."""
        await super().start()
        self.session.start()
        return self

    async def shutdown(self, timeout: float = 10.0, *, ordered: bool = True) -> ShutdownReport:
        """As `RingKernelRuntime.shutdown`; then Ray is shut down if this runtime started it."""
        try:
            return await super().shutdown(timeout, ordered=ordered)
        finally:
            for kid in [*self.kernel_ids, *self.terminated_ids]:
                kernel = self.get_kernel(kid)
                if isinstance(kernel, RayTierKernel):  # (every kernel launched here is one)
                    await kernel.release()
            self.session.close()

    async def launch(
        self,
        kernel_id: str,
        kernel_func: KernelFunc | None = None,
        *,
        config: RingKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
        tier: str | None = None,
        **options: Any,
    ) -> RingKernel:
        """`RingKernelRuntime.launch` on the Ray tier; ``tier`` (or the registered or
        configured one) is the tier inside the Ray actor."""
        inner = tier
        if inner is None and kernel_func is None:
            with contextlib.suppress(KernelNotFoundError):
                inner = get_registered_kernel(kernel_id).options.get("tier")
        if inner is None and config is not None:
            inner = config.tier
        if inner is not None and canonical_tier(inner) != "ray":
            options.setdefault("actor_tier", inner)
        return await super().launch(
            kernel_id,
            kernel_func,
            config=config,
            input_type=input_type,
            output_type=output_type,
            tier="ray",
            **options,
        )
