"""The Ray session of a runtime: Ray itself (reached lazily), actor names, resources.

One `RaySession` per runtime holds what the Ray tier's kernels share: how Ray is
initialized (`address`, `init_options`), the prefix of their Ray actor names, the
batching settings (`max_batch`, `prefetch`, `read_ahead`), the default actor options and
the restart timeout. It keeps no table of kernels: the runtime's registry is the only one.

Design notes:
- A session is found by its runtime through a weak map (`session_for`): the ordinary
  `RingKernelRuntime` needs no Ray-specific attribute, gets a default session on its first
  Ray launch, and `RayRingKernelRuntime` installs one made from its constructor arguments
  (`use_session`).
- ``import pydotcompute`` must never import Ray, and a module of this package is itself
  called ``ray``: the real library is always fetched through `importlib` by absolute name.
"""

from __future__ import annotations

import importlib
import itertools
import os
import re
import uuid
import weakref
from typing import Any

from ....exceptions import BackendNotAvailableError, InvalidConfigurationError
from ...runtime import PLACEMENT_OPTIONS

__all__ = (
    "DEFAULT_MAX_CONCURRENCY",
    "RAY_ACTOR_OPTIONS",
    "RaySession",
    "actor_name",
    "errors",
    "is_ray_available",
    "ray_module",
    "reason",
    "session_for",
    "use_session",
)

#: Launch options passed straight to ``ActorClass.options(...)`` (resources and placement);
#: an in-process launch accepts and ignores them.
RAY_ACTOR_OPTIONS = PLACEMENT_OPTIONS
#: Ray threads per kernel actor: calls that can wait in it at once (parked fetch and watch,
#: pushes waiting for room, concurrent ``send_and_receive`` callers).
DEFAULT_MAX_CONCURRENCY = 64
MIN_CONCURRENCY = 4
_session_ids = itertools.count(1)


def is_ray_available() -> bool:
    """True when the ``ray`` package can be imported (``pip install "pydotcompute[ray]"``)."""
    try:
        importlib.import_module("ray")
    except ImportError:
        return False
    return True


def ray_module() -> Any:
    """The ``ray`` package, or ``BackendNotAvailableError`` naming the extra to install."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise BackendNotAvailableError(
            f"the Ray runtime needs the 'ray' package ({exc}); "
            'install it with: pip install "pydotcompute[ray]"'
        ) from exc


def actor_name(prefix: str, kernel_id: str) -> str:
    """The Ray actor name of ``kernel_id`` in the session whose names start with ``prefix``."""
    return f"{prefix}{kernel_id}"


class RayErrors:
    """The Ray exception classes the tier catches, looked up once."""

    actor: type[BaseException]
    unavailable: tuple[type[BaseException], ...]

    def __init__(self) -> None:
        mod = importlib.import_module("ray.exceptions")
        self.actor = mod.RayActorError
        unavailable = getattr(mod, "ActorUnavailableError", None)
        self.unavailable = (unavailable,) if unavailable is not None else ()


_ERRORS: RayErrors | None = None


def errors() -> RayErrors:
    """The Ray exception classes (`RayErrors`), imported on first use."""
    global _ERRORS
    if _ERRORS is None:
        _ERRORS = RayErrors()
    return _ERRORS


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def reason(exc: BaseException) -> str:
    """The telling line of a Ray actor error: the exception that broke it, or why it died."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line) and not line.startswith("ray."):
            return line
    for line in reversed(lines):
        if line.lower().startswith(("the actor is dead because", "the actor died because")):
            return line
    return lines[0] if lines else type(exc).__name__


class RaySession:
    """What the Ray-tier kernels of one runtime share (see the module notes).

    Args:
        address: Passed to ``ray.init(address=...)`` when Ray is not initialized yet
            (``"auto"`` or ``"ray://head:10001"`` to join an existing cluster). When Ray is
            already initialized it is used as is.
        init_options: More ``ray.init`` keyword arguments (``runtime_env``, ``namespace``,
            ``num_cpus`` for a local instance, ...). A session that initialized Ray shuts
            it down again in `close`.
        max_batch: The most messages one Ray call carries (sends and forwards).
        prefetch: The most replies one fetch brings back to the driver.
        actor_options: Default ``ActorClass.options(...)`` for every kernel (per-kernel
            launch options override them).
        enable_telemetry: Time every message inside the actors.
        restart_timeout: Seconds to wait for Ray to bring a restarting actor back before
            the kernel is declared FAILED.
        read_ahead: Once a kernel's replies have been received, keep one fetch parked in
            its actor so the next reply comes back without waiting for a receive call.
        name: Prefix of the Ray actor names (default: unique per session).
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        init_options: dict[str, Any] | None = None,
        max_batch: int = 1024,
        prefetch: int = 1024,
        actor_options: dict[str, Any] | None = None,
        enable_telemetry: bool = True,
        restart_timeout: float = 60.0,
        read_ahead: bool = True,
        name: str | None = None,
    ) -> None:
        if type(max_batch) is not int or max_batch < 1:
            raise InvalidConfigurationError(f"max_batch must be an int >= 1, got {max_batch!r}")
        if type(prefetch) is not int or prefetch < 1:
            raise InvalidConfigurationError(f"prefetch must be an int >= 1, got {prefetch!r}")
        self.address = address
        self.init_options = dict(init_options or {})
        self.max_batch = max_batch
        self.prefetch = prefetch
        self.actor_options = dict(actor_options or {})
        self.enable_telemetry = enable_telemetry
        self.restart_timeout = restart_timeout
        self.read_ahead = read_ahead
        tag = name or f"{os.getpid():x}-{next(_session_ids)}-{uuid.uuid4().hex[:8]}"
        self.name_prefix = f"pydotcompute/{tag}/"
        self.owns_ray = False

    def __repr__(self) -> str:
        return f"<RaySession prefix={self.name_prefix!r} owns_ray={self.owns_ray}>"

    def start(self) -> None:
        """Initialize Ray unless it already is (idempotent)."""
        ray = ray_module()
        if not ray.is_initialized():
            opts = {"include_dashboard": False, "log_to_driver": True, **self.init_options}
            if self.address is not None:
                opts["address"] = self.address
            ray.init(**opts)
            self.owns_ray = True
        errors()

    def close(self) -> None:
        """Shut Ray down if this session initialized it."""
        if self.owns_ray:
            self.owns_ray = False
            ray_module().shutdown()

    def actor_name(self, kernel_id: str) -> str:
        """The Ray actor name of ``kernel_id`` in this session."""
        return actor_name(self.name_prefix, kernel_id)

    def options_for(
        self, kernel_id: str, opts: dict[str, Any], ray_options: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The ``ActorClass.options(...)`` of a kernel: the session's defaults, then the
        placement options taken out of ``opts`` (in place), then ``ray_options``.

        Raises:
            InvalidConfigurationError: ``max_concurrency`` too small for the tier's calls.
        """
        actor_opts = dict(self.actor_options)
        for key in RAY_ACTOR_OPTIONS & set(opts):
            value = opts.pop(key)
            if value is not None:
                actor_opts[key] = value
        actor_opts.update(ray_options or {})
        concurrency = actor_opts.setdefault("max_concurrency", DEFAULT_MAX_CONCURRENCY)
        if type(concurrency) is not int or concurrency < MIN_CONCURRENCY:
            raise InvalidConfigurationError(
                f"kernel {kernel_id!r}: max_concurrency must be an int >= {MIN_CONCURRENCY} "
                f"(a parked fetch, a watch, a push and a request run at once), got "
                f"{concurrency!r}"
            )
        return actor_opts

    @staticmethod
    def check_resources(kernel_id: str, actor_opts: dict[str, Any]) -> None:
        """Refuse resources the cluster does not have at all.

        Raises:
            InvalidConfigurationError: naming the resource, what was asked and what exists.
        """
        wanted: dict[str, float] = {}
        for key, res in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            if actor_opts.get(key):
                wanted[res] = float(actor_opts[key])
        for res, amount in (actor_opts.get("resources") or {}).items():
            wanted[res] = float(amount)
        if not wanted:
            return
        total = ray_module().cluster_resources()
        for res, amount in wanted.items():
            have = float(total.get(res, 0.0))
            if amount > have:
                raise InvalidConfigurationError(
                    f"kernel {kernel_id!r} asks Ray for {amount:g} {res} but the cluster has "
                    f"{have:g}; connect to a cluster that has it (ray.init(address=...)), "
                    "lower the request, or pass check_resources=False to wait for an "
                    "autoscaler"
                )


_SESSIONS: weakref.WeakKeyDictionary[Any, RaySession] = weakref.WeakKeyDictionary()


def use_session(runtime: Any, session: RaySession) -> None:
    """Have `runtime`'s Ray-tier kernels use `session` (before its first Ray launch)."""
    _SESSIONS[runtime] = session


def session_for(runtime: Any, *, enable_telemetry: bool = True) -> RaySession:
    """The `RaySession` of `runtime`, made with default settings on first use."""
    if runtime is None:
        return RaySession(enable_telemetry=enable_telemetry)
    session = _SESSIONS.get(runtime)
    if session is None:
        session = _SESSIONS[runtime] = RaySession(enable_telemetry=enable_telemetry)
    return session
