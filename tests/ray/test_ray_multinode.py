"""The Ray tier beyond one machine, on `ray.cluster_utils.Cluster`: a head and a second
node, both raylets on 127.0.0.1 (traffic stays on loopback).

The second node offers a custom resource ``far``, the head ``near``: a kernel that asks
for one runs there. The module stops the suite's local Ray instance, runs on its own
cluster, and starts the local instance again when it is done.

Every node binds ``127.0.0.2``, a loopback address, through the public ``node_ip_address``
argument. Not ``127.0.0.1``: Ray rewrites an address it calls local (``localhost``,
``127.0.0.1``, ``::1``) given to ``ray.init`` into the machine's outward address, where a
cluster bound to loopback does not answer; turning that off takes a private flag
(``ray._private.ray_constants.ENABLE_RAY_CLUSTER``). The rest of 127.0.0.0/8 is loopback
on Linux (Ray clusters run on Linux only), so every hop still stays on this machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from conftest import shipped, start_local_ray
from ray.cluster_utils import Cluster
from ray_test_actors import Num, Text, where_am_i

from pydotcompute import KernelState, RingKernelRuntime
from tests import tier_scenarios as sc

pytestmark = pytest.mark.ray

LOOPBACK = "127.0.0.2"  # see the module notes: loopback, yet not rewritten by Ray
BOUND_S = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head (2 CPUs, ``near``) and a node with ``far`` (its `Node` in ``cluster.far``),
    the driver connected to them."""
    ray.shutdown()
    made = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"near": 4},
            "node_ip_address": LOOPBACK,
            "include_dashboard": False,
        },
    )
    try:
        made.far = made.add_node(num_cpus=1, resources={"far": 1}, node_ip_address=LOOPBACK)
        ray.init(
            address=made.address,
            runtime_env=shipped(),
            logging_level="ERROR",
            log_to_driver=False,
        )
        yield made
    finally:
        ray.shutdown()
        made.shutdown()
    start_local_ray()


async def _pipeline(rt: RingKernelRuntime, *, restart: bool = False) -> None:
    """a (asyncio) -> b (ray, on the far node; it answers each Job with a Done, after the
    job's pause) -> c (ray, on the head)."""
    await rt.launch("a", sc.relay_async, input_type=sc.Job, output_type=sc.Job, queue_size=64)
    await rt.launch(
        "b",
        sc.echo_async,
        input_type=sc.Job,
        output_type=sc.Done,
        tier="ray",
        num_cpus=0,
        resources={"far": 1},
        **({"restart": "on_failure", "max_restarts": None} if restart else {}),
    )
    await rt.launch(
        "c",
        sc.relay_async,
        input_type=sc.Done,
        output_type=sc.Done,
        tier="ray",
        num_cpus=0,
        resources={"near": 1},
    )
    rt.connect("a", "b")
    rt.connect("b", "c")
    for kid in "abc":
        await rt.activate(kid)


async def test_placement_by_resources(cluster: Any) -> None:
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await rt.launch(
            "w", where_am_i, input_type=Num, output_type=Text, tier="ray", resources={"far": 1}
        )
        await rt.activate("w")
        node = (await rt.send_and_receive("w", Num(value=0), timeout=30)).text.split("|")[0]
        assert node == cluster.far.node_id
        assert node != ray.get_runtime_context().get_node_id()  # not the head's


async def test_cross_node_pipeline_exactly_once_in_order(cluster: Any) -> None:
    n = 2000
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _pipeline(rt)
        assert rt.get_kernel("b").direct_edge == "c"  # b's actor hands c's actor batches

        async def feed() -> None:
            for i in range(n):
                await rt.send("a", sc.Job(seq=i))

        feeding = asyncio.create_task(feed())
        got = [(await rt.receive("c", timeout=30)).seq for _ in range(n)]
        await feeding
        assert got == list(range(n))
        # the driver carried control only: nothing of b's came back to it
        assert rt.get_kernel("b").worker.replies_fetched == 0
        assert sum(rt.get_telemetry(k).messages_dropped for k in "abc") == 0


async def test_node_lost_mid_stream(cluster: Any) -> None:
    """The far node goes while messages flow: Ray restarts b on a new node; a waits (it
    does not fail), what died with b is counted, the stream resumes by itself, in order."""
    n = 3000
    async with asyncio.timeout(BOUND_S), RingKernelRuntime() as rt:
        await _pipeline(rt, restart=True)
        # a node with the resource is there for Ray to restart b on
        lost_node = cluster.far
        cluster.far = cluster.add_node(num_cpus=1, resources={"far": 1}, node_ip_address=LOOPBACK)
        sent: list[int] = []

        async def feed() -> None:
            for i in range(n):
                # a millisecond each at b: b holds messages when its node goes
                await rt.send("a", sc.Job(seq=i, payload="sleep:0.001"))
                sent.append(i)

        feeding = asyncio.create_task(feed())
        got = [(await rt.receive("c", timeout=30)).seq for _ in range(300)]
        cluster.remove_node(lost_node)
        await feeding  # a's sends waited while b restarted; none failed
        assert len(sent) == n
        b = rt.get_kernel("b")
        # read until the last message: the stream resumes by itself once Ray has restarted
        # b (seconds: Ray notices the node is gone, then starts b on the new one), then
        # look a while longer for anything delivered twice
        while not got or got[-1] != n - 1:
            try:
                got.append((await rt.receive("c", timeout=60)).seq)
            except TimeoutError:
                pytest.fail(f"the stream did not resume: {len(got)} read, the last {got[-1]}")
        while True:
            try:
                got.append((await rt.receive("c", timeout=1)).seq)
            except TimeoutError:
                break
        assert b.restarts == 1
        assert rt.get_kernel_state("b") is KernelState.ACTIVE
        assert got == sorted(got), "out of order"
        assert len(got) == len(set(got)), "delivered twice"
        assert got[-1] == n - 1, "the stream did not resume"
        tels = [rt.get_telemetry(k) for k in "abc"]
        lost = tels[1].drop_reasons().get("actor_lost", 0)
        assert lost > 0  # the point of the test: b held messages when its node went
        # each message read once or counted once (at most once for those lost with b)
        assert len(got) + sum(t.messages_dropped for t in tels) == n
        assert sum(t.messages_dropped for t in tels) == lost
        report = await rt.shutdown()
        assert report == {"b": lost}, report  # the shutdown report counts them too
