"""The process tier's child side and wire, by their old path; they live in
`tiers.process.child`, `tiers.process.framing` and `tiers.process.waiting`."""

from __future__ import annotations

from .tiers.process.child import ChildSpec as ChildSpec
from .tiers.process.child import ProcessKernelContext as CythonKernelContext
from .tiers.process.child import child_main as child_main
from .tiers.process.framing import ERROR_FRAME as ERROR_FRAME
from .tiers.process.framing import FRAME_TAG as FRAME_TAG
from .tiers.process.framing import STATUS_MAX_BYTES as STATUS_MAX_BYTES
from .tiers.process.framing import decode_value as decode_value
from .tiers.process.framing import encode_value as encode_value
from .tiers.process.framing import encoder_for as encoder_for
from .tiers.process.framing import exception_data as exception_data
from .tiers.process.framing import pack_report as pack_report
from .tiers.process.framing import reply_correlation as reply_correlation
from .tiers.process.framing import unpack_report as unpack_report
from .tiers.process.waiting import PROBE_EVERY as PROBE_EVERY
from .tiers.process.waiting import SLICE_S as SLICE_S
from .tiers.process.waiting import Waiter as Waiter
from .tiers.process.waiting import drain_bell as drain_bell
from .tiers.process.waiting import read_parked as read_parked
from .tiers.process.waiting import read_wait as read_wait
from .tiers.process.waiting import ring_bell as ring_bell
from .tiers.process.waiting import write_wait as write_wait

__all__ = (
    "ChildSpec",
    "CythonKernelContext",
    "Waiter",
    "child_main",
    "drain_bell",
    "read_parked",
    "read_wait",
    "reply_correlation",
    "ring_bell",
    "write_wait",
)
