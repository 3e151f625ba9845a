"""The decision log's writer: a need short cycle after cycle is written once, however the
cycle's rows are sliced while they are built."""

from __future__ import annotations

from bigfleet.decisions import Decision, DecisionLog, LogLimits

T0 = 1_796_000_000.0


class Kept:
    """A sink that keeps what it is given (the writer's own logic is under test here)."""

    def __init__(self) -> None:
        self.rows: list[Decision] = []

    async def append(self, entries: list[Decision]) -> int:
        self.rows.extend(entries)
        return len(entries)

    async def prune(self, shard_id: str, *, retention_seconds: float, max_rows: int) -> int:
        return 0


def unmet(at: float, cluster: str, reason: str = "no matching supply") -> Decision:
    return Decision(
        shard_id="shard-0",
        decided_at=at,
        cycle=int(at - T0),
        mode="active",
        kind="unmet",
        cluster_id=cluster,
        need_key="k",
        reason=reason,
    )


async def test_a_need_short_every_cycle_is_written_once_when_cycles_are_built_in_slices() -> None:
    sink = Kept()
    # Slices of 2 rows: each cycle of 5 unmet needs is built in three slices.
    writer = DecisionLog(
        "shard-0", sink, limits=LogLimits(build_slice_rows=2, repeat_seconds=600), clock=lambda: T0
    )
    clusters = [f"c{i}" for i in range(5)]
    for cycle in range(4):
        writer.defer([unmet(T0 + cycle, c) for c in clusters])
        await writer.flush()

    # Each need once: before the fix, a slice forgot the keys of every other slice,
    # and all five were written again every cycle (20 rows).
    assert sorted(r.cluster_id for r in sink.rows) == clusters


async def test_a_need_that_was_met_for_a_cycle_is_news_again() -> None:
    sink = Kept()
    writer = DecisionLog(
        "shard-0", sink, limits=LogLimits(build_slice_rows=2, repeat_seconds=600), clock=lambda: T0
    )
    writer.defer([unmet(T0, "c0"), unmet(T0, "c1"), unmet(T0, "c2")])
    writer.defer([unmet(T0 + 1, "c0"), unmet(T0 + 1, "c2")])  # c1 met in cycle 1
    writer.defer([unmet(T0 + 2, c) for c in ("c0", "c1", "c2")])  # and short again
    writer.defer([unmet(T0 + 3, "c0", reason="quota")])  # a changed reason is news
    await writer.flush()

    assert [(r.cycle, r.cluster_id, r.reason) for r in sink.rows] == [
        (0, "c0", "no matching supply"),
        (0, "c1", "no matching supply"),
        (0, "c2", "no matching supply"),
        (2, "c1", "no matching supply"),
        (3, "c0", "quota"),
    ]
