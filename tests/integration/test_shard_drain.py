"""Draining a shard on the real stack: its cluster moves with its machines, then it is removed.

Two shards split the tiny cloud (six machines each). Cluster ``stay`` lands
on shard-0, cluster ``leaving`` on shard-1 and runs on two of shard-1's
machines; one of shard-1's GPU slots is an idle host. Draining shard-1 must
move ``leaving`` and its configured machines to shard-0, send the operator
there, keep its machines configured, hand the idle host over, move its quota
away, leave no machine owned twice, and empty shard-1 so that it can be removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bigfleet.devstack import DevStack
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import ShardNotEmpty, ShardRemoved
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern, SimulatedCluster
from providers.model import FencingToken
from shard_engine.model import MachineState
from tests.integration.multishard import configured_for, eventually, options, shard

pytestmark = pytest.mark.e2e

SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))


def small_demand(cpu: float) -> DemandPattern:
    """``cpu`` cores on m6i.large machines (two cores each)."""
    return DemandPattern(
        cpu=cpu, memory_gib=1, min_unit_cpu=1, min_unit_memory_gib=1, requirements=(SMALL,)
    )


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(options(tmp_path, empty_database_url))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def _connect(dev: DevStack, cluster_id: str, cpu: float) -> SimulatedCluster:
    assert dev.store is not None
    owner = await dev.store.assign_cluster(cluster_id)
    cluster = SimulatedCluster(
        cluster_id, shard(dev, owner).address, small_demand(cpu), rollup_interval_s=0.5
    )
    cluster.start()
    dev.clusters.append(cluster)
    return cluster


async def _held_as_recorded(dev: DevStack) -> dict[str, str] | None:
    """PostgreSQL's owners, once every shard process holds exactly what they say; else None.

    A handover moves ownership in PostgreSQL first (the donor's activity) and the
    receiver adopts afterwards (its own activity, on its own task queue), so for a
    moment a machine is recorded as the receiver's before the receiver holds it; no
    process acts on it then. A machine held by two processes is never a matter of
    waiting: that fails at once.
    """
    assert dev.store is not None
    owners = await dev.store.owners()
    in_memory: dict[str, str] = {}
    for process in dev.shards:
        for machine_id in process.owned:
            assert machine_id not in in_memory, f"{machine_id} is owned twice in memory"
            in_memory[machine_id] = process.shard_id
    return owners if in_memory == owners else None


async def test_a_drained_shard_hands_over_its_cluster_and_machines_and_is_removed(
    stack: DevStack,
) -> None:
    assert stack.store is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    stay = await _connect(stack, "stay", cpu=1)
    leaving = await _connect(stack, "leaving", cpu=3)
    assert await stack.store.assign_cluster("leaving") == "shard-1"
    donor = shard(stack, "shard-1")
    kept = await eventually(
        lambda: _settled_on(stack, donor, "leaving", at_least=2),
        what="leaving runs on 2 machines and has none in motion",
    )
    kept_ids = {m.id for m in kept}
    # One of shard-1's GPU slots becomes a real, idle host (left over by some cluster).
    idle_id = sorted(m for m in donor.owned if "p5-48xlarge" in m)[0]
    client = next(iter(stack.provider_clients.values()))
    await client.create(idle_id, FencingToken("setup", 1, 1))
    await eventually(
        lambda: (m := donor.engine.machine(idle_id)) is not None and m.state.name == "IDLE",
        what="shard-1 to see its idle machine",
    )

    await stack.store.drain_shard("shard-1")
    with pytest.raises(ShardNotEmpty):
        await stack.store.remove_shard("shard-1")

    receiver = shard(stack, "shard-0")
    await eventually(
        lambda: leaving.shard_address == receiver.address and leaving.connected.is_set(),
        what="the operator to reconnect to shard-0",
    )
    assert leaving.redirects == [receiver.address]
    assert [c.shard_id for c in await stack.store.clusters() if c.cluster_id == "leaving"] == [
        "shard-0"
    ]
    await eventually(lambda: _empty(stack, "shard-1"), what="shard-1 to own nothing")

    # The operator kept its machines: the same ones, still configured, now shard-0's.
    assert {m.id for m in await configured_for(stack, "leaving")} == kept_ids
    owners = await eventually(
        lambda: _held_as_recorded(stack), what="shard-0 to adopt what it was handed"
    )
    assert {owners[m] for m in kept_ids} == {"shard-0"}
    assert not kept_ids & set(donor.owned)
    assert not [m for m in donor.engine.machines() if m.cluster == "leaving"]
    # Adopted machines enter the engine once the provider has been asked about them.
    await eventually(
        lambda: {m.id for m in receiver.engine.machines() if m.cluster == "leaving"} == kept_ids,
        what="shard-0's engine to hold the leaving cluster's machines",
    )
    assert stay.connected.is_set() and stay.redirects == []

    async def moved() -> list[tuple[str | None, str | None, str]] | None:
        # The move's outcome lands after the operator was redirected: wait for it.
        moves = [
            (i.donor_shard, i.receiver_shard, i.status)
            for i in await stack.store.instructions(limit=200)  # type: ignore[union-attr]
            if i.kind == "cluster-move"
        ]
        return moves if all(status != "pending" for _, _, status in moves) else None

    assert await eventually(moved, what="the cluster move's outcome") == [
        ("shard-1", "shard-0", "applied")
    ]
    # The idle machine was handed over, not left behind or deleted.
    assert owners[idle_id] == "shard-0"
    await eventually(
        lambda: (m := receiver.engine.machine(idle_id)) is not None and m.state.name == "IDLE",
        what="shard-0's engine to hold the idle machine",
    )

    async def handed_over() -> bool:
        # The handover's outcome is recorded after the ownership moved: wait for it.
        return any(
            i.kind == "handover" and i.status == "applied" and idle_id in str(i.payload)
            for i in await stack.store.instructions(limit=200)  # type: ignore[union-attr]
        )

    await eventually(handed_over, what="the handover's outcome to be recorded")

    # An operator that still dials the old shard is sent to the new one.
    stray = SimulatedCluster("leaving", donor.address, small_demand(3), rollup_interval_s=0.5)
    stray.start()
    try:
        await eventually(lambda: stray.redirects, what="a stray operator to be redirected")
        assert stray.redirects == [receiver.address]
    finally:
        await stray.stop()

    await stack.store.remove_shard("shard-1")
    removed = await stack.store.shard("shard-1")
    assert removed is not None and removed.state == "removed"
    assert len(await stack.store.owners()) == 12
    # A process started for the removed shard refuses to start instead of standing by.
    assert stack.client is not None
    late = ShardProcess(
        ShardOptions(shard_id="shard-1", holder="late", listen="127.0.0.1:0"),
        store=stack.store,
        temporal=stack.client,
        providers=stack.provider_clients,
    )
    with pytest.raises(ShardRemoved):
        await late.start()


async def _settled_on(
    dev: DevStack, process: ShardProcess, cluster: str, *, at_least: int
) -> list[provider_pb2.Machine] | None:
    """The cluster's configured machines, once there are ``at_least`` of them and the
    shard's engine holds no other machine for it (none being created, configured,
    drained or replaced). Recording them earlier races a machine still on its way:
    under load a create can outlive its deadline, be replaced, and configure after."""
    found = await configured_for(dev, cluster)
    held = {m.id: m.state for m in process.engine.machines() if m.cluster == cluster}
    settled = all(state is MachineState.CONFIGURED for state in held.values()) and (
        cluster not in process.engine.in_flight().values()
    )
    if len(found) >= at_least and settled and set(held) == {m.id for m in found}:
        return found
    return None


async def _empty(dev: DevStack, shard_id: str) -> bool:
    assert dev.store is not None
    row = await dev.store.shard(shard_id)
    return row is not None and row.clusters == 0 and row.machines == 0
