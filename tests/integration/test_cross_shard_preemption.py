"""The paper's GPU story across shards.

Cluster ``a`` (priority 500000) holds every GPU machine of the tiny cloud, half
of them on loan from the other shard. Cluster ``b`` (priority 1000000) on the other
shard then asks for two with nothing free anywhere. Its shortfall escalates;
the coordinator has shard-0 drain two of A's machines with the grace the
priority gap gives (exactly 500000 -> 2 minutes), ownership moves, and
shard-1 configures them for B.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from bigfleet.devstack import DevStack
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import SimulatedCluster
from tests.integration.multishard import configured_for, eventually, gpu_demand, options, shard
from workflows import search_attributes as sa

pytestmark = pytest.mark.e2e


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(options(tmp_path, empty_database_url))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def _at_least(stack: DevStack, cluster: str, n: int) -> list[provider_pb2.Machine] | None:
    found = await configured_for(stack, cluster)
    return list(found) if len(found) >= n else None


async def test_a_higher_priority_on_another_shard_preempts_with_the_gap_scaled_grace(
    stack: DevStack,
) -> None:
    assert stack.store is not None and stack.client is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    # A lands on shard-0 (first contact) and takes all four GPU machines.
    owner_a = await stack.store.assign_cluster("a")
    a = SimulatedCluster("a", shard(stack, owner_a).address, gpu_demand(4, priority=500_000))
    a.start()
    stack.clusters.append(a)
    await eventually(lambda: _at_least(stack, "a", 4), within=90, what="A holding 4 GPU machines")

    owner_b = await stack.store.assign_cluster("b")
    assert owner_b != owner_a
    b = SimulatedCluster("b", shard(stack, owner_b).address, gpu_demand(2, priority=1_000_000))
    b.start()
    stack.clusters.append(b)
    got = await eventually(
        lambda: _at_least(stack, "b", 2), within=120, what="B configured by preemption"
    )
    assert len(got) == 2
    assert len(await configured_for(stack, "a")) == 2, "A keeps the machines not needed"

    # The drains ran on the donor with the table's grace, each its own workflow.
    drains = [
        wf
        async for wf in stack.client.list_workflows(
            f"BigFleetOperation='drain' AND BigFleetShardId='{owner_a}'"
        )
    ]
    assert len(drains) == 2
    for wf in drains:
        assert wf.status == WorkflowExecutionStatus.COMPLETED
        assert wf.typed_search_attributes.get(sa.GRACE_SECONDS) == 120
    # Ownership moved by CAS: B's machines belong to B's shard, nobody owns twice.
    owners = await stack.store.owners([m.id for m in await configured_for(stack, "b")])
    assert set(owners.values()) == {owner_b}
    moved = [
        i for i in await stack.store.instructions() if i.kind == "preempt" and i.status == "applied"
    ]
    assert len(moved) == 1 and moved[0].donor_shard == owner_a
