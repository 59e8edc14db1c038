"""``@ring_kernel``, its metadata, the registry it fills and ``RingKernelBuilder``."""

from __future__ import annotations

from typing import Any

import pytest
from foundation_helpers import Req, Resp

from pydotcompute import RingKernelRuntime, ring_kernel
from pydotcompute.decorators import (
    RingKernelBuilder,
    RingKernelMeta,
    get_ring_kernel_meta,
    is_ring_kernel,
)
from pydotcompute.exceptions import (
    InvalidConfigurationError,
    KernelAlreadyExistsError,
    KernelNotFoundError,
    TypeValidationError,
)
from pydotcompute.ring_kernels.context import KernelContext
from pydotcompute.ring_kernels.registry import (
    RingKernelSpec,
    clear_registry,
    get_registered_kernel,
    list_registered_kernels,
    register_ring_kernel,
    unregister_ring_kernel,
)

pytestmark = pytest.mark.usefixtures("clean_kernel_registry")


async def plain_actor(ctx: KernelContext) -> None:
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(Resp(y=msg.x + 100))


def test_bare_decorator_uses_the_function_name() -> None:
    async def my_actor(ctx: KernelContext) -> None:
        await ctx.receive()

    decorated = ring_kernel(my_actor)
    assert decorated is my_actor  # returned unchanged
    assert is_ring_kernel(my_actor)
    meta = get_ring_kernel_meta(my_actor)
    assert isinstance(meta, RingKernelMeta)
    assert meta.kernel_id == "my_actor"
    assert (meta.input_queue_size, meta.output_queue_size) == (4096, 4096)
    assert (meta.grid_size, meta.block_size) == (1, 256)
    assert (meta.backpressure, meta.backend, meta.tier) == ("block", "cpu", "asyncio")
    assert (meta.serialize, meta.restart, meta.max_restarts) == (False, "never", 3)
    assert get_registered_kernel("my_actor").func is my_actor


def test_called_decorator_records_every_option() -> None:
    @ring_kernel(
        kernel_id="full",
        input_type=Req,
        output_type=Resp,
        queue_size=64,
        output_queue_size=8,
        grid_size=2,
        block_size=128,
        backpressure="drop_oldest",
        serialize=True,
        restart="on_failure",
        max_restarts=5,
        custom_flag=True,
    )
    async def full(ctx: KernelContext) -> None:
        await ctx.receive()

    meta = get_ring_kernel_meta(full)
    assert meta is not None
    assert (meta.input_type, meta.output_type) == (Req, Resp)
    assert (meta.input_queue_size, meta.output_queue_size) == (64, 8)
    assert (meta.grid_size, meta.block_size) == (2, 128)
    assert meta.backpressure == "drop_oldest"
    assert (meta.serialize, meta.restart, meta.max_restarts) == (True, "on_failure", 5)
    assert meta.extra == {"custom_flag": True}
    assert meta.launch_options() == {
        "input_queue_size": 64,
        "output_queue_size": 8,
        "grid_size": 2,
        "block_size": 128,
        "backpressure_strategy": "drop_oldest",
        "backend": "cpu",
        "serialize": True,
        "restart": "on_failure",
        "max_restarts": 5,
        "tier": "asyncio",
        "custom_flag": True,
    }
    spec = get_registered_kernel("full")
    assert spec == RingKernelSpec("full", full, Req, Resp, meta.launch_options())


def test_backpressure_enum_normalised_to_its_value() -> None:
    from pydotcompute.ring_kernels import BackpressureStrategy

    @ring_kernel(kernel_id="bp", backpressure=BackpressureStrategy.REJECT)
    async def bp(ctx: KernelContext) -> None:
        await ctx.receive()

    assert get_ring_kernel_meta(bp).backpressure == "reject"  # type: ignore[union-attr]


def test_auto_register_false_only_attaches_metadata() -> None:
    @ring_kernel(kernel_id="unlisted", auto_register=False)
    async def unlisted(ctx: KernelContext) -> None:
        await ctx.receive()

    assert is_ring_kernel(unlisted)
    assert "unlisted" not in list_registered_kernels()


def test_undecorated_functions_have_no_metadata() -> None:
    assert get_ring_kernel_meta(plain_actor) is None
    assert not is_ring_kernel(plain_actor)
    assert get_ring_kernel_meta(42) is None


def test_sync_threaded_actors_are_allowed_on_other_tiers() -> None:
    def blocking(ctx: Any) -> None:
        ctx.receive()

    ring_kernel(kernel_id="threaded_one", tier="thread")(blocking)
    assert get_ring_kernel_meta(blocking).tier == "thread"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"backend": "tpu"}, r"backend must be one of \('cpu', 'cuda', 'metal'\), got 'tpu'"),
        ({"queue_size": 0}, r"input_queue_size must be an int in 1\.\.16777216, got 0"),
        ({"output_queue_size": 2**25}, r"output_queue_size must be an int in 1\.\."),
        ({"queue_size": 1.5}, r"input_queue_size must be an int"),
        ({"queue_size": True}, r"input_queue_size must be an int"),
        ({"grid_size": 0}, r"grid_size must be an int >= 1, got 0"),
        ({"block_size": 1025}, r"block_size must be an int in 1\.\.1024, got 1025"),
        ({"backpressure": "wait"}, r"unknown backpressure strategy 'wait'"),
        ({"backpressure": 3}, r"backpressure must be 'block', 'reject' or 'drop_oldest', got 3"),
        ({"restart": "always"}, r"restart must be one of \('never', 'on_failure'\)"),
        ({"max_restarts": -2}, r"max_restarts must be an int >= 0, got -2"),
        ({"kernel_id": "   "}, r"kernel_id must be a non-empty string, got '   '"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], match: str) -> None:
    async def actor(ctx: KernelContext) -> None:
        await ctx.receive()

    with pytest.raises(InvalidConfigurationError, match=match):
        ring_kernel(**options)(actor)
    assert not is_ring_kernel(actor)


def test_a_plain_def_is_refused_on_the_asyncio_tier() -> None:
    def not_async(ctx: Any) -> None:
        pass

    with pytest.raises(
        InvalidConfigurationError,
        match=r"ring kernel 'not_async' must be an 'async def' function taking a KernelContext",
    ):
        ring_kernel(not_async)


@pytest.mark.parametrize("bad", ["Req", 5, Req(x=1)], ids=["str", "int", "instance"])
def test_message_types_must_be_classes(bad: Any) -> None:
    async def actor(ctx: KernelContext) -> None:
        await ctx.receive()

    with pytest.raises(TypeValidationError, match=r"input_type must be a class"):
        ring_kernel(kernel_id="typed", input_type=bad)(actor)
    with pytest.raises(TypeValidationError, match=r"output_type must be a class"):
        ring_kernel(kernel_id="typed", output_type=bad)(actor)


def test_metadata_cannot_be_attached_to_a_builtin() -> None:
    with pytest.raises(InvalidConfigurationError, match="cannot attach ring kernel metadata"):
        ring_kernel(kernel_id="b", tier="thread")(len)


# --- the registry ----------------------------------------------------------------------


def test_re_registering_replaces_unless_told_not_to() -> None:
    register_ring_kernel("same", plain_actor)

    async def newer(ctx: KernelContext) -> None:
        await ctx.receive()

    register_ring_kernel("same", newer)
    assert get_registered_kernel("same").func is newer
    with pytest.raises(
        KernelAlreadyExistsError,
        match=r"a ring kernel with id 'same' is already registered .*choose another kernel_id",
    ):
        register_ring_kernel("same", plain_actor, replace_existing=False)


def test_registry_listing_and_removal() -> None:
    clear_registry()
    register_ring_kernel("b", plain_actor)
    register_ring_kernel("a", plain_actor, input_type=Req, input_queue_size=3)
    assert list_registered_kernels() == ["a", "b"]
    spec = get_registered_kernel("a")
    assert spec.options == {"input_queue_size": 3}
    assert spec.with_options(restart="on_failure").options == {
        "input_queue_size": 3,
        "restart": "on_failure",
    }
    assert spec.options == {"input_queue_size": 3}  # specs are immutable
    assert unregister_ring_kernel("a") is True
    assert unregister_ring_kernel("a") is False
    with pytest.raises(
        KernelNotFoundError,
        match=r"unknown kernel id 'a' in the @ring_kernel registry; known ids: 'b'",
    ):
        get_registered_kernel("a")


# --- the builder -----------------------------------------------------------------------


def test_builder_collects_options_fluently() -> None:
    built = (
        RingKernelBuilder("built")
        .input(Req)
        .output(Resp)
        .queue_size(32)
        .backpressure("reject")
        .grid(4, 64)
        .restart("on_failure", 2)
        .serialize()
        .options(note="x")
        .build(plain_actor)
    )
    assert built is plain_actor
    meta = get_ring_kernel_meta(plain_actor)
    assert meta is not None
    assert meta.kernel_id == "built"
    assert (meta.input_type, meta.output_type) == (Req, Resp)
    assert (meta.input_queue_size, meta.backpressure) == (32, "reject")
    assert (meta.grid_size, meta.block_size) == (4, 64)
    assert (meta.restart, meta.max_restarts, meta.serialize) == ("on_failure", 2, True)
    assert meta.extra == {"note": "x"}
    assert get_registered_kernel("built").input_type is Req


def test_builder_aliases_and_no_register() -> None:
    async def other(ctx: KernelContext) -> None:
        await ctx.receive()

    b = RingKernelBuilder("quiet").with_input_type(Req).with_output_type(Resp)
    b.with_queue_size(5).with_backpressure("block").tier("asyncio").backend("cpu")
    b.build(other, register=False)
    assert get_ring_kernel_meta(other).input_queue_size == 5  # type: ignore[union-attr]
    assert "quiet" not in list_registered_kernels()


def test_builder_validates_the_id_and_the_options() -> None:
    with pytest.raises(InvalidConfigurationError, match="kernel_id must be a non-empty string"):
        RingKernelBuilder("")
    with pytest.raises(InvalidConfigurationError, match="block_size"):
        RingKernelBuilder("bad").grid(1, 4096).build(plain_actor)


# --- end to end ------------------------------------------------------------------------


async def test_decorated_kernel_launches_by_id_with_its_options() -> None:
    @ring_kernel(
        kernel_id="deco_e2e",
        input_type=Req,
        output_type=Resp,
        queue_size=2,
        backpressure="reject",
    )
    async def deco_e2e(ctx: KernelContext) -> None:
        while not ctx.should_terminate:
            msg = await ctx.receive()
            await ctx.send(Resp(y=-msg.x))

    async with RingKernelRuntime() as runtime:
        kernel = await runtime.launch("deco_e2e")
        assert kernel.config.backpressure_strategy == "reject"
        assert kernel.inbox is not None
        assert kernel.inbox.maxsize == 2
        await runtime.activate("deco_e2e")
        assert (await runtime.send_and_receive("deco_e2e", Req(x=3), timeout=5)).y == -3
