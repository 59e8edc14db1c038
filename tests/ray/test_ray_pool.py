"""Ray refuses worker pools at launch: each kernel is one Ray actor."""

from __future__ import annotations

import pytest
from ray_test_actors import double_actor

from pydotcompute.distributed.ray import RayRingKernelRuntime
from pydotcompute.exceptions import InvalidConfigurationError


async def test_replicas_refused_at_launch(ray_runtime: RayRingKernelRuntime) -> None:
    with pytest.raises(
        InvalidConfigurationError, match=r"replicas=2 is not supported on the ray tier"
    ):
        await ray_runtime.launch("pool", double_actor, replicas=2)
    assert "pool" not in ray_runtime.kernel_ids
