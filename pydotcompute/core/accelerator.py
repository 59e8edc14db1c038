"""Device discovery: CUDA GPUs (CuPy runtime), Metal (MLX) and the CPU.

``Accelerator()`` is a process-wide singleton that probes once, lazily, and never raises
because a library or driver is missing: a failed probe is recorded in
``unavailable_reasons`` and the CPU is used. ``PYDOTCOMPUTE_BACKEND`` (``auto``, ``cpu``,
``cuda``, ``metal``) overrides the automatic choice (CUDA, then a Metal GPU, then the CPU);
asking for a backend that is not usable falls back to the CPU with a ``RuntimeWarning`` that
says why. With ``NUMBA_ENABLE_CUDASIM=1`` the Numba CUDA simulator counts as one CUDA device
(``is_simulated``), so the CUDA paths can be exercised without hardware.

Backend instances come from ``backends._registry`` and the CUDA probes from
``backends._cuda_probe``, both leaves: the backends use the compiler, which asks this module.
"""

from __future__ import annotations

import enum
import os
import platform
import threading
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from ..backends._cuda_probe import cuda_simulator_enabled, numba_cuda
from ..backends._registry import backend_instance, reset_backends
from ..exceptions import InvalidConfigurationError

__all__ = (
    "Accelerator",
    "DeviceProperties",
    "DeviceType",
    "MemoryInfo",
    "cuda_available",
    "get_accelerator",
    "metal_available",
)

ENV_BACKEND = "PYDOTCOMPUTE_BACKEND"


class DeviceType(enum.Enum):
    """Kinds of device; the values match ``BackendType`` and ``PYDOTCOMPUTE_BACKEND``."""

    CPU = "cpu"
    CUDA = "cuda"
    METAL = "metal"


@dataclass(frozen=True, slots=True)
class DeviceProperties:
    """What a device is and can do. ``compute_capability`` is ``(0, 0)`` off CUDA (None is
    accepted too); ``compute_capability_str`` is then ``"N/A"``."""

    device_id: int
    device_type: DeviceType
    name: str
    compute_capability: tuple[int, int] | None = (0, 0)
    total_memory: int = 0
    multiprocessor_count: int = 0
    max_threads_per_block: int = 1
    max_block_dims: tuple[int, int, int] = (1, 1, 1)
    max_grid_dims: tuple[int, int, int] = (1, 1, 1)
    warp_size: int = 1
    is_available: bool = True
    is_simulated: bool = False

    @property
    def compute_capability_str(self) -> str:
        """``"8.0"``-style compute capability; ``"N/A"`` when there is none (None, or
        ``(0, 0)`` on a device that is not CUDA)."""
        cc = self.compute_capability
        if cc is None or (tuple(cc) == (0, 0) and self.device_type is not DeviceType.CUDA):
            return "N/A"
        return f"{cc[0]}.{cc[1]}"

    @property
    def total_memory_gb(self) -> float:
        """Total memory in GiB."""
        return self.total_memory / 2**30


class MemoryInfo(tuple[int, int]):
    """``Accelerator.get_memory_info()``: a ``(free, total)`` tuple that also reads as
    PyDotCompute 0.2's dict: ``info["free"]``, ``info["total"]``, ``info["used"]``,
    ``"used" in info``, ``keys()``, ``items()`` (plus any extra keys a backend reports)."""

    extra: dict[str, int]  # keys beyond free/total/used that the backend reports

    def __new__(cls, free: int, total: int, extra: dict[str, int] | None = None) -> MemoryInfo:
        info = super().__new__(cls, (int(free), int(total)))
        info.extra = dict(extra or {})
        return info

    @property
    def free(self) -> int:
        return self[0]

    @property
    def total(self) -> int:
        return self[1]

    @property
    def used(self) -> int:
        """``total - free`` (0.2 on Metal: the cache memory, reported as an extra key)."""
        return self.extra.get("used", max(0, self[1] - self[0]))

    def as_dict(self) -> dict[str, int]:
        return {"free": self[0], "total": self[1], "used": self.used, **self.extra}

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return self.as_dict()[key]
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return key in self.as_dict()
        return super().__contains__(key)

    def keys(self) -> list[str]:
        return list(self.as_dict())

    def items(self) -> list[tuple[str, int]]:
        return list(self.as_dict().items())

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_dict().get(key, default)


def _host_memory() -> tuple[int, int]:
    """(available, total) physical memory in bytes, (0, 0) where unknown."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        avail = os.sysconf("SC_AVPHYS_PAGES") * page
        return int(avail), int(total)
    except (ValueError, OSError, AttributeError):
        return 0, 0


def _cpu_device() -> DeviceProperties:
    name = platform.processor() or platform.machine() or "cpu"
    return DeviceProperties(
        device_id=0,
        device_type=DeviceType.CPU,
        name=name,
        total_memory=_host_memory()[1],
        multiprocessor_count=os.cpu_count() or 1,
    )


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _probe_cuda() -> tuple[list[DeviceProperties], str | None]:
    """CUDA devices, or an empty list and the reason. Never raises."""
    if cuda_simulator_enabled():
        try:
            cuda = numba_cuda()

            cc = tuple(cuda.get_current_device().compute_capability)
            return [
                DeviceProperties(
                    device_id=0,
                    device_type=DeviceType.CUDA,
                    name="Numba CUDA simulator",
                    compute_capability=(int(cc[0]), int(cc[1])),
                    multiprocessor_count=1,
                    max_threads_per_block=1024,
                    max_block_dims=(1024, 1024, 64),
                    max_grid_dims=(2**31 - 1, 65535, 65535),
                    warp_size=32,
                    is_simulated=True,
                )
            ], None
        except Exception as exc:
            return [], f"the Numba CUDA simulator failed to start: {exc}"
    try:
        import cupy
    except Exception as exc:
        numba_devices = _probe_cuda_numba()
        if numba_devices:
            return numba_devices, None
        return [], f'CuPy is not installed ({exc}); pip install "pydotcompute[cuda]"'
    try:
        runtime = cupy.cuda.runtime
        count = int(runtime.getDeviceCount())
        devices = []
        for i in range(count):
            p = runtime.getDeviceProperties(i)
            devices.append(
                DeviceProperties(
                    device_id=i,
                    device_type=DeviceType.CUDA,
                    name=_text(p.get("name", f"cuda:{i}")),
                    compute_capability=(int(p.get("major", 0)), int(p.get("minor", 0))),
                    total_memory=int(p.get("totalGlobalMem", 0)),
                    multiprocessor_count=int(p.get("multiProcessorCount", 0)),
                    max_threads_per_block=int(p.get("maxThreadsPerBlock", 1024)),
                    max_block_dims=tuple(int(x) for x in p.get("maxThreadsDim", (1, 1, 1))),  # type: ignore[arg-type]
                    max_grid_dims=tuple(int(x) for x in p.get("maxGridSize", (1, 1, 1))),  # type: ignore[arg-type]
                    warp_size=int(p.get("warpSize", 32)),
                )
            )
    except Exception as exc:
        return [], f"CuPy found no usable CUDA GPU ({exc})"
    if not devices:
        return [], "CuPy found no CUDA GPU"
    return devices, None


def _probe_cuda_numba() -> list[DeviceProperties]:
    """CUDA devices seen by Numba (used when CuPy is missing); empty on any failure."""
    try:
        cuda = numba_cuda()
        if not cuda.is_available():
            return []
        devices = []
        for i, gpu in enumerate(cuda.gpus):
            cc = tuple(gpu.compute_capability)
            name = getattr(gpu, "name", f"cuda:{i}")
            devices.append(
                DeviceProperties(
                    device_id=i,
                    device_type=DeviceType.CUDA,
                    name=_text(name),
                    compute_capability=(int(cc[0]), int(cc[1])),
                    max_threads_per_block=1024,
                    max_block_dims=(1024, 1024, 64),
                    max_grid_dims=(2**31 - 1, 65535, 65535),
                    warp_size=32,
                )
            )
        return devices
    except Exception:
        return []


def _probe_metal() -> tuple[list[DeviceProperties], str | None, bool]:
    """Metal devices, the reason there are none, and whether MLX itself imports."""
    try:
        import mlx.core as mx
    except Exception as exc:
        return [], f'MLX is not installed ({exc}); pip install "pydotcompute[metal]"', False
    try:
        if not mx.metal.is_available():
            return [], f"MLX has no Metal GPU here (it runs on {mx.default_device()})", True
        info: dict[str, Any] = {}
        try:
            info = dict(mx.device_info())
        except Exception:
            info = {}
        return (
            [
                DeviceProperties(
                    device_id=0,
                    device_type=DeviceType.METAL,
                    name=_text(info.get("device_name", "Apple GPU")),
                    total_memory=int(info.get("memory_size", 0) or 0),
                    max_threads_per_block=1024,
                    max_block_dims=(1024, 1024, 1024),
                    max_grid_dims=(2**31 - 1, 65535, 65535),
                    warp_size=32,
                )
            ],
            None,
            True,
        )
    except Exception as exc:
        return [], f"MLX Metal probe failed ({exc})", True


class Accelerator:
    """The process-wide view of compute devices (a singleton).

    Every attribute is computed on the first access and cached; ``refresh()`` probes again.
    Nothing here raises because CuPy, Numba, MLX or a driver is missing.
    """

    _instance: ClassVar[Accelerator | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    # one lock for the one instance (a class attribute: a fresh instance after
    # ``_reset_for_tests`` shares it); nothing is probed until an attribute asks
    _lock: ClassVar[threading.RLock] = threading.RLock()
    _probed: bool = False

    def __new__(cls) -> Accelerator:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = super().__new__(cls)
            return cls._instance

    def _probe(self) -> None:
        with self._lock:
            if self._probed:
                return
            requested = os.environ.get(ENV_BACKEND, "auto").strip().lower() or "auto"
            valid = ("auto", "cpu", "cuda", "metal")
            if requested not in valid:
                raise InvalidConfigurationError(
                    f"{ENV_BACKEND}={requested!r} is not a backend; use one of {', '.join(valid)}"
                )
            self._cuda_devices, cuda_reason = _probe_cuda()
            self._metal_devices, metal_reason, mlx_ok = _probe_metal()
            self._cpu = _cpu_device()
            self._reasons: dict[str, str] = {}
            if cuda_reason:
                self._reasons["cuda"] = cuda_reason
            if metal_reason:
                self._reasons["metal"] = metal_reason
            self._requested = requested
            self._backend = self._choose(requested, mlx_ok)
            self._current = 0
            self._probed = True

    def _choose(self, requested: str, mlx_ok: bool) -> DeviceType:
        if requested == "auto":
            if self._cuda_devices:
                return DeviceType.CUDA
            if self._metal_devices:
                return DeviceType.METAL
            return DeviceType.CPU
        if requested == "cuda":
            if self._cuda_devices:
                return DeviceType.CUDA
            warnings.warn(
                f"{ENV_BACKEND}=cuda but CUDA is unavailable ({self._reasons.get('cuda')}); "
                "using the CPU",
                RuntimeWarning,
                stacklevel=4,
            )
            return DeviceType.CPU
        if requested == "metal":
            if self._metal_devices:
                return DeviceType.METAL
            if mlx_ok:
                # Explicit request: MLX works (its CPU build), so honour it without a GPU.
                import mlx.core as mx

                self._metal_devices = [
                    DeviceProperties(
                        device_id=0,
                        device_type=DeviceType.METAL,
                        name=f"MLX {mx.default_device()} (no Metal GPU)",
                        total_memory=self._cpu.total_memory,
                    )
                ]
                return DeviceType.METAL
            warnings.warn(
                f"{ENV_BACKEND}=metal but MLX is unavailable ({self._reasons.get('metal')}); "
                "using the CPU",
                RuntimeWarning,
                stacklevel=4,
            )
        return DeviceType.CPU

    # --- public surface --------------------------------------------------------------------

    @property
    def backend_type(self) -> DeviceType:
        """The device type compute goes to by default (after ``PYDOTCOMPUTE_BACKEND``)."""
        self._probe()
        return self._backend

    @property
    def requested_backend(self) -> str:
        """The raw ``PYDOTCOMPUTE_BACKEND`` value (``"auto"`` when unset)."""
        self._probe()
        return self._requested

    @property
    def cuda_available(self) -> bool:
        """Whether at least one CUDA device (or the CUDA simulator) is usable."""
        self._probe()
        return bool(self._cuda_devices)

    @property
    def cuda_simulated(self) -> bool:
        """Whether the CUDA devices are the Numba simulator."""
        self._probe()
        return any(d.is_simulated for d in self._cuda_devices)

    @property
    def metal_available(self) -> bool:
        """Whether a Metal GPU is usable through MLX (``False`` for MLX's CPU build)."""
        self._probe()
        return any("no Metal GPU" not in d.name for d in self._metal_devices)

    @property
    def unavailable_reasons(self) -> dict[str, str]:
        """``{"cuda": why, "metal": why}`` for each backend that was not found."""
        self._probe()
        return dict(self._reasons)

    def _active_devices(self) -> list[DeviceProperties]:
        if self._backend is DeviceType.CUDA:
            return self._cuda_devices
        if self._backend is DeviceType.METAL:
            return self._metal_devices
        return [self._cpu]

    @property
    def device_count(self) -> int:
        """Number of devices of the active backend type (1 for the CPU)."""
        self._probe()
        return len(self._active_devices())

    @property
    def devices(self) -> list[DeviceProperties]:
        """Every device found: CUDA devices, then Metal, then the CPU."""
        self._probe()
        return [*self._cuda_devices, *self._metal_devices, self._cpu]

    @property
    def current_device_id(self) -> int:
        """Index of the current device within the active backend."""
        self._probe()
        return self._current

    @property
    def current_device(self) -> DeviceProperties:
        """Properties of the current device."""
        self._probe()
        return self._active_devices()[self._current]

    def get_device(self, device_id: int = 0) -> DeviceProperties:
        """Properties of device ``device_id`` of the active backend.

        Raises:
            InvalidConfigurationError: no such device.
        """
        self._probe()
        devices = self._active_devices()
        if not isinstance(device_id, int) or not 0 <= device_id < len(devices):
            raise InvalidConfigurationError(
                f"no {self._backend.value} device {device_id!r}; valid ids are "
                f"0..{len(devices) - 1}"
            )
        return devices[device_id]

    def set_device(self, device_id: int) -> None:
        """Make ``device_id`` current (and CuPy's current device on CUDA).

        Raises:
            InvalidConfigurationError: no such device.
        """
        props = self.get_device(device_id)
        with self._lock:
            if props.device_type is DeviceType.CUDA and not props.is_simulated:
                import cupy

                cupy.cuda.Device(device_id).use()
            self._current = device_id

    def get_backend(self) -> Any:
        """The ``Backend`` instance for the current device."""
        return backend_instance(self.backend_type.value, self.current_device_id)

    def synchronize(self) -> None:
        """Wait for all queued work on the current device (a no-op on the CPU)."""
        if self.backend_type is DeviceType.CPU:
            return
        self.get_backend().synchronize()

    def get_memory_info(self) -> MemoryInfo:
        """Free and total bytes of the current device (host memory on the CPU).

        A ``MemoryInfo``: unpacks as ``(free_bytes, total_bytes)`` and reads as a dict with
        ``free``, ``total`` and ``used`` (on Metal also ``cache_memory``/``peak_memory``).
        """
        kind = self.backend_type
        if kind is DeviceType.CUDA and not self.cuda_simulated:
            free, total = self.get_backend().get_memory_info()
            return MemoryInfo(free, total)
        if kind is DeviceType.METAL:
            try:
                import mlx.core as mx

                total = self.current_device.total_memory or _host_memory()[1]
                extra = {
                    key: int(getattr(mx, f"get_{key}")())
                    for key in ("cache_memory", "peak_memory")
                    if hasattr(mx, f"get_{key}")
                }
                return MemoryInfo(max(0, total - int(mx.get_active_memory())), total, extra)
            except Exception:
                return MemoryInfo(*_host_memory())
        return MemoryInfo(*_host_memory())

    def refresh(self) -> None:
        """Probe again (after installing a library or changing ``PYDOTCOMPUTE_BACKEND``)."""
        with self._lock:
            self._probed = False
        reset_backends()
        self._probe()

    def summary(self) -> dict[str, Any]:
        """A plain dict for ``show_config()`` and bug reports. Never raises."""
        try:
            self._probe()
            return {
                "backend": self._backend.value,
                "requested": self._requested,
                "cuda_available": self.cuda_available,
                "cuda_simulated": self.cuda_simulated,
                "metal_available": self.metal_available,
                "devices": [
                    {
                        "id": d.device_id,
                        "type": d.device_type.value,
                        "name": d.name,
                        "compute_capability": d.compute_capability_str,
                        "memory_gb": round(d.total_memory_gb, 2),
                    }
                    for d in self.devices
                ],
                "unavailable": self.unavailable_reasons,
            }
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    @classmethod
    def _reset_for_tests(cls) -> None:
        """Drop the singleton so the next ``Accelerator()`` probes from scratch."""
        with cls._instance_lock:
            cls._instance = None
        reset_backends()

    def __repr__(self) -> str:
        if not self._probed:  # a repr does not start the (slow) probe
            return "Accelerator(devices=?, not probed yet)"
        return (
            f"Accelerator(devices={self.device_count}, cuda_available={self.cuda_available}, "
            f"metal_available={self.metal_available}, current_device={self.current_device.name}, "
            f"backend={self._backend.value})"
        )


def get_accelerator() -> Accelerator:
    """The ``Accelerator`` singleton."""
    return Accelerator()


def cuda_available() -> bool:
    """Whether a CUDA device (or the CUDA simulator) is usable. Never raises."""
    try:
        return get_accelerator().cuda_available
    except Exception:
        return False


def metal_available() -> bool:
    """Whether a Metal GPU is usable through MLX. Never raises."""
    try:
        return get_accelerator().metal_available
    except Exception:
        return False
