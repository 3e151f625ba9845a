"""End to end on EC2: the dev stack with the EC2 provider (``bigfleet dev --ec2``)
against a local EC2 API server (moto), a demo cluster served by real
instances, and a spot interruption warning on the SQS queue followed by EC2
reclaiming the instance: the machine leaves the cluster and is replaced.

What moto does not do, the test does in EC2's place: it sends the
EventBridge warning to the queue and terminates the instance (EC2 reclaims a
spot instance about two minutes after its warning).
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
    assert noticed.state == pb.MACHINE_STATE_CONFIGURED

    local.reclaim(victim.host.ref)

    async def reclaimed() -> pb.Machine | None:
        machine = await provider.get(victim.id)
        return machine if machine.state != pb.MACHINE_STATE_CONFIGURED else None

    gone = await eventually(reclaimed, within=30, what="the reclaimed machine leaving CONFIGURED")
    assert gone.cluster == ""
    assert gone.state == pb.MACHINE_STATE_FAILED
    assert gone.last_error.startswith("spot interruption")
    await eventually(
        lambda: victim.id not in {n.machine_id for n in cluster.configured_nodes()},
        within=60,
        what="the operator told the interrupted node left",
    )

    async def replaced() -> list[pb.Machine]:
        now = await serving()
        return now if now and victim.id not in {m.id for m in now} else []

    await eventually(replaced, within=120, what="the cluster's cores served again without it")
