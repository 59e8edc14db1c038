"""The device side of one GPU actor: memory, compilation, launch, liveness, release.

Three flavours share this interface:

* ``simulator`` — NumPy arrays stand in for mapped memory and the kernel runs in threads
  (``simlaunch``);
* ``numba`` — rings in mapped pinned memory (``cuda.mapped_array``), state in device
  memory, the Numba kernel launched once on a non-blocking stream;
* ``cuda_c`` — the same memory, a CUDA C kernel compiled by NVRTC and launched through a
  CuPy ``RawModule`` on a non-blocking CuPy stream.

A persistent kernel never finishes on its own, so it must not sit on a stream that
synchronizes with the legacy default stream (every synchronous copy would wait for it):
streams are created non-blocking, and when none can be made the launch is refused rather
than put on a blocking stream. Freeing device or pinned memory is implicitly
device-synchronizing in CUDA, and would wait for *every* running persistent kernel, and
so may allocating it: rings, control blocks and state are carved from slabs (`slab.py`) that
grow only while no GPU actor runs, and go back to the slab, not to CUDA, when an actor ends.
What else an actor holds (streams, events, modules) is parked in a graveyard and freed only
when no GPU actor is running, and Numba's own deferred frees are held back
(`defer_cleanup`) for as long as one runs.

Module loading can synchronize too (lazy loading, the default since CUDA 12.2, loads a
kernel at its first launch, beside the kernels already running): `CUDA_MODULE_LOADING`
defaults to `EAGER` for the process when the GPU tier is the first to touch CUDA, and
`compile` loads the module and resolves the kernel (`bind`, then `cuKernelGetFunction`
where numba-cuda uses the context-independent library API) before `start` launches it.

Liveness fails closed: "has the kernel finished?" is answered True only by the event or by
a sticky context error (an illegal address, a launch failure: the context is gone, and the
kernel with it). Any other error while asking means "still running", so memory a kernel may
still use is never freed on a guess. At interpreter exit, every kernel still running is
told to terminate (an abandoned persistent kernel would hold up process exit).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import re
import threading
import time
import weakref
from typing import Any

import numpy as np

from ....backends import device_sync
from ....exceptions import (
    BackendNotAvailableError,
    CUDAError,
    KernelCompilationError,
    TypeValidationError,
)
from . import layout as L
from .edge import EdgeArena, edge_arena
from .host import fence
from .slab import Carve, MemorySlabs, default_chunk_bytes

__all__ = (
    "STICKY_ERROR_CODES",
    "DeviceActor",
    "KernelLiveness",
    "is_sticky_error",
    "live_actor_count",
    "memory_slabs",
    "nonblocking_stream",
    "reserve_memory",
    "terminate_running_kernels",
)

logger = logging.getLogger("pydotcompute")

_graveyard: list[Any] = []
_live = 0
_live_lock = threading.Lock()
_running: weakref.WeakSet[DeviceActor] = weakref.WeakSet()
_atexit_registered = False
_deferred_cleanup: Any = None  # Numba's defer_cleanup context, held while a kernel runs
_slabs: dict[bool, MemorySlabs] = {}
_c_modules: dict[tuple[str, int], tuple[Any, Any]] = {}  # loaded CUDA C kernels, kept

#: CUDA errors after which the context is unusable (sticky): the kernel is gone with it.
#: The driver and runtime API share these numbers.
STICKY_ERROR_CODES: dict[int, str] = {
    4: "deinitialized (the driver is shutting down)",
    214: "uncorrectable ECC error",
    700: "illegal address",
    702: "launch timeout",
    709: "context destroyed",
    710: "device-side assert",
    714: "hardware stack error",
    715: "illegal instruction",
    716: "misaligned address",
    717: "invalid address space",
    718: "invalid program counter",
    719: "launch failed",
}
_STICKY_TEXT = re.compile(
    r"ILLEGAL_ADDRESS|IllegalAddress|illegal memory access|LAUNCH_FAILED|LaunchFailure|"
    r"unspecified launch failure|device-side assert|ILLEGAL_INSTRUCTION|IllegalInstruction|"
    r"MISALIGNED_ADDRESS|MisalignedAddress|HARDWARE_STACK_ERROR|ECC_UNCORRECTABLE|"
    r"CONTEXT_IS_DESTROYED|DEINITIALIZED|CudartUnloading|INVALID_PC|InvalidPc|"
    r"INVALID_ADDRESS_SPACE|LAUNCH_TIMEOUT",
)


def is_sticky_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a sticky CUDA error (the context, and every kernel in it, is gone).

    Reads the numeric code Numba (``code``) or CuPy (``status``) attach, else the error
    name or text. Anything else (a busy driver, a wrong thread, a bug) is not sticky.
    """
    for attr in ("code", "status", "error", "result"):
        value = getattr(exc, attr, None)
        try:
            code = int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if code in STICKY_ERROR_CODES:
            return True
    return bool(_STICKY_TEXT.search(f"{type(exc).__name__} {exc}"))


class KernelLiveness:
    """Asks a launch's completion event whether the kernel ended, failing closed.

    Args:
        event: A Numba event (``query()``) or a CuPy event (``done``), recorded after the
            launch on the kernel's stream.
        flavour: ``"numba"`` or ``"cuda_c"`` (which of the two to ask).
        name: For messages.
    """

    def __init__(self, event: Any, flavour: str, name: str) -> None:
        self.event = event
        self.flavour = flavour
        self.name = name
        self.fault: CUDAError | None = None
        self.last_query_error: BaseException | None = None

    def _query(self) -> bool:
        if self.flavour == "numba":
            return bool(self.event.query())
        return bool(self.event.done)

    def finished(self) -> bool:
        """True once the kernel ended, cleanly or with a sticky error; False otherwise,
        including when the question itself failed for another reason."""
        if self.fault is not None:
            return True
        try:
            return self._query()
        except Exception as exc:
            if is_sticky_error(exc):
                fault = CUDAError(f"{self.name}: the persistent kernel faulted: {exc}")
                fault.__cause__ = exc
                self.fault = fault
                return True
            if self.last_query_error is None:
                logger.warning(
                    "%s: could not ask whether the kernel finished (%r); treating it as "
                    "still running",
                    self.name,
                    exc,
                )
            self.last_query_error = exc
            return False

    def failure(self) -> CUDAError | None:
        """The sticky error that ended the kernel (None while it runs or after a clean end)."""
        self.finished()
        return self.fault


def _numba_cuda() -> Any:
    """``numba.cuda``, typed ``Any`` (Numba ships no type stubs), imported on first use."""
    from ....backends.numba_compat import import_numba_cuda

    return import_numba_cuda()


def memory_slabs(simulator: bool | None = None) -> MemorySlabs:
    """The process's ring and state memory slabs (the simulator's when it is on)."""
    if simulator is None:
        from .build import SIMULATOR

        simulator = SIMULATOR
    with _live_lock:
        slabs = _slabs.get(simulator)
        if slabs is None:
            slabs = _slabs[simulator] = MemorySlabs(simulator)
    return slabs


def reserve_memory(mapped_bytes: int, device_bytes: int, device_id: int = 0) -> None:
    """Make sure the slabs hold this much free memory before GPU actors start.

    Raises:
        CUDAError: GPU actors are running (growing a slab may synchronize the device).
    """
    if _live:
        raise CUDAError(
            f"cannot reserve GPU actor memory while {_live} GPU actor(s) run: allocating may "
            "synchronize the device, which waits for them forever; reserve before the first "
            "one starts"
        )
    slabs = memory_slabs()
    if slabs.mapped.simulator:
        slabs.reserve(mapped_bytes, device_bytes)
        return
    with _numba_cuda().gpus[device_id]:
        slabs.reserve(mapped_bytes, device_bytes)


def live_actor_count() -> int:
    """How many GPU actors of this process have a kernel that may still be running."""
    return _live


def _actor_started(actor: DeviceActor) -> None:
    global _live, _atexit_registered
    with _live_lock:
        _live += 1
        _running.add(actor)
        if not _atexit_registered:
            atexit.register(terminate_running_kernels)
            _atexit_registered = True
    device_sync.kernel_started(actor.name)


def _actor_released(actor: DeviceActor, keep: list[Any]) -> None:
    global _live
    device_sync.kernel_stopped(actor.name)
    with _live_lock:
        _live -= 1
        _running.discard(actor)
        _graveyard.extend(keep)
        if _live == 0:
            _graveyard.clear()
            _allow_cleanup()


def _defer_cleanup() -> None:
    """Hold Numba's deferred frees (``cuMemFree`` may synchronize the device) while kernels
    run; called with the actor's device current."""
    global _deferred_cleanup
    with _live_lock:
        if _deferred_cleanup is not None:
            return
        try:
            cm = _numba_cuda().defer_cleanup()
            cm.__enter__()
        except Exception as exc:  # a Numba without it: frees are still parked above
            logger.debug("numba.cuda.defer_cleanup unavailable: %r", exc)
            return
        _deferred_cleanup = cm


def _allow_cleanup() -> None:
    """Let Numba free again (the last kernel ended); called with ``_live_lock`` held."""
    global _deferred_cleanup
    cm, _deferred_cleanup = _deferred_cleanup, None
    if cm is not None:
        try:
            cm.__exit__(None, None, None)
        except Exception as exc:
            logger.debug("leaving numba.cuda.defer_cleanup failed: %r", exc)


def terminate_running_kernels(timeout: float = 2.0) -> list[str]:
    """Tell every persistent kernel of this process to leave its loop; wait up to ``timeout``.

    Registered with ``atexit`` when the first kernel starts: an abandoned persistent kernel
    (an actor never terminated) plus finalizers that free its memory can hang process exit.
    Writes TERMINATE into each running kernel's control block (host memory: no driver call).

    Returns:
        The names of the kernels still running after ``timeout`` seconds.
    """
    with _live_lock:
        actors = [a for a in _running if a.holds_memory]
    for actor in actors:
        try:
            ctl = actor.host["ctl"]
            fence()
            ctl[L.TERMINATE] = 1
            ctl[L.DOORBELL] = int(ctl[L.DOORBELL]) | L.DOORBELL_TERMINATE
        except Exception as exc:  # memory already gone: nothing to tell
            logger.debug("%s: could not write TERMINATE: %r", actor.name, exc)
    deadline = time.monotonic() + timeout
    left = actors
    while left:
        left = [a for a in left if not a.finished()]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.001)
    if left:
        logger.error(
            "%d persistent GPU kernel(s) still running at exit: %s",
            len(left),
            ", ".join(a.name for a in left),
        )
    return [a.name for a in left]


class DeviceActor:
    """Memory and kernel of one GPU actor (see the module docstring).

    Args:
        name: Thread / log name (``pydotcompute-gpu:<kernel id>``).
        handler: The Python handler (a function or a Numba device dispatcher); unused
            when ``cuda_source`` is given.
        cuda_source, handler_name, in_name, out_name: The CUDA C flavour's handler.
        in_dtype, out_dtype: Slot layouts.
        state: Initial state: a NumPy array, or an object with ``.device`` (a
            ``UnifiedBuffer``) whose device array the kernel then updates in place.
        cooperative, block_size: One thread, or a block that calls the handler together.
        ring_in, ring_out: Slot counts of the inbox and outbox rings.
        max_backoff_ns, drop_when_full: Copied into the control block.
        device_id: The CUDA device.
    """

    def __init__(
        self,
        *,
        name: str,
        handler: Any,
        cuda_source: str | None,
        handler_name: str,
        in_name: str,
        out_name: str,
        in_dtype: np.dtype[Any],
        out_dtype: np.dtype[Any],
        state: Any,
        cooperative: bool,
        block_size: int,
        ring_in: int,
        ring_out: int,
        max_backoff_ns: int,
        drop_when_full: bool,
        device_id: int,
    ) -> None:
        from . import build

        self.name = name
        self.handler = handler
        self.cuda_source = cuda_source
        self.handler_name = handler_name
        self.in_name = in_name
        self.out_name = out_name
        self.cooperative = cooperative
        self.nthreads = block_size if cooperative else 1
        self.device_id = device_id
        self.simulator = build.SIMULATOR
        if self.simulator:
            if cuda_source is not None:
                raise BackendNotAvailableError(
                    f"{name}: a CUDA C handler needs a real GPU (NVRTC and CuPy); the CUDA "
                    "simulator runs only handlers written in Python"
                )
            self.flavour = "simulator"
        else:
            self.flavour = "cuda_c" if cuda_source is not None else "numba"
            _require_gpu(device_id)
        self._state_owner = state if hasattr(state, "ensure_on_device") else None
        self._kernel: Any = None
        self._launch: Any = None
        self._event: Any = None
        self._liveness: KernelLiveness | None = None
        self._stream: Any = None
        self._keep: list[Any] = []
        self._carves: list[Carve] = []
        self._host_views: dict[str, np.ndarray[Any, Any]] = {}
        self._started = False
        self._compiling = False
        self._released = False
        self._abandoned = False
        self._slabs = memory_slabs(self.simulator)
        try:
            with self._device():
                self.inbox = self._mapped("inbox", ring_in, in_dtype)
                self.outbox = self._mapped("outbox", ring_out + 1, out_dtype)  # + scratch slot
                self.ostat = self._mapped("ostat", ring_out + 1, np.dtype(np.int64))
                self.lat = self._mapped("lat", ring_in, np.dtype(np.int64))
                self.ctl = self._mapped("ctl", L.CTL_WORDS, np.dtype(np.int64))
                self.state_dev = self._state_array(state)
                # where a batch is staged (device memory): inbox slots of a cooperative
                # block, records taken from a device edge (``edge.py``)
                n_stage = L.BATCH
                if self.simulator:
                    self.stage: Any = np.zeros(n_stage, in_dtype).view(np.recarray)
                    self.ostage: Any = np.zeros(1, out_dtype).view(np.recarray)
                else:
                    self.stage = self._take("device", n_stage, in_dtype).device
                    self.ostage = self._take("device", 1, out_dtype).device
                # the device's edge arena (a CUDA C kernel does not take edges)
                self.edge_arena: EdgeArena | None = None
                if self.flavour != "cuda_c":
                    self.edge_arena = edge_arena(device_id, self._slabs, may_grow=_live == 0)
        except BaseException:
            self._give_back_carves()
            raise
        h = self.host
        h["ctl"][L.MAX_BACKOFF_NS] = max_backoff_ns
        h["ctl"][L.OUTBOX_POLICY] = 1 if drop_when_full else 0

    # -- memory --------------------------------------------------------------------------

    def _device(self) -> Any:
        if self.simulator:
            import contextlib

            return contextlib.nullcontext()
        cuda = _numba_cuda()

        return cuda.gpus[self.device_id]

    def _take(self, kind: str, n: int, dtype: np.dtype[Any]) -> Carve:
        """``n`` zeroed elements from a slab; it grows only while no GPU actor runs."""
        slab = self._slabs.mapped if kind == "mapped" else self._slabs.device
        carve = slab.take(
            n * dtype.itemsize, dtype, may_grow=_live == 0, chunk_bytes=default_chunk_bytes()
        )
        self._carves.append(carve)
        return carve

    def _mapped(self, key: str, n: int, dtype: np.dtype[Any]) -> Any:
        """A ring or control array in mapped memory: the host view is kept under ``key``,
        the device view (what the kernel gets) is returned."""
        carve = self._take("mapped", n, dtype)
        assert carve.host is not None
        self._host_views[key] = carve.host
        return carve.device

    def _give_back_carves(self) -> None:
        carves, self._carves = self._carves, []
        for carve in carves:
            carve.release()

    @property
    def host(self) -> dict[str, np.ndarray[Any, Any]]:
        """Plain NumPy views of the mapped arrays (what the host reads and writes)."""
        return self._host_views

    def _state_array(self, state: Any) -> Any:
        owner = self._state_owner
        if owner is not None:
            if not getattr(owner, "is_allocated", True):
                owner.allocate()
            dev = owner.device
            if self.simulator:
                return np.asarray(getattr(dev, "_ary", dev))
            if not hasattr(dev, "__cuda_array_interface__"):
                raise TypeValidationError(
                    f"{self.name}: the state buffer's device side is {type(dev).__name__}, not "
                    "CUDA memory; create the UnifiedBuffer with backend='cuda'"
                )
            if self.flavour == "numba" and not hasattr(dev, "copy_to_host"):
                # a CuPy array: a Numba view of the same memory (no copy), imported once and
                # without the stream sync the interface would otherwise ask for at each launch
                self._keep.append(dev)
                return _numba_cuda().as_cuda_array(dev, sync=False)
            return dev
        if self.simulator:
            return np.array(state, copy=True)
        arr = np.ascontiguousarray(state)
        dev = self._take("device", max(1, arr.size), arr.dtype).device[: arr.size]
        dev = dev.reshape(arr.shape)
        dev.copy_to_device(arr)
        return dev

    def read_state(self) -> np.ndarray[Any, Any]:
        """A host copy of the actor's state (may be mid-update while the kernel runs)."""
        dev = self.state_dev
        if self.simulator or isinstance(dev, np.ndarray):
            return np.array(dev, copy=True)
        if hasattr(dev, "copy_to_host"):
            return dev.copy_to_host()  # type: ignore[no-any-return]
        import cupy

        return cupy.asnumpy(dev)  # type: ignore[no-any-return]

    # -- compile and launch --------------------------------------------------------------

    def _args(self) -> tuple[Any, ...]:
        # without an edge arena the kernel never routes (`edge_arena` is None): any
        # uint8 / int64 arrays stand in for the arena's two arguments
        if self.simulator:
            h = self.host
            stage_b = np.asarray(self.stage).view(np.uint8)
            arena = self.edge_arena
            return (
                h["inbox"].view(np.recarray),
                h["outbox"].view(np.recarray),
                h["ostat"],
                h["lat"],
                h["ctl"],
                self.state_dev,
                self.stage,
                self.ostage,
                stage_b,
                np.asarray(self.ostage).view(np.uint8),
                stage_b if arena is None else arena.data,
                h["ctl"] if arena is None else arena.hdr_device,
            )
        stage_b = self.stage.view(np.uint8)
        arena = self.edge_arena
        return (
            self.inbox,
            self.outbox,
            self.ostat,
            self.lat,
            self.ctl,
            self.state_dev,
            self.stage,
            self.ostage,
            stage_b,
            self.ostage.view(np.uint8),
            stage_b if arena is None else arena.data,
            self.ctl if arena is None else arena.hdr_device,
        )

    def mark_compiling(self, compiling: bool) -> None:
        """Say that a compile thread outlived its caller (``release`` waits for it)."""
        self._compiling = compiling

    def compile(self) -> None:
        """Compile the kernel (slow; the caller runs it in a worker thread). No-op simulated."""
        if self.flavour == "simulator":
            from . import build, device

            self._kernel = device.make_ring_kernel(
                build.python_handler(self.handler), cooperative=self.cooperative
            )
            return
        with self._device():
            if self.flavour == "numba":
                self._compile_numba()
            else:
                self._compile_c()

    def _compile_numba(self) -> None:
        from . import build

        disp = build.build_kernel(self.handler, cooperative=self.cooperative)
        argtypes = build.argument_types(self._args())
        try:
            kernel = disp.compile(argtypes)
        except Exception as exc:
            raise KernelCompilationError(
                f"{self.name}: the handler "
                f"{build.python_handler(self.handler).__name__!r} does not compile for the "
                f"GPU: {type(exc).__name__}: {exc}"
            ) from exc
        # load the module and resolve the kernel now, not at the launch: a module load
        # beside running persistent kernels may synchronize the device
        bind = getattr(kernel, "bind", None)
        if callable(bind):
            try:
                bind()
                _load_into_context(kernel)
            except Exception as exc:
                raise CUDAError(f"{self.name}: loading the compiled kernel failed: {exc}") from exc
        self._kernel = disp

    def _compile_c(self) -> None:
        import cupy

        from . import cuda_c

        src = cuda_c.generate_source(
            self.cuda_source or "",
            self.handler_name,
            self.in_name,
            self.host["inbox"].dtype,
            self.out_name,
            self.host["outbox"].dtype,
            np.dtype(self.state_dev.dtype),
            int(np.prod(self.state_dev.shape)),
            cooperative=self.cooperative,
        )
        key = (src, self.device_id)
        with _live_lock:
            cached = _c_modules.get(key)
        if cached is None:  # a loaded module is reused: loading beside kernels may sync
            try:
                with cupy.cuda.Device(self.device_id):
                    module = cupy.RawModule(code=src, options=("-std=c++17",))
                    cached = (module, module.get_function(cuda_c.KERNEL_NAME))
            except Exception as exc:
                raise KernelCompilationError(
                    f"{self.name}: the CUDA C handler does not compile: {exc}"
                ) from exc
            with _live_lock:
                _c_modules[key] = cached
        self._kernel = cached[1]
        self._keep.append(cached[0])

    def start(self) -> None:
        """Launch the persistent kernel; returns at once (the kernel keeps running)."""
        if self._kernel is None:
            self.compile()
        if self.flavour == "simulator":
            from . import build, simlaunch

            self._launch = simlaunch.start(
                self._kernel,
                self._args(),
                nthreads=self.nthreads,
                name=self.name,
                swap=(build.python_handler(self.handler),),
            )
        else:
            with self._device():
                if self.flavour == "numba":
                    self._start_numba()
                else:
                    self._start_c()
        self._started = True
        if self.flavour != "simulator":
            self._liveness = KernelLiveness(self._event, self.flavour, self.name)
            with self._device():
                _defer_cleanup()
        _actor_started(self)

    def _start_numba(self) -> None:
        cuda = _numba_cuda()

        self._stream = nonblocking_stream(self._keep, self.device_id)
        try:
            self._kernel[1, self.nthreads, self._stream](*self._args())
            self._event = cuda.event(timing=False)
            self._event.record(self._stream)
        except Exception as exc:
            raise CUDAError(f"{self.name}: launching the persistent kernel failed: {exc}") from exc

    def _start_c(self) -> None:
        import cupy

        with cupy.cuda.Device(self.device_id):
            stream = cupy.cuda.Stream(non_blocking=True)
        self._stream = stream
        ptr = _device_pointer
        h = self.host
        args = (
            np.uint64(ptr(self.inbox)),
            np.uint64(ptr(self.outbox)),
            np.uint64(ptr(self.ostat)),
            np.uint64(ptr(self.lat)),
            np.uint64(ptr(self.ctl)),
            np.uint64(ptr(self.state_dev)),
            np.uint64(ptr(self.stage)),
            np.int64(len(h["inbox"])),
            np.int64(len(h["outbox"]) - 1),
            np.int64(len(h["lat"])),
        )
        try:
            with cupy.cuda.Device(self.device_id):
                self._kernel((1,), (self.nthreads,), args, stream=stream)
                self._event = cupy.cuda.Event(disable_timing=True)
                self._event.record(stream)
        except Exception as exc:
            raise CUDAError(f"{self.name}: launching the persistent kernel failed: {exc}") from exc

    # -- liveness ------------------------------------------------------------------------

    @property
    def holds_memory(self) -> bool:
        """True from the kernel's start until its memory is released: a kernel that may
        still run and read its control block."""
        return self._started and not self._released

    def finished(self) -> bool:
        """True once the kernel is no longer running (ended cleanly or not)."""
        if not self._started:
            return True
        if self.flavour == "simulator":
            return not self._launch.is_alive()  # type: ignore[no-any-return]
        assert self._liveness is not None
        return self._liveness.finished()

    def failure(self) -> BaseException | None:
        """The error that ended the kernel, if it ended badly (None while it runs)."""
        if not self._started:
            return None
        if self.flavour == "simulator":
            err = self._launch.error
            return err if isinstance(err, BaseException) else None
        assert self._liveness is not None
        return self._liveness.failure()

    def join(self, timeout: float) -> bool:
        """Wait (blocking) up to ``timeout`` for the simulated threads to end."""
        if self.flavour == "simulator" and self._launch is not None:
            return self._launch.join(timeout)  # type: ignore[no-any-return]
        return self.finished()

    def release(self) -> None:
        """Give the memory back: now if no GPU actor runs, else when the last one ends.

        While a compile thread that outlived its launch still runs (``mark_compiling``),
        nothing is released; the thread's end releases it.

        A kernel that may still be running (it did not acknowledge TERMINATE) keeps its
        memory for the life of the process instead: freeing it would let a hung kernel
        write into reused memory. A later ``release`` frees it once the kernel ended.
        """
        if self._released or self._compiling:  # a compile thread still uses it
            return
        if self._started and not self.finished():
            if not self._abandoned:
                self._abandoned = True
                with _live_lock:
                    _graveyard.append(self)
                logger.error("%s: the kernel is still running; its memory is kept alive", self.name)
            return
        self._released = True
        if self._state_owner is not None and hasattr(self._state_owner, "mark_device_dirty"):
            try:
                self._state_owner.mark_device_dirty()
            except Exception as exc:  # the owner may have been freed by the user
                logger.debug("%s: could not mark the state buffer device-dirty: %r", self.name, exc)
        self._give_back_carves()  # the kernel ended: its slab memory is free again
        keep = [*self._keep, self._stream, self._event, self._kernel]
        if self._abandoned:
            with _live_lock:
                if self in _graveyard:
                    _graveyard.remove(self)
        if self.simulator:
            keep = []
        if self._started:
            _actor_released(self, keep)
        else:  # never launched (a compile error): still, no free while a kernel runs
            with _live_lock:
                if _live:
                    _graveyard.extend(keep)


def _device_pointer(arr: Any) -> int:
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return int(arr.device_ctypes_pointer.value)


def nonblocking_stream(keep: list[Any], device_id: int) -> Any:
    """A Numba stream that does not synchronize with the legacy default stream.

    Raises:
        CUDAError: neither CuPy nor Numba's driver could make one. A persistent kernel on a
            blocking stream would make every synchronous copy on the legacy default stream
            wait for it, forever, so there is no fallback.
    """
    cuda = _numba_cuda()

    try:
        import cupy

        with cupy.cuda.Device(device_id):
            stream = cupy.cuda.Stream(non_blocking=True)
        keep.append(stream)
        return cuda.external_stream(stream.ptr)
    except Exception as exc:
        logger.debug("CuPy non-blocking stream unavailable (%r); trying Numba's driver", exc)
    try:
        drv: Any = importlib.import_module("numba.cuda.cudadrv.driver")

        flags = drv.binding.CUstream_flags.CU_STREAM_NON_BLOCKING.value
        handle = drv.driver.cuStreamCreate(flags)
        ctx = cuda.current_context()
        # Numba's own finalizer (private): the stream is destroyed as Numba's are
        finalizer = drv._stream_finalizer(ctx.deallocations, handle)  # noqa: SLF001
        return drv.Stream(handle, finalizer=finalizer)
    except Exception as exc:
        raise CUDAError(
            f"could not create a non-blocking CUDA stream for a persistent kernel ({exc!r}); "
            "on a blocking stream every synchronous copy on the legacy default stream would "
            "wait for the kernel, which never ends on its own. Install CuPy for this CUDA "
            "version (cupy-cuda12x / cupy-cuda13x) or a numba-cuda whose driver exposes "
            "cuStreamCreate"
        ) from exc


def _load_into_context(kernel: Any) -> None:
    """Load a bound Numba kernel into the current context now, not at its first launch.

    numba-cuda 0.30+ resolves kernels through the context-independent library API
    (``cuLibraryGetKernel``), which the driver may load into a context only when the kernel
    first launches, beside running persistent kernels. Asking for the context's function
    handle (``cuKernelGetFunction``) loads it. Older numba-cuda (a ``CUfunction`` already)
    needs nothing.
    """
    library = getattr(kernel, "_codelibrary", None)
    get_cufunc = getattr(library, "get_cufunc", None)
    if not callable(get_cufunc):
        return
    handle = getattr(get_cufunc(), "handle", None)
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        return
    cu_kernel = getattr(drv, "CUkernel", None)
    if cu_kernel is None or not isinstance(handle, cu_kernel):
        return
    err, _ = drv.cuKernelGetFunction(handle)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise CUDAError(f"cuKernelGetFunction failed ({err}): the kernel could not be loaded")


def _require_gpu(device_id: int) -> None:
    # lazy loading (the default since CUDA 12.2) loads a kernel at its first launch, which
    # may synchronize the device while other persistent kernels run; only effective when
    # CUDA was not initialized yet in this process (a user's own setting is kept)
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    from ....backends.numba_compat import numba_cuda_version, version_problem

    problem = version_problem(numba_cuda_version())
    if problem is not None:
        raise BackendNotAvailableError(problem)
    try:
        cuda = _numba_cuda()
    except ImportError as exc:  # pragma: no cover - numba is part of the cuda extra
        raise BackendNotAvailableError(
            f'GPU ring kernels need numba-cuda ({exc}); pip install "pydotcompute[cuda]"'
        ) from exc
    try:
        available = cuda.is_available()
        count = len(cuda.gpus) if available else 0
    except Exception as exc:
        available, count = False, 0
        reason = f"{type(exc).__name__}: {exc}"
    else:
        reason = "no CUDA GPU is visible to Numba"
    if not available or device_id >= count:
        if available:
            reason = f"asked for CUDA device {device_id} but {count} device(s) exist"
        raise BackendNotAvailableError(
            f"GPU ring kernels need an NVIDIA GPU: {reason}. Set NUMBA_ENABLE_CUDASIM=1 (before "
            "importing numba) to run them on the Numba CUDA simulator instead"
        )
    cc = cuda.gpus[device_id].compute_capability
    if tuple(cc) < (7, 0):
        raise BackendNotAvailableError(
            f"GPU ring kernels need compute capability 7.0+ (system-scope acquire/release and "
            f"__nanosleep); device {device_id} is {cc[0]}.{cc[1]}"
        )
