"""GPU ring kernels: what is refused at decoration and construction time (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated, Any

import numpy as np
import pytest

from pydotcompute import RingKernelRuntime
from pydotcompute.decorators.ring_kernel import ring_kernel
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    InvalidConfigurationError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.config import RingKernelConfig
from pydotcompute.ring_kernels.message import message
from pydotcompute.ring_kernels.tiers.gpu import GPURingKernel


@message
class Point:
    x: float
    y: np.float32


@message
class Window:
    samples: Annotated[np.ndarray, (8,), np.float32]
    label: int


@message
class Loose:
    values: list[float]
    name: str


def handler(inp: Any, out: Any, state: Any) -> int:
    out.x = inp.x
    return 0


def _decorate(fn: Any = handler, **kw: Any) -> Any:
    opts: dict[str, Any] = {
        "kernel_id": "spec_check",
        "input_type": Point,
        "output_type": Point,
        "backend": "cuda",
        "auto_register": False,
    }
    opts.update(kw)
    return ring_kernel(**opts)(fn)


def test_fixed_layout_kernel_is_accepted() -> None:
    fn = _decorate(input_type=Window, output_type=Point, state=np.zeros(4, np.int32))
    assert fn is handler
    assert fn.__ring_kernel_meta__.tier == "gpu"


def test_non_fixed_layout_input_is_refused_naming_the_fields() -> None:
    with pytest.raises(
        TypeValidationError,
        match=r"GPU ring kernel 'spec_check': input_type Loose is not a fixed-layout message "
        r"\(fields 'values: list\[float\]', 'name: str' have no fixed size\); GPU rings carry",
    ):
        _decorate(input_type=Loose)


def test_non_fixed_layout_output_is_refused() -> None:
    with pytest.raises(TypeValidationError, match="output_type Loose is not a fixed-layout"):
        _decorate(output_type=Loose)


def test_missing_message_type_is_refused() -> None:
    with pytest.raises(TypeValidationError, match="needs an output_type: a fixed-layout @message"):
        _decorate(output_type=None)


def test_async_actor_is_refused() -> None:
    async def actor(ctx: Any) -> None:
        pass

    with pytest.raises(
        TypeValidationError,
        match=r"kernel '\w+': the gpu tier runs device functions .*, but '.*actor' is async",
    ):
        _decorate(actor)
    with pytest.raises(TypeValidationError, match="is async"):  # the kind is the first check
        _decorate(actor, output_type=None)


def test_handler_arity_is_checked() -> None:
    def two(inp: Any, out: Any) -> int:
        return 0

    with pytest.raises(
        TypeValidationError, match=r"must take \(inp, out, state\).*takes \(inp, out\)"
    ):
        _decorate(two)


def test_grid_size_must_be_one() -> None:
    with pytest.raises(InvalidConfigurationError, match="grid_size must be 1, got 4"):
        _decorate(grid_size=4)


def test_restart_on_failure_is_refused() -> None:
    with pytest.raises(InvalidConfigurationError, match="restart='on_failure' is not supported"):
        _decorate(restart="on_failure")


def test_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(InvalidConfigurationError, match=r"unknown option\(s\) \['stat'\].*'state'"):
        _decorate(stat=np.zeros(1))


@pytest.mark.parametrize(
    ("option", "value", "text"),
    [
        ("outbox_full", "spill", "outbox_full must be 'block' or 'drop', got 'spill'"),
        ("watchdog_timeout", 0, "watchdog_timeout must be seconds > 0 or None, got 0"),
        ("terminate_timeout", -1.0, "terminate_timeout must be seconds > 0, got -1.0"),
        ("compile_timeout", 0, "compile_timeout must be seconds > 0 or None, got 0"),
        ("compile_timeout", "1", "compile_timeout must be seconds > 0 or None, got '1'"),
        ("ring_size", 0, "ring_size must be an int in 1..16777216, got 0"),
        ("max_backoff_ns", 10**7, "max_backoff_ns must be an int in 0..1000000"),
        ("cooperative", "yes", "cooperative must be True or False, got 'yes'"),
        ("device_id", -1, "device_id must be an int >= 0, got -1"),
    ],
)
def test_option_values_are_checked(option: str, value: Any, text: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=text):
        _decorate(**{option: value})


def test_state_must_be_numeric() -> None:
    with pytest.raises(TypeValidationError, match=r"state must hold numbers.*got dtype <U3"):
        _decorate(state=np.array(["abc"]))
    with pytest.raises(TypeValidationError, match=r"state must be a NumPy array.*got list"):
        _decorate(state=[1, 2])
    with pytest.raises(InvalidConfigurationError, match=r"state must be a non-empty array"):
        _decorate(state=np.zeros(0))


def test_cuda_source_must_define_the_handler() -> None:
    with pytest.raises(
        InvalidConfigurationError, match="cuda_source does not define the handler 'step'"
    ):
        _decorate(cuda_source="__device__ int handle(...) { return 0; }", handler_name="step")


def test_a_cuda_kernel_is_not_a_device_function() -> None:
    cuda = pytest.importorskip("numba.cuda")
    if getattr(__import__("numba").config, "ENABLE_CUDASIM", 0):
        pytest.skip("the simulator's dispatchers do not carry target options")
    kern = cuda.jit(handler)
    with pytest.raises(TypeValidationError, match=r"is a CUDA kernel \(@cuda\.jit\)"):
        _decorate(kern)


def test_the_tier_class_checks_too() -> None:
    cfg = RingKernelConfig(kernel_id="direct")
    with pytest.raises(TypeValidationError, match="input_type Loose is not a fixed-layout"):
        GPURingKernel("direct", handler, config=cfg, input_type=Loose, output_type=Point)


async def test_runtime_launch_refuses_a_loose_type_before_touching_a_device() -> None:
    async with RingKernelRuntime() as rt:
        with pytest.raises(TypeValidationError, match="input_type Loose is not a fixed-layout"):
            await rt.launch("gpu", handler, input_type=Loose, output_type=Point, tier="gpu")
        assert "gpu" not in rt


async def test_launch_without_gpu_or_simulator_says_how_to_get_one() -> None:
    pytest.importorskip("numba.cuda")
    from numba import config, cuda

    if getattr(config, "ENABLE_CUDASIM", 0) or cuda.is_available():
        pytest.skip("a GPU (or the simulator) is available here")
    async with RingKernelRuntime() as rt:
        with pytest.raises(BackendNotAvailableError, match="NUMBA_ENABLE_CUDASIM=1"):
            await rt.launch("gpu", handler, input_type=Point, output_type=Point, tier="gpu")
        assert "gpu" not in rt


def test_importing_the_gpu_tier_loads_no_cuda_library() -> None:
    code = (
        "import sys, pydotcompute.ring_kernels.tiers.gpu as g\n"
        "from pydotcompute.decorators.ring_kernel import ring_kernel\n"
        "heavy = [m for m in ('numba', 'cupy', 'pynvml', 'llvmlite') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
