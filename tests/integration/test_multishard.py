"""Two shards, one coordinator, real Temporal, real PostgreSQL, a simulated cloud over gRPC.

The tiny cloud has four GPU machines and eight small ones; the coordinator
splits them evenly, so each shard owns two GPU machines. A cluster asking
for four GPU machines can only be served with help from the other shard.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
from sqlalchemy import text

from bigfleet.devstack import DevStack
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import SimulatedCluster
from providers.errors import Fenced
from providers.model import FencingToken
from tests.integration.multishard import (
    configured_for,
    coordinator_settled,
    eventually,
    gpu_demand,
    options,
    shard,
)
from workflows import coordinator_contracts as co

pytestmark = pytest.mark.e2e


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(options(tmp_path, empty_database_url))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def _owned_gpus(dev: DevStack, shard_id: str) -> list[str]:
    assert dev.store is not None
    owners = await dev.store.owners()
    return sorted(m for m, s in owners.items() if s == shard_id and "p5-48xlarge" in m)


async def _connect(dev: DevStack, cluster_id: str, machines: int) -> SimulatedCluster:
    assert dev.store is not None
    owner = await dev.store.assign_cluster(cluster_id)
    cluster = SimulatedCluster(
        cluster_id, shard(dev, owner).address, gpu_demand(machines), rollup_interval_s=0.5
    )
    cluster.start()
    dev.clusters.append(cluster)
    return cluster


async def test_the_coordinator_splits_quota_evenly_between_shards(stack: DevStack) -> None:
    await eventually(
        lambda: all(len(p.owned) == 6 for p in stack.shards), what="6 machines per shard"
    )
    assert len(await _owned_gpus(stack, "shard-0")) == 2
    assert len(await _owned_gpus(stack, "shard-1")) == 2


async def test_a_shortfall_is_met_with_speculative_quota_from_another_shard(
    stack: DevStack,
) -> None:
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    await _connect(stack, "gpu-b", machines=4)
    machines = await eventually(
        lambda: _four(configured_for(stack, "gpu-b")), within=90, what="4 GPU machines configured"
    )
    assert len(machines) == 4
    assert stack.store is not None
    receiver = await stack.store.assign_cluster("gpu-b")
    assert len(await _owned_gpus(stack, receiver)) == 4
    applied = [i for i in await stack.store.instructions() if i.status == "applied"]
    assert any(i.kind == "speculative" and i.receiver_shard == receiver for i in applied)


async def _four(
    machines: Awaitable[list[provider_pb2.Machine]],
) -> list[provider_pb2.Machine] | None:
    found = await machines
    return found if len(found) >= 4 else None


async def _idle_gpus_on_shard_1(dev: DevStack) -> list[str]:
    """Make shard-1's two GPU slots real idle hosts (left over by a cluster, say); return
    them once shard-0 is offered them."""
    await eventually(lambda: all(len(p.owned) == 6 for p in dev.shards), what="distribution")
    donor_gpus = await _owned_gpus(dev, "shard-1")
    client = next(iter(dev.provider_clients.values()))
    for i, machine_id in enumerate(donor_gpus):
        await client.create(machine_id, FencingToken("setup", 1, i + 1))
    await eventually(
        lambda: (
            sum(
                1
                for m in shard(dev, "shard-1").engine.machines()
                if m.id in donor_gpus and m.state.name == "IDLE"
            )
            == 2
        ),
        what="shard-1 sees two idle GPU machines",
    )
    # shard-0 learns of them after one of its reports that follows a round planned from
    # a report of shard-1's showing them idle. Until then the coordinator would answer a
    # shortfall from the report before, where they were quota (and move none of it).
    await _offered(dev, "shard-0", 2)
    return donor_gpus


async def _offered(dev: DevStack, shard_id: str, machines: int) -> None:
    """Wait until ``shard_id`` is offered ``machines`` idle machines of the other shards."""
    await eventually(
        lambda: sum(o.count for o in shard(dev, shard_id).engine.fleet_idle_offers) == machines,
        within=90,
        what=f"{shard_id} is offered {machines} idle machines of the other shards",
    )


async def test_idle_machines_of_another_shard_are_given_before_new_ones_are_bought(
    stack: DevStack,
) -> None:
    donor_gpus = await _idle_gpus_on_shard_1(stack)
    await _connect(stack, "gpu-a", machines=4)  # first contact: shard-0
    machines = await eventually(
        lambda: _four(configured_for(stack, "gpu-a")), within=90, what="4 GPU machines configured"
    )
    assert {m.id for m in machines} >= set(donor_gpus), "the idle machines were used"
    assert stack.store is not None
    kinds = [i.kind for i in await stack.store.instructions() if i.status == "applied"]
    assert "idle" in kinds and "speculative" not in kinds
    assert set(donor_gpus) <= set(await _owned_gpus(stack, "shard-0")), "ownership moved"


async def test_with_reports_ten_minutes_apart_news_still_reaches_the_coordinator_at_once(
    tmp_path: Path, empty_database_url: str
) -> None:
    """ADR 0184: each shard reports after its first cycle (so the coordinator knows it as
    a receiver of offers), shard-1 reports its two new idle GPU hosts after the cycle
    that sees them, and shard-0 reads the round's offers at its next cycle, without a
    report of its own. With the periodic reports alone none of this would happen within
    ten minutes."""
    dev = DevStack(
        options(tmp_path, empty_database_url, report_interval_s=600.0, early_report_gap_s=0.3)
    )
    try:
        await dev.start()
        await eventually(lambda: all(len(p.owned) == 6 for p in dev.shards), what="distribution")
        receiver = shard(dev, "shard-0").parts.reporter.news
        reported_at = receiver.sent_at
        assert reported_at > 0, "shard-0 reported after its first cycle"
        donor_gpus = await _owned_gpus(dev, "shard-1")
        client = next(iter(dev.provider_clients.values()))
        for i, machine_id in enumerate(donor_gpus):
            await client.create(machine_id, FencingToken("setup", 1, i + 1))
        await _offered(dev, "shard-0", 2)
        assert receiver.sent_at == reported_at, "shard-0 learnt of them without reporting"
    finally:
        await dev.stop()


async def test_a_shard_that_could_buy_takes_another_shards_idle_machines_instead(
    stack: DevStack,
) -> None:
    """Idle first, fleet-wide (ADR 0129): shard-0 owns two GPU slots of its own, enough
    for the cluster, so it has no shortfall to report; yet shard-1's two idle GPU hosts
    are used, and nothing new is created."""
    donor_gpus = await _idle_gpus_on_shard_1(stack)
    own_gpus = await _owned_gpus(stack, "shard-0")
    client = next(iter(stack.provider_clients.values()))
    await _connect(stack, "gpu-a", machines=2)  # first contact: shard-0
    machines = await eventually(
        lambda: _two(configured_for(stack, "gpu-a")), within=90, what="2 GPU machines configured"
    )
    assert {m.id for m in machines} == set(donor_gpus), "the other shard's idle hosts were used"
    listing = await client.list()
    states = {m.id: m.state for m in listing.machines}
    assert all(states[m] == provider_pb2.MACHINE_STATE_SPECULATIVE for m in own_gpus), (
        "nothing new was created"
    )
    assert stack.store is not None
    # What answered the cluster: one idle transfer (the coordinator may also even out
    # quota afterwards, shard-0 now holding all four GPU slots; that answers no need).
    answers = [
        i.kind
        for i in await stack.store.instructions()
        if i.status == "applied" and i.payload.get("cluster_id") == "gpu-a"
    ]
    assert answers == ["idle"]


async def test_an_instruction_from_an_older_term_is_refused(stack: DevStack) -> None:
    assert stack.coordinator is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    donor = shard(stack, "shard-1")
    assert donor.highest_term == stack.coordinator.term
    spec = co.TransferSpec(
        kind=co.TransferKind.SPECULATIVE,
        donor="shard-1",
        receiver="shard-0",
        provider="simcloud",
        instance_type="m6i.large",
        zone="test-1a",
        capacity_type=provider_pb2.CAPACITY_TYPE_ON_DEMAND,
        count=1,
        cluster_id="",
        need_key="zombie",
        priority=0,
    )
    before = dict(donor.owned)
    result = await donor.parts.transfers.release_machines(
        co.ReleaseInput(stack.coordinator.term - 1, 1, spec)
    )
    assert result.moved == [] and "stale coordinator term" in result.refused
    assert donor.owned == before


async def test_an_instruction_larger_than_the_sanity_limit_is_refused(stack: DevStack) -> None:
    assert stack.coordinator is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    donor = shard(stack, "shard-1")
    spec = co.TransferSpec(
        kind=co.TransferKind.SPECULATIVE,
        donor="shard-1",
        receiver="shard-0",
        provider="simcloud",
        instance_type="m6i.large",
        zone="test-1a",
        capacity_type=provider_pb2.CAPACITY_TYPE_ON_DEMAND,
        count=4,  # limit is 50% of 6 = 3
        cluster_id="",
        need_key="greedy",
        priority=0,
    )
    result = await donor.parts.transfers.release_machines(
        co.ReleaseInput(stack.coordinator.term, 99, spec)
    )
    assert result.moved == [] and "exceeds the limit of 3" in result.refused


async def test_a_shard_that_lost_its_lease_stops_acting_and_is_fenced(stack: DevStack) -> None:
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    zombie = shard(stack, "shard-1")
    machine_id = (await _owned_gpus(stack, "shard-1"))[0]
    assert stack.store is not None and stack.db is not None
    # Another process takes shard-1's lease (the zombie's lease "expired" during a pause).
    async with stack.db.engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE shards SET lease_expires_at = now() - interval '1 second' "
                "WHERE id = 'shard-1'"
            )
        )
    successor_epoch = await stack.store.acquire_lease("shard-1", "successor", ttl_seconds=60)
    assert successor_epoch > zombie.epoch
    await eventually(lambda: not zombie.active, within=60, what="the zombie to notice")
    assert await zombie.run_cycle() == 0, "a shard without its lease plans nothing"
    # The successor acts on a machine; the zombie's next call on it is fenced.
    client = next(iter(stack.provider_clients.values()))
    await client.create(machine_id, FencingToken("shard-1", successor_epoch, 1))
    with pytest.raises(Fenced):
        await client.create(machine_id, zombie.lease.next_token())


async def test_shards_keep_serving_while_the_coordinator_is_away(stack: DevStack) -> None:
    assert stack.coordinator is not None and stack.store is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    # Let the start-up evening-out of quota (a shard that owns nothing of a group gets
    # its share, one instruction at a time) finish before the coordinator goes away;
    # on a loaded machine it can otherwise still be owed when the coordinator returns.
    await coordinator_settled(stack, more_rounds=2)
    await stack.coordinator.stop()
    cluster = await _connect(stack, "gpu-c", machines=2)
    machines = await eventually(
        lambda: _two(configured_for(stack, "gpu-c")), within=60, what="2 GPUs from own quota"
    )
    assert len(machines) == 2
    # It wants more than its shard owns: nothing can move while the coordinator is away.
    instructions_before = len(await stack.store.instructions())
    cluster.demand = gpu_demand(4)
    owner = shard(stack, await stack.store.assign_cluster("gpu-c"))
    await eventually(
        lambda: any(s.cluster_id == "gpu-c" for s in owner.engine.shortfalls()),
        what="the shard to see its shortfall",
    )
    cycles = owner.cycles
    await eventually(lambda: owner.cycles >= cycles + 3, what="three more cycles")
    assert len(await configured_for(stack, "gpu-c")) == 2
    assert len(await stack.store.instructions()) == instructions_before
    # The coordinator returns with a new term and resolves the shortfall exactly once.
    # Only what it did from now on counts: the start-up evening-out of quota was
    # settled before it left.
    earlier = {i.id for i in await stack.store.instructions()}
    await stack.coordinator.start()
    await eventually(
        lambda: _four(configured_for(stack, "gpu-c")), within=90, what="4 GPUs after return"
    )
    await coordinator_settled(stack, more_rounds=2)
    receiver = await stack.store.assign_cluster("gpu-c")
    moves = [
        i
        for i in await stack.store.instructions()
        if i.id not in earlier
        and i.status == "applied"
        and i.receiver_shard == receiver
        and "moved 0" not in (i.outcome or "")
    ]
    # Spelled out as text: a list in the message would be cut short by pytest.
    assert len(moves) == 1, (
        "\n".join(
            f"id={i.id} term={i.term} seq={i.seq} at={i.created_at} donor={i.donor_shard} "
            f"outcome={i.outcome!r} payload={dict(i.payload)!r}"
            for i in moves
        )
        + f"\nshortfalls now: {owner.engine.shortfalls()!r}"
    )
    assert len(await configured_for(stack, "gpu-c")) == 4


async def _two(
    machines: Awaitable[list[provider_pb2.Machine]],
) -> list[provider_pb2.Machine] | None:
    found = await machines
    return found if len(found) >= 2 else None
