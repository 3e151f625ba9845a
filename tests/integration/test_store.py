"""The durable store on a real PostgreSQL: migrations, leases, assignments."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from bigfleet.store import Database, LeaseHeld, LeaseLost, Store


async def _tables(db: Database) -> set[str]:
    async with db.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        )
        return {r[0] for r in rows}


async def test_migrations_go_up_and_down_cleanly(empty_database_url: str) -> None:
    db = Database.connect(empty_database_url)
    try:
        await db.migrate()
        assert {"shards", "clusters", "machines", "assignment_log", "coordinator"} <= await _tables(
            db
        )
        await db.downgrade("base")
        assert await _tables(db) == {"alembic_version"}
        await db.migrate()
        assert "machines" in await _tables(db)
    finally:
        await db.close()


async def test_each_lease_acquisition_increments_the_epoch(database: Database) -> None:
    store = Store(database.engine)
    first = await store.acquire_lease("shard-0", "proc-a", ttl_seconds=30)
    second = await store.acquire_lease("shard-0", "proc-a", ttl_seconds=30)
    assert second == first + 1


async def test_a_live_lease_held_by_another_process_is_refused(database: Database) -> None:
    store = Store(database.engine)
    await store.acquire_lease("shard-0", "proc-a", ttl_seconds=30)
    with pytest.raises(LeaseHeld):
        await store.acquire_lease("shard-0", "proc-b", ttl_seconds=30)


async def test_an_expired_lease_is_taken_over_and_the_old_holder_loses_it(
    database: Database,
) -> None:
    store = Store(database.engine)
    old = await store.acquire_lease("shard-0", "proc-a", ttl_seconds=0.05)
    await asyncio.sleep(0.2)
    new = await store.acquire_lease("shard-0", "proc-b", ttl_seconds=30)
    assert new == old + 1
    with pytest.raises(LeaseLost):
        await store.renew_lease("shard-0", "proc-a", old, ttl_seconds=30)


async def test_concurrent_acquisitions_yield_one_winner(database: Database) -> None:
    store = Store(database.engine)
    results = await asyncio.gather(
        *(store.acquire_lease("shard-0", f"proc-{i}", ttl_seconds=30) for i in range(5)),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1
    assert all(isinstance(r, LeaseHeld) for r in results if not isinstance(r, int))


async def test_a_cluster_keeps_the_shard_it_was_first_assigned(database: Database) -> None:
    store = Store(database.engine)
    await store.acquire_lease("shard-0", "a", ttl_seconds=30)
    await store.acquire_lease("shard-1", "b", ttl_seconds=30)
    first = await store.assign_cluster("c1")
    second = await store.assign_cluster("c2")
    assert {first, second} == {"shard-0", "shard-1"}, "least-loaded spreads first contacts"
    assert await store.assign_cluster("c1") == first


async def test_concurrent_first_contacts_agree_on_one_shard(database: Database) -> None:
    store = Store(database.engine)
    for i in range(3):
        await store.acquire_lease(f"shard-{i}", f"p{i}", ttl_seconds=30)
    answers = await asyncio.gather(*(store.assign_cluster("same") for _ in range(8)))
    assert len(set(answers)) == 1


async def test_an_operation_outcome_is_recorded_exactly_once(database: Database) -> None:
    store = Store(database.engine)
    epoch = await store.acquire_lease("shard-0", "a", ttl_seconds=30)
    kwargs = dict(
        machine_id="m-1",
        shard_id="shard-0",
        shard_epoch=epoch,
        provider="sim",
        cluster_id="c1",
        operation="configure",
        operation_seq=1,
        shard_metadata={"need": "k"},
    )
    assert await store.record_operation(**kwargs) is True  # type: ignore[arg-type]
    assert await store.record_operation(**kwargs) is False  # type: ignore[arg-type]
    assert await store.assignment_log("m-1") == [("configure", 1, "c1")]
    (row,) = await store.machines("shard-0")
    assert row.cluster_id == "c1" and row.operation_seq == 1 and row.shard_metadata == {"need": "k"}


async def test_an_outcome_of_an_older_operation_is_logged_but_does_not_move_the_row(
    database: Database,
) -> None:
    """After a takeover the successor's operation (a newer epoch's sequence) may finish
    first; the predecessor's outcome, recorded later by the successor, still reaches
    the history, once, and leaves the ownership row at the newer operation."""
    store = Store(database.engine)
    epoch = await store.acquire_lease("shard-0", "a", ttl_seconds=30)
    newer, older = 2_000_000_001, 1_000_000_001

    async def record(cluster_id: str | None, operation: str, seq: int) -> bool:
        return await store.record_operation(
            machine_id="m-1",
            shard_id="shard-0",
            shard_epoch=epoch,
            provider="sim",
            cluster_id=cluster_id,
            operation=operation,
            operation_seq=seq,
        )

    assert await record(None, "drain", newer)
    for _ in range(2):  # the activity is retried: logged once
        assert not await record("c1", "provision", older)
    assert await store.assignment_log("m-1") == [
        ("drain", newer, None),
        ("provision", older, "c1"),
    ]
    (row,) = await store.machines("shard-0")
    assert row.cluster_id is None and row.operation_seq == newer


async def test_a_stale_epoch_cannot_write_assignments(database: Database) -> None:
    store = Store(database.engine)
    old = await store.acquire_lease("shard-0", "a", ttl_seconds=30)
    await store.acquire_lease("shard-0", "a", ttl_seconds=30)
    with pytest.raises(LeaseLost):
        await store.record_operation(
            machine_id="m-1",
            shard_id="shard-0",
            shard_epoch=old,
            provider="sim",
            cluster_id="c1",
            operation="configure",
            operation_seq=1,
        )
    assert await store.machines() == []


async def test_many_clusters_are_assigned_at_once_and_keep_their_shard(
    database: Database,
) -> None:
    store = Store(database.engine)
    await store.acquire_lease("shard-0", "a", ttl_seconds=30)
    await store.acquire_lease("shard-1", "b", ttl_seconds=30)
    assert await store.assign_cluster("old") in ("shard-0", "shard-1")
    before = await store.assign_cluster("old")
    owners = await store.assign_clusters([f"c{i}" for i in range(50)] + ["old"])
    assert owners["old"] == before
    # The new ones went together to the shard that was least loaded (not "old"'s).
    assert {owners[f"c{i}"] for i in range(50)} == {"shard-0", "shard-1"} - {before}
    again = await store.assign_clusters(["c1", "c2"])
    assert again == {"c1": owners["c1"], "c2": owners["c2"]}
    assert await store.assign_cluster("c3") == owners["c3"]


async def test_assigning_no_cluster_is_nothing_and_an_empty_id_is_refused(
    database: Database,
) -> None:
    store = Store(database.engine)
    assert await store.assign_clusters([]) == {}
    with pytest.raises(ValueError, match="cluster_id"):
        await store.assign_clusters(["ok", ""])
