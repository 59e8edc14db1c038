"""Validators shared by ``@ring_kernel``, ``RingKernelConfig`` and the runtime."""

from __future__ import annotations

from typing import Any

import pytest
from foundation_helpers import Other, Req

from pydotcompute.decorators import (
    RuntimeValidator,
    validate_backpressure_strategy,
    validate_config,
    validate_priority,
)
from pydotcompute.decorators.validators import (
    MAX_QUEUE_SIZE,
    check_block_size,
    check_grid_size,
    check_message,
    check_queue_size,
    validate_kernel_id,
    validate_message_type,
    validate_restart,
)
from pydotcompute.exceptions import InvalidConfigurationError, TypeValidationError
from pydotcompute.ring_kernels.config import RingKernelConfig
from pydotcompute.ring_kernels.fast_queue import BackpressureStrategy


def test_kernel_id() -> None:
    assert validate_kernel_id("k") == "k"
    for bad in ("", "  ", None, 3, b"k"):
        with pytest.raises(InvalidConfigurationError, match="kernel_id must be a non-empty string"):
            validate_kernel_id(bad)


def test_queue_size() -> None:
    assert check_queue_size(1) == 1
    assert check_queue_size(MAX_QUEUE_SIZE) == MAX_QUEUE_SIZE
    for bad in (0, -1, MAX_QUEUE_SIZE + 1, 1.0, "8", True, None):
        with pytest.raises(
            InvalidConfigurationError, match=rf"^my_q must be an int in 1\.\.{MAX_QUEUE_SIZE}, got"
        ):
            check_queue_size(bad, "my_q")


def test_grid_size() -> None:
    assert check_grid_size(1) == 1
    assert check_grid_size(10**6) == 10**6
    for bad in (0, -3, 2.0, False):
        with pytest.raises(InvalidConfigurationError, match=r"grid_size must be an int >= 1"):
            check_grid_size(bad)


def test_block_size() -> None:
    assert check_block_size(1) == 1
    assert check_block_size(1024) == 1024
    for bad in (0, 1025, 32.0, True):
        with pytest.raises(
            InvalidConfigurationError, match=r"block_size must be an int in 1\.\.1024, got"
        ):
            check_block_size(bad)


def test_priority() -> None:
    assert validate_priority(0) == 0
    assert validate_priority(255) == 255
    for bad in (-1, 256, 1.0, "1"):
        with pytest.raises(
            InvalidConfigurationError, match=r"message priority must be an int in 0\.\.255, got"
        ):
            validate_priority(bad)


def test_backpressure_strategy() -> None:
    assert validate_backpressure_strategy("block") is BackpressureStrategy.BLOCK
    assert validate_backpressure_strategy("Reject") is BackpressureStrategy.REJECT
    assert (
        validate_backpressure_strategy(BackpressureStrategy.DROP_OLDEST)
        is BackpressureStrategy.DROP_OLDEST
    )
    with pytest.raises(
        InvalidConfigurationError,
        match=r"unknown backpressure strategy 'later'; choose one of "
        r"\['block', 'reject', 'drop_oldest'\]",
    ):
        validate_backpressure_strategy("later")
    with pytest.raises(InvalidConfigurationError, match="backpressure must be 'block'"):
        validate_backpressure_strategy(None)


def test_restart() -> None:
    assert validate_restart("never", 0) == ("never", 0)
    assert validate_restart("on_failure", 7) == ("on_failure", 7)
    with pytest.raises(InvalidConfigurationError, match="restart must be one of"):
        validate_restart("sometimes", 1)
    with pytest.raises(InvalidConfigurationError, match="max_restarts must be an int >= 0"):
        validate_restart("never", -1)
    with pytest.raises(InvalidConfigurationError, match="max_restarts must be an int >= 0"):
        validate_restart("never", 1.5)


def test_message_type() -> None:
    assert validate_message_type(None) is None
    assert validate_message_type(Req) is Req
    with pytest.raises(
        TypeValidationError, match=r"output_type must be a class .* got 3 of type int"
    ):
        validate_message_type(3, "output_type")


def test_message_accepts_the_type_its_subclasses_and_anything_for_none() -> None:
    msg = Req(x=1)
    assert check_message(msg, Req) is msg
    assert check_message(msg, None) is msg
    assert check_message(msg, object) is msg


def test_message_names_expected_and_received() -> None:
    with pytest.raises(TypeValidationError, match=r"^kernel 'calc' expects Req, got Other$"):
        check_message(Other(z="x"), Req, "calc")
    with pytest.raises(TypeValidationError, match=r"^kernel expects Req, got dict \(\{'x': 1\}\)$"):
        check_message({"x": 1}, Req)
    with pytest.raises(TypeValidationError, match=r"^kernel 'k' must send Req, got int \(5\)$"):
        check_message(5, Req, "k", "must send")


def test_message_repr_of_a_long_value_is_cut() -> None:
    with pytest.raises(TypeValidationError) as info:
        check_message("x" * 500, Req, "k")
    assert len(str(info.value)) < 150


def test_config() -> None:
    cfg = RingKernelConfig("ok")
    assert validate_config(cfg) is cfg
    with pytest.raises(InvalidConfigurationError, match="output_queue_size"):
        validate_config(RingKernelConfig("bad", output_queue_size=0))
    with pytest.raises(InvalidConfigurationError, match="kernel_id"):
        validate_config(RingKernelConfig(""))


@pytest.mark.parametrize("strict", [True, False])
def test_runtime_validator(strict: bool) -> None:
    v = RuntimeValidator(strict_types=strict)
    v.check_input("k", Req, Req(x=1))
    bad: Any = Other(z="?")
    if strict:
        with pytest.raises(TypeValidationError, match="kernel 'k' expects Req, got Other"):
            v.check_input("k", Req, bad)
        with pytest.raises(TypeValidationError, match="kernel 'k' must send Req, got Other"):
            v.check_output("k", Req, bad)
    else:
        v.check_input("k", Req, bad)
        v.check_output("k", Req, bad)
    cfg = RingKernelConfig("c")
    assert v.check_config(cfg) is cfg
