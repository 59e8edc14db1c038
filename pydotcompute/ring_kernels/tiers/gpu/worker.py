"""The GPU tier's `TierWorker`: one persistent CUDA kernel, its mapped rings and the
host task that watches them.

The runtime hosts it as it hosts a thread or a child process: `GPURingKernel` is the
bridge (`HostedKernel`) with the GPU's device steps added, so reply delivery,
correlation, forwarding, drop accounting and hand-back are the bridge's. This module is
mechanism only: start the device kernel, publish requests into the inbox ring, take
replies from the outbox ring, flip the control block's words and read its counters.

Design notes:
- No host thread: the device writes into mapped memory, so somebody has to look. One
  asyncio task per actor (the *monitor*) does, on the loop that launched it: it spins
  (``sleep(0)``) while messages are in flight, backs off to millisecond sleeps, parks on a
  future when nothing is in flight (woken by `offer`, or every 0.25 s for the watchdog),
  and tells the bridge through `watch`'s callback, on the loop itself, that replies are
  ready. Once a burst: the callback fires when replies wait and the last poll found none
  (the bridge polls until empty, or hands over to its collector), so a reply the bridge
  cannot deliver yet (a full outbox) costs no busy loop.
- The monitor is also the watchdog: a kernel that exits by itself, faults, or makes no
  progress for ``watchdog_timeout`` seconds while messages are pending is reported as
  this worker's `failure` (`poll_reply` raises `KernelFailedError` after the replies the
  device published first). Before `activate` nobody polls, so a failure is also handed
  to the `on_failure` callback.
- `start` and `stop` block (the bridge runs them in a worker thread) and write the
  control block from that thread while the loop may publish: the doorbell word is
  composed under the rings' lock (`HostRings`), the only place two host threads write.
  Replies are taken under this worker's lock, since `stop` takes the last ones itself
  before it gives the memory back. Every CUDA call (asking whether the kernel ended,
  copying the state back, releasing memory) is made on the loop's thread, where the actor
  was started (`_device_call`: a worker thread may have no CUDA context current, and an
  error there would read as "still running"); the ring words are plain mapped memory.
- A stopped kernel's memory goes back to the slab at once (`DeviceActor.release`), so
  `stop` first copies out what is still readable: the replies, the requests the kernel
  never took, the latencies, the final state and the control block (counters stay
  readable through `word`). A kernel that does not acknowledge TERMINATE keeps its
  memory (it may still write it) and `hung` says so; a later `stop` tries again.
- Device edges (``edge.py``): a producer routed into a ``device-ring`` edge writes its
  replies there from its kernel, so the bridge sees none of them; the consumer's kernel
  polls the edge beside its inbox. Route changes are acknowledged by the kernel
  (``EDGE_ROUTE_ACK``) and waited for on the calling thread (microseconds: the kernel reads
  the word between batches). The consumer's monitor spins while its edge holds records,
  and the producer's wakes it when its kernel makes progress.
- A message the handler rejects (a non-zero status) reaches the bridge as a
  `HandlerRejectedError`: a `MessageRejectedError` (the bridge counts it as dropped,
  reason ``rejected``, and tells its caller) that is also a `KernelError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ....exceptions import (
    CUDAError,
    InvalidConfigurationError,
    KernelCompilationError,
    KernelError,
    KernelFailedError,
    KernelStateError,
    MessageRejectedError,
    TypeValidationError,
)
from ...states import KernelState
from ...telemetry import LatencyRecorder, PyLatencyRecorder
from ..contract import Capabilities, TierWorker
from . import layout as L
from .edge import DeviceEdge
from .host import HostRings, Liveness
from .prepare import compile_within
from .spec import GPUKernelOptions, normalize_state

if TYPE_CHECKING:
    from .resources import DeviceActor

__all__ = ("GPUWorker", "HandlerRejectedError")

logger = logging.getLogger("pydotcompute")

Latencies = tuple[int, int, int, int, list[tuple[int, int]]]
#: Longest a worker thread waits for the loop to make a CUDA call for it before making it
#: itself (a loop that does not answer is stuck or gone).
_LOOP_CALL_S = 10.0


class HandlerRejectedError(MessageRejectedError, KernelError):
    """A GPU handler returned a non-zero status for one message: no reply was published.

    The caller of that message's ``send_and_receive`` gets this error; the kernel keeps
    running. ``correlation_id`` is the rejected message's id, ``status`` the handler's
    return value.
    """

    #: The reason the bridge counts the message's drop under (`telemetry.drop_reasons()`).
    drop_reason = "rejected"

    def __init__(self, kernel_id: str, correlation_id: object, status: int) -> None:
        super().__init__(kernel_id, correlation_id, f"the handler returned status {status}")
        self.status = status
        self.args = (
            f"GPU kernel {kernel_id!r}: the handler rejected message {correlation_id} "
            f"with status {status}",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.kernel_id, self.correlation_id, self.status))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class GPUWorker(TierWorker):
    """One GPU actor's device side, behind the tier contract.

    Built by `GPURingKernel` at launch; `boot` compiles the handler and starts the
    persistent kernel (it holds messages until `start` sets ``ACTIVE``).

    Args:
        kernel_id: The kernel's name.
        handler: The device handler ``handler(inp, out, state) -> int`` (unused with the
            ``cuda_source`` option).
        options: The tier options, checked (`check_spec`).
        input_type, output_type: Fixed-layout message classes (their records are slots).
        in_dtype, out_dtype: Their record layouts.
        ring_size: Slots per device ring.
        block_size: Threads of a cooperative block.
        room: How many published requests the kernel may hold not yet taken (the
            bridge's width; at most ``ring_size``).
    """

    #: The handler is a device function the tier checks itself (`check_spec`); one
    #: persistent kernel is one actor (no pool, no restart); the bridge's room can be set
    #: up to the ring; the device times each message; device-ring edges both ways.
    CAPABILITIES = Capabilities(
        actor_kind=None,
        resize=True,
        telemetry_refresh=True,
        edges_out=frozenset({"device-ring"}),
        edges_in=frozenset({"device-ring"}),
    )

    def __init__(
        self,
        kernel_id: str,
        handler: Any,
        *,
        options: GPUKernelOptions,
        input_type: Any,
        output_type: Any,
        in_dtype: np.dtype[Any],
        out_dtype: np.dtype[Any],
        ring_size: int,
        block_size: int,
        room: int,
    ) -> None:
        self._kernel_id = kernel_id
        self._handler = handler
        self._opts = options
        self._in_t = input_type
        self._out_t = output_type
        self._in_dtype = in_dtype
        self._out_dtype = out_dtype
        self._ring_size = ring_size
        self._block_size = block_size
        self._room = max(1, min(room, ring_size))
        self._dev: DeviceActor | None = None
        self._rings: HostRings | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._monitor: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._reader: Callable[[], None] | None = None
        self._writable: Callable[[], None] | None = None
        self._on_failure: Callable[[BaseException], None] | None = None
        self._armed = True  # the next reply wakes the reader (the last poll found none)
        self._want_room = False  # an offer was refused: wake the writer when room frees
        self._head_seen = 0
        self._live = Liveness(0.0)
        self._last_health = 0.0
        self._lock = threading.Lock()  # taking replies (the loop, and the last take in stop)
        self._stop_lock = threading.Lock()
        self._pending: deque[Any] = deque()  # taken from the ring, not yet polled
        self._leftovers: list[Any] = []  # requests a stopped kernel never took
        self._taken = 0  # replies taken from the outbox ring
        self._lat_seen = 0
        self._drops_seen = 0
        self._edge_rejected_seen = 0
        self._recorder: PyLatencyRecorder = LatencyRecorder()
        self._failure: BaseException | None = None
        self._failure_told = False
        self._started = False  # `start` set ACTIVE (activate)
        self._stopping = False
        self._stopped = False
        self._released = False
        self._hung: KernelStateError | None = None
        self._ctl_final: np.ndarray[Any, Any] | None = None
        self.final_state: np.ndarray[Any, Any] | None = None
        self._route = 0  # the EDGE_ROUTE bits the host asked for
        self._edge_in: DeviceEdge | None = None  # the device edge this kernel reads
        self._edge_out: DeviceEdge | None = None  # the device edge it writes into now

    def __repr__(self) -> str:
        state = "failed" if self._failure else "stopped" if self._stopped else "running"
        return f"<GPUWorker {self._kernel_id!r} {state}>"

    # -- what it is -------------------------------------------------------------------------

    @property
    def flavour(self) -> str | None:
        """``simulator``, ``numba`` or ``cuda_c`` once booted (None before)."""
        return None if self._dev is None else self._dev.flavour

    @property
    def device(self) -> DeviceActor | None:
        """The device actor (memory, stream, persistent kernel); None before `boot`."""
        return self._dev

    @property
    def rings(self) -> HostRings | None:
        """The host views of the rings and control block while the kernel holds its
        memory; None before `boot` and once `stop` gave the memory back."""
        return None if self._released else self._rings

    @property
    def hung(self) -> KernelStateError | None:
        """Why the last `stop` could not end the kernel (it did not acknowledge
        TERMINATE within ``terminate_timeout``), or None."""
        return self._hung

    @property
    def input_type(self) -> Any:
        """The input message class (its records are the inbox's slots)."""
        return self._in_t

    @property
    def in_dtype(self) -> np.dtype[Any]:
        """The input record layout."""
        return self._in_dtype

    @property
    def device_id(self) -> int:
        """The CUDA device the kernel runs on."""
        return self._opts.device_id

    @property
    def edge_source(self) -> str | None:
        """The id of the kernel whose device edge this one reads (None: none, or closed)."""
        edge = self._edge_in
        return None if edge is None or edge.closed else edge.source_id

    @property
    def replies_taken(self) -> int:
        """Replies taken from the outbox ring so far (rejections included)."""
        return self._taken

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def word(self, index: int) -> int:
        """One control-block word (a device counter or flag): live while the kernel holds
        its memory, else as `stop` copied it (0 before `boot`)."""
        final = self._ctl_final
        if final is not None:
            return int(final[index])
        r = self._rings
        return 0 if r is None else int(r.ctl[index])

    @property
    def pending_input(self) -> int:
        """Requests published into the inbox ring and not yet taken by the kernel."""
        r = self._rings
        return 0 if r is None or self._released else r.in_flight()

    @property
    def is_idle(self) -> bool:
        r = self._rings
        if r is None or self._released:
            return True
        return not self._pending and not r.in_flight() and not r.ready() and not self._edge_depth()

    def _edge_depth(self) -> int:
        edge = self._edge_in
        return 0 if edge is None else edge.depth

    def snapshot_state(self) -> np.ndarray[Any, Any] | None:
        """A host copy of the actor's state: live while the kernel runs, the final state
        once stopped; None when there is neither."""
        if self._released or self._dev is None:
            return None if self.final_state is None else self.final_state.copy()
        return self._dev.read_state()

    # -- lifecycle --------------------------------------------------------------------------

    async def boot(self, on_failure: Callable[[BaseException], None]) -> None:
        """Allocate the rings and state, compile the handler and start the persistent
        kernel (which holds messages until `start`); then watch it from this loop.
        ``on_failure`` hears of a failure the monitor finds (on the loop).

        Raises:
            BackendNotAvailableError: no GPU (and the simulator is off), or no CuPy/NVRTC
                for a CUDA C handler.
            KernelCompilationError: the handler does not compile (in time).
            CUDAError: the kernel did not start within ``terminate_timeout``.
        """
        from .resources import DeviceActor

        opts = self._opts
        dev = DeviceActor(
            name=f"pydotcompute-gpu:{self._kernel_id}",
            handler=self._handler,
            cuda_source=opts.cuda_source,
            handler_name=opts.handler_name,
            in_name=self._in_t.__name__,
            out_name=self._out_t.__name__,
            in_dtype=self._in_dtype,
            out_dtype=self._out_dtype,
            state=normalize_state(self._kernel_id, opts.state),
            cooperative=opts.cooperative,
            block_size=self._block_size,
            ring_in=self._ring_size,
            ring_out=self._ring_size,
            max_backoff_ns=opts.max_backoff_ns,
            drop_when_full=opts.outbox_full == "drop",
            device_id=opts.device_id,
        )
        try:
            if dev.flavour == "simulator":
                dev.compile()
            elif not await compile_within(dev, opts.compile_timeout):
                raise KernelCompilationError(
                    f"GPU kernel {self._kernel_id!r}: compiling and loading its handler took "
                    f"longer than compile_timeout={opts.compile_timeout}s; a first compile "
                    "takes seconds: check that NVVM/NVRTC are found (CUDA_HOME) and that "
                    "nothing holds the GPU, or raise compile_timeout"
                )
            dev.start()
        except BaseException:
            dev.release()  # deferred while a compile thread still uses it
            raise
        rings = HostRings(dev.host)
        try:
            await self._await_started(dev, rings)
        except BaseException:
            rings.set_word(L.TERMINATE, 1)
            dev.join(1.0)
            dev.release()  # kept alive instead if the kernel may still run
            raise
        self._dev, self._rings = dev, rings
        self._live = Liveness(time.monotonic())
        self._on_failure = on_failure
        loop = asyncio.get_running_loop()
        self._loop, self._loop_thread = loop, threading.get_ident()
        self._monitor = loop.create_task(
            self._watch_device(), name=f"pydotcompute:{self._kernel_id}:device"
        )

    async def _await_started(self, dev: DeviceActor, rings: HostRings) -> None:
        timeout = self._opts.terminate_timeout
        deadline = time.monotonic() + timeout
        delay = 0.0
        while rings.word(L.STARTED) != 1:
            if dev.finished():
                err = dev.failure() or RuntimeError("the persistent kernel exited on its own")
                raise KernelFailedError(self._kernel_id, err) from err
            if time.monotonic() > deadline:
                raise CUDAError(
                    f"GPU ring kernel {self._kernel_id!r} did not start within {timeout}s: "
                    "the GPU may be full of other persistent kernels (each GPU actor holds "
                    "one block) or busy; terminate some, or raise terminate_timeout"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)

    def _ack_problem(self, index: int, value: int, operation: str, deadline: float) -> Any:
        """Whether ``ctl[index] == value`` yet: True, None (not yet), or the failure that
        ended the wait (the kernel exited, or did not acknowledge in time)."""
        dev, r = self._dev, self._rings
        if dev is None or r is None or self._released:
            return KernelStateError(self._kernel_id, KernelState.TERMINATED, operation)
        if r.word(index) == value:
            return True
        if self._failure is not None:
            return self._failure
        exited = self._device_call(self._exit_reason)
        if exited is not None:
            return exited
        if time.monotonic() > deadline:
            tt = self._opts.terminate_timeout
            return TimeoutError(f"the GPU kernel did not acknowledge {operation} within {tt}s")
        return None

    def _set_active_word(self, active: bool) -> None:
        r = self._rings
        if r is not None and not self._released:
            r.set_word(L.ACTIVE, int(active))
            self._kick_any_thread()

    def _acknowledged(self, got: Any) -> None:
        """Return when ``got`` (from `_ack_problem`) says the kernel acknowledged; else
        raise: a state error as it is, a failure (noted) as `KernelFailedError`."""
        if got is True:
            return
        if isinstance(got, KernelStateError):
            raise got
        self._note_failure(got)
        raise KernelFailedError(self._kernel_id, got) from got

    def start(self) -> None:
        """Let the kernel take messages (``ACTIVE``) and wait for its acknowledgement;
        blocking (the runtime runs it in a worker thread).

        Raises:
            KernelFailedError: the kernel exited, or did not acknowledge within
                ``terminate_timeout`` (it is then this worker's `failure`).
        """
        self._set_active_word(True)
        deadline = time.monotonic() + self._opts.terminate_timeout
        delay = 0.0
        while (got := self._ack_problem(L.ACTIVE_ACK, 1, "activate", deadline)) is None:
            time.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)
        self._acknowledged(got)
        self._started = True

    async def set_active(self, active: bool, operation: str) -> None:
        """The device step of deactivate/reactivate: flip ``ACTIVE`` and wait, on the
        loop, for the kernel's acknowledgement (once deactivated it takes no message;
        those already in its inbox ring stay there).

        Raises:
            KernelFailedError: as `start`.
        """
        self._set_active_word(active)
        deadline = time.monotonic() + self._opts.terminate_timeout
        delay = 0.0
        value = int(active)
        while (got := self._ack_problem(L.ACTIVE_ACK, value, operation, deadline)) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)
        self._acknowledged(got)

    def resume(self) -> None:
        """Let a deactivated kernel take messages again without waiting for it (a
        terminate drains what it was given)."""
        if self._started and not self._stopping and self._failure is None:
            self._set_active_word(True)

    def abort(self) -> None:
        """Tell a live kernel to leave its loop (the kernel failed); returns at once."""
        r = self._rings
        if r is not None and not self._released:
            r.set_word(L.TERMINATE, 1)

    def stop(self, timeout: float) -> bool:
        """Drain, then end the kernel; blocking. An active (or deactivated) kernel first
        takes what is in its inbox ring, for up to ``timeout`` seconds; then TERMINATE is
        set and the kernel's acknowledgement awaited (``terminate_timeout``; after a
        failure no longer than ``timeout``). What is still readable is copied out and the
        memory given back. A kernel that does not acknowledge keeps its memory and is
        reported by `hung`; calling `stop` again tries again.

        Returns:
            True when the kernel took everything it was given and ended.
        """
        with self._stop_lock:
            self._stopping = True
            dev, r = self._dev, self._rings
            if dev is None or r is None or self._released:
                self._stopped = True
                self._kick_any_thread()
                return True
            drained = True
            if self._started and self._failure is None and self._hung is None:
                r.set_word(L.ACTIVE, 1)  # a deactivated kernel drains too
                self._kick_any_thread()
                drained = self._wait(
                    lambda: (
                        (not r.in_flight() and not self._edge_depth())
                        or self._failure is not None
                        or self._device_call(dev.finished)
                    ),
                    timeout,
                )
            r.set_word(L.TERMINATE, 1)
            tt = self._opts.terminate_timeout
            ended = self._wait(
                lambda: self._device_call(dev.finished),
                tt if self._failure is None else min(tt, max(timeout, 0.1)),
            )
            if ended:
                failure = self._device_call(dev.failure)
                if failure is not None and self._failure is None:
                    self._failure = failure
                self._hung = None
                self._finish_device(dev, r)
                self._close_edge_in()
            else:
                self._hung = KernelStateError(
                    self._kernel_id,
                    KernelState.TERMINATING,
                    "terminate",
                    f"the GPU kernel did not acknowledge termination within {tt}s "
                    f"(processed {r.word(L.PROCESSED)}, heartbeat {r.word(L.HEARTBEAT)}); "
                    "its handler may be stuck. Its memory is kept alive, and the kernel keeps "
                    "its GPU block until it returns or the process exits",
                )
                self._device_call(dev.release)  # kept alive: the kernel may still run
            self._stopped = True
        self._kick_any_thread()  # the monitor tells the reader, then ends
        return ended and drained

    @staticmethod
    def _wait(done: Callable[[], bool], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        delay = 0.0
        while not done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)
        return True

    def _finish_device(self, dev: DeviceActor, r: HostRings) -> None:
        """The kernel ended: copy out what stays readable, then give the memory back.
        (``_lock`` is never held across a `_device_call`: the loop may wait for it.)"""
        final = self._device_call(dev.read_state)
        with self._lock:
            n = r.ready()
            if n:
                self._pending.extend(self._take(r, n))
            left = r.unconsumed()
            if len(left):
                self._leftovers.extend(self._in_t.from_records(left))
            self._fold_latencies(r)
            self._ctl_final = r.ctl.copy()
            self.final_state = final
            self._released = True
        self._device_call(dev.release)

    def _exit_reason(self) -> BaseException | None:
        """Why the kernel ended (its fault, or that it exited by itself), or None while it
        runs. Makes CUDA calls: on the loop's thread (`_device_call`)."""
        dev = self._dev
        if dev is None or not dev.finished():
            return None
        return dev.failure() or RuntimeError("the persistent kernel exited on its own")

    def _device_call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` (a CUDA call) made on the loop's thread: at once there, else handed to
        the loop and waited for (the loop is free: `start` and `stop` run in a worker
        thread the loop awaits). A loop that is gone, or does not answer within
        `_LOOP_CALL_S`, leaves the call to this thread."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            return fn()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the waiting thread, which raises it
                done.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed
            return fn()
        try:
            return done.result(_LOOP_CALL_S)
        except concurrent.futures.TimeoutError:
            if done.done():
                raise  # ``fn``'s own error
            return fn()  # the loop does not answer

    # -- messages in ----------------------------------------------------------------------

    def _free(self, r: HostRings) -> int:
        return min(r.room(), self._room - r.in_flight())

    def _check_open(self) -> HostRings:
        if self._failure is not None:
            err = KernelFailedError(self._kernel_id, self._failure)
            raise err from self._failure
        r = self._rings
        if r is None or self._stopping or self._released:
            raise KernelStateError(
                self._kernel_id, KernelState.TERMINATING, "send to", "it is stopping"
            )
        return r

    def offer(self, msg: Any) -> bool:
        r = self._check_open()
        if self._free(r) <= 0:
            self._want_room = True
            return False
        r.publish(self._in_t.to_records((msg,)))
        self._kick()
        return True

    def offer_many(self, msgs: list[Any]) -> int:
        """Publish the prefix of ``msgs`` the ring has room for, with one tail store."""
        r = self._check_open()
        k = min(self._free(r), len(msgs))
        if k < len(msgs):
            self._want_room = True
        if k <= 0:
            return 0
        try:
            recs = self._in_t.to_records(msgs[:k])
        except Exception:  # one does not convert: one by one, so the prefix stops there
            return super().offer_many(msgs[:k])
        r.publish(recs)
        self._kick()
        return k

    def offer_records(self, records: np.ndarray[Any, Any]) -> int:
        """Publish the prefix of ``records`` (``input_type.dtype``) the ring has room for;
        returns its length (0: full)."""
        r = self._check_open()
        k = min(self._free(r), len(records))
        if k <= 0:
            return 0
        r.publish(records[:k])
        self._kick()
        return k

    def set_room(self, n: int) -> bool:
        """Let the kernel hold up to ``n`` published requests not yet taken; False when
        the inbox ring has fewer slots."""
        if type(n) is not int or not 1 <= n <= self._ring_size:
            return False
        self._room = n
        return True

    def on_writable(self, callback: Callable[[], None]) -> None:
        self._writable = callback

    async def wait_for_room(self, seconds: float) -> None:
        """Wait until the kernel takes a request (or ``seconds`` pass, or it stops)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._room_waiters.append(fut)
        self._kick()
        handle = loop.call_later(max(0.0, seconds), _resolve, fut)
        try:
            await fut
        finally:
            handle.cancel()

    # -- messages out ---------------------------------------------------------------------

    def watch(self, loop: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
        """The monitor runs on the loop that booted the kernel and calls ``callback``
        there: no thread hop at all."""
        if loop is not self._loop:
            return None
        return self.on_readable(callback)

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._reader = callback
        self._armed = True
        self._kick()

        def undo() -> None:
            if self._reader is callback:
                self._reader = None

        return undo

    def on_failure(self, callback: Callable[[BaseException], None] | None) -> None:
        """Hear (on the loop) of a failure the monitor finds: before `start`, nobody
        polls for it."""
        self._on_failure = callback

    def _take(self, r: HostRings, n: int) -> list[Any]:
        """Take ``n`` replies from the ring (under ``_lock``): reply objects, and a
        `HandlerRejectedError` for each message the handler rejected, in order."""
        recs, stats = r.take(n)
        self._taken += n
        out: list[Any] = self._out_t.from_records(recs)
        if stats.any():
            for k in np.flatnonzero(stats).tolist():
                rec = recs[k]
                cid = uuid.UUID(int=(int(rec["_cid_hi"]) << 64) | int(rec["_cid_lo"]))
                out[k] = HandlerRejectedError(self._kernel_id, cid, int(stats[k]))
        return out

    def poll_reply(self) -> Any:
        got = self.poll_replies(1)
        return got[0] if got else None

    def poll_replies(self, max_count: int) -> list[Any]:
        with self._lock:
            pend = self._pending
            if not pend and not self._released:
                r = self._rings
                n = 0 if r is None else min(r.ready(), max_count)
                if n > 0:
                    assert r is not None
                    got = self._take(r, n)
                    for i, item in enumerate(got):
                        if isinstance(item, BaseException):
                            pend.extend(got[i:])
                            if i:
                                return got[:i]
                            break
                    else:
                        return got
            if pend:
                out: list[Any] = []
                while pend and len(out) < max_count:
                    item = pend[0]
                    if isinstance(item, BaseException):
                        if out:
                            break
                        pend.popleft()
                        raise item
                    out.append(pend.popleft())
                return out
            failure = self._failure
            if failure is not None:
                err = KernelFailedError(self._kernel_id, failure)
                raise err from failure
            if self._stopped:
                raise KernelStateError(
                    self._kernel_id,
                    KernelState.TERMINATED,
                    "receive from",
                    "its GPU kernel has stopped and every reply was read",
                )
            self._armed = True
            return []

    def drain_replies(self) -> list[Any]:
        """Every reply readable now, oldest first (rejections as their errors)."""
        with self._lock:
            r = self._rings
            if r is not None and not self._released:
                n = r.ready()
                if n:
                    self._pending.extend(self._take(r, n))
            out = list(self._pending)
            self._pending.clear()
        return out

    def drain_latencies(self) -> Latencies | None:
        """The device's per-message latencies since the last call (the latency ring keeps
        the last ``ring_size``), as `LatencyRecorder.drain` gives them."""
        with self._lock:
            r = self._rings
            if r is not None and not self._released:
                self._fold_latencies(r)
        return self._recorder.drain()

    def _fold_latencies(self, r: HostRings) -> None:
        processed = r.word(L.PROCESSED)
        add = self._recorder.add
        for v in r.latencies(self._lat_seen, processed).tolist():
            add(v)
        self._lat_seen = processed

    def take_device_drops(self) -> int:
        """Replies the device discarded (``outbox_full="drop"``) since the last call."""
        seen = self.word(L.DROPPED)
        new = seen - self._drops_seen
        if new <= 0:
            return 0
        self._drops_seen = seen
        return new

    def take_edge_rejections(self) -> int:
        """Messages the handler rejected while the kernel wrote into a device edge, since
        the last call (no `HandlerRejectedError` reached the bridge for them)."""
        seen = self.word(L.EDGE_REJECTED)
        new = seen - self._edge_rejected_seen
        if new <= 0:
            return 0
        self._edge_rejected_seen = seen
        return new

    # -- what is left ---------------------------------------------------------------------

    # -- device edges (``edge.py``) --------------------------------------------------------

    def edge_fit(self, kind: str, consumer: Any) -> str:
        """Whether this kernel can write into a ``kind`` edge read by ``consumer``'s
        kernel: "" when it can, else why the edge keeps the loop path (`edges.negotiate`).

        Raises:
            TypeValidationError: the consumer's input class is not this kernel's output
                class: a device edge copies records as they are.
        """
        if kind != "device-ring":
            return f"the gpu tier has no {kind!r} edges"
        if not isinstance(consumer, GPUWorker):
            return f"a device-ring edge needs a GPU kernel at both ends, not {consumer!r}"
        if self._out_t is not consumer.input_type or self._out_dtype != consumer.in_dtype:
            raise TypeValidationError(
                f"cannot connect {self._kernel_id!r} -> {consumer.kernel_id!r} over a "
                f"device-ring edge: {self._kernel_id!r} writes {self._out_t.__name__} records "
                f"but {consumer.kernel_id!r} reads {consumer.input_type.__name__} records, and "
                "the edge copies records as they are; give both kernels the same @message "
                "class, or connect(..., direct=False) to convert on the loop path"
            )
        if self.device_id != consumer.device_id:
            return (
                f"the kernels run on different devices ({self._kernel_id!r} on cuda:"
                f"{self.device_id}, {consumer.kernel_id!r} on cuda:{consumer.device_id}); a "
                "device-ring edge joins two kernels on one device"
            )
        for w in (self, consumer):
            if w.flavour == "cuda_c":
                return f"{w.kernel_id!r} has a CUDA C handler, whose kernel takes no device edges"
            dev = w.device
            if dev is None or dev.edge_arena is None:
                return f"{w.kernel_id!r} was started without the device's edge arena (no room)"
        src = consumer.edge_source
        if src is not None and src != self._kernel_id:
            return (
                f"{consumer.kernel_id!r} already reads a device-ring edge from {src!r} (a GPU "
                "kernel reads one device edge beside its inbox)"
            )
        return ""

    @property
    def kernel_id(self) -> str:
        return self._kernel_id

    def open_edge(self, kind: str, source_id: str) -> Any:
        """The ``device-ring`` edge from ``source_id`` into this kernel (its memory is
        taken when the producer is routed into it)."""
        if kind != "device-ring":
            return super().open_edge(kind, source_id)
        self._check_open()
        edge = self._edge_in
        if edge is not None and not edge.closed:
            if edge.source_id == source_id:
                return edge
            raise InvalidConfigurationError(
                f"GPU kernel {self._kernel_id!r} already reads a device-ring edge from "
                f"{edge.source_id!r}; a GPU kernel reads one device edge beside its inbox"
            )
        edge = DeviceEdge(self, source_id, self._ring_size, self._in_dtype, self._in_t.from_records)
        self._edge_in = edge
        return edge

    def route_into(self, edge: Any) -> None:
        """Have the kernel write its replies into ``edge`` (a `DeviceEdge`), or back into
        its outbox (None). Returns once the kernel (and, the first time, the consumer's
        kernel) acknowledged.

        Raises:
            InvalidConfigurationError: not a device edge, a closed one, or no room for it.
            KernelFailedError: a kernel did not acknowledge within ``terminate_timeout``.
        """
        if edge is None:
            self._unroute()
            return
        if not isinstance(edge, DeviceEdge):
            super().route_into(edge)
            return
        if edge.closed:
            raise InvalidConfigurationError(f"the device edge into {edge.consumer!r} is closed")
        why = self.edge_fit("device-ring", edge.consumer)
        if why:
            raise InvalidConfigurationError(why)
        if self._edge_out is edge:
            return
        self._check_open()
        if self._edge_out is not None:
            self._unroute()
        dev = self._dev
        assert dev is not None
        assert dev.edge_arena is not None
        if not edge.placed:
            if not edge.place(dev.edge_arena):
                raise InvalidConfigurationError(
                    f"the edge arena of cuda:{self.device_id} has no room for a "
                    f"{edge.capacity}-slot edge of {edge.dtype.itemsize}-byte records"
                )
            edge.consumer.attach_in(edge)
        self._change_route(
            self._route | L.EDGE_ROUTE_OUT,
            {L.EDGE_OUT_BASE: edge.base, L.EDGE_OUT_CAP: edge.capacity, L.EDGE_OUT_HDR: edge.hdr},
        )
        self._edge_out = edge
        edge.producer = self

    def attach_in(self, edge: DeviceEdge) -> None:
        """Have the kernel read ``edge`` (placed) beside its inbox; waits for its ack."""
        self._change_route(
            self._route | L.EDGE_ROUTE_IN,
            {L.EDGE_IN_BASE: edge.base, L.EDGE_IN_CAP: edge.capacity, L.EDGE_IN_HDR: edge.hdr},
        )

    def detach_out(self, edge: DeviceEdge) -> None:
        """``edge`` is being closed (its consumer stopped): the kernel writes into its
        outbox again; returns once it acknowledged, or at once when it no longer runs."""
        if self._edge_out is not edge:
            return
        self._unroute()

    def wake(self) -> None:
        """Wake the monitor (a producer's kernel wrote into this kernel's edge)."""
        self._kick_any_thread()

    def _unroute(self) -> None:
        edge, self._edge_out = self._edge_out, None
        if edge is None:
            return
        edge.producer = None
        r = self._rings
        if r is None or self._released:
            return
        try:
            self._change_route(self._route & ~L.EDGE_ROUTE_OUT, {})
        except KernelStateError:  # stopped meanwhile: it writes nothing any more
            pass

    def _change_route(self, route: int, params: dict[int, int]) -> None:
        r = self._rings
        if r is None or self._released:
            raise KernelStateError(
                self._kernel_id, KernelState.TERMINATED, "route", "its GPU kernel has stopped"
            )
        for index, value in params.items():
            r.set_word(index, value)
        r.set_word(L.EDGE_ROUTE, route)  # after the parameters (set_word fences)
        self._route = route
        self._kick_any_thread()
        deadline = time.monotonic() + self._opts.terminate_timeout
        delay = 0.0
        while (got := self._ack_problem(L.EDGE_ROUTE_ACK, route, "an edge", deadline)) is None:
            time.sleep(delay)
            delay = min(delay * 2 or 1e-5, 1e-3)
        self._acknowledged(got)

    def _close_edge_in(self) -> None:
        """The kernel ended: stop the producer writing into its edge, then hand back what
        the edge still holds (after the requests the kernel never took)."""
        edge = self._edge_in
        if edge is None or edge.closed:
            return
        producer = edge.producer
        if producer is not None:
            try:
                producer.detach_out(edge)
            except Exception as exc:  # it failed: it was told to leave its loop
                logger.warning(
                    "GPU kernel %r: the producer of its device edge did not acknowledge the "
                    "close (%r); reading the edge back anyway",
                    self._kernel_id,
                    exc,
                )
        # (a device-to-host copy on a GPU: made on the loop's thread, as every CUDA call)
        self._leftovers.extend(self._device_call(edge.read_back))

    def take_undelivered(self) -> list[Any]:
        """The requests the stopped kernel never took, once (none while it may still run:
        a hung kernel may still read its ring)."""
        out, self._leftovers = self._leftovers, []
        return out

    # -- the monitor ----------------------------------------------------------------------

    def _kick(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def _kick_any_thread(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._kick()
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._kick)

    def _note_failure(self, exc: BaseException) -> None:
        """The kernel faulted, hung or exited: the first failure is the one reported; a
        live kernel is told to leave its loop; the monitor tells the reader."""
        if self._failure is None:
            self._failure = exc
        self.abort()
        self._kick_any_thread()

    def _wake_room_waiters(self) -> None:
        waiters = self._room_waiters
        while waiters:
            _resolve(waiters.popleft())

    def _tell_reader(self) -> None:
        reader = self._reader
        if reader is not None:
            self._armed = False
            reader()

    def _look(self, r: HostRings) -> bool:
        """One pass: tell the reader of new replies and the writer of new room."""
        progressed = False
        if self._armed and self._reader is not None and r.ready():
            self._tell_reader()
            progressed = True
        head = r.word(L.IN_HEAD)
        if head != self._head_seen:
            self._head_seen = head
            progressed = True
            out = self._edge_out
            if out is not None:  # its kernel may have written into the edge
                out.consumer.wake()
            self._wake_room_waiters()
            if self._want_room and self._free(r) > 0:
                self._want_room = False
                writable = self._writable
                if writable is not None:
                    writable()
        return progressed

    async def _watch_device(self) -> None:
        """Watch the rings and the kernel until it stops or fails (see the design notes)."""
        loop = asyncio.get_running_loop()
        r = self._rings
        assert r is not None
        spin = 0.0 if self.flavour == "simulator" else 2e-4
        last = time.monotonic()
        try:
            while True:
                if self._failure is not None and not self._failure_told:
                    self._report_failure()
                    return
                if self._stopped:
                    self._wake_room_waiters()
                    self._tell_reader()  # it polls what is left, then learns of the stop
                    return
                progressed = self._look(r)
                now = time.monotonic()
                if progressed:
                    last = now
                    await asyncio.sleep(0)
                    continue
                if not self._stopping:
                    problem = self._health(r, now)
                    if problem is not None:
                        self._note_failure(problem)
                        continue
                waited = now - last
                if r.in_flight() > 0 or self._want_room or waited < spin or self._edge_depth():
                    await asyncio.sleep(0 if waited < spin else min(1e-3, waited / 4))
                    continue
                fut = loop.create_future()
                self._wake = fut
                handle = loop.call_later(0.25, _resolve, fut)
                try:
                    await fut
                finally:
                    handle.cancel()
                    self._wake = None
                last = time.monotonic()
        except Exception as exc:  # a bug or a device error: report it, never die silently
            self._note_failure(exc)
            self._report_failure()

    def _report_failure(self) -> None:
        failure = self._failure
        assert failure is not None
        self._failure_told = True
        self._wake_room_waiters()
        self._tell_reader()
        on_failure = self._on_failure
        if on_failure is not None:
            on_failure(failure)

    def _health(self, r: HostRings, now: float) -> BaseException | None:
        """The watchdog: a kernel that exited, faulted or stopped making progress."""
        dev = self._dev
        assert dev is not None
        live = self._live
        if live.observe(
            now,
            published=r.in_tail,
            taken=r.word(L.IN_HEAD),
            seen=r.word(L.TAIL_SEEN),
            beat=r.word(L.HEARTBEAT),
        ):
            self._wake_room_waiters()
        if now - self._last_health >= 0.01:  # a driver call on a GPU: not on every pass
            self._last_health = now
            exited = self._exit_reason()
            if exited is not None:
                return exited
        wd = self._opts.watchdog_timeout
        pending = r.in_flight()
        if wd is not None and pending and r.word(L.ACTIVE) and live.stalled_for(now) > wd:
            return TimeoutError(
                live.describe(self._kernel_id, wd, pending, r.word(L.PROCESSED), now)
            )
        return None

    async def join_monitor(self, timeout: float = 1.0) -> None:
        """Wait (up to ``timeout`` seconds) for the monitor task to end after a stop."""
        task = self._monitor
        if task is None or task.done() or task is asyncio.current_task():
            return
        self._kick()
        await asyncio.wait({task}, timeout=timeout)
