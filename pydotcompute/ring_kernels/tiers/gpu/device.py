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
EDGE_ROUTE, EDGE_ROUTE_ACK = L.EDGE_ROUTE, L.EDGE_ROUTE_ACK
EDGE_ROUTE_OUT, EDGE_ROUTE_IN = L.EDGE_ROUTE_OUT, L.EDGE_ROUTE_IN
EDGE_OUT_BASE, EDGE_OUT_CAP, EDGE_OUT_HDR = L.EDGE_OUT_BASE, L.EDGE_OUT_CAP, L.EDGE_OUT_HDR
EDGE_IN_BASE, EDGE_IN_CAP, EDGE_IN_HDR = L.EDGE_IN_BASE, L.EDGE_IN_CAP, L.EDGE_IN_HDR
EH_TAIL, EH_HEAD, EH_FULL = L.EH_TAIL, L.EH_HEAD, L.EH_FULL
EDGE_REJECTED = L.EDGE_REJECTED

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
    ``ctl`` (the control block, ``layout.py``), ``state`` (the actor's device array),
    ``stage`` (``BATCH`` input records in device memory), ``ostage`` (one output record in
    device memory: the reply bound for an out-edge), ``stageb`` and ``ostageb`` (the two as
    bytes), ``arena`` (the device's edge arena, bytes in device memory) and ``ehdr`` (the
    edge headers, int64 words in mapped memory; ``edge.py``).

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

    Device edges (``EDGE_ROUTE``): with the out route on, the handler writes its reply into
    ``ostage`` (device memory, not the mapped outbox: no PCIe traffic per message), and
    each reply (status 0) is copied from there into the out-edge's next slot and the batch is
    published with one release store of the edge's tail; a full edge stalls the kernel
    (backpressure: it waits, it never overwrites). With the in route on, the edge is a
    second input: a batch is taken from the inbox or the edge by turns, the edge's records
    are copied into ``stage`` by the block, handled, and the edge's head is released after
    the batch. A rejected message (non-zero status) puts nothing into the out-edge.
    """

    def pdc_ring_kernel(
        inbox: Any,
        outbox: Any,
        ostat: Any,
        lat: Any,
        ctl: Any,
        state: Any,
        stage: Any,
        ostage: Any,
        stageb: Any,
        ostageb: Any,
        arena: Any,
        ehdr: Any,
    ) -> None:
        tid = cuda.threadIdx.x
        nthr = cuda.blockDim.x
        sh = cuda.shared.array(10, types.int64)
        cap_in = inbox.shape[0]
        cap_out = outbox.shape[0] - 1  # the last slot is the scratch reply of a dropped one
        isz_in = stageb.shape[0] // stage.shape[0]  # bytes per input record
        isz_out = ostageb.shape[0] // ostage.shape[0]  # bytes per output record
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
        route = 0  # the EDGE_ROUTE value acted on
        eo_base = 0  # out-edge: slots at arena[eo_base:], eo_cap of them, header eo_hdr
        eo_cap = 1
        eo_hdr = 0
        eo_tail = 0  # records published into the out-edge
        eo_head_seen = 0  # the consumer's head as last read
        eo_full = 0
        eo_rejected = 0  # messages rejected while writing into an out-edge
        ei_base = 0  # in-edge
        ei_cap = 1
        ei_hdr = 0
        ei_head = 0  # records taken from the in-edge
        turn = 0  # 1: the in-edge goes first when both inputs hold messages
        if tid == 0:
            store_release(ctl, STARTED, 1)
        while True:
            if tid == 0:
                cmd = CMD_IDLE
                count = 0
                src = 0
                # one word brings the inbox tail and both flags: an idle poll is one
                # system-scope load (one round trip to host memory)
                bell = load_acquire(ctl, DOORBELL)
                terminate = bell & DOORBELL_TERMINATE
                active = 1 if bell & DOORBELL_ACTIVE else 0
                tail_seen = bell >> DOORBELL_SHIFT
                if terminate != 0:
                    cmd = CMD_EXIT
                else:
                    if idle % 16 == 0:  # edge routes: between batches, every 16th idle poll
                        want = load_acquire(ctl, EDGE_ROUTE)
                        if want != route:
                            if (want & EDGE_ROUTE_OUT) != 0 and (route & EDGE_ROUTE_OUT) == 0:
                                eo_base = ctl[EDGE_OUT_BASE]
                                eo_cap = ctl[EDGE_OUT_CAP]
                                eo_hdr = ctl[EDGE_OUT_HDR]
                                eo_tail = load_acquire(ehdr, eo_hdr + EH_TAIL)
                                eo_head_seen = load_acquire(ehdr, eo_hdr + EH_HEAD)
                                eo_full = load_acquire(ehdr, eo_hdr + EH_FULL)
                            if (want & EDGE_ROUTE_IN) != 0 and (route & EDGE_ROUTE_IN) == 0:
                                ei_base = ctl[EDGE_IN_BASE]
                                ei_cap = ctl[EDGE_IN_CAP]
                                ei_hdr = ctl[EDGE_IN_HDR]
                                ei_head = load_acquire(ehdr, ei_hdr + EH_HEAD)
                            route = want
                            stalled = False
                            store_release(ctl, EDGE_ROUTE_ACK, route)
                    if active != active_seen:
                        active_seen = active
                        store_release(ctl, ACTIVE_ACK, active)
                    if active != 0:
                        avail = tail_seen - head
                        if (route & EDGE_ROUTE_IN) != 0:
                            avail_e = load_acquire(ehdr, ei_hdr + EH_TAIL) - ei_head
                            if avail_e > 0 and (avail <= 0 or turn != 0):
                                src = 1
                                avail = avail_e
                        if avail > 0:
                            if (route & EDGE_ROUTE_OUT) != 0:
                                space = eo_cap - (eo_tail - eo_head_seen)
                                if space < avail:
                                    eo_head_seen = load_acquire(ehdr, eo_hdr + EH_HEAD)
                                    space = eo_cap - (eo_tail - eo_head_seen)
                            else:
                                space = cap_out - (out_tail - out_head_seen)
                                if space < avail:
                                    out_head_seen = load_acquire(ctl, OUT_HEAD)
                                    space = cap_out - (out_tail - out_head_seen)
                            if space > 0:
                                cmd = CMD_PROCESS
                                count = min(avail, space, BATCH)
                                stalled = False
                                turn = 1 - src  # the other input goes first next time
                            else:
                                if not stalled:
                                    stalled = True
                                    if (route & EDGE_ROUTE_OUT) != 0:
                                        eo_full += 1
                                        store_relaxed(ehdr, eo_hdr + EH_FULL, eo_full)
                                    else:
                                        full_events += 1
                                        store_relaxed(ctl, OUTBOX_FULL, full_events)
                                if drop_when_full and (route & EDGE_ROUTE_OUT) == 0:
                                    cmd = CMD_PROCESS_DROP
                                    count = min(avail, BATCH)
                                    turn = 1 - src
                                else:
                                    cmd = CMD_STALL
                sh[0] = cmd
                sh[1] = ei_head if src != 0 else head
                sh[2] = out_tail
                sh[3] = count
                sh[4] = src
                sh[5] = 1 if (route & EDGE_ROUTE_OUT) != 0 else 0
                sh[6] = ei_base
                sh[7] = ei_cap
            cuda.syncthreads()
            cmd = sh[0]
            if cmd == CMD_EXIT:
                break
            if cmd == CMD_PROCESS or cmd == CMD_PROCESS_DROP:  # noqa: SIM109 - Numba
                count = sh[3]
                from_edge = sh[4] != 0
                to_edge = sh[5] != 0
                if from_edge:  # stage the batch from the in-edge (device memory), as bytes
                    first = sh[1]
                    ebase = sh[6]
                    ecap = sh[7]
                    for k in range(tid, count * isz_in, nthr):
                        j = k // isz_in
                        b = k - j * isz_in
                        stageb[k] = arena[ebase + ((first + j) % ecap) * isz_in + b]
                    cuda.syncthreads()
                elif cooperative:  # stage the batch: the block's reads overlap
                    for j in range(tid, count, nthr):
                        stage[j] = inbox[(sh[1] + j) % cap_in]
                    cuda.syncthreads()
                staged = cooperative or from_edge
                written = 0
                for j in range(count):
                    i = (sh[1] + j) % cap_in
                    o = (sh[2] + j) % cap_out if cmd == CMD_PROCESS else cap_out
                    t0 = now_ns()
                    status = 0
                    if to_edge:  # the reply goes to device memory, then into the edge
                        if cooperative:
                            status = handler(stage[j], ostage[0], state)
                            cuda.threadfence_system()
                            cuda.syncthreads()
                        elif tid == 0:
                            if staged:
                                status = handler(stage[j], ostage[0], state)
                            else:
                                status = handler(inbox[i], ostage[0], state)
                    elif cooperative:
                        status = handler(stage[j], outbox[o], state)
                        cuda.threadfence_system()
                        cuda.syncthreads()
                    elif tid == 0:
                        if staged:
                            status = handler(stage[j], outbox[o], state)
                        else:
                            status = handler(inbox[i], outbox[o], state)
                    if tid == 0:
                        rin = stage[j] if staged else inbox[i]
                        rout = ostage[0] if to_edge else outbox[o]
                        # (header columns by name, as the host reads them)
                        rout["_mid_hi"] = 0
                        rout["_mid_lo"] = 0
                        rout["_cid_hi"] = rin["_mid_hi"]
                        rout["_cid_lo"] = rin["_mid_lo"]
                        rout["_priority"] = rin["_priority"]
                        if not to_edge:
                            ostat[o] = status
                        elif status == 0:  # the reply into the out-edge's next slot
                            dst = eo_base + ((eo_tail + written) % eo_cap) * isz_out
                            for b in range(isz_out):
                                arena[dst + b] = ostageb[b]
                            written += 1
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
                            if to_edge:
                                eo_rejected += 1
                if tid == 0:
                    # one publication per batch: counters first, then the release stores
                    store_relaxed(ctl, PROCESSED, processed)
                    store_relaxed(ctl, ERRORS, errors)
                    store_relaxed(ctl, LAST_STATUS, last_bad)
                    store_relaxed(ctl, LAST_LATENCY, dt)
                    store_relaxed(ctl, TOTAL_LATENCY, total_lat)
                    store_relaxed(ctl, MAX_LATENCY, max_lat)
                    store_relaxed(ctl, MIN_LATENCY, min_lat)
                    if to_edge:
                        store_relaxed(ctl, EDGE_REJECTED, eo_rejected)
                        cuda.threadfence_system()
                        eo_tail += written
                        store_release(ehdr, eo_hdr + EH_TAIL, eo_tail)
                    elif cmd == CMD_PROCESS:
                        out_tail += count
                        store_release(ctl, OUT_TAIL, out_tail)
                    else:
                        dropped += count
                        store_relaxed(ctl, DROPPED, dropped)
                    if from_edge:
                        ei_head += count
                        store_release(ehdr, ei_hdr + EH_HEAD, ei_head)
                    else:
                        head += count
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
