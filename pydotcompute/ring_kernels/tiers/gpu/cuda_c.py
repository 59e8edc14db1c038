"""The CUDA C flavour of the persistent kernel: source generation and NVRTC compilation.

A handler written in CUDA C is pasted into a generated translation unit that defines one
``struct`` per message layout (with explicit padding, so the C layout is the NumPy layout by
construction; ``static_assert`` checks the sizes), the memory-order primitives as inline
PTX, and the same loop as the Numba kernel (``device.py``). NVRTC compiles it to PTX
without a GPU (``ptx``); on a GPU CuPy's ``RawModule`` compiles and loads it.

The handler's signature:

```text
__device__ int handle(const In* in, Out* out, State* state)
```

where ``In``/``Out`` are the message class names (also typedef'd as ``pdc_in_t`` and
``pdc_out_t``), ``State`` is the C type of the state array's elements (``pdc_state_t``)
and ``PDC_STATE_SIZE`` is its element count.
"""

from __future__ import annotations

import keyword
import re
from typing import Any

import numpy as np

from ....exceptions import BackendNotAvailableError, KernelCompilationError, TypeValidationError
from . import layout

__all__ = ("KERNEL_NAME", "c_struct", "generate_source", "ptx")

KERNEL_NAME = "pdc_ring_kernel_c"

_C_TYPES = {
    ("b", 1): "bool",
    ("i", 1): "signed char",
    ("u", 1): "unsigned char",
    ("i", 2): "short",
    ("u", 2): "unsigned short",
    ("i", 4): "int",
    ("u", 4): "unsigned int",
    ("i", 8): "long long",
    ("u", 8): "unsigned long long",
    ("f", 4): "float",
    ("f", 8): "double",
}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_C_KEYWORDS = frozenset(
    {
        "auto",
        "bool",
        "break",
        "case",
        "char",
        "class",
        "const",
        "continue",
        "default",
        "delete",
        "do",
        "double",
        "else",
        "enum",
        "extern",
        "float",
        "for",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "new",
        "operator",
        "private",
        "protected",
        "public",
        "register",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "struct",
        "switch",
        "template",
        "this",
        "typedef",
        "union",
        "unsigned",
        "virtual",
        "void",
        "volatile",
        "while",
    }
)


def c_type(dtype: np.dtype[Any]) -> str:
    """The C spelling of a scalar NumPy dtype."""
    ctype = _C_TYPES.get((dtype.kind, dtype.itemsize))
    if ctype is None:
        raise TypeValidationError(
            f"dtype {dtype} has no CUDA C equivalent for a CUDA C handler; use bool, "
            "(u)int8..64, float32 or float64 fields"
        )
    return ctype


def _c_name(name: str, what: str) -> str:
    if not _IDENT.match(name) or name in _C_KEYWORDS or keyword.iskeyword(name):
        raise TypeValidationError(f"{what} {name!r} is not usable as a C identifier")
    return name


def c_struct(name: str, dtype: np.dtype[Any]) -> str:
    """A C ``struct`` with exactly ``dtype``'s layout (explicit padding, size asserted)."""
    _c_name(name, "message class name")
    fields = sorted(
        ((n, *dtype.fields[n][:2]) for n in dtype.names or ()),  # type: ignore[index]
        key=lambda f: f[2],
    )
    lines = [f"struct __align__({dtype.alignment}) {name} {{"]
    pos = 0
    pad = 0
    for fname, fdt, offset in fields:
        if offset > pos:
            lines.append(f"    unsigned char _pdc_pad{pad}[{offset - pos}];")
            pad += 1
        base = fdt.base
        if base.fields is not None:
            raise TypeValidationError(f"field {fname!r} of {name} is a nested structure")
        dims = "".join(f"[{d}]" for d in fdt.shape)
        lines.append(f"    {c_type(base)} {_c_name(fname, 'field name')}{dims};")
        pos = offset + fdt.itemsize
    if dtype.itemsize > pos:
        lines.append(f"    unsigned char _pdc_pad{pad}[{dtype.itemsize - pos}];")
    lines.append("};")
    lines.append(
        f'static_assert(sizeof({name}) == {dtype.itemsize}, "{name} must match its NumPy layout");'
    )
    return "\n".join(lines)


_PRELUDE = r"""
typedef long long pdc_i64;
__device__ __forceinline__ pdc_i64 pdc_load_acquire(const pdc_i64* p) {
    pdc_i64 v;
    asm volatile("ld.acquire.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ pdc_i64 pdc_load_relaxed(const pdc_i64* p) {
    pdc_i64 v;
    asm volatile("ld.relaxed.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void pdc_store_release(pdc_i64* p, pdc_i64 v) {
    asm volatile("st.release.sys.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void pdc_store_relaxed(pdc_i64* p, pdc_i64 v) {
    asm volatile("st.relaxed.sys.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ pdc_i64 pdc_now_ns() {
    pdc_i64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
"""

_KERNEL = r"""
extern "C" __global__ void {kernel}(
    const pdc_in_t* inbox, pdc_out_t* outbox, pdc_i64* ostat, pdc_i64* lat, pdc_i64* ctl,
    pdc_state_t* state, pdc_in_t* stage, pdc_i64 cap_in, pdc_i64 cap_out, pdc_i64 nlat)
{{
    __shared__ pdc_i64 sh[4];
    const int tid = threadIdx.x;
    const pdc_i64 max_backoff = ctl[PDC_MAX_BACKOFF_NS];
    const bool drop_when_full = ctl[PDC_OUTBOX_POLICY] != 0;
    pdc_i64 head = 0, tail_seen = 0, out_tail = 0, out_head_seen = 0, active_seen = -1;
    pdc_i64 processed = 0, errors = 0, dropped = 0, full_events = 0, beat = 0, last_bad = 0;
    pdc_i64 total_lat = 0, max_lat = 0, min_lat = 0, dt = 0, idle = 0, backoff = 0;
    bool stalled = false;
    if (tid == 0) pdc_store_release(ctl + PDC_STARTED, 1);
    for (;;) {{
        if (tid == 0) {{
            pdc_i64 cmd = PDC_CMD_IDLE, count = 0;
            /* one word brings the inbox tail and both flags: one system-scope load */
            const pdc_i64 bell = pdc_load_acquire(ctl + PDC_DOORBELL);
            const pdc_i64 terminate = bell & PDC_DOORBELL_TERMINATE;
            const pdc_i64 active = (bell & PDC_DOORBELL_ACTIVE) ? 1 : 0;
            tail_seen = bell >> PDC_DOORBELL_SHIFT;
            if (terminate != 0) {{
                cmd = PDC_CMD_EXIT;
            }} else {{
                if (active != active_seen) {{
                    active_seen = active;
                    pdc_store_release(ctl + PDC_ACTIVE_ACK, active);
                }}
                if (active != 0) {{
                    const pdc_i64 avail = tail_seen - head;
                    if (avail > 0) {{
                        pdc_i64 space = cap_out - (out_tail - out_head_seen);
                        if (space < avail) {{
                            out_head_seen = pdc_load_acquire(ctl + PDC_OUT_HEAD);
                            space = cap_out - (out_tail - out_head_seen);
                        }}
                        if (space > 0) {{
                            cmd = PDC_CMD_PROCESS;
                            count = min(min(avail, space), (pdc_i64)PDC_BATCH);
                            stalled = false;
                        }} else {{
                            if (!stalled) {{
                                stalled = true;
                                pdc_store_relaxed(ctl + PDC_OUTBOX_FULL, ++full_events);
                            }}
                            if (drop_when_full) {{
                                cmd = PDC_CMD_PROCESS_DROP;
                                count = min(avail, (pdc_i64)PDC_BATCH);
                            }} else {{
                                cmd = PDC_CMD_STALL;
                            }}
                        }}
                    }}
                }}
            }}
            sh[0] = cmd;
            sh[1] = head;
            sh[2] = out_tail;
            sh[3] = count;
        }}
        __syncthreads();
        const pdc_i64 cmd = sh[0];
        if (cmd == PDC_CMD_EXIT) break;
        if (cmd == PDC_CMD_PROCESS || cmd == PDC_CMD_PROCESS_DROP) {{
            const pdc_i64 count = sh[3];
            if ({cooperative}) {{  /* stage the batch: the block's reads overlap */
                for (pdc_i64 j = tid; j < count; j += blockDim.x)
                    stage[j] = inbox[(sh[1] + j) % cap_in];
                __syncthreads();
            }}
            for (pdc_i64 j = 0; j < count; ++j) {{
                const pdc_i64 i = (sh[1] + j) % cap_in;
                const pdc_i64 o = cmd == PDC_CMD_PROCESS ? (sh[2] + j) % cap_out : cap_out;
                const pdc_in_t* in = {cooperative} ? &stage[j] : &inbox[i];
                const pdc_i64 t0 = pdc_now_ns();
                int status = 0;
                if ({cooperative} || tid == 0) status = {handler}(in, &outbox[o], state);
                if ({cooperative}) {{
                    __threadfence_system();
                    __syncthreads();
                }}
                if (tid == 0) {{
                    outbox[o]._mid_hi = 0;
                    outbox[o]._mid_lo = 0;
                    outbox[o]._cid_hi = in->_mid_hi;
                    outbox[o]._cid_lo = in->_mid_lo;
                    outbox[o]._priority = in->_priority;
                    ostat[o] = status;
                    dt = pdc_now_ns() - t0;
                    lat[processed % nlat] = dt;
                    processed += 1;
                    total_lat += dt;
                    if (dt > max_lat) max_lat = dt;
                    if (processed == 1 || dt < min_lat) min_lat = dt;
                    if (status != 0) {{
                        errors += 1;
                        last_bad = status;
                    }}
                }}
            }}
            if (tid == 0) {{
                pdc_store_relaxed(ctl + PDC_PROCESSED, processed);
                pdc_store_relaxed(ctl + PDC_ERRORS, errors);
                pdc_store_relaxed(ctl + PDC_LAST_STATUS, last_bad);
                pdc_store_relaxed(ctl + PDC_LAST_LATENCY, dt);
                pdc_store_relaxed(ctl + PDC_TOTAL_LATENCY, total_lat);
                pdc_store_relaxed(ctl + PDC_MAX_LATENCY, max_lat);
                pdc_store_relaxed(ctl + PDC_MIN_LATENCY, min_lat);
                head += count;
                if (cmd == PDC_CMD_PROCESS) {{
                    out_tail += count;
                    pdc_store_release(ctl + PDC_OUT_TAIL, out_tail);
                }} else {{
                    dropped += count;
                    pdc_store_relaxed(ctl + PDC_DROPPED, dropped);
                }}
                pdc_store_release(ctl + PDC_IN_HEAD, head);
            }}
            idle = 0;
            backoff = 0;
        }} else {{
            idle += 1;
            if (tid == 0 && (cmd == PDC_CMD_STALL || idle % 16 == 0)) {{
                pdc_store_relaxed(ctl + PDC_TAIL_SEEN, tail_seen);
                pdc_store_relaxed(ctl + PDC_HEARTBEAT, ++beat);
            }}
            if (idle > PDC_SPIN_ITERATIONS) {{
                backoff = backoff > 0 ? backoff * 2 : 32;
                if (backoff > max_backoff) backoff = max_backoff;
                if (backoff > 0) __nanosleep((unsigned int)backoff);
            }}
        }}
        __syncthreads();
    }}
    if (tid == 0) pdc_store_release(ctl + PDC_TERMINATED, 1);
}}
"""


def generate_source(
    handler_source: str,
    handler_name: str,
    in_name: str,
    in_dtype: np.dtype[Any],
    out_name: str,
    out_dtype: np.dtype[Any],
    state_dtype: np.dtype[Any],
    state_size: int,
    *,
    cooperative: bool,
) -> str:
    """The whole translation unit: layout, primitives, structs, handler, kernel."""
    _c_name(handler_name, "handler_name")
    defines = "\n".join(f"#define PDC_{k} {v}" for k, v in sorted(layout.constants().items()))
    structs = [c_struct(in_name, in_dtype)]
    if out_name != in_name:
        structs.append(c_struct(out_name, out_dtype))
    elif out_dtype != in_dtype:
        raise TypeValidationError(f"two message classes named {in_name} with different layouts")
    parts = [
        "// generated by pydotcompute: GPU ring kernel (CUDA C handler)",
        defines,
        _PRELUDE,
        *structs,
        f"typedef {in_name} pdc_in_t;",
        f"typedef {out_name} pdc_out_t;",
        f"typedef {c_type(state_dtype)} pdc_state_t;",
        f"#define PDC_STATE_SIZE {int(state_size)}",
        "// ---- handler ----",
        handler_source,
        "// ---- persistent loop ----",
        _KERNEL.format(
            kernel=KERNEL_NAME,
            handler=handler_name,
            cooperative="true" if cooperative else "false",
        ),
    ]
    return "\n".join(parts)


def _nvrtc() -> Any:
    try:
        from cupy.cuda import nvrtc
    except Exception as exc:
        raise BackendNotAvailableError(
            f"CUDA C handlers are compiled with NVRTC through CuPy, which is not usable "
            f'({type(exc).__name__}: {exc}); pip install "pydotcompute[cuda]"'
        ) from exc
    return nvrtc


def ptx(source: str, cc: tuple[int, int], *, options: tuple[str, ...] = ()) -> str:
    """Compile ``source`` to PTX for compute capability ``cc`` with NVRTC (no GPU needed).

    Raises:
        KernelCompilationError: NVRTC rejected the source; carries its log.
    """
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(source, "pdc_ring_kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"-arch=compute_{cc[0]}{cc[1]}", "-std=c++17", *options])
        except Exception as exc:
            log = nvrtc.getProgramLog(prog)
            raise KernelCompilationError(
                f"NVRTC could not compile the CUDA C ring kernel for sm_{cc[0]}{cc[1]}: "
                f"{exc}\n{log}"
            ) from exc
        out = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    text = out.decode() if isinstance(out, bytes) else str(out)
    return text.rstrip("\x00")
