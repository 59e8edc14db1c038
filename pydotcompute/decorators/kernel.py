"""``@kernel`` and ``@gpu_kernel``: mark functions as compute kernels, compiled on first use.

``@kernel`` wraps an *array-level* function: calling it runs the Numba CPU JIT version
(``device="cpu"``/``"auto"``) or the ``mx.compile`` version (``device="metal"``). Indexing it
with a launch configuration, ``k[grid, block](...)``, treats it as a thread-indexed CUDA kernel
instead — the body must then use ``numba.cuda.grid`` and friends.

``@gpu_kernel`` wraps a thread-indexed CUDA kernel: it is launched with ``k[grid, block](...)``
or ``k.launch(grid, block, ...)``, and ``k.ptx(cc=(8, 0))`` compiles it to PTX on machines
without a GPU (given a ``signature``). Both compile through the shared ``KernelCompiler``, so
each (function, signature, device, options) is compiled once and CUDA PTX lands in the
on-disk ``KernelCache`` (``cache=False`` keeps it off disk).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar, overload

from ..exceptions import InvalidConfigurationError, KernelAlreadyExistsError

__all__ = (
    "GPUKernel",
    "KernelFunction",
    "KernelRegistry",
    "cuda_source",
    "get_kernel_meta",
    "get_kernel_registry",
    "gpu_kernel",
    "is_kernel",
    "kernel",
)

_DEVICES = ("auto", "cpu", "cuda", "metal")


def _compile(func: Callable[..., Any], **kw: Any) -> Any:
    from ..compilation.compiler import get_compiler

    return get_compiler().compile(func, **kw)


def _split_launch(config: Any) -> tuple[Any, Any, Any]:
    if not isinstance(config, tuple) or len(config) not in (2, 3, 4):
        raise InvalidConfigurationError(
            f"launch with kernel[grid, block] or kernel[grid, block, stream], got [{config!r}]"
        )
    stream = config[2] if len(config) >= 3 else None
    return config[0], config[1], stream


class KernelFunction:
    """What ``@kernel`` returns: a callable compute kernel with metadata.

    Attributes:
        name: the kernel name (defaults to the function's).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"metal"`` as requested.
        fastmath: compile with fast floating point.
        cache: persist compiled artifacts (PTX) on disk.
        py_func: the original function.
    """

    is_gpu_kernel = False

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        device: str = "auto",
        fastmath: bool = True,
        cache: bool = True,
    ) -> None:
        if device not in _DEVICES:
            raise InvalidConfigurationError(
                f"@kernel device must be one of {', '.join(_DEVICES)}, got {device!r}"
            )
        if not callable(func):
            raise InvalidConfigurationError(f"@kernel needs a function, got {type(func).__name__}")
        functools.update_wrapper(self, func)
        self.py_func = func
        self.name: str = str(name or getattr(func, "__name__", None) or "kernel")
        self.device = device
        self.fastmath = fastmath
        self.cache = cache

    @property
    def resolved_device(self) -> str:
        """Where a plain call runs: ``"metal"`` if asked for, else ``"cpu"``.

        ``"cuda"`` kernels are thread-indexed and cannot be called plainly; ``"auto"`` calls
        run on the CPU, while ``k[grid, block](...)`` always launches on CUDA.
        """
        return "metal" if self.device == "metal" else "cpu"

    def compile(self, device: str | None = None, signature: Any | None = None) -> Any:
        """The ``CompiledKernel`` for ``device`` (default ``resolved_device``)."""
        return _compile(
            self.py_func,
            signature=signature,
            name=self.name,
            device=device or self.resolved_device,
            fastmath=self.fastmath,
            cache=self.cache,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.device == "cuda":
            raise InvalidConfigurationError(
                f"kernel {self.name!r} targets CUDA; launch it as {self.name}[grid, block](...)"
            )
        return self.compile()(*args, **kwargs)

    def __getitem__(self, config: Any) -> Callable[..., Any]:
        grid, block, stream = _split_launch(config)

        def launch(*args: Any) -> Any:
            from ..backends import get_backend

            backend = get_backend("cuda")
            return backend.execute_kernel(
                self.compile("cuda"), grid, block, *args, stream=stream, on_error="raise"
            )

        return launch

    @property
    def metadata(self) -> dict[str, Any]:
        """Name, device and options, for tooling."""
        return {
            "name": self.name,
            "device": self.device,
            "fastmath": self.fastmath,
            "cache": self.cache,
            "gpu": self.is_gpu_kernel,
        }

    def __repr__(self) -> str:
        return f"<kernel {self.name!r} device={self.device}>"


class GPUKernel:
    """What ``@gpu_kernel`` returns: a Numba CUDA kernel compiled on first launch.

    Attributes:
        name: the kernel name.
        signature: the Numba signature (``None``: compiled per argument types at launch).
        fastmath, debug, cache: compile options.
        py_func: the original function.
    """

    is_gpu_kernel = True

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        signature: Any | None = None,
        fastmath: bool = True,
        debug: bool = False,
        cache: bool = True,
    ) -> None:
        if not callable(func):
            raise InvalidConfigurationError(
                f"@gpu_kernel needs a function, got {type(func).__name__}"
            )
        functools.update_wrapper(self, func)
        self.py_func = func
        self.name: str = str(name or getattr(func, "__name__", None) or "kernel")
        self.signature = signature
        self.fastmath = fastmath
        self.debug = debug
        self.cache = cache

    @property
    def device(self) -> str:
        """Always ``"cuda"``."""
        return "cuda"

    @property
    def is_available(self) -> bool:
        """Whether a GPU (or the CUDA simulator) can run this kernel now."""
        from ..backends import get_backend

        return get_backend("cuda").is_available

    def compile(self, cc: tuple[int, int] | None = None) -> Any:
        """The ``CompiledKernel`` (with PTX when a signature is set; no GPU needed)."""
        return _compile(
            self.py_func,
            signature=self.signature,
            name=self.name,
            device="cuda",
            fastmath=self.fastmath,
            debug=self.debug,
            cache=self.cache,
            cc=cc,
        )

    def ptx(self, cc: tuple[int, int] = (8, 0)) -> str:
        """PTX for compute capability ``cc``.

        Raises:
            InvalidConfigurationError: no ``signature`` was given (PTX needs types).
            KernelCompilationError: Numba rejected the kernel.
        """
        if self.signature is None:
            raise InvalidConfigurationError(
                f"gpu kernel {self.name!r} has no signature; PTX needs one, e.g. "
                "@gpu_kernel(signature='void(float32[:], float32[:])')"
            )
        ptx = self.compile(cc).ptx
        assert ptx is not None
        return str(ptx)

    def launch(
        self,
        grid_size: int | Sequence[int],
        block_size: int | Sequence[int],
        *args: Any,
        stream: Any | None = None,
    ) -> Any:
        """Launch and wait; returns the backend's ``KernelExecutionResult``.

        Raises:
            BackendNotAvailableError: no GPU and no simulator.
        """
        from ..backends import get_backend

        backend = get_backend("cuda")
        backend.require()
        return backend.execute_kernel(
            self.compile(), grid_size, block_size, *args, stream=stream, on_error="raise"
        )

    def __getitem__(self, config: Any) -> Callable[..., Any]:
        grid, block, stream = _split_launch(config)
        return functools.partial(self.launch, grid, block, stream=stream)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidConfigurationError(
            f"gpu kernel {self.name!r} needs a launch configuration: "
            f"{self.name}[grid, block](...) or {self.name}.launch(grid, block, ...)"
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Name, signature and options, for tooling."""
        return {
            "name": self.name,
            "device": "cuda",
            "signature": self.signature,
            "fastmath": self.fastmath,
            "debug": self.debug,
            "cache": self.cache,
            "gpu": True,
        }

    def __repr__(self) -> str:
        return f"<gpu_kernel {self.name!r} signature={self.signature!r}>"


@overload
def kernel(func: Callable[..., Any]) -> KernelFunction: ...
@overload
def kernel(
    func: None = None,
    *,
    name: str | None = None,
    device: str = "auto",
    fastmath: bool = True,
    cache: bool = True,
) -> Callable[[Callable[..., Any]], KernelFunction]: ...
def kernel(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    device: str = "auto",
    fastmath: bool = True,
    cache: bool = True,
) -> KernelFunction | Callable[[Callable[..., Any]], KernelFunction]:
    """Mark ``func`` as a compute kernel (bare ``@kernel`` or ``@kernel(...)``).

    Args:
        func: the function (when used bare).
        name: kernel name (default: the function's).
        device: ``"auto"``/``"cpu"`` (Numba CPU JIT), ``"metal"`` (``mx.compile``) or
            ``"cuda"`` (thread-indexed; launch with ``k[grid, block]``).
        fastmath: compile with fast floating point.
        cache: persist compiled PTX on disk.

    Raises:
        InvalidConfigurationError: unknown ``device``.
    """

    def wrap(fn: Callable[..., Any]) -> KernelFunction:
        k = KernelFunction(fn, name=name, device=device, fastmath=fastmath, cache=cache)
        get_kernel_registry().register(k.name, k, overwrite=True)
        return k

    return wrap(func) if func is not None else wrap


@overload
def gpu_kernel(func: Callable[..., Any]) -> GPUKernel: ...
@overload
def gpu_kernel(
    func: None = None,
    *,
    name: str | None = None,
    signature: Any | None = None,
    fastmath: bool = True,
    debug: bool = False,
    cache: bool = True,
) -> Callable[[Callable[..., Any]], GPUKernel]: ...
def gpu_kernel(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    signature: Any | None = None,
    fastmath: bool = True,
    debug: bool = False,
    cache: bool = True,
) -> GPUKernel | Callable[[Callable[..., Any]], GPUKernel]:
    """Mark ``func`` as a CUDA kernel (bare ``@gpu_kernel`` or ``@gpu_kernel(...)``).

    Args:
        func: the function (when used bare).
        name: kernel name (default: the function's).
        signature: a Numba signature such as ``"void(float32[:], float32[:])"``; enables
            eager PTX (``k.ptx()``) without a GPU.
        fastmath: compile with fast floating point.
        debug: compile with device-side checks.
        cache: persist compiled PTX on disk.
    """

    def wrap(fn: Callable[..., Any]) -> GPUKernel:
        k = GPUKernel(
            fn, name=name, signature=signature, fastmath=fastmath, debug=debug, cache=cache
        )
        get_kernel_registry().register(k.name, k, overwrite=True)
        return k

    return wrap(func) if func is not None else wrap


def is_kernel(obj: Any) -> bool:
    """Whether ``obj`` came from ``@kernel`` or ``@gpu_kernel``."""
    return isinstance(obj, (KernelFunction, GPUKernel))


def get_kernel_meta(obj: Any) -> dict[str, Any] | None:
    """The metadata of a ``@kernel``/``@gpu_kernel`` object, else ``None``."""
    return obj.metadata if is_kernel(obj) else None


class KernelRegistry:
    """Compute kernels by name. `@kernel` and `@gpu_kernel` register what they wrap in the
    process-wide registry, a later definition under the same name replacing the earlier one.

    `KernelRegistry()` is that process-wide registry (as in PyDotCompute 0.2:
    `KernelRegistry() is get_kernel_registry()`); `KernelRegistry.private()` makes an
    isolated, empty one. Thread-safe: one lock guards the table.
    """

    _kernels: dict[str, Any]
    _lock: threading.Lock
    _shared: ClassVar[KernelRegistry | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls) -> KernelRegistry:
        if cls is KernelRegistry:
            with cls._shared_lock:
                if cls._shared is None:
                    cls._shared = cls.private()
                return cls._shared
        return super().__new__(cls)

    def __init__(self) -> None:
        # __init__ runs again on every KernelRegistry() call, which returns the shared
        # registry: set the table up once.
        if getattr(self, "_kernels", None) is not None:
            return
        self._kernels = {}
        self._lock = threading.Lock()

    @classmethod
    def private(cls) -> KernelRegistry:
        """A new, empty registry of its own (not the process-wide one)."""
        registry = object.__new__(cls)
        registry.__init__()  # type: ignore[misc]
        return registry

    def register(self, name: str, kernel: Any, *, overwrite: bool = False) -> None:
        """Register `kernel` under `name`.

        Raises:
            KernelAlreadyExistsError: `name` is taken and `overwrite` is False (a
                `ValueError`).
            InvalidConfigurationError: `name` is empty or not a str.
        """
        if not isinstance(name, str) or not name:
            raise InvalidConfigurationError(f"kernel name must be a non-empty str, got {name!r}")
        with self._lock:
            if not overwrite and name in self._kernels:
                raise KernelAlreadyExistsError(
                    f"a kernel named {name!r} is already registered; pass overwrite=True to "
                    "replace it or unregister() it first"
                )
            self._kernels[name] = kernel

    def unregister(self, name: str) -> bool:
        """Forget `name`; returns whether it was registered."""
        with self._lock:
            return self._kernels.pop(name, None) is not None

    def get(self, name: str) -> Any | None:
        """The kernel registered under `name`, or `None`."""
        return self._kernels.get(name)

    def list(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._kernels)

    def clear(self) -> None:
        """Forget every kernel."""
        with self._lock:
            self._kernels.clear()

    def __contains__(self, name: object) -> bool:
        return name in self._kernels

    def __len__(self) -> int:
        return len(self._kernels)

    def __repr__(self) -> str:
        return f"<KernelRegistry kernels={len(self._kernels)}>"


_registry = KernelRegistry()  # the process-wide one


def get_kernel_registry() -> KernelRegistry:
    """The process-wide `KernelRegistry` that `@kernel` and `@gpu_kernel` fill."""
    return _registry


_F = TypeVar("_F")


def cuda_source(source: str) -> Callable[[_F], _F]:
    """Attach CUDA C `source` to a kernel as its `__cuda_source__` attribute.

    `@cuda_source(src)` keeps the source next to the Python function it belongs to, for
    tools (and people) that want the CUDA C a kernel corresponds to; compile it with
    `compile_kernel(kernel.__cuda_source__, name=..., device="cuda")`.

    Raises:
        InvalidConfigurationError: `source` is not a non-empty str.
    """
    if not isinstance(source, str) or not source.strip():
        raise InvalidConfigurationError(
            f"cuda_source() takes the CUDA C source as a non-empty str, got {source!r:.60}"
        )

    def attach(obj: _F) -> _F:
        obj.__cuda_source__ = source  # type: ignore[attr-defined]
        return obj

    return attach
