"""The shared memory layout of a GPU ring kernel: control block words and commands.

The control block is one ``int64`` array in mapped (zero-copy) pinned host memory. Words
written by the host and words written by the device sit on different 64-byte lines, so a
host store and a device store never share a cache line (no false sharing across PCIe).
Both the Numba kernel (``device.py``) and the CUDA C kernel (``cuda_c.py``) use these
indices; changing one means changing both.
"""

from __future__ import annotations

__all__ = (
    "ACTIVE",
    "ACTIVE_ACK",
    "BATCH",
    "CMD_EXIT",
    "CMD_IDLE",
    "CMD_PROCESS",
    "CMD_PROCESS_DROP",
    "CMD_STALL",
    "CTL_WORDS",
    "DOORBELL",
    "DOORBELL_ACTIVE",
    "DOORBELL_SHIFT",
    "DOORBELL_TERMINATE",
    "DROPPED",
    "EDGE_IN_BASE",
    "EDGE_IN_CAP",
    "EDGE_IN_HDR",
    "EDGE_OUT_BASE",
    "EDGE_OUT_CAP",
    "EDGE_OUT_HDR",
    "EDGE_REJECTED",
    "EDGE_ROUTE",
    "EDGE_ROUTE_ACK",
    "EDGE_ROUTE_IN",
    "EDGE_ROUTE_OUT",
    "EDGE_WORDS",
    "EH_CLOSED",
    "EH_FULL",
    "EH_HANDED",
    "EH_HEAD",
    "EH_TAIL",
    "ERRORS",
    "HEARTBEAT",
    "IN_HEAD",
    "IN_TAIL",
    "LAST_LATENCY",
    "LAST_STATUS",
    "MAX_BACKOFF_NS",
    "MAX_LATENCY",
    "MIN_LATENCY",
    "OUTBOX_FULL",
    "OUTBOX_POLICY",
    "OUT_HEAD",
    "OUT_TAIL",
    "PROCESSED",
    "SPIN_ITERATIONS",
    "STARTED",
    "TAIL_SEEN",
    "TERMINATE",
    "TERMINATED",
    "TOTAL_LATENCY",
    "constants",
)

# -- written by the host ----------------------------------------------------------------------
IN_TAIL = 0  # messages published into the inbox ring (monotonic)
# What the kernel polls: IN_TAIL << DOORBELL_SHIFT | TERMINATE bit | ACTIVE bit, stored by the
# host (one writer: the event loop) after the words it summarizes, so one system-scope load
# per poll brings all three. The separate words stay for readers (telemetry, the watchdog).
DOORBELL = 1
DOORBELL_ACTIVE = 1
DOORBELL_TERMINATE = 2
DOORBELL_SHIFT = 2
# Device edges (``edge.py``): which edges the kernel writes into / reads from. The kernel
# reads EDGE_ROUTE (acquire) between batches and every 16th idle poll, then the parameters
# of a route that turned on, and acknowledges in EDGE_ROUTE_ACK.
EDGE_ROUTE = 2  # bit EDGE_ROUTE_OUT: replies go into an edge; bit EDGE_ROUTE_IN: read one
EDGE_ROUTE_OUT = 1
EDGE_ROUTE_IN = 2
EDGE_OUT_BASE = 3  # byte offset of the out-edge's slots in the edge arena
EDGE_OUT_CAP = 4  # its slot count
EDGE_OUT_HDR = 5  # index of its header words in the edge header array
EDGE_IN_BASE = 6
EDGE_IN_CAP = 7
OUT_HEAD = 8  # replies consumed from the outbox ring (monotonic)
EDGE_IN_HDR = 9
ACTIVE = 16  # 1 = process messages, 0 = hold them (deactivated)
TERMINATE = 17  # 1 = leave the loop at the next iteration
OUTBOX_POLICY = 18  # 0 = stall while the outbox is full, 1 = run the handler, drop the reply
MAX_BACKOFF_NS = 19  # ceiling of the idle back-off sleep

# -- written by the device --------------------------------------------------------------------
IN_HEAD = 24  # messages taken from the inbox ring (monotonic)
OUT_TAIL = 32  # replies published into the outbox ring (monotonic)
STARTED = 40  # 1 once the kernel runs
TERMINATED = 41  # 1 when the kernel left its loop (the acknowledgement of TERMINATE)
ACTIVE_ACK = 42  # the last ACTIVE value the kernel acted on
HEARTBEAT = 43  # advances while the kernel idles or stalls (the watchdog reads it)
# The inbox tail the kernel last read from the doorbell, stored just before each heartbeat:
# a heartbeat proves the kernel alive, this that it sees what the host published.
TAIL_SEEN = 44
EDGE_ROUTE_ACK = 45  # the last EDGE_ROUTE value the kernel acted on
# messages the handler rejected while the kernel wrote into an out-edge (no reply reached
# the host, so the host counts these drops from here; ERRORS counts every rejection)
EDGE_REJECTED = 47
PROCESSED = 48  # messages handled (replied, rejected or reply dropped)
DROPPED = 49  # replies discarded because the outbox was full (policy 1)
ERRORS = 50  # messages the handler rejected (non-zero status)
LAST_LATENCY = 51  # ns spent on the last message
TOTAL_LATENCY = 52
MAX_LATENCY = 53
MIN_LATENCY = 54
LAST_STATUS = 55  # the last non-zero status a handler returned
OUTBOX_FULL = 56  # times the kernel found the outbox full (stall or drop episodes)

CTL_WORDS = 64

# -- one device edge's header (int64 words in mapped memory, ``edge.py``) ----------------------
EH_TAIL = 0  # records the producing kernel published (release store): ``accepted``
EH_FULL = 1  # times the producing kernel found the edge full (backpressure episodes)
EH_HEAD = 8  # records the consuming kernel took (release store): ``taken``
EH_HANDED = 16  # records the host read back and handed back after the consumer stopped
EH_CLOSED = 17  # 1 once the host closed the edge (no kernel writes or reads it any more)
EDGE_WORDS = 24  # three 64-byte lines: producer, consumer, host

# -- what thread 0 tells the block each iteration ---------------------------------------------
CMD_IDLE = 0
CMD_PROCESS = 1
CMD_PROCESS_DROP = 2
CMD_STALL = 3
CMD_EXIT = 4

#: Idle iterations spent polling without sleeping before the back-off starts.
SPIN_ITERATIONS = 64

#: Most messages handled between two publications (one release store per batch).
BATCH = 64


def constants() -> dict[str, int]:
    """Every layout constant by name (used to emit the CUDA C ``#define``s)."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, int)}
