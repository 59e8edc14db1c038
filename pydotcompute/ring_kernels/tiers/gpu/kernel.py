"""GPU-resident ring kernels: one persistent CUDA kernel per actor, fed through mapped rings.

(One class, the GPU tier's host side: the mechanism of a GPU actor. Policy (the state
machine's rules, failure, hand-back, drop counting) is `RingKernel`'s; device code, memory,
launching, ring mechanics and option checks live beside this module in `tiers/gpu/`.)

What runs where:

```text
event loop (host)                            mapped pinned host memory       GPU
-----------------                            -------------------------       ---
send -> staging queue -> write inbox slots   inbox ring [slots]              one block loops:
        (or straight into the ring)  ------> ctl[IN_TAIL]  ---------------->  poll, handle,
pump task <- read outbox slots <------------ outbox ring, ctl[OUT_TAIL] <----  write reply,
     -> waiter / forward / reply buffer     ctl: ACTIVE, TERMINATE, counters   publish
```

The kernel is launched once (``launch``) on a non-blocking stream and loops until the control
block says TERMINATE; ``activate``/``deactivate``/``reactivate`` flip ``ACTIVE`` and wait
for the kernel's acknowledgement (``ACTIVE_ACK``); ``terminate`` drains, sets TERMINATE and
waits for ``TERMINATED`` with a timeout. Nothing is relaunched per message. The host side is
one asyncio task per kernel (the *pump*): it collects replies in batches, moves staged
messages into free slots, and watches the kernel; it spins only while messages are in
flight and parks on a future otherwise. Sends write the ring directly when the staging
queue is empty, so a round trip costs no task switch on the send side.

Memory-ordering argument (inbox; the outbox is the mirror image with roles swapped):

1. The host writes a slot's bytes (NumPy stores into mapped memory), then a full fence
   (a lock acquire/release: a locked instruction on x86-64), then stores ``IN_TAIL`` and
   the ``DOORBELL`` word (``IN_TAIL << 2 | TERMINATE << 1 | ACTIVE``; the event loop is its
   only writer). On x86-64 (TSO) stores become visible in program order anyway; the fence
   also stops the interpreter/compiler side from reordering.
2. Thread 0 of the kernel reads ``DOORBELL`` with ``ld.acquire.sys``. Acquire at system
   scope orders every later load of that thread after it, so once it sees the new tail it
   reads the slot bytes the host wrote before publishing (PTX memory model: the host's
   program-ordered stores and the acquire form a release/acquire pattern at system scope;
   this is the pattern ``cuda::atomic<..., thread_scope_system>`` compiles to). The other
   threads of the block learn the slot index through shared memory after ``bar.sync``,
   which orders their loads after thread 0's acquire (causality order is cumulative).
3. Replies: every thread that wrote the reply slot (or the state) executes
   ``__threadfence_system`` then ``bar.sync``; thread 0 writes the header, then stores
   ``OUT_TAIL`` with ``st.release.sys``: the host cannot see the new tail before the slot.
   The host reads ``OUT_TAIL`` then the slot (x86-64 never reorders loads with loads),
   copies and zeroes the slots, fences, and stores ``OUT_HEAD``; the kernel reads
   ``OUT_HEAD`` with acquire before it reuses a slot, so it never overwrites a reply the
   host is still copying.
4. ``IN_HEAD`` is released by the kernel only after it finished reading the slot (the
   handler's loads precede the release), so the host reuses a slot only when the kernel is
   done with it.
5. Every index is a monotonic 64-bit count (slot = count % size): no ABA, no wrap bit.
6. ``ACTIVE`` and ``TERMINATE`` travel in the doorbell with the inbox tail, so a poll is one
   system-scope load (one round trip to host memory), not three; the separate words stay
   for host-side readers. ``ACTIVE_ACK`` is a release store, so when ``deactivate`` sees
   it, no message is being taken any more.
7. The inline-asm loads carry a ``memory`` clobber and side effects, so the compiler cannot
   hoist a poll out of the loop or move a slot access across it (what ``volatile`` would
   give, plus the hardware ordering). A burst of up to ``BATCH`` messages is handled in
   order and published with one release store.

Under the Numba CUDA simulator the kernel runs in Python threads (``simlaunch.py``)
over plain NumPy arrays; the GIL orders every read and write, and the device polls with
plain reads (an atomic of another kind than the writer's may miss updates there).
Rejected designs: a host thread per kernel copying messages (an extra hop and a thread per
actor), cooperative launch of many blocks (needs grid sync, and the simulator runs blocks
one after another), device-side queues in global memory with cudaMemcpy per message (a
driver call per message is what the persistent kernel exists to avoid).

Policy comes from `RingKernel`: its verbs (`launch`, `activate`, `deactivate`,
`reactivate`, `terminate`) and `_fail` check, change states, hand back and account; this
class only supplies their device steps through the `_place_*` hooks (start the kernel, flip
``ACTIVE``, drain and set TERMINATE, give back the ring's leftovers) and `close_replies`
for its reply buffer. Kernels reach it through the public `accept`/`accept_nowait`. Drops
are counted as they happen: the staging queue's ``drop_oldest`` drops as it makes them, a
reply the device discarded (``outbox_full="drop"``) when the host reads the device's
counter, a rejected message or a reply nobody waits for when it is collected
(`count_lost_reply`). The reply buffer holds records, not objects, so `receive_records`
costs no message object; it is why `receive` is this class's own (the outbox the shared
`launch` makes carries no reply; its statistics count the lost ones, as on every tier).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ....exceptions import (
    CUDAError,
    InvalidConfigurationError,
    KernelCompilationError,
    KernelError,
    KernelFailedError,
    KernelStateError,
    QueueClosedError,
    QueueFullError,
    QueueTimeoutError,
    TypeValidationError,
)
from ...config import RingKernelConfig
from ...fast_queue import FastMessageQueue
from ...kernel import KernelFunc, RingKernel
from ...states import KernelState
from ...supervision import BurstLog
from . import layout as L
from .host import HostRings, Liveness, Replies
from .prepare import compile_within
from .spec import OPTION_NAMES as _OPTION_NAMES
from .spec import GPUKernelOptions, GPUKernelStatistics, check_spec, normalize_state

if TYPE_CHECKING:
    from ...runtime import RingKernelRuntime
    from .resources import DeviceActor

__all__ = ("STATUS_OK", "GPUKernelOptions", "GPUKernelStatistics", "GPURingKernel")

logger = logging.getLogger("pydotcompute")

#: The status a handler returns to publish its reply; anything else rejects the message.
STATUS_OK = 0

_UNBOUNDED = 1 << 30


class GPURingKernel(RingKernel):
    """A ring kernel whose handler runs in a persistent CUDA kernel (tier ``gpu``).

    Built by ``runtime.launch(..., tier="gpu")`` or from a ``@ring_kernel(...,
    backend="cuda")`` declaration; ``kernel_func`` is the handler
    ``handler(inp, out, state) -> int`` (a Python function compiled as a Numba CUDA device
    function) unless the ``cuda_source`` option supplies it in CUDA C. The interface is
    `RingKernel`'s; `send_batch` / `send_records` and
    `receive_batch` / `receive_records` move many messages per publish.
    Every method runs on the event loop that launched the kernel.
    """

    EXTRA_OPTIONS: frozenset[str] = _OPTION_NAMES
    #: The handler is a device function (or none), not a Python actor: not checked.
    ACTOR_KIND = None
    #: A persistent device kernel is not restarted by the runtime: refused at launch.
    SUPPORTS_RESTART = False

    __slots__ = (
        "_bridge",
        "_dev",
        "_device_drops_seen",
        "_drop_log",
        "_fwd_backlog",
        "_last_health",
        "_lat_seen",
        "_live",
        "_published_direct",
        "_pump_stop",
        "_pump_task",
        "_recv_waiters",
        "_replies",
        "_replies_closed",
        "_replies_received",
        "_rings",
        "_space_waiters",
        "_wake",
        "final_state",
        "in_dtype",
        "options",
        "out_dtype",
        "ring_size",
    )

    def __init__(
        self,
        kernel_id: str,
        kernel_func: KernelFunc | Any,
        *,
        config: RingKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
        runtime: RingKernelRuntime | None = None,
        enable_telemetry: bool = True,
    ) -> None:
        if config is None:
            config = RingKernelConfig(kernel_id=kernel_id)
        config.tier = "gpu"
        config.backend = "cuda"
        # the staging queue holds message objects (records are made as they are published)
        config.serialize = False
        config.use_fast_queue = True
        opts, in_dt, out_dt = check_spec(
            kernel_id,
            kernel_func,
            input_type,
            output_type,
            grid_size=config.grid_size,
            block_size=config.block_size,
            extra=dict(config.extra),
            restart=config.restart,
        )
        super().__init__(
            kernel_id,
            kernel_func if kernel_func is not None else _no_python_handler,
            config=config,
            input_type=input_type,
            output_type=output_type,
            runtime=runtime,
            enable_telemetry=enable_telemetry,
        )
        self._direct = False  # the runtime must go through accept / receive
        self._published_direct = 0  # messages that went straight into the ring, not staged
        self.options = opts
        self.in_dtype = in_dt
        self.out_dtype = out_dt
        self.ring_size = opts.ring_size or min(
            config.input_queue_size, config.output_queue_size, 4096
        )
        self._bridge = opts.bridge_queue_size or self.ring_size
        self._dev: DeviceActor | None = None
        self._rings: HostRings | None = None
        self._lat_seen = 0
        self._device_drops_seen = 0
        self._live = Liveness(0.0)
        self._last_health = 0.0
        self._pump_task: asyncio.Task[None] | None = None
        self._pump_stop = False
        self._wake: asyncio.Future[None] | None = None
        self._replies = Replies()
        self._replies_closed: BaseException | None = None
        self._replies_received = 0
        self._recv_waiters: deque[asyncio.Future[None]] = deque()
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._fwd_backlog: deque[Any] = deque()
        # replies a connected kernel refused: one line, then a count
        self._drop_log = BurstLog(
            logger,
            logging.WARNING,
            "%d more repl(ies) refused downstream since the last line (counted as dropped)",
        )
        self.final_state: np.ndarray[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"<GPURingKernel {self.kernel_id!r} {self._state.name}>"

    # -- introspection ------------------------------------------------------------------

    @property
    def flavour(self) -> str | None:
        """``simulator``, ``numba`` or ``cuda_c`` once launched (None before)."""
        return None if self._dev is None else self._dev.flavour

    def _staged(self) -> int:
        inbox = self._inbox
        return 0 if inbox is None else len(inbox)

    @property
    def is_idle(self) -> bool:
        r = self._rings
        if self._state is not KernelState.ACTIVE:
            return True
        if r is None or self._staged():
            return False
        return r.in_flight() == 0 and r.ready() == 0 and not self._fwd_backlog

    def statistics(self) -> GPUKernelStatistics:
        """A frozen snapshot of the device counters and host-side occupancy."""
        r = self._rings

        def w(i: int) -> int:
            return 0 if r is None else r.word(i)

        return GPUKernelStatistics(
            flavour=self.flavour or "not launched",
            processed=w(L.PROCESSED),
            replies_received=self._replies_received,
            errors=w(L.ERRORS),
            dropped=w(L.DROPPED),
            outbox_full_events=w(L.OUTBOX_FULL),
            last_status=w(L.LAST_STATUS),
            last_latency_ns=w(L.LAST_LATENCY),
            min_latency_ns=w(L.MIN_LATENCY),
            max_latency_ns=w(L.MAX_LATENCY),
            total_latency_ns=w(L.TOTAL_LATENCY),
            heartbeat=w(L.HEARTBEAT),
            in_flight=0 if r is None else r.in_flight(),
            staged=self._staged(),
            buffered_replies=self._replies.count,
            ring_size=self.ring_size,
        )

    def refresh_telemetry(self) -> None:
        """Copy the device counters into ``self.telemetry`` (``runtime.get_telemetry``).

        Per-message latencies come from the device's latency ring, so the histogram sees
        at most the last ``ring_size`` messages between two refreshes. Drops are not
        recomputed here: they were counted as the host saw them.
        """
        r = self._rings
        if r is None:
            return
        self._count_device_drops()
        tel = self.telemetry
        processed = r.word(L.PROCESSED)
        for v in r.latencies(self._lat_seen, processed).tolist():
            tel.record_latency(v)
        self._lat_seen = processed
        tel.messages_processed = processed
        tel.messages_sent = self._replies_received
        tel.error_count = r.word(L.ERRORS) + (0 if self.error is None else 1)
        if processed:
            tel.total_latency_ns = r.word(L.TOTAL_LATENCY)
            tel.max_latency_ns = r.word(L.MAX_LATENCY)
            tel.min_latency_ns = r.word(L.MIN_LATENCY)

    def messages_received(self) -> int:
        """Messages staged plus those published straight into the ring."""
        return super().messages_received() + self._published_direct

    def _count_device_drops(self) -> None:
        """Count the replies the device discarded since the host last looked."""
        r = self._rings
        if r is None:
            return
        seen = r.word(L.DROPPED)
        new = seen - self._device_drops_seen
        if new > 0:
            self._device_drops_seen = seen
            self.telemetry.record_drop(new, "outbox_full")

    def state_snapshot(self) -> np.ndarray[Any, Any]:
        """A host copy of the actor's device state (``final_state`` once terminated)."""
        if self._dev is not None and self._state is not KernelState.TERMINATED:
            return self._dev.read_state()
        if self.final_state is not None:
            return self.final_state.copy()
        raise self._refuse("read the state of")

    # -- lifecycle: the device's side of each verb ---------------------------------------

    def _make_contexts(self) -> list[Any]:
        """None: no Python actor runs on the loop (the handler runs on the device)."""
        return []

    async def _place_launch(self) -> None:
        """`launch`'s device step: allocate the rings and state, compile, and start the
        persistent kernel, which holds messages until `activate`; then start the pump.

        Raises:
            BackendNotAvailableError: no GPU (and the simulator is off), or no CuPy/NVRTC
                for a CUDA C handler.
            KernelCompilationError: the handler does not compile.
            CUDAError: the kernel did not start within ``terminate_timeout``.
        """
        from .resources import DeviceActor

        opts, cfg = self.options, self.config
        dev = DeviceActor(
            name=f"pydotcompute-gpu:{self.kernel_id}",
            handler=self._func,
            cuda_source=opts.cuda_source,
            handler_name=opts.handler_name,
            in_name=self.input_type.__name__,  # type: ignore[union-attr]
            out_name=self.output_type.__name__,  # type: ignore[union-attr]
            in_dtype=self.in_dtype,
            out_dtype=self.out_dtype,
            state=normalize_state(self.kernel_id, opts.state),
            cooperative=opts.cooperative,
            block_size=cfg.block_size,
            ring_in=self.ring_size,
            ring_out=self.ring_size,
            max_backoff_ns=opts.max_backoff_ns,
            drop_when_full=opts.outbox_full == "drop",
            device_id=opts.device_id,
        )
        try:
            if dev.flavour == "simulator":
                dev.compile()
            elif not await compile_within(dev, opts.compile_timeout):
                raise KernelCompilationError(
                    f"GPU kernel {self.kernel_id!r}: compiling and loading its handler took "
                    f"longer than compile_timeout={opts.compile_timeout}s; a first compile "
                    "takes seconds: check that NVVM/NVRTC are found (CUDA_HOME) and that "
                    "nothing holds the GPU, or raise compile_timeout"
                )
            dev.start()
        except BaseException:
            dev.release()  # deferred while a compile thread still uses it
            raise
        self._dev = dev
        self._rings = HostRings(dev.host)
        try:
            await self._await_word(L.STARTED, 1, "start")
        except BaseException:
            self._rings.set_word(L.TERMINATE, 1)
            dev.join(1.0)
            dev.release()  # kept alive instead if the kernel may still run
            self._dev = self._rings = None
            raise
        self._live = Liveness(time.monotonic())
        # the pump takes what is staged once the staging queue exists (made next, by launch)
        self._pump_task = asyncio.get_running_loop().create_task(
            self._pump(), name=f"pydotcompute:{self.kernel_id}"
        )

    async def _place_set_active(self, active: bool, operation: str) -> None:
        """The device step of `activate`/`deactivate`/`reactivate`: flip ``ACTIVE`` and
        wait for the kernel's acknowledgement (once deactivated, it takes no message)."""
        r = self._rings
        assert r is not None
        value = int(active)
        r.set_word(L.ACTIVE, value)
        self._kick()
        await self._await_word(L.ACTIVE_ACK, value, operation)

    async def _await_word(self, index: int, value: int, operation: str) -> None:
        """Wait until ``ctl[index] == value`` (the kernel's acknowledgement)."""
        dev, r = self._dev, self._rings
        assert dev is not None
        assert r is not None
        timeout = self.options.terminate_timeout
        deadline = time.monotonic() + timeout
        delay = 0.0
        while r.word(index) != value:
            if dev.finished():
                err = dev.failure() or RuntimeError("the persistent kernel exited on its own")
                self._device_failed(err)
                raise KernelFailedError(self.kernel_id, err) from err
            if time.monotonic() > deadline:
                if operation == "start":
                    raise CUDAError(
                        f"GPU ring kernel {self.kernel_id!r} did not start within {timeout}s: "
                        "the GPU may be full of other persistent kernels (each GPU actor holds "
                        "one block) or busy; terminate some, or raise terminate_timeout"
                    )
                err = TimeoutError(
                    f"the GPU kernel did not acknowledge {operation} within {timeout}s"
                )
                self._device_failed(err)
                raise KernelFailedError(self.kernel_id, err) from err
            await asyncio.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)

    async def _place_stop(self, was: KernelState, grace: float) -> list[Any] | None:
        """`terminate`'s device step: an active (or deactivated) kernel first processes
        what is queued, for up to ``grace`` seconds; then TERMINATE is set and the kernel's
        acknowledgement awaited. Returns the requests it never took; the final state is
        kept in ``final_state``.

        Raises:
            KernelStateError: the kernel did not acknowledge termination within
                ``terminate_timeout`` (it is then FAILED, and its memory is kept alive
                because a hung kernel may still use it).
        """
        dev, r = self._dev, self._rings
        hung: KernelStateError | None = None
        if dev is not None and r is not None:
            if was in (KernelState.ACTIVE, KernelState.DEACTIVATED):
                r.set_word(L.ACTIVE, 1)
                self._kick()
                await self._drain(grace)
            r.set_word(L.TERMINATE, 1)
            tt = self.options.terminate_timeout
            if await self._wait_finished(tt):
                failure = dev.failure()
                if failure is not None:
                    self._device_failed(failure)
                self._collect(None)
            else:
                hung = KernelStateError(
                    self.kernel_id,
                    KernelState.TERMINATING,
                    "terminate",
                    f"the GPU kernel did not acknowledge termination within {tt}s "
                    f"(processed {r.word(L.PROCESSED)}, heartbeat {r.word(L.HEARTBEAT)}); "
                    "its handler may be stuck. Its memory is kept alive, and the kernel keeps "
                    "its GPU block until it returns or the process exits",
                )
        await self._stop_pump()
        self._flush_forward_backlog()
        self._count_device_drops()
        if dev is not None:
            self.refresh_telemetry()
            if hung is None:
                self.final_state = dev.read_state()
            dev.release()  # kept alive instead while the kernel may still run
        if hung is not None:
            if r is not None and r.in_flight():  # a hung kernel may still read them
                self.telemetry.record_drop(r.in_flight(), "lost")
            self._device_failed(TimeoutError(str(hung)))
            if was is not KernelState.FAILED:
                raise hung
            logger.error("kernel %r: %s", self.kernel_id, hung)
            return None
        return self._ring_leftovers()

    async def _drain(self, seconds: float) -> None:
        """Wait until every staged and published request was handled and replied."""
        dev, r = self._dev, self._rings
        assert dev is not None
        assert r is not None
        deadline = time.monotonic() + seconds
        delay = 0.0
        while time.monotonic() < deadline and self._state is not KernelState.FAILED:
            if self.hurried:  # an interrupted shutdown: no more draining
                return
            staged = self._staged()
            if not staged and not r.in_flight() and not r.ready() and not self._fwd_backlog:
                return
            if dev.finished():
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)

    async def _wait_finished(self, seconds: float) -> bool:
        dev = self._dev
        assert dev is not None
        deadline = time.monotonic() + seconds
        delay = 0.0
        while not dev.finished():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)
        return True

    def _ring_leftovers(self) -> list[Any]:
        """The requests published to the ring that the stopped kernel never took (once)."""
        r = self._rings
        if r is None:
            return []
        recs = r.unconsumed()
        if not len(recs):
            return []
        return list(self.input_type.from_records(recs))  # type: ignore[union-attr]

    def _device_failed(self, exc: BaseException) -> None:
        """The kernel faulted, hung or exited: it fails (`RingKernel._fail`), unless it
        already failed or terminated (the first failure is the one reported)."""
        if self._state not in (KernelState.FAILED, KernelState.TERMINATED):
            self._fail(exc)

    def _place_failed(self, exc: BaseException) -> list[Any]:
        """`_fail`'s device step: the kernel is told to leave its loop and the pump stops;
        the requests a stopped kernel never took are returned, to be handed back before
        the staged ones (a live kernel may still read its ring: nothing is taken from it)."""
        dev, r = self._dev, self._rings
        lost = self._ring_leftovers() if dev is not None and dev.finished() else []
        if r is not None:
            r.set_word(L.TERMINATE, 1)  # a live kernel leaves its loop
        self.telemetry.last_error = f"{type(exc).__name__}: {exc}"
        self._pump_stop = True
        self._kick()
        return lost

    @property
    def unread_replies(self) -> int:
        """How many replies wait in the reply buffer, unread."""
        return int(self._replies.count)

    def close_replies(self, error: BaseException) -> None:
        """No reply will come any more: receivers drain the reply buffer, then get
        ``error`` (the first one given is kept)."""
        super().close_replies(error)
        if self._replies_closed is None:
            self._replies_closed = error
        self._wake_all(self._recv_waiters)
        self._wake_all(self._space_waiters)

    # -- the pump -----------------------------------------------------------------------

    def _kick(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    @staticmethod
    def _wake_all(waiters: deque[asyncio.Future[None]]) -> None:
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def _stop_pump(self) -> None:
        self._pump_stop = True
        self._kick()
        task = self._pump_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if not done:  # stuck forwarding into a full kernel
                task.cancel()
                await asyncio.wait({task})

    def _room(self, r: HostRings) -> int:
        """How many more messages the host may publish now: none while the kernel takes
        none (so the staging queue's priority and policy decide what it gets next), and
        at most ``bridge_queue_size`` in the ring."""
        if self._state is not KernelState.ACTIVE and not self._stopping:
            return 0
        return min(r.room(), self._bridge - r.in_flight())

    def _reply_room(self) -> int:
        if self._stopping or self._forward is not None or self._waiters:
            return _UNBOUNDED
        return self.config.output_queue_size - self._replies.count

    def _busy(self) -> bool:
        """Work in flight that the pump must watch (a full reply buffer waits for receive)."""
        r = self._rings
        assert r is not None
        if self._staged() or self._fwd_backlog:
            return True
        return r.in_flight() > 0 or (r.ready() > 0 and self._reply_room() > 0)

    async def _pump(self) -> None:
        """Collect replies, refill the ring and watch the kernel until told to stop.

        Spins (``sleep(0)``) while messages are in flight, for at most ``spin`` seconds
        without progress, then backs off to millisecond sleeps; parks on a future (woken
        by sends and receives, or every 0.25 s for the watchdog) when nothing is in flight.
        """
        loop = asyncio.get_running_loop()
        sim = self._dev is not None and self._dev.flavour == "simulator"
        spin = 0.0 if sim else 2e-4
        last = time.monotonic()
        try:
            while not self._pump_stop:
                progressed = self._poll()
                if self._fwd_backlog and self._forward is not None:
                    await self._forward_replies()
                    progressed = True
                now = time.monotonic()
                if progressed:
                    last = now
                    await asyncio.sleep(0)
                    continue
                self._health(now)
                if self._pump_stop:
                    break
                waited = now - last
                if self._busy() or waited < spin:  # in flight, or lingering for a next send
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
            self._device_failed(exc)

    def _poll(self) -> bool:
        """One pass: collect replies, refill the ring from the staging queue."""
        progressed = self._collect(4096)
        inbox, r = self._inbox, self._rings
        if inbox is not None and len(inbox) and r is not None:
            room = self._room(r)
            if room > 0 and self._state is not KernelState.FAILED:
                batch = inbox.get_batch(room)
                r.publish(self.input_type.to_records(batch))  # type: ignore[union-attr]
                progressed = True
        if self._space_waiters and r is not None and r.room() > 0:
            self._wake_all(self._space_waiters)  # send_records waits for free slots
        return progressed

    def _collect(self, limit: int | None) -> bool:
        r = self._rings
        if r is None:
            return False
        n = r.ready()
        if limit is not None:
            n = min(n, limit, self._reply_room())
        if n <= 0:
            return False
        recs, stats = r.take(n)
        self._replies_received += n
        self._deliver(recs, stats)
        self._count_device_drops()
        return True

    def _deliver(self, recs: np.ndarray[Any, Any], stats: np.ndarray[Any, Any]) -> None:
        """Route replies: rejected ones to their waiter as errors, correlated ones to their
        ``send_and_receive`` caller, the rest onward (``connect``) or to the reply buffer.
        A rejected message and a reply whose caller gave up are counted as dropped (never
        buffered: a full buffer nobody reads would stop the replies of waiting callers)."""
        out_t: Any = self.output_type
        waiters = self._waiters
        tel = self.telemetry
        bad = stats != 0
        if bad.any():
            for rec, status in zip(recs[bad], stats[bad], strict=True):
                cid = uuid.UUID(int=(int(rec["_cid_hi"]) << 64) | int(rec["_cid_lo"]))
                text = f"the handler rejected message {cid} with status {int(status)}"
                tel.last_error = text
                tel.record_drop(1, "rejected")
                fut = waiters.pop(cid.bytes, None)  # callers are filed under id bytes
                if fut is not None and not fut.done():
                    fut.set_exception(KernelError(f"GPU kernel {self.kernel_id!r}: {text}"))
            recs = recs[~bad]
        if (waiters or self._answers) and len(recs):
            keep = np.ones(len(recs), dtype=bool)
            for k in range(len(recs)):
                rec = recs[k]
                key = ((int(rec["_cid_hi"]) << 64) | int(rec["_cid_lo"])).to_bytes(16, "big")
                fut = waiters.pop(key, None)
                if fut is not None:
                    keep[k] = False
                    if not fut.done():
                        fut.set_result(out_t.from_records(recs[k : k + 1])[0])
                    else:  # its caller timed out or was cancelled: nobody reads it
                        self.drop_unawaited(key, abandoned=True)
                elif self.drop_unawaited(key):  # a request's, its caller gone: dropped
                    keep[k] = False
            recs = recs[keep]
        if not len(recs):
            return
        if self._forward is not None:
            self._fwd_backlog.extend(out_t.from_records(recs))
            return
        self._replies.push(recs)
        self._wake_all(self._recv_waiters)

    async def _forward_replies(self) -> None:
        """Send collected replies on to the connected kernel, waiting for its room; one it
        refuses is counted as dropped (a full ``reject`` inbox) or kept in the reply
        buffer (a kernel that stopped)."""
        target = self._forward
        backlog = self._fwd_backlog
        while backlog and target is not None:
            try:
                await target.accept(backlog[0], None)
            except (QueueFullError, KernelStateError, KernelFailedError) as exc:
                self._refused_downstream(target, exc, backlog[0])
            backlog.popleft()

    def _flush_forward_backlog(self) -> None:
        """At terminate: hand what is still to forward to the connected kernel without
        waiting; what it cannot take now is counted as dropped."""
        target, backlog = self._forward, self._fwd_backlog
        while backlog:
            reply = backlog.popleft()
            if target is None:
                self.count_lost_reply()
                continue
            try:
                target.accept_nowait(reply)
            except (QueueFullError, KernelStateError, KernelFailedError) as exc:
                self._refused_downstream(target, exc, reply)
        refused = self._drop_log.take_pending()
        if refused:
            logger.warning(
                "kernel %r: %d more repl(ies) refused by the kernel it forwards into "
                "(counted as dropped)",
                self.kernel_id,
                refused,
            )

    def _refused_downstream(self, target: RingKernel, exc: BaseException, reply: Any) -> None:
        if isinstance(exc, KernelStateError):  # it stopped: the reply stays here, readable
            self.reply_kept(target, exc)
            self._replies.push(self.output_type.to_records([reply]))  # type: ignore[union-attr]
            self._wake_all(self._recv_waiters)
            return
        self.count_lost_reply()
        self._drop_log.event(
            "kernel %r: a reply forwarded to %r was dropped: %s",
            self.kernel_id,
            target.kernel_id,
            exc,
        )

    def _health(self, now: float) -> None:
        """The watchdog: a kernel that exited, faulted or stopped making progress FAILs."""
        dev, r = self._dev, self._rings
        if dev is None or r is None or self._state in (KernelState.FAILED, KernelState.TERMINATED):
            return
        self._count_device_drops()
        live = self._live
        progressed = live.observe(
            now,
            published=r.in_tail,
            taken=r.word(L.IN_HEAD),
            seen=r.word(L.TAIL_SEEN),
            beat=r.word(L.HEARTBEAT),
        )
        if progressed:
            self._wake_all(self._space_waiters)
        if now - self._last_health >= 0.01:  # a driver call on a GPU: not on every pass
            self._last_health = now
            if not self._stopping and dev.finished():
                err = dev.failure() or RuntimeError("the persistent kernel exited on its own")
                self._device_failed(err)
                return
        wd = self.options.watchdog_timeout
        pending = r.in_flight()
        if wd is not None and pending and r.word(L.ACTIVE) and live.stalled_for(now) > wd:
            text = live.describe(self.kernel_id, wd, pending, r.word(L.PROCESSED), now)
            self._device_failed(TimeoutError(text))

    # -- sending: straight into the ring when nothing is staged ahead ---------------------

    def _sendable(self) -> tuple[FastMessageQueue[Any], HostRings]:
        inbox, r = self._inbox, self._rings
        if inbox is None or r is None or inbox.closed or self._stopping:
            raise self._refuse("send to")
        return inbox, r

    async def accept(self, msg: Any, timeout: float | None = None) -> None:
        """Validate ``msg``; publish it now when nothing is staged ahead of it, else stage."""
        self._validate_in(msg)
        inbox, r = self._sendable()
        if not len(inbox) and self._room(r) > 0:
            r.publish(self.input_type.to_records((msg,)))  # type: ignore[union-attr]
            self._published_direct += 1
        else:
            try:
                await inbox.put(msg, timeout=timeout)
            except QueueClosedError:
                raise self._refuse("send to") from None
        self._kick()

    def accept_nowait(self, msg: Any) -> None:
        """Like `accept`, but a full staging queue raises ``QueueFullError`` at once."""
        self._validate_in(msg)
        inbox, r = self._sendable()
        if not len(inbox) and self._room(r) > 0:
            r.publish(self.input_type.to_records((msg,)))  # type: ignore[union-attr]
            self._published_direct += 1
        else:
            inbox.put_nowait(msg)
        self._kick()

    async def send_batch(self, msgs: Sequence[Any], timeout: float | None = None) -> int:
        """Send many messages; those that fit in the ring are published with one tail store.

        Returns:
            How many were accepted (``len(msgs)`` unless the inbox rejects).
        """
        for m in msgs:
            self._validate_in(m)
        inbox, r = self._sendable()
        k = min(len(msgs), r.room()) if not len(inbox) else 0
        if k:
            r.publish(self.input_type.to_records(msgs[:k]))  # type: ignore[union-attr]
            self._published_direct += k
        for m in msgs[k:]:
            try:
                await inbox.put(m, timeout=timeout)
            except QueueClosedError:
                raise self._refuse("send to") from None
        self._kick()
        return len(msgs)

    async def send_records(
        self,
        records: np.ndarray[Any, Any],
        timeout: float | None = None,
    ) -> int:
        """Send a structured array in ``input_type.dtype`` layout straight into the ring.

        The fastest path: no message objects, one copy and one tail store per free run of
        slots. Waits for room (up to ``timeout`` seconds). Records with zero ``_mid_*``
        get replies with zero ``_cid_*``.

        Raises:
            TypeValidationError: ``records`` is not an array of ``input_type.dtype``.
            QueueTimeoutError: no room within ``timeout``.
        """
        if not isinstance(records, np.ndarray) or records.dtype != self.in_dtype:
            got = getattr(records, "dtype", type(records).__name__)
            raise TypeValidationError(
                f"kernel {self.kernel_id!r} expects records of "
                f"{self.input_type.__name__}.dtype, got {got}"  # type: ignore[union-attr]
            )
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        sent = 0
        while sent < len(records):
            inbox, r = self._sendable()
            room = r.room() if not len(inbox) else 0
            if room > 0:
                k = min(room, len(records) - sent)
                r.publish(records[sent : sent + k])
                sent += k
                self._published_direct += k
                self._kick()
                continue
            if deadline is not None and loop.time() >= deadline:
                raise QueueTimeoutError(
                    f"timed out after {timeout}s waiting for a free slot in the inbox ring of "
                    f"kernel {self.kernel_id!r} ({sent} of {len(records)} records sent)"
                )
            fut = loop.create_future()
            self._space_waiters.append(fut)
            self._kick()
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - loop.time()))
            handle = loop.call_later(wait, _resolve, fut)
            try:
                await fut
            finally:
                handle.cancel()
        return sent

    # -- receiving: from the reply buffer (records) ---------------------------------------

    def _take(self, n: int) -> np.ndarray[Any, Any]:
        if type(n) is not int or n < 1:
            raise InvalidConfigurationError(f"max_count must be an int >= 1, got {n!r}")
        recs = self._replies.pop(n)
        self._kick()  # room for more replies
        return recs

    async def _wait_reply(self, timeout: float | None) -> None:
        """Wait until a reply is buffered (or raise the close reason or a timeout).

        A kernel never activated raises at once, as on every tier: no reply can come."""
        if self._state is KernelState.LAUNCHED:
            raise self._not_active("receive from")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._replies.count:
            if self._replies_closed is not None:
                raise self._replies_closed
            if self._inbox is None:
                raise self._refuse("receive from")
            handle = None
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise QueueTimeoutError(
                        f"no reply from GPU kernel {self.kernel_id!r} within {timeout}s"
                    )
            fut = loop.create_future()
            self._recv_waiters.append(fut)
            if deadline is not None:
                handle = loop.call_later(left, _resolve, fut)
            try:
                await fut
            finally:
                if handle is not None:
                    handle.cancel()

    async def receive(self, timeout: float | None = None) -> Any:
        """The next reply, waiting up to ``timeout`` seconds.

        Raises:
            QueueTimeoutError: nothing arrived in time.
            KernelFailedError: the kernel failed (after buffered replies were drained).
            KernelStateError: it is LAUNCHED (never activated), or terminated and its
                replies are drained.
        """
        if not self._replies.count:
            await self._wait_reply(timeout)
        return self.output_type.from_records(self._take(1))[0]  # type: ignore[union-attr]

    def receive_nowait(self) -> Any:
        """The next reply, or None when none is buffered (raises once closed and drained)."""
        if self._replies.count:
            return self.output_type.from_records(self._take(1))[0]  # type: ignore[union-attr]
        if self._replies_closed is not None:
            raise self._replies_closed
        if self._inbox is None:
            raise self._refuse("receive from")
        return None

    async def receive_batch(self, max_count: int, timeout: float | None = None) -> list[Any]:
        """Up to ``max_count`` replies: waits for the first, then takes what is buffered."""
        if not self._replies.count:
            await self._wait_reply(timeout)
        return self.output_type.from_records(self._take(max_count))  # type: ignore[union-attr, no-any-return]

    async def receive_records(
        self,
        max_count: int,
        timeout: float | None = None,
    ) -> np.ndarray[Any, Any]:
        """Up to ``max_count`` replies as a structured array (``output_type.dtype``)."""
        if not self._replies.count:
            await self._wait_reply(timeout)
        return self._take(max_count)


#: The name the tier registry loads (``tier="gpu"``).
GPUKernel = GPURingKernel


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _no_python_handler(ctx: Any) -> None:  # pragma: no cover - never called
    raise RuntimeError("a CUDA C handler runs on the device only")
