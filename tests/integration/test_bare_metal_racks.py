"""Bare metal on the real stack: whole racks per shard, drains that keep racks whole,
and a proportional decommission of a hall.

The tiny site has two halls of three racks (fifteen servers). The
coordinator hands out racks, never single servers, so a shard can serve a
gang that must share a rack.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from activities.membership import plan_decommission
from bigfleet.devstack import DevStack
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern, SimulatedCluster
from providers.config import ProviderConfig
from providers.model import FencingToken
from tests.integration.multishard import eventually, options, shard

pytestmark = pytest.mark.e2e

TINY_SITE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_bare_metal.json"
RACK = "topology.kubernetes.io/rack"
SERVERS = 15
RACKS = 6


def _options(tmp: Path, db_url: str, shards: int) -> object:
    site = ProviderConfig(kind="bare-metal", catalog_path=TINY_SITE, time_factor=0.005, seed=3)
    return options(tmp, db_url, shards=shards, extra_providers=(site,))


async def _stack(tmp: Path, db_url: str, shards: int) -> DevStack:
    dev = DevStack(_options(tmp, db_url, shards))  # type: ignore[arg-type]
    await dev.start()
    return dev


@pytest.fixture
async def three(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = await _stack(tmp_path, empty_database_url, 3)
    try:
        yield dev
    finally:
        await dev.stop()


async def _servers(dev: DevStack) -> list[provider_pb2.Machine]:
    return list((await dev.provider_clients["bm"].list()).machines)


async def _rack_owners(dev: DevStack) -> dict[str, set[str]]:
    """rack -> the shards owning any of its servers (PostgreSQL)."""
    assert dev.store is not None
    owners = await dev.store.owners()
    out: dict[str, set[str]] = defaultdict(set)
    for m in await _servers(dev):
        if m.id in owners:
            out[m.labels[RACK]].add(owners[m.id])
    return out


async def _all_servers_owned(dev: DevStack) -> bool:
    assert dev.store is not None
    owners = await dev.store.owners()
    return sum(1 for m in await _servers(dev) if m.id in owners) == SERVERS


def _owned_once_in_memory(dev: DevStack) -> dict[str, str]:
    seen: dict[str, str] = {}
    for process in dev.shards:
        for machine_id in process.owned:
            assert machine_id not in seen, f"{machine_id} owned by two shard processes"
            seen[machine_id] = process.shard_id
    return seen


@pytest.mark.parametrize("shards", [2, 3])
async def test_racks_are_assigned_whole_and_spread_evenly(
    tmp_path: Path, empty_database_url: str, shards: int
) -> None:
    dev = await _stack(tmp_path, empty_database_url, shards)
    try:
        assert dev.store is not None
        await eventually(lambda: _all_servers_owned(dev), what="every server to be assigned")

        racks = await _rack_owners(dev)
        assert len(racks) == RACKS
        assert all(len(holders) == 1 for holders in racks.values()), racks
        per_shard = Counter(next(iter(h)) for h in racks.values())
        assert per_shard == {f"shard-{i}": RACKS // shards for i in range(shards)}
        owners = await dev.store.owners()
        await eventually(
            lambda: _bare_metal(_owned_once_in_memory(dev)) == _bare_metal(owners),
            what="each shard process to hold exactly its racks",
        )
    finally:
        await dev.stop()


def _bare_metal(owners: dict[str, str]) -> dict[str, str]:
    return {m: s for m, s in owners.items() if m.startswith("bm-")}


async def test_decommissioning_part_of_a_hall_takes_from_every_shard_in_proportion(
    three: DevStack,
) -> None:
    assert three.store is not None
    await eventually(lambda: _all_servers_owned(three), what="every server to be assigned")
    owners = await three.store.owners()
    hall = [m for m in await _servers(three) if m.zone == "hall-a"]
    held = Counter(owners[m.id] for m in hall)
    count = 4

    taken = await plan_decommission(
        three.store,
        "bm",
        three.provider_clients["bm"],
        label="topology.kubernetes.io/zone",
        value="hall-a",
        count=count,
    )

    assert sum(len(ids) for ids in taken.values()) == count
    hall_ids = {m.id for m in hall}
    for shard_id, ids in taken.items():
        assert set(ids) <= hall_ids
        assert {owners[i] for i in ids} == {shard_id}
    for shard_id, n in held.items():
        exact = count * n / len(hall)
        assert abs(len(taken.get(shard_id, [])) - exact) < 1, (shard_id, n, taken)


async def test_draining_a_shard_keeps_every_rack_whole(three: DevStack) -> None:
    assert three.store is not None
    await eventually(lambda: _all_servers_owned(three), what="every server to be assigned")
    demand = DemandPattern(
        cpu=20,
        memory_gib=8,
        min_unit_cpu=1,
        min_unit_memory_gib=1,
        requirements=(("node.kubernetes.io/instance-type", 1, ("gp-small",)),),
    )
    drained = await three.store.assign_cluster("metal")
    cluster = SimulatedCluster(
        "metal", shard(three, drained).address, demand, rollup_interval_s=0.5
    )
    cluster.start()
    three.clusters.append(cluster)
    await eventually(lambda: len(cluster.configured_nodes()) >= 2, what="metal runs on 2 servers")
    bound = {n.machine_id for n in cluster.configured_nodes()}

    await three.store.drain_shard(drained)
    await eventually(
        lambda: _shard_empty(three, drained), within=45, what=f"{drained} to own nothing"
    )

    racks = await _rack_owners(three)
    assert all(len(holders) == 1 for holders in racks.values()), racks
    assert drained not in set().union(*racks.values())
    receiver = next(c.shard_id for c in await three.store.clusters() if c.cluster_id == "metal")
    owners = await three.store.owners()
    assert {owners[m] for m in bound} == {receiver}
    await eventually(lambda: cluster.redirects and cluster.connected.is_set(), what="reconnect")
    assert {n.machine_id for n in cluster.configured_nodes()} >= bound

    async def memory_agrees() -> bool:
        # A receiver takes what it was handed into memory after the store
        # recorded it: wait for the shard processes to catch up with the store.
        assert three.store is not None
        return _owned_once_in_memory(three) == await three.store.owners()

    await eventually(memory_agrees, what="the shard processes to hold what the store says")
    await three.store.remove_shard(drained)


async def _shard_empty(dev: DevStack, shard_id: str) -> bool:
    assert dev.store is not None
    row = await dev.store.shard(shard_id)
    return row is not None and row.clusters == 0 and row.machines == 0


async def test_a_gang_takes_another_shards_idle_servers_and_a_new_one_of_their_rack(
    tmp_path: Path, empty_database_url: str
) -> None:
    """ADR 0173 on the real stack: a gang of three on a shard whose racks hold two
    servers each takes two idle servers of a rack of three on the other shard and the
    third server of that rack, through one idle and one quota transfer (before, quota
    alone: three new servers), and nothing is created in its own racks."""
    dev = await _stack(tmp_path, empty_database_url, 2)
    try:
        assert dev.store is not None
        await eventually(lambda: _all_servers_owned(dev), what="every server to be assigned")
        # Clusters go to the least-loaded shard: the first to the shard holding the racks
        # of three, so "train" lands on the one whose racks hold two servers each.
        holder = await dev.store.assign_cluster("placeholder")
        receiver = await dev.store.assign_cluster("train")
        assert receiver != holder
        donor = next(p.shard_id for p in dev.shards if p.shard_id != receiver)
        servers = await _servers(dev)
        owners = await dev.store.owners()
        by_rack: dict[str, list[str]] = defaultdict(list)
        for m in servers:
            by_rack[m.labels[RACK]].append(m.id)
        rack = next(
            r for r, ids in sorted(by_rack.items()) if len(ids) == 3 and owners[ids[0]] == donor
        )
        client = dev.provider_clients["bm"]
        idle = sorted(by_rack[rack])[:2]
        for i, machine_id in enumerate(idle):
            await client.create(machine_id, FencingToken("setup", 1, i + 1))

        def offered() -> bool:
            offers = shard(dev, receiver).engine.fleet_idle_offers
            return any(
                o.labels.get(RACK) == rack and o.count == 2 and o.speculative >= 1 for o in offers
            )

        await eventually(offered, within=90, what=f"{receiver} offered 2 idle servers of {rack}")
        demand = DemandPattern(
            cpu=3 * 15,
            memory_gib=3,
            min_unit_cpu=15,
            min_unit_memory_gib=1,
            priority=900_000,
            requirements=((RACK, 5, ()),),  # Same: one gang in one rack
        )
        cluster = SimulatedCluster(
            "train", shard(dev, receiver).address, demand, rollup_interval_s=0.5
        )
        cluster.start()
        dev.clusters.append(cluster)
        await eventually(
            lambda: len(cluster.configured_nodes()) >= 3, within=90, what="the gang on 3 servers"
        )

        used = {n.machine_id for n in cluster.configured_nodes()}
        assert used == set(by_rack[rack]), "the gang runs in the rack of the idle servers"
        answers = sorted(
            (i.kind, i.donor_shard, i.payload.get("domain"), i.payload.get("count"))
            for i in await dev.store.instructions()
            if i.status == "applied" and i.payload.get("cluster_id") == "train"
        )
        assert answers == [("idle", donor, rack, 2), ("speculative", donor, rack, 1)]
        states = {m.id: m.state for m in await _servers(dev)}
        mine = [m for m, s in (await dev.store.owners()).items() if s == receiver]
        created = {
            m
            for m in mine
            if m.startswith("bm-")
            and m not in used
            and states[m] != provider_pb2.MACHINE_STATE_SPECULATIVE
        }
        assert created == set(), "nothing created in the receiver's own racks"
    finally:
        await dev.stop()
