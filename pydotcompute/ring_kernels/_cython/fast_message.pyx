# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled fast paths for messages: the priority check, message ids, `serialize` and
stamping a reply with its request.

Design notes:
- Each function here has a Python twin in `pydotcompute.ring_kernels.message` with the same
  results and errors, used when this extension is not built. Only the common case runs in
  C: anything unusual (a nested message, a correlation value that is neither an id nor a
  message, a value the encoder refuses) is handed to the Python twin, so the rules live in
  one place. A reply whose correlation slot holds its request gets the request's id in C.
- The three header fields are slots of `RingKernelMessage` itself, so they sit at the same
  offset in every subclass. `bind` reads the offsets from their member descriptors once;
  afterwards a header slot is read with one load instead of an attribute lookup. Every
  entry point checks that it was handed a message before touching a slot.
"""

cimport cython
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject, PyObject_TypeCheck, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport uint64_t


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset

    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member


cdef enum:
    _T_OBJECT = 6
    _T_OBJECT_EX = 16

# the id source: a random 128-bit base (hi, lo) XOR a counter in the low bits
cdef uint64_t _hi = 0
cdef uint64_t _lo = 0
cdef uint64_t _count = 0

cdef Py_ssize_t _mid_off = -1
cdef Py_ssize_t _prio_off = -1
cdef Py_ssize_t _cid_off = -1
cdef PyTypeObject *_base = NULL
cdef object _base_ref = None
cdef object _bad_priority = None
cdef object _slow_serialize = None
cdef object _uuid_type = None
cdef dict _encoders = {}


cdef Py_ssize_t _offset_of(object descr, object base) except -1:
    if type(descr).__name__ != "member_descriptor" or descr.__objclass__ is not base:
        raise TypeError(f"expected a slot of {base.__name__}, got {descr!r}")
    cdef PyMemberDef *member = (<PyMemberDescrObject *>descr).d_member
    if member.type != _T_OBJECT and member.type != _T_OBJECT_EX:
        raise TypeError(f"slot {descr!r} does not hold an object")
    return member.offset


def bind(
    base,
    mid_slot,
    priority_slot,
    cid_slot,
    bad_priority,
    slow_serialize,
    uuid_type,
    dict encoders,
):
    """Hand this module the message base class, its header slots and the Python pieces.

    ``encoders`` maps a message class to the encode function `serialize` may call directly
    (classes with nested messages are left out: their ids are made in Python first).
    """
    global _mid_off, _prio_off, _cid_off, _base, _base_ref, _bad_priority
    global _slow_serialize, _uuid_type, _encoders
    if not isinstance(base, type):
        raise TypeError("base must be a class")
    _mid_off = _offset_of(mid_slot, base)
    _prio_off = _offset_of(priority_slot, base)
    _cid_off = _offset_of(cid_slot, base)
    _base_ref = base
    _base = <PyTypeObject *>base
    _bad_priority = bad_priority
    _slow_serialize = slow_serialize
    _uuid_type = uuid_type
    _encoders = encoders


cdef inline PyObject *_slot(object obj, Py_ssize_t offset):
    return (<PyObject **>((<char *><PyObject *>obj) + offset))[0]


cdef inline void _set_slot(object obj, Py_ssize_t offset, object value):
    cdef PyObject **where = <PyObject **>((<char *><PyObject *>obj) + offset)
    cdef PyObject *old = where[0]
    Py_INCREF(value)
    where[0] = <PyObject *>value
    Py_XDECREF(old)


def reseed(uint64_t hi, uint64_t lo):
    """Start a new id sequence from the base ``(hi << 64) | lo`` (the counter restarts)."""
    global _hi, _lo, _count
    _hi = hi
    _lo = lo
    _count = 0


cdef inline bytes _new_id():
    global _count
    cdef unsigned char buf[16]
    cdef uint64_t lo
    cdef int i
    _count += 1
    lo = _lo ^ _count
    for i in range(8):
        buf[i] = <unsigned char>(_hi >> (56 - 8 * i))
        buf[8 + i] = <unsigned char>(lo >> (56 - 8 * i))
    return PyBytes_FromStringAndSize(<char *>buf, 16)


def next_id_bytes():
    """A fresh message id as the 16 big-endian bytes the wire carries."""
    return _new_id()


def check_priority(self):
    """Raise ``ValueError`` unless the message's priority is an int in 0..255.

    Installed as the messages' ``__post_init__``: msgspec calls it after building or
    decoding a message.
    """
    if _base == NULL or not PyObject_TypeCheck(self, _base):
        raise TypeError(f"expected a message, got {type(self).__name__}")
    cdef PyObject *p = _slot(self, _prio_off)
    if p == NULL:
        raise AttributeError("priority")
    cdef object value = <object>p
    if type(value) is int and 0 <= value <= 255:
        return
    raise _bad_priority(value)


def stamp_reply(msg, current):
    """Correlate the reply ``msg`` to ``current``, the request being handled, unless it has
    a ``correlation_id`` already (or ``current`` is None, or ``msg`` is not a message)."""
    if current is None or _base == NULL or not PyObject_TypeCheck(msg, _base):
        return
    cdef PyObject *cid = _slot(msg, _cid_off)
    if cid == NULL or <object>cid is None:
        _set_slot(msg, _cid_off, current)


def serialize(self):
    """Encode this message as MessagePack bytes: `[type_tag, *fields, *header]`."""
    if _base == NULL or not PyObject_TypeCheck(self, _base):
        return _slow_serialize(self)
    cdef PyObject *mid = _slot(self, _mid_off)
    cdef PyObject *cid = _slot(self, _cid_off)
    if mid == NULL or cid == NULL:
        return _slow_serialize(self)
    cdef object c = <object>cid
    cdef PyObject *rid
    cdef PyObject *encode = PyDict_GetItem(_encoders, type(self))
    if encode == NULL:
        return _slow_serialize(self)
    if c is not None and type(c) is not bytes and type(c) is not _uuid_type:
        if not PyObject_TypeCheck(c, _base):
            return _slow_serialize(self)  # a value the Python code refuses, with its error
        # the request this reply answers (stamped by a runtime): its id, made if need be
        rid = _slot(c, _mid_off)
        if rid == NULL:
            return _slow_serialize(self)
        if <object>rid is None:
            _set_slot(c, _mid_off, _new_id())
            rid = _slot(c, _mid_off)
        _set_slot(self, _cid_off, <object>rid)
    if <object>mid is None:
        _set_slot(self, _mid_off, _new_id())
    try:
        return (<object>encode)(self)
    except Exception:
        return _slow_serialize(self)  # raises the error that names the field


# --- stream decoding -------------------------------------------------------------------------

cdef Py_ssize_t _registry_version = 0


def registry_changed():
    """The message registry changed (a class was registered): every `StreamDecoder`
    looks its cached class up again before trusting it."""
    global _registry_version
    _registry_version += 1


@cython.final
cdef class StreamDecoder:
    """Decodes one stream of frames (a queue's, a process ring's): `codec.message_decoder`.

    The class of the previous frame is tried first: its typed decoder checks the tag
    itself, so a stream of one class decodes in one msgspec call. Anything it does not
    accept goes through ``general`` (`deserialize_message`), so results and errors are
    the same. ``fast_of(cls)`` gives a class's typed decode function, or None for a class
    that must always take the general path.
    """

    cdef object _fast
    cdef object _last
    cdef Py_ssize_t _seen
    cdef object _general
    cdef object _fast_of

    def __init__(self, general, fast_of):
        self._general = general
        self._fast_of = fast_of
        self._fast = None
        self._last = None
        self._seen = -1

    @cython.always_allow_keywords(False)
    def decode(self, data):
        """The message in the frame ``data`` (raises `MessageDeserializationError`)."""
        if self._fast is not None and self._seen == _registry_version:
            try:
                return self._fast(data)
            except Exception:  # another class, or bad bytes: the general path says which
                pass
        msg = self._general(data)
        t = type(msg)
        if t is not self._last or self._seen != _registry_version:
            self._seen = _registry_version
            self._last = t
            self._fast = self._fast_of(t)
        return msg
