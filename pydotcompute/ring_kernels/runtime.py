"""RingKernelRuntime: the registry, router, supervisor and telemetry hub of ring kernels.

Design notes:
- The runtime owns no task of its own: every send is a direct enqueue into the target's
  inbox (validated against its ``input_type``), every receive a direct dequeue from its
  outbox, and pipelines (``connect``) forward inside the sending actor's ``ctx.send``. A
  router task per kernel was rejected: it doubles the hops on the hot path.
- Execution tiers plug in by name (``tier=``, see ``tiers/``): each tier provides a class
  with the `RingKernel` interface, imported
  lazily so that the default tier never loads threads, processes or CUDA. The runtime uses
  kernels only through their public methods (``try_accept``/``accept``, ``receive``,
  ``forward_to``, ...) and reads what a tier supports (actor kind, restart, pools,
  broadcast, telemetry to fold in) from its ``CAPABILITIES``, never by looking for a
  method: where a flag is off, the `RingKernel` default applies.
- Shutdown goes head to tail along ``connect`` edges (`supervision.stop_waves`): a stage
  is terminated once every stage forwarding into it has drained into it, so a pipeline
  stops without losing what is in flight; kernels with no edge between them stop in
  parallel. One overall timeout bounds it all, each wave getting what is left (stopping
  everything at once, ``ordered=False``, was the old default: the tail closed first and
  refused what the head had already made). Each kernel drains for at most its own
  ``drain_timeout``, however the stop came (`shutdown`, leaving ``async with``, Ctrl-C).
- Shutdown reports every message it lost (handed back, or dropped while it ran) and the
  replies it leaves unread (`shutdown.ShutdownReport`), and it always closes its books: a
  Ctrl-C or a cancellation while it runs stops every kernel at once instead of breaking it
  off (an interrupted shutdown left kernels it had not reached with their queues uncounted).
- Shutdown and ``terminate_all`` refuse to run inside an actor's own task: they would
  wait for that actor to finish, which waits for them.
- ``terminate`` takes the id out of ``kernel_ids`` (PyDotCompute 0.2's contract: the id
  can be launched again) but parks the kernel until ``remove``: its unread replies stay
  receivable and ``get_kernel``/``get_telemetry`` still answer for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import logging
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import Any

from ..decorators.validators import validate_kernel_id, validate_seconds
from ..exceptions import (
    InvalidConfigurationError,
    KernelAlreadyExistsError,
    KernelNotFoundError,
    KernelStateError,
    QueueClosedError,
    TypeValidationError,
)
from ._loop import get_loop_info as _get_loop_info
from ._loop import install_eager_task_factory
from .config import RingKernelConfig
from .edges import EdgeInfo, EdgeTable
from .instruments import Instrument, Instruments
from .kernel import KernelFunc, RingKernel
from .registry import get_registered_kernel, register_ring_kernel
from .shutdown import ShutdownReport, held_interrupts
from .states import KernelState
from .supervision import stop_waves
from .telemetry import RingKernelTelemetry, TelemetryCollector
from .tiers import canonical_tier, check_actor_kind, register_tier, tier_class

__all__ = ("RingKernelRuntime", "get_registered_kernel", "register_ring_kernel", "register_tier")

logger = logging.getLogger("pydotcompute")


def _tier_class(tier: str) -> type[RingKernel]:
    cls: type[RingKernel] = tier_class(tier)
    return cls


class RingKernelRuntime:
    """Launches, routes and supervises ring kernels on the running event loop.

    Use it as an async context manager:

    ```python
    async with RingKernelRuntime() as runtime:
        await runtime.launch("compute")
        await runtime.activate("compute")
        await runtime.send("compute", ComputeRequest(values=[1.0]))
        reply = await runtime.receive("compute")
    ```

    ``len(runtime)`` and ``kernel_id in runtime`` look at the launched kernels, but a
    runtime is always true (``__bool__``): ``if runtime:`` asks whether there is one, not
    whether it has kernels yet; test ``len(runtime)`` or `kernel_ids` for that.

    Args:
        enable_telemetry: Time every message (one clock read each, binned into a latency
            histogram in C by `telemetry.LatencyRecorder`, or in NumPy batches without the
            compiled extension). With False, as in PyDotCompute 0.2, `get_telemetry`
            returns None, `get_all_telemetry` ``{}`` and `get_summary` zero totals; the
            counters the kernels keep anyway are read with `get_counters`.
        use_uvloop: Informational: uvloop is chosen when the loop is created (importing
            pydotcompute installs its policy; ``pydotcompute.run`` uses its loop factory).
        use_eager_tasks: Start tasks eagerly on the loop (3.12+; ``eager_task_factory``).
        tracing: Record OpenTelemetry spans of every message (``send <kernel>``,
            ``process <kernel>``) with the global tracer provider; needs the
            ``observability`` extra. It installs `observability.tracing.MessageTracer`
            as the first instrument (``runtime.tracer``).
        instruments: `Instrument` objects whose hooks the runtime calls as messages move
            (see `instruments`); more can be added with `add_instrument`. With none,
            nothing on the message path changes.
    """

    #: How errors name this runtime ("unknown kernel id 'x' in the runtime").
    RUNTIME_NAME = "runtime"

    def __init__(
        self,
        *,
        enable_telemetry: bool = True,
        use_uvloop: bool = True,
        use_eager_tasks: bool = True,
        tracing: bool = False,
        instruments: Iterable[Instrument] = (),
    ) -> None:
        self._kernels: dict[str, RingKernel] = {}
        # terminated through this runtime: out of `kernel_ids`, still readable (`remove`)
        self._parked: dict[str, RingKernel] = {}
        self._telemetry = TelemetryCollector()
        self.enable_telemetry = enable_telemetry
        self.use_uvloop = use_uvloop
        self.use_eager_tasks = use_eager_tasks
        self._active = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_time = time.monotonic()
        self._failures: list[tuple[str, BaseException | None]] = []
        self._terminating: dict[str, asyncio.Future[None]] = {}
        self._hurried = False  # a shutdown was interrupted: no more draining
        self._shutdown_report: ShutdownReport | None = None
        self._metrics: Any = None  # the MetricsServer of serve_metrics (False: shut down)
        self._metrics_lock = threading.Lock()
        self._edge_table = EdgeTable()  # which kind each connect edge got (`edges`)
        #: the `observability.tracing.MessageTracer` of ``tracing=True``, else None
        self.tracer: Any = None
        self._instruments = Instruments()
        if tracing:
            from ..observability.tracing import MessageTracer

            self.tracer = MessageTracer()
            self._instruments.append(self.tracer)
        for instrument in instruments:
            self.add_instrument(instrument)

    # -- lifecycle of the runtime -------------------------------------------------------

    async def start(self) -> RingKernelRuntime:
        """Bind to the running loop (idempotent); after `shutdown`, start again."""
        if self._closed:
            self._closed = False
            with self._metrics_lock:
                self._metrics = None
        self._hurried = False
        if not self._active:
            self._loop = asyncio.get_running_loop()
            if self.use_eager_tasks:
                install_eager_task_factory(self._loop)
            self._active = True
            self._start_time = time.monotonic()
        return self

    async def __aenter__(self) -> RingKernelRuntime:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def is_active(self) -> bool:
        return self._active

    # -- instruments --------------------------------------------------------------------

    @property
    def instruments(self) -> Instruments:
        """The installed `Instrument` objects, in the order their hooks are called
        (read-only: change it with `add_instrument` and `remove_instrument`)."""
        return self._instruments

    def add_instrument(self, instrument: Instrument) -> None:
        """Have the runtime call ``instrument``'s hooks from now on (once, however often
        it is added). Kernels launched afterwards are observed in full; a kernel launched
        before gets the hooks of the runtime and of its bridge, not those of its asyncio
        actor's context (chosen at launch) nor `Instrument.kernel_launched`.

        Raises:
            TypeValidationError: ``instrument`` is not an `Instrument`.
        """
        if not isinstance(instrument, Instrument):
            raise TypeValidationError(
                f"add_instrument takes an Instrument (subclass "
                f"pydotcompute.ring_kernels.Instrument and override the hooks you need), "
                f"got {type(instrument).__name__}"
            )
        if instrument not in self._instruments:
            self._instruments.append(instrument)

    def remove_instrument(self, instrument: Instrument) -> None:
        """Stop calling ``instrument``'s hooks (a no-op when it is not installed)."""
        if instrument in self._instruments:
            self._instruments.remove(instrument)

    @property
    def kernel_ids(self) -> list[str]:
        """The ids of the kernels launched and not terminated through this runtime."""
        return list(self._kernels)

    @property
    def terminated_ids(self) -> list[str]:
        """The ids `terminate` or `shutdown` took out of `kernel_ids` and `remove` has not
        forgotten: their kernels still answer `receive`, `get_kernel` and
        `get_telemetry`; launching one of these ids again forgets the old kernel."""
        return list(self._parked)

    def __contains__(self, kernel_id: object) -> bool:
        return kernel_id in self._kernels

    def __len__(self) -> int:
        return len(self._kernels)

    def __bool__(self) -> bool:
        """Always True: without it ``__len__`` would make a runtime with no kernels false,
        and ``if runtime:`` (is there a runtime?) would take the wrong branch."""
        return True

    async def shutdown(self, timeout: float = 10.0, *, ordered: bool = True) -> ShutdownReport:
        """Terminate every kernel, draining, within ``timeout`` seconds in all.

        With ``ordered`` (the default) pipelines stop head to tail along ``connect``
        edges: sources first, then each stage once every stage feeding it has drained
        into it (see `terminate_all`). ``ordered=False`` terminates every kernel at once.
        Each kernel drains for at most its ``drain_timeout``. Afterwards `kernel_ids` is
        empty (every kernel is in `terminated_ids`, readable until `remove`) and the
        runtime can be `start`ed again.

        A Ctrl-C (SIGINT on the main thread, under ``asyncio.run`` or the default
        handler) or a cancellation of the calling task while it runs does not break it
        off: every kernel still running is stopped at once (no more draining), what they
        hold is handed back and counted, and then the interrupt is passed on (or the
        cancellation raised).

        Returns:
            A `ShutdownReport`: kernel id -> messages lost (handed back in
            ``kernel.undelivered``, by terminate or by an earlier failure, plus those
            dropped while the shutdown ran, replies refused by a stopped kernel
            included), ``{}`` when nothing was lost; its ``unread`` attribute counts the
            replies left in outboxes (`take_unread` reads them). Also kept as
            `shutdown_report`. A runtime already shut down returns an empty report. On the Ray
            tier the messages lost with a dead actor before the shutdown are counted too
            (never handed back).

        Raises:
            KernelStateError: called from inside an actor (its own kernel could never
                finish: it waits for this call). Nothing is stopped.
            InvalidConfigurationError: ``timeout`` is not a finite number >= 0.
        """
        if self._closed:
            return ShutdownReport()
        self._refuse_from_actor("shutdown")
        timeout = self._checked_timeout(timeout)
        self._hurried = False
        with held_interrupts(self._interrupted):
            closing = asyncio.ensure_future(self._close(timeout, ordered, time.monotonic()))
            cancelled = False
            while True:  # the books are closed even when this task is cancelled
                try:
                    report = await asyncio.shield(closing)
                    break
                except asyncio.CancelledError:
                    if closing.done():
                        raise
                    cancelled = True
                    self._interrupted("its task was cancelled")
            for kid in list(self._kernels):
                self._park(kid)
            self._active = False
            self._closed = True
            self._shutdown_report = report
            if cancelled:
                raise asyncio.CancelledError
        return report

    async def _close(self, timeout: float, ordered: bool, started: float) -> ShutdownReport:
        try:
            return await self.terminate_all(timeout=timeout, ordered=ordered)
        finally:
            await self._stop_metrics(started, timeout)

    def _interrupted(self, why: str = "Ctrl-C") -> None:
        """A shutdown was interrupted: every kernel still draining is cut off now, and the
        kernels not reached yet stop without draining (their queues handed back)."""
        if self._hurried:
            return
        self._hurried = True
        logger.warning(
            "shutdown interrupted (%s): stopping every kernel now without draining further; "
            "what they hold is handed back and counted (runtime.shutdown_report)",
            why,
        )
        for k in self._kernels.values():
            if k.CAPABILITIES.hurry:  # (a no-op for one not terminating)
                k.hurry()

    @property
    def shutdown_report(self) -> ShutdownReport | None:
        """The `ShutdownReport` of the last `shutdown` (None before the first one): how to
        read it after leaving ``async with RingKernelRuntime()``, which discards it."""
        return self._shutdown_report

    def take_unread(self, kernel_id: str) -> list[Any]:
        """Take every reply still readable from a kernel's outbox, oldest first, without
        waiting: after a shutdown, the replies its report counts as ``unread`` (a
        terminated kernel keeps them until `remove` or a new launch of its id).

        Raises:
            KernelNotFoundError: unknown id.
        """
        kernel = self._kernel(kernel_id)
        replies: list[Any] = []
        while True:
            try:
                reply = kernel.receive_nowait()
            except (KernelStateError, QueueClosedError):  # terminated (or failed) and drained
                return replies
            if reply is None:
                return replies
            replies.append(reply)

    async def terminate_all(self, timeout: float = 10.0, *, ordered: bool = True) -> ShutdownReport:
        """Terminate every running kernel; returns what was lost (a `ShutdownReport`).

        With ``ordered``, in waves along ``connect`` edges: a kernel is terminated once
        every kernel forwarding into it is TERMINATED (a cycle is broken at the kernel of
        the cycle launched first); kernels of one wave stop in parallel. ``timeout``
        bounds the whole call: each wave's grace period is what is left of it, and each
        kernel's is at most its ``drain_timeout``. Without ``ordered``, every kernel is
        terminated at once. Terminated kernels move from `kernel_ids` to
        `terminated_ids`, as with `terminate`.

        Raises:
            KernelStateError: called from inside an actor (see `shutdown`).
            InvalidConfigurationError: ``timeout`` is not a finite number >= 0.
        """
        timeout = self._checked_timeout(timeout)
        self._refuse_from_actor("terminate_all")
        kernels = [k for k in self._kernels.values() if k.state is not KernelState.TERMINATED]
        before = {k.kernel_id: _drop_figures(k) for k in kernels}
        # what died with a tier's remote actor before now (Ray's): counted, never handed
        # back; a loss while stopping shows in the drop figures instead
        lost_before = {k.kernel_id: _lost_with_actor(k) for k in kernels}
        waves = stop_waves(kernels, _forward_target) if ordered else [kernels]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        broken: list[str] = []
        for wave in waves:
            left = 0.0 if self._hurried else max(0.0, deadline - loop.time())
            results = await asyncio.gather(
                *(self._stop(k, min(left, k.config.drain_timeout)) for k in wave),
                return_exceptions=True,
            )
            for k, res in zip(wave, results, strict=True):
                if isinstance(res, BaseException):
                    logger.error("terminating kernel %r raised %r", k.kernel_id, res)
                    broken.append(k.kernel_id)
                elif k.state is not KernelState.TERMINATED:
                    logger.error("kernel %r did not finish terminating in time", k.kernel_id)
                    broken.append(k.kernel_id)
        for kid, k in list(self._kernels.items()):
            if k.state is KernelState.TERMINATED:
                self._park(kid)
        return self._report(kernels, before, broken, lost_before)

    def _report(
        self,
        stopped: list[RingKernel],
        before: dict[str, tuple[int, int]],
        broken: list[str],
        lost_before: dict[str, int] | None = None,
    ) -> ShutdownReport:
        """What stopping ``stopped`` lost (``before``: their `_drop_figures` first), and
        the replies every kernel of the runtime leaves unread (logged in one line)."""
        report = ShutdownReport(interrupted=self._hurried)
        for k in stopped:
            kid = k.kernel_id
            handed = len(k.undelivered)
            total, handed_back = _drop_figures(k)
            dropped = max(0, (total - before[kid][0]) - (handed_back - before[kid][1]))
            dropped += (lost_before or {}).get(kid, 0)
            if handed:
                report.undelivered[kid] = handed
            if dropped:
                report.dropped[kid] = dropped
            if kid in broken:
                report[kid] = -1
            elif handed or dropped:
                report[kid] = handed + dropped
        for k in [*self._kernels.values(), *self._parked.values()]:
            unread = _unread(k)
            if unread:
                report.unread[k.kernel_id] = unread
        if report.unread:
            logger.warning(
                "%d repl(ies) left unread at shutdown (%s); readable with "
                "runtime.take_unread(kernel_id) until the kernel is removed",
                report.unread_total,
                ", ".join(f"{kid!r}: {n}" for kid, n in report.unread.items()),
            )
        return report

    def _park(self, kernel_id: str) -> None:
        """Move a kernel from `kernel_ids` to `terminated_ids`."""
        self._parked[kernel_id] = self._kernels.pop(kernel_id)

    async def _stop(self, kernel: RingKernel, timeout: float) -> None:
        """Terminate ``kernel``; a runtime.terminate() already under way is waited for,
        not started again."""
        under_way = self._terminating.get(kernel.kernel_id)
        if under_way is not None:
            await asyncio.wait([under_way], timeout=timeout)
            return
        if kernel.state is not KernelState.TERMINATED:
            await kernel.terminate(timeout=timeout)

    def _refuse_from_actor(self, operation: str) -> None:
        """Refuse ``operation`` in an actor's own task: it would wait for that actor."""
        task = asyncio.current_task()
        if task is None:
            return
        for k in self._kernels.values():
            if k.is_actor_task(task):
                raise KernelStateError(
                    k.kernel_id,
                    k.state,
                    f"call runtime.{operation}() from the actor of",
                    f"{operation} must be called from outside an actor (it waits for every "
                    "actor to finish, this one included); return from the actor function, "
                    "or start it as a task of its own: "
                    f"asyncio.get_running_loop().create_task(runtime.{operation}())",
                )

    @staticmethod
    def _checked_timeout(timeout: float) -> float:
        seconds = validate_seconds(timeout, "timeout")
        assert seconds is not None
        return seconds

    # -- kernel lookup ------------------------------------------------------------------

    def _kernel(self, kernel_id: str) -> RingKernel:
        try:
            return self._kernels[kernel_id]
        except KeyError:
            parked = self._parked.get(kernel_id)
            if parked is not None:
                return parked
            raise KernelNotFoundError(kernel_id, self._kernels, where=self.RUNTIME_NAME) from None
        except TypeError:
            raise KernelNotFoundError(
                repr(kernel_id), self._kernels, where=self.RUNTIME_NAME
            ) from None

    def get_kernel(self, kernel_id: str) -> RingKernel:
        """The kernel object (for introspection: state, telemetry, undelivered); a
        terminated one too, until `remove`."""
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
        **options: Any,
    ) -> RingKernel:
        """Phase 1: create the kernel and allocate its queues (state LAUNCHED).

        Without ``kernel_func`` the kernel comes from the ``@ring_kernel`` registry.
        ``options`` override `RingKernelConfig` fields (``queue_size``,
        ``backpressure``, ``restart``, ``serialize``, ``tier``, ...). ``replicas=N`` runs N
        copies of the actor behind this one id (a worker pool, see `pool.py`: replies
        in completion order, not FIFO across replicas) on the asyncio, thread and process
        tiers; other tiers refuse it.

        An id in `terminated_ids` can be launched again: the terminated kernel is
        forgotten first, as `remove` does.

        Raises:
            KernelAlreadyExistsError: ``kernel_id`` is already launched in this runtime.
            KernelNotFoundError: no function given and none registered under the id.
            InvalidConfigurationError: a bad option, or ``replicas > 1`` on a tier that
                cannot run a pool.
        """
        if not self._active:
            await self.start()
        validate_kernel_id(kernel_id)
        if kernel_id in self._kernels:
            raise KernelAlreadyExistsError(
                f"kernel {kernel_id!r} is already launched in this {self.RUNTIME_NAME} "
                f"(state {self._kernels[kernel_id].state.name}); terminate it first or "
                "choose another kernel_id"
            )
        if kernel_id in self._parked:
            self.remove(kernel_id)
        registered: dict[str, Any] = {}
        if kernel_func is None:
            spec = get_registered_kernel(kernel_id)
            kernel_func = spec.func
            input_type = input_type if input_type is not None else spec.input_type
            output_type = output_type if output_type is not None else spec.output_type
            registered = spec.options
        opts = options  # a fresh dict per call: ours to change
        if tier is not None:
            opts["tier"] = tier
        tier_name = canonical_tier(
            opts.get("tier") or registered.get("tier") or (config.tier if config else "asyncio")
        )
        cls = _tier_class(tier_name)
        if "replicas" in opts or "replicas" in registered:
            cls, opts, registered = _pool_launch(kernel_id, tier_name, cls, opts, registered)
        extra = cls.EXTRA_OPTIONS
        if registered:  # the decorator's options first: an alias given here (queue_size) wins
            config = _build_config(kernel_id, config, registered, extra, tier=tier_name)
            config = _apply_options(kernel_id, config, opts, extra, tier=tier_name)  # our copy
        else:
            config = _build_config(kernel_id, config, opts, extra, tier=tier_name)
        caps = cls.CAPABILITIES
        check_actor_kind(kernel_id, tier_name, kernel_func, caps.actor_kind)
        if config.restart != "never" and not caps.restart:
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: restart={config.restart!r} is not supported on the "
                f"{tier_name} tier (its actor is not restarted by the runtime); launch it "
                "with restart='never' and relaunch on failure, or use the asyncio tier"
            )
        kernel = cls(
            kernel_id,
            kernel_func,
            config=config,
            input_type=input_type,
            output_type=output_type,
            runtime=self,
            enable_telemetry=self.enable_telemetry,
        )
        await kernel.launch()
        if self._instruments:
            self._instruments.kernel_launched(kernel)
        self._kernels[kernel_id] = kernel
        return kernel

    async def activate(self, kernel_id: str) -> None:
        """Phase 2: start processing (LAUNCHED -> ACTIVE)."""
        await self._kernel(kernel_id).activate()

    async def deactivate(self, kernel_id: str) -> None:
        """Pause delivery; queued messages are kept (ACTIVE -> DEACTIVATED)."""
        await self._kernel(kernel_id).deactivate()

    async def reactivate(self, kernel_id: str) -> None:
        """Resume delivery (DEACTIVATED -> ACTIVE)."""
        await self._kernel(kernel_id).reactivate()

    async def terminate(self, kernel_id: str, timeout: float | None = None) -> list[Any]:
        """Terminate one kernel, draining gracefully; returns its undelivered messages.

        ``timeout`` defaults to the kernel's ``drain_timeout`` (5 s unless configured).
        Once TERMINATED the id leaves `kernel_ids` (and ``in``/``len``) for
        `terminated_ids`: `receive` still reads its unread replies, `get_kernel` and
        `get_telemetry` still answer, until `remove` or a new launch of the id.

        Raises:
            InvalidConfigurationError: ``timeout`` is not None or a finite number >= 0.
        """
        kernel = self._kernel(kernel_id)
        if timeout is not None:
            timeout = self._checked_timeout(timeout)
        for other in self._kernels.values():
            if other.forwards_to is kernel and other.state not in (
                KernelState.TERMINATED,
                KernelState.FAILED,
            ):
                logger.warning(
                    "kernel %r forwards into %r, which is terminating", other.kernel_id, kernel_id
                )
        done = asyncio.get_running_loop().create_future()
        self._terminating.setdefault(kernel_id, done)
        try:
            left = await kernel.terminate(timeout=timeout)
        finally:
            if self._terminating.get(kernel_id) is done:
                del self._terminating[kernel_id]
            done.set_result(None)
        if self._kernels.get(kernel_id) is kernel and kernel.state is KernelState.TERMINATED:
            self._park(kernel_id)
        return left

    def remove(self, kernel_id: str) -> None:
        """Forget a TERMINATED kernel (one in `terminated_ids`, or whose actor ended by
        itself).

        Replies still unread in its outbox are dropped with it, with a warning that says
        how many (``ArrayMessage`` frames release the arrays they pinned).
        """
        kernel = self._kernel(kernel_id)
        if kernel.state is not KernelState.TERMINATED:
            raise KernelStateError(kernel_id, kernel.state, "remove", "terminate it first")
        out = kernel.outbox
        unread = out.clear() if out is not None else 0
        if unread:
            logger.warning(
                "kernel %r removed with %d unread replies; they are dropped", kernel_id, unread
            )
        if self._parked.get(kernel_id) is kernel:
            del self._parked[kernel_id]
        else:
            del self._kernels[kernel_id]
        self._edge_table.forget(kernel)

    # -- messaging ----------------------------------------------------------------------

    def send(
        self, kernel_id: str, msg: Any, *, timeout: float | None = None
    ) -> Coroutine[Any, Any, bool]:
        """Deliver ``msg`` to a kernel's inbox (``await runtime.send(...)``).

        The kernel's own ``send`` coroutine is returned to be awaited: the runtime adds no
        frame of its own to the hot path. An unknown id raises at the call.

        Raises:
            KernelNotFoundError: unknown id (the text lists the known ids).
            TypeValidationError: ``msg`` is not the kernel's ``input_type``.
            KernelStateError: the kernel is terminating, terminated or failed.
            QueueFullError / QueueTimeoutError: backpressure ``reject`` / a ``timeout``.
        """
        try:
            kernel = self._kernels[kernel_id]
        except (KeyError, TypeError):
            kernel = self._kernel(kernel_id)
        if self._instruments:
            return self._instruments.send(kernel, msg, timeout)
        return kernel.send(msg, timeout)

    def send_nowait(self, kernel_id: str, msg: Any) -> bool:
        """Like `send` but never waits: a full inbox raises ``QueueFullError``."""
        kernel = self._kernel(kernel_id)
        if self._instruments:
            self._instruments.send_nowait(kernel, msg)
        else:
            kernel.accept_nowait(msg)
        return True

    def receive(self, kernel_id: str, *, timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        """The next message from a kernel's outbox, waiting up to ``timeout`` seconds
        (``await runtime.receive(...)``; the kernel's own ``receive`` coroutine is returned
        to be awaited, and an unknown id raises at the call).

        Raises:
            QueueTimeoutError: nothing arrived in time (a ``TimeoutError``).
            KernelFailedError: the actor raised (after the outbox was drained).
            KernelStateError: the kernel was terminated and its outbox is drained, or it
                is LAUNCHED (never activated: raised at once, no reply can come).
        """
        try:
            kernel = self._kernels[kernel_id]
        except (KeyError, TypeError):
            kernel = self._kernel(kernel_id)
        return kernel.receive(timeout)

    def receive_nowait(self, kernel_id: str) -> Any:
        """The next reply, or None when the outbox is empty."""
        return self._kernel(kernel_id).receive_nowait()

    def send_and_receive(
        self, kernel_id: str, msg: Any, *, timeout: float | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Send ``msg`` and wait for the reply correlated with it
        (``await runtime.send_and_receive(...)``; as with `send`, the kernel's own coroutine
        is returned to be awaited, and an unknown id raises at the call).

        The actor's reply is matched by ``correlation_id`` (stamped automatically when the
        actor replies while handling ``msg``), so concurrent callers each get their own.
        """
        try:
            kernel = self._kernels[kernel_id]
        except (KeyError, TypeError):
            kernel = self._kernel(kernel_id)
        if self._instruments:
            return self._instruments.request(kernel, msg, timeout)
        return kernel.send_and_receive(msg, timeout)

    async def broadcast(self, kernel_id: str, msg: Any, *, timeout: float | None = None) -> int:
        """Send every replica of a pool (``launch(..., replicas=N)``) its own copy of ``msg``.

        Each running replica gets one copy, with a fresh ``message_id`` (so its reply
        correlates), and takes it exactly once. The copies enter the pool's inbox in
        ``msg``'s priority band, all at once: a HIGH or SYSTEM broadcast reaches each
        replica before the queued messages of lower bands it has not taken (on the thread
        and process tiers, behind at most the few messages already handed to that
        replica). Each copy then ends as any message does: its reply goes where replies
        go, or it is handed back by ``terminate``, or counted as dropped. On a kernel that
        is not a pool this is `send` (and returns 1).

        Args:
            kernel_id: The pool (or kernel).
            msg: An ``@message`` instance of the kernel's ``input_type``.
            timeout: Under ``block`` backpressure, how long to wait for room for the first
                copy (the others follow it at once, beyond the bound if need be); under
                ``reject`` the inbox must have room for every copy.

        Returns:
            How many replicas it reached: one per replica still running (a replica whose
            actor function returned is skipped).

        Raises:
            KernelNotFoundError: unknown id.
            TypeValidationError: ``msg`` is not the kernel's ``input_type``, or cannot be
                copied with a fresh ``message_id``.
            KernelStateError / KernelFailedError: the kernel does not take messages.
            QueueFullError / QueueTimeoutError: ``reject`` without room for every copy /
                ``timeout`` passed with the inbox full. Nothing was sent.
            InvalidConfigurationError: ``timeout`` is not a finite number >= 0 or None.
        """
        kernel = self.get_kernel(kernel_id)
        if timeout is not None:
            timeout = self._checked_timeout(timeout)
        if not kernel.CAPABILITIES.broadcast:  # one actor: a plain send
            await self.send(kernel_id, msg, timeout=timeout)
            return 1
        return await kernel.broadcast(msg, timeout)

    def connect(self, source_id: str, target_id: str, *, direct: bool = True) -> None:
        """Forward everything ``source_id`` sends into ``target_id``'s inbox (a pipeline).

        Between two off-loop kernels whose tiers offer a direct edge (thread and process
        kernels; two GPU kernels on one device) the messages move straight from actor to
        actor, off the event loop; with ``direct=False``, or where no direct kind fits,
        they cross the loop. `edges` says which (docs/concepts/data-plane.md).

        Raises:
            TypeValidationError: the source's ``output_type`` cannot be the target's
                ``input_type`` (for a GPU -> GPU edge: is not the same class).
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
        # a tracer keeps the kinds that carry trace context direct; another instrument's
        # hooks would miss a direct edge's messages, so it keeps loop edges
        tracing = self.tracer is not None and self.tracer in self._instruments
        others = any(inst is not self.tracer for inst in self._instruments)
        self._edge_table.check(src, dst, tracing=tracing, instrumented=others, direct=direct)
        src.forward_to(dst)
        info = self._edge_table.connect(
            src, dst, tracing=tracing, instrumented=others, direct=direct
        )
        if self._instruments:
            self._instruments.edge_routed(src, info.kind != "loop")

    def disconnect(self, source_id: str) -> None:
        """Stop forwarding ``source_id``'s output; it goes to its outbox again."""
        src = self._kernel(source_id)
        self._edge_table.disconnect(src)
        src.forward_to(None)
        if self._instruments:
            self._instruments.edge_routed(src, False)

    def edges(self) -> list[EdgeInfo]:
        """Every ``connect`` edge of the kernels in `kernel_ids` and `terminated_ids`
        (until `remove`), and how its messages move.

        Each `EdgeInfo` names the source and target, the edge's ``kind`` (``"loop"``:
        through this runtime's event loop; ``"objects"``: directly, thread to thread;
        ``"shm-ring"``: directly through shared memory, with a process end;
        ``"device-ring"``: GPU kernel to GPU kernel through device memory),
        ``why`` a loop edge is not direct, and a direct edge's own counters (see
        docs/concepts/data-plane.md).
        """
        return self._edge_table.edges([*self._kernels.values(), *self._parked.values()])

    # -- telemetry ----------------------------------------------------------------------

    def get_telemetry(self, kernel_id: str) -> RingKernelTelemetry | None:
        """A kernel's telemetry (a terminated one's too, until `remove`), or None for an
        unknown id or when the runtime was made with ``enable_telemetry=False`` (as in
        PyDotCompute 0.2). `get_counters` is the strict form."""
        if not self.enable_telemetry:
            return None
        try:
            return self.get_counters(kernel_id)
        except KernelNotFoundError:
            return None

    def get_counters(self, kernel_id: str) -> RingKernelTelemetry:
        """A kernel's telemetry record, kept whatever ``enable_telemetry`` says (without
        it, arrivals, drops and errors are still counted; processing is not timed).

        Raises:
            KernelNotFoundError: unknown id (the text lists the known ids).
        """
        kernel = self._kernel(kernel_id)
        if kernel.CAPABILITIES.telemetry_refresh:  # first: a tier may replace its record
            kernel.refresh_telemetry()
        tel = kernel.telemetry
        inbox = kernel.inbox
        tel.queue_depth = len(inbox) if inbox is not None else 0
        # arrivals: counted by the kernel's queues, nothing per message
        tel.messages_received = kernel.messages_received()
        self._edge_table.fold(kernel, tel, timed=self.enable_telemetry)
        return tel

    def get_replica_telemetry(self, kernel_id: str) -> list[RingKernelTelemetry]:
        """One telemetry record per replica of a pool (`launch(..., replicas=N)`).

        Their `messages_processed` and `messages_sent` add up to `get_telemetry`'s, which
        is the pool as a whole. A kernel that is not a pool gives a one-item list holding
        its own telemetry.
        """
        tel = self.get_counters(kernel_id)
        kernel = self._kernel(kernel_id)
        if not kernel.CAPABILITIES.replica_telemetry:
            return [tel]
        tels = kernel.replica_telemetry()
        self._edge_table.fold_replicas(kernel, tels, timed=self.enable_telemetry)
        return tels

    def get_all_telemetry(self) -> dict[str, RingKernelTelemetry]:
        """`get_telemetry` of every id in `kernel_ids` (``{}`` without telemetry)."""
        if not self.enable_telemetry:
            return {}
        return {kid: self.get_counters(kid) for kid in self._kernels}

    def get_summary(self) -> dict[str, Any]:
        """Totals across kernels, uptime and GPU utilization (a fraction 0..1; None
        without NVML).

        ``kernel_count`` and ``active_kernels`` count `kernel_ids`; the message totals
        also count the kernels in `terminated_ids` (what they dropped at terminate).

        With ``enable_telemetry=False`` only ``kernel_count`` and zero totals (as in
        PyDotCompute 0.2).
        """
        from .telemetry import get_gpu_monitor

        if not self.enable_telemetry:
            return {
                "kernel_count": len(self._kernels),
                "total_messages_processed": 0,
                "total_messages_dropped": 0,
                "total_errors": 0,
            }
        tels = [self.get_counters(kid) for kid in [*self._kernels, *self._parked]]
        mon = get_gpu_monitor()
        util = mon.get_utilization(0) if mon.is_available and mon.device_count else None
        return {
            "kernel_count": len(self._kernels),
            "active_kernels": sum(k.state is KernelState.ACTIVE for k in self._kernels.values()),
            "total_messages_processed": sum(t.messages_processed for t in tels),
            "total_messages_dropped": sum(t.messages_dropped for t in tels),
            "total_errors": sum(t.error_count for t in tels),
            "uptime_seconds": time.monotonic() - self._start_time,
            "gpu_utilization": util,
            "failures": [(kid, repr(err)) for kid, err in self._failures],
        }

    def serve_metrics(self, port: int = 9464, host: str = "127.0.0.1") -> tuple[str, int]:
        """Serve Prometheus metrics at ``http://host:port/metrics`` until shutdown.

        Values are read from the telemetry at scrape time (`pydotcompute.observability`).
        Connections are served concurrently, each within 5 s, and a blocked loop does not
        fail a scrape (the observability guide); to choose these, use
        ``pydotcompute.observability.serve_metrics``. ``port=0`` picks a free port.
        Serving again returns the address already served when ``host`` is the same and
        ``port`` is the same or 0; another address raises.
        Safe to call from any thread.

        Returns:
            The bound ``(host, port)``.

        Raises:
            BackendNotAvailableError: ``prometheus-client`` is not installed
                (``pip install "pydotcompute[observability]"``).
            InvalidConfigurationError: the address cannot be bound, or metrics are already
                served at another one.
            KernelStateError: the runtime was shut down (and not started again).
        """
        from ..observability.metrics import serve_metrics

        with self._metrics_lock:
            server = self._metrics
            if self._closed or server is False:
                raise KernelStateError(
                    "<runtime>", "SHUT DOWN", "serve metrics for", "await runtime.start() first"
                )
            if server is None:
                server = self._metrics = serve_metrics(self, port, host, loop=self._loop)
            elif server.requested[0] != host or port not in (0, server.address[1]):
                raise InvalidConfigurationError(
                    f"metrics are already served at {server.url}; asked for {host}:{port}. "
                    "One server per runtime: call serve_metrics with that address (or port=0)"
                )
            address: tuple[str, int] = server.address
            return address

    async def _stop_metrics(self, started: float, timeout: float) -> None:
        with self._metrics_lock:
            server, self._metrics = self._metrics, False
        if server:  # in a thread: a scrape in flight may wait for this loop
            try:  # what is left of shutdown's timeout (it closes live connections at once)
                left = min(max(0.0, float(timeout) - (time.monotonic() - started)), 10.0)
            except (TypeError, ValueError):
                left = 0.0
            await asyncio.to_thread(server.stop, left)

    def get_loop_info(self) -> dict[str, Any]:
        return _get_loop_info()

    def kernel_failed(self, kernel: RingKernel) -> None:
        """Record that ``kernel`` failed (its kernels call it: their ``on_failed``)."""
        self._failures.append((kernel.kernel_id, kernel.error))

    _on_kernel_failed = kernel_failed  # the older name

    # -- scopes -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def kernel_scope(
        self, kernel_id: str, kernel_func: KernelFunc | None = None, **kwargs: Any
    ) -> AsyncIterator[RingKernel]:
        """Launch and activate a kernel for the duration of an ``async with`` block."""
        kernel = await self.launch(kernel_id, kernel_func, **kwargs)
        await kernel.activate()
        try:
            yield kernel
        finally:
            if kernel.state is not KernelState.TERMINATED:
                await kernel.terminate()
            self._kernels.pop(kernel_id, None)


def _forward_target(kernel: RingKernel) -> RingKernel | None:
    return kernel.forwards_to


def _lost_with_actor(kernel: RingKernel) -> int:
    """What died with ``kernel``'s remote actor so far (a Ray actor lost): its drops of
    reason ``actor_lost``, counted, never handed back (0 on a tier without one)."""
    return (kernel.telemetry.drops_by_reason or {}).get("actor_lost", 0)


def _drop_figures(kernel: RingKernel) -> tuple[int, int]:
    """``(messages dropped, of which handed back)`` of ``kernel`` so far."""
    tel = kernel.telemetry
    return tel.messages_dropped, tel.drop_reasons().get("undelivered", 0)


def _unread(kernel: RingKernel) -> int:
    """How many replies wait in ``kernel``'s outbox (a tier with a reply buffer of its
    own counts that in ``unread_replies``)."""
    return kernel.unread_replies


def _pool_launch(
    kernel_id: str,
    tier: str,
    cls: type[RingKernel],
    opts: dict[str, Any],
    registered: dict[str, Any],
) -> tuple[type[RingKernel], dict[str, Any], dict[str, Any]]:
    """Apply the `replicas` option: the pool class of tier `tier` for more than one, the
    tier's own class for one (the option then removed from both option sets)."""
    from .pool import check_replicas, pool_class

    registered = dict(registered)
    value = opts.pop("replicas", None)
    from_decorator = registered.pop("replicas", 1)
    replicas = check_replicas(kernel_id, from_decorator if value is None else value)
    if replicas == 1:
        return cls, opts, registered
    opts["replicas"] = replicas
    return pool_class(kernel_id, tier, cls, replicas), opts, registered


_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(RingKernelConfig)) - {"extra"}
#: Ray actor options (resources and placement). ``RayRingKernelRuntime.launch`` hands them
#: to Ray (they are its ``RAY_ACTOR_OPTIONS``); an in-process launch accepts and ignores them,
#: so one ``@ring_kernel(num_cpus=...)`` declaration runs on both.
PLACEMENT_OPTIONS = frozenset(
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
#: Config fields for which None is a value (no limit), not "the default".
NONE_IS_A_VALUE = frozenset({"max_restarts", "restart_window"})
#: Launch options that set several config fields (``queue_size`` sets both queue sizes).
OPTION_ALIASES = {
    "queue_size": ("input_queue_size", "output_queue_size"),
    "backpressure": ("backpressure_strategy",),
}


def _build_config(
    kernel_id: str,
    config: RingKernelConfig | None,
    options: dict[str, Any],
    extra_allowed: frozenset[str] = frozenset(),
    *,
    tier: str | None = None,
) -> RingKernelConfig:
    """A config of our own for ``kernel_id``: ``config`` copied (or the defaults), with
    ``options`` applied (``tier``: see `_apply_options`)."""
    if config is None:
        config = RingKernelConfig(kernel_id=kernel_id)
    else:
        config = dataclasses.replace(config, kernel_id=kernel_id, extra=dict(config.extra))
    return _apply_options(kernel_id, config, options, extra_allowed, tier=tier)


def _apply_options(
    kernel_id: str,
    config: RingKernelConfig,
    options: dict[str, Any],
    extra_allowed: frozenset[str] = frozenset(),
    *,
    tier: str | None = None,
) -> RingKernelConfig:
    """Apply launch ``options`` to ``config`` in place (a config this module made).

    Ray placement options (`PLACEMENT_OPTIONS`) are skipped: they only mean something
    to a Ray runtime. Any other unknown option raises, listing the known ones and naming
    ``tier``, the tier the launch asked for (default: the ``tier`` option, else the
    config's; the config's own field is set only when that option's turn comes).
    """
    if not options:
        return config
    fields = _CONFIG_FIELDS
    explicit = {k for k in options if k in fields and options[k] is not None}
    for key, value in options.items():
        if key in OPTION_ALIASES:
            for target in OPTION_ALIASES[key]:
                if target not in explicit:
                    setattr(config, target, value)
        elif key in fields:
            if value is not None or key in NONE_IS_A_VALUE:
                setattr(config, key, value)
        elif key in extra_allowed:
            config.extra[key] = value
        elif key in PLACEMENT_OPTIONS:
            logger.debug("kernel %r runs in-process: Ray option %r ignored", kernel_id, key)
        else:
            asked = tier or canonical_tier(options.get("tier") or config.tier)
            known = fields | set(OPTION_ALIASES) | extra_allowed | {"replicas"}
            close = difflib.get_close_matches(key, sorted(known | PLACEMENT_OPTIONS), n=3)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise InvalidConfigurationError(
                f"unknown option {key!r} for kernel {kernel_id!r} on tier {asked!r}{hint}; "
                f"known: {sorted(known)}; Ray "
                f"placement options ({', '.join(sorted(PLACEMENT_OPTIONS))}) are accepted "
                "and ignored in-process"
            )
    return config
