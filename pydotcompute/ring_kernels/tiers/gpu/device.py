"""Device code of the GPU ring kernel: the persistent loop and its memory-order primitives.

This module imports Numba at the top and is itself imported only when a GPU actor is
launched or compiled. Host code must not live here: under the Numba CUDA simulator the
``cuda`` global of this module is swapped for a fake while a simulated kernel runs.

The same Python source is the real kernel (compiled by Numba) and the simulated one (run by
``simlaunch``). Only the primitives differ:

========================  ===========================================  ======================
primitive                 on a GPU (sm_70+)                            simulator
========================  ===========================================  ======================
``load_acquire``          ``ld.acquire.sys.global.b64`` + memory       plain read (the GIL
                          clobber (never hoisted out of the loop)      orders threads)
``load_relaxed``          ``ld.relaxed.sys.global.b64`` (flags)        plain read
``store_release``         ``st.release.sys.global.b64``                plain write
``store_relaxed``         ``st.relaxed.sys.global.b64``                plain write
``now_ns``                ``%globaltimer``                             ``perf_counter_ns``
``cuda.nanosleep``        ``nanosleep.u32``                            ``time.sleep``
========================  ===========================================  ======================

The memory-ordering argument is in ``kernel.py``'s opening comment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import cuda as _numba_cuda
from numba import types

from ....backends.numba_compat import ensure_numpy_compat
from . import layout as L

ensure_numpy_compat()  # before the first compile (NumPy 2.5 lacks the np.row_stack it uses)

cuda: Any = _numba_cuda  # the name the simulator swaps; typed Any (Numba has no stubs)

__all__ = ("SIMULATOR", "load_acquire", "make_ring_kernel", "now_ns", "store_release")

SIMULATOR: bool = bool(getattr(numba.config, "ENABLE_CUDASIM", 0))

# Layout constants as module globals: Numba freezes them into the kernel as literals.
IN_TAIL, OUT_HEAD, ACTIVE, TERMINATE = L.IN_TAIL, L.OUT_HEAD, L.ACTIVE, L.TERMINATE
DOORBELL, DOORBELL_SHIFT = L.DOORBELL, L.DOORBELL_SHIFT
DOORBELL_ACTIVE, DOORBELL_TERMINATE = L.DOORBELL_ACTIVE, L.DOORBELL_TERMINATE
OUTBOX_POLICY, MAX_BACKOFF_NS = L.OUTBOX_POLICY, L.MAX_BACKOFF_NS
IN_HEAD, OUT_TAIL, STARTED, TERMINATED = L.IN_HEAD, L.OUT_TAIL, L.STARTED, L.TERMINATED
ACTIVE_ACK, HEARTBEAT, PROCESSED, DROPPED = L.ACTIVE_ACK, L.HEARTBEAT, L.PROCESSED, L.DROPPED
TAIL_SEEN = L.TAIL_SEEN
ERRORS, LAST_LATENCY, TOTAL_LATENCY = L.ERRORS, L.LAST_LATENCY, L.TOTAL_LATENCY
MAX_LATENCY, MIN_LATENCY, LAST_STATUS = L.MAX_LATENCY, L.MIN_LATENCY, L.LAST_STATUS
OUTBOX_FULL, SPIN_ITERATIONS, BATCH = L.OUTBOX_FULL, L.SPIN_ITERATIONS, L.BATCH
CMD_IDLE, CMD_PROCESS, CMD_PROCESS_DROP = L.CMD_IDLE, L.CMD_PROCESS, L.CMD_PROCESS_DROP
CMD_STALL, CMD_EXIT = L.CMD_STALL, L.CMD_EXIT

load_acquire: Any
load_relaxed: Any
store_release: Any
store_relaxed: Any
now_ns: Any

if SIMULATOR:

    def load_acquire(arr: Any, idx: int) -> int:
        """Plain read: simulated threads are ordered by the GIL (no weaker-kind atomics)."""
        return int(arr[idx])

    def load_relaxed(arr: Any, idx: int) -> int:
        return int(arr[idx])

    def store_release(arr: Any, idx: int, value: int) -> None:
        arr[idx] = value

    def store_relaxed(arr: Any, idx: int, value: int) -> None:
        arr[idx] = value

    def now_ns() -> int:
        return time.perf_counter_ns()

else:  # pragma: no cover - compiled for the device; checked by the PTX tests
    import importlib

    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    try:
        cgutils: Any = importlib.import_module("numba.cuda.cgutils")
    except ImportError as exc:
        from ....backends.numba_compat import numba_cuda_version, version_problem

        raise ImportError(
            version_problem(numba_cuda_version())
            or f"numba.cuda.cgutils is missing ({exc}); pip install 'numba-cuda>=0.20'"
        ) from exc

    _I64 = ir.IntType(64)

    def _slot_pointer(
        context: Any, builder: Any, arrty: Any, arr: Any, idxty: Any, idx: Any
    ) -> Any:
        ary = context.make_array(arrty)(context, builder, value=arr)
        index = context.cast(builder, idx, idxty, types.intp)
        return cgutils.get_item_pointer(context, builder, arrty, ary, [index], wraparound=False)

    def _check_word_array(arr: Any) -> None:
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64):
            raise TypeError(f"expected a 1-D int64 array, got {arr}")

    def _load(order: str) -> Any:
        @intrinsic
        def load(typingctx: Any, arr: Any, idx: Any) -> Any:
            _check_word_array(arr)
            sig = types.int64(arr, idx)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                ptr = _slot_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                asm = ir.InlineAsm(
                    ir.FunctionType(_I64, [_I64.as_pointer()]),
                    f"ld.{order}.sys.global.b64 $0, [$1];",
                    "=l,l,~{memory}",
                    side_effect=True,
                )
                return builder.call(asm, [ptr])

            return sig, codegen

        return load

    # acquire: later loads see everything published before the store that was read
    load_acquire = _load("acquire")
    # relaxed: a flag that carries no data; may be in flight together with an acquire
    load_relaxed = _load("relaxed")

    def _store(order: str) -> Any:
        @intrinsic
        def store(typingctx: Any, arr: Any, idx: Any, value: Any) -> Any:
            _check_word_array(arr)
            sig = types.void(arr, idx, value)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                ptr = _slot_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                val = context.cast(builder, args[2], sig.args[2], types.int64)
                asm = ir.InlineAsm(
                    ir.FunctionType(ir.VoidType(), [_I64.as_pointer(), _I64]),
                    f"st.{order}.sys.global.b64 [$0], $1;",
                    "l,l,~{memory}",
                    side_effect=True,
                )
                builder.call(asm, [ptr, val])
                return context.get_dummy_value()

            return sig, codegen

        return store

    store_release = _store("release")
    store_relaxed = _store("relaxed")

    @intrinsic
    def now_ns(typingctx: Any) -> Any:
        """The GPU's global nanosecond timer."""
        sig = types.int64()

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            asm = ir.InlineAsm(
                ir.FunctionType(_I64, []), "mov.u64 $0, %globaltimer;", "=l", side_effect=True
            )
            return builder.call(asm, [])

        return sig, codegen


def make_ring_kernel(handler: Callable[..., Any], *, cooperative: bool) -> Callable[..., None]:
    """The persistent loop around ``handler`` (a device function, or a Python function in
    the simulator).

    Arguments of the returned kernel: ``inbox`` (ring of input records), ``outbox`` (ring of
    output records plus one scratch slot at the end), ``ostat`` (int64 status per outbox
    slot), ``lat`` (int64 latency ring, one entry per processed message modulo its size),
    ``ctl`` (the control block, ``layout.py``), ``state`` (the actor's device array) and
    ``stage`` (``BATCH`` input records in device memory; cooperative kernels only).

    Thread 0 polls and decides; the decision reaches the block through shared memory and
    ``syncthreads``. When several messages wait, up to ``BATCH`` are handled one after the
    other (actor semantics: in order, one at a time) and published with one release store,
    so a burst pays for one system-scope fence instead of one per message. With
    ``cooperative`` every thread of the block calls the handler on the same message
    (splitting an array payload by ``cuda.threadIdx.x``); otherwise the kernel runs with one
    thread. A cooperative block first copies the batch's inbox slots into ``stage`` together
    (thread ``t`` copies slots ``t``, ``t + blockDim``, ...: many reads of host memory in
    flight at once instead of every thread reading every field across PCIe), then handles
    the staged copies.
    """

    def pdc_ring_kernel(
        inbox: Any, outbox: Any, ostat: Any, lat: Any, ctl: Any, state: Any, stage: Any
    ) -> None:
        tid = cuda.threadIdx.x
        sh = cuda.shared.array(4, types.int64)
        cap_in = inbox.shape[0]
        cap_out = outbox.shape[0] - 1  # the last slot is the scratch reply of a dropped one
        nlat = lat.shape[0]
        max_backoff = ctl[MAX_BACKOFF_NS]
        drop_when_full = ctl[OUTBOX_POLICY] != 0
        # thread 0's bookkeeping (other threads keep unused copies)
        head = 0
        tail_seen = 0
        out_tail = 0
        out_head_seen = 0
        active_seen = -1
        processed = 0
        errors = 0
        dropped = 0
        full_events = 0
        stalled = False
        beat = 0
        total_lat = 0
        max_lat = 0
        min_lat = 0
        last_bad = 0
        dt = 0
        idle = 0
        backoff = 0
        if tid == 0:
            store_release(ctl, STARTED, 1)
        while True:
            if tid == 0:
                cmd = CMD_IDLE
                count = 0
                # one word brings the inbox tail and both flags: an idle poll is one
                # system-scope load (one round trip to host memory)
                bell = load_acquire(ctl, DOORBELL)
                terminate = bell & DOORBELL_TERMINATE
                active = 1 if bell & DOORBELL_ACTIVE else 0
                tail_seen = bell >> DOORBELL_SHIFT
                if terminate != 0:
                    cmd = CMD_EXIT
                else:
                    if active != active_seen:
                        active_seen = active
                        store_release(ctl, ACTIVE_ACK, active)
                    if active != 0:
                        avail = tail_seen - head
                        if avail > 0:
                            space = cap_out - (out_tail - out_head_seen)
                            if space < avail:
                                out_head_seen = load_acquire(ctl, OUT_HEAD)
                                space = cap_out - (out_tail - out_head_seen)
                            if space > 0:
                                cmd = CMD_PROCESS
                                count = min(avail, space, BATCH)
                                stalled = False
                            else:
                                if not stalled:
                                    stalled = True
                                    full_events += 1
                                    store_relaxed(ctl, OUTBOX_FULL, full_events)
                                if drop_when_full:
                                    cmd = CMD_PROCESS_DROP
                                    count = min(avail, BATCH)
                                else:
                                    cmd = CMD_STALL
                sh[0] = cmd
                sh[1] = head
                sh[2] = out_tail
                sh[3] = count
            cuda.syncthreads()
            cmd = sh[0]
            if cmd == CMD_EXIT:
                break
            if cmd == CMD_PROCESS or cmd == CMD_PROCESS_DROP:  # noqa: SIM109 - Numba
                count = sh[3]
                if cooperative:  # stage the batch: the block's reads overlap
                    for j in range(tid, count, cuda.blockDim.x):
                        stage[j] = inbox[(sh[1] + j) % cap_in]
                    cuda.syncthreads()
                for j in range(count):
                    i = (sh[1] + j) % cap_in
                    o = (sh[2] + j) % cap_out if cmd == CMD_PROCESS else cap_out
                    t0 = now_ns()
                    status = 0
                    if cooperative:
                        status = handler(stage[j], outbox[o], state)
                        cuda.threadfence_system()
                        cuda.syncthreads()
                    elif tid == 0:
                        status = handler(inbox[i], outbox[o], state)
                    if tid == 0:
                        rin = stage[j] if cooperative else inbox[i]
                        rout = outbox[o]
                        rout._mid_hi = 0
                        rout._mid_lo = 0
                        rout._cid_hi = rin._mid_hi
                        rout._cid_lo = rin._mid_lo
                        rout._priority = rin._priority
                        ostat[o] = status
                        dt = now_ns() - t0
                        lat[processed % nlat] = dt
                        processed += 1
                        total_lat += dt
                        if dt > max_lat:
                            max_lat = dt
                        if processed == 1 or dt < min_lat:
                            min_lat = dt
                        if status != 0:
                            errors += 1
                            last_bad = status
                if tid == 0:
                    # one publication per batch: counters first, then the release stores
                    store_relaxed(ctl, PROCESSED, processed)
                    store_relaxed(ctl, ERRORS, errors)
                    store_relaxed(ctl, LAST_STATUS, last_bad)
                    store_relaxed(ctl, LAST_LATENCY, dt)
                    store_relaxed(ctl, TOTAL_LATENCY, total_lat)
                    store_relaxed(ctl, MAX_LATENCY, max_lat)
                    store_relaxed(ctl, MIN_LATENCY, min_lat)
                    head += count
                    if cmd == CMD_PROCESS:
                        out_tail += count
                        store_release(ctl, OUT_TAIL, out_tail)
                    else:
                        dropped += count
                        store_relaxed(ctl, DROPPED, dropped)
                    store_release(ctl, IN_HEAD, head)
                idle = 0
                backoff = 0
            else:
                idle += 1
                if tid == 0 and (cmd == CMD_STALL or idle % 16 == 0):
                    beat += 1
                    store_relaxed(ctl, TAIL_SEEN, tail_seen)
                    store_relaxed(ctl, HEARTBEAT, beat)
                if idle > SPIN_ITERATIONS:
                    backoff = backoff * 2 if backoff > 0 else 32
                    if backoff > max_backoff:
                        backoff = max_backoff
                    if backoff > 0:
                        cuda.nanosleep(np.uint32(backoff))
            cuda.syncthreads()
        if tid == 0:
            store_release(ctl, TERMINATED, 1)

    return pdc_ring_kernel
