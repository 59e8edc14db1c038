"""Errors cross the Ray boundary as data and come back as the same class with the same text."""

from __future__ import annotations

import pickle
import threading

import pytest

from pydotcompute import KernelState
from pydotcompute.exceptions import (
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    QueueFullError,
)
from pydotcompute.ring_kernels.tiers.ray.wire import pack_error, unpack_error

pytestmark = pytest.mark.ray


def _round_trip(err):
    return unpack_error(pickle.loads(pickle.dumps(pack_error(err))))


def test_state_error_keeps_class_text_and_fields():
    err = KernelStateError("k", KernelState.ACTIVE, "activate", "it is already active")
    back = _round_trip(err)
    assert type(back) is KernelStateError
    assert str(back) == str(err)
    assert back.state is KernelState.ACTIVE
    assert back.kernel_id == "k"
    assert back.operation == "activate"


def test_not_found_error_keeps_its_listing():
    back = _round_trip(KernelNotFoundError("nope", ["a", "b"], where="Ray runtime"))
    assert isinstance(back, KeyError)
    assert str(back) == "unknown kernel id 'nope' in the Ray runtime; known ids: 'a', 'b'"
    assert back.known == ["a", "b"]


def test_failed_error_carries_its_cause():
    cause = ValueError("negative value -3")
    back = _round_trip(KernelFailedError("k", cause))
    assert type(back) is KernelFailedError
    assert "the actor raised ValueError: negative value -3" in str(back)
    assert isinstance(back.__cause__, ValueError)
    assert isinstance(back.error, ValueError)


def test_unpicklable_cause_becomes_a_runtime_error_with_its_text():
    class Odd(Exception):
        def __init__(self, lock):
            super().__init__("odd failure")
            self.lock = lock

    back = _round_trip(KernelFailedError("k", Odd(threading.Lock())))
    assert isinstance(back.__cause__, RuntimeError)
    assert str(back.__cause__) == "Odd: odd failure"


def test_plain_pydotcompute_error_round_trips():
    back = _round_trip(QueueFullError("queue of kernel 'k' is full (4/4 messages)"))
    assert type(back) is QueueFullError
    assert str(back) == "queue of kernel 'k' is full (4/4 messages)"
