"""The command line against a real PostgreSQL: shards, clusters, coordinator status,
and the membership commands drain and remove."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner, Result

from bigfleet.cli import app
from bigfleet.store import Database, Store


async def _cli(db: Database, *args: str) -> Result:
    """Run ``bigfleet ARGS`` (in a thread: the commands run their own event loop)."""
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, app, list(args), env={"BIGFLEET_DATABASE_URL": db.url}
    )


@pytest.fixture
async def fleet(database: Database) -> Store:
    """Two shards, a cluster and some machines on each, a coordinator term with one outcome."""
    store = Store(database.engine)
    await store.acquire_lease("shard-0", "proc-a", ttl_seconds=300)
    await store.acquire_lease("shard-1", "proc-b", ttl_seconds=300)
    assert await store.assign_cluster("web") == "shard-0"
    assert await store.assign_cluster("batch") == "shard-1"
    await store.assign_unowned("shard-0", "sim", ["m1", "m2"], term=1)
    await store.assign_unowned("shard-1", "sim", ["m3"], term=1)
    for _ in range(3):
        term = await store.take_term()
    await store.record_instruction(
        term=term, seq=7, kind="speculative", donor="shard-1", receiver="shard-0", payload={}
    )
    await store.finish_instruction(term=term, seq=7, status="applied", outcome="moved 1 of 1")
    return store


def _row(output: str, first: str) -> list[str]:
    return next(line.split() for line in output.splitlines() if line.split()[:1] == [first])


async def test_shards_lists_membership_leases_and_counts(database: Database, fleet: Store) -> None:
    result = await _cli(database, "shards")

    assert result.exit_code == 0, result.output
    assert _row(result.output, "shard-0")[:5] == ["shard-0", "active", "1", "1", "2"]
    assert _row(result.output, "shard-1")[:5] == ["shard-1", "active", "1", "1", "1"]
    assert "proc-a until" in result.output and "proc-b until" in result.output


async def test_clusters_shows_where_each_cluster_is_served(
    database: Database, fleet: Store
) -> None:
    result = await _cli(database, "clusters")

    assert result.exit_code == 0, result.output
    assert _row(result.output, "web")[:2] == ["web", "shard-0"]
    assert _row(result.output, "batch")[:2] == ["batch", "shard-1"]


async def test_coordinator_status_shows_the_term_and_outcomes(
    database: Database, fleet: Store
) -> None:
    result = await _cli(database, "coordinator", "status")

    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "term 3"
    line = _row(result.output, "3/7")
    assert line[:5] == ["3/7", "speculative", "shard-1", "->", "shard-0"]
    assert "applied" in line and "moved 1 of 1" in result.output


async def test_drain_then_remove_refuses_until_the_shard_owns_nothing(
    database: Database, fleet: Store
) -> None:
    drained = await _cli(database, "shards", "drain", "shard-1")
    assert drained.exit_code == 0, drained.output
    assert "1 cluster(s) and 1 machine(s) move to shard-0" in drained.output
    assert _row((await _cli(database, "shards")).output, "shard-1")[1] == "draining"

    refused = await _cli(database, "shards", "remove", "shard-1")
    assert refused.exit_code != 0
    assert "still owns 1 cluster(s) and 1 machine(s)" in refused.output
    last = await _cli(database, "shards", "drain", "shard-0")
    assert last.exit_code != 0 and "only active shard" in last.output
    unknown = await _cli(database, "shards", "remove", "shard-9")
    assert unknown.exit_code != 0 and "does not exist" in unknown.output

    # What the coordinator's workflows do, done directly: move the cluster, hand over m3.
    moved = await fleet.move_cluster(
        cluster_id="batch", donor="shard-1", receiver="shard-0", machine_ids=[], term=3, seq=8
    )
    assert moved.moved
    assert await fleet.transfer(
        donor="shard-1", receiver="shard-0", machine_ids=["m3"], term=3, seq=9
    ) == ["m3"]
    waited = await _cli(database, "shards", "drain", "shard-1", "--wait", "--timeout", "5")
    assert waited.exit_code == 0 and "owns nothing" in waited.output

    removed = await _cli(database, "shards", "remove", "shard-1")
    assert removed.exit_code == 0, removed.output
    assert _row((await _cli(database, "shards")).output, "shard-1")[1] == "removed"
    assert _row((await _cli(database, "clusters")).output, "batch")[1] == "shard-0"
