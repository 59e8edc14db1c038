"""Drive actors deterministically: scripted messages in, replies collected, no sleeps.

Design notes:
- "Idle" means no kernel can make progress without a new message: every ACTIVE kernel has
  an empty inbox and its actor is parked in ``ctx.receive()``. Each kernel answers through
  its read-only ``is_idle`` property (tiers that run actors elsewhere answer for
  themselves). `wait_until_idle` polls it on the event loop and requires two idle
  polls in a row with a loop turn in between, so work already scheduled with ``call_soon``
  cannot slip past. Sleeping a fixed time was rejected: it is slow or flaky, usually both.
- Kernels that are not ACTIVE (launched, deactivated, terminated, failed) count as idle:
  nothing is delivered to them, so waiting on them could only time out. An actor that
  never parks in ``receive()`` (it sleeps or polls) is never idle; waiting on it times out
  with a message that names it.
- `ScriptedKernel` owns a private runtime unless given one, and drives one kernel;
  `run_actor` is the one-call form. Replies are read from the outbox, so a reply an
  actor forwards elsewhere (``connect``, ``send_to``) is not collected here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..exceptions import KernelFailedError, KernelStateError, QueueClosedError, QueueTimeoutError
from ..ring_kernels.kernel import RingKernel
from ..ring_kernels.runtime import RingKernelRuntime
from ..ring_kernels.states import KernelState

if TYPE_CHECKING:
    from ..ring_kernels.kernel import KernelFunc
    from ..ring_kernels.telemetry import RingKernelTelemetry

__all__ = (
    "ScriptedKernel",
    "assert_no_drops",
    "assert_no_failures",
    "collect_replies",
    "run_actor",
    "wait_until_idle",
)

_FAST_POLLS = 200  # loop turns polled back to back before backing off to 1 ms sleeps


def _kernels_of(target: Any, kernel_ids: Iterable[str] | None = None) -> list[Any]:
    """The kernel objects behind a runtime, a kernel, a ScriptedKernel or a list of them."""
    if isinstance(target, RingKernelRuntime):
        ids = list(kernel_ids) if kernel_ids is not None else target.kernel_ids
        return [target.get_kernel(kid) for kid in ids]
    if isinstance(target, ScriptedKernel):
        return [target.kernel]
    if isinstance(target, RingKernel) or (
        hasattr(target, "kernel_id") and hasattr(target, "state")
    ):
        return [target]
    if isinstance(target, Iterable):
        out: list[Any] = []
        for item in target:
            out.extend(_kernels_of(item))
        return out
    raise TypeError(
        "expected a RingKernelRuntime, a RingKernel, a ScriptedKernel or an iterable of "
        f"kernels, got {type(target).__name__}"
    )


def _busy_reason(kernel: Any) -> str | None:
    """Why ``kernel`` can still make progress, or None when it is idle."""
    if kernel.state is not KernelState.ACTIVE:
        return None
    inbox = getattr(kernel, "inbox", None)
    queued = len(inbox) if inbox is not None else 0
    idle = getattr(kernel, "is_idle", None)
    if idle is None:  # a kernel class without the property: the inbox is all we can see
        return f"its inbox holds {queued} message(s)" if queued else None
    if idle:
        return None
    if queued:
        return f"its inbox holds {queued} message(s)"
    if getattr(kernel, "_task", True) is None:
        return (
            f"its tier ({type(kernel).__name__}) does not report whether its actor waits in "
            "receive(); wait for a known number of replies instead (ScriptedKernel.expect, "
            "run_actor(..., replies=n))"
        )
    return "its actor is busy (not waiting in ctx.receive())"


async def wait_until_idle(
    target: Any, timeout: float = 5.0, *, kernel_ids: Iterable[str] | None = None
) -> None:
    """Return once every kernel is idle: inboxes empty, actors parked in ``receive()``.

    Args:
        target: A ``RingKernelRuntime`` (all its kernels, including ones launched while
            waiting), a ``RingKernel``, a `ScriptedKernel`, or an iterable of them.
        timeout: Seconds to wait before giving up.
        kernel_ids: With a runtime, only these kernels.

    Raises:
        QueueTimeoutError: still busy after ``timeout`` seconds (a ``TimeoutError``); the
            message names each busy kernel and why.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    ids = list(kernel_ids) if kernel_ids is not None else None
    quiet = 0
    polls = 0
    while True:
        busy = [
            (k.kernel_id, reason)
            for k in _kernels_of(target, ids)
            if (reason := _busy_reason(k)) is not None
        ]
        if busy:
            quiet = 0
            if loop.time() >= deadline:
                detail = "; ".join(f"{kid!r}: {why}" for kid, why in busy)
                raise QueueTimeoutError(
                    f"kernels did not become idle within {timeout}s: {detail}. A kernel is "
                    "idle when its inbox is empty and its actor waits in ctx.receive(); an "
                    "actor that sleeps or polls instead never is"
                )
        else:
            quiet += 1
            if quiet >= 2:
                return
        polls += 1
        await asyncio.sleep(0 if polls < _FAST_POLLS else 0.001)


def collect_replies(target: Any, kernel_id: str | None = None) -> list[Any]:
    """Take every reply waiting in a kernel's outbox, without waiting.

    Args:
        target: A ``RingKernelRuntime`` (then ``kernel_id`` is required), a ``RingKernel``
            or a `ScriptedKernel`.
        kernel_id: The kernel, with a runtime.
    """
    if isinstance(target, RingKernelRuntime):
        if kernel_id is None:
            raise TypeError("collect_replies(runtime, kernel_id): kernel_id is required")
        kernel = target.get_kernel(kernel_id)
    else:
        (kernel,) = _kernels_of(target)
    out: list[Any] = []
    while True:
        try:
            reply = kernel.receive_nowait()
        except (QueueClosedError, KernelStateError):
            break  # closed and drained (terminated or failed)
        if reply is None:
            break
        out.append(reply)
    return out


def _describe_messages(messages: list[Any], limit: int = 3) -> str:
    shown = ", ".join(repr(m) for m in messages[:limit])
    more = f", ... ({len(messages) - limit} more)" if len(messages) > limit else ""
    return f"[{shown}{more}]"


def assert_no_drops(target: Any, *kernel_ids: str) -> None:
    """Fail when any kernel dropped or left undelivered a message.

    Looks at the kernel's telemetry (``messages_dropped``), its inbox and outbox counters
    (drops under ``drop_oldest`` backpressure) and ``kernel.undelivered`` (messages left
    when it was terminated or failed).

    Args:
        target: A runtime, a kernel, a `ScriptedKernel` or an iterable of them.
        kernel_ids: With a runtime, only these kernels (default: all).

    Raises:
        AssertionError: naming each kernel, what it lost and where.
    """
    problems: list[str] = []
    for kernel in _kernels_of(target, kernel_ids or None):
        parts: list[str] = []
        for label in ("inbox", "outbox"):
            queue = getattr(kernel, label, None)
            if queue is None:
                continue
            stats = queue.statistics()
            if stats.total_dropped:
                parts.append(
                    f"its {label} dropped {stats.total_dropped} (backpressure "
                    f"{getattr(queue.backpressure, 'value', queue.backpressure)!r})"
                    if label == "inbox"
                    else f"its {label} dropped {stats.total_dropped}"
                )
        undelivered = list(getattr(kernel, "undelivered", ()))
        if undelivered:
            parts.append(
                f"{len(undelivered)} undelivered when it stopped: {_describe_messages(undelivered)}"
            )
        telemetry = getattr(kernel, "telemetry", None)
        dropped = getattr(telemetry, "messages_dropped", 0)
        if dropped and not parts:
            parts.append(f"telemetry counts {dropped} dropped")
        if parts:
            problems.append(f"kernel {kernel.kernel_id!r}: " + "; ".join(parts))
    if problems:
        raise AssertionError("messages were dropped:\n  " + "\n  ".join(problems))


def assert_no_failures(target: Any, *kernel_ids: str) -> None:
    """Fail when any kernel's actor raised (a FAILED kernel, or errors in telemetry).

    Raises:
        AssertionError: naming each kernel and the error it raised.
    """
    problems: list[str] = []
    for kernel in _kernels_of(target, kernel_ids or None):
        error = getattr(kernel, "error", None)
        telemetry = getattr(kernel, "telemetry", None)
        count = getattr(telemetry, "error_count", 0)
        if kernel.state is KernelState.FAILED or error is not None or count:
            what = repr(error) if error is not None else getattr(telemetry, "last_error", None)
            restarts = getattr(telemetry, "restarts", 0)
            extra = f" ({restarts} restart(s))" if restarts else ""
            problems.append(
                f"kernel {kernel.kernel_id!r} is {kernel.state.name}: its actor raised "
                f"{count or 1} time(s), last {what}{extra}"
            )
    if problems:
        raise AssertionError("actors failed:\n  " + "\n  ".join(problems))


class ScriptedKernel:
    """One actor driven step by step: send scripted messages, get back its replies.

    It launches and activates the actor on a private runtime (or ``runtime``) on entry and
    terminates it on exit (shutting a private runtime down). Every method runs on the
    test's event loop.

    Example:

    ```python
    async with ScriptedKernel(compute_actor) as kernel:
        assert await kernel.ask(ComputeRequest(values=[1.0, 2.0])) == ...
        replies = await kernel.feed(req_a, req_b)
    ```

    Args:
        actor: An ``async def actor(ctx)`` (``@ring_kernel`` options are honoured) or the
            id of a registered ``@ring_kernel``.
        kernel_id: Defaults to the ``@ring_kernel`` id or the function's name.
        input_type, output_type: Message types (default: the ``@ring_kernel``'s).
        runtime: Launch into this runtime instead of a private one.
        tier: Execution tier (``asyncio``, ``thread``, ``process``, ...).
        timeout: Seconds any single wait may take.
        options: Further ``runtime.launch`` options (``queue_size``, ``backpressure``...).
    """

    def __init__(
        self,
        actor: KernelFunc | str,
        *,
        kernel_id: str | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
        runtime: RingKernelRuntime | None = None,
        tier: str | None = None,
        timeout: float = 5.0,
        **options: Any,
    ) -> None:
        from ..decorators.ring_kernel import get_ring_kernel_meta
        from ..ring_kernels.registry import get_registered_kernel

        opts: dict[str, Any] = {}
        kid: str
        if isinstance(actor, str):
            spec = get_registered_kernel(actor)
            func: Any = spec.func
            kid = kernel_id or actor
            input_type = input_type if input_type is not None else spec.input_type
            output_type = output_type if output_type is not None else spec.output_type
            opts.update(spec.options)
        else:
            func = actor
            meta = get_ring_kernel_meta(actor)
            if meta is not None:
                kid = kernel_id or meta.kernel_id
                input_type = input_type if input_type is not None else meta.input_type
                output_type = output_type if output_type is not None else meta.output_type
                opts.update(meta.launch_options())
            else:
                kid = kernel_id or str(getattr(actor, "__name__", "actor"))
        opts.update(options)
        if tier is not None:
            opts["tier"] = tier
        self.kernel_id: str = kid
        self.timeout = timeout
        self.received: list[Any] = []
        self._func = func
        self._types = (input_type, output_type)
        self._options = opts
        self._runtime = runtime
        self._owns_runtime = runtime is None
        self._kernel: Any = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> ScriptedKernel:
        """Launch and activate the actor (idempotent)."""
        if self._kernel is not None:
            return self
        if self._runtime is None:
            self._runtime = RingKernelRuntime()
        await self._runtime.start()
        in_t, out_t = self._types
        self._kernel = await self._runtime.launch(
            self.kernel_id, self._func, input_type=in_t, output_type=out_t, **self._options
        )
        await self._kernel.activate()
        return self

    async def stop(self) -> list[Any]:
        """Terminate the actor (draining its inbox); returns undelivered messages.

        Replies still in the outbox are moved to `received`. A private runtime is
        shut down; a shared one forgets the kernel so its id can be launched again.
        """
        kernel = self._kernel
        if kernel is None:
            return []
        left: list[Any] = []
        if kernel.state is not KernelState.TERMINATED:
            left = await kernel.terminate(timeout=self.timeout)
        self.received.extend(collect_replies(kernel))
        runtime = self._runtime
        assert runtime is not None
        if self._owns_runtime:
            await runtime.shutdown(timeout=self.timeout)
        elif self.kernel_id in runtime and runtime.get_kernel(self.kernel_id) is kernel:
            runtime.remove(self.kernel_id)
        return left

    async def __aenter__(self) -> ScriptedKernel:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- introspection -----------------------------------------------------------------------

    @property
    def kernel(self) -> Any:
        """The running kernel (a ``RingKernel`` or a tier's equivalent)."""
        if self._kernel is None:
            raise KernelStateError(
                self.kernel_id, KernelState.CREATED, "use", "enter `async with` or await start()"
            )
        return self._kernel

    @property
    def runtime(self) -> RingKernelRuntime:
        if self._runtime is None:
            raise KernelStateError(
                self.kernel_id, KernelState.CREATED, "use", "enter `async with` or await start()"
            )
        return self._runtime

    @property
    def state(self) -> KernelState:
        return self.kernel.state  # type: ignore[no-any-return]

    @property
    def telemetry(self) -> RingKernelTelemetry:
        return self.runtime.get_counters(self.kernel_id)

    # -- driving -----------------------------------------------------------------------------

    async def send(self, *messages: Any) -> None:
        """Enqueue messages in order without waiting for them to be processed."""
        kernel = self.kernel
        for msg in messages:
            await kernel.send(msg, timeout=self.timeout)

    async def settle(self) -> list[Any]:
        """Wait until the runtime is idle; return the replies produced since the last call.

        Raises:
            KernelFailedError: the actor raised (replies it sent first are in
                `received`).
            QueueTimeoutError: not idle within ``timeout``.
        """
        await wait_until_idle(self.runtime, self.timeout)
        replies = collect_replies(self.kernel)
        self.received.extend(replies)
        kernel = self.kernel
        if kernel.state is KernelState.FAILED:
            err = KernelFailedError(self.kernel_id, kernel.error)
            raise err from kernel.error
        return replies

    async def feed(self, *messages: Any) -> list[Any]:
        """Enqueue every message, then wait until idle; returns the replies (a burst).

        All messages are queued before the actor runs, so priority bands decide the order
        they are handled in.
        """
        await self.send(*messages)
        return await self.settle()

    async def step(self, message: Any) -> list[Any]:
        """Send one message and wait until idle; returns the replies it caused."""
        await self.send(message)
        return await self.settle()

    async def ask(self, message: Any) -> Any:
        """Send one message and return its single reply.

        Raises:
            AssertionError: the actor sent no reply, or more than one.
        """
        replies = await self.step(message)
        if len(replies) != 1:
            raise AssertionError(
                f"kernel {self.kernel_id!r} answered {type(message).__name__} with "
                f"{len(replies)} replies, expected exactly 1: {_describe_messages(replies)}"
            )
        return replies[0]

    async def expect(self, count: int, *, timeout: float | None = None) -> list[Any]:
        """Wait for exactly ``count`` replies (for actors that reply later, or elsewhere).

        Raises:
            QueueTimeoutError: fewer than ``count`` arrived within ``timeout`` (default:
                the kernel's); the message says how many did.
        """
        limit = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        got: list[Any] = []
        kernel = self.kernel
        while len(got) < count:
            try:
                got.append(await kernel.receive(timeout=max(0.0, deadline - loop.time())))
            except QueueTimeoutError:
                self.received.extend(got)
                raise QueueTimeoutError(
                    f"kernel {self.kernel_id!r} sent {len(got)} of {count} expected replies "
                    f"within {limit}s: {_describe_messages(got)}"
                ) from None
        self.received.extend(got)
        return got


async def run_actor(
    actor: KernelFunc | str,
    messages: Iterable[Any],
    *,
    burst: bool = False,
    replies: int | None = None,
    allow_drops: bool = False,
    kernel_id: str | None = None,
    input_type: type | None = None,
    output_type: type | None = None,
    runtime: RingKernelRuntime | None = None,
    tier: str | None = None,
    timeout: float = 5.0,
    **options: Any,
) -> list[Any]:
    """Run ``actor`` over scripted ``messages`` and return every reply, in order.

    Example:

    ```python
    replies = await run_actor(compute_actor, [ComputeRequest(values=[1.0, 2.0])])
    assert [r.result for r in replies] == [3.0]
    ```

    Args:
        actor: An ``async def actor(ctx)`` or a registered ``@ring_kernel`` id.
        messages: The script.
        burst: Queue every message before the actor runs (priority bands then decide the
            order); by default each message is handled, and the kernel idle, before the
            next is sent.
        replies: Instead of waiting for the kernel to be idle, send every message and wait
            for exactly this many replies (more by the time the actor stops is an error).
            Works on every tier, including those that cannot report idleness.
        allow_drops: Do not fail when a message was dropped (``drop_oldest`` backpressure).
        kernel_id, input_type, output_type, runtime, tier, timeout, options: As for
            `ScriptedKernel`.

    Raises:
        KernelFailedError: the actor raised.
        AssertionError: a message was dropped or left unprocessed (unless ``allow_drops``),
            or ``replies`` was given and a different number arrived.
        QueueTimeoutError: the actor did not settle (or send ``replies``) within
            ``timeout``.
    """
    script = ScriptedKernel(
        actor,
        kernel_id=kernel_id,
        input_type=input_type,
        output_type=output_type,
        runtime=runtime,
        tier=tier,
        timeout=timeout,
        **options,
    )
    async with script:
        if replies is not None:
            await script.send(*messages)
            await script.expect(replies)
        elif burst:
            await script.feed(*messages)
        else:
            for msg in messages:
                await script.step(msg)
    if not allow_drops:
        assert_no_drops(script.kernel)
    if replies is not None and len(script.received) != replies:
        raise AssertionError(
            f"kernel {script.kernel_id!r} sent {len(script.received)} replies, expected "
            f"exactly {replies}: {_describe_messages(script.received)}"
        )
    return script.received
