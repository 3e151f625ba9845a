"""Quarantined machines survive a shard restart: written through to PostgreSQL
when the shard quarantines or releases, and loaded by the next process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import Database, Store
from workflows.contracts import MachineOutcome, RecordMachineInput

SHARD = "shard-0"


@pytest.fixture
async def url(empty_database_url: str) -> AsyncIterator[str]:
    """A migrated database's URL; each test connects (and reconnects) itself."""
    db = Database.connect(empty_database_url)
    try:
        await db.migrate()
    finally:
        await db.close()
    yield empty_database_url


async def _machine(store: Store, machine_id: str, *, shard_id: str = SHARD) -> int:
    """A machine row owned by ``shard_id``; returns the shard's epoch."""
    epoch = await store.acquire_lease(shard_id, f"holder-{shard_id}", ttl_seconds=30)
    await store.record_operation(
        machine_id=machine_id,
        shard_id=shard_id,
        shard_epoch=epoch,
        provider="simcloud",
        cluster_id=None,
        operation="create",
        operation_seq=1,
    )
    return epoch


def _shard(store: Store, epoch: int) -> ShardProcess:
    """A shard process object that is not started (no Temporal, no providers)."""
    shard = ShardProcess(
        ShardOptions(shard_id=SHARD),
        store=store,
        temporal=None,  # type: ignore[arg-type]
        providers={},
        clock=lambda: 1_000.0,
    )
    shard.lease.epoch = epoch
    return shard


async def test_a_quarantine_is_still_there_for_a_new_store(url: str) -> None:
    first = Database.connect(url)
    try:
        store = Store(first.engine)
        await _machine(store, "m-1")
        await _machine(store, "m-2")
        assert await store.quarantine("m-1", SHARD, "capacity: no such slot")
    finally:
        await first.close()

    second = Database.connect(url)
    try:
        store = Store(second.engine)
        assert await store.quarantined(SHARD) == {"m-1": "capacity: no such slot"}
        assert await store.release_quarantine("m-1")
        assert not await store.release_quarantine("m-1"), "releasing twice changes nothing"
        assert await store.quarantined(SHARD) == {}
    finally:
        await second.close()


async def test_quarantine_belongs_to_the_owning_shard(url: str) -> None:
    db = Database.connect(url)
    try:
        store = Store(db.engine)
        await _machine(store, "m-1", shard_id="shard-1")
        assert not await store.quarantine("m-1", SHARD, "not ours"), "another shard's machine"
        assert not await store.quarantine("m-unknown", SHARD, "no row")
        assert await store.quarantine("m-1", "shard-1", "first")
        assert await store.quarantine("m-1", "shard-1", "second")
        assert await store.quarantined(SHARD) == {}
        assert await store.quarantined("shard-1") == {"m-1": "second"}
    finally:
        await db.close()


async def test_a_restarted_shard_still_ignores_its_quarantined_machine(url: str) -> None:
    first = Database.connect(url)
    try:
        store = Store(first.engine)
        epoch = await _machine(store, "m-bad")
        shard = _shard(store, epoch)
        await shard.parts.outcomes.record_machine(
            RecordMachineInput(
                shard_id=SHARD,
                operation="create",
                operation_seq=2,
                outcome=MachineOutcome("m-bad", "simcloud", "FAILED", "quota exceeded"),
                succeeded=False,
                quarantine=True,
            )
        )
        assert shard.lifecycle.is_quarantined("m-bad")
    finally:
        await first.close()

    second = Database.connect(url)
    try:
        restarted = _shard(Store(second.engine), epoch)
        assert not restarted.lifecycle.is_quarantined("m-bad")
        await restarted.load_quarantine()
        assert restarted.lifecycle.quarantined == {"m-bad": "quota exceeded"}

        assert await restarted.release_quarantine("m-bad")
        assert not restarted.lifecycle.is_quarantined("m-bad")
        again = _shard(Store(second.engine), epoch)
        await again.load_quarantine()
        assert again.lifecycle.quarantined == {}
    finally:
        await second.close()
