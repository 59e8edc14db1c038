"""One class per tag, and field values checked at the door (`message.fields`,
`message.identity`, `message.declared`).

The field checks run against both implementations (the compiled common case and the Python
twin) and against the oracle they stand in for: the class's own decoder, reading what
``serialize`` wrote. The test-purepython step runs this file with the extension off.
"""

from __future__ import annotations

import enum
import gc
import itertools
import re
import uuid
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydotcompute import message
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    MessageDeserializationError,
    TypeValidationError,
)
from pydotcompute.ring_kernels import FastMessageQueue, RingKernelConfig
from pydotcompute.ring_kernels._native import message_extension
from pydotcompute.ring_kernels.message import (
    check_declared_types,
    check_fields,
    declared_by,
    field_problem,
    fields,
    fields_ok,
    holds_its_tag,
)

_names = itertools.count()


class Color(enum.Enum):
    RED = 1


@message
class Inner:
    x: int


def _fresh(annotation: Any, default: Any = msgspec.NODEFAULT) -> type:
    """A message class of one field ``v`` (a name of its own per call: one tag each)."""
    ns: dict[str, Any] = {"__annotations__": {"v": annotation}}
    if default is not msgspec.NODEFAULT:
        ns["v"] = default
    cls = type(f"T{next(_names)}", (), ns)
    cls.__qualname__ = f"fresh.{cls.__name__}"
    return message(cls)


def _decodes(msg: Any) -> bool:
    try:
        type(msg).deserialize(msg.serialize())
    except MessageDeserializationError:
        return False
    return True


#: (annotation, value, does the decoder take it)
CASES: list[tuple[Any, Any, bool]] = [
    (int, 1, True),
    (int, "1", False),
    (int, True, False),
    (int, 1.0, False),
    (int, np.int64(3), True),  # the encoder makes it an int: the exact way accepts it
    (float, 1.5, True),
    (float, 2, True),
    (float, "x", False),
    (str, "s", True),
    (str, b"s", False),
    (bytes, b"b", True),
    (bytes, "YWJj", False),
    (bool, False, True),
    (bool, 0, False),
    (float | None, None, True),
    (float | None, "x", False),
    (int | str, "s", True),
    (int | str, 1.5, False),
    (uuid.UUID, uuid.uuid4(), True),
    (list[float], [1.0, 2, 3.5], True),
    (list[float], [1.0, "x"], False),
    (list[float], (1.0, 2.0), True),  # any sequence encodes as an array
    (list[float], [float(i) for i in range(100)], True),  # past the compiled-loop bound
    (list[float], [*(float(i) for i in range(100)), "x"], False),
    (list[bytes], [b"a"], True),
    (list[bytes], ["YWJj"], False),  # msgspec.convert would read it as base64
    (list, [1, "a", None], True),
    (list, {"a": 1}, False),
    (dict, {"a": [1]}, True),
    (dict, [1], False),
    (tuple[int, ...], (1, 2, 3), True),
    (tuple[int, ...], (1, "2"), False),
    (tuple[int, str], (1, "a"), True),
    (tuple[int, str], (1, 2), False),
    (dict[str, int], {"a": 1}, True),
    (dict[str, int], {"a": "b"}, False),
    (Literal["a", "b"], "a", True),
    (Literal["a", "b"], "c", False),
    (Color, Color.RED, True),
    (Color, 1, True),  # the encoder writes the value: the exact way accepts it
    (Color, 2, False),
    (Annotated[int, msgspec.Meta(ge=0)], 3, True),
    (Annotated[int, msgspec.Meta(ge=0)], -1, False),
    (np.ndarray, np.zeros(3), True),
    (np.ndarray, [1.0], False),
    (np.ndarray | None, None, True),
    (Inner, Inner(x=1), True),
    (Inner, Inner(x="y"), False),  # a nested message's own fields
    (Inner | None, None, True),
    (list[Inner], [Inner(x=1), Inner(x=2)], True),
    (list[Inner], [Inner(x=1), Inner(x="z")], False),
    (Any, [1, {"a": (2, 3)}], True),  # not checked: what a hop can encode, it decodes
]


@pytest.fixture(params=["compiled", "python"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which implementation builds the checks of the classes a test makes."""
    if request.param == "compiled":
        if message_extension() is None:
            pytest.skip("the fast_message extension is not built")
    else:
        monkeypatch.setattr(fields, "_ext", None)  # checks built from now on: Python
    return str(request.param)


def _case_id(obj: Any) -> str:
    """A case's id, the same in every process (pytest-xdist's workers compare them): a
    message's random id left out."""
    return re.sub(r"UUID\('[0-9a-f-]+'\)", "UUID(...)", repr(obj))


@pytest.mark.parametrize(("annotation", "value", "decodes"), CASES, ids=_case_id)
def test_the_check_agrees_with_the_decoder(
    impl: str, annotation: Any, value: Any, decodes: bool
) -> None:
    cls = _fresh(annotation)
    msg = cls(v=value)
    assert _decodes(msg) is decodes  # the oracle
    quick = fields.fields_check(cls)(msg)
    assert fields_ok(msg) is quick
    if quick:  # never True for what the decoder refuses
        assert decodes
    problem = field_problem(msg)
    assert (problem is None) is decodes, problem
    if problem is not None:
        assert problem.startswith("field 'v' expects ")
        with pytest.raises(TypeValidationError, match=r"^kernel 'k' refused T\d+: field 'v'"):
            check_fields(msg, "k")
    else:
        check_fields(msg, "k")  # no error


#: one class per annotation, for the property test (made once: classes are registered)
_PROPERTY_CLASSES = [
    _fresh(a)
    for a in (
        int,
        float,
        str,
        bytes,
        bool,
        float | None,
        int | str,
        list[float],
        list[int | None],
        dict[str, int],
        tuple[int, ...],
        Annotated[int, msgspec.Meta(ge=0, le=9)],
    )
]
_SCALARS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.booleans(),
    st.none(),
)
_VALUES = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=40),
    st.tuples(_SCALARS, _SCALARS),
    st.dictionaries(st.text(max_size=3), _SCALARS, max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(cls=st.sampled_from(_PROPERTY_CLASSES), value=_VALUES)
def test_the_check_agrees_with_the_decoder_for_any_value(cls: type, value: Any) -> None:
    msg = cls(v=value)
    decodes = _decodes(msg)
    if fields_ok(msg):
        assert decodes, (cls.__annotations__, value)
    assert (field_problem(msg) is None) is decodes, (cls.__annotations__, value)


def test_scalar_classes_take_the_compiled_check() -> None:
    ext = message_extension()
    if ext is None:
        pytest.skip("the fast_message extension is not built")
    assert fields.fields_check(_fresh(int)) is ext.fields_ok
    assert fields.fields_check(_fresh(str | None)) is ext.fields_ok
    assert fields.fields_check(_fresh(list[int])) is not ext.fields_ok  # Python's


def test_an_error_names_the_field_the_value_and_the_fix() -> None:
    cls = _fresh(list[float])
    with pytest.raises(TypeValidationError) as info:
        check_fields(cls(v=[1.0, "x"]), "calc", "must send")
    text = str(info.value)
    assert text.startswith("kernel 'calc' cannot send T")
    assert "field 'v' expects list[float], got list ([1.0, 'x'])" in text
    assert "at `v[1]`" in text  # where inside the value
    assert "check_fields=False" in text  # the switch


def test_a_value_that_is_no_message_is_not_checked() -> None:
    for value in (1, "x", {"a": 1}, None):
        assert fields_ok(value)
        assert field_problem(value) is None


def test_check_fields_must_be_a_bool() -> None:
    with pytest.raises(InvalidConfigurationError, match="check_fields must be True or False"):
        RingKernelConfig(kernel_id="k", check_fields="no")  # type: ignore[arg-type]


# --- one class per tag ------------------------------------------------------------------------


class _State:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeKernel:
    """What the registry reads of a kernel: its id and its state's name."""

    def __init__(self, kernel_id: str, state: str = "ACTIVE") -> None:
        self.kernel_id = kernel_id
        self.state = _State(state)


def _twin(name: str) -> type:
    """A class of the qualified name ``twin.<name>`` and one int field: called twice, the
    second takes the first's tag over (the same layout)."""
    cls = type(name, (), {"__annotations__": {"amount": int}})
    cls.__qualname__ = f"twin.{name}"
    return message(cls)


def test_a_tag_is_not_taken_from_a_class_a_live_kernel_declares() -> None:
    first = _twin("Held")
    kernel = FakeKernel("bank")
    check_declared_types(kernel, input_type=first)
    assert declared_by(first) == ["kernel 'bank' (ACTIVE) as its input_type"]
    with pytest.raises(TypeValidationError) as info:
        _twin("Held")
    text = str(info.value)
    assert f"cannot redefine {__name__}.twin.Held: it is declared by kernel 'bank'" in text
    assert "(ACTIVE) as its input_type" in text
    assert "Terminate the kernel first" in text
    assert holds_its_tag(first)  # refused: nothing changed
    kernel.state = _State("TERMINATED")  # an ended kernel holds nothing
    second = _twin("Held")
    assert not holds_its_tag(first)
    assert holds_its_tag(second)


def test_a_dropped_kernel_holds_nothing() -> None:
    first = _twin("Dropped")
    kernel = FakeKernel("gone")
    check_declared_types(kernel, output_type=first)
    del kernel
    gc.collect()
    assert declared_by(first) == []
    _twin("Dropped")  # taken over: nobody declares the first


def test_a_replaced_class_cannot_be_declared_nor_sent() -> None:
    first = _twin("Replaced")
    second = _twin("Replaced")
    with pytest.raises(
        TypeValidationError,
        match=rf"kernel 'k': output_type {__name__}\.twin\.Replaced does not hold its wire "
        r"tag: .*reloaded or redefined",
    ):
        check_declared_types(FakeKernel("k", "CREATED"), output_type=first)
    old = first(amount=1)
    assert not fields_ok(old)
    problem = field_problem(old)
    assert problem is not None
    assert problem.startswith(f"{__name__}.twin.Replaced was reloaded or redefined")
    with pytest.raises(TypeValidationError, match="reloaded or redefined"):
        check_fields(old, "k")
    assert fields_ok(second(amount=1))


def test_a_decoded_message_of_another_class_is_refused_where_a_type_is_declared() -> None:
    @message
    class Wanted:
        n: int

    @message
    class Other:
        n: int

    q: FastMessageQueue[Any] = FastMessageQueue(8, kernel_id="k", serialize=True, expect=Wanted)
    q.put_nowait(Other(n=1))
    q.put_nowait(Wanted(n=2))
    with pytest.raises(
        MessageDeserializationError, match=r"^kernel 'k': bytes hold a Other message, expected"
    ):
        q.get_nowait()
    assert q.get_nowait().n == 2


def test_two_classes_of_one_name_are_named_by_module_and_said_to_be_so() -> None:
    first = _twin("Named")
    second = _twin("Named")
    with pytest.raises(MessageDeserializationError) as info:
        first.deserialize(second(amount=1).serialize())
    text = str(info.value)
    assert f"bytes hold a {__name__}.twin.Named message of another definition" in text
    assert f"expected {__name__}.twin.Named" in text


class _CountedKernel(FakeKernel):
    """A `FakeKernel` that counts how often its state is read."""

    reads = 0

    @property  # type: ignore[override]
    def state(self) -> _State:
        _CountedKernel.reads += 1
        return _State("ACTIVE")

    @state.setter
    def state(self, value: _State) -> None:
        pass


def test_declaring_a_class_for_many_kernels_reads_each_state_a_bounded_number_of_times() -> None:
    """Launching n kernels of one class costs O(n) in all: each declaration does not look
    at every kernel declared before it (10,000 launches took 45 s that way, not 0.3 s)."""
    cls = _twin("Many")
    kernels = [_CountedKernel(f"k{i}") for i in range(2000)]
    _CountedKernel.reads = 0
    for k in kernels:
        check_declared_types(k, input_type=cls)
    assert _CountedKernel.reads <= 8 * len(kernels), _CountedKernel.reads
    assert len(declared_by(cls)) == len(kernels)  # every one of them is still named
