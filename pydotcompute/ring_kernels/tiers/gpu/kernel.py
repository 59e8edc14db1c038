"""GPU-resident ring kernels: one persistent CUDA kernel per actor, fed through mapped rings.

How the tier fits the contract: the GPU tier is a `TierWorker` behind the one bridge, like
the thread and process tiers. `GPURingKernel` is a `HostedKernel` (the bridge: banded
inbox, outbox, correlation, forwarding, drop accounting, hand-back) that builds a
`GPUWorker` (``worker.py``: the rings, the device steps and the task that watches them)
and adds the device's side of the verbs the bridge does not own: launch compiles and starts
the persistent kernel, deactivate/reactivate flip ``ACTIVE`` and wait for the kernel's
acknowledgement, a kernel that does not acknowledge TERMINATE fails instead of ending.
Device code, memory, launching, ring mechanics and option checks live beside this module
in `tiers/gpu/`.

What runs where:

```text
event loop (host)                            mapped pinned host memory       GPU
-----------------                            -------------------------       ---
send -> banded inbox -> bridge pump -------> inbox ring [slots]              one block loops:
        (or straight into the ring)          ctl: DOORBELL (tail, flags) ->  poll, handle,
device monitor: replies ready? ------------- outbox ring, ctl[OUT_TAIL] <--  write reply,
bridge: poll -> caller / connected kernel / outbox   ctl: counters           publish
```

The kernel is launched once (``launch``) on a non-blocking stream and loops until the control
block says TERMINATE; ``activate``/``deactivate``/``reactivate`` flip ``ACTIVE`` and wait
for the kernel's acknowledgement (``ACTIVE_ACK``); ``terminate`` drains, sets TERMINATE and
waits for ``TERMINATED`` with a timeout. Nothing is relaunched per message. The host side
is the bridge's two tasks plus one monitor task per kernel (``worker.py``), which spins
only while messages are in flight and parks on a future otherwise. Sends write the ring
directly when nothing is queued ahead (the bridge's direct path), so a round trip costs no
task switch on the send side.

Memory-ordering argument (inbox; the outbox is the mirror image with roles swapped):

1. The host writes a slot's bytes (NumPy stores into mapped memory), then a full fence
   (acquiring the rings' lock: a locked instruction on x86-64), then stores ``IN_TAIL``
   and the ``DOORBELL`` word (``IN_TAIL << 2 | TERMINATE << 1 | ACTIVE``, composed under
   that lock: the loop publishes, a stop in a worker thread sets TERMINATE). On x86-64
   (TSO) stores become visible in program order anyway; the fence also stops the
   interpreter/compiler side from reordering.
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
driver call per message is what the persistent kernel exists to avoid), a reply buffer of
records beside the bridge's outbox (the GPU tier had one: it made the tier repeat the
bridge's correlation, forwarding and drop counting; `receive_records` now converts the
replies it takes, a cost only that path pays).

Drops are the bridge's: a message the handler rejected (a `HandlerRejectedError`, reason
``rejected``), a reply nobody waits for, a reply a connected kernel refused, messages
handed back. The one drop the device makes itself, a reply discarded under
``outbox_full="drop"``, is counted (reason ``outbox_full``) when telemetry is read and at
terminate, from the device's counter.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ....exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    QueueTimeoutError,
    TypeValidationError,
)
from ...config import RingKernelConfig
from ...hosted import HostedKernel
from ...kernel import KernelFunc
from ...states import KernelState
from ..contract import TierWorker
from . import layout as L
from .host import HostRings
from .spec import OPTION_NAMES as _OPTION_NAMES
from .spec import GPUKernelOptions, GPUKernelStatistics, check_spec
from .worker import GPUWorker, HandlerRejectedError

if TYPE_CHECKING:
    from ...runtime import RingKernelRuntime
    from .resources import DeviceActor

__all__ = (
    "STATUS_OK",
    "GPUKernelOptions",
    "GPUKernelStatistics",
    "GPURingKernel",
    "HandlerRejectedError",
)

logger = logging.getLogger("pydotcompute")

#: The status a handler returns to publish its reply; anything else rejects the message.
STATUS_OK = 0


class GPURingKernel(HostedKernel):
    """A ring kernel whose handler runs in a persistent CUDA kernel (tier ``gpu``).

    Built by ``runtime.launch(..., tier="gpu")`` or from a ``@ring_kernel(...,
    backend="cuda")`` declaration; ``kernel_func`` is the handler
    ``handler(inp, out, state) -> int`` (a Python function compiled as a Numba CUDA device
    function) unless the ``cuda_source`` option supplies it in CUDA C. The interface is
    `RingKernel`'s (through the hosting bridge, as on the thread and process tiers);
    `send_batch` / `send_records` and `receive_batch` / `receive_records` move many
    messages per publish. Every method runs on the event loop that launched the kernel.
    """

    EXTRA_OPTIONS: frozenset[str] = _OPTION_NAMES
    #: Its capabilities are the worker's (`GPUWorker.CAPABILITIES`): the handler is checked
    #: by the tier itself, and restart and pools are refused at launch.
    WORKER = GPUWorker

    __slots__ = ("_failed_before", "_gpu", "in_dtype", "options", "out_dtype", "ring_size")

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
        replicas = config.extra.get("replicas", 1)
        if replicas != 1:
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: replicas={replicas} is not supported on the gpu tier "
                "(each GPU actor is one persistent kernel with its own rings and state); "
                "launch several GPU kernels under their own ids, or run the pool on the "
                "asyncio, thread or process tier"
            )
        config.tier = "gpu"
        config.backend = "cuda"
        # the banded inbox holds message objects (records are made as they are published)
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
        ring_size = opts.ring_size or min(config.input_queue_size, config.output_queue_size, 4096)
        # the bridge's width is the tier's own option (default: the whole ring), fixed: the
        # bridge widens only a width nobody chose, and here the ring is the choice
        config.extra = {
            **config.extra,
            "bridge_queue_size": min(opts.bridge_queue_size or ring_size, ring_size),
        }
        super().__init__(
            kernel_id,
            kernel_func if kernel_func is not None else _no_python_handler,
            config=config,
            input_type=input_type,
            output_type=output_type,
            runtime=runtime,
            enable_telemetry=enable_telemetry,
        )
        self.options = opts
        self.in_dtype = in_dt
        self.out_dtype = out_dt
        self.ring_size = ring_size
        self._gpu: GPUWorker | None = None
        self._failed_before = False

    def __repr__(self) -> str:
        return f"<GPURingKernel {self.kernel_id!r} {self._state.name}>"

    # -- introspection ------------------------------------------------------------------

    @property
    def flavour(self) -> str | None:
        """``simulator``, ``numba`` or ``cuda_c`` once launched (None before)."""
        return None if self._gpu is None else self._gpu.flavour

    @property
    def device(self) -> DeviceActor | None:
        """The device actor (memory, stream, persistent kernel) once launched."""
        return None if self._gpu is None else self._gpu.device

    @property
    def rings(self) -> HostRings | None:
        """The host views of the rings and control block while the kernel holds its
        memory (None before launch and after terminate)."""
        return None if self._gpu is None else self._gpu.rings

    @property
    def final_state(self) -> np.ndarray[Any, Any] | None:
        """The actor's device state as it was when the kernel ended (None before)."""
        return None if self._gpu is None else self._gpu.final_state

    def control_word(self, index: int) -> int:
        """One control-block word (``layout.py``: a device counter or flag), read live
        while the kernel runs and from the copy taken when it stopped afterwards."""
        return 0 if self._gpu is None else self._gpu.word(index)

    def statistics(self) -> GPUKernelStatistics:
        """A frozen snapshot of the device counters and host-side occupancy."""
        gpu = self._gpu
        w = self.control_word
        inbox, outbox = self._inbox, self._outbox
        return GPUKernelStatistics(
            flavour=self.flavour or "not launched",
            processed=w(L.PROCESSED),
            replies_received=0 if gpu is None else gpu.replies_taken,
            errors=w(L.ERRORS),
            dropped=w(L.DROPPED),
            outbox_full_events=w(L.OUTBOX_FULL),
            last_status=w(L.LAST_STATUS),
            last_latency_ns=w(L.LAST_LATENCY),
            min_latency_ns=w(L.MIN_LATENCY),
            max_latency_ns=w(L.MAX_LATENCY),
            total_latency_ns=w(L.TOTAL_LATENCY),
            heartbeat=w(L.HEARTBEAT),
            in_flight=0 if gpu is None else gpu.pending_input,
            staged=0 if inbox is None else len(inbox),
            buffered_replies=0 if outbox is None else len(outbox),
            ring_size=self.ring_size,
        )

    def refresh_telemetry(self) -> None:
        """Fold the device's per-message latencies into ``self.telemetry`` and count the
        replies it discarded (``runtime.get_telemetry`` calls it).

        The latency ring keeps the last ``ring_size`` messages, so the histogram sees at
        most that many between two refreshes.
        """
        super().refresh_telemetry()
        self._count_device_drops()

    def _count_device_drops(self) -> None:
        gpu = self._gpu
        n = 0 if gpu is None else gpu.take_device_drops()
        if n:
            self._count_dropped(n, "outbox_full")
        n = 0 if gpu is None else gpu.take_edge_rejections()
        if n:  # rejected while the replies went into a device edge: no error reached us
            self._count_dropped(n, "rejected")

    def state_snapshot(self) -> np.ndarray[Any, Any]:
        """A host copy of the actor's device state (``final_state`` once terminated)."""
        gpu = self._gpu
        snap = None if gpu is None else gpu.snapshot_state()
        if snap is None:
            raise self._refuse("read the state of")
        return snap

    # -- the device's side of the verbs ---------------------------------------------------

    def _make_contexts(self) -> list[Any]:
        """None: no Python actor runs on the loop (the handler runs on the device)."""
        return []

    async def _place_launch(self) -> None:
        """`launch`'s device step: allocate the rings and state, compile, and start the
        persistent kernel, which holds messages until `activate` (`GPUWorker.boot`)."""
        cfg = self.config
        gpu = GPUWorker(
            self.kernel_id,
            self._func,
            options=self.options,
            input_type=self.input_type,
            output_type=self.output_type,
            in_dtype=self.in_dtype,
            out_dtype=self.out_dtype,
            ring_size=self.ring_size,
            block_size=cfg.block_size,
            room=int(cfg.extra["bridge_queue_size"]),
        )
        await gpu.boot(self._device_failed)
        self._gpu = gpu

    def _make_worker(self, bridge: int) -> TierWorker:
        gpu = self._gpu
        assert gpu is not None  # booted by `_place_launch`
        gpu.set_room(bridge)
        return gpu

    async def activate(self) -> None:
        """Let the kernel take messages (``ACTIVE``, acknowledged by the device), then
        start the bridge. A kernel that fails to acknowledge is FAILED."""
        try:
            await super().activate()
        except KernelFailedError as exc:
            if self._state is KernelState.LAUNCHED:  # (no collector runs to report it)
                self._fail(exc.error if exc.error is not None else exc)
            raise

    async def _place_set_active(self, active: bool, operation: str) -> None:
        """The device step of `deactivate`/`reactivate`: flip ``ACTIVE`` and wait for the
        kernel's acknowledgement (once deactivated, it takes no message; what is in its
        inbox ring stays there)."""
        gpu = self._gpu
        if gpu is not None:
            await gpu.set_active(active, operation)

    async def terminate(self, timeout: float | None = None) -> list[Any]:
        """Drain into the device and stop it (see `HostedKernel.terminate`). A kernel that
        does not acknowledge TERMINATE within ``terminate_timeout`` is FAILED instead, and
        ``KernelStateError`` says so (its memory is kept alive: it may still use it)."""
        gpu = self._gpu
        self._failed_before = self._state is KernelState.FAILED
        if gpu is not None and self._state in (KernelState.ACTIVE, KernelState.DEACTIVATED):
            gpu.resume()  # a deactivated kernel drains what the bridge still hands it
        try:
            return await super().terminate(timeout)
        finally:
            if gpu is not None:
                await gpu.join_monitor()

    def _finish_termination(self, left: list[Any]) -> list[Any]:
        self._count_device_drops()
        gpu = self._gpu
        hung = None if gpu is None else gpu.hung
        if gpu is None or hung is None:
            failure = None if gpu is None else gpu.failure
            if failure is not None and self.error is None:  # it faulted while draining
                self.error = failure
                self.telemetry.record_error(failure)
            return super()._finish_termination(left)
        # the kernel did not acknowledge TERMINATE: what it may still read is lost
        lost = gpu.pending_input
        if lost:
            self.telemetry.record_drop(lost, "lost")
            if self._timed:
                self.telemetry.messages_processed -= lost
        self.hand_back(left)
        if self._failed_before:
            self._state = KernelState.FAILED
            logger.error("kernel %r: %s", self.kernel_id, hung)
            return left
        self._fail(TimeoutError(str(hung)))
        raise hung

    def _device_failed(self, exc: BaseException) -> None:
        """The worker's monitor found the kernel faulted, hung or exited. Once activated
        the bridge's collector reports it; before, nobody polls, so it fails here."""
        if self._state is KernelState.LAUNCHED:
            self._fail(exc)

    def _place_failed(self, exc: BaseException) -> list[Any]:
        """`_fail`'s device step: the failure is recorded and a live kernel told to leave
        its loop; what its ring still holds is handed back when it is stopped."""
        self.telemetry.record_error(exc)
        gpu = self._gpu
        if gpu is not None:
            gpu.abort()
        return []

    # -- many messages at once -------------------------------------------------------------

    def _check_sendable(self) -> None:
        inbox = self._inbox
        if inbox is None or inbox.closed or self._stopping:
            raise self._refuse("send to")

    async def send_batch(self, msgs: Sequence[Any], timeout: float | None = None) -> int:
        """Send many messages; those that fit in the ring are published with one tail store
        when nothing is queued ahead, the rest are sent one by one.

        Returns:
            How many were accepted (``len(msgs)`` unless the inbox rejects).
        """
        for m in msgs:
            self._validate_in(m)
        self._check_sendable()
        batch = list(msgs)
        k = self._hand_over_many(lambda worker: worker.offer_many(batch), batch) if batch else 0
        for m in batch[k:]:
            await self.send(m, timeout)
        return len(batch)

    async def send_records(
        self,
        records: np.ndarray[Any, Any],
        timeout: float | None = None,
    ) -> int:
        """Send a structured array in ``input_type.dtype`` layout straight into the ring.

        The fastest path: no message objects, one copy and one tail store per free run of
        slots. Waits for room (up to ``timeout`` seconds), and while messages sent before
        wait in the inbox. Records with zero ``_mid_*`` get replies with zero ``_cid_*``.

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
            self._check_sendable()
            gpu = self._gpu
            assert gpu is not None
            k = self._hand_over_many(functools.partial(_offer_records, gpu, records[sent:]))
            if k:
                sent += k
                continue
            if deadline is not None and loop.time() >= deadline:
                raise QueueTimeoutError(
                    f"timed out after {timeout}s waiting for a free slot in the inbox ring of "
                    f"kernel {self.kernel_id!r} ({sent} of {len(records)} records sent)"
                )
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - loop.time()))
            await gpu.wait_for_room(wait)
        return sent

    async def receive_batch(self, max_count: int, timeout: float | None = None) -> list[Any]:
        """Up to ``max_count`` replies: waits for the first (as `receive`), then takes
        what is in the outbox."""
        if type(max_count) is not int or max_count < 1:
            raise InvalidConfigurationError(f"max_count must be an int >= 1, got {max_count!r}")
        first = await self.receive(timeout)
        out = self._outbox
        rest = [] if out is None or max_count == 1 else out.get_batch(max_count - 1)
        return [first, *rest]

    async def receive_records(
        self,
        max_count: int,
        timeout: float | None = None,
    ) -> np.ndarray[Any, Any]:
        """Up to ``max_count`` replies as a structured array (``output_type.dtype``)."""
        replies = await self.receive_batch(max_count, timeout)
        return self.output_type.to_records(replies)  # type: ignore[union-attr, no-any-return]


#: The name the tier registry loads (``tier="gpu"``).
GPUKernel = GPURingKernel


def _offer_records(gpu: GPUWorker, records: np.ndarray[Any, Any], _worker: TierWorker) -> int:
    """`send_records`' hand-over: records go to the GPU worker itself (records are no
    message objects: the instruments are not told of them one by one)."""
    return gpu.offer_records(records)


async def _no_python_handler(ctx: Any) -> None:  # pragma: no cover - never called
    raise RuntimeError("a CUDA C handler runs on the device only")
