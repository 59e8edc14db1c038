"""The error hierarchy of DESIGN.md section 6: one root, each error also its builtin."""

from __future__ import annotations

import pytest

from pydotcompute import exceptions as exc
from pydotcompute.ring_kernels.states import KernelState

REFINES = [
    (exc.KernelNotFoundError, KeyError),
    (exc.KernelAlreadyExistsError, exc.KernelError),
    (exc.KernelStateError, RuntimeError),
    (exc.KernelFailedError, exc.KernelStateError),
    (exc.MessageSerializationError, ValueError),
    (exc.MessageDeserializationError, ValueError),
    (exc.TypeValidationError, TypeError),
    (exc.QueueFullError, exc.QueueError),
    (exc.QueueTimeoutError, TimeoutError),
    (exc.QueueClosedError, exc.QueueError),
    (exc.BufferNotAllocatedError, exc.PyDotComputeError),
    (exc.BufferSyncError, exc.PyDotComputeError),
    (exc.BackendNotAvailableError, ImportError),
    (exc.CUDAError, exc.PyDotComputeError),
    (exc.MetalError, exc.PyDotComputeError),
    (exc.KernelCompilationError, exc.PyDotComputeError),
    (exc.InvalidConfigurationError, ValueError),
]


@pytest.mark.parametrize(("cls", "builtin"), REFINES, ids=[c.__name__ for c, _ in REFINES])
def test_every_error_has_the_root_and_its_builtin(cls: type, builtin: type) -> None:
    assert issubclass(cls, exc.PyDotComputeError)
    assert issubclass(cls, builtin)
    assert cls.__doc__, f"{cls.__name__} needs a 'raised when' docstring"


def test_all_names_every_public_error() -> None:
    public = {
        name
        for name, value in vars(exc).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    assert public == set(exc.__all__)
    assert len(exc.__all__) == len(set(exc.__all__))


def test_kernel_not_found_lists_known_ids_sorted() -> None:
    err = exc.KernelNotFoundError("nope", ["b", "a"])
    assert str(err) == "unknown kernel id 'nope' in the runtime; known ids: 'a', 'b'"
    assert err.kernel_id == "nope"
    assert err.known == ["a", "b"]
    with pytest.raises(KeyError, match=r"known ids: 'a', 'b'"):
        raise err


def test_kernel_not_found_with_no_known_ids_says_none() -> None:
    err = exc.KernelNotFoundError("x", (), where="@ring_kernel registry")
    assert str(err) == "unknown kernel id 'x' in the @ring_kernel registry; known ids: none"


def test_kernel_state_error_names_kernel_state_and_operation() -> None:
    err = exc.KernelStateError("k", KernelState.TERMINATED, "activate", "launch a new one")
    assert str(err) == "cannot activate kernel 'k': it is TERMINATED; launch a new one"
    assert (err.kernel_id, err.state, err.operation) == ("k", KernelState.TERMINATED, "activate")


def test_kernel_failed_error_carries_the_actor_error() -> None:
    cause = ValueError("bad input 7")
    err = exc.KernelFailedError("k", cause)
    assert err.error is cause
    assert err.state is KernelState.FAILED
    assert "it is FAILED; the actor raised ValueError: bad input 7" in str(err)
    assert isinstance(err, RuntimeError)


def test_queue_timeout_is_caught_by_except_timeout_error() -> None:
    with pytest.raises(TimeoutError, match="waited"):
        raise exc.QueueTimeoutError("waited too long")
