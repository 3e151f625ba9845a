"""Scarce capacity spread over quota groups: even placement, and a shortfall filled by
several donations (ADR 0111).

The cloud has four g5.xlarge machines, and each is a quota group of its own:
on-demand and spot, in two zones. Two shards, one coordinator, real Temporal,
real PostgreSQL, the simulated cloud over gRPC. The coordinator must give each
shard two of them (not all four to the first), and a cluster asking for four
g5.xlarge must get them although the two it lacks are two different profiles
at the other shard.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bigfleet.devstack import DevStack
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern, SimulatedCluster
from tests.integration.multishard import configured_for, eventually, options, shard

pytestmark = pytest.mark.e2e

GPU_SPREAD = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_spread_cloud.json"
G5 = ("node.kubernetes.io/instance-type", 1, ("g5.xlarge",))


def g5_demand(machines: int) -> DemandPattern:
    """``machines`` whole g5.xlarge machines' worth of GPUs (one each), any zone or capacity."""
    return DemandPattern(
        cpu=1,
        memory_gib=1,
        gpus=float(machines),
        min_unit_gpus=1.0,
        min_unit_cpu=1,
        min_unit_memory_gib=1,
        priority=500_000,
        requirements=(G5,),
    )


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(options(tmp_path, empty_database_url, catalog_path=GPU_SPREAD))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def _g5_by_shard(dev: DevStack) -> dict[str, list[str]]:
    assert dev.store is not None
    out: dict[str, list[str]] = {"shard-0": [], "shard-1": []}
    for machine_id, owner in (await dev.store.owners()).items():
        if "g5-xlarge" in machine_id:
            out[owner].append(machine_id)
    return out


async def _four(dev: DevStack, cluster: str) -> list[provider_pb2.Machine] | None:
    found = await configured_for(dev, cluster)
    return found if len(found) >= 4 else None


async def test_four_gpu_machines_in_four_quota_groups_go_two_to_each_shard(
    stack: DevStack,
) -> None:
    await eventually(
        lambda: all(len(p.owned) == 6 for p in stack.shards), what="6 machines per shard"
    )
    owned = await _g5_by_shard(stack)
    assert sorted(len(ids) for ids in owned.values()) == [2, 2], owned


async def test_a_shortfall_of_four_g5_is_filled_by_donations_of_two_profiles(
    stack: DevStack,
) -> None:
    assert stack.store is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    receiver = await stack.store.assign_cluster("g5-team")
    cluster = SimulatedCluster(
        "g5-team", shard(stack, receiver).address, g5_demand(4), rollup_interval_s=0.5
    )
    cluster.start()
    stack.clusters.append(cluster)
    machines = await eventually(
        lambda: _four(stack, "g5-team"), within=120, what="4 g5.xlarge configured"
    )
    assert len(machines) == 4
    # Four quota groups: two zones times on-demand and spot.
    assert len({(m.zone, m.capacity_type) for m in machines}) == 4
    owned = await _g5_by_shard(stack)
    assert len(owned[receiver]) == 4, "every g5.xlarge now belongs to the cluster's shard"
    donations = [
        i
        for i in await stack.store.instructions()
        if i.status == "applied" and i.kind == "speculative" and i.receiver_shard == receiver
    ]
    assert len(donations) >= 2, [(i.kind, i.outcome) for i in donations]
