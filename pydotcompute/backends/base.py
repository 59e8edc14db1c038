"""The ``Backend`` interface every compute backend implements.

A backend owns one device's memory and kernels: it allocates arrays, copies between host and
device, launches kernels and compiles them. The three implementations (``CPUBackend``,
``CUDABackend``, ``MetalBackend``) load their libraries lazily, so importing this package never
imports CuPy, Numba or MLX, and constructing a backend never raises when its library or device
is missing: ``is_available`` is then ``False``, ``unavailable_reason`` says why, and every
operation raises `BackendNotAvailableError` naming the extra
to install.

Copies follow one contract on every backend: ``copy_to_device(a)`` returns an array that does
not alias ``a`` (on the CPU backend, a NumPy copy), and ``out=`` copies into an existing array
after checking that shapes and dtypes match; a mismatch raises
`BufferMismatchError` naming both sides.
"""

from __future__ import annotations

import enum
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..exceptions import BackendNotAvailableError, BufferMismatchError

__all__ = (
    "Backend",
    "BackendType",
    "KernelExecutionResult",
    "check_copy_compatible",
    "check_on_error",
    "describe_array",
    "error_text",
    "normalize_grid",
    "numpy_dtype_of",
)

Shape = tuple[int, ...]
DTypeLike = npt.DTypeLike


class BackendType(enum.Enum):
    """The kinds of compute backend; values are the names used by ``PYDOTCOMPUTE_BACKEND``."""

    CPU = "cpu"
    CUDA = "cuda"
    METAL = "metal"

    @classmethod
    def parse(cls, value: BackendType | str) -> BackendType:
        """Turn ``"cuda"``/``"CUDA"``/``BackendType.CUDA`` into a ``BackendType``.

        Raises:
            ValueError: ``value`` names no backend; the message lists the valid names.
        """
        if isinstance(value, BackendType):
            return value
        text = str(value).strip().lower()
        for member in cls:
            if member.value == text:
                return member
        valid = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"unknown backend {value!r}; expected one of {valid}")


@dataclass(slots=True)
class KernelExecutionResult:
    """What one ``Backend.execute_kernel`` call did.

    By default (``on_error="return"``, as in PyDotCompute 0.2) a kernel that raises gives a
    result with ``success=False`` and the exception in ``error``; with ``on_error="raise"``
    the exception propagates and every result you hold has ``success=True``. Every field
    has a default, so ``KernelExecutionResult(success=True, execution_time_ms=1.5)`` (0.2's
    keyword form) works.
    """

    kernel_name: str = ""
    backend: BackendType | None = None
    grid_size: tuple[int, ...] = (1,)
    block_size: tuple[int, ...] = (1,)
    execution_time_ms: float = 0.0
    output: Any = None
    success: bool = True
    error: BaseException | None = None


ON_ERROR = ("return", "raise")


def check_on_error(on_error: object) -> str:
    """``on_error`` is ``"return"`` (a failed result) or ``"raise"`` (the exception).

    Raises:
        InvalidConfigurationError: any other value.
    """
    if on_error not in ON_ERROR:
        from ..exceptions import InvalidConfigurationError

        raise InvalidConfigurationError(
            f"on_error must be 'return' (a result with success=False) or 'raise', got {on_error!r}"
        )
    return on_error  # type: ignore[return-value]


def describe_array(a: Any) -> str:
    """``"float32 (1000,) numpy.ndarray"``-style description used in error messages."""
    dtype = getattr(a, "dtype", None)
    shape = getattr(a, "shape", None)
    kind = f"{type(a).__module__.split('.')[0]}.{type(a).__name__}"
    return f"{dtype} {tuple(shape) if shape is not None else '?'} {kind}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_text(exc: BaseException) -> str:
    """``str(exc)`` without terminal colour codes (Numba colours its messages).

    A NumPy name missing inside Numba itself (a Numba release older than the NumPy
    installed) gets a hint, so the error does not read as a fault in the user's kernel.
    """
    text = _ANSI.sub("", str(exc)).strip()
    if isinstance(exc, AttributeError) and text.startswith("module 'numpy' has no attribute"):
        text += (
            f" (raised inside Numba, not by your code: the installed numba-cuda does not "
            f'support NumPy {np.__version__}; pip install "numpy<2.5", which the '
            "pydotcompute[cuda] extra pins)"
        )
    return text


def numpy_dtype_of(a: Any) -> np.dtype[Any] | None:
    """The NumPy dtype of any array (NumPy, CuPy, Numba, MLX), ``None`` if it has none."""
    dtype = getattr(a, "dtype", None)
    if dtype is None:
        return None
    try:
        return np.dtype(dtype)  # type: ignore[no-any-return]
    except TypeError:
        name = str(dtype).rsplit(".", 1)[-1]  # "mlx.core.float32" -> "float32"
        try:
            return np.dtype("bool" if name == "bool_" else name)
        except TypeError:
            return None


def check_copy_compatible(src: Any, dst: Any, *, what: str = "copy") -> None:
    """Raise ``BufferMismatchError`` unless ``src`` and ``dst`` have equal shape and dtype.

    Args:
        src: the array data comes from.
        dst: the array data goes to.
        what: the operation, for the message.
    """
    src_shape = tuple(getattr(src, "shape", ()))
    dst_shape = tuple(getattr(dst, "shape", ()))
    src_dtype = numpy_dtype_of(src)
    dst_dtype = numpy_dtype_of(dst)
    if src_shape != dst_shape or src_dtype != dst_dtype:
        problems = []
        if src_shape != dst_shape:
            problems.append("shapes")
        if src_dtype != dst_dtype:
            problems.append("dtypes")
        raise BufferMismatchError(
            f"cannot {what} {src_dtype} {src_shape} (source) into {dst_dtype} {dst_shape} "
            f"(destination): {' and '.join(problems)} differ; convert the source with "
            f".astype()/.reshape() first"
        )


def normalize_grid(value: int | Sequence[int], what: str) -> tuple[int, ...]:
    """Turn a grid or block size (int or 1-3 ints) into a tuple, checking it is positive.

    Raises:
        InvalidConfigurationError: a dimension is not a positive int, or there are more than 3.
    """
    from ..exceptions import InvalidConfigurationError

    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(
        not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1 for d in dims
    ):
        raise InvalidConfigurationError(
            f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {value!r}"
        )
    return tuple(int(d) for d in dims)


class Backend(ABC):
    """A compute backend bound to one device.

    Subclasses set the class attributes and implement the abstract methods; they must not
    import their library at module import time, and their constructor must not raise when
    the library or device is missing.

    Attributes:
        backend_type: which kind of backend this is.
        extra: the pip extra that installs the backend's libraries (``None`` for the CPU).
        device_id: the device index this backend drives.
    """

    backend_type: ClassVar[BackendType]
    extra: ClassVar[str | None] = None

    def __init__(self, device_id: int = 0) -> None:
        if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
            from ..exceptions import InvalidConfigurationError

            raise InvalidConfigurationError(
                f"device_id must be a non-negative int, got {device_id!r}"
            )
        self.device_id = device_id
        self._available: bool | None = None
        self._reason: str | None = None

    # --- probing ---------------------------------------------------------------------------

    @abstractmethod
    def _probe(self) -> str | None:
        """Load the library and check the device; return ``None`` if usable, else why not.

        Must not raise.
        """

    def _ensure_probed(self) -> None:
        if self._available is None:
            try:
                reason = self._probe()
            except Exception as exc:  # a broken driver or library must not escape a probe
                reason = f"{type(exc).__name__}: {exc}"
            self._reason = reason
            self._available = reason is None

    @property
    def is_available(self) -> bool:
        """Whether the library imports and the device is usable. Never raises."""
        self._ensure_probed()
        return bool(self._available)

    @property
    def unavailable_reason(self) -> str | None:
        """Why the backend is unavailable, or ``None`` when it is available."""
        self._ensure_probed()
        return self._reason

    @property
    def name(self) -> str:
        """A short name for messages, such as ``"cuda:0"``."""
        return f"{self.backend_type.value}:{self.device_id}"

    def require(self) -> None:
        """Raise ``BackendNotAvailableError`` (naming the extra) unless the backend is usable."""
        if self.is_available:
            return
        hint = (
            f'install it with pip install "pydotcompute[{self.extra}]"'
            if self.extra
            else "it should always be available; please report a bug"
        )
        raise BackendNotAvailableError(
            f"the {self.backend_type.value} backend is not available ({self._reason}); {hint}"
        )

    @property
    @abstractmethod
    def device_count(self) -> int:
        """How many devices of this kind are usable (0 when unavailable)."""

    # --- memory ----------------------------------------------------------------------------

    @abstractmethod
    def allocate(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> Any:
        """Allocate a zero-filled device array."""

    def empty(self, shape: int | Shape, dtype: DTypeLike = np.float32) -> Any:
        """Allocate a device array without initialising it (defaults to ``allocate``)."""
        return self.allocate(shape, dtype)

    def free(self, a: Any) -> None:  # noqa: B027 - optional hook, most backends use GC
        """Release a device array early; the default leaves it to the garbage collector."""

    @abstractmethod
    def copy_to_device(self, a: Any, *, out: Any | None = None, stream: Any | None = None) -> Any:
        """Copy host data to the device; returns ``out`` (filled) or a new device array."""

    @abstractmethod
    def copy_to_host(
        self, a: Any, *, out: np.ndarray[Any, Any] | None = None, stream: Any | None = None
    ) -> np.ndarray[Any, Any]:
        """Copy device data to the host; returns ``out`` (filled) or a new NumPy array."""

    @abstractmethod
    def fill(self, a: Any, value: Any) -> Any:
        """Set every element of device array ``a`` to ``value``; returns the filled array."""

    def is_device_array(self, a: Any) -> bool:
        """Whether ``a`` is an array living on this backend's device."""
        return False

    def copy_device_to_device(self, src: Any, dst: Any) -> Any:
        """Copy device array ``src`` into ``dst`` (checked); returns the array holding it."""
        check_copy_compatible(src, dst, what="copy on the device")
        dst[...] = src
        return dst

    # --- execution -------------------------------------------------------------------------

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until all work queued on the device has finished."""

    def synchronize_stream(self, stream: Any = None) -> None:
        """Wait for the work queued on one stream (the current one when ``None``).

        Backends without streams wait for the whole device.
        """
        self.synchronize()

    def create_stream(self) -> Any:
        """Create a stream (a queue of device work); ``None`` where the backend has none."""
        self.require()
        return None

    @abstractmethod
    def execute_kernel(
        self,
        kernel: Callable[..., Any],
        grid_size: int | Sequence[int],
        block_size: int | Sequence[int],
        *args: Any,
        stream: Any | None = None,
        shared_mem: int = 0,
        on_error: str = "return",
        **kwargs: Any,
    ) -> KernelExecutionResult:
        """Run ``kernel`` over ``args`` and wait for it; see each backend for launch rules.

        ``shared_mem`` is the dynamic shared memory per block in bytes (CUDA only; other
        backends ignore it). Other keyword arguments go to the kernel (CPU and Metal).
        ``on_error="return"`` (the default, as in PyDotCompute 0.2) turns an exception from
        the kernel into a result with ``success=False`` and ``error`` set;
        ``on_error="raise"`` lets it propagate.
        """

    @abstractmethod
    def compile_kernel(
        self, func: Callable[..., Any] | str, signature: Any | None = None, **options: Any
    ) -> Any:
        """Compile ``func`` for this backend (through the shared ``KernelCompiler``)."""

    def load_ptx(self, ptx: str, name: str) -> Any:
        """Load PTX text on the current device and return its kernel ``name``.

        Only the CUDA backend can; the others raise.

        Raises:
            BackendNotAvailableError: this backend cannot load PTX.
        """
        raise BackendNotAvailableError(
            f"the {self.backend_type.value} backend cannot load PTX (kernel {name!r}); "
            "PTX runs on the cuda backend"
        )

    @abstractmethod
    def get_vector_add_kernel(self) -> Callable[..., Any]:
        """A vector add: ``(a, b, out)`` on the CPU and CUDA; ``(a, b) -> a + b`` on Metal,
        whose arrays are immutable."""

    @abstractmethod
    def get_matrix_multiply_kernel(self) -> Callable[..., Any]:
        """A matrix product: ``(a, b, out)`` on the CPU and CUDA; ``(a, b) -> a @ b`` on Metal."""

    # --- helpers for subclasses -------------------------------------------------------------

    @staticmethod
    def kernel_name(kernel: Any) -> str:
        """The name a launch of ``kernel`` is recorded under (its ``name``, ``__name__``, or
        the name of the Python function a compiled kernel wraps)."""
        for attr in ("name", "__name__"):
            value = getattr(kernel, attr, None)
            if isinstance(value, str):
                return value
        py_func = getattr(kernel, "py_func", None)
        return getattr(py_func, "__name__", type(kernel).__name__)

    _kernel_name = kernel_name  # the name subclasses have used

    @staticmethod
    def _now() -> float:
        return time.perf_counter()

    def __repr__(self) -> str:
        if self.is_available:
            return f"{type(self).__name__}(available=True, device={self.name!r})"
        return (
            f"{type(self).__name__}(available=False, device={self.name!r}, reason={self._reason!r})"
        )


def as_shape(shape: int | Sequence[int]) -> Shape:
    """Normalise ``shape`` (an int or a sequence of non-negative ints) to a tuple.

    Raises:
        InvalidConfigurationError: a dimension is negative or not an int.
    """
    if type(shape) is int and shape >= 0:  # fast paths for the common cases
        return (shape,)
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape
    from ..exceptions import InvalidConfigurationError

    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0 for d in dims):
        raise InvalidConfigurationError(
            f"shape must be an int or a tuple of non-negative ints, got {shape!r}"
        )
    return tuple(int(d) for d in dims)
