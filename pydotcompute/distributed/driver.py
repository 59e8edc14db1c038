"""The driver of ring kernels in Ray actors: `RayDriver`.

It backs the `"ray"` tier of `RingKernelRuntime` (`ring_kernels/tiers/ray.py`) and the
compatibility class `RayRingKernelRuntime` (`ray.py`).

The same ``@ring_kernel`` actors, the same lifecycle and the same ``send`` / ``receive`` /
``send_and_receive`` / ``connect`` calls as `RingKernelRuntime`, but
each kernel runs in its own Ray actor (which hosts an ordinary tier-1 runtime, see
``_host.py``). Ray does the placement, the resources and the process supervision; this
module adds no cluster layer of its own.

Design notes:
- Messages cross as MessagePack bytes (``msg.serialize()`` / ``deserialize_message``), in
  lists: one Ray call carries a whole batch. A Ray actor call costs about a millisecond,
  decoding a message about a microsecond, so throughput comes from batching.
- Sends coalesce automatically, with no added delay: each kernel has one ``push`` call in
  flight; whatever is sent while it flies goes out together in the next call (Nagle
  without the timer). One call in flight per kernel also keeps the order of messages,
  which Ray does not promise for threaded actors. ``send`` waits for its batch to be
  acknowledged (so it raises the kernel's refusal); ``send_nowait`` does not wait and a
  refusal is raised by the next send and kept in ``kernel.undelivered``.
- Receives prefetch: one ``fetch`` call brings back up to ``prefetch`` replies, later
  receives are served from the driver-side buffer. A fetch that the caller gave up on
  (timeout, cancellation) still lands in the buffer; replies are never dropped.
- ``send_and_receive`` is one Ray call (the actor correlates the reply), which is what the
  round trip benchmark measures against a plain Ray actor call.
- ``connect`` and ``ctx.send_to`` go actor to actor: the driver hands the source actor the
  target's handle; the driver never relays kernel-to-kernel traffic.
- Faults: a ``watch`` call is parked in every actor. When the actor dies, that call (and
  every other call in flight) fails; the kernel becomes FAILED with the Ray error as its
  cause, and every waiting caller gets `KernelFailedError` instead of hanging. With
  ``restart="on_failure"`` the actor is created with Ray's ``max_restarts``; when Ray brings
  it back, the driver relaunches the kernel in it and returns it to its previous state.
- Ray is imported lazily (``importlib``) so that ``import pydotcompute`` never loads it.

Layout (and why this file is long): one method per verb, by kernel id, plus the Ray-only
ones (the tier's kernels and the compatibility class call them);
``_kernel`` holds the per-kernel batching, prefetching and fault handling on the driver,
``_host`` the Ray actor that hosts a kernel, ``_wire`` how errors cross, ``_support`` the
lazy access to Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from ..decorators.validators import validate_kernel_id
from ..exceptions import (
    InvalidConfigurationError,
    KernelAlreadyExistsError,
    KernelNotFoundError,
    KernelStateError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from ..ring_kernels.config import RingKernelConfig
from ..ring_kernels.message import deserialize_message
from ..ring_kernels.registry import get_registered_kernel
from ..ring_kernels.runtime import OPTION_ALIASES, PLACEMENT_OPTIONS
from ..ring_kernels.states import KernelState
from ..ring_kernels.telemetry import RingKernelTelemetry
from ._host import actor_name
from ._kernel import RayKernel
from ._support import errors, host_class, is_ray_available, ray_module, reason
from ._wire import unpack_error

if TYPE_CHECKING:
    from ..ring_kernels.kernel import KernelFunc

__all__ = ("RAY_ACTOR_OPTIONS", "RayDriver", "RayKernel", "is_ray_available")

logger = logging.getLogger("pydotcompute")

#: Launch options passed straight to ``ActorClass.options(...)`` (resources and placement).
RAY_ACTOR_OPTIONS = PLACEMENT_OPTIONS  # an in-process launch accepts and ignores them
_ENDED = (KernelState.TERMINATED, KernelState.FAILED)


def _never_activated(kernel_id: str, operation: str) -> KernelStateError:
    """Waiting on a kernel that was never activated: no reply can come (said at once)."""
    return KernelStateError(
        kernel_id,
        KernelState.LAUNCHED,
        operation,
        "activate it first: a kernel that was never activated runs no actor, so no reply can come",
    )


#: Ray threads per kernel actor: calls that can wait in it at once (parked fetch and watch,
#: pushes waiting for room, concurrent ``send_and_receive`` callers).
DEFAULT_MAX_CONCURRENCY = 64
_MIN_CONCURRENCY = 4
_REPLY_GRACE_S = 30.0  # how long past a caller's timeout a silent actor is still waited for
_runtime_ids = itertools.count(1)


# --- the runtime ---------------------------------------------------------------------------


class RayDriver:
    """Launches, routes and supervises ring kernels placed in Ray actors.

    Use it like `RingKernelRuntime`:

    ```python
    async with RayRingKernelRuntime() as runtime:
        await runtime.launch("compute", num_cpus=1)
        await runtime.activate("compute")
        reply = await runtime.send_and_receive("compute", ComputeRequest(values=[1.0]))
    ```

    Args:
        address: Passed to ``ray.init(address=...)`` when Ray is not initialized yet
            (``"auto"`` or ``"ray://head:10001"`` to join an existing cluster). When Ray is
            already initialized it is used as is.
        init_options: More ``ray.init`` keyword arguments (``runtime_env``, ``namespace``,
            ``num_cpus`` for a local instance, ...). A runtime that initialized Ray shuts it
            down again in `shutdown`.
        max_batch: The most messages one Ray call carries (sends and forwards).
        prefetch: The most replies one fetch brings back to the driver.
        actor_options: Default ``ActorClass.options(...)`` for every kernel (per-kernel
            launch options override them).
        enable_telemetry: Time every message inside the actors.
        restart_timeout: Seconds to wait for Ray to bring a restarting actor back before
            the kernel is declared FAILED.
        read_ahead: Once a kernel's replies have been received, keep one fetch parked in
            its actor so the next reply comes back without waiting for a receive call.
        name: Prefix of the Ray actor names (default: unique per runtime).
    """

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
        if type(max_batch) is not int or max_batch < 1:
            raise InvalidConfigurationError(f"max_batch must be an int >= 1, got {max_batch!r}")
        if type(prefetch) is not int or prefetch < 1:
            raise InvalidConfigurationError(f"prefetch must be an int >= 1, got {prefetch!r}")
        self.address = address
        self.init_options = dict(init_options or {})
        self.max_batch = max_batch
        self.prefetch = prefetch
        self.actor_options = dict(actor_options or {})
        self.enable_telemetry = enable_telemetry
        self.restart_timeout = restart_timeout
        self.read_ahead = read_ahead
        tag = name or f"{os.getpid():x}-{next(_runtime_ids)}-{uuid.uuid4().hex[:8]}"
        self.name_prefix = f"pydotcompute/{tag}/"
        self._kernels: dict[str, RayKernel] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active = False
        self._closed = False
        self._owns_ray = False
        self._start_time = time.monotonic()
        self._failures: list[tuple[str, BaseException | None]] = []

    # -- lifecycle of the runtime -------------------------------------------------------

    async def start(self) -> RayDriver:
        """Bind to the running loop and make sure Ray is initialized (idempotent)."""
        if self._closed:
            raise KernelStateError("<ray runtime>", "SHUT DOWN", "start", "create a new runtime")
        if self._active:
            return self
        ray = ray_module()
        if not ray.is_initialized():
            opts = {"include_dashboard": False, "log_to_driver": True, **self.init_options}
            if self.address is not None:
                opts["address"] = self.address
            ray.init(**opts)
            self._owns_ray = True
        errors()
        self._loop = asyncio.get_running_loop()
        self._active = True
        self._start_time = time.monotonic()
        return self

    async def __aenter__(self) -> RayDriver:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def is_active(self) -> bool:
        return self._active

    @property
    def kernel_ids(self) -> list[str]:
        return list(self._kernels)

    def __contains__(self, kernel_id: object) -> bool:
        return kernel_id in self._kernels

    def __len__(self) -> int:
        return len(self._kernels)

    async def shutdown(self, timeout: float = 10.0) -> dict[str, int]:
        """Terminate every kernel (draining, upstream stages first) and kill every actor.

        Returns:
            kernel id -> number of messages that could not be delivered (non-zero only).
        """
        if self._closed:
            return {}
        try:
            report = await self.terminate_all(timeout=timeout)
        finally:
            for k in self._kernels.values():
                await self._release(k)
            self._active = False
            self._closed = True
            if self._owns_ray:
                ray_module().shutdown()
                self._owns_ray = False
        return report

    async def terminate_all(self, timeout: float = 10.0) -> dict[str, int]:
        """Terminate every kernel; pipeline sources go first so nothing is lost in between.

        Returns kernel id -> undelivered count (non-zero only; -1 when terminate raised).
        """
        todo = {kid for kid, k in self._kernels.items() if k._state is not KernelState.TERMINATED}
        report: dict[str, int] = {}
        while todo:
            feeding = {self._kernels[kid]._forward_to for kid in todo}
            wave = [kid for kid in todo if kid not in feeding] or sorted(todo)
            results = await asyncio.gather(
                *(self.terminate(kid, timeout=timeout) for kid in wave), return_exceptions=True
            )
            for kid, res in zip(wave, results, strict=True):
                todo.discard(kid)
                if isinstance(res, BaseException):
                    logger.error("terminating kernel %r raised %r", kid, res)
                    report[kid] = -1
                elif res:
                    report[kid] = len(res)
        return report

    # -- kernel lookup ------------------------------------------------------------------

    def _kernel(self, kernel_id: str) -> RayKernel:
        try:
            return self._kernels[kernel_id]
        except KeyError:
            raise KernelNotFoundError(kernel_id, self._kernels, where="Ray runtime") from None
        except TypeError:
            raise KernelNotFoundError(repr(kernel_id), self._kernels, where="Ray runtime") from None

    def get_kernel(self, kernel_id: str) -> RayKernel:
        """The driver-side handle (state, error, actor, undelivered, restarts)."""
        return self._kernel(kernel_id)

    def get_kernel_state(self, kernel_id: str) -> KernelState:
        return self._kernel(kernel_id).state

    # -- lifecycle of kernels -----------------------------------------------------------

    async def launch(
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
    ) -> RayKernel:
        """Phase 1: create the kernel's Ray actor and allocate its queues (LAUNCHED).

        Without ``kernel_func`` the kernel comes from the ``@ring_kernel`` registry. Ray
        resource options (``num_cpus``, ``num_gpus``, ``resources``, ``memory``,
        ``accelerator_type``, ``scheduling_strategy``, ``runtime_env``, ...; see
        `RAY_ACTOR_OPTIONS`) go to the actor, here or in ``@ring_kernel(...)``; any
        other option configures the kernel as in ``RingKernelRuntime.launch``. A kernel
        on the GPU tier (``backend="cuda"``) asks for ``num_gpus=1`` unless told otherwise.

        The kernel function and its message classes must be importable by the Ray workers
        (module-level definitions in a module installed on every node or shipped with
        ``runtime_env``).

        Raises:
            KernelAlreadyExistsError: the id is already launched in this runtime.
            KernelNotFoundError: no function given and none registered under the id.
            InvalidConfigurationError: a bad option, resources the cluster does not have
                (with ``check_resources``), or an actor that could not start.
        """
        if not self._active:
            await self.start()
        validate_kernel_id(kernel_id)
        if kernel_id in self._kernels:
            raise KernelAlreadyExistsError(
                f"kernel {kernel_id!r} is already launched in this Ray runtime (state "
                f"{self._kernels[kernel_id].state.name}); terminate and remove it first or "
                "choose another kernel_id"
            )
        opts: dict[str, Any] = {}
        if kernel_func is None:
            spec = get_registered_kernel(kernel_id)
            kernel_func = spec.func
            input_type = input_type if input_type is not None else spec.input_type
            output_type = output_type if output_type is not None else spec.output_type
            opts.update(spec.options)
        for alias, targets in OPTION_ALIASES.items():  # launch options beat the decorator's
            if options.get(alias) is not None:
                for target in targets:
                    if target not in options:
                        opts.pop(target, None)
        opts.update(options)
        if tier is not None:
            opts["tier"] = tier
        actor_opts = dict(self.actor_options)
        for key in RAY_ACTOR_OPTIONS & set(opts):
            value = opts.pop(key)
            if value is not None:
                actor_opts[key] = value
        actor_opts.update(ray_options or {})
        concurrency = actor_opts.setdefault("max_concurrency", DEFAULT_MAX_CONCURRENCY)
        if type(concurrency) is not int or concurrency < _MIN_CONCURRENCY:
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: max_concurrency must be an int >= {_MIN_CONCURRENCY} "
                f"(a parked fetch, a watch, a push and a request run at once), got "
                f"{concurrency!r}"
            )
        cfg = self._checked_config(kernel_id, config, opts)
        if cfg.tier in ("gpu", "cuda") and "num_gpus" not in actor_opts:
            actor_opts["num_gpus"] = 1
        if check_resources:
            self._check_resources(kernel_id, actor_opts)
        restartable = cfg.restart == "on_failure"
        name = actor_name(self.name_prefix, kernel_id)
        settings = {
            "enable_telemetry": self.enable_telemetry,
            "max_batch": self.max_batch,
            "peer_limit": cfg.output_queue_size,
        }
        try:
            actor = (
                host_class()
                .options(
                    name=name,
                    # Ray counts over the actor's whole life; -1: no limit
                    max_restarts=(-1 if cfg.max_restarts is None else cfg.max_restarts)
                    if restartable
                    else 0,
                    max_task_retries=0,
                    **actor_opts,
                )
                .remote(
                    kernel_id,
                    kernel_func,
                    input_type,
                    output_type,
                    config,
                    opts,
                    self.name_prefix,
                    settings,
                )
            )
        except (TypeError, ValueError) as exc:
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: Ray refused the actor: {exc}"
            ) from exc
        except Exception as exc:  # pickling the function or a message class
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: cannot ship {kernel_func!r} to Ray: {exc}; define "
                "the kernel function and its message classes at module level in an "
                "importable module"
            ) from exc
        kernel = RayKernel(kernel_id, actor, name, cfg, input_type, output_type, actor_opts, self)
        try:
            _, err = await actor.launch.remote()
        except errors().actor as exc:
            with contextlib.suppress(Exception):
                ray_module().kill(actor)
            module = getattr(kernel_func, "__module__", "?")
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: its Ray actor could not start ({reason(exc)}); "
                f"every Ray worker must be able to import {module!r} (install it on each "
                "node or ship it with runtime_env={'py_modules': [...]} or "
                "{'working_dir': ...})"
            ) from exc
        except BaseException:
            with contextlib.suppress(Exception):
                ray_module().kill(actor)
            raise
        if err is not None:
            with contextlib.suppress(Exception):
                ray_module().kill(actor)
            raise unpack_error(err)
        kernel._state = KernelState.LAUNCHED
        self._kernels[kernel_id] = kernel
        kernel._start_watch()
        return kernel

    def _checked_config(
        self, kernel_id: str, config: RingKernelConfig | None, opts: dict[str, Any]
    ) -> RingKernelConfig:
        """Validate tier-1 options on the driver, before an actor is spent on them."""
        from ..decorators.validators import validate_config
        from ..ring_kernels import runtime as runtime_module

        tier = opts.get("tier") or (config.tier if config is not None else "asyncio")
        extra: frozenset[str] = frozenset()
        if tier not in ("asyncio", "async"):
            extra = frozenset(opts)  # other tiers validate their own options in the actor
        cfg = runtime_module._build_config(kernel_id, config, dict(opts), extra)
        validate_config(cfg)
        return cfg

    def _check_resources(self, kernel_id: str, actor_opts: dict[str, Any]) -> None:
        wanted: dict[str, float] = {}
        for key, res in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            if actor_opts.get(key):
                wanted[res] = float(actor_opts[key])
        for res, amount in (actor_opts.get("resources") or {}).items():
            wanted[res] = float(amount)
        if not wanted:
            return
        total = ray_module().cluster_resources()
        for res, amount in wanted.items():
            have = float(total.get(res, 0.0))
            if amount > have:
                raise InvalidConfigurationError(
                    f"kernel {kernel_id!r} asks Ray for {amount:g} {res} but the cluster has "
                    f"{have:g}; connect to a cluster that has it (ray.init(address=...)), "
                    "lower the request, or pass check_resources=False to wait for an "
                    "autoscaler"
                )

    async def _lifecycle(self, kernel_id: str, operation: str) -> None:
        k = self._kernel(kernel_id)
        await k._settle()
        if k._state is KernelState.FAILED and k._dead:
            raise k._failed_error()
        try:
            state, err = await getattr(k.actor, operation).remote()
        except errors().actor as exc:
            raise k._lost(exc, operation) from exc
        if err is not None:
            raise unpack_error(err)
        if k._state not in _ENDED and k._stopping is None:
            k._state = KernelState[state]

    async def activate(self, kernel_id: str) -> None:
        """Phase 2: start processing (LAUNCHED -> ACTIVE)."""
        await self._lifecycle(kernel_id, "activate")

    async def deactivate(self, kernel_id: str) -> None:
        """Pause delivery; queued messages are kept (ACTIVE -> DEACTIVATED)."""
        await self._lifecycle(kernel_id, "deactivate")

    async def reactivate(self, kernel_id: str) -> None:
        """Resume delivery (DEACTIVATED -> ACTIVE)."""
        await self._lifecycle(kernel_id, "reactivate")

    async def terminate(self, kernel_id: str, timeout: float | None = None) -> list[Any]:
        """Terminate one kernel, draining gracefully, and release its Ray actor.

        Messages still waiting on the driver are sent first; the actor drains its inbox
        (``timeout`` seconds, default ``config.drain_timeout``); the replies left in its
        outbox come back to the driver and stay receivable. Returns the messages that
        could not be processed (also kept in ``kernel.undelivered``).
        """
        k = self._kernel(kernel_id)
        if k._stopping is not None:
            await asyncio.shield(k._stopping)
            return []
        if k._state is KernelState.TERMINATED:
            raise KernelStateError(kernel_id, k._state, "terminate", "it is already terminated")
        assert self._loop is not None
        stopping = k._stopping = self._loop.create_future()
        k._state = KernelState.TERMINATING
        left: list[Any] = []
        try:
            if k._restoring is not None:
                await asyncio.wait({k._restoring})
            grace = k.config.drain_timeout if timeout is None else timeout
            await k._flush_quietly(grace)
            alive = not k._dead
            if alive:
                left = await self._terminate_remote(k, timeout)
            # a push the actor could not take (its inbox full, its outbox unread) ends
            # with the actor's terminate: wait for its answer, so that what it refused is
            # accounted for before terminate returns
            await k._flush_quietly(5.0)
            if left:
                k.undelivered.extend(left)
                k.telemetry.record_drop(len(left))
                logger.warning(
                    "kernel %r terminated with %d undelivered message(s) (counted as dropped)",
                    kernel_id,
                    len(left),
                )
            if alive:
                # the actor's last counts (its restarts, errors, drops) before it goes:
                # telemetry read after terminate must not be the last periodic snapshot
                await self._final_telemetry(k)
            if k._end_error is None or not isinstance(k._end_error, KernelStateError):
                k._end_error = KernelStateError(
                    kernel_id,
                    KernelState.TERMINATED,
                    "receive from",
                    "it was terminated and its outbox is drained",
                )
        finally:
            k._state = KernelState.TERMINATED
            await self._release(k)
            k._stopping = None
            stopping.set_result(None)
        return left

    async def _terminate_remote(self, k: RayKernel, timeout: float | None) -> list[Any]:
        try:
            value, err = await k.actor.terminate.remote(timeout)
        except errors().actor as exc:
            k.error = k.error or exc
            k.telemetry.record_error(exc)
            logger.error("kernel %r: its Ray actor died while terminating: %s", k.kernel_id, exc)
            return []
        if err is not None:
            error = unpack_error(err)
            if getattr(error, "state", None) is KernelState.TERMINATED:
                return []  # its function had returned already
            raise error
        left_b, rest_b, _state, forward_dropped = value
        if k._fetch is not None:  # replies it took came out of the outbox before these
            await asyncio.wait({k._fetch}, timeout=5.0)
        k._replies.extend(deserialize_message(b) for b in rest_b)
        if forward_dropped:
            k.telemetry.record_drop(forward_dropped)
        return [deserialize_message(b) for b in left_b]

    async def _final_telemetry(self, k: RayKernel) -> None:
        """Fetch ``k``'s telemetry from its actor once more (bounded: 5 s); a failure
        leaves the last snapshot, with a warning."""
        try:
            async with asyncio.timeout(5.0):
                tel, _ = await k.actor.telemetry.remote()
        except Exception as exc:
            logger.warning("kernel %r: final telemetry not fetched: %r", k.kernel_id, exc)
            return
        self._merge_telemetry(k, tel)

    async def _release(self, k: RayKernel) -> None:
        """Stop the driver-side tasks of ``k`` and kill its actor (idempotent)."""
        for task in (k._watch, k._fetch, k._restoring, k._setup):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait({task})  # (our own cancellation still propagates)
        k._watch = k._fetch = k._restoring = k._setup = None
        if not k._released:
            k._released = True
            with contextlib.suppress(Exception):
                ray_module().kill(k.actor, no_restart=True)

    def remove(self, kernel_id: str) -> None:
        """Forget a TERMINATED kernel so its id can be launched again."""
        k = self._kernel(kernel_id)
        if k._state is not KernelState.TERMINATED:
            raise KernelStateError(kernel_id, k._state, "remove", "terminate it first")
        if not k._released:
            k._released = True
            with contextlib.suppress(Exception):
                ray_module().kill(k.actor, no_restart=True)
        del self._kernels[kernel_id]

    # -- messaging: sends ----------------------------------------------------------------

    async def send(self, kernel_id: str, msg: Any, *, timeout: float | None = None) -> bool:
        """Deliver ``msg`` to a kernel's inbox in its Ray actor.

        Waits until the actor has accepted it (messages sent meanwhile by other callers
        share the same Ray call).

        Raises:
            KernelNotFoundError: unknown id (the text lists the known ids).
            TypeValidationError: ``msg`` is not the kernel's ``input_type``.
            KernelStateError: the kernel is terminating or terminated.
            KernelFailedError: the kernel failed or its actor died.
            QueueFullError / QueueTimeoutError: backpressure ``reject`` / a ``timeout``.
        """
        try:
            k = self._kernels[kernel_id]
        except (KeyError, TypeError):
            k = self._kernel(kernel_id)
        data = k._encode(msg)
        if k._async_error is not None:
            k._raise_async_error()
        if k._setup is not None:
            await k._settle()
        if k._queued >= k.config.input_queue_size:
            await k._room(timeout)
        await k._wait_parts(k._enqueue([data], timeout, True))
        return True

    def send_nowait(self, kernel_id: str, msg: Any) -> bool:
        """Queue ``msg`` for the kernel without waiting for the actor.

        It leaves with the next Ray call (coalesced with other sends). If the actor later
        refuses it, the error is raised by the next send to this kernel and the message
        is kept in ``kernel.undelivered``.

        Raises:
            QueueFullError: ``input_queue_size`` messages are already in flight.
        """
        k = self._kernel(kernel_id)
        data = k._encode(msg)
        k._raise_async_error()
        if k._queued >= k.config.input_queue_size:
            raise QueueFullError(
                f"{k._queued} messages to kernel {kernel_id!r} are already in flight to its "
                "Ray actor (its input_queue_size); use send() to wait for room"
            )
        k._enqueue([data], None, False)
        return True

    async def send_batch(
        self, kernel_id: str, msgs: Iterable[Any], *, timeout: float | None = None
    ) -> int:
        """Send many messages in as few Ray calls as possible (``max_batch`` per call).

        Returns how many were accepted (all of them, or it raises the refusal; the
        accepted prefix stays delivered and the rest is kept in ``kernel.undelivered``).
        """
        k = self._kernel(kernel_id)
        encode = k._encode
        datas = [encode(m) for m in msgs]
        if not datas:
            return 0
        k._raise_async_error()
        await k._settle()
        await k._wait_parts(k._enqueue(datas, timeout, True))
        return len(datas)

    async def flush(self, kernel_id: str) -> None:
        """Wait until every message sent to the kernel so far has reached its actor.

        Raises the refusal of a ``send_nowait`` message, if any.
        """
        k = self._kernel(kernel_id)
        if k._batches:
            last = k._batches[-1]
            await k._wait_parts([(last, 0)])
        k._raise_async_error()

    async def receive(self, kernel_id: str, *, timeout: float | None = None) -> Any:
        """The next reply from a kernel's outbox, waiting up to ``timeout`` seconds.

        Raises:
            QueueTimeoutError: nothing arrived in time (a ``TimeoutError``).
            KernelFailedError: the actor raised or died (after its replies were drained).
            KernelStateError: the kernel was terminated and its outbox is drained.
        """
        try:
            k = self._kernels[kernel_id]
        except (KeyError, TypeError):
            k = self._kernel(kernel_id)
        replies = k._replies
        if not replies:
            if k.state is KernelState.LAUNCHED:
                raise _never_activated(kernel_id, "receive from")
            await k._wait_replies(timeout, 1)
        msg = replies.popleft()
        if not replies and k._fetch is None and self.read_ahead:
            k._read_ahead()
        return msg

    def receive_nowait(self, kernel_id: str) -> Any:
        """The next reply already on the driver, or None (starts a fetch in the background)."""
        k = self._kernel(kernel_id)
        if k._replies:
            return k._replies.popleft()
        if k._fetch_error is not None:
            err, k._fetch_error = k._fetch_error, None
            raise err
        if k._end_error is not None and k._stopping is None:
            raise k._end_error
        if k._fetch is None and k._stopping is None and k._restoring is None and self._loop:
            k._fetch = self._loop.create_task(k._fetch_replies(self.prefetch, None))
        return None

    async def receive_batch(
        self, kernel_id: str, max_count: int = 1024, *, timeout: float | None = None
    ) -> list[Any]:
        """Up to ``max_count`` replies: waits (up to ``timeout``) for the first, then takes
        what has arrived. Returns an empty list when the timeout passes first.
        """
        k = self._kernel(kernel_id)
        if not k._replies:
            try:
                await k._wait_replies(timeout, max_count)
            except QueueTimeoutError:
                return []
        replies = k._replies
        if len(replies) <= max_count:
            out = list(replies)
            replies.clear()
            if k._fetch is None and self.read_ahead:
                k._read_ahead()
            return out
        return [replies.popleft() for _ in range(max_count)]

    async def send_and_receive(
        self, kernel_id: str, msg: Any, *, timeout: float | None = None
    ) -> Any:
        """Send ``msg`` and wait for the reply correlated with it, in one Ray call.

        Concurrent callers each get their own reply. Earlier sends to the same kernel
        reach it first.
        """
        try:
            k = self._kernels[kernel_id]
        except (KeyError, TypeError):
            k = self._kernel(kernel_id)
        if k.state is KernelState.LAUNCHED:
            raise _never_activated(kernel_id, "send_and_receive to")
        data = k._encode(msg)
        if k._batches or k._setup is not None or k._restoring is not None:
            await self.flush(kernel_id)
            await k._settle()
        try:
            if timeout is None:
                answer = await k._request.remote(data)
            else:
                # ``asyncio.timeout``, not ``wait_for``: on 3.11 ``wait_for`` can swallow a
                # cancellation that lands as the answer arrives
                async with asyncio.timeout(timeout + _REPLY_GRACE_S):
                    answer = await k._request.remote(data, timeout)
        except errors().actor as exc:
            raise k._lost(exc, "send to") from exc
        except TimeoutError:
            raise QueueTimeoutError(
                f"no reply from kernel {kernel_id!r} within {timeout}s: its Ray actor did "
                "not answer"
            ) from None
        if type(answer) is bytes:
            return deserialize_message(answer)
        raise unpack_error(answer[1])

    # -- routing ------------------------------------------------------------------------

    def connect(self, source_id: str, target_id: str) -> asyncio.Task[None] | None:
        """Forward everything ``source_id`` sends into ``target_id``'s inbox, actor to actor.

        The source's actor pushes straight to the target's actor (batched); the driver is
        not on that path. The change reaches the source actor before any later call to it;
        ``await runtime.connect(...)`` to wait for it explicitly.

        Raises:
            TypeValidationError: the source's ``output_type`` cannot be the target's
                ``input_type``.
        """
        src, dst = self._kernel(source_id), self._kernel(target_id)
        if src is dst:
            raise InvalidConfigurationError(f"cannot connect kernel {source_id!r} to itself")
        out_t, in_t = src.output_type, dst.input_type
        if out_t is not None and in_t is not None and not issubclass(out_t, in_t):
            raise TypeValidationError(
                f"cannot connect {source_id!r} -> {target_id!r}: {source_id!r} sends "
                f"{out_t.__name__} but {target_id!r} expects {in_t.__name__}"
            )
        if src._state in _ENDED or src._stopping is not None:
            raise src._refuse("connect")
        src._forward_to = target_id
        return self._remote_setup(src, src.actor.connect.remote(target_id, dst.actor))

    def disconnect(self, source_id: str) -> asyncio.Task[None] | None:
        """Stop forwarding ``source_id``'s output; it goes to its outbox again."""
        src = self._kernel(source_id)
        src._forward_to = None
        if src._state in _ENDED:
            return None
        return self._remote_setup(src, src.actor.disconnect.remote())

    def _remote_setup(self, k: RayKernel, ref: Any) -> asyncio.Task[None] | None:
        previous = k._setup

        async def apply() -> None:
            if previous is not None:
                await previous
            try:
                _, err = await ref
            except errors().actor as exc:
                raise k._lost(exc, "connect") from exc
            if err is not None:
                raise unpack_error(err)

        loop = self._loop
        if loop is None:
            return None
        k._setup = loop.create_task(apply())
        return k._setup

    # -- telemetry ----------------------------------------------------------------------

    def get_telemetry(self, kernel_id: str) -> RingKernelTelemetry:
        """The kernel's telemetry as last fetched (see `refresh_telemetry`)."""
        k = self._kernel(kernel_id)
        k.telemetry.queue_depth = max(k.telemetry.queue_depth, 0)
        return k.telemetry

    async def refresh_telemetry(self, kernel_id: str) -> RingKernelTelemetry:
        """Fetch the kernel's telemetry from its actor (one Ray call)."""
        k = self._kernel(kernel_id)
        if not k._released and not k._dead:
            try:
                tel, _ = await k.actor.telemetry.remote()
            except errors().actor as exc:
                raise k._lost(exc, "read telemetry of") from exc
            self._merge_telemetry(k, tel)
        return k.telemetry

    def refresh_telemetry_now(self, kernel_id: str, timeout: float = 5.0) -> RingKernelTelemetry:
        """`refresh_telemetry` for synchronous callers: waits (up to `timeout` seconds,
        blocking the caller) for the actor's snapshot; on any Ray error the last snapshot
        is returned unchanged."""
        k = self._kernel(kernel_id)
        if not k._released and not k._dead:
            try:
                tel, _ = ray_module().get(k.actor.telemetry.remote(), timeout=timeout)
            except Exception as exc:
                logger.warning("kernel %r: telemetry not refreshed: %r", kernel_id, exc)
            else:
                self._merge_telemetry(k, tel)
        return k.telemetry

    @staticmethod
    def _merge_telemetry(k: RayKernel, tel: RingKernelTelemetry | None) -> None:
        if tel is not None:
            local = k.telemetry
            tel.start_time = time.monotonic() - tel.uptime_seconds
            tel.messages_dropped = max(tel.messages_dropped, local.messages_dropped)
            tel.restarts += k.restarts  # in-actor restarts + Ray restarts
            if local.error_count > tel.error_count:
                tel.error_count, tel.last_error = local.error_count, local.last_error
            k.telemetry = tel

    def get_all_telemetry(self) -> dict[str, RingKernelTelemetry]:
        return {kid: self.get_telemetry(kid) for kid in self._kernels}

    def get_summary(self) -> dict[str, Any]:
        """Totals across kernels (as last fetched), uptime, failures."""
        tels = [k.telemetry for k in self._kernels.values()]
        return {
            "kernel_count": len(self._kernels),
            "active_kernels": sum(k._state is KernelState.ACTIVE for k in self._kernels.values()),
            "total_messages_processed": sum(t.messages_processed for t in tels),
            "total_messages_dropped": sum(t.messages_dropped for t in tels),
            "total_errors": sum(t.error_count for t in tels),
            "uptime_seconds": time.monotonic() - self._start_time,
            "gpu_utilization": None,
            "failures": [(kid, repr(err)) for kid, err in self._failures],
            "restarts": {k.kernel_id: k.restarts for k in self._kernels.values() if k.restarts},
        }

    def get_loop_info(self) -> dict[str, Any]:
        from ..ring_kernels._loop import get_loop_info

        return get_loop_info()

    # -- scopes -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def kernel_scope(
        self, kernel_id: str, kernel_func: KernelFunc | None = None, **kwargs: Any
    ) -> AsyncIterator[RayKernel]:
        """Launch and activate a kernel for the duration of an ``async with`` block."""
        kernel = await self.launch(kernel_id, kernel_func, **kwargs)
        try:
            await self.activate(kernel_id)
            yield kernel
        finally:
            if kernel.state is not KernelState.TERMINATED:
                await self.terminate(kernel_id)
            self._kernels.pop(kernel_id, None)
