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
- A small frame is encoded into one reused buffer and copied out: msgspec's own output
  starts at 32 bytes and reallocates for any frame past that (about 25 ns a message). A
  frame over 1 KiB sends its class back to msgspec's own output (one copy less); a busy
  buffer (an encode hook serializing a message, another thread) is never shared.
- The hot calls test for an error themselves instead of in a ``try``: a Cython ``try``
  saves and restores the exception state on every pass (about 10 ns).
- `serialize` and `deserialize` keep the entry of the class they saw last and compare
  its class by pointer before looking in their dicts: a run of one class (the common
  case) costs no hashing. The entry is one object, so it is replaced in one store.
- `deserialize` tries the class's own typed decoder (it checks the tag itself): no tag is
  read and no registry lookup is made. Whatever it refuses (another class's frame, bad
  bytes) is handed to the Python twin, whose general path says what is wrong.
- `decode_frame` (`deserialize_message`) reads the tag's bytes in place and finds its class
  in a small table filled as tags are met (no string is made, no registry lookup). The
  table is a cache, not the registry: the typed decoder it picks checks the tag again, so
  an entry that is stale or shares a slot can only send a frame to the Python path.
- `fields_ok` (`message.fields.fields_ok`) checks, for a class whose fields are all
  scalars (`add_field_shape`), the exact class of each field's value by pointer, read from
  its slot; any other class goes to the Python twin, which has the rules. A False here
  only sends the caller to the Python verdict (`field_problem`), as the twin's does.
"""

cimport cython
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject, PyObject_TypeCheck, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from libc.stdint cimport uint64_t
from libc.string cimport memcmp


cdef extern from "Python.h":
    # declared returning a bare pointer: Cython adds no error check, the caller does
    PyObject *PyObject_CallOneArg(object callable, object arg)
    PyObject *PyObject_Vectorcall(object callable, PyObject **args, size_t nargsf, PyObject *kw)
    long PyLong_AsLongAndOverflow(object obj, int *overflow) except? -1
    # declared without an error check: the caller clears the error itself
    int PyObject_GetBuffer(object obj, Py_buffer *view, int flags)
    void PyBuffer_Release(Py_buffer *view)
    PyObject *PyList_GET_ITEM(object lst, Py_ssize_t i)
    char *PyBytes_AS_STRING(object b)
    Py_ssize_t PyBytes_GET_SIZE(object b)
    enum:
        PyBUF_SIMPLE
    object PyMethod_New(object func, object self)
    int PyErr_ExceptionMatches(object exc)
    int PyObject_IS_GC(PyObject *obj)
    int PyType_IsSubtype(PyTypeObject *a, PyTypeObject *b)  # its class has Py_TPFLAGS_HAVE_GC (may be tracked)
    void PyErr_Clear()

    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset

    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member


cdef extern from "Python.h":
    ctypedef PyObject *(*PyCFunction)(PyObject *, PyObject *)

    ctypedef struct PyMethodDef:
        const char *ml_name
        PyCFunction ml_meth
        int ml_flags
        const char *ml_doc

    object PyCFunction_NewEx(PyMethodDef *ml, object self, object module)

    enum:
        METH_O


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
    global _slow_serialize, _uuid_type, _encoders, _checked_type
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
    _checked_type = None
    _forget()


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


cdef object _checked_type = None  # a subclass of the message base (see check_priority)


@cython.always_allow_keywords(False)
def check_priority(self):
    """Raise ``ValueError`` unless the message's priority is an int in 0..255.

    Installed as the messages' ``__post_init__``: msgspec calls it after building or
    decoding a message.
    """
    global _checked_type
    cdef object t = type(self)
    if t is not _checked_type:  # the class of the last call's message was checked then
        if _base == NULL or not PyObject_TypeCheck(self, _base):
            raise TypeError(f"expected a message, got {type(self).__name__}")
        _checked_type = t
    cdef PyObject *p = _slot(self, _prio_off)
    if p == NULL:
        raise AttributeError("priority")
    cdef object value = <object>p
    cdef int overflow = 0
    cdef long v
    if type(value) is int:
        v = PyLong_AsLongAndOverflow(value, &overflow)
        if overflow == 0 and 0 <= v <= 255:
            return
    raise _bad_priority(value)


cdef int _CHAIN_LIMIT = 64  # `message.base.CHAIN_LIMIT`


cdef object _correlation_to(object request, object reply):
    """`message.base.correlation_to`: ``request`` where holding it can close no loop, else
    its id."""
    if not PyObject_TypeCheck(request, _base):
        return request
    cdef PyObject *cur = <PyObject *>request
    cdef int i
    for i in range(_CHAIN_LIMIT):
        if cur == <PyObject *>reply or PyObject_IS_GC(cur):
            break
        cur = _slot(<object>cur, _cid_off)
        if cur == NULL or not PyObject_TypeCheck(<object>cur, _base):
            return request
    cdef PyObject *mid = _id_of(request)
    return request if mid == NULL else <object>mid


cdef PyObject *_id_of(object msg):
    """The id slot of the message ``msg``, its id made now if it had none (NULL: the slot
    was never set, an instance made without ``__init__``)."""
    cdef PyObject *mid = _slot(msg, _mid_off)
    if mid != NULL and <object>mid is None:
        _set_slot(msg, _mid_off, _new_id())
        mid = _slot(msg, _mid_off)
    return mid


def stamp_reply(msg, current):
    """Correlate the reply ``msg`` to ``current``, the request being handled, unless it has
    a ``correlation_id`` already (or ``current`` is None, or ``msg`` is not a message).

    The slot holds ``current`` itself, or its id where that would close a loop (see
    `message.base.correlation_to`)."""
    if current is None or _base == NULL or not PyObject_TypeCheck(msg, _base):
        return
    cdef PyObject *cid = _slot(msg, _cid_off)
    if cid == NULL or <object>cid is None:
        _set_slot(msg, _cid_off, _correlation_to(current, msg))


cdef object _reply_key_slow = None  # `message.base.reply_key`'s Python body


def bind_reply_key(slow):
    """Hand this module the Python `reply_key` the unusual cases go to."""
    global _reply_key_slow
    _reply_key_slow = slow


@cython.always_allow_keywords(False)
def reply_key(reply):
    """`message.base.reply_key`, compiled for a message's common cases: its correlation
    slot empty (None), bytes, or the request itself (that request's id bytes, or None
    while its id was never made). Anything else goes to the Python function."""
    cdef PyObject *cid
    cdef PyObject *mid
    if _base != NULL and PyObject_TypeCheck(reply, _base):
        cid = _slot(reply, _cid_off)
        if cid == NULL or <object>cid is None:
            return None
        if type(<object>cid) is bytes:
            return <object>cid
        if PyObject_TypeCheck(<object>cid, _base):
            mid = _slot(<object>cid, _mid_off)
            if mid == NULL or <object>mid is None:
                return None
            if type(<object>mid) is bytes:
                return <object>mid
    return _reply_key_slow(reply)


cdef int _propagate() except -1:
    """Hand on the error that is already set (a failed call whose error is not caught)."""
    return -1


cdef inline object _steal(PyObject *result):
    """The object a C call returned, owning the reference the call made."""
    obj = <object>result
    Py_DECREF(obj)
    return obj


cdef inline bint _caught() except -1:
    """After a call returned NULL: True (the error cleared) for an ``Exception``, else the
    error propagates."""
    if not PyErr_ExceptionMatches(Exception):
        _propagate()
    PyErr_Clear()
    return True


# the reused output buffer of small frames (see the module notes)
cdef Py_ssize_t _SMALL = 1024
cdef object _out = bytearray(256)
cdef bint _out_busy = False
cdef dict _direct = {}  # class -> its _Direct, emptied whenever the registry changes
cdef _Direct _last_direct = None  # the entry `serialize` used last (see the module notes)


@cython.final
cdef class _Direct:
    """How one class's frames are encoded: msgspec's ``encode`` and ``encode_into``."""

    cdef object cls
    cdef object encode
    cdef object encode_into
    cdef bint small  # the last frame fitted the reused buffer

    def __init__(self, cls, encode):
        self.cls = cls
        self.encode = encode
        self.encode_into = getattr(getattr(encode, "__self__", None), "encode_into", None)
        self.small = self.encode_into is not None


cdef _Direct _direct_of(object cls):
    """The class's entry, made from ``_encoders`` on first use; None: not encoded here."""
    global _last_direct
    cdef _Direct last = _last_direct
    if last is not None and last.cls is cls:
        return last
    cdef PyObject *d = PyDict_GetItem(_direct, cls)
    if d != NULL:
        _last_direct = <_Direct>d
        return <_Direct>d
    cdef PyObject *encode = PyDict_GetItem(_encoders, cls)
    if encode == NULL or _base == NULL or not PyType_IsSubtype(<PyTypeObject *>cls, _base):
        return None
    entry = _Direct(cls, <object>encode)
    _direct[cls] = entry
    _last_direct = entry
    return entry


cdef object _encode(_Direct d, object msg):
    """The frame of ``msg``, or None when msgspec raised an ``Exception`` (cleared)."""
    global _out, _out_busy
    cdef PyObject *r
    cdef PyObject *args[2]
    cdef Py_ssize_t n
    if d.small and not _out_busy:
        _out_busy = True
        args[0] = <PyObject *>msg
        args[1] = <PyObject *>_out
        r = PyObject_Vectorcall(d.encode_into, args, 2, NULL)
        _out_busy = False
        if r == NULL:
            _caught()
            return None
        Py_DECREF(<object>r)
        n = PyByteArray_GET_SIZE(_out)
        data = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(_out), n)
        if n > _SMALL:  # a large frame: this class goes straight to bytes from now on
            d.small = False
            _out = bytearray(256)
        return data
    r = PyObject_CallOneArg(d.encode, msg)
    if r == NULL:
        _caught()
        return None
    data = _steal(r)
    if not d.small and d.encode_into is not None and len(<bytes>data) <= _SMALL:
        d.small = True
    return data


@cython.always_allow_keywords(False)
def serialize(self):
    """Encode this message as MessagePack bytes: `[type_tag, *fields, *header]`."""
    # only subclasses of the message base get an entry: `self` is a message if it has one
    cdef _Direct d = _direct_of(type(self))
    if d is None:
        return _slow_serialize(self)
    cdef PyObject *mid = _slot(self, _mid_off)
    cdef PyObject *cid = _slot(self, _cid_off)
    if mid == NULL or cid == NULL:
        return _slow_serialize(self)
    cdef object c = <object>cid
    cdef PyObject *rid
    if c is not None and type(c) is not bytes and type(c) is not _uuid_type:
        if not PyObject_TypeCheck(c, _base):
            return _slow_serialize(self)  # a value the Python code refuses, with its error
        # the request this reply answers (stamped by a runtime): its id, made if need be
        rid = _id_of(c)
        if rid == NULL:
            return _slow_serialize(self)
        _set_slot(self, _cid_off, <object>rid)
    if <object>mid is None:
        _set_slot(self, _mid_off, _new_id())
    data = _encode(d, self)
    if data is None:
        return _slow_serialize(self)  # raises the error that names the field
    return data


# --- stream decoding -------------------------------------------------------------------------

cdef Py_ssize_t _registry_version = 0


def registry_changed():
    """The message registry changed (a class was registered): every `StreamDecoder`
    looks its cached class up again before trusting it, `serialize` its encoders and
    `deserialize` its decoders."""
    global _registry_version
    _registry_version += 1
    _forget()


cdef int _forget() except -1:
    """Drop every cached entry (the registry or a binding changed)."""
    global _last_direct, _last_decoding
    _last_direct = None
    _last_decoding = None
    _direct.clear()
    cdef _Decoding d
    for d in _decoding.values():
        d.call = None  # the loop an entry and its bound method make, broken
    _decoding.clear()
    cdef Py_ssize_t i
    for i in range(_TAGS):
        _tags[i] = None
    return 0


# --- decoding into a known class -------------------------------------------------------------

cdef dict _decoders = {}  # class -> its typed decode function (`codec.DIRECT_DECODERS`)
cdef dict _decoding = {}  # class -> its _Decoding, emptied whenever the registry changes
cdef object _slow_deserialize = None  # `Cls.deserialize` in Python: (cls, data)
cdef object _general = None  # `deserialize_message` in Python: (data)
cdef enum:
    _TAGS = 64  # slots of the tag table, a power of two
# the tag table: slot (from a frame's tag bytes) -> the _Decoding whose tag it is, or None;
# a cache filled by `decode_frame` as it meets classes (a slot taken by two tags holds the
# last one seen, and the other takes the Python path until it is seen again)
cdef list _tags = [None] * _TAGS


@cython.final
cdef class _Decoding:
    """``Cls.deserialize`` of one class: its typed decode function, tried first."""

    cdef object cls
    cdef object decode
    cdef readonly object call  # `deserialize` bound to this entry, made once
    cdef bytes tag  # its type tag as frames carry it (UTF-8), once `decode_frame` met one

    def __init__(self, cls, decode):
        self.cls = cls
        self.decode = decode
        # a C function bound to this entry: called straight from the interpreter
        self.call = PyCFunction_NewEx(&_deserialize_def, self, None)

    @property
    def deserialize(self):
        """What ``Cls.deserialize`` is for this class (how a pickled one is found again)."""
        return self.call

    def __reduce__(self):
        # ``Cls.deserialize`` pickles as ``getattr(<this>, "deserialize")``: rebuilt from
        # the class, where it lands
        return (_deserialize_holder, (self.cls,))


def _deserialize_holder(cls):
    """Something whose ``deserialize`` is ``cls.deserialize`` (unpickling one)."""
    cdef _Decoding d = _decoding_of(cls)
    return cls if d is None else d


cdef object _entry_deserialize(object entry, object data):
    """``Cls.deserialize(data)`` for the class of ``entry`` (a `_Decoding`)."""
    cdef _Decoding d = <_Decoding>entry
    cdef PyObject *r = PyObject_CallOneArg(d.decode, data)
    if r != NULL:
        return _steal(r)
    _caught()  # another class's frame, or bad bytes: the Python path says which
    return _slow_deserialize(d.cls, data)


cdef PyMethodDef _deserialize_def
_deserialize_def.ml_name = b"deserialize"
_deserialize_def.ml_meth = <PyCFunction>_entry_deserialize
_deserialize_def.ml_flags = METH_O
_deserialize_def.ml_doc = (
    b"Decode bytes written by serialize into an instance of this class.\n\n"
    b"Raises MessageDeserializationError for malformed or truncated bytes, a field that "
    b"does not validate, or bytes of another message type."
)


cdef _Decoding _last_decoding = None  # the entry `deserialize` used last


def bind_decoding(dict decoders, general):
    """Hand `decode_frame` and `deserialize` the typed decoders they may call directly
    (``decoders``: class -> decode function; classes left out always take the Python
    path) and ``general(data)``, `deserialize_message` in Python."""
    global _decoders, _general
    _decoders = decoders
    _general = general
    _forget()


def bind_class_fallback(slow_deserialize):
    """Hand `deserialize` its Python path, ``slow_deserialize(cls, data)``."""
    global _slow_deserialize
    _slow_deserialize = slow_deserialize
    _forget()


cdef _Decoding _decoding_of(object cls):
    """The class's entry, made from ``_decoders`` on first use; None: not decoded here."""
    global _last_decoding
    cdef _Decoding last = _last_decoding
    if last is not None and last.cls is cls:
        return last
    cdef PyObject *d = PyDict_GetItem(_decoding, cls)
    if d != NULL:
        _last_decoding = <_Decoding>d
        return <_Decoding>d
    cdef PyObject *decode = PyDict_GetItem(_decoders, cls)
    if decode == NULL:
        return None
    entry = _Decoding(cls, <object>decode)
    _decoding[cls] = entry
    _last_decoding = entry
    return entry


def deserialize(cls, data):
    """Decode bytes written by `serialize` into an instance of the class ``cls``.

    Installed as the messages' ``deserialize`` classmethod. Raises
    `MessageDeserializationError` for malformed or truncated bytes, a field that does not
    validate, or bytes of another message type (the Python path says which).
    """
    cdef PyObject *r
    cdef _Decoding d = _decoding_of(cls)
    if d is not None:
        r = PyObject_CallOneArg(d.decode, data)
        if r != NULL:
            return _steal(r)
        _caught()  # another class's frame, or bad bytes: the Python path says which
    return _slow_deserialize(cls, data)


# --- decoding by the tag a frame carries ------------------------------------------------------


cdef Py_ssize_t _find_tag(const unsigned char *p, Py_ssize_t n, Py_ssize_t *size) noexcept:
    """Where the type tag of the frame ``p[:n]`` starts (its length in ``size``), or -1
    when the bytes do not start as a frame does (the Python path then says why)."""
    cdef Py_ssize_t i
    cdef unsigned char b
    if n < 1:
        return -1
    b = p[0]
    if 0x90 <= b <= 0x9F:
        i = 1
    elif b == 0xDC:
        i = 3
    elif b == 0xDD:
        i = 5
    else:
        return -1
    if i >= n:
        return -1
    b = p[i]
    if 0xA0 <= b <= 0xBF:
        size[0] = b & 0x1F
        i += 1
    elif b == 0xD9 and i + 1 < n:
        size[0] = p[i + 1]
        i += 2
    elif b == 0xDA and i + 2 < n:
        size[0] = (<Py_ssize_t>p[i + 1] << 8) | p[i + 2]
        i += 3
    else:
        return -1
    if i + size[0] > n:
        return -1
    return i


cdef inline Py_ssize_t _tag_slot(const unsigned char *tag, Py_ssize_t size) noexcept:
    """The tag table slot of a tag: from its length and last 8 bytes (where the class
    names of one module differ)."""
    cdef size_t h = <size_t>size
    cdef Py_ssize_t i = size - 8 if size > 8 else 0
    while i < size:
        h = h * 31 + tag[i]
        i += 1
    return <Py_ssize_t>(h & (_TAGS - 1))


cdef _Decoding _entry_of_tag(const unsigned char *tag, Py_ssize_t size):
    cdef PyObject *e = PyList_GET_ITEM(_tags, _tag_slot(tag, size))
    if <object>e is None:
        return None
    cdef _Decoding d = <_Decoding>e
    cdef bytes known = d.tag
    if PyBytes_GET_SIZE(known) == size and memcmp(PyBytes_AS_STRING(known), tag, size) == 0:
        return d
    return None


cdef _Decoding _entry_of_frame(object data, bint learn, object cls):
    """The entry of the class the tag of the frame ``data`` names (None: not known yet).

    With ``learn``, ``cls`` is the class the Python path found for this frame: its entry
    is put in the tag table instead (when it may be decoded here)."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t n, at, size = 0
    cdef _Decoding d = None
    cdef bint release = False
    if type(data) is bytes:
        p = <const unsigned char *>PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
    else:
        if PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0:
            PyErr_Clear()  # not bytes at all: the Python path says so
            return None
        release = True
        p = <const unsigned char *>view.buf
        n = view.len
    at = _find_tag(p, n, &size)
    if at >= 0:
        if not learn:
            d = _entry_of_tag(p + at, size)
        else:
            d = _decoding_of(cls)
            if d is not None and d.tag is None:
                d.tag = PyBytes_FromStringAndSize(<char *>(p + at), size)
            if d is not None and _entry_of_tag(p + at, size) is None:
                # still the registry's entry (making the bytes may have run other code)
                if PyDict_GetItem(_decoding, cls) == <PyObject *>d:
                    _tags[_tag_slot(p + at, size)] = d
    if release:
        PyBuffer_Release(&view)
    return d


@cython.always_allow_keywords(False)
def decode_frame(data):
    """Decode bytes written by `RingKernelMessage.serialize` into the right class.

    The class is found by the frame's type tag (its fully qualified name): a tag seen
    before is found in a table by its bytes, with no string made and no registry lookup;
    its typed decoder validates every field. A tag not seen yet, and anything the typed
    decoder refuses, takes the Python path (`deserialize_message`), which reports what is
    wrong.

    Raises:
        MessageDeserializationError: bytes are malformed or truncated, name an unknown type,
            or a field does not validate (the message names the field path).
    """
    cdef PyObject *r
    cdef _Decoding d = _entry_of_frame(data, False, None)
    if d is not None:
        r = PyObject_CallOneArg(d.decode, data)
        if r != NULL:
            return _steal(r)
        _caught()  # bad bytes: the Python path says what is wrong
        return _general(data)
    msg = _general(data)
    _entry_of_frame(data, True, type(msg))
    return msg


@cython.final
cdef class ClassDeserialize:
    """The messages' ``deserialize``: called as a classmethod, ``Cls.deserialize(data)``.

    Read from a class it gives the ``deserialize`` of that class's `_Decoding` entry,
    bound once (a classmethod makes a bound method on every read); a class whose frames
    take the Python path gets that path bound to it.
    """

    def __get__(self, obj, owner):
        if owner is None:
            owner = type(obj)
        cdef _Decoding d = _decoding_of(owner)
        if d is not None:
            return d.call
        return PyMethod_New(_slow_deserialize, owner)


@cython.final
cdef class StreamDecoder:
    """Decodes one stream of frames (a queue's, a process ring's): `codec.message_decoder`.

    The stream's class (that of the first frame, again after the registry changes, or
    after a frame of a class that must take the general path) is decoded by its typed
    decoder when a frame carries its tag (the tag's bytes compared in place): a stream of
    one class decodes in one msgspec call. A frame of another class goes straight to
    ``general`` (`deserialize_message`, which finds classes by their tag) without a
    failed try, and without making it the stream's class: a stream that alternates
    classes pays no switch. Anything the typed decoder refuses goes there too, so results
    and errors are the same. ``fast_of(cls)`` gives a class's typed decode function, or
    None for a class that must always take the general path.
    """

    cdef object _fast
    cdef object _last
    cdef bytes _tag  # the tag of the class of `_fast`, as frames carry it
    cdef Py_ssize_t _seen
    cdef object _general
    cdef object _fast_of

    def __init__(self, general, fast_of):
        self._general = general
        self._fast_of = fast_of
        self._fast = None
        self._last = None
        self._tag = None
        self._seen = -1

    @cython.always_allow_keywords(False)
    def decode(self, data):
        """The message in the frame ``data`` (raises `MessageDeserializationError`)."""
        cdef PyObject *r
        if self._fast is not None and self._seen == _registry_version:
            if not _frame_tag_is(data, self._tag):
                return self._general(data)  # another class: found by its tag there
            r = PyObject_CallOneArg(self._fast, data)
            if r != NULL:
                return _steal(r)
            _caught()  # bad bytes: the general path says what is wrong
        msg = self._general(data)
        t = type(msg)
        if t is not self._last or self._seen != _registry_version:
            self._seen = _registry_version
            self._last = t
            self._fast = self._fast_of(t)
            self._tag = _frame_tag(data)
        return msg


cdef object _frame_tag(object data):
    """The type tag of the frame ``data`` as its bytes, or None when it has none."""
    cdef Py_buffer view
    cdef Py_ssize_t at, size = 0
    if PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0:
        PyErr_Clear()
        return None
    at = _find_tag(<const unsigned char *>view.buf, view.len, &size)
    tag = None
    if at >= 0:
        tag = PyBytes_FromStringAndSize(<char *>view.buf + at, size)
    PyBuffer_Release(&view)
    return tag


cdef bint _frame_tag_is(object data, bytes tag) noexcept:
    """Whether the frame ``data`` carries the type tag ``tag`` (False for no frame)."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t n, at, size = 0
    cdef bint same
    if tag is None:
        return False
    if type(data) is bytes:
        p = <const unsigned char *>PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
        at = _find_tag(p, n, &size)
        return (
            at >= 0 and size == PyBytes_GET_SIZE(tag)
            and memcmp(p + at, PyBytes_AS_STRING(tag), size) == 0
        )
    if PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0:
        PyErr_Clear()
        return False
    p = <const unsigned char *>view.buf
    at = _find_tag(p, view.len, &size)
    same = (
        at >= 0 and size == PyBytes_GET_SIZE(tag)
        and memcmp(p + at, PyBytes_AS_STRING(tag), size) == 0
    )
    PyBuffer_Release(&view)
    return same


# --- field checks (`message.fields`) ---------------------------------------------------------

cdef class _Shape:
    """The fields of one all-scalar message class: slot offsets and accepted classes."""

    cdef list live  # the codec's ``holds_tag`` cell: [True] while the class holds its tag
    cdef tuple offsets  # of int
    cdef tuple first  # the class each field's value must have ...
    cdef tuple second  # ... or this one (None where there is only one)


cdef dict _shapes = {}  # class -> _Shape
cdef object _shape_type = None  # the class of the last message checked, and its shape
cdef _Shape _shape_last = None
# ... and of the one before it: a request and its reply alternate (two entries, no lookup)
cdef object _shape_type2 = None
cdef _Shape _shape_last2 = None
cdef object _fields_slow = None  # `message.fields`'s Python check of any value: (msg)
cdef object _py_true = True  # the object (a bare ``True`` in a C expression is the C 1)


def bind_field_checks(slow):
    """Hand this module the Python check every class without a shape goes to."""
    global _fields_slow, _shape_type, _shape_last, _shape_type2, _shape_last2
    _fields_slow = slow
    _shape_type = _shape_type2 = None
    _shape_last = _shape_last2 = None


cdef Py_ssize_t _field_offset(object descr, object cls) except -1:
    if type(descr).__name__ != "member_descriptor" or not issubclass(cls, descr.__objclass__):
        raise TypeError(f"expected a slot of {cls.__name__}, got {descr!r}")
    cdef PyMemberDef *member = (<PyMemberDescrObject *>descr).d_member
    if member.type != _T_OBJECT and member.type != _T_OBJECT_EX:
        raise TypeError(f"slot {descr!r} does not hold an object")
    return member.offset


def add_field_shape(cls, list live, tuple slots, tuple first, tuple second):
    """Check the messages of ``cls`` here: the value in each of ``slots`` (its fields'
    member descriptors) must be of class ``first[i]`` or ``second[i]`` (None: no
    second), and ``live[0]`` must be True."""
    global _shape_type, _shape_last, _shape_type2, _shape_last2
    if _base == NULL or not isinstance(cls, type) or not issubclass(cls, _base_ref):
        raise TypeError(f"expected a message class, got {cls!r}")
    if not len(slots) == len(first) == len(second):
        raise ValueError("slots, first and second differ in length")
    cdef _Shape shape = _Shape()
    shape.live = live
    shape.offsets = tuple(_field_offset(d, cls) for d in slots)
    shape.first = first
    shape.second = second
    _shapes[cls] = shape
    _shape_type = _shape_type2 = None
    _shape_last = _shape_last2 = None


@cython.always_allow_keywords(False)
def fields_ok(msg):
    """True when every field of ``msg`` holds a value of an accepted class (see
    `add_field_shape`); a value of a class without a shape gets the Python check's answer."""
    global _shape_type, _shape_last, _shape_type2, _shape_last2
    cdef object t = type(msg)
    cdef _Shape shape
    cdef PyObject *p
    if t is _shape_type:
        shape = _shape_last
    elif t is _shape_type2:
        shape = _shape_last2
    else:
        p = PyDict_GetItem(_shapes, t)
        if p == NULL:
            return _fields_slow(msg)
        shape = <_Shape>p
        _shape_type2 = _shape_type
        _shape_last2 = _shape_last
        _shape_type = t
        _shape_last = shape
    if PyList_GET_ITEM(shape.live, 0) != <PyObject *>_py_true:
        return False
    cdef Py_ssize_t i
    cdef PyObject *v
    cdef PyObject *vt
    for i in range(len(shape.offsets)):
        v = _slot(msg, <Py_ssize_t>shape.offsets[i])
        if v == NULL:
            return False
        vt = <PyObject *>(<PyTypeObject *>v.ob_type)
        if vt != <PyObject *>shape.first[i] and vt != <PyObject *>shape.second[i]:
            return False
    return True
