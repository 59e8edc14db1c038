"""The first-fit arena behind the GPU tier's memory slabs (no GPU, no Numba needed)."""

from __future__ import annotations

import pytest

from pydotcompute.exceptions import InvalidConfigurationError
from pydotcompute.ring_kernels.tiers.gpu.slab import ALIGN, Arena, default_chunk_bytes


def test_allocations_are_aligned_and_disjoint() -> None:
    a = Arena(4096)
    offs = [a.alloc(n) for n in (1, 300, 256, 700)]
    assert offs == [0, 256, 768, 1024]
    assert all(o is not None and o % ALIGN == 0 for o in offs)
    assert a.bytes_free == 4096 - 1792
    assert a.alloc(4096) is None  # does not fit


def test_released_ranges_merge_with_their_neighbours() -> None:
    a = Arena(4 * ALIGN)
    x, y, z, w = (a.alloc(ALIGN) for _ in range(4))
    assert a.alloc(1) is None
    for off in (y, x, w, z):  # out of order
        assert off is not None
        a.release(off)
    assert a.free == [(0, 4 * ALIGN)]
    assert a.alloc(4 * ALIGN) == 0


def test_first_fit_reuses_a_hole() -> None:
    a = Arena(8 * ALIGN)
    x = a.alloc(2 * ALIGN)
    a.alloc(ALIGN)
    assert x is not None
    a.release(x)
    assert a.alloc(ALIGN) == 0
    assert a.alloc(ALIGN) == ALIGN
    assert a.alloc(ALIGN) == 3 * ALIGN


def test_the_chunk_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYDOTCOMPUTE_GPU_SLAB_MB", raising=False)
    assert default_chunk_bytes() == 64 << 20
    monkeypatch.setenv("PYDOTCOMPUTE_GPU_SLAB_MB", "0.5")
    assert default_chunk_bytes() == 1 << 19
    monkeypatch.setenv("PYDOTCOMPUTE_GPU_SLAB_MB", "lots")
    with pytest.raises(InvalidConfigurationError, match="got 'lots'"):
        default_chunk_bytes()
