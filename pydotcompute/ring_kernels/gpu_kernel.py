"""GPU-resident ring kernels: one persistent CUDA kernel per actor, fed through mapped rings.

(Longer than most modules: it is one class, the GPU tier's host-side state machine. Device
code, memory, launching, ring mechanics and option checks live in ``_gpu/``.)

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

Under the Numba CUDA simulator the kernel runs in Python threads (``_gpu/simlaunch.py``)
over plain NumPy arrays; the GIL orders every read and write, and the device polls with
plain reads (an atomic of another kind than the writer's may miss updates there).
Rejected designs: a host thread per kernel copying messages (an extra hop and a thread per
actor), cooperative launch of many blocks (needs grid sync, and the simulator runs blocks
one after another), device-side queues in global memory with cudaMemcpy per message (a
driver call per message is what the persistent kernel exists to avoid).
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

from ..exceptions import (
    CUDAError,
    InvalidConfigurationError,
    KernelCompilationError,
    KernelError,
    KernelFailedError,
    KernelStateError,
    QueueClosedError,
    QueueTimeoutError,
    TypeValidationError,
)
from ._gpu import layout as L
from ._gpu.host import HostRings, Liveness, Replies
from ._gpu.spec import OPTION_NAMES as _OPTION_NAMES
from ._gpu.spec import (
    GPUKernelOptions,
    GPUKernelStatistics,
    check_spec,
    normalize_state,
)
from .config import RingKernelConfig
from .fast_queue import FastMessageQueue
from .kernel import KernelFunc, RingKernel
from .states import KernelState

if TYPE_CHECKING:
    from ..decorators.ring_kernel import RingKernelMeta
    from ._gpu.resources import DeviceActor
    from .runtime import RingKernelRuntime

__all__ = (
    "STATUS_OK",
    "GPUKernelOptions",
    "GPUKernelStatistics",
    "GPURingKernel",
    "check_gpu_kernel_spec",
    "compile_gpu_kernel_cuda_c",
    "compile_gpu_kernel_ptx",
    "prepare_gpu_kernel",
    "reserve_gpu_memory",
)

logger = logging.getLogger("pydotcompute")

#: The status a handler returns to publish its reply; anything else rejects the message.
STATUS_OK = 0

_UNBOUNDED = 1 << 30


def check_gpu_kernel_spec(meta: RingKernelMeta, fn: Any) -> None:
    """Validate a ``@ring_kernel(..., backend="cuda")`` declaration at decoration time.

    Raises:
        TypeValidationError: a message type without a fixed layout, or a handler that is
            not ``handler(inp, out, state) -> int``.
        InvalidConfigurationError: unknown or invalid GPU options, ``grid_size != 1``.

    Ray placement options (``num_gpus``, ...) are not GPU-tier options: they are left to
    the runtime (a Ray runtime uses them, an in-process one ignores them).
    """
    from .runtime import PLACEMENT_OPTIONS

    check_spec(
        meta.kernel_id,
        fn,
        meta.input_type,
        meta.output_type,
        grid_size=meta.grid_size,
        block_size=meta.block_size,
        extra={k: v for k, v in meta.extra.items() if k not in PLACEMENT_OPTIONS},
        restart=meta.restart,
    )


def reserve_gpu_memory(mapped_mb: float, device_mb: float = 0.0, device_id: int = 0) -> None:
    """Set aside ring (mapped host) and state (device) memory for GPU actors up front.

    GPU actors take their rings and state from two slabs that grow only while no GPU actor
    runs (allocating may synchronize the device, which would wait for the running kernels
    forever). The slabs grow by ``PYDOTCOMPUTE_GPU_SLAB_MB`` MiB (default 64) on demand;
    call this before the first actor starts when more actors must start beside running
    ones than that holds.

    Raises:
        CUDAError: GPU actors are running already.
        InvalidConfigurationError: a negative size.
    """
    if mapped_mb < 0 or device_mb < 0:
        raise InvalidConfigurationError(
            f"reserve_gpu_memory sizes must be >= 0 MiB, got mapped_mb={mapped_mb!r}, "
            f"device_mb={device_mb!r}"
        )
    from ._gpu.resources import reserve_memory

    reserve_memory(int(mapped_mb * (1 << 20)), int(device_mb * (1 << 20)), device_id)


def prepare_gpu_kernel(
    handler: Any,
    input_type: type,
    output_type: type,
    *,
    state: Any = None,
    cooperative: bool = False,
    block_size: int = 32,
    device_id: int = 0,
    cuda_source: str | None = None,
    handler_name: str = "handle",
) -> str:
    """Compile a handler's persistent kernel and load it onto the GPU now.

    Loading a module beside running persistent kernels may synchronize the device, which
    waits for them forever. Call this for every handler (with a state of the same dtype
    and shape as the actors will use) before the first GPU actor starts; actors launched
    later with the same handler and layouts reuse the loaded kernel. Under the CUDA
    simulator it only checks the declaration.

    Returns:
        The flavour: ``"numba"``, ``"cuda_c"`` or ``"simulator"``.

    Raises:
        KernelCompilationError: the handler does not compile.
        BackendNotAvailableError: no GPU (and the simulator is off).
    """
    extra: dict[str, Any] = {"cooperative": cooperative, "device_id": device_id}
    if cuda_source is not None:
        extra.update(cuda_source=cuda_source, handler_name=handler_name)
    opts, in_dt, out_dt = check_spec(
        "<prepare>",
        handler,
        input_type,
        output_type,
        grid_size=1,
        block_size=block_size,
        extra=extra,
    )
    from ._gpu.resources import DeviceActor

    dev = DeviceActor(
        name="pydotcompute-gpu:<prepare>",
        handler=handler,
        cuda_source=opts.cuda_source,
        handler_name=opts.handler_name,
        in_name=input_type.__name__,
        out_name=output_type.__name__,
        in_dtype=in_dt,
        out_dtype=out_dt,
        state=normalize_state("<prepare>", state),
        cooperative=opts.cooperative,
        block_size=block_size,
        ring_in=1,
        ring_out=1,
        max_backoff_ns=opts.max_backoff_ns,
        drop_when_full=False,
        device_id=opts.device_id,
    )
    try:
        dev.compile()
    finally:
        dev.release()
    return dev.flavour


def compile_gpu_kernel_ptx(
    handler: Any,
    input_type: type,
    output_type: type,
    *,
    state: Any = None,
    cooperative: bool = False,
    cc: tuple[int, int] = (8, 0),
) -> str:
    """Compile the persistent kernel around a Python handler to PTX, without a GPU.

    Run it outside the simulator (Numba's ``compile_ptx`` is not available there); CI uses
    it to prove that a handler compiles for the device.

    Raises:
        KernelCompilationError: Numba rejected the handler (the text carries its error).
    """
    _, in_dt, out_dt = check_spec(
        "<compile>", handler, input_type, output_type, grid_size=1, block_size=32, extra={}
    )
    from ._gpu import build

    arr = _state_host(normalize_state("<compile>", state))
    return build.compile_ptx(handler, in_dt, out_dt, arr, cooperative=cooperative, cc=cc)


def compile_gpu_kernel_cuda_c(
    cuda_source: str,
    input_type: type,
    output_type: type,
    *,
    handler_name: str = "handle",
    state: Any = None,
    cooperative: bool = False,
    cc: tuple[int, int] = (8, 0),
) -> tuple[str, str]:
    """Generate the CUDA C persistent kernel around ``cuda_source`` and compile it to PTX
    with NVRTC (no GPU needed). Returns ``(source, ptx)``.

    Raises:
        KernelCompilationError: NVRTC rejected the source (the text carries its log).
    """
    extra = {"cuda_source": cuda_source, "handler_name": handler_name}
    _, in_dt, out_dt = check_spec(
        "<compile>", None, input_type, output_type, grid_size=1, block_size=32, extra=extra
    )
    from ._gpu import cuda_c

    arr = _state_host(normalize_state("<compile>", state))
    src = cuda_c.generate_source(
        cuda_source,
        handler_name,
        input_type.__name__,
        in_dt,
        output_type.__name__,
        out_dt,
        arr.dtype,
        arr.size,
        cooperative=cooperative,
    )
    return src, cuda_c.ptx(src, cc)


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

    __slots__ = (
        "_dev",
        "_fwd_backlog",
        "_lat_seen",
        "_last_health",
        "_live",
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
        # the runtime's tier-1 fast paths check this flag (the GPU tier opts out)
        *(() if "_direct" in RingKernel.__slots__ else ("_direct",)),
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
        self._direct = False  # the runtime must go through _accept / receive
        self.options = opts
        self.in_dtype = in_dt
        self.out_dtype = out_dt
        self.ring_size = opts.ring_size or min(
            config.input_queue_size, config.output_queue_size, 4096
        )
        self._dev: DeviceActor | None = None
        self._rings: HostRings | None = None
        self._lat_seen = 0
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
        self.final_state: np.ndarray[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"<GPURingKernel {self.kernel_id!r} {self._state.name}>"

    # -- introspection ------------------------------------------------------------------

    @property
    def flavour(self) -> str | None:
        """``simulator``, ``numba`` or ``cuda_c`` once launched (None before)."""
        return None if self._dev is None else self._dev.flavour

    @property
    def is_idle(self) -> bool:
        r = self._rings
        if self._state is not KernelState.ACTIVE:
            return True
        if r is None or (self._inbox is not None and self._inbox._count):
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
            staged=0 if self._inbox is None else len(self._inbox),
            buffered_replies=self._replies.count,
            ring_size=self.ring_size,
        )

    def refresh_telemetry(self) -> None:
        """Copy the device counters into ``self.telemetry`` (``runtime.get_telemetry``).

        Per-message latencies come from the device's latency ring, so the histogram sees
        at most the last ``ring_size`` messages between two refreshes.
        """
        r = self._rings
        if r is None:
            return
        tel = self.telemetry
        processed = r.word(L.PROCESSED)
        for v in r.latencies(self._lat_seen, processed).tolist():
            tel.record_latency(v)
        self._lat_seen = processed
        tel.messages_processed = processed
        tel.messages_sent = self._replies_received
        # dropped: replies discarded on the device, messages the staging queue dropped
        # (drop_oldest), and messages never handled (returned by terminate / failure)
        staged_drops = 0 if self._inbox is None else self._inbox.statistics().total_dropped
        tel.messages_dropped = r.word(L.DROPPED) + staged_drops + len(self.undelivered)
        tel.error_count = r.word(L.ERRORS) + (0 if self.error is None else 1)
        if processed:
            tel.total_latency_ns = r.word(L.TOTAL_LATENCY)
            tel.max_latency_ns = r.word(L.MAX_LATENCY)
            tel.min_latency_ns = r.word(L.MIN_LATENCY)

    def state_snapshot(self) -> np.ndarray[Any, Any]:
        """A host copy of the actor's device state (``final_state`` once terminated)."""
        if self._dev is not None and self._state is not KernelState.TERMINATED:
            return self._dev.read_state()
        if self.final_state is not None:
            return self.final_state.copy()
        raise self._refuse("read the state of")

    # -- lifecycle ----------------------------------------------------------------------

    async def launch(self) -> None:
        """Phase 1: allocate the rings and state, compile, and start the persistent kernel.

        The kernel runs from here on but holds messages until `activate`.

        Raises:
            BackendNotAvailableError: no GPU (and the simulator is off), or no CuPy/NVRTC
                for a CUDA C handler.
            KernelCompilationError: the handler does not compile.
            CUDAError: the kernel did not start within ``terminate_timeout``.
        """
        self._check("launch")
        from ._gpu.resources import DeviceActor

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
        self._inbox = FastMessageQueue(
            cfg.input_queue_size, kernel_id=self.kernel_id, backpressure=cfg.backpressure_strategy
        )
        self._live = Liveness(time.monotonic())
        self._state = KernelState.LAUNCHED
        self._pump_task = asyncio.get_running_loop().create_task(
            self._pump(), name=f"pydotcompute:{self.kernel_id}"
        )

    async def activate(self) -> None:
        """Phase 2: let the kernel take messages (LAUNCHED -> ACTIVE); waits for its ack."""
        self._check("activate")
        await self._set_active(1, "activate")
        self._state = KernelState.ACTIVE

    async def deactivate(self) -> None:
        """Pause (ACTIVE -> DEACTIVATED). Once this returns the kernel takes no message;
        queued ones stay in the ring."""
        self._check("deactivate")
        await self._set_active(0, "deactivate")
        self._state = KernelState.DEACTIVATED

    async def reactivate(self) -> None:
        """Resume (DEACTIVATED -> ACTIVE)."""
        self._check("reactivate")
        await self._set_active(1, "reactivate")
        self._state = KernelState.ACTIVE

    async def _set_active(self, value: int, operation: str) -> None:
        assert self._rings is not None
        self._rings.set_word(L.ACTIVE, value)
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
                self._fail(err)
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
                self._fail(err)
                raise KernelFailedError(self.kernel_id, err) from err
            await asyncio.sleep(delay)
            delay = min(delay * 2 or 1e-5, 2e-3)

    async def terminate(self, timeout: float | None = None) -> list[Any]:
        """Drain, stop the kernel and wait for its acknowledgement; returns what was left.

        An active (or deactivated) kernel first processes what is queued, for up to
        ``timeout`` seconds (default ``config.drain_timeout``); messages still unprocessed
        then are returned, kept in ``undelivered`` and counted as dropped. Replies stay
        receivable until drained; the final state is kept in ``final_state``.

        Raises:
            KernelStateError: the kernel did not acknowledge termination within
                ``terminate_timeout`` (it is then FAILED, and its memory is kept alive
                because a hung kernel may still use it).
        """
        self._check("terminate")
        if timeout is None:
            timeout = self.config.drain_timeout
        prev = self._state
        self._state = KernelState.TERMINATING
        self._stopping = True
        if self._inbox is not None:
            self._inbox.close(QueueClosedError(f"kernel {self.kernel_id!r} is terminating"))
        dev, r = self._dev, self._rings
        hung: KernelStateError | None = None
        if dev is not None and r is not None:
            if prev in (KernelState.ACTIVE, KernelState.DEACTIVATED):
                r.set_word(L.ACTIVE, 1)
                self._kick()
                await self._drain(timeout)
            r.set_word(L.TERMINATE, 1)
            tt = self.options.terminate_timeout
            if await self._wait_finished(tt):
                failure = dev.failure()
                if failure is not None:
                    self._fail(failure)
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
        left = self._leftovers(hung is None)
        if left:
            self.undelivered.extend(left)
            logger.warning(
                "kernel %r terminated with %d undelivered message(s) (counted as dropped)",
                self.kernel_id,
                len(left),
            )
        self._fail_waiters(
            KernelStateError(self.kernel_id, KernelState.TERMINATED, "send to", "it was terminated")
        )
        self._wake_all(self._space_waiters)
        if self._replies_closed is None:
            self._replies_closed = KernelStateError(
                self.kernel_id,
                KernelState.TERMINATED,
                "receive from",
                "it was terminated and its outbox is drained",
            )
        self._wake_all(self._recv_waiters)
        if dev is not None:
            self.refresh_telemetry()
            if hung is None:
                self.final_state = dev.read_state()
            dev.release()  # kept alive instead while the kernel may still run
        if hung is not None:
            self._fail(TimeoutError(str(hung)))
            if prev is not KernelState.FAILED:
                raise hung
            logger.error("kernel %r: %s", self.kernel_id, hung)
        self._state = KernelState.TERMINATED
        return left

    async def _drain(self, seconds: float) -> None:
        """Wait until every staged and published request was handled and replied."""
        dev, r = self._dev, self._rings
        assert dev is not None
        assert r is not None
        deadline = time.monotonic() + seconds
        delay = 0.0
        while time.monotonic() < deadline and self._state is not KernelState.FAILED:
            staged = self._inbox._count if self._inbox is not None else 0
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

    def _leftovers(self, device_stopped: bool) -> list[Any]:
        """Messages never handled: those left in the ring, then those still staged."""
        left: list[Any] = []
        if self._rings is not None and device_stopped:
            recs = self._rings.unconsumed()
            if len(recs):
                left = list(self.input_type.from_records(recs))  # type: ignore[union-attr]
        if self._inbox is not None:
            staged = self._inbox.drain()
            left.extend(staged)
        return left

    def _fail(self, exc: BaseException) -> None:
        """The kernel faulted, hung or exited: FAILED, and everyone waiting learns why."""
        if self._state in (KernelState.FAILED, KernelState.TERMINATED):
            return
        self.error = exc
        self._state = KernelState.FAILED
        self.telemetry.last_error = f"{type(exc).__name__}: {exc}"
        logger.error("GPU kernel %r failed: %r", self.kernel_id, exc)
        err = KernelFailedError(self.kernel_id, exc)
        err.__cause__ = exc
        if self._rings is not None:
            self._rings.set_word(L.TERMINATE, 1)  # a live kernel leaves its loop
        if self._inbox is not None:
            self._inbox.close(err)
            self.undelivered.extend(self._inbox.drain())
        self._fail_waiters(err)
        self._replies_closed = err
        self._wake_all(self._recv_waiters)
        self._wake_all(self._space_waiters)
        self._pump_stop = True
        self._kick()
        if self._forward is None and self._runtime is not None:
            self._runtime._on_kernel_failed(self)

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

    def _reply_room(self) -> int:
        if self._stopping or self._forward is not None or self._waiters:
            return _UNBOUNDED
        return self.config.output_queue_size - self._replies.count

    def _busy(self) -> bool:
        """Work in flight that the pump must watch (a full reply buffer waits for receive)."""
        r = self._rings
        assert r is not None
        if (self._inbox is not None and self._inbox._count) or self._fwd_backlog:
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
            self._fail(exc)

    def _poll(self) -> bool:
        """One pass: collect replies, refill the ring from the staging queue."""
        progressed = self._collect(4096)
        inbox, r = self._inbox, self._rings
        if inbox is not None and inbox._count and r is not None:
            room = r.room()
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
        return True

    def _deliver(self, recs: np.ndarray[Any, Any], stats: np.ndarray[Any, Any]) -> None:
        """Route replies: rejected ones to their waiter as errors, correlated ones to their
        ``send_and_receive`` caller, the rest onward (``connect``) or to the reply buffer."""
        out_t: Any = self.output_type
        waiters = self._waiters
        bad = stats != 0
        if bad.any():
            for rec, status in zip(recs[bad], stats[bad], strict=True):
                cid = uuid.UUID(int=(int(rec["_cid_hi"]) << 64) | int(rec["_cid_lo"]))
                text = f"the handler rejected message {cid} with status {int(status)}"
                self.telemetry.last_error = text
                fut = waiters.pop(cid, None)
                if fut is not None and not fut.done():
                    fut.set_exception(KernelError(f"GPU kernel {self.kernel_id!r}: {text}"))
            recs = recs[~bad]
        if waiters and len(recs):
            keep = np.ones(len(recs), dtype=bool)
            for k in range(len(recs)):
                rec = recs[k]
                cid = uuid.UUID(int=(int(rec["_cid_hi"]) << 64) | int(rec["_cid_lo"]))
                fut = waiters.pop(cid, None)
                if fut is not None:
                    keep[k] = False
                    if not fut.done():
                        fut.set_result(out_t.from_records(recs[k : k + 1])[0])
            recs = recs[keep]
        if not len(recs):
            return
        if self._forward is not None:
            self._fwd_backlog.extend(out_t.from_records(recs))
            return
        self._replies.push(recs)
        self._wake_all(self._recv_waiters)

    async def _forward_replies(self) -> None:
        target = self._forward
        backlog = self._fwd_backlog
        while backlog and target is not None:
            await target._accept(backlog[0], None)
            backlog.popleft()

    def _health(self, now: float) -> None:
        """The watchdog: a kernel that exited, faulted or stopped making progress FAILs."""
        dev, r = self._dev, self._rings
        if dev is None or r is None or self._state in (KernelState.FAILED, KernelState.TERMINATED):
            return
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
                self._fail(dev.failure() or RuntimeError("the persistent kernel exited on its own"))
                return
        wd = self.options.watchdog_timeout
        pending = r.in_flight()
        if wd is not None and pending and r.word(L.ACTIVE) and live.stalled_for(now) > wd:
            text = live.describe(self.kernel_id, wd, pending, r.word(L.PROCESSED), now)
            self._fail(TimeoutError(text))

    # -- sending ------------------------------------------------------------------------

    def _sendable(self) -> tuple[FastMessageQueue[Any], HostRings]:
        inbox, r = self._inbox, self._rings
        if inbox is None or r is None or inbox._closed or self._stopping:
            raise self._refuse("send to")
        return inbox, r

    async def _accept(self, msg: Any, timeout: float | None) -> None:
        """Validate ``msg``; publish it now when nothing is staged ahead of it, else stage."""
        self._validate_in(msg)
        inbox, r = self._sendable()
        if not inbox._count and r.room() > 0:
            r.publish(self.input_type.to_records((msg,)))  # type: ignore[union-attr]
        else:
            try:
                await inbox.put(msg, timeout=timeout)
            except QueueClosedError:
                raise self._refuse("send to") from None
        self._kick()

    def _accept_nowait(self, msg: Any) -> None:
        self._validate_in(msg)
        inbox, r = self._sendable()
        if not inbox._count and r.room() > 0:
            r.publish(self.input_type.to_records((msg,)))  # type: ignore[union-attr]
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
        k = min(len(msgs), r.room()) if not inbox._count else 0
        if k:
            r.publish(self.input_type.to_records(msgs[:k]))  # type: ignore[union-attr]
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
            room = r.room() if not inbox._count else 0
            if room > 0:
                k = min(room, len(records) - sent)
                r.publish(records[sent : sent + k])
                sent += k
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

    # -- receiving ----------------------------------------------------------------------

    def _take(self, n: int) -> np.ndarray[Any, Any]:
        if type(n) is not int or n < 1:
            raise InvalidConfigurationError(f"max_count must be an int >= 1, got {n!r}")
        recs = self._replies.pop(n)
        self._kick()  # room for more replies
        return recs

    async def _wait_reply(self, timeout: float | None) -> None:
        """Wait until a reply is buffered (or raise the close reason or a timeout)."""
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
            KernelStateError: it was terminated and its replies are drained.
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


async def compile_within(dev: Any, limit: float | None) -> bool:
    """Run ``dev.compile()`` in a worker thread; False when it outlasts ``limit`` seconds.

    A thread cannot be stopped: past the limit the compile runs on, marked
    (``mark_compiling``) so that ``release`` waits, and ``dev.release()`` runs once it ends.
    """
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(None, dev.compile)
    done, _ = await asyncio.wait({fut}, timeout=limit)
    if done:
        fut.result()  # the compile's own error, if any
        return True
    dev.mark_compiling(True)

    def finished(f: asyncio.Future[Any]) -> None:
        dev.mark_compiling(False)
        if not f.cancelled():
            f.exception()  # retrieved: the launch already failed with the timeout
        dev.release()

    fut.add_done_callback(finished)
    return False


def _state_host(state: Any) -> np.ndarray[Any, Any]:
    """The host array describing a state (a buffer's host side, or the array itself)."""
    return np.asarray(state.host) if hasattr(state, "ensure_on_device") else np.asarray(state)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _no_python_handler(ctx: Any) -> None:  # pragma: no cover - never called
    raise RuntimeError("a CUDA C handler runs on the device only")
