"""Ring kernels on a Ray cluster: :class:`RayRingKernelRuntime`.

The same ``@ring_kernel`` actors, the same lifecycle and the same ``send`` / ``receive`` /
``send_and_receive`` / ``connect`` calls as :class:`~pydotcompute.RingKernelRuntime`, but
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
  which Ray does not promise for async actors. ``send`` waits for its batch to be
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
  cause, and every waiting caller gets :class:`KernelFailedError` instead of hanging. With
  ``restart="on_failure"`` the actor is created with Ray's ``max_restarts``; when Ray brings
  it back, the driver relaunches the kernel in it and returns it to its previous state.
- Ray is imported lazily (``importlib``) so that ``import pydotcompute`` never loads it, and
  because this module is itself called ``ray``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import os
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from ..decorators.validators import validate_kernel_id, validate_message
from ..exceptions import (
    BackendNotAvailableError,
    InvalidConfigurationError,
    KernelAlreadyExistsError,
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from ..ring_kernels.lifecycle import KernelState, RingKernelConfig
from ..ring_kernels.message import RingKernelMessage, deserialize_message
from ..ring_kernels.registry import get_registered_kernel
from ..ring_kernels.telemetry import RingKernelTelemetry
from ._host import KernelHost, actor_name
from ._wire import unpack_cause, unpack_error

if TYPE_CHECKING:
    from ..ring_kernels.lifecycle import KernelFunc

__all__ = ("RAY_ACTOR_OPTIONS", "RayKernel", "RayRingKernelRuntime", "is_ray_available")

logger = logging.getLogger("pydotcompute")

#: Launch options passed straight to ``ActorClass.options(...)`` (resources and placement).
RAY_ACTOR_OPTIONS = frozenset(
    {
        "num_cpus",
        "num_gpus",
        "resources",
        "memory",
        "accelerator_type",
        "scheduling_strategy",
        "runtime_env",
        "max_concurrency",
        "label_selector",
    }
)
_OPTION_ALIASES = {
    "queue_size": ("input_queue_size", "output_queue_size"),
    "backpressure": ("backpressure_strategy",),
}
_RUNNING = (KernelState.LAUNCHED, KernelState.ACTIVE, KernelState.DEACTIVATED)
_ENDED = (KernelState.TERMINATED, KernelState.FAILED)
_REPLY_GRACE_S = 30.0  # how long past a caller's timeout a silent actor is still waited for
_runtime_ids = itertools.count(1)


# --- Ray, lazily ---------------------------------------------------------------------------


def is_ray_available() -> bool:
    """True when the ``ray`` package can be imported (``pip install "pydotcompute[ray]"``)."""
    try:
        importlib.import_module("ray")
    except ImportError:
        return False
    return True


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise BackendNotAvailableError(
            f"the Ray runtime needs the 'ray' package ({exc}); "
            'install it with: pip install "pydotcompute[ray]"'
        ) from exc


class _RayErrors:
    """The Ray exception classes this module catches, looked up once."""

    actor: type[BaseException]
    unavailable: tuple[type[BaseException], ...]

    def __init__(self) -> None:
        mod = importlib.import_module("ray.exceptions")
        self.actor = mod.RayActorError
        unavailable = getattr(mod, "ActorUnavailableError", None)
        self.unavailable = (unavailable,) if unavailable is not None else ()


_ERRORS: _RayErrors | None = None


def _errors() -> _RayErrors:
    global _ERRORS
    if _ERRORS is None:
        _ERRORS = _RayErrors()
    return _ERRORS


_HOST_CLASS: Any = None


def _host_class() -> Any:
    """``ray.remote(KernelHost)``, built once per process."""
    global _HOST_CLASS
    if _HOST_CLASS is None:
        _HOST_CLASS = _ray().remote(KernelHost)
    return _HOST_CLASS


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def _reason(exc: BaseException) -> str:
    """The telling line of a Ray actor error: the exception that broke it, or why it died."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line) and not line.startswith("ray."):
            return line
    for line in reversed(lines):
        if line.lower().startswith(("the actor is dead because", "the actor died because")):
            return line
    return lines[0] if lines else type(exc).__name__


# --- the driver-side kernel ----------------------------------------------------------------


class _Batch:
    """Messages that will cross in one ``push`` call."""

    __slots__ = ("accepted", "done", "error", "items", "sent", "timeout", "unwaited")

    def __init__(self, timeout: float | None) -> None:
        self.items: list[bytes] = []
        self.timeout = timeout
        self.sent = False
        self.unwaited = False
        self.accepted: int | None = None
        self.error: BaseException | None = None
        self.done: asyncio.Future[None] | None = None


class RayKernel:
    """The driver's handle on a ring kernel that runs in a Ray actor.

    Attributes:
        kernel_id: The kernel's id.
        actor: The Ray actor handle (``ray.kill(kernel.actor)`` simulates a lost node).
        actor_name: The Ray actor's name (unique per runtime).
        config: The :class:`RingKernelConfig` the kernel was launched with.
        error: Why the kernel FAILED (the actor's exception, or the Ray error when the
            actor died).
        undelivered: Messages that were sent but never processed (left in the inbox at
            terminate, or refused on their way).
        restarts: How many times Ray restarted the actor.
        telemetry: The last snapshot fetched with ``runtime.refresh_telemetry(id)``, plus
            the driver's own counts of refused messages, errors and restarts.
    """

    def __init__(
        self,
        kernel_id: str,
        actor: Any,
        name: str,
        config: RingKernelConfig,
        input_type: type | None,
        output_type: type | None,
        ray_options: dict[str, Any],
    ) -> None:
        self.kernel_id = kernel_id
        self.actor = actor
        self.actor_name = name
        self.config = config
        self.input_type = input_type
        self.output_type = output_type
        self.ray_options = ray_options
        self.error: BaseException | None = None
        self.undelivered: list[Any] = []
        self.restarts = 0
        self.telemetry = RingKernelTelemetry(kernel_id)
        self._state = KernelState.CREATED
        self._push = actor.push
        self._request = actor.request
        self._fetch_method = actor.fetch
        # outbound
        self._batches: deque[_Batch] = deque()
        self._queued = 0
        self._pump: asyncio.Task[None] | None = None
        self._async_error: BaseException | None = None
        # inbound
        self._replies: deque[Any] = deque()
        self._fetch: asyncio.Task[None] | None = None
        self._fetch_error: BaseException | None = None
        self._end_error: BaseException | None = None
        # control
        self._watch: asyncio.Task[None] | None = None
        self._restoring: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._setup: asyncio.Task[None] | None = None
        self._forward_to: str | None = None
        self._dead = False
        self._released = False

    @property
    def state(self) -> KernelState:
        return self._state

    @property
    def is_active(self) -> bool:
        return self._state is KernelState.ACTIVE

    @property
    def pending(self) -> int:
        """Messages sent from the driver and not yet acknowledged by the actor."""
        return self._queued

    @property
    def buffered(self) -> int:
        """Replies already fetched to the driver and not yet received."""
        return len(self._replies)

    def __repr__(self) -> str:
        return f"<RayKernel {self.kernel_id!r} {self._state.name} actor={self.actor_name!r}>"

    def _refuse(self, operation: str) -> BaseException:
        if self._state is KernelState.FAILED:
            return self._failed_error()
        return KernelStateError(self.kernel_id, self._state, operation)

    def _failed_error(self) -> BaseException:
        if isinstance(self._end_error, KernelFailedError):
            return self._end_error
        err = KernelFailedError(self.kernel_id, self.error)
        err.__cause__ = self.error
        return err


def _min_timeout(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


# --- the runtime ---------------------------------------------------------------------------


class RayRingKernelRuntime:
    """Launches, routes and supervises ring kernels placed in Ray actors.

    Use it like :class:`~pydotcompute.RingKernelRuntime`::

        async with RayRingKernelRuntime() as runtime:
            await runtime.launch("compute", num_cpus=1)
            await runtime.activate("compute")
            reply = await runtime.send_and_receive("compute", ComputeRequest(values=[1.0]))

    Args:
        address: Passed to ``ray.init(address=...)`` when Ray is not initialized yet
            (``"auto"`` or ``"ray://head:10001"`` to join an existing cluster). When Ray is
            already initialized it is used as is.
        init_options: More ``ray.init`` keyword arguments (``runtime_env``, ``namespace``,
            ``num_cpus`` for a local instance, ...). A runtime that initialized Ray shuts it
            down again in :meth:`shutdown`.
        max_batch: The most messages one Ray call carries (sends and forwards).
        prefetch: The most replies one fetch brings back to the driver.
        actor_options: Default ``ActorClass.options(...)`` for every kernel (per-kernel
            launch options override them).
        enable_telemetry: Time every message inside the actors.
        restart_timeout: Seconds to wait for Ray to bring a restarting actor back before
            the kernel is declared FAILED.
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

    async def start(self) -> RayRingKernelRuntime:
        """Bind to the running loop and make sure Ray is initialized (idempotent)."""
        if self._closed:
            raise KernelStateError("<ray runtime>", "SHUT DOWN", "start", "create a new runtime")
        if self._active:
            return self
        ray = _ray()
        if not ray.is_initialized():
            opts = {"include_dashboard": False, "log_to_driver": True, **self.init_options}
            if self.address is not None:
                opts["address"] = self.address
            ray.init(**opts)
            self._owns_ray = True
        _errors()
        self._loop = asyncio.get_running_loop()
        self._active = True
        self._start_time = time.monotonic()
        return self

    async def __aenter__(self) -> RayRingKernelRuntime:
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
                _ray().shutdown()
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
        :data:`RAY_ACTOR_OPTIONS`) go to the actor, here or in ``@ring_kernel(...)``; any
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
        for alias, targets in _OPTION_ALIASES.items():  # launch options beat the decorator's
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
                _host_class()
                .options(
                    name=name,
                    max_restarts=cfg.max_restarts if restartable else 0,
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
        kernel = RayKernel(kernel_id, actor, name, cfg, input_type, output_type, actor_opts)
        try:
            _, err = await actor.launch.remote()
        except _errors().actor as exc:
            with contextlib.suppress(Exception):
                _ray().kill(actor)
            module = getattr(kernel_func, "__module__", "?")
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: its Ray actor could not start ({_reason(exc)}); "
                f"every Ray worker must be able to import {module!r} (install it on each "
                "node or ship it with runtime_env={'py_modules': [...]} or "
                "{'working_dir': ...})"
            ) from exc
        except BaseException:
            with contextlib.suppress(Exception):
                _ray().kill(actor)
            raise
        if err is not None:
            with contextlib.suppress(Exception):
                _ray().kill(actor)
            raise unpack_error(err)
        kernel._state = KernelState.LAUNCHED
        self._kernels[kernel_id] = kernel
        self._start_watch(kernel)
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
        total = _ray().cluster_resources()
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
        await self._settle(k)
        if k._state is KernelState.FAILED and k._dead:
            raise k._failed_error()
        try:
            state, err = await getattr(k.actor, operation).remote()
        except _errors().actor as exc:
            raise self._lost(k, exc, operation) from exc
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
            await self._flush_quietly(k)
            if not k._dead:
                left = await self._terminate_remote(k, timeout)
            if left:
                k.undelivered.extend(left)
                k.telemetry.record_drop(len(left))
                logger.warning(
                    "kernel %r terminated with %d undelivered message(s) (counted as dropped)",
                    kernel_id,
                    len(left),
                )
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
        except _errors().actor as exc:
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

    async def _release(self, k: RayKernel) -> None:
        """Stop the driver-side tasks of ``k`` and kill its actor (idempotent)."""
        for task in (k._watch, k._fetch, k._restoring, k._setup):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        k._watch = k._fetch = k._restoring = k._setup = None
        if not k._released:
            k._released = True
            with contextlib.suppress(Exception):
                _ray().kill(k.actor, no_restart=True)

    def remove(self, kernel_id: str) -> None:
        """Forget a TERMINATED kernel so its id can be launched again."""
        k = self._kernel(kernel_id)
        if k._state is not KernelState.TERMINATED:
            raise KernelStateError(kernel_id, k._state, "remove", "terminate it first")
        if not k._released:
            k._released = True
            with contextlib.suppress(Exception):
                _ray().kill(k.actor, no_restart=True)
        del self._kernels[kernel_id]

    # -- faults -------------------------------------------------------------------------

    def _start_watch(self, k: RayKernel) -> None:
        assert self._loop is not None
        k._watch = self._loop.create_task(
            self._watch(k), name=f"pydotcompute:ray-watch:{k.kernel_id}"
        )

    async def _watch(self, k: RayKernel) -> None:
        """Wait in the actor until the kernel ends; notice the actor dying."""
        try:
            value, _ = await k.actor.watch.remote()
        except _errors().actor as exc:
            if k._stopping is None and k._state is not KernelState.TERMINATED:
                self._lost(k, exc, "use")
            return
        if k._stopping is not None or k._state in _ENDED:
            return
        if not isinstance(value, tuple):
            return
        state, cause = value
        if state == "FAILED":
            self._mark_failed(k, unpack_cause(cause), dead=False)
        elif state == "TERMINATED":
            k._state = KernelState.TERMINATED  # its actor function returned on its own

    def _lost(self, k: RayKernel, exc: BaseException, operation: str) -> BaseException:
        """The actor behind ``k`` is gone: restart it or mark FAILED; the caller's error."""
        if k._released or k._state is KernelState.TERMINATED:
            err: BaseException = KernelStateError(
                k.kernel_id, KernelState.TERMINATED, operation, "it was terminated"
            )
            err.__cause__ = exc
            return err
        cfg = k.config
        restartable = cfg.restart == "on_failure" and k.restarts < cfg.max_restarts
        if restartable and isinstance(exc, _errors().unavailable) and k._stopping is None:
            if k._restoring is None:
                assert self._loop is not None
                k._restoring = self._loop.create_task(self._restore(k, exc))
            err = KernelStateError(
                k.kernel_id,
                "RESTARTING",
                operation,
                f"its Ray actor stopped ({type(exc).__name__}) and Ray is restarting it "
                f"(restart {k.restarts + 1} of {cfg.max_restarts}); messages in flight were "
                "lost, send them again",
            )
            err.__cause__ = exc
            return err
        self._mark_failed(k, exc, dead=True)
        return k._failed_error()

    def _mark_failed(self, k: RayKernel, cause: BaseException | None, *, dead: bool) -> None:
        if k._state is KernelState.FAILED:
            return
        k._state = KernelState.FAILED
        k._dead = k._dead or dead
        k.error = cause
        k.telemetry.record_error(cause or "failed")
        self._failures.append((k.kernel_id, cause))
        if dead:
            err = KernelFailedError(k.kernel_id, cause)
            BaseException.__init__(
                err,
                f"cannot use kernel {k.kernel_id!r}: it is FAILED; its Ray actor died "
                f"({_reason(cause) if cause else 'no reason given'}); launch it again, or "
                "launch it with restart='on_failure' to let Ray restart it",
            )
            err.__cause__ = cause
            k._end_error = err
            logger.error("kernel %r failed: its Ray actor died: %s", k.kernel_id, cause)
        else:
            logger.error("kernel %r failed: %r", k.kernel_id, cause)

    async def _restore(self, k: RayKernel, cause: BaseException) -> None:
        """Wait for Ray to restart the actor, relaunch the kernel there, resume its state.

        Ray refuses calls while the actor is restarting (``ActorUnavailableError``), so the
        restore call is retried until ``restart_timeout`` seconds have passed.
        """
        assert self._loop is not None
        deadline = self._loop.time() + self.restart_timeout
        delay = 0.05
        try:
            while True:
                forward = None
                if k._forward_to is not None and k._forward_to in self._kernels:
                    forward = (k._forward_to, self._kernels[k._forward_to].actor)
                try:
                    value, err = await k.actor.restore.remote(k._state.name, forward)
                    break
                except _errors().unavailable as exc:
                    if self._loop.time() >= deadline:
                        self._mark_failed(k, exc, dead=True)
                        return
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                except _errors().actor as exc:
                    self._mark_failed(k, exc, dead=True)
                    return
        finally:
            k._restoring = None
        if err is not None:
            self._mark_failed(k, unpack_error(err), dead=False)
            return
        if value == "restored":
            k.restarts += 1
            k.telemetry.restarts = k.restarts
            k.telemetry.record_error(cause)
            logger.warning(
                "kernel %r: Ray restarted its actor; restart %d of %d",
                k.kernel_id,
                k.restarts,
                k.config.max_restarts,
            )
        if k._stopping is None and k._state not in _ENDED:
            self._start_watch(k)

    # -- messaging: sends ----------------------------------------------------------------

    def _encode(self, k: RayKernel, msg: Any) -> bytes:
        state = k._state
        if state is not KernelState.ACTIVE and state not in _RUNNING:
            raise k._refuse("send to")
        in_t = k.input_type
        if in_t is not None and type(msg) is not in_t and not isinstance(msg, in_t):
            validate_message(msg, in_t, k.kernel_id, "expects")
        if not isinstance(msg, RingKernelMessage):
            raise TypeValidationError(
                f"kernel {k.kernel_id!r} runs in a Ray actor, so its messages cross as "
                f"MessagePack and must be @message objects; got {type(msg).__name__}"
            )
        return msg.serialize()

    def _enqueue(
        self, k: RayKernel, datas: list[bytes], timeout: float | None, waited: bool
    ) -> list[tuple[_Batch, int]]:
        """Append encoded messages to the kernel's outgoing batches; start the pump."""
        parts: list[tuple[_Batch, int]] = []
        batches = k._batches
        max_batch = self.max_batch
        i, n = 0, len(datas)
        while i < n:
            b = batches[-1] if batches else None
            if b is None or b.sent or len(b.items) >= max_batch:
                b = _Batch(timeout)
                batches.append(b)
            else:
                b.timeout = _min_timeout(b.timeout, timeout)
            take = min(max_batch - len(b.items), n - i)
            if take == 1:
                b.items.append(datas[i])
            else:
                b.items.extend(datas[i : i + take])
            i += take
            if not waited:
                b.unwaited = True
            parts.append((b, len(b.items)))
        k._queued += n
        if k._pump is None:
            assert self._loop is not None
            k._pump = self._loop.create_task(self._run_pump(k))
        return parts

    async def _run_pump(self, k: RayKernel) -> None:
        """Push the kernel's batches one Ray call at a time (the order is kept)."""
        batches = k._batches
        try:
            while batches:
                if k._restoring is not None:
                    await asyncio.wait({k._restoring})
                b = batches[0]
                b.sent = True
                err: BaseException | None
                try:
                    if b.timeout is None:
                        answer = await k._push.remote(b.items)
                    else:
                        answer = await k._push.remote(b.items, b.timeout)
                    if type(answer) is int:
                        accepted, err = answer, None
                    else:
                        accepted, err = answer[0], unpack_error(answer[1])
                except _errors().actor as exc:
                    accepted, err = 0, self._lost(k, exc, "send to")
                except Exception as exc:
                    accepted, err = 0, exc
                batches.popleft()
                k._queued -= len(b.items)
                b.accepted = accepted
                b.error = err
                if accepted < len(b.items):
                    self._refused(k, b.items[accepted:], err)
                    if b.unwaited and k._async_error is None:
                        k._async_error = err
                if b.done is not None and not b.done.done():
                    b.done.set_result(None)
        finally:
            k._pump = None

    def _refused(self, k: RayKernel, items: list[bytes], err: BaseException | None) -> None:
        msgs: list[Any] = []
        for data in items:
            try:
                msgs.append(deserialize_message(data))
            except Exception:
                msgs.append(data)
        k.undelivered.extend(msgs)
        k.telemetry.record_drop(len(msgs))
        logger.warning(
            "kernel %r refused %d message(s): %s (kept in kernel.undelivered)",
            k.kernel_id,
            len(msgs),
            err,
        )

    async def _wait_parts(self, k: RayKernel, parts: list[tuple[_Batch, int]]) -> None:
        for b, end in parts:
            if b.accepted is None:
                if b.done is None:
                    assert self._loop is not None
                    b.done = self._loop.create_future()
                await asyncio.shield(b.done)
            if b.accepted is not None and b.accepted < end:
                assert b.error is not None
                raise b.error

    def _raise_async_error(self, k: RayKernel) -> None:
        err = k._async_error
        if err is not None:
            k._async_error = None
            raise err

    async def _room(self, k: RayKernel, timeout: float | None) -> None:
        """Driver-side backpressure: wait while ``input_queue_size`` messages are in flight."""
        limit = k.config.input_queue_size
        if k._queued < limit:
            return
        assert self._loop is not None
        deadline = None if timeout is None else self._loop.time() + timeout
        while k._queued >= limit and k._batches:
            head = k._batches[0]
            if head.done is None:
                head.done = self._loop.create_future()
            remaining = None if deadline is None else deadline - self._loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueTimeoutError(
                    f"timed out after {timeout}s: {k._queued} messages to kernel "
                    f"{k.kernel_id!r} are still in flight to its Ray actor"
                )
            await asyncio.wait({head.done}, timeout=remaining)

    async def _settle(self, k: RayKernel) -> None:
        """Wait for a pending connect and an ongoing restart before talking to the actor."""
        if k._setup is not None:
            setup, k._setup = k._setup, None
            await setup
        if k._restoring is not None:
            await asyncio.wait({k._restoring})

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
        data = self._encode(k, msg)
        if k._async_error is not None:
            self._raise_async_error(k)
        if k._setup is not None:
            await self._settle(k)
        if k._queued >= k.config.input_queue_size:
            await self._room(k, timeout)
        await self._wait_parts(k, self._enqueue(k, [data], timeout, True))
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
        data = self._encode(k, msg)
        self._raise_async_error(k)
        if k._queued >= k.config.input_queue_size:
            raise QueueFullError(
                f"{k._queued} messages to kernel {kernel_id!r} are already in flight to its "
                "Ray actor (its input_queue_size); use send() to wait for room"
            )
        self._enqueue(k, [data], None, False)
        return True

    async def send_batch(
        self, kernel_id: str, msgs: Iterable[Any], *, timeout: float | None = None
    ) -> int:
        """Send many messages in as few Ray calls as possible (``max_batch`` per call).

        Returns how many were accepted (all of them, or it raises the refusal; the
        accepted prefix stays delivered and the rest is kept in ``kernel.undelivered``).
        """
        k = self._kernel(kernel_id)
        encode = self._encode
        datas = [encode(k, m) for m in msgs]
        if not datas:
            return 0
        self._raise_async_error(k)
        await self._settle(k)
        await self._wait_parts(k, self._enqueue(k, datas, timeout, True))
        return len(datas)

    async def flush(self, kernel_id: str) -> None:
        """Wait until every message sent to the kernel so far has reached its actor.

        Raises the refusal of a ``send_nowait`` message, if any.
        """
        k = self._kernel(kernel_id)
        if k._batches:
            last = k._batches[-1]
            await self._wait_parts(k, [(last, 0)])
        self._raise_async_error(k)

    async def _flush_quietly(self, k: RayKernel) -> None:
        if k._batches:
            with contextlib.suppress(Exception):
                await self._wait_parts(k, [(k._batches[-1], 0)])
        k._async_error = None

    # -- messaging: receives -------------------------------------------------------------

    async def _fetch_replies(self, k: RayKernel, n: int, wait: float | None) -> None:
        try:
            answer = await (
                k._fetch_method.remote(n) if wait is None else k._fetch_method.remote(n, wait)
            )
            items, packed = (answer, None) if type(answer) is list else answer
            if items:
                k._replies.extend(deserialize_message(b) for b in items)
            if packed is not None:
                err = unpack_error(packed)
                if isinstance(err, KernelStateError):
                    k._end_error = err  # closed and drained: terminated or failed
                else:
                    k._fetch_error = err
        except _errors().actor as exc:
            err = self._lost(k, exc, "receive from")
            if k._state is not KernelState.FAILED:
                k._fetch_error = err
        except Exception as exc:
            k._fetch_error = exc
        finally:
            k._fetch = None

    async def _wait_replies(self, k: RayKernel, timeout: float | None, n: int) -> None:
        """Return once ``k._replies`` is non-empty; raise the kernel's end or a timeout."""
        loop = self._loop
        assert loop is not None
        deadline = None if timeout is None else loop.time() + timeout
        while not k._replies:
            if k._fetch_error is not None:
                err, k._fetch_error = k._fetch_error, None
                raise err
            waiting: asyncio.Future[Any] | None = k._stopping or k._restoring
            if waiting is None:
                if k._end_error is not None:
                    raise k._end_error
                if k._setup is not None:
                    await self._settle(k)
                    continue
                waiting = k._fetch
                if waiting is None:
                    wait = None if deadline is None else max(0.0, deadline - loop.time())
                    waiting = k._fetch = loop.create_task(
                        self._fetch_replies(k, max(n, self.prefetch), wait)
                    )
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise QueueTimeoutError(f"no message from kernel {k.kernel_id!r} within {timeout}s")
            done, _ = await asyncio.wait({waiting}, timeout=remaining)
            if not done and not k._replies:
                raise QueueTimeoutError(f"no message from kernel {k.kernel_id!r} within {timeout}s")

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
        if not k._replies:
            await self._wait_replies(k, timeout, 1)
        return k._replies.popleft()

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
            k._fetch = self._loop.create_task(self._fetch_replies(k, self.prefetch, None))
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
                await self._wait_replies(k, timeout, max_count)
            except QueueTimeoutError:
                return []
        replies = k._replies
        if len(replies) <= max_count:
            out = list(replies)
            replies.clear()
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
        data = self._encode(k, msg)
        if k._batches or k._setup is not None or k._restoring is not None:
            await self.flush(kernel_id)
            await self._settle(k)
        try:
            if timeout is None:
                answer = await k._request.remote(data)
            else:
                answer = await asyncio.wait_for(
                    k._request.remote(data, timeout), timeout + _REPLY_GRACE_S
                )
        except _errors().actor as exc:
            raise self._lost(k, exc, "send to") from exc
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
            except _errors().actor as exc:
                raise self._lost(k, exc, "connect") from exc
            if err is not None:
                raise unpack_error(err)

        loop = self._loop
        if loop is None:
            return None
        k._setup = loop.create_task(apply())
        return k._setup

    # -- telemetry ----------------------------------------------------------------------

    def get_telemetry(self, kernel_id: str) -> RingKernelTelemetry:
        """The kernel's telemetry as last fetched (see :meth:`refresh_telemetry`)."""
        k = self._kernel(kernel_id)
        k.telemetry.queue_depth = max(k.telemetry.queue_depth, 0)
        return k.telemetry

    async def refresh_telemetry(self, kernel_id: str) -> RingKernelTelemetry:
        """Fetch the kernel's telemetry from its actor (one Ray call)."""
        k = self._kernel(kernel_id)
        if not k._released and not k._dead:
            try:
                tel, _ = await k.actor.telemetry.remote()
            except _errors().actor as exc:
                raise self._lost(k, exc, "read telemetry of") from exc
            if tel is not None:
                local = k.telemetry
                tel.start_time = time.monotonic() - tel.uptime_seconds
                tel.messages_dropped = max(tel.messages_dropped, local.messages_dropped)
                tel.restarts += k.restarts  # in-actor restarts + Ray restarts
                if local.error_count > tel.error_count:
                    tel.error_count, tel.last_error = local.error_count, local.last_error
                k.telemetry = tel
        return k.telemetry

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
