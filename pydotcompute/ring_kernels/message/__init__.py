"""Typed messages: `@message`, the MessagePack wire format and fixed-layout records.

Messages are `msgspec.Struct` subclasses of `RingKernelMessage`; msgspec's typed encoder
and decoder are the codec. The package is split by job:

- `ids`: unique message ids without a system call per message;
- `base`: `RingKernelMessage` and `ArrayMessage`: header fields, ids, correlation;
- `decorate`: `@message` and `@array_message`;
- `codec`: the wire format, the registry of message classes, stream decoders;
- `arrays`: NumPy arrays in messages, and arrays passed by reference;
- `layout`: fixed-layout messages and their NumPy structured `dtype` (GPU rings);
- `declared`, `identity`: one class per tag (the classes live kernels declare);
- `fields`: field values checked where a message enters a kernel.

Every name importable from `pydotcompute.ring_kernels.message` before the split still is.
"""

from __future__ import annotations

from .arrays import (
    BufferHandle,
    BufferRegistry,
    get_buffer,
    get_buffer_registry,
    register_buffer,
    release_buffer,
)
from .base import (
    ArrayMessage,
    RingKernelMessage,
    claim_request_key,
    id_key,
    raw_correlation_get,
    raw_correlation_set,
    reply_key,
    request_key,
    serialize_message,
    stamp_reply,
)
from .codec import (
    HEADER_NAMES,
    FrameHeader,
    codec_of,
    decode_error,
    deserialize_message,
    frame_header,
    frame_priority,
    get_message_type,
    holds_its_tag,
    message_decoder,
    message_field_names,
    message_tag,
    register_message_type,
    registered_message_types,
    release_frame,
)
from .declared import declared_by
from .decorate import array_message, message
from .fields import check_fields, field_problem, fields_check, fields_ok
from .identity import (
    check_declared_types,
    class_names,
    expecting,
    mismatch_text,
    redefinition_note,
)
from .ids import in_request_space, new_message_id, next_request_id, request_space
from .layout import (
    HEADER_FIELD_NAMES,
    field_layout,
    fixed_layout_dtype,
    is_fixed_layout,
)

__all__ = (
    "HEADER_FIELD_NAMES",
    "HEADER_NAMES",
    "ArrayMessage",
    "BufferHandle",
    "BufferRegistry",
    "FrameHeader",
    "RingKernelMessage",
    "array_message",
    "check_declared_types",
    "check_fields",
    "claim_request_key",
    "class_names",
    "codec_of",
    "declared_by",
    "decode_error",
    "deserialize_message",
    "expecting",
    "field_layout",
    "field_problem",
    "fields_check",
    "fields_ok",
    "fixed_layout_dtype",
    "frame_header",
    "frame_priority",
    "get_buffer",
    "get_buffer_registry",
    "get_message_type",
    "holds_its_tag",
    "id_key",
    "in_request_space",
    "is_fixed_layout",
    "message",
    "message_decoder",
    "message_field_names",
    "message_tag",
    "mismatch_text",
    "new_message_id",
    "next_request_id",
    "raw_correlation_get",
    "raw_correlation_set",
    "redefinition_note",
    "register_buffer",
    "register_message_type",
    "registered_message_types",
    "release_buffer",
    "release_frame",
    "reply_key",
    "request_key",
    "request_space",
    "serialize_message",
    "stamp_reply",
)

# Names code written before the split imported from here; kept as aliases of the public
# names above. New code uses the public ones.
_registry = get_buffer_registry()
_raw_cid_slot_get = raw_correlation_get
_HEADER_NAMES = HEADER_FIELD_NAMES
_field_layout = field_layout
_finalize = register_message_type
