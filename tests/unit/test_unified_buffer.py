"""UnifiedBuffer: the state machine, lazy transfers proven by counters, errors, async copies."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pydotcompute.backends import CPUBackend, MetalBackend
from pydotcompute.core import BufferState, MemoryPool, UnifiedBuffer
from pydotcompute.core import unified_buffer as ub_mod
from pydotcompute.exceptions import (
    BufferMismatchError,
    BufferNotAllocatedError,
    BufferSyncError,
    InvalidConfigurationError,
)

HAS_MLX = MetalBackend().is_available


def make(shape: Any = (8,), dtype: Any = np.float32, **kw: Any) -> UnifiedBuffer:
    """A CPU buffer with a separate device array and strict marks: the GPU-like state
    machine these tests pin (the CPU default shares one array, see test_compat_toolkit)."""
    kw.setdefault("device_copy", True)
    kw.setdefault("strict_sync", True)
    return UnifiedBuffer(shape, dtype, backend="cpu", **kw)


def transfers(buf: UnifiedBuffer) -> tuple[int, int]:
    s = buf.transfer_stats
    return s.host_to_device, s.device_to_host


# --- construction and allocation ---------------------------------------------------------


def test_properties_before_allocation() -> None:
    buf = UnifiedBuffer((1000,), dtype=np.float32, backend="cpu")
    assert buf.shape == (1000,)
    assert buf.dtype == np.float32
    assert buf.size == 1000
    assert buf.nbytes == 4000
    assert len(buf) == 1000
    assert buf.state is BufferState.UNINITIALIZED
    assert not buf.is_allocated
    assert "UNINITIALIZED" in repr(buf)


@pytest.mark.parametrize("attr", ["host", "device"])
def test_use_before_allocate_raises(attr: str) -> None:
    with pytest.raises(
        BufferNotAllocatedError, match=r"float32 \(8,\) is not allocated; call allocate"
    ):
        getattr(make(), attr)


def test_use_after_free_raises_and_reallocate_works() -> None:
    buf = make().allocate()
    buf.free()
    buf.free()  # harmless
    assert buf.state is BufferState.UNINITIALIZED
    for op in (lambda: buf.host, lambda: buf.device, buf.mark_host_dirty, buf.synchronize):
        with pytest.raises(BufferNotAllocatedError, match="was freed; call allocate"):
            op()
    buf.allocate()
    assert buf.state is BufferState.SYNCHRONIZED
    assert not buf.host.any()


def test_allocate_variants() -> None:
    assert make().allocate().state is BufferState.SYNCHRONIZED
    assert make().allocate(device=False).state is BufferState.HOST_ONLY
    assert make().allocate(host=False).state is BufferState.DEVICE_ONLY
    with pytest.raises(InvalidConfigurationError, match="needs host=True, device=True or both"):
        make().allocate(host=False, device=False)


def test_allocating_the_missing_side_copies_once() -> None:
    buf = make().allocate(device=False)
    buf[:] = 5
    buf.allocate(device=True)
    assert buf.state is BufferState.SYNCHRONIZED
    assert transfers(buf) == (1, 0)
    np.testing.assert_array_equal(buf.device, 5)


def test_bad_dtype_and_shape() -> None:
    with pytest.raises(InvalidConfigurationError, match="dtype 'nonsense' is not a NumPy dtype"):
        UnifiedBuffer(4, "nonsense", backend="cpu")
    with pytest.raises(InvalidConfigurationError, match="contains Python objects"):
        UnifiedBuffer(4, object, backend="cpu")
    with pytest.raises(InvalidConfigurationError, match="non-negative ints"):
        UnifiedBuffer((2, -1), backend="cpu")


# --- the seed workflow and lazy transfers --------------------------------------------------


async def test_seed_workflow() -> None:
    buf = UnifiedBuffer((1000,), dtype=np.float32, backend="cpu", device_copy=True)
    buf.allocate()
    buf.host[:] = np.arange(1000, dtype=np.float32)
    buf.mark_host_dirty()
    assert buf.state is BufferState.HOST_DIRTY
    await buf.ensure_on_device()
    assert buf.state is BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.device, np.arange(1000))
    assert transfers(buf) == (1, 0)


def test_device_is_a_separate_numpy_array_on_cpu() -> None:
    buf = make().allocate()
    assert isinstance(buf.device, np.ndarray)
    assert not np.shares_memory(buf.device, buf.host)


def test_reads_of_the_current_side_never_copy() -> None:
    buf = make().allocate()
    for _ in range(5):
        _ = buf.host
        _ = buf.device
    assert transfers(buf) == (0, 0)
    buf.mark_host_dirty()
    for _ in range(5):
        _ = buf.host
    assert transfers(buf) == (0, 0)
    for _ in range(5):
        _ = buf.device
    assert transfers(buf) == (1, 0)


def test_device_write_then_host_read_copies_once() -> None:
    buf = make().allocate()
    buf.device[:] = 3
    buf.mark_device_dirty()
    assert buf.state is BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.host, 3)
    np.testing.assert_array_equal(buf.host, 3)
    assert transfers(buf) == (0, 1)
    stats = buf.transfer_stats
    assert stats.bytes_device_to_host == buf.nbytes
    assert stats.total_transfers == 1
    buf.reset_transfer_stats()
    assert buf.transfer_stats.total_transfers == 0


def test_setitem_marks_host_dirty_and_getitem_reads() -> None:
    buf = make().allocate()
    buf[2] = 7
    assert buf.state is BufferState.HOST_DIRTY
    assert buf[2] == 7
    assert buf.device[2] == 7
    assert list(buf)[2] == 7
    assert np.asarray(buf)[2] == 7


def test_setitem_after_device_write_keeps_device_data() -> None:
    buf = make().allocate()
    buf.device[:] = 1
    buf.mark_device_dirty()
    buf[0] = 9  # reads the device data first, then writes one element
    np.testing.assert_array_equal(buf.device, [9, 1, 1, 1, 1, 1, 1, 1])


def test_conflicting_writes_are_refused() -> None:
    buf = make().allocate()
    stale_device = buf.device
    buf[0] = 1
    stale_device[1] = 2
    with pytest.raises(
        BufferSyncError, match=r"mark_device_dirty\(\) while the host side is dirty"
    ):
        buf.mark_device_dirty()
    assert buf.state is BufferState.HOST_DIRTY  # unchanged by the refusal
    buf2 = make().allocate()
    buf2.device[0] = 1
    buf2.mark_device_dirty()
    with pytest.raises(
        BufferSyncError, match=r"mark_host_dirty\(\) while the device side is dirty"
    ):
        buf2.mark_host_dirty()


def test_one_sided_buffers_cannot_mark_the_missing_side() -> None:
    with pytest.raises(BufferSyncError, match="has no device side to mark dirty"):
        make().allocate(device=False).mark_device_dirty()
    with pytest.raises(BufferSyncError, match="has no host side to mark dirty"):
        make().allocate(host=False).mark_host_dirty()


def test_device_only_buffer_gets_a_host_side_on_read() -> None:
    buf = make().allocate(host=False)
    buf.device[:] = 4
    np.testing.assert_array_equal(buf.host, 4)
    assert buf.state is BufferState.SYNCHRONIZED
    assert transfers(buf) == (0, 1)


def test_synchronize_reconciles_dirty_side_only() -> None:
    buf = make().allocate()
    buf[:] = 2
    buf.synchronize()
    assert buf.state is BufferState.SYNCHRONIZED
    buf.synchronize()
    assert transfers(buf) == (1, 0)
    one_sided = make().allocate(device=False)
    one_sided.synchronize()
    assert one_sided.state is BufferState.HOST_ONLY


def test_fill_and_zeros_touch_no_transfer() -> None:
    buf = make().allocate()
    buf[:] = 1
    buf.fill(6)
    assert buf.state is BufferState.SYNCHRONIZED
    np.testing.assert_array_equal(buf.device, 6)
    np.testing.assert_array_equal(buf.host, 6)
    buf.zeros()
    assert not buf.host.any()
    assert transfers(buf) == (0, 0)


# --- copies ------------------------------------------------------------------------------


def test_copy_from_and_to() -> None:
    buf = make().allocate()
    src = np.arange(8, dtype=np.float32)
    buf.copy_from(src)
    assert buf.state is BufferState.HOST_DIRTY
    out = np.empty(8, np.float32)
    assert buf.copy_to(out) is out
    np.testing.assert_array_equal(out, src)
    buf.copy_from([1, 2, 3, 4, 5, 6, 7, 8])  # a plain sequence takes the buffer's dtype
    assert buf[7] == 8


def test_copy_from_overwrites_a_dirty_device_side() -> None:
    buf = make().allocate()
    buf.device[:] = 5
    buf.mark_device_dirty()
    buf.copy_from(np.ones(8, np.float32))
    assert buf.state is BufferState.HOST_DIRTY
    np.testing.assert_array_equal(buf.device, 1)


def test_copy_mismatches_name_both_sides() -> None:
    buf = UnifiedBuffer((1000,), np.float32, backend="cpu").allocate()
    with pytest.raises(
        BufferMismatchError,
        match=r"cannot copy_from float64 \(10,\) \(source\) into float32 \(1000,\) \(destination\)",
    ):
        buf.copy_from(np.zeros(10))
    with pytest.raises(
        BufferMismatchError, match=r"copy_to float32 \(1000,\) \(source\) into int32"
    ):
        buf.copy_to(np.zeros(1000, np.int32))
    with pytest.raises(
        BufferMismatchError, match="copy_to needs a NumPy or device array, got list"
    ):
        buf.copy_to([0.0] * 1000)
    with pytest.raises(BufferMismatchError, match="cannot copy"):
        buf.copy_from(["a", "b"])


def test_len_of_scalar_buffer() -> None:
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d"):
        len(UnifiedBuffer((), backend="cpu"))


def test_context_manager_allocates_and_frees() -> None:
    with make() as buf:
        assert buf.is_allocated
    assert not buf.is_allocated


def test_pinned_is_ignored_off_cuda() -> None:
    buf = make(pinned=True).allocate()
    assert not buf.pinned


def test_pool_backed_buffer_returns_memory() -> None:
    pool = MemoryPool.create()
    buf = make((256,), pool=pool).allocate()
    assert pool.get_stats().blocks_in_use == 2
    buf[:] = 1
    np.testing.assert_array_equal(buf.device, 1)
    buf.free()
    stats = pool.get_stats()
    assert stats.blocks_in_use == 0
    assert stats.blocks_cached == 2
    again = make((256,), pool=pool).allocate()
    assert not again.host.any()  # pooled memory is zeroed on allocate
    assert pool.get_stats().hits == 2


# --- async --------------------------------------------------------------------------------


async def test_ensure_methods_return_current_arrays_without_extra_copies() -> None:
    buf = make().allocate()
    dev = await buf.ensure_on_device()
    host = await buf.ensure_on_host()
    assert dev is buf.device
    assert host is buf.host
    assert transfers(buf) == (0, 0)
    buf.device[:] = 2
    buf.mark_device_dirty()
    host = await buf.ensure_on_host()
    np.testing.assert_array_equal(host, 2)
    assert transfers(buf) == (0, 1)


async def test_large_copies_run_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ub_mod, "ASYNC_COPY_THRESHOLD", 64)
    loop_thread = threading.get_ident()
    copy_threads: list[int] = []

    class SpyBackend(CPUBackend):  # a subclass: copies go through copy_to_device
        def copy_to_device(self, a: Any, **kw: Any) -> Any:
            copy_threads.append(threading.get_ident())
            return super().copy_to_device(a, **kw)

    backend = SpyBackend()
    big = UnifiedBuffer((64,), np.float32, backend=backend).allocate()
    big[:] = 1
    small = UnifiedBuffer((4,), np.float32, backend=backend).allocate()
    small[:] = 1
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await big.ensure_on_device()
    await small.ensure_on_device()
    task.cancel()
    assert copy_threads[0] != loop_thread  # the big copy ran in a worker thread
    assert copy_threads[1] == loop_thread  # the small one inline
    np.testing.assert_array_equal(big.device, 1)


async def test_concurrent_ensures_copy_once() -> None:
    buf = make((1 << 19,)).allocate()  # 2 MiB: threaded
    buf[:] = 3
    results = await asyncio.gather(*(buf.ensure_on_device() for _ in range(4)))
    assert all(r is results[0] for r in results)
    assert transfers(buf) == (1, 0)


# --- the MLX mirror -------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_MLX, reason="MLX is not installed")
def test_metal_mirror_is_lazy_and_writes_back() -> None:
    import mlx.core as mx

    buf = make().allocate()
    buf[:] = 1
    m1 = buf.metal
    m2 = buf.metal
    assert m1 is m2
    assert buf.transfer_stats.host_to_metal == 1
    buf[0] = 5
    m3 = buf.metal
    assert np.array(m3)[0] == 5
    assert buf.transfer_stats.host_to_metal == 2
    m3[1] = 9
    buf.mark_metal_dirty()
    assert buf.host[1] == 9
    assert buf.transfer_stats.metal_to_host == 1
    np.testing.assert_array_equal(buf.device[:2], [5, 9])
    buf.metal = mx.zeros((8,), dtype=mx.float32)
    assert not buf.host.any()
    with pytest.raises(BufferMismatchError, match=r"\(8,\) \(destination\)"):
        buf.metal = mx.zeros((3,), dtype=mx.float32)


@pytest.mark.skipif(not HAS_MLX, reason="MLX is not installed")
def test_metal_dirty_without_current_mirror() -> None:
    buf = make().allocate()
    with pytest.raises(BufferSyncError, match="no current MLX mirror"):
        buf.mark_metal_dirty()
    _ = buf.metal
    buf[0] = 1  # host changed: the mirror is stale
    with pytest.raises(BufferSyncError, match="no current MLX mirror"):
        buf.mark_metal_dirty()


@pytest.mark.skipif(not HAS_MLX, reason="MLX is not installed")
def test_buffer_on_the_metal_backend() -> None:
    import mlx.core as mx

    buf = UnifiedBuffer((4,), np.float32, backend="metal").allocate()
    assert isinstance(buf.device, mx.array)
    assert buf.metal is buf.device
    buf[:] = 2
    assert np.array(buf.device).tolist() == [2, 2, 2, 2]
    buf.metal = buf.device * 3
    assert buf.state is BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.host, 6)
    buf.fill(1)
    np.testing.assert_array_equal(np.array(buf.device), 1)
    buf.copy_from(mx.full((4,), 8.0))
    np.testing.assert_array_equal(buf.host, 8)


# --- property test: random operation sequences against a model ---------------------------

SIZE = 6
values = st.floats(-1e3, 1e3, allow_nan=False, width=32)
index = st.integers(0, SIZE - 1)


class BufferModel(RuleBasedStateMachine):
    """Drives a buffer with random reads and writes on both sides; checks data, state and
    the exact number of copies against a model."""

    @initialize(host=st.booleans(), device=st.booleans())
    def start(self, host: bool, device: bool) -> None:
        if not (host or device):
            host = device = True
        self.buf = make((SIZE,)).allocate(host=host, device=device)
        self.data = np.zeros(SIZE, np.float32)
        self.state = (
            BufferState.SYNCHRONIZED
            if host and device
            else BufferState.HOST_ONLY
            if host
            else BufferState.DEVICE_ONLY
        )
        self.h2d = self.d2h = 0

    # model transitions
    def _read_host(self) -> None:
        if self.state in (BufferState.DEVICE_DIRTY, BufferState.DEVICE_ONLY):
            self.d2h += 1
            self.state = BufferState.SYNCHRONIZED

    def _read_device(self) -> None:
        if self.state in (BufferState.HOST_DIRTY, BufferState.HOST_ONLY):
            self.h2d += 1
            self.state = BufferState.SYNCHRONIZED

    @rule(i=index, v=values)
    def write_host_item(self, i: int, v: float) -> None:
        self.buf[i] = v
        self._read_host()
        self.data[i] = v
        if self.state is BufferState.SYNCHRONIZED:
            self.state = BufferState.HOST_DIRTY

    @rule(i=index, v=values)
    def write_device_item(self, i: int, v: float) -> None:
        dev = self.buf.device
        self._read_device()
        dev[i] = v
        self.buf.mark_device_dirty()
        self.data[i] = v
        if self.state is BufferState.SYNCHRONIZED:
            self.state = BufferState.DEVICE_DIRTY

    @rule()
    def read_host(self) -> None:
        got = self.buf.host.copy()
        self._read_host()
        np.testing.assert_array_equal(got, self.data)

    @rule()
    def read_device(self) -> None:
        got = np.array(self.buf.device)
        self._read_device()
        np.testing.assert_array_equal(got, self.data)

    @rule()
    def ensure_on_device(self) -> None:
        asyncio.run(self.buf.ensure_on_device())
        self._read_device()

    @rule()
    def ensure_on_host(self) -> None:
        asyncio.run(self.buf.ensure_on_host())
        self._read_host()

    @rule()
    def synchronize(self) -> None:
        self.buf.synchronize()
        if self.state is BufferState.HOST_DIRTY:
            self._read_device()
        elif self.state is BufferState.DEVICE_DIRTY:
            self._read_host()

    @rule(v=values)
    def fill(self, v: float) -> None:
        self.buf.fill(v)
        self.data[:] = v
        if self.state not in (BufferState.HOST_ONLY, BufferState.DEVICE_ONLY):
            self.state = BufferState.SYNCHRONIZED

    @rule(data=st.lists(values, min_size=SIZE, max_size=SIZE))
    def copy_from(self, data: list[float]) -> None:
        self.buf.copy_from(np.array(data, np.float32))
        self.data[:] = data
        self.state = (
            BufferState.HOST_ONLY if self.state is BufferState.HOST_ONLY else BufferState.HOST_DIRTY
        )

    @precondition(lambda self: self.state is BufferState.HOST_DIRTY)
    @rule()
    def conflicting_device_mark(self) -> None:
        with pytest.raises(BufferSyncError):
            self.buf.mark_device_dirty()

    @precondition(lambda self: self.state is BufferState.DEVICE_DIRTY)
    @rule()
    def conflicting_host_mark(self) -> None:
        with pytest.raises(BufferSyncError):
            self.buf.mark_host_dirty()

    @invariant()
    def state_and_counters_match(self) -> None:
        assert self.buf.state is self.state
        stats = self.buf.transfer_stats
        assert (stats.host_to_device, stats.device_to_host) == (self.h2d, self.d2h)


BufferModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBufferModel = BufferModel.TestCase
