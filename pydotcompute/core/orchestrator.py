"""ComputeOrchestrator: launch compute kernels from async code, with streams and a history.

Launches run in a worker thread (``asyncio.to_thread``) by default: a CPU kernel is a
blocking NumPy/Numba call and a GPU launch ends in a synchronize, and neither may stall the
event loop. MLX (the Metal backend) ties streams and unevaluated arrays to the thread that
made them, so its streams are thread-local and the backend queues the evaluation of lazy
inputs on the caller's thread (``MetalBackend.schedule_inputs``) before the hand-off.

Every launch — successful or not — is recorded as a ``KernelExecution`` in a bounded
history, so failures are visible after the fact as well as raised to the caller.

An ``async def`` kernel (any kernel whose call returns an awaitable) is awaited on the
caller's event loop after the call: it is not blocking code, and what it awaits may belong
to that loop. Its recorded time covers the await.

``initialize()`` and ``shutdown()`` do their work when called and return an awaitable, so
both ``orch.initialize()`` and ``await orch.initialize()`` work (the 0.2 API was used both
ways); ``async with ComputeOrchestrator() as orch`` is the recommended form. For the same
reason ``stream_context()`` works under ``with`` and ``async with``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends.base import KernelExecutionResult, normalize_grid
from ..backends.device_sync import ring_kernels_running
from ..exceptions import InvalidConfigurationError, KernelAlreadyExistsError, KernelNotFoundError

if TYPE_CHECKING:
    from types import TracebackType

    from ..backends.base import Backend, BackendType
    from .accelerator import Accelerator
    from .memory_pool import MemoryPool

__all__ = (
    "ComputeOrchestrator",
    "KernelExecution",
    "KernelLaunchConfig",
    "KernelNotRegisteredError",
)


class KernelNotRegisteredError(KernelNotFoundError, ValueError):
    """Raised when a kernel name given to a `ComputeOrchestrator` is not registered.

    A `KernelNotFoundError` (a `KeyError`) like every unknown kernel, and a `ValueError`,
    which is what older code catches around `launch_kernel`.
    """

    def __init__(self, kernel_id: str, known: Any = (), *, where: str = "orchestrator"):
        super().__init__(kernel_id, known, where=where)
        listing = ", ".join(repr(k) for k in self.known) if self.known else "none"
        self.args = (f"Kernel {kernel_id!r} not registered with the {where}; known ids: {listing}",)


@dataclass(frozen=True, slots=True)
class KernelLaunchConfig:
    """How to launch a kernel.

    Attributes:
        grid_size: blocks per grid (an int or up to three ints; kept as a tuple, so
            `KernelLaunchConfig(4, 8).grid_size == (4,)`).
        block_size: threads per block (an int or up to three ints; kept as a tuple).
        shared_memory_bytes: dynamic shared memory per block (CUDA C kernels).
        stream: the stream to launch on (``None``: the orchestrator's current stream).

    Raises:
        InvalidConfigurationError: a size is not positive.
    """

    grid_size: int | tuple[int, ...] = 1
    block_size: int | tuple[int, ...] = 256
    shared_memory_bytes: int = 0
    stream: Any = None

    def __post_init__(self) -> None:
        # sizes are kept as tuples (an int becomes a 1-tuple), as older code reads them
        object.__setattr__(self, "grid_size", normalize_grid(self.grid_size, "grid_size"))
        object.__setattr__(self, "block_size", normalize_grid(self.block_size, "block_size"))
        if not isinstance(self.shared_memory_bytes, int) or self.shared_memory_bytes < 0:
            raise InvalidConfigurationError(
                f"shared_memory_bytes must be an int >= 0, got {self.shared_memory_bytes!r}"
            )

    @property
    def total_threads(self) -> int:
        """Blocks times threads per block."""
        total = 1
        for d in (
            *normalize_grid(self.grid_size, "grid_size"),
            *normalize_grid(self.block_size, "block_size"),
        ):
            total *= d
        return total


_execution_ids = itertools.count(1)


class KernelExecution:
    """One recorded launch. Every argument has a default, so code can build one by hand.

    Attributes:
        execution_id: increasing id (within the orchestrator that recorded it).
        kernel_name: the kernel's name.
        config: the launch configuration.
        start_time: wall-clock start (``time.time()``).
        end_time: wall-clock end.
        success: whether it completed without raising.
        error: the exception when it failed (``error_message`` has it as text).
        backend: backend name (``"cpu:0"``, ``"cuda:0"``, ...).
        result: the backend's result (device-measured time, output) when it succeeded.
    """

    def __init__(
        self,
        execution_id: int | None = None,
        kernel_name: str = "",
        config: KernelLaunchConfig | None = None,
        start_time: float = 0.0,
        end_time: float = 0.0,
        success: bool = False,
        error: BaseException | None = None,
        *,
        backend: str = "",
        result: KernelExecutionResult | None = None,
        duration_ms: float | None = None,
    ) -> None:
        self.execution_id = execution_id if execution_id is not None else next(_execution_ids)
        self.kernel_name = kernel_name
        self.config = config if config is not None else KernelLaunchConfig()
        self.start_time = start_time
        self.end_time = end_time
        self.success = success
        self.error = error
        self.backend = backend
        self.result = result
        self._measured_ms = duration_ms

    @property
    def duration_ms(self) -> float:
        """Launch to completion in ms: as the orchestrator measured it, else
        ``(end_time - start_time) * 1000``."""
        if self._measured_ms is not None:
            return self._measured_ms
        return (self.end_time - self.start_time) * 1000.0

    @property
    def error_message(self) -> str | None:
        """``"ExceptionType: message"`` when it failed, else None."""
        if self.error is None:
            return None
        return f"{type(self.error).__name__}: {self.error}"

    @property
    def device_time_ms(self) -> float | None:
        """Time measured by the backend (CUDA events on a GPU), when available."""
        return self.result.execution_time_ms if self.result is not None else None

    def __repr__(self) -> str:
        return (
            f"KernelExecution(execution_id={self.execution_id!r}, "
            f"kernel_name={self.kernel_name!r}, success={self.success}, "
            f"duration_ms={self.duration_ms:.3f}, error={self.error_message!r})"
        )


async def _awaited(result: KernelExecutionResult) -> KernelExecutionResult:
    """``result`` of an ``async def`` kernel, its coroutine awaited on the caller's loop;
    its time is the call's plus the await's."""
    start = time.perf_counter()
    output = await result.output
    elapsed = (time.perf_counter() - start) * 1e3
    return dataclasses.replace(
        result, output=output, execution_time_ms=result.execution_time_ms + elapsed
    )


class _Done:
    """An already-completed awaitable (see the module docstring)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


class ComputeOrchestrator:
    """Registers compute kernels and launches them on a backend without blocking the loop.

    Args:
        backend: a ``Backend``, a backend name, or ``None`` for the accelerator's choice.
        max_history: executions kept in the history (oldest dropped first).
        run_in_thread: run launches in a worker thread (``False`` runs them inline, which is
            only right for tiny kernels).
    """

    def __init__(
        self,
        backend: Backend | BackendType | str | None = None,
        *,
        max_history: int = 1000,
        run_in_thread: bool = True,
    ) -> None:
        if not isinstance(max_history, int) or max_history < 1:
            raise InvalidConfigurationError(f"max_history must be an int >= 1, got {max_history!r}")
        self._backend_spec = backend
        self._backend: Backend | None = None
        self._kernels: dict[str, Callable[..., Any]] = {}
        self._history: deque[KernelExecution] = deque(maxlen=max_history)
        self._ids = itertools.count(1)
        self._streams: list[Any] = []
        self._current_stream: Any = None
        self._run_in_thread = run_in_thread
        self._initialized = False
        self._closed = False
        self._lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def is_initialized(self) -> bool:
        """Whether ``initialize()`` ran and ``shutdown()`` did not."""
        return self._initialized and not self._closed

    @property
    def is_active(self) -> bool:
        """The same as `is_initialized`: ready to launch."""
        return self.is_initialized

    @property
    def accelerator(self) -> Accelerator:
        """The process-wide `Accelerator` (device discovery and selection)."""
        from .accelerator import get_accelerator

        return get_accelerator()

    @property
    def memory_pool(self) -> MemoryPool:
        """The process-wide `MemoryPool` kernels' buffers can come from."""
        from .memory_pool import get_memory_pool

        return get_memory_pool()

    @property
    def backend(self) -> Backend:
        """The backend kernels run on (resolved on first use)."""
        if self._backend is None:
            from ..backends import get_backend
            from ..backends.base import Backend

            spec = self._backend_spec
            self._backend = spec if isinstance(spec, Backend) else get_backend(spec)
        return self._backend

    def initialize(self) -> _Done:
        """Resolve the backend and check it is usable; idempotent. Awaitable or not.

        Raises:
            BackendNotAvailableError: the chosen backend is unusable.
        """
        self.backend.require()
        self._initialized = True
        self._closed = False
        return _Done()

    def shutdown(self) -> _Done:
        """Wait for queued device work and release streams; idempotent. Awaitable or not."""
        if self._initialized and not self._closed:
            with contextlib.suppress(Exception):
                self.synchronize()
        self._streams.clear()
        self._current_stream = None
        self._closed = True
        return _Done()

    async def __aenter__(self) -> ComputeOrchestrator:
        await self.initialize()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    def __enter__(self) -> ComputeOrchestrator:
        self.initialize()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # --- kernels ---------------------------------------------------------------------------

    def register_kernel(self, name: str, fn: Callable[..., Any]) -> None:
        """Register ``fn`` under ``name`` for ``launch_kernel(name, ...)``.

        Raises:
            KernelAlreadyExistsError: ``name`` is taken (``unregister_kernel`` it first).
            InvalidConfigurationError: ``fn`` is not callable or ``name`` is empty.
        """
        if not isinstance(name, str) or not name:
            raise InvalidConfigurationError(f"kernel name must be a non-empty str, got {name!r}")
        if not callable(fn):
            raise InvalidConfigurationError(
                f"kernel {name!r} must be callable, got {type(fn).__name__}"
            )
        with self._lock:
            if name in self._kernels:
                raise KernelAlreadyExistsError(
                    f"a kernel named {name!r} is already registered with this orchestrator; "
                    "unregister_kernel() it first"
                )
            self._kernels[name] = fn

    def unregister_kernel(self, name: str) -> None:
        """Forget ``name``.

        Raises:
            KernelNotRegisteredError: unknown ``name``.
        """
        with self._lock:
            if name not in self._kernels:
                raise KernelNotRegisteredError(name, self._kernels, where="orchestrator")
            del self._kernels[name]

    def get_kernel(self, name: str) -> Callable[..., Any] | None:
        """The kernel registered under ``name``, or None (see `require_kernel`)."""
        return self._kernels.get(name)

    def require_kernel(self, name: str) -> Callable[..., Any]:
        """The kernel registered under ``name``.

        Raises:
            KernelNotRegisteredError: unknown ``name`` (the message lists the registered ones).
        """
        try:
            return self._kernels[name]
        except KeyError:
            raise KernelNotRegisteredError(name, self._kernels, where="orchestrator") from None

    @property
    def kernel_names(self) -> list[str]:
        """Registered kernel names, sorted."""
        return sorted(self._kernels)

    async def launch_kernel(
        self,
        kernel_or_name: Callable[..., Any] | str,
        config: KernelLaunchConfig | tuple[Any, Any] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> KernelExecution:
        """Launch a kernel (or a registered name) and wait for it without blocking the loop.

        Args:
            kernel_or_name: a kernel callable (an ``async def`` one is awaited on this loop)
                or a registered name.
            config: a ``KernelLaunchConfig``, a ``(grid, block)`` tuple, or ``None`` (1, 256).
            *args: the kernel's arguments.
            **kwargs: keyword arguments for the kernel (CPU and Metal); ``stream`` and
                ``shared_mem`` are reserved (set them in the ``KernelLaunchConfig``).

        Returns:
            The recorded ``KernelExecution``.

        Raises:
            KernelNotRegisteredError: unknown name (a `KeyError` and a `ValueError`).
            KernelStateError: the orchestrator was shut down.
            Exception: whatever the kernel or backend raised (also recorded in the history).
        """
        if self._closed:
            from ..exceptions import KernelStateError

            name = kernel_or_name if isinstance(kernel_or_name, str) else "?"
            raise KernelStateError(
                name,
                "SHUT_DOWN",
                "launch",
                "this ComputeOrchestrator was shut down; create a new one",
            )
        if not self._initialized:
            self.initialize()
        _check_kernel_kwargs(kwargs)
        fn = (
            self.require_kernel(kernel_or_name)
            if isinstance(kernel_or_name, str)
            else kernel_or_name
        )
        name = kernel_or_name if isinstance(kernel_or_name, str) else self.backend.kernel_name(fn)
        cfg = self._as_config(config)
        stream = cfg.stream if cfg.stream is not None else self._current_stream
        backend = self.backend
        call = functools.partial(
            _raise_failure,
            backend.execute_kernel,
            fn,
            cfg.grid_size,
            cfg.block_size,
            *args,
            stream=stream,
            shared_mem=cfg.shared_memory_bytes,
            **kwargs,
        )
        start_wall, start = time.time(), time.perf_counter()
        try:
            if self._run_in_thread:
                # MLX: lazy inputs can only be evaluated in the thread that built them.
                schedule_inputs = getattr(backend, "schedule_inputs", None)
                if schedule_inputs is not None:
                    schedule_inputs(args)
                result = await asyncio.to_thread(call)
            else:
                result = call()
            if inspect.isawaitable(result.output):  # an `async def` kernel: run it here
                result = await _awaited(result)
        except BaseException as exc:
            self._record(name, cfg, start_wall, start, None, exc)
            raise
        return self._record(name, cfg, start_wall, start, result, None)

    @staticmethod
    def _as_config(config: KernelLaunchConfig | tuple[Any, Any] | None) -> KernelLaunchConfig:
        if config is None:
            return KernelLaunchConfig()
        if isinstance(config, KernelLaunchConfig):
            return config
        if isinstance(config, tuple) and len(config) == 2:
            return KernelLaunchConfig(grid_size=config[0], block_size=config[1])
        raise InvalidConfigurationError(
            f"config must be a KernelLaunchConfig or a (grid, block) tuple, got {config!r}"
        )

    def _record(
        self,
        name: str,
        cfg: KernelLaunchConfig,
        start_wall: float,
        start: float,
        result: KernelExecutionResult | None,
        error: BaseException | None,
    ) -> KernelExecution:
        elapsed = (time.perf_counter() - start) * 1e3
        execution = KernelExecution(
            execution_id=next(self._ids),
            kernel_name=name,
            config=cfg,
            backend=self.backend.name,
            start_time=start_wall,
            end_time=start_wall + elapsed / 1e3,
            duration_ms=elapsed,
            success=error is None,
            error=error,
            result=result,
        )
        self._history.append(execution)
        return execution

    # --- streams ---------------------------------------------------------------------------

    def create_stream(self) -> Any:
        """A new stream on the backend (``None`` on the CPU, which has none)."""
        stream = self.backend.create_stream()
        if stream is not None:
            self._streams.append(stream)
        return stream

    def stream_context(self, stream: Any | None = None) -> StreamContext:
        """Launches inside the block default to ``stream`` (a new one if ``None``); the
        stream is synchronized on exit. Works with ``with`` and ``async with`` (0.2's form);
        both yield the stream, ``None`` on the CPU."""
        return StreamContext(self, stream)

    def set_current_stream(self, stream: Any) -> Any:
        """Make ``stream`` the default for launches; returns the previous default."""
        previous = self._current_stream
        self._current_stream = stream
        return previous

    def synchronize(self) -> None:
        """Wait for every stream this orchestrator created and for the device.

        While persistent GPU ring kernels run, the device-wide wait would never end, so it
        waits for the current stream instead (the kernels run on streams of their own).
        """
        for stream in self._streams:
            if hasattr(stream, "synchronize"):
                stream.synchronize()
        if ring_kernels_running():
            self.backend.synchronize_stream()
        else:
            self.backend.synchronize()

    # --- history ---------------------------------------------------------------------------

    def get_execution_history(
        self, limit: int | None = None, kernel_name: str | None = None
    ) -> list[KernelExecution]:
        """Recorded launches, oldest first; ``limit`` keeps the most recent ones (0 or None:
        all of them)."""
        items: Sequence[KernelExecution] = list(self._history)
        if kernel_name is not None:
            items = [e for e in items if e.kernel_name == kernel_name]
        if limit is not None:
            if limit < 0:
                raise InvalidConfigurationError(f"limit must be >= 0, got {limit}")
            if limit:  # 0 means the whole history, as in 0.2
                items = items[len(items) - limit :]
        return list(items)

    def clear_execution_history(self) -> None:
        """Forget recorded launches."""
        self._history.clear()

    def statistics(self) -> dict[str, Any]:
        """Launch counts and timings per kernel over the recorded history."""
        per: dict[str, dict[str, float]] = {}
        for e in self._history:
            s = per.setdefault(e.kernel_name, {"launches": 0, "failures": 0, "total_ms": 0.0})
            s["launches"] += 1
            s["failures"] += 0 if e.success else 1
            s["total_ms"] += e.duration_ms
        return {
            "backend": self.backend.name,
            "launches": len(self._history),
            "failures": sum(1 for e in self._history if not e.success),
            "kernels": per,
        }

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ready" if self._initialized else "new"
        return (
            f"ComputeOrchestrator(active={self.is_active}, kernels={len(self._kernels)}, "
            f"executions={len(self._history)}, state={state})"
        )


_RESERVED_KWARGS = ("stream", "shared_mem", "on_error")


def _raise_failure(execute: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``backend.execute_kernel`` and raise the error of a failed result: backends
    return failures (0.2's ``on_error="return"``), the orchestrator raises and records
    them. Works with backends written before ``on_error`` existed."""
    result = execute(*args, **kwargs)
    error = getattr(result, "error", None)
    if error is not None and not getattr(result, "success", True):
        raise error
    return result


def _check_kernel_kwargs(kwargs: dict[str, Any]) -> None:
    reserved = sorted(k for k in kwargs if k in _RESERVED_KWARGS)
    if reserved:
        raise InvalidConfigurationError(
            f"launch_kernel keyword(s) {reserved} are reserved for the launch; set the stream "
            "and shared memory in KernelLaunchConfig(stream=..., shared_memory_bytes=...)"
        )


class StreamContext:
    """``orch.stream_context()``: a context manager for ``with`` and ``async with`` alike."""

    def __init__(self, orchestrator: ComputeOrchestrator, stream: Any | None) -> None:
        self._orch = orchestrator
        self._stream = stream
        self._previous: Any = None

    def __enter__(self) -> Any:
        target = self._stream if self._stream is not None else self._orch.create_stream()
        self._stream = target
        self._previous = self._orch.set_current_stream(target)
        return target

    def __exit__(self, *exc: object) -> None:
        self._orch.set_current_stream(self._previous)
        target = self._stream
        if target is not None and hasattr(target, "synchronize"):
            target.synchronize()

    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)
