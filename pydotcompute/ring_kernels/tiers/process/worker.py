"""The process tier's parent side: `ProcessWorker`, the actor in a child process.

Use it for CPU-heavy Python actors (a process of their own, no shared GIL) and for
isolation (a crash cannot take the caller down). The actor is a plain, importable
function taking a `ProcessKernelContext` (same methods as the threaded context). The
runtime drives the worker through the tier contract (``tier="process"``); used directly,
`ProcessKernel` (``CythonRingKernel``) is its synchronous façade.

Design notes:
- Transport: two `SharedByteRing` segments
  (inbox parent->child, outbox child->parent) carrying MessagePack bytes
  (``msg.serialize()`` / ``deserialize_message``); the commit protocol of the ring means a
  reader never sees a torn message. The parent creates both, the child attaches, and once
  the child reports ready the parent unlinks both names: the mappings live on in the two
  processes, so no segment can outlive them, whatever happens afterwards.
- Waiting spins, then parks. Each side first polls its ring without the GIL for a spin
  budget (``ProcessKernelConfig.spin_us``, default 50 us), which keeps a ping-pong at a few
  microseconds because neither side sleeps. Past the budget it sets its ``waiting`` flag,
  re-checks, and sleeps in ``poll()`` on a doorbell pipe that the other side writes only
  when it sees the flag (see ``_spsc_py`` for why no wake-up is lost; `waiting` holds
  the helpers). Spinning longer was rejected: on a 2-core machine a spinning process
  that gets descheduled stalls its peer for a scheduler tick (tens of milliseconds).
  ``docs/concepts/tiers.md`` has the measured trade-off behind the default.
- Doorbells: one socket pair carries the parent's rings to the child (inbox data, outbox
  space: the child's actor thread waits for one thing at a time, so one doorbell serves
  both) and the child's "a reply is ready" to the parent; a pipe carries "inbox space"
  to the parent. The parent's two waiting roles keep separate doorbells, so a sender and
  a receiver in different parent threads never steal each other's wake-up.
- Descriptors: the parent holds four per kernel (the socket, the space pipe, the status
  pipe, the child's sentinel): the child's ends are closed once it started, shared
  segments keep none once mapped, and one watcher thread (`watcher.WATCHER`) serves every
  kernel of the process.
- Liveness: every parent-side wait also polls the child's process sentinel, and the
  watcher marks the kernel stopped/failed the moment the child exits, so a crash or a
  ``kill -9`` reaches senders and receivers at once (not after a timeout). The child's
  doorbells hang up when the parent dies, and the child then exits. An exception in
  the actor travels back as plain data (never a pickle: unpickling would run whatever the
  child's class asked for) and becomes ``error``: the builtin type when it was a builtin,
  else `RemoteActorError`, with the child's traceback as a
  note; callers get ``KernelFailedError`` after the replies sent before it.
- What is in flight is never lost. The parent keeps every message it sent until the child
  has *finished* it (the actor asked for its next message, returned, or answered it: a
  reply written after the last ``mark_done`` finishes the one in hand), counted by the
  inbox ring's ``records_done``; when the child ends early, `take_undelivered` hands
  back exactly the unfinished ones, in send order, the one in the actor's hands first.
  Kept objects are pruned lazily, every 64 sends (or every in-flight window, the hand-over
  bound + 1 where the runtime set one, else ``input_queue_size`` + 1, if smaller): at most
  that many finished messages are held beside the unfinished ones, whatever the window.
- A corrupted ring (``RingCorruptedError``: impossible positions or lengths in the shared
  header) fails the kernel and kills the child; it is never read past its end.
- Startup failures name their likely cause, and a spawned child's stderr from before it
  runs our code is tapped into a temporary file (see `launch.StderrTap`) so a script without
  the ``__main__`` guard gets the child's own traceback in the error.
- Graceful stop drains: ``stop()`` closes the inbox for writing, the child processes what
  is queued, ``ctx.receive()`` then raises ``QueueClosedError`` (a clean exit), and the
  parent keeps reading the outbox meanwhile so a child blocked on a full outbox can finish.
  Replies stay receivable after ``stop()`` (`ProcessWorker.drain_replies` takes
  them all); messages the child never took are returned by
  `ProcessWorker.unprocessed`.
- Length: this file is past the house limit on purpose: it is one state machine (launch,
  watch, stop, crash, cleanup) whose parts share the same locks and fields. The child's
  side is `child`, the wire `framing`, the waiting helpers `waiting`, and starting and
  ending a process (stderr tap, exit codes, forks) `launch`.
- Only the process that started a child acts on it at exit (see `launch`): a kernel's
  finalizer does nothing in a process other than the one that created it.
- Batches: `offer_many` encodes each message once and writes the batch with one publish
  (`SharedByteRing.write_many`) and at most one doorbell; `poll_replies` reads every
  ready reply in one call (`read_many`). The hand-over bound (`bound_in_flight`) counts
  a message until the child finished it *and* its replies were read here: the child
  stores the outbox's record count before it marks a message done, which is what tells.
- The worker IS the tier: the contract's methods are its own (`offer` is
  ``send_nowait``, `poll_reply` is ``receive_nowait``), and the loop watches the reply
  doorbell itself (`watch`; the child's exit reaches it from the shared watcher): one
  wake-up fewer per reply than a waker thread. One bell per burst: the loop's bell
  callback withdraws the request for bells, and the poll that next finds the outbox
  empty renews it and checks once more, so replies that arrive while the loop is busy
  with earlier ones ring nothing (every callback polls until the outbox is empty, or
  leaves that to the collector, which does). Its ``state`` is a `KernelState`; a
  failure ends in TERMINATED with ``error`` set, as the standalone kernel always
  reported it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing import connection as mp_connection
from typing import Any

from ....exceptions import (
    InvalidConfigurationError,
    KernelFailedError,
    KernelStateError,
    MessageDeserializationError,
    QueueClosedError,
    ReplyDecodeError,
    RingCorruptedError,
    TypeValidationError,
)
from ... import _native
from ..._native import FastLock, SharedByteRing
from ..._native.spsc_py import SharedSegment
from ...message import expecting, message_decoder
from ...states import KernelState
from ...telemetry import LATENCY_BLOCK_BYTES, SharedLatencyBlock
from ...wakers import Waker, WakerSet
from .. import check_actor_kind
from ..contract import Capabilities, TierWorker
from .child import ChildSpec, child_main
from .config import ProcessKernelConfig, resolve_config
from .framing import (
    ERROR_FRAME,
    FRAME_TAG,
    STATUS_MAX_BYTES,
    TRACE_FRAME,
    decode_value,
    encoder_for,
    no_encoder,
    rebuild_error,
    rejection,
    reply_correlation,
    split_trace,
    too_large,
    trace_header,
    unpack_report,
)
from .launch import (
    StderrTap,
    describe_exit,
    exited,
    raise_fd_limit,
    reap,
    spawn_context,
    startup_hint,
    track,
)
from .waiting import (
    SLICE_S,
    WRITE_WAKE,
    Waiter,
    drain_bell,
    read_parked,
    read_wait,
    ring_bell,
    write_wait,
)
from .watcher import WATCHER

__all__ = ("ProcessWorker",)

_monotonic = time.monotonic
_ACTIVE = KernelState.ACTIVE
# what a caller can do about a kernel in each state
_STATE_HINTS = {
    KernelState.CREATED: "call start() first or use it as a context manager",
    KernelState.TERMINATING: "it is stopping",
    KernelState.TERMINATED: "it has stopped",
}


def _call_wakers(wakers: tuple[Waker, ...]) -> None:
    for wake in wakers:
        wake()


class _RingView:
    """One ring as the parent sees it; the shape adapters expect of ``kernel.inbox``."""

    __slots__ = ("_get", "_kernel", "_when")

    def __init__(self, kernel: ProcessWorker, when: str, get: Callable[[], Any]) -> None:
        self._kernel = kernel
        self._when = when
        self._get = get

    def add_waker(self, callback: Callable[[], None], *, when: str | None = None) -> None:
        """Register ``callback`` for this ring's direction (see ``ProcessWorker.add_waker``)."""
        self._kernel.add_waker(callback, when=when or self._when)

    def remove_waker(self, callback: Callable[[], None]) -> None:
        """Stop calling ``callback``."""
        self._kernel.remove_waker(callback)

    def __len__(self) -> int:
        ring = self._get()
        return 0 if ring is None or ring.closed else len(ring)

    def get_stats(self) -> dict[str, int]:
        """The ring's counters (empty once it is closed)."""
        ring = self._get()
        return {} if ring is None or ring.closed else dict(ring.stats())


class ProcessWorker(TierWorker):
    """A persistent actor in a child process: the process tier's `TierWorker`.

    The runtime drives it through the contract (`offer`, `poll_reply`, ...); used directly
    (through the synchronous façade `ProcessKernel`), ``send``/``receive`` wait.

    Args:
        kernel_id: The kernel's name.
        kernel_func: ``fn(ctx)``, a plain function importable by module path (a module-level
            ``def``): the child imports it.
        config: Ring sizes, spin budget and start method; defaults to
            ``ProcessKernelConfig(kernel_id)``.
        input_type: When given, ``send`` refuses other types.
        output_type: When given, ``ctx.send`` in the child refuses other types, and a
            reply decoded here that is not one is dropped as one that does not decode.
        room: When given, the hand-over bound (`bound_in_flight`) it is built with: the
            runtime's ``bridge_queue_size``.

    Without types it carries ``@message`` instances and any MessagePack-able value (int,
    float, str, bytes, bool, None, lists and dicts of them, NumPy arrays) both ways; plain
    values arrive as their MessagePack equivalents (a tuple as a list).

    Lifecycle: ``state`` goes CREATED -> ACTIVE (running) -> TERMINATING (stopping) ->
    TERMINATED. A kernel whose actor raised, or whose child died, is TERMINATED with
    ``failed`` True and ``error`` set.
    """

    #: Plain-function actors; pools; a room the bridge may widen (`set_room`); a reply
    #: polled for within a budget (`reply_within`); the latencies the child timed; trace
    #: context in each record's header.
    CAPABILITIES = Capabilities(
        replicas=True, resize=True, inline_request=True, telemetry_refresh=True, trace_wire=True
    )
    # one reply bell per burst while an event loop watches (see the module notes); False
    # rings on every reply, as before (kept to measure the difference)
    BATCH_BELLS = True

    def __init__(
        self,
        kernel_id: str,
        kernel_func: Any,
        *,
        config: ProcessKernelConfig | None = None,
        input_type: type | None = None,
        output_type: type | None = None,
        room: int | None = None,
    ) -> None:
        config = resolve_config(kernel_id, config, ProcessKernelConfig)
        if not callable(kernel_func):
            raise TypeValidationError(
                f"kernel {kernel_id!r} needs a callable actor taking one context argument, "
                f"got {type(kernel_func).__name__}"
            )
        check_actor_kind(kernel_id, "process", kernel_func, self.CAPABILITIES.actor_kind)
        try:
            self._func_bytes = pickle.dumps(kernel_func)
        except Exception as exc:
            raise TypeValidationError(
                f"kernel {kernel_id!r} runs its actor in a child process, so the function must "
                f"be importable by module path (a module-level def); "
                f"{getattr(kernel_func, '__qualname__', kernel_func)!r} is not ({exc}). Move it "
                "to module level, or use ThreadedRingKernel"
            ) from exc
        if output_type is not None:
            try:
                pickle.dumps(output_type)
            except Exception as exc:
                raise TypeValidationError(
                    f"kernel {kernel_id!r}: output_type {output_type.__qualname__} must be "
                    f"importable by module path to reach the child process ({exc})"
                ) from exc
        self._kernel_id = kernel_id
        self._config = config
        self._input_type = input_type
        self._output_type = output_type
        self._check_fields = config.check_fields
        self._state = KernelState.CREATED
        self._error: BaseException | None = None
        self._state_lock = threading.Lock()
        # every round trip takes both: the compiled lock skips threading.Lock's argument
        # parsing (about 65 ns a pair on Python 3.11)
        self._send_lock = FastLock()
        self._recv_lock = FastLock()
        self._unprocessed: list[Any] = []
        self._started_at = 0.0
        self._stopped_at = 0.0
        self._spin_s = config.spin_us / 1e6
        self._exit_lock = threading.Lock()
        self._process: Any = None
        self._in_ring: Any = None
        self._out_ring: Any = None
        self._conns: list[Any] = []
        self._in_data_fd = -1  # the doorbell socket: the parent rings the child on it
        self._out_space_fd = -1  # (the same socket)
        self._bell_fd = -1  # the same socket again: the child rings "a reply is ready"
        self._space_fd = -1  # the pipe the child rings when it freed inbox space
        self._send_waiter: Waiter | None = None
        self._recv_waiter: Waiter | None = None
        self._watched: tuple[int, ...] = ()  # what the shared watcher watches for us
        self._lent = False  # an event loop watches the bell socket (see `watch`)
        self._rebell: Callable[[], None] | None = None  # ring the loop's bell callback
        self._lent_close: Any = None  # the bell and space pipe, closed when the loop is done
        self._exit_hooks: list[Callable[[], None]] = []
        self._wakers = WakerSet()
        self._space_armed = False
        self._cleaned = False
        # (type, encoder) of the last type sent, replaced as one object: two threads sending
        # different types must never pair one type with the other's encoder
        self._codec: tuple[type | None, Callable[[Any], bytes]] = (None, no_encoder)
        # `trace_wire`'s callbacks (a tracing runtime only)
        self._trace_header: Callable[[Any], tuple[int, int, int] | None] | None = None
        self._trace_received: Callable[[Any, int, int, int], None] | None = None
        # (message, its bytes) measured by the caller: the next send of that very object
        # writes these instead of encoding it again (see `keep_encoded`)
        self._encoded: tuple[Any, bytes] | None = None
        self._traced = False  # `trace_wire` prefixes records: measured bytes do not apply
        self._in_max = 0
        # messages sent and not known to be finished by the child, oldest first
        self._inflight: list[Any] = []  # a list: pruning drops a prefix in one call
        self._pruned = 0  # finished messages dropped from the front of ``_inflight``
        # kept messages are pruned every `_prune_step` sends (see the design notes)
        self._prune_step = min(config.input_queue_size + 1, 64)
        self._prune_at = self._prune_step
        # the hand-over bound plus the actor's hand (`bound_in_flight`; 0: none): messages
        # whose replies were all read here (``_consumed``, inbox records) leave it;
        # ``_gated``: an offer was refused by it, so the reads and the child's finishes
        # that open it wake the writable wakers
        self._bound = 0
        self._consumed = 0
        self._gated = False
        self._final_counts: tuple[int, int] | None = None  # (taken, done) once the child ended
        self._answered_at_exit = False  # see `answered_at_exit`
        self._undelivered_taken = False
        self._rx: Any = None  # the outbox ring while receiving from it is allowed
        self._status: Any = None
        self._child_exited = False
        self._stop_requested = False
        self._pending_out: deque[bytes] = deque()
        # the outbox's stream (its type's fast path), checked against ``output_type``
        self._decode = expecting(message_decoder(), output_type, kernel_id)
        self._exit_code: int | None = None
        self._pid: int | None = None
        # the child's message timings (config.record_latency): the segment, its view, and
        # what was read from it when it was closed (handed over by the next drain)
        self._lat_seg: SharedSegment | None = None
        self._lat: SharedLatencyBlock | None = None
        self._lat_left: list[Any] = []
        self._lat_lock = threading.Lock()

        self._owner_pid = os.getpid()  # only this process may end the child at exit
        if room is not None:
            self.bound_in_flight(room)

    # -- properties -------------------------------------------------------------------

    @property
    def kernel_id(self) -> str:
        """The kernel's name."""
        return self._kernel_id

    @property
    def config(self) -> ProcessKernelConfig:
        """The configuration it was created with."""
        return self._config

    @property
    def state(self) -> KernelState:
        """Where the kernel is in its lifecycle (see the class docstring)."""
        return self._state

    @property
    def is_running(self) -> bool:
        """True while the child runs and no stop was requested."""
        return self._state is _ACTIVE

    @property
    def error(self) -> BaseException | None:
        """Why the kernel failed: the actor's exception, or the child's death."""
        return self._error

    @property
    def failure(self) -> BaseException | None:
        """`error`, under the name the tier contract uses."""
        return self._error

    @property
    def failed_on(self) -> Any:
        """The message in the actor's hands when it failed (it raised, or the child died):
        taken and not finished. None when it held none, or before the child exited and
        after `take_undelivered` handed it back."""
        with self._send_lock:
            counts = self._final_counts
            if self._error is None or counts is None:
                return None
            taken, done = counts
            i = done - self._pruned
            if taken <= done or not 0 <= i < len(self._inflight):
                return None
            return self._inflight[i]

    @property
    def failed(self) -> bool:
        """True when the actor raised (or the child died unexpectedly)."""
        return self._error is not None

    @property
    def using_cython(self) -> bool:
        """True when the compiled ring is in use (else the pure-Python twin)."""
        return _native.is_cython_available()

    @property
    def pid(self) -> int | None:
        """The child's process id once started."""
        return self._pid

    @property
    def exit_code(self) -> int | None:
        """The child's exit code once it ended (negative: killed by that signal)."""
        return self._exit_code

    @property
    def max_message_bytes(self) -> int:
        """The largest encoded message ``send`` accepts, in bytes (valid before ``start``).

        A ``@message`` counts its ``serialize()`` bytes, a plain value its MessagePack bytes
        plus 2. ``send`` raises ``MessageSerializationError`` for anything larger; raise
        ``ProcessKernelConfig(ring_bytes=N)`` (``launch(..., ring_bytes=N)`` in the
        runtime) to allow up to ``N - 8``.
        """
        return ((self._config.input_ring_bytes + 7) & ~7) - 8

    @property
    def pending_input(self) -> int:
        """Messages sent and not yet taken by the actor (the inbox ring's records).

        At most ``config.input_queue_size``; 0 before ``start``. After the child ended and
        ``stop`` collected the leftovers, the number of messages it never took. With a
        hand-over bound (`bound_in_flight`): the messages it counts, at most the bound.
        """
        ring = self._in_ring
        if ring is not None and not self._cleaned:
            try:
                if self._bound:  # (less the actor's hand)
                    sent = self._pruned + len(self._inflight)
                    return max(self._bound - 1 - self._exact_room(sent), 0)
                return len(ring)
            except ValueError:  # closed by a concurrent stop
                pass
        return len(self._unprocessed)

    def bound_in_flight(self, bound: int) -> None:
        """Have `offer` and `offer_many` hand over at most ``bound`` messages beyond the
        one in the actor's hands (the runtime's ``bridge_queue_size``) that are not
        *consumed*; `pending_input` then counts those, less the actor's hand.

        A message is consumed once the actor asked for its next message after it and
        every reply the child wrote until then was read here (`poll_reply`). Taken is
        not enough: replies already waiting in the outbox come out before whatever is
        handed over next, so a late urgent message would wait behind them too.
        """
        if bound < 1:
            raise InvalidConfigurationError(
                f"kernel {self._kernel_id!r}: the hand-over bound must be >= 1, got {bound!r}"
            )
        self._bound = bound + 1  # (the actor's hand)
        self._prune_step = min(self._bound, 64)

    def set_room(self, n: int) -> bool:
        """The contract's room is the hand-over bound (`bound_in_flight`), which can change
        within the inbox ring's records (``config.input_queue_size``, fixed once built):
        False, changing nothing, beyond them or without a bound."""
        if not self._bound or n > self._config.input_queue_size:
            return False
        self.bound_in_flight(n)
        self._opened()  # widened while the bound refused: the writable wakers run
        return True

    def _room(self) -> int:
        """How many more messages the hand-over bound lets through now (may be <= 0)."""
        sent = self._pruned + len(self._inflight)
        room = self._bound - (sent - self._consumed)
        return room if room > 0 else self._exact_room(sent)

    def _exact_room(self, sent: int) -> int:
        """`_room`, with what was consumed read from the shared headers first."""
        ring, out = self._in_ring, self._rx
        consumed = self._consumed
        if ring is not None and out is not None:
            try:
                # the child stores how many replies it had written (`done_mark`) before it
                # marks a message done, so reading them in that order and finding that
                # many replies read here means every reply to those messages was read
                done = ring.records_done
                caught_up = out.records_read - len(self._pending_out) >= ring.done_mark
            except ValueError:  # closed by a concurrent stop: the send reports it
                caught_up = False
            if caught_up and done > consumed:
                consumed = self._consumed = done
        return self._bound - (sent - consumed)

    def _done_mark(self) -> tuple[int, int] | None:
        """(``records_done``, ``done_mark``) of the inbox, in that order; None if closed.
        Taken before a read of the outbox while the bound refuses, it lets that read
        consume those messages even while the child goes on (`_exact_room` needs the
        outbox caught up with the latest mark)."""
        ring = self._in_ring
        try:
            return (ring.records_done, ring.done_mark) if ring is not None else None
        except ValueError:  # closed by a concurrent stop
            return None

    def _opened(self) -> None:
        """After reading replies: wake the writable wakers if that opened the bound."""
        if self._gated and self._room() > 0:
            self._gated = False
            _call_wakers(self._wakers.writable)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the child process and wait until it has imported the actor.

        Raises:
            KernelStateError: already started.
            KernelFailedError: the child could not start (import error, bad pickle, timeout).
        """
        with self._state_lock:
            if self._state is not KernelState.CREATED:
                raise KernelStateError(
                    self._kernel_id,
                    self._state,
                    "start",
                    "a kernel runs once; create a new one to run again",
                )
            self._state = KernelState.ACTIVE
        try:
            self._launch()
        except BaseException:
            self._cleanup()
            with self._state_lock:
                self._state = KernelState.TERMINATED
            raise

    def _launch(self) -> None:
        cfg = self._config
        raise_fd_limit()
        ctx: Any = spawn_context(cfg.start_method)
        self._in_ring = SharedByteRing(cfg.input_ring_bytes, max_records=cfg.input_queue_size)
        self._out_ring = SharedByteRing(cfg.output_ring_bytes, max_records=cfg.output_queue_size)
        ours, theirs = socket.socketpair()
        bell = mp_connection.Connection(ours.detach())
        child_bell = mp_connection.Connection(theirs.detach())
        space_r, space_w = (mp_connection.Connection(fd) for fd in os.pipe())
        status_r, status_w = ctx.Pipe(duplex=False)
        if cfg.record_latency:
            self._lat_seg = SharedSegment(size=LATENCY_BLOCK_BYTES)
            self._lat = SharedLatencyBlock(self._lat_seg.buf)
        child_ends = [child_bell, space_w, status_w]
        self._conns = [bell, space_r, status_r]
        self._status = status_r
        spec = ChildSpec(
            kernel_id=self._kernel_id,
            func=self._func_bytes,
            output_type=self._output_type,
            check_fields=self._check_fields,
            in_name=self._in_ring.name,
            out_name=self._out_ring.name,
            spin_s=self._spin_s,
            adaptive=cfg.adaptive_spin,
            in_data=child_bell,
            in_space=space_w,
            out_data=child_bell,
            out_space=child_bell,
            status=status_w,
            lat_name=None if self._lat_seg is None else self._lat_seg.name,
            **self._edge_spec(),
            traced=self._traced,
        )
        process = ctx.Process(
            target=child_main,
            args=(spec,),
            name=f"pydotcompute-{self._kernel_id}",
            daemon=cfg.daemon,
        )
        tap = StderrTap(spec) if ctx.get_start_method() == "spawn" else None
        try:
            if tap is not None:
                tap.start(process)
            else:
                process.start()
        finally:
            for conn in child_ends:
                conn.close()
        self._process = process
        track(process)
        self._pid = process.pid
        self._started_at = _monotonic()
        for conn in self._conns[:2]:
            os.set_blocking(conn.fileno(), False)
        self._in_data_fd = self._out_space_fd = self._bell_fd = bell.fileno()
        self._space_fd = space_r.fileno()
        adaptive = cfg.adaptive_spin
        self._send_waiter = Waiter(self._space_fd, process.sentinel, self._spin_s, adaptive)
        self._recv_waiter = Waiter(self._bell_fd, process.sentinel, self._spin_s, adaptive)
        # wait for "ready" (or an early death / error report)
        ready = mp_connection.wait([status_r, process.sentinel], cfg.startup_timeout)
        report = self._read_status() if status_r in ready else []
        if not report or report[0] != "ready":
            if not ready:
                process.kill()
            self._exit_code = reap(process)
            if report and report[0] == "error":
                cause = rebuild_error(report, self._kernel_id, process.pid)
                hint = startup_hint(report)
            else:
                cause = ChildProcessError(
                    f"the child process of kernel {self._kernel_id!r} "
                    f"{describe_exit(self._exit_code)} before reporting ready"
                    + ("" if ready else f" (startup_timeout={cfg.startup_timeout}s)")
                )
                # exit code 1 is an uncaught exception in the bootstrap (a signal or
                # os._exit says something else)
                hint = startup_hint(report) if ready and self._exit_code == 1 else ""
            if tap is not None:
                hint += tap.finish(failed=True)
            self._error = cause
            self._child_exited = True
            err = KernelFailedError(self._kernel_id, cause, note=hint)
            raise err from cause
        if tap is not None:
            tap.finish(failed=False)
        # both processes have mapped the rings: drop the names so nothing can leak
        self._in_ring.unlink()
        self._out_ring.unlink()
        if self._lat_seg is not None:
            self._lat_seg.unlink()
        self._in_max = self._in_ring.max_record_size
        self._rx = self._out_ring
        self._watched = (process.sentinel,)
        WATCHER.set(process.sentinel, self._on_sentinel)
        self._sync_watch()

    def _sync_watch(self) -> None:
        """Have the shared watcher watch what the registered wakers need.

        With readable wakers (and no event loop watching the bell itself) it watches the
        bell and keeps the outbox's ``reader_waiting`` flag armed, so the child rings on
        every reply; writable wakers are armed by ``send_nowait`` when it finds the inbox
        full, and the watcher watches the space pipe for them.
        """
        with self._exit_lock:
            if not self._watched or self._child_exited:
                return
            readable, writable = self._wakers.readable, self._wakers.writable
            want = {self._process.sentinel}
            if readable and not self._lent:
                want.add(self._bell_fd)
            if writable and not self._lent:
                want.add(self._space_fd)
            gone = [fd for fd in self._watched if fd not in want]
            new = [fd for fd in want if fd not in self._watched]
            self._watched = tuple(want)
        WATCHER.discard(gone)
        for fd in new:
            WATCHER.set(fd, self._on_bell if fd == self._bell_fd else self._on_space)
        if self._bell_fd in new:
            ring = self._out_ring
            ring.set_reader_waiting(True)
            if ring.readable():
                _call_wakers(readable)

    def _unwatch_all(self) -> None:
        """Stop the shared watcher watching this kernel (it is done on return)."""
        with self._exit_lock:
            watched, self._watched = self._watched, ()
        WATCHER.discard(watched)

    def _on_bell(self) -> None:
        """Watcher thread: the child rang the reply bell."""
        drain_bell(self._bell_fd)
        ring = self._out_ring
        if ring is not None and not ring.closed:
            ring.set_reader_waiting(True)
        _call_wakers(self._wakers.readable)

    def _on_space(self) -> None:
        """Watcher thread: the child freed inbox space (or finished a message) for an armed
        writer. One bell per arming: the child would otherwise ring on every message it
        takes while the writer waits; a refused offer arms again, and then looks again."""
        drain_bell(self._space_fd)
        with self._send_lock:
            if self._space_armed:
                self._space_armed = False
                ring = self._in_ring
                if ring is not None and not ring.closed:
                    ring.set_writer_waiting(False)
        _call_wakers(self._wakers.writable)

    def _on_sentinel(self) -> None:
        """Watcher thread: the child exited."""
        self._unwatch_all()
        self._on_child_exit()
        _call_wakers(self._wakers.readable + self._wakers.writable)
        _call_wakers(tuple(self._exit_hooks))

    def add_waker(self, callback: Callable[[], None], *, when: str = "readable") -> None:
        """Call ``callback()`` from the watcher thread when a reply may be ready.

        ``when="writable"``: when the inbox may have room again after ``send_nowait``
        returned False. Both also fire when the child exits. Callbacks must be quick and
        must not raise (an event loop adapter wraps ``loop.call_soon_threadsafe``).
        """
        self._wakers.add(callback, when)  # type: ignore[arg-type]
        self._sync_watch()

    def remove_waker(self, callback: Callable[[], None]) -> None:
        """Stop calling ``callback`` (no error if it was not registered)."""
        self._wakers.remove(callback)
        self._sync_watch()

    @property
    def inbox(self) -> _RingView:
        """The inbox seen from the parent: ``len()``, ``get_stats()``, ``add_waker``."""
        return _RingView(self, "writable", lambda: self._in_ring)

    @property
    def outbox(self) -> _RingView:
        """The outbox seen from the parent: ``len()``, ``get_stats()``, ``add_waker``."""
        return _RingView(self, "readable", lambda: self._out_ring)

    def _on_child_exit(self, _flag: bool = True) -> bool:
        """Record that the child ended (idempotent, any thread); returns True."""
        if self._child_exited:
            return True
        with self._exit_lock:
            if self._child_exited:
                return True
            process = self._process
            self._exit_code = reap(process)
            error: BaseException | None = None
            while report := self._read_status():
                if report[0] == "error":
                    error = rebuild_error(report, self._kernel_id, process.pid)
                elif report[0] == "left":
                    self._edge_report(report)
            if error is None and self._exit_code != 0 and not self._stop_requested:
                error = ChildProcessError(
                    f"the child process of kernel {self._kernel_id!r} (pid {process.pid}) "
                    f"{describe_exit(self._exit_code)} without reporting an error"
                )
            self._final_counts = self._answered(self._inbox_counts())
            with self._state_lock:
                if error is not None and self._error is None:
                    self._error = error
                self._state = KernelState.TERMINATED
                self._stopped_at = _monotonic()
            self._child_exited = True
        return True

    def _edge_spec(self) -> dict[str, Any]:
        """Further `ChildSpec` fields: a worker with direct edges names its control
        segment and the child's setup (`edge_worker`)."""
        return {}

    def _edge_report(self, report: list[Any]) -> None:
        """A ``["left", ...]`` report: the child's actor raised holding an edge's record."""

    def _read_status(self) -> list[Any]:
        """The next report on the status pipe (``[]`` when none, closed or malformed).

        Reports are MessagePack bytes: nothing the child sends is unpickled here.
        """
        status = self._status
        try:
            if status is None or not status.poll():
                return []
            data = status.recv_bytes(STATUS_MAX_BYTES)
        except (EOFError, OSError):
            return []
        report = unpack_report(data)
        return report if report else ["malformed"]

    def _inbox_counts(self) -> tuple[int, int] | None:
        """(taken, finished) from the inbox header, clamped to what was sent; None if gone."""
        ring = self._in_ring
        if ring is None or ring.closed:
            return None
        try:
            taken, done = ring.records_read, ring.records_done
        except ValueError:
            return None
        base = self._pruned
        sent = base + len(self._inflight)
        taken = min(max(taken, base), sent)
        return taken, min(max(done, base), taken)

    def _answered(self, counts: tuple[int, int] | None) -> tuple[int, int] | None:
        """``counts`` at the child's exit, with the message in the actor's hands finished
        when it was answered: the child wrote a reply after it last marked its messages
        done (``done_mark``), so handing that message back as well would report it twice.
        (Read from the rings' headers after the exit: no race with a kill between the
        reply's write and a mark.)"""
        ring, out = self._in_ring, self._out_ring
        if ring is None or out is None:
            return counts
        try:
            self._answered_at_exit = out.records_written > ring.done_mark
        except ValueError:  # closed by a concurrent stop
            return counts
        if counts is None or counts[0] <= counts[1] or not self._answered_at_exit:
            return counts
        return (counts[0], counts[0])

    @property
    def answered_at_exit(self) -> bool:
        """True when the child, at its exit, had written a reply since its actor last
        asked for a message: the message in the actor's hands (from the inbox or a direct
        edge) was answered, so it is finished."""
        return self._answered_at_exit

    def _ring_failed(self, exc: RingCorruptedError) -> None:
        """A ring's header is impossible: fail with ``exc`` and end the child (its channel
        cannot be trusted any more). Safe from any thread."""
        with self._state_lock:
            if self._error is None:
                self._error = exc
            if self._state is _ACTIVE:
                self._state = KernelState.TERMINATING
        process = self._process
        if process is not None and not self._child_exited:
            try:
                process.kill()
            except (OSError, ValueError):
                pass
            if exited(process, 5.0):
                self._on_child_exit()

    def _child_gone(self, value: bool = False) -> bool:
        """``gone`` callback for the wait helpers: checks (or records) the child's exit."""
        if value or self._child_exited:
            return self._on_child_exit()
        return False

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop gracefully: close the inbox, let the child drain it and exit, collect replies.

        Every reply the child produced stays readable afterwards (``receive_nowait`` or
        `drain_replies`), and every message it did not finish comes back from
        `take_undelivered`.

        Args:
            timeout: Seconds to wait for the child to finish; then it is terminated (and
                killed if it ignores that), and unread inbox messages move to
                `unprocessed`.

        Returns:
            True when the child exited by itself (also if it had already ended or never
            started); False when it had to be terminated.
        """
        with self._state_lock:
            if self._state is KernelState.CREATED:
                self._state = KernelState.TERMINATED
                return True
            if self._state is KernelState.ACTIVE:
                self._state = KernelState.TERMINATING
            self._stop_requested = True
        if self._cleaned or self._process is None or self._in_ring is None:
            return True  # stopped before, or start() failed and cleaned up
        graceful = True
        if not self._child_exited:
            deadline = _monotonic() + max(timeout, 0.0)
            got_send = self._send_lock.acquire(True, max(timeout, 0.0))
            try:
                self._in_ring.close_writer()
            finally:
                if got_send:
                    self._send_lock.release()
            ring_bell(self._in_data_fd)
            graceful = self._await_exit(deadline)
        self._collect_leftovers()
        self._cleanup()
        return graceful

    def _await_exit(self, deadline: float) -> bool:
        """Wait for the child to exit, draining the outbox so it cannot block on it."""
        process = self._process
        out_ring = self._out_ring
        out_fd = self._bell_fd
        while True:
            if self._recv_lock.acquire(False):
                try:
                    out_ring.set_reader_waiting(True)
                    self._drain_outbox()
                    if out_ring.writer_waiting:
                        ring_bell(self._out_space_fd)
                finally:
                    self._recv_lock.release()
            remaining = deadline - _monotonic()
            if remaining <= 0:
                break
            ready = mp_connection.wait([process.sentinel, out_fd], min(remaining, SLICE_S))
            if out_fd in ready:
                drain_bell(out_fd)
            if process.sentinel in ready:
                self._on_child_exit()
                return True
        process.terminate()
        if not exited(process, 1.0):
            process.kill()
            exited(process, 5.0)
        self._on_child_exit()
        return False

    def _drain_outbox(self) -> None:
        """Move every committed reply record to ``_pending_out`` (``_recv_lock`` held)."""
        ring = self._out_ring
        if ring is None or ring.closed:
            return
        pending = self._pending_out
        try:
            while (data := ring.try_read()) is not None:
                pending.append(data)
        except RingCorruptedError as exc:
            self._ring_failed(exc)

    def _collect_leftovers(self) -> None:
        with self._recv_lock:
            self._drain_outbox()
        with self._send_lock:  # the child has exited: the messages it never took
            counts = self._final_counts or self._inbox_counts()
            if counts is not None and not self._unprocessed:
                base = self._pruned
                self._unprocessed.extend(self._inflight[counts[0] - base :])

    def _cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        self._unwatch_all()
        alive = self._process is not None and not self._child_exited
        if alive and not exited(self._process, 0.0):
            self._process.kill()
            exited(self._process, 5.0)
        if self._process is not None:
            self._on_child_exit()
            self._process.close()
        with self._recv_lock, self._send_lock:
            self._rx = None
            for ring in (self._in_ring, self._out_ring):
                if ring is not None:
                    ring.unlink()
                    ring.close()
            with self._exit_lock:  # an event loop still watching the bell closes it
                lent = self._lent
                if lent:  # the bell and the space pipe: kept open (and alive) until then
                    self._lent_close = self._conns[:2]
            for conn in self._conns[2:] if lent else self._conns:
                conn.close()
            self._conns = []
            self._close_latency_block()
        with self._state_lock:
            self._state = KernelState.TERMINATED
            if not self._stopped_at:
                self._stopped_at = _monotonic()

    def _close_latency_block(self) -> None:
        """Keep what the block holds for the next drain, then unmap it."""
        with self._lat_lock:
            lat, seg = self._lat, self._lat_seg
            self._lat = self._lat_seg = None
            if lat is not None:
                part = lat.take()
                if part is not None:
                    self._lat_left.append(part)
                lat.release()
            if seg is not None:
                seg.unlink()
                seg.close()

    def drain_latencies(self) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
        """The latencies the child timed since the last call, as `LatencyRecorder.drain`
        gives them; None when there are none (or ``config.record_latency`` is off).

        Read from shared memory: the child hands its timings over every few hundred
        messages and whenever its actor waits for the next one.
        """
        with self._lat_lock:
            if self._lat is not None:
                return self._lat.take()
            return self._lat_left.pop() if self._lat_left else None

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the child to exit without asking it to; True if it has."""
        if self._process is None:
            return self._state is KernelState.TERMINATED
        if self._child_exited:
            return True
        if not exited(self._process, timeout):
            return False
        self._on_child_exit()
        return True

    # -- caller side ------------------------------------------------------------------

    def send(self, msg: Any, timeout: float | None = None) -> bool:
        """Encode ``msg`` into the child's inbox, waiting while it is full.

        ``msg`` is a ``@message`` or any MessagePack-able value. The inbox is full when
        ``config.input_queue_size`` messages are sent and not yet taken by the actor (or
        its bytes are used up). The object itself is kept until the child has finished it
        (see `take_undelivered`).

        Returns:
            True when queued, False when the timeout expired first.

        Raises:
            KernelStateError: the kernel is not running (``KernelFailedError`` if it failed
                or its child died).
            TypeValidationError: ``msg`` is not the ``input_type``.
            MessageSerializationError: ``msg`` cannot be encoded (the message names its
                type), or it encodes to more than `max_message_bytes`; raised at
                once, nothing is queued.
        """
        lock = self._send_lock
        if timeout is None:
            lock.acquire()
        elif not (lock.acquire(True, timeout) if timeout > 0 else lock.acquire(False)):
            return False
        try:
            if self._state is not _ACTIVE:
                raise self._state_error("send to")
            codec = self._codec
            if type(msg) is not codec[0]:  # validate each new type once
                codec = self._codec = (type(msg), self._encoder_for(msg))
            encoded = self._encoded
            if encoded is not None:
                self._encoded = None
                data = encoded[1] if encoded[0] is msg else codec[1](msg)
            else:
                data = codec[1](msg)
            ring = self._in_ring
            try:
                result = ring.try_write(data)
                if not result:
                    assert self._send_waiter is not None
                    result = write_wait(ring, data, self._send_waiter, timeout, self._child_gone)
                    if not result and self._wakers.writable and not self._child_exited:
                        # arm the writable wakers: the child rings after its next read
                        self._space_armed = True
                        ring.set_writer_waiting(True)
                        result = ring.try_write(data)
                if result and self._space_armed:
                    self._space_armed = False
                    ring.set_writer_waiting(False)
            except InvalidConfigurationError:  # the ring says it can never hold the record
                raise too_large(self._kernel_id, msg, len(data), self._in_max, "inbox") from None
            except QueueClosedError:  # the child closed its inbox: it is exiting
                self._await_child()
                raise self._state_error("send to") from None
            except RingCorruptedError as exc:
                self._ring_failed(exc)
                raise self._state_error("send to") from exc
            if not result:
                if self._child_exited:
                    raise self._state_error("send to")
                return False
            inflight = self._inflight
            if len(inflight) >= self._prune_at:
                self._prune(ring)
            inflight.append(msg)
        finally:
            lock.release()
        if result == WRITE_WAKE:
            ring_bell(self._in_data_fd)
        return True

    def encode_checked(self, msg: Any, keep: bool = False) -> bytes:
        """The record `send` would write for ``msg``, checked as `send` checks it (its type
        against ``input_type``, its size against `max_message_bytes`) and nothing queued:
        how a caller refuses at once a value the ring can never carry. Hand the bytes to
        `keep_encoded` so the send writes them instead of encoding again (``keep=True``
        does that here).

        Raises:
            TypeValidationError: ``msg`` is not the ``input_type``.
            MessageSerializationError: it cannot be encoded, or encodes too large.
        """
        codec = self._codec
        if type(msg) is not codec[0]:
            codec = self._codec = (type(msg), self._encoder_for(msg))
        data: bytes = codec[1](msg)
        limit = self._in_max
        if limit and len(data) > limit:
            raise too_large(self._kernel_id, msg, len(data), limit, "inbox")
        if keep and not self._traced:  # (`keep_encoded`, inline: every send comes here)
            self._encoded = (msg, data)
        return data

    def keep_encoded(self, msg: Any, data: bytes | None) -> None:
        """``data`` is what ``msg`` encodes to (`encode_checked`, or a ``@message``'s
        ``serialize``), measured by the caller:
        the next `send` writes it if that send is of this very object, and forgets it
        either way. ``data=None`` forgets it now; a traced worker (`trace_wire`) ignores
        it, since its records carry a header first. Call it right before the send, on the
        sending thread: a message changed in between would go as it was measured."""
        self._encoded = None if data is None or self._traced else (msg, data)

    def reply_within(self, budget_s: float) -> Any:
        """Poll the outbox for the next reply for up to ``budget_s`` seconds, holding the
        calling thread (an event loop, while a caller waits for a reply): the reply, or
        None when none came. Raises what `poll_reply` raises.

        While it polls, the child is asked not to ring the reply doorbell (a reply found
        here needs no wake-up); the request is re-armed, and the ring checked once more,
        before it returns, so no wake-up is lost; replies found behind the one returned,
        written while the doorbell was off, are announced as the doorbell would.
        """
        lock = self._recv_lock
        if not lock.acquire(False):
            return None  # another thread receives: it gets the reply
        behind = False
        try:
            if self._pending_out:
                data = None  # kept replies come first: `poll_reply` gives them
            else:
                ring = self._rx
                if ring is None:
                    return None
                try:
                    # (``behind``: replies written while the bell was off, nobody told)
                    data, behind = ring.spin_read_quiet(budget_s, self._out_space_fd)
                except RingCorruptedError:
                    data = None  # `poll_reply` meets it and reports it
                else:
                    if data is None:
                        return None
        finally:
            lock.release()
            if behind:
                self._announce_replies()
        if data is None:
            return self.poll_reply()
        if self._gated:
            self._opened()
        return self._decode_record(data)

    def _announce_replies(self) -> None:
        """Tell whoever reads replies that some are ready, as the child's bell would."""
        rebell = self._rebell
        if self._lent and rebell is not None:
            rebell()
        else:
            _call_wakers(self._wakers.readable)

    def _prune(self, ring: Any) -> None:
        """Drop the kept messages the child has finished (``_send_lock`` held)."""
        try:
            done = ring.records_done
        except ValueError:  # closed
            return
        drop = min(done - self._pruned, len(self._inflight))
        if drop > 0:
            del self._inflight[:drop]
            self._pruned += drop
        self._prune_at = len(self._inflight) + self._prune_step

    def _await_child(self, timeout: float | None = 5.0) -> None:
        """Wait for a child that is known to be exiting (it closed a ring), then record it."""
        waiting = self._process is not None and not self._child_exited and not self._cleaned
        if waiting and exited(self._process, timeout):
            self._on_child_exit()

    def receive(self, timeout: float | None = None) -> Any:
        """The next reply, waiting up to ``timeout`` seconds (None = until one arrives).

        Replies already sent stay receivable after the kernel stopped or failed.

        Returns:
            The reply (a ``@message`` or a plain value), or None when the timeout expired.

        Raises:
            MessageRejectedError: the child could not decode one message (a field of the
                wrong type, for example); its ``correlation_id`` is that message's id. The
                kernel keeps running: receive again for the next reply.
            ReplyDecodeError: one reply does not decode here (its class was never imported
                in this process, say); it is consumed, its ``correlation_id`` says which
                request it answers, and the next receive goes on with the next reply.
            KernelFailedError: the actor raised (or the child died, or a ring was found
                corrupted) and every earlier reply has been received.
            KernelStateError: the kernel never started, or stopped and is drained.
        """
        lock = self._recv_lock
        if timeout is None:
            lock.acquire()
        elif not lock.acquire(True, max(timeout, 0.0)):
            return None
        try:
            if self._pending_out:
                return self._decode_record(self._pending_out.popleft())
            ring = self._rx
            if ring is None:
                raise self._state_error("receive from")
            waiter = self._recv_waiter
            assert waiter is not None
            try:
                wake = self._out_space_fd  # rung by a read that frees space for the child
                if timeout is None:  # read_wait inlined: this is every reply's path
                    data = ring.spin_read(waiter.spin_s, wake)
                    if data is None:
                        data = read_parked(ring, waiter, None, self._child_gone, wake)
                    elif waiter.misses and waiter.spin_s > 0:
                        waiter.hit()
                else:
                    data = read_wait(ring, waiter, timeout, self._child_gone, wake)
            except RingCorruptedError as exc:
                self._ring_failed(exc)
                self._rx = None
                raise self._state_error("receive from") from exc
            if self._wakers.readable:
                ring.set_reader_waiting(True)  # a park clears the watcher's arming
            elif data is None and self._lent and self.BATCH_BELLS:
                # polled empty while a loop watches: ask for the bell again, then re-check
                # (the loop's bell callback withdrew it: replies meanwhile ring nothing)
                ring.set_reader_waiting(True)
                data = ring.spin_read(0, self._out_space_fd)
            if data is None:
                if self._child_exited or ring.writer_closed:
                    # the child wrote its last reply and is exiting: wait, then report
                    self._await_child(timeout)
                    if self._child_exited:
                        raise self._state_error("receive from")
                return None
        finally:
            lock.release()
        return self._decode_record(data)

    def _decode_record(self, data: bytes) -> Any:
        """A reply record taken from the ring: a ``@message`` (`ReplyDecodeError` when it
        does not decode here), or a frame (a plain value, a rejection)."""
        if data[0] != FRAME_TAG:
            try:
                return self._decode(data)
            except MessageDeserializationError as exc:
                raise self._undecodable(data, exc) from exc
        return self._decode_frame(data)

    def _decode_reply(self, data: bytes) -> Any:
        """A ``@message`` reply record, decoded (`ReplyDecodeError` when it does not)."""
        try:
            return self._decode(data)
        except MessageDeserializationError as exc:
            raise self._undecodable(data, exc) from exc

    def _undecodable(self, data: bytes, exc: MessageDeserializationError) -> ReplyDecodeError:
        """The error for a reply record that does not decode here (it is consumed)."""
        err = ReplyDecodeError(self._kernel_id, reply_correlation(data), str(exc))
        err.__cause__ = exc
        return err

    def _decode_frame(self, data: bytes) -> Any:
        """A reply record that is not a ``@message``: a plain value, a rejection, or a
        record a traced child prefixed with its context (`trace_wire`). A ``@message``
        reply, the usual one, never comes here: untraced, it is checked for nothing more."""
        head = data[:2]
        if head == ERROR_FRAME:
            raise rejection(self._kernel_id, data)
        if head == TRACE_FRAME:
            return self._decode_traced(data)
        return decode_value(self._kernel_id, data)

    def _decode_traced(self, data: bytes) -> Any:
        """A reply record with the actor's trace context: the reply, its context reported
        (`trace_wire`'s ``received``)."""
        trace_id, span_id, flags, record = split_trace(self._kernel_id, data)
        reply = self._decode_reply(record) if record[0] != FRAME_TAG else self._decode_frame(record)
        received = self._trace_received
        if received is not None:
            received(reply, trace_id, span_id, flags)
        return reply

    def _encoder_for(self, msg: Any) -> Callable[[Any], bytes]:
        """The encoder of ``msg``'s type (checked against ``input_type``), prefixing each
        record with its context once `trace_wire` was called; chosen once per new type, so
        the choice costs a message nothing."""
        encode = encoder_for(
            self._kernel_id, msg, self._input_type, "expects", fields=self._check_fields
        )
        header = self._trace_header
        if header is None:
            return encode

        def traced(value: Any) -> bytes:
            ctx = header(value)
            return encode(value) if ctx is None else trace_header(*ctx) + encode(value)

        return traced

    # -- trace context on the wire (a tracing runtime only; see `framing`) ---------------

    def trace_wire(
        self,
        header: Callable[[Any], tuple[int, int, int] | None],
        received: Callable[[Any, int, int, int], None],
    ) -> bool:
        """Prefix each inbox record with the context ``header(msg)`` gives (`framing`'s
        ``0xC1 'T'`` header) and report each reply's context. Called before `start`: the
        child builds its actor a traced context from the start (`ChildSpec.traced`)."""
        self._trace_header = header
        self._trace_received = received
        self._codec = (None, no_encoder)  # the next send chooses a prefixing encoder
        self._traced = True
        self._encoded = None
        return True

    def drain_replies(self) -> list[Any]:
        """Every reply readable now, oldest first, without waiting or raising for failures.

        After `stop` (or once the child died) this is every reply the child produced
        and nobody received yet: ``stop`` never discards one. A message the child rejected
        appears in the list as its `MessageRejectedError`
        instance (check with ``isinstance``); a reply that does not decode appears as its
        `ReplyDecodeError`. Safe from any thread, but it waits for a
        concurrent ``receive`` to return (do not call it while another thread waits in
        ``receive(timeout=None)`` on a running kernel).
        """
        out: list[Any] = []
        with self._recv_lock:
            if not self._cleaned:
                self._drain_outbox()
            pending = self._pending_out
            while pending:
                data = pending.popleft()
                try:
                    out.append(
                        self._decode_reply(data)
                        if data[0] != FRAME_TAG
                        else self._decode_frame(data)
                    )
                except MessageDeserializationError as exc:  # rejected, or does not decode
                    out.append(exc)
            ring = self._out_ring
            if ring is not None and not ring.closed and ring.writer_waiting:
                ring_bell(self._out_space_fd)
        return out

    def take_undelivered(self) -> list[Any]:
        """The messages the child did not finish, oldest first; each is returned only once.

        A message is *finished* when the actor asked for its next message after taking it
        (``ctx.receive``/``ctx.receive_nowait``), when the actor returned normally (or
        ended on the ``QueueClosedError`` of a stop), or when the child rejected it as
        undecodable (the caller got a ``MessageRejectedError``). Everything else sent
        successfully comes back here, exactly the objects passed to ``send``: the one in
        the actor's hands when the stop's grace period ran out, when the child was killed
        or when the actor raised (first), then those it never took (in send order). A
        message whose ``send`` raised or returned False was never sent.

        Returns:
            The unfinished messages; ``[]`` before ``start``, after a clean stop, and on
            every call after the first.

        Raises:
            KernelStateError: the child is still running (call after `stop`, or once
                the kernel failed because the child died).
        """
        with self._send_lock:
            if self._process is None:
                return []
            if not self._child_exited:
                raise KernelStateError(
                    self._kernel_id,
                    self._state,
                    "take undelivered messages from",
                    "its child is still running; call stop() first",
                )
            if self._undelivered_taken:
                return []
            self._undelivered_taken = True
            counts = self._final_counts
            base = self._pruned
            done = counts[1] if counts is not None else base
            out = self._inflight[done - base :]
            self._inflight.clear()
            return out

    def send_nowait(self, msg: Any) -> bool:
        """Queue ``msg`` if the inbox has room; False when full (same errors as ``send``)."""
        return self.send(msg, 0)

    def receive_nowait(self) -> Any:
        """The next reply or None, without waiting (same errors as ``receive``)."""
        return self.receive(0)

    def unprocessed(self) -> list[Any]:
        """Messages sent but never handed to the actor (stop timeout, failure, crash)."""
        return list(self._unprocessed)

    # -- the tier contract ----------------------------------------------------------------

    def offer(self, msg: Any) -> bool:
        """`send_nowait`: hand ``msg`` to the child's inbox, False when it is full (or the
        hand-over bound is reached, see `bound_in_flight`)."""
        bound = self._bound
        if (
            bound
            # (`_room`'s quick answer inline: this is every hand-over's path)
            and bound - (self._pruned + len(self._inflight) - self._consumed) <= 0
            and self._room() <= 0
            and not self._refused()
        ):
            return False
        return self.send(msg, 0)

    def _refused(self) -> bool:
        """The bound refused a message: arm the wake-ups that open it, then look again
        (True: room after all). The child rings the space doorbell when it finishes a
        message (`SharedByteRing.mark_done`) or reads one while this is armed; reading
        replies here checks it too (`_opened`)."""
        self._gated = True
        ring = self._in_ring
        if self._wakers.writable and ring is not None and not self._space_armed:
            with self._send_lock:
                if not ring.closed:
                    self._space_armed = True
                    ring.set_writer_waiting(True)
        return self._room() > 0

    def offer_many(self, msgs: list[Any]) -> int:
        """Hand over the longest prefix of ``msgs`` that fits, encoded once each and written
        with one publish; one doorbell for the batch, only if the child is parked."""
        if not msgs:
            return 0
        most = len(msgs)
        if self._bound:
            room = self._room()
            if room <= 0 and not self._refused():
                return 0
            most = min(most, max(self._room(), 1))
        lock = self._send_lock
        if not lock.acquire(True, 0):
            return 0
        try:
            if self._state is not _ACTIVE:
                raise self._state_error("send to")
            datas: list[bytes] = []
            codec = self._codec
            encoded = self._encoded
            self._encoded = None
            batch = msgs[:most]
            if set(map(type, batch)) == {codec[0]}:
                # one type, checked already: encoded in one C loop (a kept record is only
                # ever the last send's, which a queued batch rarely holds: encoded again)
                with contextlib.suppress(Exception):
                    datas.extend(map(codec[1], batch))
            for msg in batch[len(datas) :]:
                try:
                    if type(msg) is not codec[0]:  # validate each new type once
                        codec = self._codec = (type(msg), self._encoder_for(msg))
                    if encoded is not None and encoded[0] is msg:
                        datas.append(encoded[1])
                    else:
                        datas.append(codec[1](msg))
                except Exception:
                    if datas:
                        break  # the rest go one by one, where this one raises
                    raise
            ring = self._in_ring
            n: int
            wake: bool
            try:
                n, wake = ring.write_many(datas)
            except InvalidConfigurationError:  # the first can never fit
                msg = msgs[0]
                raise too_large(
                    self._kernel_id, msg, len(datas[0]), self._in_max, "inbox"
                ) from None
            except QueueClosedError:  # the child closed its inbox: it is exiting
                self._await_child()
                raise self._state_error("send to") from None
            except RingCorruptedError as exc:
                self._ring_failed(exc)
                raise self._state_error("send to") from exc
            if n:
                if self._space_armed:
                    self._space_armed = False
                    ring.set_writer_waiting(False)
                self._gated = False
                inflight = self._inflight
                if len(inflight) + n >= self._prune_at:
                    self._prune(ring)
                inflight.extend(msgs[:n])
        finally:
            lock.release()
        if not n:  # full: the one-by-one path waits for room (and arms its wake-up)
            return 1 if self.send(msgs[0], 0) else 0
        if wake:
            ring_bell(self._in_data_fd)
        return n

    def poll_reply(self) -> Any:
        """`receive_nowait`: the next reply, or None when none is ready."""
        reply = self.receive(0)
        if self._gated:
            self._opened()
        return reply

    def poll_replies(self, max_count: int) -> list[Any]:
        """Up to ``max_count`` replies read in one call, oldest first (``[]``: none).

        A reply that does not decode (or a message the child rejected) after others ends
        the batch: it is kept and raised by the next poll, so nothing precedes an error.
        """
        lock = self._recv_lock
        if max_count < 2 or not lock.acquire(False):
            reply = self.poll_reply()  # (a receiving thread holds the lock: it gets them)
            return [] if reply is None else [reply]
        records: list[bytes] = []
        report = False  # nothing read and the child may have ended: `poll_reply` says
        try:
            pending = self._pending_out
            while pending and len(records) < max_count:
                records.append(pending.popleft())
            ring = self._rx
            if ring is None:
                report = not records
            elif len(records) < max_count:
                wake = self._out_space_fd
                mark = self._done_mark() if self._gated else None
                try:
                    records += ring.read_many(max_count - len(records), wake)
                    if not records and self._lent and self.BATCH_BELLS:
                        # found it empty while a loop watches: ask for the bell again,
                        # then look once more (as `receive` does; a batch that got some
                        # leaves that to the poll after it, so replies that arrive while
                        # these are delivered ring nothing)
                        ring.set_reader_waiting(True)
                        records += ring.read_many(max_count, wake)
                    if not records:
                        report = self._child_exited or ring.writer_closed
                    elif mark is not None and ring.records_read - len(pending) >= mark[1]:
                        # every reply to the messages done before this read was read
                        self._consumed = max(self._consumed, mark[0])
                except RingCorruptedError:
                    report = not records  # (else the next poll meets it and reports it)
        finally:
            lock.release()
        if not records:
            if report:
                reply = self.poll_reply()
                return [] if reply is None else [reply]
            if self._gated:
                self._opened()
            return []
        out: list[Any] = []
        # the common case, every record a message: decoded in one C loop; the first that
        # is not (a frame, or one that does not decode) and the rest take the loop below
        # (``extend`` keeps what it decoded before the error: nothing is decoded twice)
        with contextlib.suppress(Exception):
            out.extend(map(self._decode, records))
        decode = self._decode_record
        for i in range(len(out), len(records)):
            try:
                out.append(decode(records[i]))
            except MessageDeserializationError:
                if not out:
                    self._unread(records[i + 1 :])
                    raise
                self._unread(records[i:])
                break
        if self._gated:
            self._opened()
        return out

    def _unread(self, records: list[bytes]) -> None:
        """Put records read but not returned back in front of the next poll."""
        if records:
            with self._recv_lock:
                self._pending_out.extendleft(reversed(records))

    def on_writable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the inbox may have room again (see `add_waker`)."""
        self.add_waker(callback, when="writable")

    def on_readable(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when a reply may be ready; returns the undo."""
        self.add_waker(callback, when="readable")
        return lambda: self.remove_waker(callback)

    def watch(self, loop: Any, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Have ``loop`` watch the reply doorbell and the child's exit itself.

        The loop watches the bell socket itself, and the space pipe (its rings run the
        writable wakers on the loop's thread); the shared watcher records the child's exit
        and then schedules ``callback`` on the loop. While the loop watches, `stop` leaves
        both open: the returned undo closes them if the worker has been cleaned up
        meanwhile, so a descriptor is never pulled from under the loop.
        """
        if self._process is None or not self._conns:
            raise self._state_error("wait on")
        bell = self._bell_fd
        aloop: asyncio.AbstractEventLoop = loop

        def on_bell() -> None:
            if self.BATCH_BELLS:
                # one bell per burst: no more until a poll finds the ring empty and re-arms
                out_ring = self._rx
                if out_ring is not None:
                    out_ring.set_reader_waiting(False)
            drain_bell(bell)
            callback()

        def on_exit() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                aloop.call_soon_threadsafe(callback)

        def rebell() -> None:
            with contextlib.suppress(RuntimeError):
                aloop.call_soon_threadsafe(on_bell)

        self._rebell = rebell

        with self._exit_lock:
            self._lent = True
        try:
            aloop.add_reader(bell, on_bell)
        except NotImplementedError:  # a loop without add_reader (Windows' proactor)
            with self._exit_lock:
                self._lent = False
            return None
        space = self._space_fd
        # the space pipe too: a thread woken for each of its rings would then take the GIL
        # from the loop, and hand its wake-up over through the loop's self-pipe anyway
        aloop.add_reader(space, self._on_space)
        self._sync_watch()  # the loop watches the bell and the space pipe from now on
        self._exit_hooks.append(on_exit)
        if self._child_exited:
            on_exit()
        self.arm_receive()  # the child rings the doorbell on every reply

        def unwatch() -> None:
            aloop.remove_reader(bell)
            aloop.remove_reader(space)
            with contextlib.suppress(ValueError):
                self._exit_hooks.remove(on_exit)
            with self._exit_lock:
                self._lent = False
                close, self._lent_close = self._lent_close, None
            if close is not None:
                for conn in close:
                    conn.close()
            else:
                self._sync_watch()

        return unwatch

    # -- errors and reports ---------------------------------------------------------------

    def _state_error(self, operation: str) -> KernelStateError:
        if self._error is not None:
            err = KernelFailedError(self._kernel_id, self._error)
            err.__cause__ = self._error
            return err
        hint = _STATE_HINTS.get(self._state, "")
        return KernelStateError(self._kernel_id, self._state, operation, hint)

    def _uptime(self) -> float:
        """Seconds from start to stop (or to now while it runs); 0.0 if never started."""
        end = self._stopped_at or _monotonic()
        return end - self._started_at if self._started_at else 0.0

    # -- event-loop hosting -------------------------------------------------------------

    def wait_handles(self) -> tuple[int, int]:
        """File descriptors an event loop can watch: (outbox doorbell, child sentinel).

        Call `arm_receive` first, re-check with `receive_nowait`, then wait for
        either descriptor to become readable; `disarm_receive` afterwards.
        """
        if self._process is None or not self._conns:
            raise self._state_error("wait on")
        return self._bell_fd, self._process.sentinel

    def arm_receive(self) -> None:
        """Ask the child to ring the outbox doorbell on its next reply."""
        if self._out_ring is not None and not self._out_ring.closed:
            self._out_ring.set_reader_waiting(True)

    def disarm_receive(self) -> None:
        """Withdraw `arm_receive` and empty the doorbell."""
        if self._out_ring is not None and not self._out_ring.closed:
            self._out_ring.set_reader_waiting(False)
            drain_bell(self._bell_fd)

    def statistics(self) -> dict[str, Any]:
        """State, error, child, waker and ring counters in one dictionary."""
        wakers = self._wakers
        rings: dict[str, Any] = {}
        for name, ring in (("inbox", self._in_ring), ("outbox", self._out_ring)):
            if ring is not None and not ring.closed:
                rings[name] = ring.stats()
        return {
            "kernel_id": self._kernel_id,
            "state": self._state.value,
            "failed": self._error is not None,
            "error": repr(self._error) if self._error is not None else None,
            "pid": self.pid,
            "exit_code": self._exit_code,
            "implementation": _native.IMPLEMENTATION,
            "uptime_seconds": self._uptime(),
            "unprocessed": len(self._unprocessed),
            "pending_replies": len(self._pending_out),
            "pending_input": self.pending_input,
            "in_flight": len(self._inflight),
            "wakers": {"readable": len(wakers.readable), "writable": len(wakers.writable)},
            **rings,
        }

    def __del__(self) -> None:
        if getattr(self, "_owner_pid", None) != os.getpid():
            return  # a fork of the parent: the child and its channels are not ours
        process = getattr(self, "_process", None)
        if process is not None and getattr(self, "_conns", None):
            try:
                self._cleanup()
            except Exception:
                pass

    def __repr__(self) -> str:
        failure = f" failed: {self._error!r}" if self._error is not None else ""
        return (
            f"<{type(self).__name__} {self._kernel_id!r} {self._state.name} pid={self.pid} "
            f"({_native.IMPLEMENTATION}){failure}>"
        )
