"""MemoryPool: size classes, reuse, LRU eviction under a byte limit, statistics, misuse."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydotcompute.backends import MetalBackend
from pydotcompute.core import MemoryPool, configure_memory_pool, get_memory_pool
from pydotcompute.core.memory_pool import MIN_BLOCK, PoolStatistics, size_class
from pydotcompute.exceptions import BufferNotAllocatedError, InvalidConfigurationError


@given(st.integers(0, 1 << 34))
def test_size_class_bounds(nbytes: int) -> None:
    cls = size_class(nbytes)
    assert cls >= nbytes
    assert cls >= MIN_BLOCK
    if nbytes > MIN_BLOCK:
        assert cls <= nbytes * 1.25 + 1
    assert size_class(cls) == cls  # a class is its own class


@given(st.integers(0, 1 << 30), st.integers(0, 1 << 30))
def test_size_class_is_monotone(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert size_class(lo) <= size_class(hi)


def test_examples_of_size_classes() -> None:
    assert [size_class(n) for n in (0, 512, 513, 1024, 1025, 1300, 1600, 1900)] == [
        512, 512, 640, 1024, 1280, 1536, 1792, 2048,
    ]  # fmt: skip


def test_acquire_returns_typed_view() -> None:
    pool = MemoryPool.create()
    a = pool.acquire((3, 4), np.int16)
    assert a.shape == (3, 4)
    assert a.dtype == np.int16
    a[:] = 7
    assert (a == 7).all()
    pool.release(a)


def test_release_then_acquire_reuses_memory() -> None:
    pool = MemoryPool.create()
    a = pool.acquire(1000, np.float32)
    pool.release(a)
    b = pool.acquire(900, np.float32)  # same size class (4000 B and 3600 B -> 4096 B)
    assert np.shares_memory(a, b)
    s = pool.get_stats()
    assert (s.hits, s.misses, s.acquires, s.releases) == (1, 1, 2, 1)
    assert s.hit_rate == 0.5
    assert s.blocks_in_use == 1
    assert s.bytes_in_use == size_class(4000)
    pool.release(b)


def test_different_size_classes_do_not_share() -> None:
    pool = MemoryPool.create()
    a = pool.acquire(1000, np.float32)
    pool.release(a)
    b = pool.acquire(2000, np.float32)
    assert not np.shares_memory(a, b)
    assert pool.get_stats().misses == 2


def test_most_recently_released_block_is_reused_first() -> None:
    pool = MemoryPool.create()
    a, b = pool.acquire(256), pool.acquire(256)
    pool.release(a)
    pool.release(b)
    assert np.shares_memory(pool.acquire(256), b)


def test_lru_eviction_under_limit() -> None:
    block = size_class(4096)
    pool = MemoryPool(max_bytes=2 * block)
    first, second = pool.acquire(1024), pool.acquire(1024)
    third = pool.acquire(1024)  # over the limit while in use: allowed, nothing cached to drop
    assert pool.get_stats().evictions == 0
    pool.release(first)  # 3 blocks held > 2: the released block goes at once
    s = pool.get_stats()
    assert (s.evictions, s.blocks_cached) == (1, 0)
    pool.release(second)
    pool.release(third)
    s = pool.get_stats()
    assert s.blocks_cached == 2
    assert s.total_bytes <= 2 * block
    # touch order: second released before third, so a new block evicts second first
    big = pool.acquire(8192)  # a different class; holding it pushes the total over the limit
    s = pool.get_stats()
    assert s.evictions == 3  # both cached 4 KiB blocks dropped (8 KiB alone fills the limit)
    again = pool.acquire(1024)
    assert not np.shares_memory(again, third)
    pool.release(big)
    pool.release(again)


def test_lru_keeps_recently_used() -> None:
    block = size_class(400)
    pool = MemoryPool(max_bytes=3 * block)
    x, y = pool.acquire(100), pool.acquire(200)  # 400 B and 800 B -> two classes
    pool.release(x)
    pool.release(y)
    z = pool.acquire(100)  # hit: x's block is in use again
    assert np.shares_memory(z, x)
    pool.set_limit(block / 2**20)  # only one block fits now: y's block (LRU) is evicted
    s = pool.get_stats()
    assert s.evictions == 1
    assert s.blocks_cached == 0
    pool.release(z)


def test_set_limit_validation_and_removal() -> None:
    pool = MemoryPool.create()
    with pytest.raises(InvalidConfigurationError, match="limit must be >= 0 MiB"):
        pool.set_limit(-1)
    pool.set_limit(1)
    assert pool.limit_bytes == 2**20
    pool.set_limit(0)
    assert pool.limit_bytes is None
    with pytest.raises(InvalidConfigurationError, match="max_bytes must be a non-negative int"):
        MemoryPool(max_bytes=-5)


def test_release_of_foreign_or_released_array() -> None:
    pool = MemoryPool.create()
    with pytest.raises(
        BufferNotAllocatedError, match=r"cannot release ndarray float64 \(3,\): it was not acquired"
    ):
        pool.release(np.zeros(3))
    a = pool.acquire(10)
    pool.release(a)
    with pytest.raises(BufferNotAllocatedError, match="already released"):
        pool.release(a)


def test_pooled_buffer_releases_on_error() -> None:
    pool = MemoryPool.create()
    shapes = []

    def use_and_fail() -> None:
        with pool.pooled_buffer((4, 4)) as arr:
            shapes.append(arr.shape)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        use_and_fail()
    assert shapes == [(4, 4)]
    s = pool.get_stats()
    assert (s.blocks_in_use, s.blocks_cached) == (0, 1)
    with pool.pooled_buffer(16) as arr2:
        pool.release(arr2)  # an early release inside the block is tolerated
    assert pool.get_stats().blocks_in_use == 0


def test_disabled_pool_never_caches() -> None:
    pool = MemoryPool(enabled=False)
    for _ in range(3):
        pool.release(pool.acquire(100))
    s = pool.get_stats()
    assert (s.hits, s.misses, s.blocks_cached, s.enabled) == (0, 3, 0, False)
    pool.enable()
    pool.release(pool.acquire(100))
    pool.release(pool.acquire(100))
    assert pool.get_stats().hits == 1
    pool.disable()
    assert pool.get_stats().blocks_cached == 0


def test_free_all_blocks_and_reset_stats() -> None:
    pool = MemoryPool.create()
    pool.release(pool.acquire(1000))
    assert pool.free_all_blocks() == size_class(4000)
    assert pool.get_stats().bytes_cached == 0
    pool.reset_stats()
    assert pool.get_stats().acquires == 0


def test_locations_on_the_cpu_backend() -> None:
    pool = MemoryPool(backend="cpu")
    dev = pool.acquire(10, location="device")
    pinned = pool.acquire(10, location="pinned")
    assert isinstance(dev, np.ndarray)
    assert isinstance(pinned, np.ndarray)
    by_loc = pool.get_stats().bytes_by_location
    assert by_loc["device"] == by_loc["pinned"] == MIN_BLOCK
    assert pool.get_pinned_stats()["bytes_in_use"] == MIN_BLOCK
    pool.release(dev)
    pool.release(pinned)
    host = pool.acquire(10)
    assert not np.shares_memory(host, dev)  # locations never share blocks
    with pytest.raises(
        InvalidConfigurationError, match="location must be one of host, device, pinned"
    ):
        pool.acquire(10, location="gpu")  # type: ignore[arg-type]


@pytest.mark.skipif(not MetalBackend().is_available, reason="MLX is not installed")
def test_metal_device_acquire_passes_through() -> None:
    import mlx.core as mx

    pool = MemoryPool(backend="metal")
    arr = pool.acquire(4, location="device")
    assert isinstance(arr, mx.array)
    assert pool.get_stats().misses == 1


@pytest.mark.skipif(not MetalBackend().is_available, reason="MLX is not installed")
def test_metal_device_acquire_can_be_released() -> None:
    import mlx.core as mx

    pool = MemoryPool(backend="metal")
    arr = pool.acquire((2, 3), np.float32, location="device")
    assert isinstance(arr, mx.array)
    assert arr.shape == (2, 3)
    assert arr.dtype == mx.float32
    s = pool.get_stats()
    assert (s.blocks_in_use, s.bytes_in_use) == (1, 24)
    assert s.bytes_by_location["device"] == 24
    pool.release(arr)
    s = pool.get_stats()
    assert (s.releases, s.blocks_in_use, s.bytes_in_use) == (1, 0, 0)
    assert s.blocks_cached == 0  # MLX caches its own buffers: nothing is kept here
    with pytest.raises(BufferNotAllocatedError, match="already released"):
        pool.release(arr)
    with pool.pooled_buffer(8, np.int32, location="device") as buf:
        assert buf.dtype == mx.int32
        assert pool.get_stats().blocks_in_use == 1
    assert pool.get_stats().blocks_in_use == 0


def test_concurrent_acquire_release_keeps_counts_consistent() -> None:
    pool = MemoryPool(max_bytes=64 * 1024)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                arr = pool.acquire(int(rng.integers(1, 2000)), np.float32)
                arr[:] = seed
                assert (arr == seed).all()  # nobody else writes into a block we hold
                pool.release(arr)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    s = pool.get_stats()
    assert s.acquires == s.releases == 800
    assert s.hits + s.misses == 800
    assert s.blocks_in_use == 0
    assert s.bytes_cached <= 64 * 1024


def test_process_wide_pool_and_configure() -> None:
    pool = get_memory_pool()
    assert get_memory_pool() is pool
    saved_limit, saved_enabled = pool.limit_bytes, pool.enabled
    try:
        assert configure_memory_pool(limit_mb=2, enabled=True) is pool
        assert pool.limit_bytes == 2 * 2**20
        configure_memory_pool(enabled=False)
        assert not pool.enabled
    finally:
        pool.set_limit((saved_limit or 0) / 2**20)
        if saved_enabled:
            pool.enable()
    assert "MemoryPool" in repr(pool)


# --- the shapes code written for 0.2 calls ---------------------------------------------


def test_pool_statistics_built_the_0_2_way() -> None:
    s = PoolStatistics(3 * 2**20, 4 * 2**20, 2)  # used_bytes, total_bytes, n_free_blocks
    assert (s.used_bytes, s.total_bytes, s.n_free_blocks) == (3 * 2**20, 4 * 2**20, 2)
    assert s.free_bytes == 2**20
    assert s.utilization == pytest.approx(0.75)
    assert (s.used_mb, s.total_mb) == (pytest.approx(3.0), pytest.approx(4.0))
    assert PoolStatistics().utilization == 0.0  # an empty pool: no division by zero


def test_pool_statistics_0_2_fields_follow_the_pool() -> None:
    pool = MemoryPool.create()
    a = pool.acquire(1024, np.uint8)
    b = pool.acquire(2048, np.uint8)
    pool.release(b)
    s = pool.get_stats()
    assert (s.used_bytes, s.total_bytes, s.n_free_blocks) == (1024, 3072, 1)
    assert (s.bytes_in_use, s.bytes_cached, s.blocks_cached) == (1024, 2048, 1)
    assert s.free_bytes == 2048
    assert s.utilization == pytest.approx(1 / 3)
    pool.release(a)


def test_memory_pool_built_the_0_2_way() -> None:
    pool = MemoryPool(initial_size_mb=0, max_size_mb=None)
    assert pool.limit_bytes is None
    bounded = MemoryPool(1, 2)  # positionally: initial_size_mb, max_size_mb
    assert bounded.limit_bytes == 2 * 2**20
    assert bounded.initial_size_mb == 1
    a = bounded.acquire(3 * 2**20, np.uint8)  # in use is never refused...
    bounded.release(a)
    assert bounded.get_stats().bytes_cached == 0  # ...but not kept above the bound
    assert bounded.get_stats().evictions == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial_size_mb": -1}, r"initial_size_mb must be >= 0, got -1"),
        ({"max_size_mb": -2}, r"max_size_mb must be >= 0 or None, got -2"),
        ({"initial_size_mb": 8, "max_size_mb": 4}, r"initial_size_mb=8 is above .* 4 MiB"),
        ({"max_size_mb": 1, "max_bytes": 5}, r"max_size_mb=1 and max_bytes=5 disagree"),
    ],
)
def test_memory_pool_0_2_arguments_checked(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=match):
        MemoryPool(**kwargs)  # type: ignore[arg-type]


def test_configure_memory_pool_the_0_2_way() -> None:
    pool = get_memory_pool()
    saved_limit, saved_enabled = pool.limit_bytes, pool.enabled
    try:
        pool.disable()
        assert configure_memory_pool(initial_size_mb=0, max_size_mb=3, enable=True) is pool
        assert (pool.limit_bytes, pool.enabled) == (3 * 2**20, True)
        configure_memory_pool(0, None, False)  # positionally; None leaves the bound
        assert (pool.limit_bytes, pool.enabled) == (3 * 2**20, False)
        configure_memory_pool()  # 0.2's default turns caching on
        assert pool.enabled
        with pytest.raises(InvalidConfigurationError, match="initial_size_mb=9 is above"):
            configure_memory_pool(initial_size_mb=9, max_size_mb=3)
    finally:
        pool.set_limit((saved_limit or 0) / 2**20)
        if saved_enabled:
            pool.enable()
        else:
            pool.disable()


def test_memory_pool_repr_shows_state() -> None:
    pool = MemoryPool(max_bytes=4096)
    a = pool.acquire(512, np.uint8)
    assert repr(pool) == (
        "MemoryPool(enabled=True, used=0.00MB, total=0.00MB, cuda=False, cached=0B, "
        "limit=4096B, hits=0, misses=1, evictions=0)"
    )
    pool.release(a)
    pool.disable()
    assert repr(pool).startswith("MemoryPool(enabled=False, ")
