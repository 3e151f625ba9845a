"""End to end on EC2: the dev stack with the EC2 provider (``bigfleet dev --ec2``)
against a local EC2 API server (moto), a demo cluster served by real
instances, and a spot interruption warning on the SQS queue: the shard
drains the warned machine and replaces it before EC2 takes it back.

What moto does not do, the test does in EC2's place: it sends the
EventBridge warning to the queue. It never terminates the instance; the
drain and the replacement are BigFleet's own doing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bigfleet.devstack import DevStack
from bigfleet.v1alpha1 import capacity_pb2
from bigfleet.v1alpha1 import provider_pb2 as pb
from clusters.operator import DemandPattern
from providers.ec2.local import LocalEc2
from providers.ec2.notices import LABEL, SPOT_WARNING
from shard_engine.quantity import parse_quantity
from tests.e2e.stacks import one_shard
from tests.waiting import eventually
from workflows import search_attributes as sa

pytestmark = pytest.mark.e2e

CLUSTER = "e2e-ec2"
#: Spot only, so the interruption warning has a spot machine to land on.
DEMAND = DemandPattern(
    cpu=6,
    memory_gib=12,
    priority=500_000,
    requirements=(
        ("bigfleet.io/capacity-type", capacity_pb2.NodeSelectorRequirement.OPERATOR_IN, ("spot",)),
    ),
)


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(one_shard(tmp_path, empty_database_url, ((CLUSTER, DEMAND),), ec2=True))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def test_ec2_machines_serve_a_cluster_and_an_interrupted_one_is_replaced(
    stack: DevStack,
) -> None:
    local = stack.local_ec2
    assert isinstance(local, LocalEc2)
    (cluster,) = stack.clusters
    provider = stack.provider_clients["ec2"]

    async def serving() -> list[pb.Machine]:
        listing = await provider.list([pb.MACHINE_STATE_CONFIGURED])
        mine = [m for m in listing.machines if m.cluster == CLUSTER]
        cpu = sum(parse_quantity(m.allocatable.resources["cpu"]) for m in mine)
        return mine if cpu >= DEMAND.cpu else []

    machines = await eventually(serving, within=120, what="the cluster's cores on EC2 machines")
    ec2 = local.client("ec2")
    for machine in machines:
        assert machine.capacity_type == pb.CAPACITY_TYPE_SPOT
        (reservation,) = ec2.describe_instances(InstanceIds=[machine.host.ref])["Reservations"]
        (instance,) = reservation["Instances"]
        assert instance["State"]["Name"] == "running"
        assert instance.get("InstanceLifecycle") == "spot"
    await eventually(
        lambda: {n.machine_id for n in cluster.configured_nodes()} >= {m.id for m in machines},
        within=60,
        what="the operator told about its EC2 nodes",
    )

    victim = machines[0]
    local.send_notice(victim.host.ref, SPOT_WARNING)

    async def warned() -> pb.Machine | None:
        machine = await provider.get(victim.id)
        return machine if machine.interruption_probability == pytest.approx(0.99) else None

    noticed = await eventually(warned, within=30, what="the warning raising the machine's risk")
    assert noticed.labels[LABEL] == "spot-interruption-warning"

    # BigFleet acts on the warning itself: it drains the machine (reason
    # "interruption") and provisions its replacement; nothing here plays EC2
    # reclaiming the instance.
    async def drained() -> pb.Machine | None:
        machine = await provider.get(victim.id)
        return machine if machine.cluster != CLUSTER else None

    left = await eventually(drained, within=60, what="the warned machine drained from its cluster")
    assert left.state in (
        pb.MACHINE_STATE_IDLE,
        pb.MACHINE_STATE_DELETING,
        pb.MACHINE_STATE_DRAINING,
    )
    assert stack.client is not None
    query = f"BigFleetMachineId = '{victim.id}' AND BigFleetOperation = 'drain'"

    async def drain_workflow() -> object | None:
        async for wf in stack.client.list_workflows(query):  # type: ignore[union-attr]
            return wf
        return None

    wf = await eventually(drain_workflow, within=30, what="the drain workflow in Temporal")
    assert wf.typed_search_attributes.get(sa.REASON) == "interruption"  # type: ignore[attr-defined]
    await eventually(
        lambda: victim.id not in {n.machine_id for n in cluster.configured_nodes()},
        within=60,
        what="the operator told the interrupted node left",
    )

    async def replaced() -> list[pb.Machine]:
        now = await serving()
        return now if now and victim.id not in {m.id for m in now} else []

    await eventually(replaced, within=120, what="the cluster's cores served again without it")
