"""KernelCompiler: compile a kernel once per (source hash, signature, device, options).

Two caches stack up. In memory, a dict maps the key to the ``CompiledKernel``, so the second
request in a process costs a hash. On disk, the ``KernelCache`` keeps the PTX that NVRTC
produced for CUDA C source and that ``numba.cuda.compile_ptx`` produced for Python kernels
with an explicit signature, so another process (or the next run) skips the compiler: CUDA C
kernels are then loaded straight from the cached PTX with ``cupy.RawModule``, and Python
kernels get their PTX (for inspection and the PTX check) without recompiling.

What each device gets:

* ``"cpu"`` — ``numba.njit`` (eager with a signature, lazy without), or the plain function
  when Numba is missing. Numba's own ``cache=`` is not used: it writes next to the source file,
  which may be read-only.
* ``"cuda"`` — Python functions: ``numba.cuda.jit``, built on first launch (so compiling to
  PTX works on a machine without a GPU); CUDA C source: NVRTC to PTX (no GPU needed), loaded
  with CuPy on first launch.
* ``"metal"`` — ``mx.compile``.

Compiler failures raise ``KernelCompilationError`` carrying the compiler's own message.
A CUDA kernel is built on the shared CUDA backend, looked up in ``backends._registry`` (a
leaf), because the backend modules import this one for their ``compile_kernel``.

The source hash covers the function's source text (or bytecode when there is no source), its
constants and the reprs of its closure cells, so two closures over different values do not
share an entry; module globals are not hashed — pass changing values as arguments.

This file is longer than the ~600-line habit: the per-device paths share the compiler's two
caches and counters under one lock, and the constructors older code builds by hand
(`CompilationOptions`, `CompiledKernel`) must stay next to the code that fills them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends._cuda_probe import cuda_simulator_enabled, numba_cuda
from ..backends._registry import backend_instance
from ..backends.base import BackendType, error_text
from ..exceptions import BackendNotAvailableError, InvalidConfigurationError, KernelCompilationError

if TYPE_CHECKING:
    from .cache import KernelCache

__all__ = (
    "DEFAULT_CC",
    "CompilationOptions",
    "CompiledKernel",
    "CompilerStats",
    "KernelCompiler",
    "compile_kernel",
    "get_compiler",
    "nvrtc_compile_ptx",
    "source_hash",
    "warmup_kernels",
)

#: PTX target used when no GPU is present to ask (Ampere; loads on every newer GPU).
DEFAULT_CC = (8, 0)
_DEVICES = ("auto", "cpu", "cuda", "metal")


@dataclass(frozen=True, slots=True)
class CompilationOptions:
    """Options that change the generated code (all but `device`, `cache` and `name` are
    part of the cache key).

    The first six fields keep the order and defaults older code passes positionally.

    Attributes:
        device: the device to compile for when these options are given to a compiler or a
            `compile` call without `device=`: `"cuda"`, `"cpu"`, `"metal"` or `"auto"`.
        fastmath: allow fast, less exact floating point.
        debug: generate debug code (slower; exceptions checked on the device).
        lineinfo: keep source line information in PTX.
        opt_level: optimisation level 0-3; 0 turns Numba CUDA's optimiser off.
        cache: persist PTX in the `KernelCache`.
        cc: CUDA compute capability to target; `None` means the current GPU's, else 8.0.
        nvrtc_options: extra NVRTC flags for CUDA C source.
        name: the kernel's name (the entry point for CUDA C source).

    Raises:
        InvalidConfigurationError: an unknown device or an `opt_level` outside 0-3.
    """

    device: str = "cuda"
    fastmath: bool = True
    debug: bool = False
    lineinfo: bool = False
    opt_level: int = 3
    cache: bool = True
    cc: tuple[int, int] | None = None
    nvrtc_options: tuple[str, ...] = ()
    name: str | None = None

    def __post_init__(self) -> None:
        if self.device not in _DEVICES:
            raise InvalidConfigurationError(
                f"device must be one of {', '.join(_DEVICES)}, got {self.device!r}"
            )
        if isinstance(self.opt_level, bool) or self.opt_level not in (0, 1, 2, 3):
            raise InvalidConfigurationError(
                f"opt_level must be 0, 1, 2 or 3, got {self.opt_level!r}"
            )

    def cache_key(self) -> str:
        """The options as a stable string (`device`, `name` and `cache` excluded)."""
        return (
            f"fm={int(self.fastmath)};dbg={int(self.debug)};li={int(self.lineinfo)};"
            f"O={self.opt_level};cc={self.cc};nv={','.join(self.nvrtc_options)}"
        )


def source_hash(func: Callable[..., Any] | str) -> str:
    """A SHA-256 over what defines a kernel's behaviour (see the module docstring)."""
    h = hashlib.sha256()
    if isinstance(func, str):
        h.update(b"src\0" + func.encode())
        return h.hexdigest()
    target = inspect.unwrap(getattr(func, "py_func", func))
    h.update(f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}".encode())
    try:
        h.update(textwrap.dedent(inspect.getsource(target)).encode())
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        if code is not None:
            h.update(code.co_code)
        else:  # a builtin or C function: its identity is all there is
            h.update(repr(target).encode())
    code = getattr(target, "__code__", None)
    if code is not None:
        h.update(repr(code.co_consts).encode())
    for cell in getattr(target, "__closure__", None) or ():
        try:
            h.update(repr(cell.cell_contents).encode())
        except ValueError:  # empty cell
            h.update(b"<empty>")
    return h.hexdigest()


def nvrtc_compile_ptx(
    source: str, name: str, cc: tuple[int, int], options: tuple[str, ...] = ()
) -> str:
    """Compile CUDA C ``source`` to PTX with NVRTC (through CuPy); no GPU is needed.

    Raises:
        BackendNotAvailableError: CuPy (which ships the NVRTC binding) is missing.
        KernelCompilationError: NVRTC rejected the source; the message holds its log.
    """
    try:
        from cupy.cuda import nvrtc
    except Exception as exc:
        raise BackendNotAvailableError(
            f"compiling CUDA C needs CuPy's NVRTC ({exc}); install it with "
            'pip install "pydotcompute[cuda]"'
        ) from None
    flags = [f"--gpu-architecture=compute_{cc[0]}{cc[1]}", *options]
    try:
        prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    except Exception as exc:
        raise KernelCompilationError(f"NVRTC could not create program {name!r}: {exc}") from exc
    try:
        try:
            nvrtc.compileProgram(prog, flags)
        except Exception as exc:
            try:
                log = nvrtc.getProgramLog(prog)
            except Exception:
                log = ""
            raise KernelCompilationError(
                f"NVRTC failed to compile CUDA C kernel {name!r} for compute_{cc[0]}{cc[1]}: "
                f"{exc}\n{log}".rstrip()
            ) from exc
        ptx = nvrtc.getPTX(prog)
    finally:
        try:
            nvrtc.destroyProgram(prog)
        except Exception:
            pass
    text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    return text.rstrip("\x00")


def _numpy_to_mlx(mx: Any, compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` accepting NumPy arrays too: ``mx.compile``'d functions take only trees of
    ``mx.array``s and constants, so NumPy arguments are converted at the call."""
    import numpy as np

    def convert(a: Any) -> Any:
        return mx.array(a) if isinstance(a, np.ndarray) else a

    def call(*args: Any, **kwargs: Any) -> Any:
        return compiled(*[convert(a) for a in args], **{k: convert(v) for k, v in kwargs.items()})

    return call


def _numba_error(exc: BaseException) -> bool:
    errors = sys.modules.get("numba.core.errors")
    return errors is not None and isinstance(exc, errors.NumbaError)


class CompiledKernel:
    """A kernel compiled for one device, usable like the underlying callable.

    ``kernel`` is the executable object (a Numba dispatcher, a CuPy ``RawKernel``, an MLX
    compiled function, or the plain function); for CUDA it is built on first access, so a
    ``CompiledKernel`` with PTX exists on machines without a GPU. Calling it or indexing it
    with a launch configuration (``k[grid, block](...)``) forwards to ``kernel``.

    Attributes:
        name: the kernel name.
        device: ``"cpu"``, ``"cuda"`` or ``"metal"``.
        signature: the signature it was compiled for (``None`` = lazy / any).
        key: the cache key.
        ptx: PTX text for CUDA kernels when it was produced, else ``None``.
        from_disk_cache: whether the PTX came from the ``KernelCache``.
        compile_time_ms: time spent compiling (0 when everything came from caches).
    """

    def __init__(
        self,
        kernel: Any = None,
        name: str = "kernel",
        source_hash: str = "",
        signature: Any = None,
        options: CompilationOptions | None = None,
        compile_time_ms: float = 0.0,
        ptx: str | None = None,
        *,
        device: str | None = None,
        key: str | None = None,
        source: Callable[..., Any] | str | None = None,
        from_disk_cache: bool = False,
        build: Callable[[], Any] | None = None,
    ) -> None:
        """Wrap a compiled `kernel` (as older code builds one), or a `build` function the
        compiler gives to make it on first use.

        Raises:
            InvalidConfigurationError: neither `kernel` nor `build` was given.
        """
        if kernel is None and build is None:
            raise InvalidConfigurationError(
                "CompiledKernel needs the compiled kernel (first argument) or build="
            )
        opts = options if options is not None else CompilationOptions()
        self.name = name
        self.device = device if device is not None else opts.device
        self.signature = signature
        self.source_hash = source_hash
        self.key = key if key is not None else source_hash
        self.options = opts
        self.source: Callable[..., Any] | str = (
            source if source is not None else getattr(kernel, "py_func", kernel)
        )
        self.ptx = ptx
        self.from_disk_cache = from_disk_cache
        self.compile_time_ms = compile_time_ms
        self._build = build if build is not None else (lambda: kernel)
        self._kernel: Any = kernel
        self._lock = threading.Lock()

    @property
    def py_func(self) -> Callable[..., Any] | None:
        """The Python function, or ``None`` for CUDA C source."""
        return None if isinstance(self.source, str) else self.source

    @property
    def kernel(self) -> Any:
        """The executable object, built on first access.

        Raises:
            BackendNotAvailableError: the device this kernel targets is missing.
            KernelCompilationError: building it failed.
        """
        if self._kernel is None:
            with self._lock:
                if self._kernel is None:
                    self._kernel = self._build()
        return self._kernel

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.kernel(*args, **kwargs)
        except Exception as exc:
            if _numba_error(exc):
                raise KernelCompilationError(
                    f"Numba could not compile kernel {self.name!r} for arguments "
                    f"({', '.join(type(a).__name__ for a in args)}): {error_text(exc)}"
                ) from exc
            raise

    def __getitem__(self, config: Any) -> Any:
        return self.kernel[config]

    def __repr__(self) -> str:
        return (
            f"<CompiledKernel {self.name!r} device={self.device} signature={self.signature!r} "
            f"ptx={'yes' if self.ptx else 'no'}>"
        )


@dataclass(frozen=True, slots=True)
class CompilerStats:
    """Counters of a ``KernelCompiler``."""

    hits: int
    misses: int
    disk_hits: int
    compilations: int
    nvrtc_compilations: int
    ptx_compilations: int
    errors: int
    entries: int

    @property
    def hit_rate(self) -> float:
        """In-memory hits over requests."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class KernelCompiler:
    """Compiles kernels for the CPU, CUDA and Metal, once per key, with a PTX disk cache.

    Args:
        options: defaults for every ``compile`` call.
        cache: the ``KernelCache`` for PTX; ``None`` uses the process-wide one, ``False``
            disables the disk cache.
    """

    def __init__(
        self,
        options: CompilationOptions | None = None,
        *,
        cache: KernelCache | bool | None = None,
    ) -> None:
        # options given here also choose the default device (see `compile`)
        self._device_from_options = options is not None
        self.options = options or CompilationOptions()
        self._cache_spec = cache
        self._kernels: dict[str, CompiledKernel] = {}
        self._lock = threading.RLock()
        self._hits = self._misses = self._disk_hits = self._compilations = 0
        self._nvrtc = self._ptx = self._errors = 0

    @property
    def cache(self) -> KernelCache | None:
        """The disk cache in use, or ``None``."""
        if self._cache_spec is False:
            return None
        if self._cache_spec is None or self._cache_spec is True:
            from .cache import get_kernel_cache

            return get_kernel_cache()
        return self._cache_spec

    @property
    def cuda_available(self) -> bool:
        """Whether CUDA kernels can run here (a GPU and its libraries, or the simulator)."""
        from ..core.accelerator import get_accelerator

        return bool(get_accelerator().cuda_available)

    @property
    def numba_available(self) -> bool:
        """Whether Numba is installed (CPU kernels are then JIT-compiled; checked without
        importing it)."""
        return "numba" in sys.modules or importlib.util.find_spec("numba") is not None

    # --- public ----------------------------------------------------------------------------

    def compile(
        self,
        func: Callable[..., Any] | str,
        *,
        signature: Any | None = None,
        name: str | None = None,
        options: CompilationOptions | None = None,
        device: str | None = None,
        **overrides: Any,
    ) -> CompiledKernel:
        """Compile ``func`` (a Python function, or CUDA C source for ``device="cuda"``).

        Args:
            func: the kernel.
            signature: a Numba signature (string or types); ``None`` compiles lazily per
                argument types (CPU/CUDA) or traces on first call (Metal).
            name: the kernel name; required for CUDA C (the ``extern "C"`` entry point).
            options: per-call options (default: the compiler's).
            device: `"auto"` (the accelerator's backend), `"cpu"`, `"cuda"`, `"metal"`;
                `None` takes `options.device` when options were given (here or to the
                compiler), else `"auto"`.
            **overrides: ``CompilationOptions`` fields to change for this call.

        Raises:
            KernelCompilationError: the compiler rejected the kernel.
            BackendNotAvailableError: the device's compiler library is missing.
            InvalidConfigurationError: unknown device or option.
        """
        opts = options or self.options
        if device is None:
            explicit = options is not None or self._device_from_options
            device = opts.device if explicit else "auto"
        if overrides:
            fields = {f.name for f in dataclasses.fields(CompilationOptions)}
            unknown = sorted(set(overrides) - fields)
            if unknown:
                raise InvalidConfigurationError(
                    f"unknown compile option(s) {', '.join(unknown)}; "
                    f"valid: {', '.join(sorted(fields))}"
                )
            opts = dataclasses.replace(opts, **overrides)
        if name is not None:
            opts = dataclasses.replace(opts, name=name)
        dev = self._resolve_device(device)
        if isinstance(func, str):
            if dev != "cuda":
                raise KernelCompilationError(
                    f"source strings are CUDA C and compile only for device='cuda', got {dev!r}"
                )
            if not opts.name:
                raise InvalidConfigurationError(
                    'compiling CUDA C source needs name=<the extern "C" entry point>'
                )
        elif not callable(func):
            raise KernelCompilationError(
                f"a kernel must be a Python function or CUDA C source, got {type(func).__name__}"
            )
        kname = str(opts.name or getattr(func, "__name__", None) or "kernel")
        src_hash = source_hash(func)
        key = self._key(src_hash, signature, dev, opts)
        with self._lock:
            hit = self._kernels.get(key)
            if hit is not None:
                self._hits += 1
                return hit
            self._misses += 1
            try:
                compiled = self._compile(func, signature, dev, opts, kname, key)
            except Exception:
                self._errors += 1
                raise
            compiled.source_hash = src_hash
            self._kernels[key] = compiled
            return compiled

    def get_stats(self) -> CompilerStats:
        """Counters since creation (or ``clear``)."""
        with self._lock:
            return CompilerStats(
                hits=self._hits,
                misses=self._misses,
                disk_hits=self._disk_hits,
                compilations=self._compilations,
                nvrtc_compilations=self._nvrtc,
                ptx_compilations=self._ptx,
                errors=self._errors,
                entries=len(self._kernels),
            )

    def get_cache_stats(self) -> dict[str, Any]:
        """A dict: ``cached_kernels`` (in-memory kernels, PyDotCompute 0.2's only key),
        ``hits``, ``misses``, ``size`` (the same as ``cached_kernels``), ``disk_hits`` and
        ``disk`` (the disk cache's statistics, or None)."""
        stats = self.get_stats()
        cache = self.cache
        return {
            "cached_kernels": stats.entries,
            "hits": stats.hits,
            "misses": stats.misses,
            "size": stats.entries,
            "disk_hits": stats.disk_hits,
            "disk": dataclasses.asdict(cache.get_stats()) if cache is not None else None,
        }

    def clear(self) -> None:
        """Forget in-memory kernels and zero the counters (the disk cache is untouched)."""
        with self._lock:
            self._kernels.clear()
            self._hits = self._misses = self._disk_hits = self._compilations = 0
            self._nvrtc = self._ptx = self._errors = 0

    def get_cached_kernel(self, key_or_hash: str) -> CompiledKernel | None:
        """The kernel compiled under a cache key or a source hash, or `None`.

        A source hash (`CompiledKernel.source_hash`) may match several kernels (one per
        signature, device and options); the first compiled is returned.
        """
        with self._lock:
            hit = self._kernels.get(key_or_hash)
            if hit is not None:
                return hit
            return next((k for k in self._kernels.values() if k.source_hash == key_or_hash), None)

    def clear_cache(self) -> int:
        """Forget in-memory kernels (the disk cache is untouched); returns how many."""
        with self._lock:
            n = len(self._kernels)
            self._kernels.clear()
            return n

    def __repr__(self) -> str:
        cuda = "simulator" if cuda_simulator_enabled() else self.cuda_available
        device = self.options.device if self._device_from_options else "auto"
        return (
            f"KernelCompiler(cuda={cuda}, numba={self.numba_available}, "
            f"cached={len(self._kernels)}, device={device})"
        )

    # --- internals -------------------------------------------------------------------------

    @staticmethod
    def _resolve_device(device: str) -> str:
        if device not in _DEVICES:
            raise InvalidConfigurationError(
                f"device must be one of {', '.join(_DEVICES)}, got {device!r}"
            )
        if device == "auto":
            from ..core.accelerator import get_accelerator

            return get_accelerator().backend_type.value
        return device

    @staticmethod
    def _key(src_hash: str, signature: Any, device: str, opts: CompilationOptions) -> str:
        h = hashlib.sha256()
        h.update(src_hash.encode())
        h.update(f"|{signature}|{device}|{opts.cache_key()}|{opts.name}".encode())
        return h.hexdigest()[:40]

    def _compile(
        self,
        func: Callable[..., Any] | str,
        signature: Any,
        device: str,
        opts: CompilationOptions,
        name: str,
        key: str,
    ) -> CompiledKernel:
        if device == "cpu":
            return self._compile_cpu(func, signature, opts, name, key)  # type: ignore[arg-type]
        if device == "metal":
            return self._compile_metal(func, signature, opts, name, key)  # type: ignore[arg-type]
        if isinstance(func, str):
            return self._compile_cuda_c(func, opts, name, key)
        return self._compile_cuda_py(func, signature, opts, name, key)

    def _compile_cpu(
        self,
        func: Callable[..., Any],
        signature: Any,
        opts: CompilationOptions,
        name: str,
        key: str,
    ) -> CompiledKernel:
        start = time.perf_counter()
        try:
            numba: Any = importlib.import_module("numba")
        except Exception:
            kernel: Any = func
        else:
            jit_kwargs: dict[str, Any] = {"fastmath": opts.fastmath}
            if opts.debug:
                jit_kwargs["debug"] = True
            try:
                if signature is not None:
                    kernel = numba.njit(signature, **jit_kwargs)(func)
                else:
                    kernel = numba.njit(**jit_kwargs)(func)
            except Exception as exc:
                if _numba_error(exc):
                    raise KernelCompilationError(
                        f"Numba could not compile {name!r} for signature {signature!r}: "
                        f"{error_text(exc)}"
                    ) from exc
                raise
        self._compilations += 1
        return CompiledKernel(
            name=name,
            device="cpu",
            signature=signature,
            key=key,
            options=opts,
            source=func,
            ptx=None,
            from_disk_cache=False,
            compile_time_ms=(time.perf_counter() - start) * 1e3,
            build=lambda: kernel,
        )

    def _compile_metal(
        self,
        func: Callable[..., Any],
        signature: Any,
        opts: CompilationOptions,
        name: str,
        key: str,
    ) -> CompiledKernel:
        try:
            import mlx.core as mx
        except Exception as exc:
            raise BackendNotAvailableError(
                f"compiling for Metal needs MLX ({exc}); install it with "
                'pip install "pydotcompute[metal]"'
            ) from None
        start = time.perf_counter()
        try:
            kernel = _numpy_to_mlx(mx, mx.compile(func))
        except Exception as exc:
            raise KernelCompilationError(
                f"mx.compile failed for {name!r}: {error_text(exc)}"
            ) from exc
        self._compilations += 1
        return CompiledKernel(
            name=name,
            device="metal",
            signature=signature,
            key=key,
            options=opts,
            source=func,
            ptx=None,
            from_disk_cache=False,
            compile_time_ms=(time.perf_counter() - start) * 1e3,
            build=lambda: kernel,
        )

    def _target_cc(self, opts: CompilationOptions) -> tuple[int, int]:
        if opts.cc is not None:
            return opts.cc
        try:
            from ..core.accelerator import get_accelerator

            acc = get_accelerator()
            if acc.cuda_available and not acc.cuda_simulated:
                cc = acc.get_device(acc.current_device_id).compute_capability
                if cc is not None and cc != (0, 0):
                    return cc
        except Exception:
            pass
        return DEFAULT_CC

    def _disk_key(self, key: str, cc: tuple[int, int], tool: str) -> str:
        return hashlib.sha256(f"{key}|{cc}|{tool}".encode()).hexdigest()[:48]

    def _cache_load(
        self, disk_key: str, opts: CompilationOptions, record: dict[str, Any]
    ) -> str | None:
        """PTX from disk, used only when its record says it was built from this source,
        these options and this target (``record``, as `_cache_store` writes it)."""
        cache = self.cache if opts.cache else None
        if cache is None:
            return None
        ptx = cache.load_text(disk_key, expect=record)
        if ptx is not None:
            self._disk_hits += 1
        return ptx

    def _cache_store(
        self, disk_key: str, ptx: str, opts: CompilationOptions, meta: dict[str, Any]
    ) -> None:
        cache = self.cache if opts.cache else None
        if cache is None:
            return
        try:
            cache.store(disk_key, ptx, kind="ptx", metadata=meta)
        except OSError as exc:  # a read-only cache must not break compilation
            warnings.warn(
                f"could not write kernel cache {cache.cache_dir}: {exc}",
                RuntimeWarning,
                stacklevel=4,
            )

    def _compile_cuda_c(
        self, source: str, opts: CompilationOptions, name: str, key: str
    ) -> CompiledKernel:
        cc = self._target_cc(opts)
        disk_key = self._disk_key(key, cc, f"nvrtc:{_nvrtc_version()}")
        start = time.perf_counter()
        record = {"name": name, "cc": list(cc), "tool": "nvrtc", "source_key": key}
        ptx = self._cache_load(disk_key, opts, record)
        from_disk = ptx is not None
        if ptx is None:
            ptx = nvrtc_compile_ptx(source, name, cc, opts.nvrtc_options)
            self._nvrtc += 1
            self._compilations += 1
            self._cache_store(disk_key, ptx, opts, record)
        elapsed = 0.0 if from_disk else (time.perf_counter() - start) * 1e3
        final_ptx = ptx

        def build() -> Any:
            return backend_instance(BackendType.CUDA).load_ptx(final_ptx, name)

        return CompiledKernel(
            name=name,
            device="cuda",
            signature=None,
            key=key,
            options=opts,
            source=source,
            ptx=ptx,
            from_disk_cache=from_disk,
            compile_time_ms=elapsed,
            build=build,
        )

    def _compile_cuda_py(
        self,
        func: Callable[..., Any],
        signature: Any,
        opts: CompilationOptions,
        name: str,
        key: str,
    ) -> CompiledKernel:
        start = time.perf_counter()
        ptx: str | None = None
        from_disk = False
        if signature is not None and not cuda_simulator_enabled():
            cc = self._target_cc(opts)
            disk_key = self._disk_key(key, cc, f"numba:{_numba_version()}")
            record = {"name": name, "cc": list(cc), "tool": "numba", "source_key": key}
            ptx = self._cache_load(disk_key, opts, record)
            from_disk = ptx is not None
            if ptx is None:
                ptx = numba_compile_ptx(func, signature, cc, opts)
                self._ptx += 1
                self._compilations += 1
                self._cache_store(disk_key, ptx, opts, record)
        elapsed = 0.0 if from_disk else (time.perf_counter() - start) * 1e3

        def build() -> Any:
            backend_instance(BackendType.CUDA).require()
            cuda = numba_cuda()

            jit_kwargs: dict[str, Any] = {"fastmath": opts.fastmath}
            if opts.debug or not opts.opt_level:
                jit_kwargs["opt"] = False
            if opts.debug:
                jit_kwargs["debug"] = True
            if opts.lineinfo:
                jit_kwargs["lineinfo"] = True
            try:
                if signature is not None:
                    return cuda.jit(signature, **jit_kwargs)(func)
                return cuda.jit(**jit_kwargs)(func)
            except Exception as exc:
                if _numba_error(exc):
                    raise KernelCompilationError(
                        f"Numba CUDA could not compile {name!r} for {signature!r}: "
                        f"{error_text(exc)}"
                    ) from exc
                raise

        return CompiledKernel(
            name=name,
            device="cuda",
            signature=signature,
            key=key,
            options=opts,
            source=func,
            ptx=ptx,
            from_disk_cache=from_disk,
            compile_time_ms=elapsed,
            build=build,
        )


def numba_compile_ptx(
    func: Callable[..., Any],
    signature: Any,
    cc: tuple[int, int],
    opts: CompilationOptions | None = None,
) -> str:
    """PTX for a Python CUDA kernel via ``numba.cuda.compile_ptx`` (no GPU needed).

    Raises:
        BackendNotAvailableError: Numba CUDA is missing, or the simulator is on (it cannot
            produce PTX; run PTX checks in a process without ``NUMBA_ENABLE_CUDASIM``).
        KernelCompilationError: Numba rejected the kernel; the message holds its error.
    """
    if cuda_simulator_enabled():
        raise BackendNotAvailableError(
            "PTX cannot be produced while the Numba CUDA simulator is on; run PTX checks in a "
            "process without NUMBA_ENABLE_CUDASIM"
        )
    try:
        cuda = numba_cuda()
    except Exception as exc:
        raise BackendNotAvailableError(
            f'compiling CUDA kernels needs Numba CUDA ({exc}); pip install "pydotcompute[cuda]"'
        ) from None
    opts = opts or CompilationOptions()
    kwargs: dict[str, Any] = {"cc": cc, "fastmath": opts.fastmath}
    if opts.debug or not opts.opt_level:
        kwargs["opt"] = False
    if opts.debug:
        kwargs["debug"] = True
    if opts.lineinfo:
        kwargs["lineinfo"] = True
    name = getattr(func, "__name__", "kernel")
    try:
        ptx, _ = cuda.compile_ptx(func, signature, **kwargs)
    except Exception as exc:
        raise KernelCompilationError(
            f"Numba could not compile CUDA kernel {name!r} for {signature!r} "
            f"(cc {cc[0]}.{cc[1]}): {error_text(exc)}"
        ) from exc
    return str(ptx)


def _numba_version() -> str:
    try:
        import numba

        cuda_mod = sys.modules.get("numba_cuda")
        return f"{numba.__version__}/{getattr(cuda_mod, '__version__', '')}"
    except Exception:
        return "none"


def _nvrtc_version() -> str:
    try:
        from cupy.cuda import nvrtc

        return ".".join(str(v) for v in nvrtc.getVersion())
    except Exception:
        return "none"


_compiler: KernelCompiler | None = None
_compiler_lock = threading.Lock()


def get_compiler() -> KernelCompiler:
    """The process-wide ``KernelCompiler`` (its PTX goes to ``get_kernel_cache()``)."""
    global _compiler
    with _compiler_lock:
        if _compiler is None:
            _compiler = KernelCompiler()
        return _compiler


def compile_kernel(
    func: Callable[..., Any] | str,
    *,
    signature: Any | None = None,
    name: str | None = None,
    device: str | None = None,
    **options: Any,
) -> CompiledKernel:
    """`get_compiler().compile(...)`: compile once, cached in memory and (PTX) on disk.

    `options` are `CompilationOptions` fields (`fastmath=False`, `debug=True`, ...);
    `device=None` compiles for the accelerator's backend.
    """
    return get_compiler().compile(func, signature=signature, name=name, device=device, **options)


def warmup_kernels(
    kernels: Iterable[Callable[..., Any] | tuple[Callable[..., Any], Any]],
    *,
    device: str | None = None,
    **options: Any,
) -> dict[str, CompiledKernel]:
    """Compile `kernels` ahead of their first launch (each once; later calls hit caches).

    Args:
        kernels: functions, or `(function, signature)` pairs (with a signature, CPU kernels
            compile now and CUDA kernels get their PTX now).
        device: as for `compile_kernel`.
        **options: `CompilationOptions` fields.

    Returns:
        The compiled kernels by name.

    Raises:
        KernelCompilationError: a kernel does not compile (the ones before it are cached).
    """
    compiled: dict[str, CompiledKernel] = {}
    for item in kernels:
        func, signature = item if isinstance(item, tuple) else (item, None)
        k = compile_kernel(func, signature=signature, device=device, **options)
        compiled[k.name] = k
    return compiled
