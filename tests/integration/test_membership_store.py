"""Shard membership in the store on a real PostgreSQL: drain, cluster moves, removal."""

from __future__ import annotations

import asyncio

import pytest

from bigfleet.store import Database, MembershipError, ShardNotEmpty, ShardRemoved, Store


async def _fleet(db: Database, shards: int = 2) -> Store:
    store = Store(db.engine)
    for i in range(shards):
        await store.acquire_lease(f"shard-{i}", f"proc-{i}", ttl_seconds=30)
    return store


async def _bind(store: Store, shard: str, cluster: str, machines: list[str]) -> None:
    """Give ``machines`` to ``shard`` and record them configured for ``cluster``."""
    await store.assign_unowned(shard, "sim", machines, term=1)
    epoch = next(r.epoch for r in await store.shards() if r.id == shard)
    for m in machines:
        await store.record_operation(
            machine_id=m,
            shard_id=shard,
            shard_epoch=epoch,
            provider="sim",
            cluster_id=cluster,
            operation="configure",
            operation_seq=3,
        )


async def test_a_draining_shard_takes_no_new_clusters(database: Database) -> None:
    store = await _fleet(database)
    await store.drain_shard("shard-0")
    await store.drain_shard("shard-0")  # idempotent

    assert {await store.assign_cluster(f"c{i}") for i in range(3)} == {"shard-1"}
    assert await store.active_shards() == ["shard-1"]


async def test_the_last_active_shard_cannot_be_drained(database: Database) -> None:
    store = await _fleet(database)
    results = await asyncio.gather(
        store.drain_shard("shard-0"), store.drain_shard("shard-1"), return_exceptions=True
    )

    assert sum(isinstance(r, MembershipError) for r in results) == 1
    assert len(await store.active_shards()) == 1
    with pytest.raises(KeyError):
        await store.drain_shard("shard-9")


async def test_a_removed_or_draining_shard_receives_no_machines(database: Database) -> None:
    store = await _fleet(database, shards=3)
    await store.assign_unowned("shard-0", "sim", ["m1", "m2"], term=1)
    await store.drain_shard("shard-1")

    assert await store.assign_unowned("shard-1", "sim", ["m3"], term=1) == []
    assert (
        await store.transfer(donor="shard-0", receiver="shard-1", machine_ids=["m1"], term=1, seq=1)
        == []
    )
    assert await store.transfer(
        donor="shard-0", receiver="shard-2", machine_ids=["m1"], term=1, seq=2
    ) == ["m1"]


async def test_a_cluster_moves_with_its_machines_exactly_once(database: Database) -> None:
    store = await _fleet(database, shards=3)
    assert await store.assign_cluster("web") == "shard-0"
    await _bind(store, "shard-0", "web", ["m1", "m2"])
    await store.assign_unowned("shard-0", "sim", ["spare"], term=1)
    await store.drain_shard("shard-0")

    first, second = await asyncio.gather(
        store.move_cluster(
            cluster_id="web",
            donor="shard-0",
            receiver="shard-1",
            machine_ids=["m1", "m2"],
            term=2,
            seq=1,
        ),
        store.move_cluster(
            cluster_id="web",
            donor="shard-0",
            receiver="shard-2",
            machine_ids=["m1", "m2"],
            term=2,
            seq=2,
        ),
    )

    assert sorted([first.moved, second.moved]) == [False, True]
    winner = first if first.moved else second
    loser = second if first.moved else first
    assert loser.owner == winner.owner, "the loser learns where the cluster went"
    assert loser.machines == winner.machines == (("m1", "sim"), ("m2", "sim"))
    owners = await store.owners()
    assert owners == {"m1": winner.owner, "m2": winner.owner, "spare": "shard-0"}
    assert [c.shard_id for c in await store.clusters()] == [winner.owner]
    assert ("cluster-move", 3, "web") in await store.assignment_log("m1")
    # Its operation sequence survives the move, so the receiver continues above it.
    assert {m.operation_seq for m in await store.machines_by_id(["m1", "m2"])} == {3}


async def test_only_a_draining_shard_gives_clusters_away(database: Database) -> None:
    store = await _fleet(database)
    await store.assign_cluster("web")
    await _bind(store, "shard-0", "web", ["m1"])

    result = await store.move_cluster(
        cluster_id="web", donor="shard-0", receiver="shard-1", machine_ids=["m1"], term=5, seq=1
    )

    assert not result.moved and result.owner == "shard-0"
    assert await store.owners() == {"m1": "shard-0"}


async def test_a_shard_is_removed_only_once_drained_and_empty(database: Database) -> None:
    store = await _fleet(database)
    await store.assign_cluster("web")
    await _bind(store, "shard-0", "web", ["m1"])
    with pytest.raises(MembershipError, match="drain it first"):
        await store.remove_shard("shard-0")
    await store.drain_shard("shard-0")
    with pytest.raises(ShardNotEmpty) as refused:
        await store.remove_shard("shard-0")
    assert (refused.value.clusters, refused.value.machines) == (1, 1)

    await store.move_cluster(
        cluster_id="web", donor="shard-0", receiver="shard-1", machine_ids=["m1"], term=1, seq=1
    )
    before = await store.shard("shard-0")
    await store.remove_shard("shard-0")
    await store.remove_shard("shard-0")  # idempotent

    after = await store.shard("shard-0")
    assert before is not None and after is not None
    assert after.state == "removed" and after.lease_holder is None
    assert after.epoch == before.epoch + 1, "whatever still runs as shard-0 is fenced"
    with pytest.raises(ShardRemoved):
        await store.acquire_lease("shard-0", "proc-0", ttl_seconds=30)
