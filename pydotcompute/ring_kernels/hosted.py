"""Tiers 2 and 3 inside the async runtime: ``runtime.launch(id, fn, tier="thread"|"process")``.

A hosted kernel keeps the tier-1 face — an asyncio inbox with priority bands and
backpressure, an asyncio outbox, correlation-matched ``send_and_receive``, ``connect`` — and
runs the actor elsewhere: a :class:`ThreadedRingKernel` (tier 2) or a
:class:`CythonRingKernel` child process (tier 3).

Design notes:
- Two tasks bridge the worlds. The *pump* moves messages from the asyncio inbox into the
  worker's (small) bridge queue in priority order, honouring deactivation; the *collector*
  moves replies from the worker's outbox into the asyncio outbox (or to a waiting
  ``send_and_receive`` caller, or onward to a connected kernel). Neither blocks the loop:
  the worker's queues call a waker in the worker's thread, which hands the wake-up to the
  loop with ``call_soon_threadsafe``; a slow poll (``_POLL_S``) is the safety net. The
  process tier skips that thread hop: the loop watches the reply doorbell and the child's
  exit itself (``_watch_replies``): one wake-up fewer per reply.
- The bridge queue is small (``bridge_queue_size``, default 64) so that priorities and
  deactivation act on almost everything still queued: what already crossed the bridge is
  the worker's to process.
- Terminate drains: the pump hands over what is queued, the worker stops gracefully, the
  collector drains the replies; leftovers on both sides are returned and counted. The pump
  counts a message as processed when it takes it; one it still holds when it is cancelled,
  and those the worker never took, stop counting as processed and are handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from ..exceptions import (
    KernelFailedError,
    KernelStateError,
    MessageRejectedError,
    MessageSerializationError,
    QueueClosedError,
)
from .lifecycle import KernelState, RingKernel

__all__ = ("ProcessHostedKernel", "ThreadHostedKernel")

logger = logging.getLogger("pydotcompute")
_POLL_S = 0.05


class _HostedKernel(RingKernel):
    """Shared bridge logic; subclasses build the worker in :meth:`_make_worker`."""

    EXTRA_OPTIONS = frozenset({"bridge_queue_size"})

    __slots__ = (
        "_collector",
        "_held",
        "_held_counted",
        "_pump",
        "_readable",
        "_unwatch",
        "_worker",
        "_writable",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._worker: Any = None
        # the message the pump took from the inbox and has not handed to the worker yet
        self._held: Any = None
        self._held_counted = False
        self._pump: asyncio.Task[None] | None = None
        self._collector: asyncio.Task[None] | None = None
        self._readable: asyncio.Event | None = None
        self._writable: asyncio.Event | None = None
        self._unwatch: Any = None  # undoes ``_watch_replies``

    # -- hooks --------------------------------------------------------------------------

    def _make_worker(self, bridge: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _start_worker(self) -> None:
        self._worker.start()

    def _stop_worker(self, timeout: float) -> bool:
        return bool(self._worker.stop(timeout))

    def _watch_replies(self, loop: asyncio.AbstractEventLoop, readable: asyncio.Event) -> Any:
        """Have ``loop`` itself set ``readable`` when a reply may be ready, and return a
        function that undoes it; None when the worker can only call a waker from a thread
        of its own (the default)."""
        return None

    def _stop_watching(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    # -- lifecycle ----------------------------------------------------------------------

    async def launch(self) -> None:
        await super().launch()
        bridge = int(self.config.extra.get("bridge_queue_size", 64))
        self._worker = self._make_worker(bridge)

    async def activate(self) -> None:
        self._check("activate")
        loop = asyncio.get_running_loop()
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        readable, writable = self._readable, self._writable

        def wake_readable() -> None:
            with contextlib.suppress(RuntimeError):  # loop closed during teardown
                loop.call_soon_threadsafe(readable.set)

        def wake_writable() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(writable.set)

        worker = self._worker
        outbox_q = getattr(worker, "outbox", None)
        inbox_q = getattr(worker, "inbox", None)
        if inbox_q is not None and hasattr(inbox_q, "add_waker"):
            with contextlib.suppress(TypeError):
                inbox_q.add_waker(wake_writable, when="writable")
        await asyncio.to_thread(self._start_worker)
        self._unwatch = self._watch_replies(loop, readable)
        if self._unwatch is None and outbox_q is not None and hasattr(outbox_q, "add_waker"):
            outbox_q.add_waker(wake_readable)
        self._state = KernelState.ACTIVE
        name = f"pydotcompute:{self.kernel_id}"
        for attr, make, label in (
            ("_pump", self._run_pump, "pump"),
            ("_collector", self._run_collector, "collect"),
        ):
            coro = make()
            try:
                setattr(self, attr, loop.create_task(coro, name=f"{name}:{label}"))
            except BaseException as exc:  # a task factory refused; the worker runs already
                coro.close()
                self._fail(exc)  # FAILED: the pump (if any) is cancelled, terminate() stops it
                raise

    async def _run_pump(self) -> None:
        inbox = self._inbox
        assert inbox is not None
        assert self._writable is not None
        worker = self._worker
        writable = self._writable
        while True:
            if self._gate is not None:
                await asyncio.shield(self._gate)
            try:
                msg = await inbox.get()
            except QueueClosedError:
                return
            self._held = msg
            if self._gate is not None:  # deactivated while we waited: hold it
                await asyncio.shield(self._gate)
            if self._tel_on:
                self.telemetry.messages_processed += 1
                self._held_counted = True
            while True:
                try:
                    ok = worker.send_nowait(msg)
                except MessageSerializationError as exc:
                    # this one message can never cross (too large for the ring, no
                    # MessagePack form): its caller gets the error, the pump goes on
                    self._held = None
                    self._held_counted = False
                    self._drop_unsendable(msg, exc)
                    break
                except (KernelFailedError, KernelStateError):
                    # the worker failed (the collector reports it) or stopped: hand it back
                    lost = self._take_held()
                    self.undelivered.extend(lost)
                    self.telemetry.record_drop(len(lost))
                    return
                if ok:
                    break
                writable.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(writable.wait(), _POLL_S)
            self._held = None
            self._held_counted = False

    def _drop_unsendable(self, msg: Any, exc: MessageSerializationError) -> None:
        """A message the worker refused to encode. It counts as processed (taken and
        answered, with an error: accounting stays exact) and as an error; its waiting
        caller gets ``exc``, and without one it is logged."""
        self.telemetry.record_error(exc)
        key = getattr(msg, "message_id", None) if self._waiters else None
        fut = self._waiters.pop(key, None) if key is not None else None
        if fut is not None:
            if not fut.done():
                fut.set_exception(exc)
            return
        logger.error("kernel %r: a message could not reach its worker: %s", self.kernel_id, exc)

    def _take_held(self) -> list[Any]:
        """The message the pump took but never handed over (``[]`` if none): it was not
        processed, so it stops counting as processed."""
        msg, self._held = self._held, None
        if msg is None:
            return []
        if self._held_counted:
            self._held_counted = False
            self.telemetry.messages_processed -= 1
        return [msg]

    def _take_unprocessed(self) -> list[Any]:
        """What the worker never took (a stop that timed out, a failure): counted as
        processed when the pump handed it over, so that count is taken back."""
        unprocessed = getattr(self._worker, "unprocessed", None)
        lost: list[Any] = list(unprocessed()) if unprocessed is not None else []
        if lost and self._tel_on:
            self.telemetry.messages_processed -= len(lost)
        return lost

    async def _run_collector(self) -> None:
        worker = self._worker
        readable = self._readable
        assert readable is not None
        while True:
            try:
                reply = worker.receive_nowait()
            except KernelFailedError as exc:
                if not self._stopping:
                    self._fail(exc.error if exc.error is not None else exc)
                return
            except KernelStateError:
                return  # stopped and drained
            except MessageRejectedError as exc:
                # the child could not decode one message and keeps serving: its caller
                # (if one waits) gets the error; otherwise it is counted as an error and logged
                self._reject(exc)
                continue
            if reply is None:
                readable.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(readable.wait(), _POLL_S)
                continue
            try:
                await self._deliver(reply)
            except Exception as exc:
                # a reply that can go nowhere (a plain value for a serializing outbox, the
                # wrong type for a connected kernel): the kernel fails, as a tier-1 actor
                # whose ctx.send raised would, instead of this task dying unnoticed
                self.telemetry.record_error(exc)
                if not self._stopping:
                    self._fail(exc)
                    return
                # terminating: keep collecting the rest; this one is counted as dropped
                self.error = exc
                logger.error("kernel %r: a reply failed while terminating: %r", self.kernel_id, exc)
                if self._outbox is not None:
                    self._outbox.count_dropped(1)
                self.telemetry.record_drop()

    def _reject(self, exc: MessageRejectedError) -> None:
        fut = self._waiters.pop(exc.correlation_id, None) if self._waiters else None
        if fut is not None:
            if not fut.done():
                fut.set_exception(exc)
            return
        self.telemetry.record_error(exc)
        logger.error("kernel %r: %s", self.kernel_id, exc)

    async def _deliver(self, reply: Any) -> None:
        """Hand a worker's reply to its ``send_and_receive`` caller, the connected kernel or
        the outbox. A plain value (an untyped actor's side output) has no correlation id:
        it goes on like any uncorrelated reply, as on tier 1."""
        if self._tel_on:
            self.telemetry.messages_sent += 1
        waiters = self._waiters
        if waiters:
            fut = waiters.pop(getattr(reply, "correlation_id", None), None)
            if fut is not None:
                if not fut.done():
                    fut.set_result(reply)
                return
        target = self._forward
        if target is not None:
            await target._accept(reply, None)
            return
        assert self._outbox is not None
        await self._outbox.put(reply)

    @property
    def is_idle(self) -> bool:
        """Idle when nothing is queued on either side of the bridge and the worker says so.

        Workers that cannot tell (a child process) are never reported idle: wait for a
        known number of replies instead.
        """
        if self._state is not KernelState.ACTIVE:
            return True
        inbox = self._inbox
        if inbox is None or len(inbox) or self._pending_replies():
            return False
        worker_idle = getattr(self._worker, "is_idle", None)
        return bool(worker_idle) if worker_idle is not None else False

    def _pending_replies(self) -> bool:
        outbox_q = getattr(self._worker, "outbox", None)
        try:
            return bool(outbox_q is not None and len(outbox_q))
        except TypeError:
            return False

    @property
    def _tel_on(self) -> bool:
        return self._timed

    async def terminate(self, timeout: float | None = None) -> list[Any]:
        """Drain the asyncio inbox into the worker, stop it gracefully, collect replies."""
        self._check("terminate")
        if timeout is None:
            timeout = self.config.drain_timeout
        self._state = KernelState.TERMINATING
        self._stopping = True
        if self._inbox is not None:
            self._inbox.close(QueueClosedError(f"kernel {self.kernel_id!r} is terminating"))
        self._open_gate()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._pump is not None and not self._pump.done():
            _, pending = await asyncio.wait({self._pump}, timeout=timeout)
            if pending:
                self._pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._pump
        if self._worker is not None:
            remaining = max(0.1, deadline - loop.time())
            await asyncio.to_thread(self._stop_worker, remaining)
        if self._collector is not None and not self._collector.done():
            _, pending = await asyncio.wait(
                {self._collector}, timeout=max(0.5, deadline - loop.time())
            )
            if pending:
                self._collector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._collector
        self._stop_watching()
        self._watch_late_replies()
        # oldest first: what crossed the bridge, then what the pump still held
        left = self._take_unprocessed() if self._worker is not None else []
        left += self._take_held()
        return self._finish_termination(left)

    def _watch_late_replies(self) -> None:
        """Count, as dropped and with a warning, replies the worker sends once the collector
        has stopped (a thread still busy when the grace period ran out finishes its message,
        but its reply has nowhere to go). The outbox's waker runs in the worker's thread."""
        outbox_q: Any = getattr(self._worker, "outbox", None)
        if not (hasattr(outbox_q, "add_waker") and hasattr(outbox_q, "get_nowait")):
            return  # the process tier: a child outlives no stop (it is killed)
        telemetry, kernel_id = self.telemetry, self.kernel_id

        def count_late() -> None:
            n = 0
            with contextlib.suppress(QueueClosedError):  # shut down and drained: no more
                while outbox_q.get_nowait() is not None:
                    n += 1
            if n:
                telemetry.record_drop(n)
                logger.warning(
                    "kernel %r: %d repl%s sent after terminate stopped collecting; dropped",
                    kernel_id,
                    n,
                    "y" if n == 1 else "ies",
                )

        outbox_q.add_waker(count_late)
        count_late()  # any that arrived between the collector's end and now

    def _fail(self, exc: BaseException) -> None:
        super()._fail(exc)
        self._stop_watching()
        pump = self._pump
        if pump is not None and not pump.done():
            pump.cancel()
        lost = self._take_unprocessed() if self._worker is not None else []
        lost += self._take_held()
        if lost:
            self.undelivered.extend(lost)
            self.telemetry.record_drop(len(lost))


class ThreadHostedKernel(_HostedKernel):
    """Tier 2 in the runtime: the actor is a plain function running in its own thread.

    The actor receives a :class:`ThreadedKernelContext` (blocking ``receive``/``send``).
    Extra options: ``bridge_queue_size``, ``thread_name``.
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "thread_name"})
    __slots__ = ()

    def _make_worker(self, bridge: int) -> Any:
        from .threaded_kernel import ThreadedKernelConfig, ThreadedRingKernel

        cfg = ThreadedKernelConfig(
            self.kernel_id,
            input_queue_size=bridge,
            output_queue_size=max(bridge, 1024),
            thread_name=self.config.extra.get("thread_name"),
        )
        return ThreadedRingKernel(
            self.kernel_id,
            self._func,  # type: ignore[arg-type]
            config=cfg,  # type: ignore[arg-type]
            input_type=self.input_type,
            output_type=self.output_type,
        )


class ProcessHostedKernel(_HostedKernel):
    """Tier 3 in the runtime: the actor runs in a child process over shared-memory rings.

    The actor function must be importable by the child (a module-level function).
    Extra options: ``bridge_queue_size``, ``ring_bytes``, ``spin_us`` (how long the child
    polls for its next message before parking; default ``HOSTED_SPIN_US``).
    """

    EXTRA_OPTIONS = frozenset({"bridge_queue_size", "ring_bytes", "spin_us"})
    # The child spins this long for its next message before parking (direct use: 50 us).
    # Hosted, the next message comes a loop round trip later (30-50 us here): with 50 us
    # the child often just missed it, parked, and each message then paid a wake-up
    # (round trips 80-110 us instead of ~50). Adaptive spinning still shrinks it when idle.
    HOSTED_SPIN_US = 200.0
    __slots__ = ()

    def _watch_replies(self, loop: asyncio.AbstractEventLoop, readable: asyncio.Event) -> Any:
        """The loop watches the outbox doorbell and the child's exit itself: a reply wakes
        the collector in one hop, not through the worker's watcher thread and a
        ``call_soon_threadsafe``. It watches duplicates of the two descriptors, so the
        worker closing its own when it stops (in another thread) never pulls a
        descriptor out from under the loop."""
        from ._process_actor import drain_bell

        worker = self._worker
        bell, sentinel = (os.dup(fd) for fd in worker.wait_handles())

        def on_bell() -> None:
            drain_bell(bell)
            readable.set()

        def on_exit() -> None:
            loop.remove_reader(sentinel)  # it stays readable once the child has gone
            # record the exit (reaping it may wait on the watcher thread's reap: not on the
            # loop), then wake the collector, which reports it
            done = loop.run_in_executor(None, worker._child_gone, True)
            done.add_done_callback(lambda _: readable.set())

        try:
            loop.add_reader(bell, on_bell)
            loop.add_reader(sentinel, on_exit)
        except NotImplementedError:  # a loop without add_reader (Windows' proactor)
            os.close(bell)
            os.close(sentinel)
            return None
        worker.arm_receive()  # the child rings the doorbell on every reply

        def unwatch() -> None:
            for fd in (bell, sentinel):
                loop.remove_reader(fd)
                os.close(fd)

        return unwatch

    def _make_worker(self, bridge: int) -> Any:
        from .cython_kernel import CythonKernelConfig, CythonRingKernel

        kwargs: dict[str, Any] = {"spin_us": self.config.extra.get("spin_us", self.HOSTED_SPIN_US)}
        ring_bytes = self.config.extra.get("ring_bytes")
        if ring_bytes is not None:
            kwargs["ring_bytes"] = ring_bytes
        cfg = CythonKernelConfig(self.kernel_id, input_queue_size=bridge, **kwargs)
        worker_kwargs: dict[str, Any] = {"config": cfg}
        try:
            return CythonRingKernel(
                self.kernel_id,
                self._func,
                input_type=self.input_type,  # type: ignore[arg-type]
                output_type=self.output_type,
                **worker_kwargs,
            )
        except TypeError:
            return CythonRingKernel(self.kernel_id, self._func, **worker_kwargs)  # type: ignore[arg-type]
