"""The process tier's file descriptors in the parent: a few per kernel, all released.

Real child processes, counted through ``/proc/self/fd``: a runtime must not run out of
descriptors (a default soft limit of 1,024) at a few dozen process kernels.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pydotcompute import RingKernelRuntime
from tests import tier_scenarios as sc

BOUND_S = sc.BOUND_S
PER_KERNEL = 4  # the socket, the space pipe, the status pipe, the child's sentinel
SHARED = 3  # the watcher's wake-up pipe, and one spare for the runtime's own

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc/self/fd"
)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _launch(rt: RingKernelRuntime, ids: list[str]) -> None:
    for kid in ids:
        await rt.launch(kid, sc.echo_sync, tier="process", input_type=sc.Job)
        await rt.activate(kid)


async def test_process_kernels_hold_few_descriptors_and_release_them() -> None:
    n = 8
    async with asyncio.timeout(BOUND_S * 3):
        # one kernel first: what is started once per process (the resource tracker, the
        # loop's executor) is not counted
        async with RingKernelRuntime() as rt:
            await _launch(rt, ["warm"])
            await rt.send_and_receive("warm", sc.Job(seq=0), timeout=BOUND_S)
        before = _open_fds()
        async with RingKernelRuntime() as rt:
            ids = [f"k{i}" for i in range(n)]
            await _launch(rt, ids)
            for i, kid in enumerate(ids):  # each one carries a round trip
                reply = await rt.send_and_receive(kid, sc.Job(seq=i), timeout=BOUND_S)
                assert reply.seq == i
            grown = _open_fds() - before
            assert grown <= PER_KERNEL * n + SHARED, (
                f"{n} process kernels hold {grown} descriptors in the parent"
            )
        assert _open_fds() == before, "descriptors left open after the runtime ended"


_SCRIPT = """
import resource
import sys

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
lowered = min(hard, 256) if hard != resource.RLIM_INFINITY else 256
resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))

from pydotcompute.ring_kernels import CythonRingKernel
from tests import tier_scenarios as sc

if __name__ == "__main__":
    with CythonRingKernel("k", sc.echo_sync) as kernel:
        kernel.send(sc.Job(seq=1))
        assert kernel.receive(timeout=30.0).seq == 1
    print(lowered, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
"""


def test_first_process_kernel_raises_the_soft_descriptor_limit(tmp_path: Path) -> None:
    resource = pytest.importorskip("resource")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard descriptor limit is {hard}: nothing to raise")
    script = tmp_path / "limit.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=BOUND_S * 2,
        cwd=root,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lowered, soft, hard_seen = (int(x) for x in done.stdout.split())
    assert soft > lowered, "the soft limit stayed where it was"
    assert soft <= hard_seen
