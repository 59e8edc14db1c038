"""Run a persistent kernel on the Numba CUDA simulator, in threads of its own.

Why not ``kernel[1, n](...)``: the simulator launches synchronously (the caller would block
for the kernel's whole life), supports one launch at a time per process, and its block
manager busy-polls its threads. A ring kernel runs for as long as its actor lives and
several actors may run at once, so this module starts the block's threads itself:

- each simulated CUDA thread is a ``threading.Thread`` named ``pydotcompute-gpu:<id>:<tid>``
  carrying ``threadIdx``/``blockIdx`` like the simulator's own threads;
- one process-wide fake ``cuda`` module (a subclass of the simulator's) answers
  ``blockDim``, ``cuda.shared`` and ``syncthreads`` from the *calling thread's* launch, so
  concurrent actors whose kernels share module globals do not see each other's shared
  memory or barriers; it adds ``nanosleep`` (a real sleep, which releases the GIL);
- while any such launch runs, the simulator's "current kernel" points at that module, so a
  nested ``@cuda.jit(device=True)`` function defined in another module resolves ``cuda``
  correctly. The price: other simulated launches in the process must wait until the GPU
  actors are terminated (the simulator's own one-kernel-at-a-time rule).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

_simkernel: Any = importlib.import_module("numba.cuda.simulator.kernel")
_api: Any = importlib.import_module("numba.cuda.simulator.kernelapi")
Dim3: Any = _api.Dim3
FakeCUDAModule: Any = _api.FakeCUDAModule
FakeCUDAShared: Any = _api.FakeCUDAShared
swapped_cuda_module: Any = _api.swapped_cuda_module

__all__ = ("SimLaunch", "start")


class _Aborted(Exception):
    """Raised in a simulated thread whose block was aborted by another thread's error."""


class SimLaunch:
    """One simulated launch: a block of threads running one kernel function."""

    def __init__(self, nthreads: int, name: str) -> None:
        self.name = name
        self.block_dim = Dim3(nthreads, 1, 1)
        self.grid_dim = Dim3(1, 1, 1)
        self.shared = FakeCUDAShared(0)
        self.barrier = threading.Barrier(nthreads)
        self.threads: list[threading.Thread] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
        self.barrier.abort()

    def is_alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every thread; True when all ended within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            t.join(left)
        return not self.is_alive()


class _DeviceThread(threading.Thread):
    def __init__(self, launch: SimLaunch, tid: int, target: Callable[[], None]) -> None:
        super().__init__(target=target, name=f"{launch.name}:{tid}", daemon=True)
        self.threadIdx = Dim3(tid, 0, 0)
        self.blockIdx = Dim3(0, 0, 0)
        self.thread_id = tid
        self.pdc_launch = launch


def _launch() -> SimLaunch:
    launch = getattr(threading.current_thread(), "pdc_launch", None)
    if launch is None:
        raise RuntimeError(
            "simulated GPU-actor device code ran outside its device thread; other simulated "
            "kernels cannot run while a GPU actor is live on the CUDA simulator"
        )
    return launch  # type: ignore[no-any-return]


class _PerThreadCUDA(FakeCUDAModule):  # type: ignore[misc]
    """The fake ``cuda`` module whose launch-specific parts follow the calling thread."""

    def __init__(self) -> None:
        super().__init__((1, 1, 1), (1, 1, 1), 0)

    @property
    def gridDim(self) -> Dim3:
        return _launch().grid_dim

    @gridDim.setter
    def gridDim(self, value: Any) -> None:
        pass

    @property
    def blockDim(self) -> Dim3:
        return _launch().block_dim

    @blockDim.setter
    def blockDim(self, value: Any) -> None:
        pass

    @property
    def shared(self) -> FakeCUDAShared:
        return _launch().shared

    def syncthreads(self) -> None:
        try:
            _launch().barrier.wait()
        except threading.BrokenBarrierError:
            raise _Aborted from None

    def nanosleep(self, ns: Any) -> None:
        time.sleep(int(ns) * 1e-9)


_MODULE = _PerThreadCUDA()
_live = 0
_live_lock = threading.Lock()
_owns_context = False


def _enter() -> None:
    global _live, _owns_context
    with _live_lock:
        _live += 1
        if _live == 1 and _simkernel._kernel_context is None:  # noqa: SLF001 (the simulator's hook)
            _simkernel._kernel_context = _MODULE  # noqa: SLF001 (the simulator's hook)
            _owns_context = True


def _leave() -> None:
    global _live, _owns_context
    with _live_lock:
        _live -= 1
        if _live == 0 and _owns_context:
            if _simkernel._kernel_context is _MODULE:  # noqa: SLF001 (the simulator's hook)
                _simkernel._kernel_context = None  # noqa: SLF001 (the simulator's hook)
            _owns_context = False


def start(
    fn: Callable[..., None],
    args: Sequence[Any],
    *,
    nthreads: int,
    name: str,
    swap: Sequence[Callable[..., Any]] = (),
) -> SimLaunch:
    """Start ``fn(*args)`` as a simulated block of ``nthreads`` threads; returns at once.

    ``swap`` lists further Python functions (the handler) whose module's ``cuda`` global
    must point at the fake module while the kernel runs.
    """
    launch = SimLaunch(nthreads, name)
    fns = [fn, *swap]

    def body() -> None:
        try:
            with contextlib.ExitStack() as stack:
                for f in fns:
                    stack.enter_context(swapped_cuda_module(f, _MODULE))
                fn(*args)
        except _Aborted:
            pass
        except BaseException as exc:  # reported through launch.error
            launch.fail(exc)
        finally:
            _leave()

    for tid in range(nthreads):
        launch.threads.append(_DeviceThread(launch, tid, body))
    for t in launch.threads:
        _enter()
        t.start()
    return launch
