"""What one round trip costs, counted rather than timed: system calls and instructions.

On a shared or virtual machine a timing drifts with load and with how fast an idle core
wakes up; a count does not. Each workload runs in a fresh child interpreter
(``PYTHONHASHSEED=0``), makes a warm-up, writes a mark to stderr, makes ``--trips`` round
trips (or pipelined messages), and writes a second mark:

- ``--tool strace``: ``strace -f`` records the child; the calls between the two marks,
  by name and by thread, divided by the trips. The per-thread split shows who sleeps:
  ``futex`` waits on the GIL's condition are a thread that woke up and found the GIL held,
  one more sleep and wake-up a trip. (strace slows every call down, so a race that a
  quick machine wins can go the other way here: read the structure, not the last digit.)
- ``--tool callgrind``: ``valgrind --tool=callgrind`` counts every instruction; the
  workload runs twice (``--trips`` and three times as many) and the difference, divided by
  the extra trips, is what one trip costs, start-up and shutdown cancelled out.
- ``--tool cachesim`` (not part of ``both``): ``valgrind --tool=cachegrind
  --cache-sim=yes`` with this machine's cache shapes read from sysfs (the first-level
  data cache, and the per-core L2 as the last level: what one core's working set must fit
  in before it reaches the shared L3), differenced the same way: instructions, data reads
  and writes, first-level and last-level data misses a trip. With 1,000 actors visited in
  turn, a miss is a cache line the trip touches that a round of the other actors pushed
  out: the count measures how much of an actor a message touches.

Workloads: ``thread`` (``tier="thread"`` through the runtime, ``send_and_receive`` with a
10 s timeout, as ``bridge_benchmark.py``), ``thread-floor`` (an asyncio loop and a thread
answering through ``call_soon_threadsafe``), ``thread-direct`` (``ThreadedRingKernel``),
``thread-pipe`` / ``thread-direct-pipe`` (a producer sending while the caller receives),
``thread-pipe-req`` (the same after 300 ``send_and_receive`` requests: from then on every
reply is checked for a caller),
``tier1`` / ``tier1-floor`` (the asyncio tier's send + receive against two
``asyncio.Queue``), ``tier1-pipe`` / ``tier1-pipe-floor``, ``actors`` /
``actors-floor`` (1,000 actors, each with a caller of its own making round trips at once,
against 1,000 bare tasks on ``asyncio.Queue``; counts per round trip), and ``actors-agg`` /
``actors-agg-floor`` (the aggregate flow of ``actor_scaling_benchmark.py``: one message
sent to each of 1,000 actors in turn, then one reply received from each, repeated; counts
per message).

Run ``python benchmarks/trip_counts_benchmark.py [--tool strace|callgrind|both|cachesim]
[--trips N] [--only thread,thread-floor]``; ``alternate.py trip_counts --old CHECKOUT
--script-from .`` puts two checkouts side by side (the counts need no alternation, but
that gives one table).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, save_json
from _suite import summary_row

START = b"PDC-TRIPS-START\n"
END = b"PDC-TRIPS-END\n"

#: (workload, what it is, its floor's workload or None)
WORKLOADS: tuple[tuple[str, str, str | None], ...] = (
    ("thread", 'tier="thread" send_and_receive (timeout 10 s)', "thread-floor"),
    ("thread-floor", "asyncio + a thread answering by call_soon_threadsafe", None),
    ("thread-direct", "ThreadedRingKernel send + receive", None),
    ("thread-pipe", 'tier="thread" pipelined, per message', "thread-direct-pipe"),
    (
        "thread-pipe-req",
        'tier="thread" pipelined after send_and_receive requests, per message',
        "thread-direct-pipe",
    ),
    ("thread-direct-pipe", "ThreadedRingKernel pipelined, per message", None),
    ("tier1", "asyncio tier send + receive", "tier1-floor"),
    ("tier1-floor", "two asyncio.Queue, one echo task", None),
    ("tier1-pipe", "asyncio tier pipelined, per message", "tier1-pipe-floor"),
    ("tier1-pipe-floor", "two asyncio.Queue pipelined, per message", None),
    ("actors", "1,000 actors, a caller each, per round trip", "actors-floor"),
    ("actors-floor", "1,000 bare tasks on asyncio.Queue, a caller each", None),
    (
        "actors-agg",
        "1,000 actors, sent to in turn then received from, per message",
        "actors-agg-floor",
    ),
    ("actors-agg-floor", "1,000 bare tasks on asyncio.Queue, the same flow", None),
)
#: round trips a strace run makes (a quarter of that: callgrind's shorter run)
DEFAULT_TRIPS = 2000
#: how many round trips one "trip" of a workload makes (``actors``: one per actor)
ACTORS_PER_TRIP = {
    "actors": 1000,
    "actors-floor": 1000,
    "actors-agg": 1000,
    "actors-agg-floor": 1000,
}

# --- the workloads (the child runs ``workload.py NAME TRIPS``) -----------------------------

CHILD = r"""
import asyncio, os, queue, sys, threading

from pydotcompute import RingKernelRuntime, message

try:
    import uvloop
    new_loop = uvloop.new_event_loop
except ImportError:
    new_loop = asyncio.new_event_loop


@message
class Ping:
    value: int


@message
class Pong:
    value: int


def echo_sync(ctx):
    receive, send = ctx.receive, ctx.send
    while True:
        msg = receive()
        send(Pong(value=msg.value))


async def echo_async(ctx):
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Pong(value=msg.value))


def mark(what):
    os.write(2, what)


WARM = 300


async def thread_rt(n):
    async with RingKernelRuntime() as rt:
        await rt.launch("echo", echo_sync, input_type=Ping, output_type=Pong, tier="thread")
        await rt.activate("echo")
        for i in range(WARM + n):
            if i == WARM:
                mark(START)
            await rt.send_and_receive("echo", Ping(value=i), timeout=10.0)
        mark(END)


async def thread_floor(n):
    loop = asyncio.get_running_loop()
    q = queue.SimpleQueue()

    def server():
        call = loop.call_soon_threadsafe
        while (item := q.get()) is not None:
            fut, msg = item
            call(fut.set_result, Pong(value=msg.value))

    t = threading.Thread(target=server, daemon=True)
    t.start()
    for i in range(WARM + n):
        if i == WARM:
            mark(START)
        fut = loop.create_future()
        q.put((fut, Ping(value=i)))
        await fut
    mark(END)
    q.put(None)
    t.join()


def thread_direct(n):
    from pydotcompute.ring_kernels import ThreadedRingKernel

    with ThreadedRingKernel("echo", echo_sync) as k:
        for i in range(WARM + n):
            if i == WARM:
                mark(START)
            k.send(Ping(value=i))
            k.receive(timeout=10.0)
        mark(END)


async def thread_pipe(n, requests=0):
    async with RingKernelRuntime() as rt:
        await rt.launch("echo", echo_sync, input_type=Ping, output_type=Pong, tier="thread")
        await rt.activate("echo")
        for i in range(requests):  # a kernel that answered requests checks its replies
            await rt.send_and_receive("echo", Ping(value=i), timeout=10.0)

        async def producer(count):
            for i in range(count):
                await rt.send("echo", Ping(value=i))

        for count in (10 * WARM, n):
            if count == n:
                mark(START)
            p = asyncio.ensure_future(producer(count))
            for _ in range(count):
                await rt.receive("echo", timeout=30.0)
            await p
        mark(END)


async def thread_pipe_req(n):
    await thread_pipe(n, requests=WARM)


def thread_direct_pipe(n):
    from pydotcompute.ring_kernels import ThreadedRingKernel

    with ThreadedRingKernel("echo", echo_sync) as k:
        for count in (10 * WARM, n):
            if count == n:
                mark(START)
            t = threading.Thread(target=lambda: [k.send(Ping(value=i), timeout=30.0) for i in range(count)])
            t.start()
            for _ in range(count):
                k.receive(timeout=30.0)
            t.join()
        mark(END)


async def tier1(n):
    async with RingKernelRuntime() as rt:
        await rt.launch("echo", echo_async, input_type=Ping, output_type=Pong)
        await rt.activate("echo")
        send, receive = rt.send, rt.receive
        for i in range(WARM + n):
            if i == WARM:
                mark(START)
            await send("echo", Ping(value=i))
            await receive("echo")
        mark(END)


async def tier1_floor(n):
    q_in, q_out = asyncio.Queue(4096), asyncio.Queue(4096)

    async def server():
        while True:
            await q_out.put(await q_in.get())

    task = asyncio.ensure_future(server())
    for i in range(WARM + n):
        if i == WARM:
            mark(START)
        await q_in.put(("ping", i))
        await q_out.get()
    mark(END)
    task.cancel()


async def tier1_pipe(n):
    async with RingKernelRuntime() as rt:
        await rt.launch("echo", echo_async, input_type=Ping, output_type=Pong)
        await rt.activate("echo")

        async def producer(count):
            for i in range(count):
                await rt.send("echo", Ping(value=i))

        for count in (WARM, n):
            if count == n:
                mark(START)
            p = asyncio.ensure_future(producer(count))
            for _ in range(count):
                await rt.receive("echo")
            await p
        mark(END)


async def tier1_pipe_floor(n):
    q_in, q_out = asyncio.Queue(4096), asyncio.Queue(4096)

    async def server():
        while True:
            await q_out.put(await q_in.get())

    async def producer(count):
        for i in range(count):
            await q_in.put(("ping", i))

    task = asyncio.ensure_future(server())
    for count in (WARM, n):
        if count == n:
            mark(START)
        p = asyncio.ensure_future(producer(count))
        for _ in range(count):
            await q_out.get()
        await p
    mark(END)
    task.cancel()


ACTORS = 1000


async def echo_same(ctx):
    while not ctx.should_terminate:
        await ctx.send(await ctx.receive())


async def launch_echoes(rt):  # ACTORS echo actors, launched and active: their ids
    ids = [f"a{i}" for i in range(ACTORS)]
    for kid in ids:
        await rt.launch(kid, echo_same, input_type=Ping, queue_size=4096)
        await rt.activate(kid)
    return ids


async def echo_task(q_in, q_out):
    while True:
        await q_out.put(await q_in.get())


async def stop_tasks(tasks):
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def actors(n):
    async with RingKernelRuntime() as rt:
        ids = await launch_echoes(rt)

        async def caller(kid, count):
            send, receive = rt.send, rt.receive
            for i in range(count):
                await send(kid, Ping(value=i))
                await receive(kid)

        await asyncio.gather(*(caller(kid, 2) for kid in ids))
        mark(START)
        await asyncio.gather(*(caller(kid, n) for kid in ids))
        mark(END)


async def actors_floor(n):
    pairs = [(asyncio.Queue(4096), asyncio.Queue(4096)) for _ in range(ACTORS)]
    tasks = [asyncio.ensure_future(echo_task(a, b)) for a, b in pairs]

    async def caller(q_in, q_out, count):
        for i in range(count):
            await q_in.put(Ping(value=i))
            await q_out.get()

    await asyncio.gather(*(caller(a, b, 2) for a, b in pairs))
    mark(START)
    await asyncio.gather(*(caller(a, b, n) for a, b in pairs))
    mark(END)
    await stop_tasks(tasks)


async def actors_agg(n):
    async with RingKernelRuntime() as rt:
        ids = await launch_echoes(rt)
        send, receive = rt.send, rt.receive

        async def rounds(count):
            for _ in range(count):
                for kid in ids:
                    await send(kid, Ping(value=1))
                for kid in ids:
                    await receive(kid)

        await rounds(2)
        mark(START)
        await rounds(n)
        mark(END)


async def actors_agg_floor(n):
    inboxes = [asyncio.Queue(4096) for _ in range(ACTORS)]
    outboxes = [asyncio.Queue(4096) for _ in range(ACTORS)]
    tasks = [asyncio.ensure_future(echo_task(a, b)) for a, b in zip(inboxes, outboxes)]

    async def rounds(count):
        for _ in range(count):
            for q in inboxes:
                await q.put(Ping(value=1))
            for q in outboxes:
                await q.get()

    await rounds(2)
    mark(START)
    await rounds(n)
    mark(END)
    await stop_tasks(tasks)


WORKLOADS = {
    "thread": thread_rt,
    "thread-floor": thread_floor,
    "thread-direct": thread_direct,
    "thread-pipe": thread_pipe,
    "thread-pipe-req": thread_pipe_req,
    "thread-direct-pipe": thread_direct_pipe,
    "tier1": tier1,
    "tier1-floor": tier1_floor,
    "tier1-pipe": tier1_pipe,
    "tier1-pipe-floor": tier1_pipe_floor,
    "actors": actors,
    "actors-floor": actors_floor,
    "actors-agg": actors_agg,
    "actors-agg-floor": actors_agg_floor,
}
name, n = sys.argv[1], int(sys.argv[2])
fn = WORKLOADS[name]
if asyncio.iscoroutinefunction(fn):
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(fn(n))
else:
    fn(n)
"""


def _child_source() -> str:
    """The workloads' module, with the marks this script looks for."""
    return f"START, END = {START!r}, {END!r}\n" + CHILD


def _child_cmd(script: Path, name: str, trips: int) -> list[str]:
    return [sys.executable, str(script), name, str(trips)]


def _env() -> dict[str, str]:
    """The child's environment: the checkout under test first on the path (``PYTHONPATH``
    when given, as ``alternate.py`` does, else this script's checkout), fixed hashing, and
    one BLAS thread (numpy's pool spins under valgrind and would count as ours)."""
    path = os.environ.get("PYTHONPATH") or str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}


def count_strace(script: Path, name: str, trips: int) -> dict[str, float]:
    """System calls a trip between the marks: ``name`` for all threads, ``T<i> name`` by
    thread (T0: the thread that wrote the start mark), and ``sleeps`` / ``T<i> sleeps``:
    futex waits that returned 0, that is a thread that went to sleep and was woken (on a
    queue's lock, or on the GIL it woke up to find held), each one wake-up."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "trace"
        subprocess.run(
            ["strace", "-f", "-qq", "-o", str(log), *_child_cmd(script, name, trips)],
            env=_env(),
            check=True,
            capture_output=True,
        )
        lines = log.read_text(errors="replace").splitlines()
    counts: collections.Counter[str] = collections.Counter()
    tids: dict[str, str] = {}
    pending: dict[str, bool] = {}  # tid -> its unfinished call is a futex wait
    on = False
    call_at = re.compile(r"(\d+)\s+(\w+)\(")
    resumed = re.compile(r"(\d+)\s+<\.\.\. (\w+) resumed>.*= (-?\d+)")
    for line in lines:
        if 'write(2, "PDC-TRIPS-START' in line:  # (not the read of the script's source)
            on = True
            tids.setdefault(line.split()[0], "T0")
            continue
        if 'write(2, "PDC-TRIPS-END' in line:
            break
        if not on:
            continue
        m = resumed.match(line)
        if m is not None:
            tid, call, result = m.groups()
            if pending.pop(tid, False) and result == "0":
                who = tids.setdefault(tid, f"T{len(tids)}")
                counts["sleeps"] += 1
                counts[f"{who} sleeps"] += 1
            continue
        m = call_at.match(line)
        if m is None:
            continue
        tid, call = m.groups()
        who = tids.setdefault(tid, f"T{len(tids)}")
        counts[call] += 1
        counts[f"{who} {call}"] += 1
        waits = call == "futex" and "_WAIT" in line
        if line.rstrip().endswith("<unfinished ...>"):
            pending[tid] = waits
        elif waits and line.rstrip().endswith("= 0"):
            counts["sleeps"] += 1
            counts[f"{who} sleeps"] += 1
    return {k: v / trips for k, v in sorted(counts.items())}


def count_callgrind(script: Path, name: str, trips: int) -> float:
    """Instructions a trip: two runs, ``trips`` and ``3 * trips``, differenced."""

    def run(n: int) -> int:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "callgrind.out"
            proc = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={out}",
                    *_child_cmd(script, name, n),
                ],
                env=_env(),
                capture_output=True,
                text=True,
            )
        found = re.findall(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or not found:
            raise SystemExit(f"callgrind run of {name} failed:\n{proc.stderr[-2000:]}")
        return int(found[-1])

    per = ACTORS_PER_TRIP.get(name, 1)
    return (run(3 * trips) - run(trips)) / (2 * trips * per)


def cache_shapes() -> tuple[list[str], str]:
    """Cachegrind's ``--D1`` and ``--LL`` for this machine (the first-level data cache and
    the per-core L2, from sysfs) and a line saying what they are; no options (cachegrind's
    own guess) where sysfs does not tell or a shape is one cachegrind refuses (a set
    count that is not a power of two)."""
    found: dict[str, tuple[int, int, int]] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
            ways = int((index / "ways_of_associativity").read_text())
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1:], 1)
        nbytes = int(size.rstrip("KM")) * scale
        sets = nbytes // max(ways * line, 1)
        if sets < 1 or sets & (sets - 1):
            continue
        if level == "1" and kind == "Data":
            found["D1"] = (nbytes, ways, line)
        elif level == "2" and kind == "Unified":
            found["LL"] = (nbytes, ways, line)
    if len(found) < 2:
        return [], "cachegrind's default cache shapes (sysfs did not give both)"
    opts = [f"--{k}={n},{w},{ln}" for k, (n, w, ln) in found.items()]
    return opts, "D1 {0[0]} B {0[1]}-way, LL (the L2) {1[0]} B {1[1]}-way".format(
        found["D1"], found["LL"]
    )


def count_cachesim(script: Path, name: str, trips: int, opts: list[str]) -> dict[str, float]:
    """Instructions, data reads + writes, first-level and last-level data misses a trip
    (cachegrind with ``opts``, from `cache_shapes`): two runs, ``trips`` and ``3 * trips``,
    differenced."""
    keys = {
        r"I\s+refs": "instructions",
        r"D\s+refs": "data refs",
        r"D1\s+misses": "D1 misses",
        r"LLd\s+misses": "LL misses",
    }

    def run(n: int) -> dict[str, int]:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [
                    "valgrind",
                    "--tool=cachegrind",
                    "--cache-sim=yes",
                    *opts,
                    f"--cachegrind-out-file={Path(tmp) / 'cachegrind.out'}",
                    *_child_cmd(script, name, n),
                ],
                env=_env(),
                capture_output=True,
                text=True,
            )
        got = {}
        for label, key in keys.items():
            m = re.findall(rf"{label}:\s+([\d,]+)", proc.stderr)
            if m:
                got[key] = int(m[-1].replace(",", ""))
        if proc.returncode != 0 or len(got) != len(keys):
            raise SystemExit(f"cachegrind run of {name} failed:\n{proc.stderr[-2000:]}")
        return got

    per = ACTORS_PER_TRIP.get(name, 1)
    a, b = run(trips), run(3 * trips)
    return {k: (b[k] - a[k]) / (2 * trips * per) for k in a}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tool", choices=("strace", "callgrind", "both", "cachesim"), default="both")
    ap.add_argument("--trips", type=int, default=None, help=f"default {DEFAULT_TRIPS}")
    ap.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer trips")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = [w for w, _, _ in WORKLOADS]
    if args.only:
        names = [n for n in args.only.split(",") if n]
        unknown = set(names) - {w for w, _, _ in WORKLOADS}
        if unknown:
            raise SystemExit(
                f"unknown workload(s) {sorted(unknown)}; known: {[w for w, _, _ in WORKLOADS]}"
            )
    wanted = ("strace", "callgrind") if args.tool == "both" else (args.tool,)
    program = {"strace": "strace", "callgrind": "valgrind", "cachesim": "valgrind"}
    tools = tuple(t for t in wanted if shutil.which(program[t]))
    for t in wanted:
        if t not in tools:
            print(f"{program[t]} not found: no {t} counts", flush=True)
    shape_opts, shapes = cache_shapes() if "cachesim" in tools else ([], "")
    if shapes:
        print(f"cache simulation: {shapes}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "workload.py"
        script.write_text(_child_source())
        for name in names if tools else []:
            per = ACTORS_PER_TRIP.get(name, 1)
            trips = args.trips or (DEFAULT_TRIPS // per or 20)
            if args.quick:
                trips = max(trips // 4, 5)
            r: dict[str, Any] = {}
            if "strace" in tools:
                counted = count_strace(script, name, trips)
                r["syscalls"] = {k: v / per for k, v in counted.items()}
            if "callgrind" in tools:
                r["instructions"] = count_callgrind(script, name, max(trips // 4, 5))
            if "cachesim" in tools:
                r["cache"] = count_cachesim(script, name, max(trips // 4, 5), shape_opts)
            results[name] = r
            if "cache" in r:
                print(f"{name}: { ({k: round(v, 1) for k, v in r['cache'].items()}) }", flush=True)
            print(
                f"{name}: {r.get('instructions', '-')} instructions, "
                f"{ {k: round(v, 2) for k, v in r.get('syscalls', {}).items() if ' ' not in k} }",
                flush=True,
            )
    rows = []
    for name, what, _ in WORKLOADS:
        if name not in results:
            continue
        r = results[name]
        sc = r.get("syscalls", {})
        rows.append(
            {
                "workload": name,
                "what": what,
                "instructions": r.get("instructions"),
                "futex": sc.get("futex"),
                "epoll_pwait": sc.get("epoll_pwait"),
                "getpid": sc.get("getpid"),
                "futex sleeps": sc.get("sleeps", 0.0) if sc else None,
            }
        )
    if rows and {"strace", "callgrind"} & set(tools):
        print_table(
            "Per round trip (per message for -pipe): instructions (callgrind), system calls "
            "(strace), and futex waits that slept (each a wake-up)",
            rows,
            ["workload", "instructions", "futex", "futex sleeps", "epoll_pwait", "getpid", "what"],
        )
    cached = [(name, what) for name, what, _ in WORKLOADS if "cache" in results.get(name, {})]
    if cached:
        print_table(
            f"Per trip, simulated caches ({shapes}): a miss is a line the trip "
            "touches that was pushed out since",
            [{"workload": name, **results[name]["cache"], "what": what} for name, what in cached],
            ["workload", "instructions", "data refs", "D1 misses", "LL misses", "what"],
        )
    summary = []
    for name, what, floor in WORKLOADS:
        res = results.get(name)
        if res is None:
            continue
        f = results.get(floor) if floor else None
        for key in ("D1 misses", "LL misses") if "cache" in res else ():
            summary.append(
                summary_row(
                    f"{name}: {key} a trip (simulated)",
                    res["cache"][key],
                    "misses",
                    higher_is_better=False,
                    baseline=f["cache"][key] if f and "cache" in f else None,
                    baseline_name=floor,
                    note=f"{what}; {shapes}",
                )
            )
        if "instructions" in res:
            summary.append(
                summary_row(
                    f"{name}: instructions a trip",
                    res["instructions"],
                    "instr",
                    higher_is_better=False,
                    baseline=f.get("instructions") if f else None,
                    baseline_name=floor,
                    note=what,
                )
            )
        for call in ("futex", "sleeps", "epoll_pwait", "getpid"):
            if "syscalls" in res:
                summary.append(
                    summary_row(
                        f"{name}: {call} a trip",
                        res["syscalls"].get(call, 0.0),
                        "calls",
                        higher_is_better=False,
                        baseline=(f["syscalls"].get(call, 0.0) if f and "syscalls" in f else None)
                        or None,
                        baseline_name=floor,
                        note=what,
                    )
                )
    if not tools:
        summary.append(
            summary_row(
                "thread: instructions a trip",
                None,
                "instr",
                higher_is_better=False,
                note="neither strace nor valgrind is installed here",
            )
        )
    out = {"tools": tools, "results": results, "summary": summary}
    save_json("trip_counts", out, args.json)
    return out


if __name__ == "__main__":
    main()
