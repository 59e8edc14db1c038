"""`ProcessKernel` (public name `CythonRingKernel`): the process tier used directly.

```python
with CythonRingKernel("fast_worker", worker) as kernel:
    kernel.send(Request(value=21))
    print(kernel.receive(timeout=5.0).value)
```

Design notes:
- A thin synchronous façade over the same `ProcessWorker` the runtime drives: it adds
  the context manager and a `start` that returns the kernel, and forwards the rest. It is
  not a subclass, because the contract's `start` returns None and this one returns self.
- The seed's state enum is gone: `state` is a `KernelState`. `CythonKernelState` keeps
  the names code written against the standalone kernel compares with, mapped onto it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, ClassVar, Self

from ...._public import expose
from ... import _native
from ...states import KernelState
from .child import ProcessKernelContext
from .config import ProcessKernelConfig
from .worker import ProcessWorker

__all__ = (
    "CythonKernelConfig",
    "CythonKernelContext",
    "CythonKernelState",
    "CythonRingKernel",
    "ProcessKernel",
    "is_cython_kernel_available",
    "is_process_kernel_compiled",
)


def is_process_kernel_compiled() -> bool:
    """True when the compiled shared-memory ring is in use.

    The process tier also works on the pure-Python twin (slower); this says whether the
    fast path is there (public name: ``is_cython_kernel_available``).
    """
    return _native.is_cython_available()


class _StateNames(type):
    def __iter__(cls) -> Iterator[KernelState]:
        return iter((cls.CREATED, cls.RUNNING, cls.STOPPING, cls.STOPPED))  # type: ignore[attr-defined]


class CythonKernelState(metaclass=_StateNames):
    """The standalone process kernel's state names, as the `KernelState` each one is.

    CREATED -> RUNNING (ACTIVE) -> STOPPING (TERMINATING) -> STOPPED (TERMINATED); a kernel
    whose actor raised, or whose child died, is STOPPED with ``failed`` True.
    """

    CREATED: ClassVar[KernelState] = KernelState.CREATED
    RUNNING: ClassVar[KernelState] = KernelState.ACTIVE
    STOPPING: ClassVar[KernelState] = KernelState.TERMINATING
    STOPPED: ClassVar[KernelState] = KernelState.TERMINATED


class ProcessKernel:
    """A persistent actor in a child process, driven with ``send``/``receive``.

    Takes the arguments of `ProcessWorker` (``kernel_id``, ``kernel_func``, ``config``,
    ``input_type``, ``output_type``); every method not defined here is the worker's (see
    it for the details). ``worker`` is the `ProcessWorker` itself.
    """

    __slots__ = ("worker",)

    def __init__(
        self,
        kernel_id: str,
        kernel_func: Any,
        *,
        config: ProcessKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
    ) -> None:
        self.worker = ProcessWorker(
            kernel_id, kernel_func, config=config, input_type=input_type, output_type=output_type
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the child and wait until it has imported the actor; returns the kernel."""
        self.worker.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop gracefully; True when the child exited by itself (`ProcessWorker.stop`)."""
        return self.worker.stop(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the child to exit without asking it to; True if it has."""
        return self.worker.join(timeout)

    def __enter__(self) -> Self:
        if self.worker.state is KernelState.CREATED:
            self.worker.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.worker.stop()

    # -- messages --------------------------------------------------------------------------

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Queue ``msg`` for the actor, waiting while the inbox is full; False on timeout."""
        return self.worker.send(msg, timeout)

    def send_nowait(self, msg: Any) -> bool:
        """Queue ``msg`` if the inbox has room; False when full."""
        return self.worker.send(msg, 0)

    def receive(self, timeout: float | None = None) -> Any:
        """The next reply, waiting up to ``timeout`` seconds; None on timeout."""
        return self.worker.receive(timeout)

    def receive_nowait(self) -> Any:
        """The next reply or None, without waiting."""
        return self.worker.receive(0)

    def drain_replies(self) -> list[Any]:
        """Every reply readable now, oldest first (rejections as their errors)."""
        return self.worker.drain_replies()

    def take_undelivered(self) -> list[Any]:
        """After the child ended: the messages it did not finish, each once."""
        return self.worker.take_undelivered()

    def unprocessed(self) -> list[Any]:
        """Messages sent but never handed to the actor (stop timeout, failure, crash)."""
        return self.worker.unprocessed()

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        """The latencies the child timed since the last call (``record_latency``)."""
        return self.worker.drain_latencies()

    # -- waiting from elsewhere (an event loop, a waker thread) ----------------------------

    def add_waker(self, callback: Callable[[], None], *, when: str = "readable") -> None:
        """Call ``callback`` from the watcher thread when a reply may be ready (or, with
        ``when="writable"``, when the inbox may have room)."""
        self.worker.add_waker(callback, when=when)

    def remove_waker(self, callback: Callable[[], None]) -> None:
        """Stop calling ``callback``."""
        self.worker.remove_waker(callback)

    def wait_handles(self) -> tuple[int, int]:
        """File descriptors an event loop can watch: (outbox doorbell, child sentinel)."""
        return self.worker.wait_handles()

    def arm_receive(self) -> None:
        """Ask the child to ring the outbox doorbell on its next reply."""
        self.worker.arm_receive()

    def disarm_receive(self) -> None:
        """Withdraw `arm_receive` and empty the doorbell."""
        self.worker.disarm_receive()

    @property
    def inbox(self) -> Any:
        """The inbox seen from the parent: ``len()``, ``get_stats()``, ``add_waker``."""
        return self.worker.inbox

    @property
    def outbox(self) -> Any:
        """The outbox seen from the parent: ``len()``, ``get_stats()``, ``add_waker``."""
        return self.worker.outbox

    # -- what it is ------------------------------------------------------------------------

    @property
    def kernel_id(self) -> str:
        """The kernel's name."""
        return self.worker.kernel_id

    @property
    def config(self) -> ProcessKernelConfig:
        """The configuration it was created with."""
        return self.worker.config

    @property
    def state(self) -> KernelState:
        """Where the kernel is in its lifecycle (names in `CythonKernelState`)."""
        return self.worker.state

    @property
    def is_running(self) -> bool:
        """True while the child runs and no stop was requested."""
        return self.worker.is_running

    @property
    def error(self) -> BaseException | None:
        """Why the kernel failed: the actor's exception, or the child's death."""
        return self.worker.error

    @property
    def failed(self) -> bool:
        """True when the actor raised (or the child died unexpectedly)."""
        return self.worker.failed

    @property
    def using_cython(self) -> bool:
        """True when the compiled ring is in use (else the pure-Python twin)."""
        return self.worker.using_cython

    @property
    def pid(self) -> int | None:
        """The child's process id once started."""
        return self.worker.pid

    @property
    def exit_code(self) -> int | None:
        """The child's exit code once it ended (negative: killed by that signal)."""
        return self.worker.exit_code

    @property
    def max_message_bytes(self) -> int:
        """The largest encoded message ``send`` accepts, in bytes."""
        return self.worker.max_message_bytes

    @property
    def pending_input(self) -> int:
        """Messages sent and not yet taken by the actor."""
        return self.worker.pending_input

    def statistics(self) -> dict[str, Any]:
        """State, error, child and ring counters in one dictionary."""
        return self.worker.statistics()

    def __repr__(self) -> str:
        return repr(self.worker).replace("<ProcessWorker", f"<{type(self).__name__}", 1)


# The public names the process tier had before it was named for what it is (it runs
# without Cython too); code written against them keeps working.
CythonRingKernel = ProcessKernel
CythonKernelConfig = ProcessKernelConfig
CythonKernelContext = ProcessKernelContext
is_cython_kernel_available = is_process_kernel_compiled

# The one class `pydotcompute.ring_kernels` exports under its own name reports it as its
# module (the others are exported as aliases and keep this one).
expose("pydotcompute.ring_kernels", ("CythonKernelState",), globals())
