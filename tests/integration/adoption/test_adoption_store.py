"""Pause, dry run and the decision log in the real PostgreSQL: durable, combined, bounded."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from bigfleet.decisions import Decision, DecisionLog, LogLimits
from bigfleet.store import Database
from bigfleet.store.controls import ALL_SHARDS, ControlStore
from bigfleet.store.decisions import DecisionStore


async def test_a_pause_is_stored_and_read_back_by_a_fresh_connection(
    database: Database,
) -> None:
    await ControlStore(database.engine).set(
        "shard-0", paused=True, reason="incident 42", changed_by="alice"
    )

    again = Database.connect(database.url)
    try:
        control = await ControlStore(again.engine).get("shard-0")
    finally:
        await again.close()

    assert control.paused and not control.dry_run
    assert control.reason == "incident 42"
    assert control.changed_by == "alice"


async def test_resume_clears_only_the_pause_and_bumps_the_version(database: Database) -> None:
    store = ControlStore(database.engine)
    first = await store.set("shard-0", paused=True, dry_run=True, reason="testing")
    second = await store.set("shard-0", paused=False, reason="")

    assert not second.paused and second.dry_run
    assert second.version == first.version + 1


async def test_pausing_all_shards_pauses_one_that_was_resumed_on_its_own(
    database: Database,
) -> None:
    store = ControlStore(database.engine)
    await store.set(ALL_SHARDS, paused=True, reason="fleet freeze")
    await store.set("shard-1", paused=False)

    assert (await store.get("shard-1")).paused
    assert (await store.get("shard-1")).reason == "fleet freeze"
    assert not (await store.get("shard-2")).dry_run


async def test_a_pause_without_a_reason_is_refused(database: Database) -> None:
    with pytest.raises(ValueError, match=r"^reason: "):
        await ControlStore(database.engine).set("shard-0", paused=True, reason="  ")


def row(at: float, kind: str, machine_id: str = "", **values: object) -> Decision:
    return Decision(
        shard_id="shard-0",
        decided_at=at,
        cycle=int(at),
        mode="active",
        kind=kind,
        machine_id=machine_id,
        **values,  # type: ignore[arg-type]
    )


T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC).timestamp()


async def test_why_a_machine_answers_from_what_was_decided_at_that_time(
    database: Database,
) -> None:
    store = DecisionStore(database.engine)
    await store.append(
        [
            row(T0, "assign", "m-1", cluster_id="c1", reason="idle covers", inputs={"price": 2}),
            row(T0 + 720, "reclaim", "m-1", cluster_id="c1", reason="excess"),
            row(T0 + 30, "assign", "m-2", cluster_id="c1"),
        ]
    )

    before = await store.about_machine("m-1", at=datetime.fromtimestamp(T0 + 719, UTC))
    after = await store.about_machine("m-1", at=datetime.fromtimestamp(T0 + 720, UTC))

    assert [d.kind for d in before] == ["assign"]
    assert before[0].inputs == {"price": 2}
    assert [d.kind for d in after] == ["reclaim", "assign"]


async def test_why_a_need_takes_a_key_prefix(database: Database) -> None:
    store = DecisionStore(database.engine)
    await store.append(
        [
            row(
                T0,
                "unmet",
                cluster_id="c1",
                need_key="abcdef0123456789",
                reason="no matching supply",
            ),
            row(T0, "unmet", cluster_id="c2", need_key="abcdef0123456789", reason="other cluster"),
        ]
    )

    [found] = await store.about_need("c1", "abcdef")

    assert found.reason == "no matching supply"


async def test_the_log_keeps_at_most_its_row_cap_per_shard(database: Database) -> None:
    store = DecisionStore(database.engine)
    await store.append([row(T0 + i, "release", f"m-{i}") for i in range(50)])

    dropped = await store.prune("shard-0", retention_seconds=10 * 365 * 86400, max_rows=20)
    left = await store.window(
        since=datetime.fromtimestamp(T0, UTC), until=datetime.fromtimestamp(T0 + 100, UTC)
    )

    assert dropped == 30
    assert [d.machine_id for d in left] == [f"m-{i}" for i in range(30, 50)]


async def test_rows_past_retention_are_pruned(database: Database) -> None:
    store = DecisionStore(database.engine)
    now = datetime.now(UTC).timestamp()
    await store.append([row(now - 3 * 86400, "release", "old"), row(now, "release", "new")])

    await store.prune("shard-0", retention_seconds=86400, max_rows=1000)

    assert await store.about_machine("old") == []
    assert [d.machine_id for d in await store.about_machine("new")] == ["new"]


async def test_the_writer_suppresses_repeats_and_flushes_in_batches(database: Database) -> None:
    store = DecisionStore(database.engine)
    writer = DecisionLog(
        "shard-0", store, limits=LogLimits(batch_rows=2, repeat_seconds=60), clock=lambda: T0
    )
    for cycle in range(5):  # the same need short in five consecutive cycles
        writer.defer([row(T0 + cycle, "unmet", cluster_id="c1", need_key="k", reason="starved")])
    writer.defer([row(T0 + 5, "unmet", cluster_id="c1", need_key="k", reason="no supply")])
    writer.defer([row(T0 + 70, "unmet", cluster_id="c1", need_key="k", reason="no supply")])

    written = await writer.flush()

    assert written == 3  # first sight, a changed reason, a reminder after repeat_seconds
    assert [d.reason for d in await store.about_need("c1", "k", at=datetime.now(UTC))] == [
        "no supply",
        "no supply",
        "starved",
    ]


async def test_a_full_buffer_drops_the_oldest_rows_and_counts_them(database: Database) -> None:
    writer = DecisionLog(
        "shard-0",
        DecisionStore(database.engine),
        limits=LogLimits(buffer_rows=3),
        clock=lambda: T0,
    )

    writer.defer([row(T0 + i, "release", f"m-{i}") for i in range(5)])
    await writer.build()

    assert writer.dropped == 2
    assert writer.pending == 3
    await writer.flush()
    kept = await DecisionStore(database.engine).window(
        since=datetime.fromtimestamp(T0, UTC), until=datetime.fromtimestamp(T0 + 9, UTC)
    )
    assert [d.machine_id for d in kept] == ["m-2", "m-3", "m-4"]


async def test_a_failed_write_keeps_the_rows_for_the_next_flush(database: Database) -> None:
    class Down:
        async def append(self, entries: list[Decision]) -> int:
            raise ConnectionError("database down")

        async def prune(self, shard_id: str, *, retention_seconds: float, max_rows: int) -> int:
            return 0

    writer = DecisionLog("shard-0", Down(), clock=lambda: T0)
    writer.defer([row(T0, "release", "m-1")])
    await writer.build()

    with pytest.raises(ConnectionError):
        await writer.flush()
    assert writer.pending == 1


async def test_a_shard_process_says_it_runs_in_shadow_mode_without_touching_the_switches(
    database: Database,
) -> None:
    store = ControlStore(database.engine)
    await store.set("shard-0", paused=True, reason="freeze")

    await store.publish_shadow("shard-0", shadow=True)
    control = await store.get("shard-0")

    assert control.shadow and control.paused and control.reason == "freeze"


async def test_deferred_cycles_are_built_by_the_writer_and_a_backlog_drops_the_oldest(
    database: Database,
) -> None:
    store = DecisionStore(database.engine)
    writer = DecisionLog(
        "shard-0", store, limits=LogLimits(pending_cycles=2, build_slice_rows=2), clock=lambda: T0
    )
    built: list[int] = []

    def cycle(n: int) -> Iterator[Decision]:
        built.append(n)  # rows are made when the writer iterates, not when handed over
        for i in range(3):
            yield row(T0 + n, "release", f"c{n}-m{i}")

    for n in range(3):
        writer.defer(cycle(n))
    assert built == []

    await writer.flush()

    assert writer.dropped_cycles == 1
    assert built == [1, 2]
    kept = await store.window(
        since=datetime.fromtimestamp(T0, UTC), until=datetime.fromtimestamp(T0 + 9, UTC)
    )
    assert [d.machine_id for d in kept] == [f"c{n}-m{i}" for n in (1, 2) for i in range(3)]
