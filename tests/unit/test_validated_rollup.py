"""ValidatedRollup: judged once, the only thing the needs table takes, one cache (ADR 0145)."""

from __future__ import annotations

import pytest

from shard_engine.engine import ShardEngine
from shard_engine.model import Need, Rollup
from shard_engine.needs import RollupRejected, ValidatedRollup, validate_rollup


def _need(cpu: float, priority: int = 1) -> Need:
    return Need(requirements=(), aggregate={"cpu": cpu}, priority=priority)


def test_a_validated_rollup_cannot_be_made_by_hand() -> None:
    rollup = Rollup("c1", 1, (_need(1.0),))
    merged, rows = validate_rollup(rollup)
    with pytest.raises(TypeError, match=r"ValidatedRollup\.check"):
        ValidatedRollup(rollup, rows, merged)


def test_the_needs_table_refuses_a_rollup_that_was_not_validated() -> None:
    engine = ShardEngine()
    with pytest.raises(TypeError, match="ValidatedRollup"):
        engine._table.apply(Rollup("c1", 1, (_need(1.0),)))  # type: ignore[arg-type]


def test_a_validated_rollup_is_applied_without_judging_the_clock_again() -> None:
    engine = ShardEngine()
    # Judged against the sender's clock at the edge; applied later, when the
    # engine's own "now" would call it far ahead: it is not judged again.
    validated = ValidatedRollup.check(
        Rollup("c1", 10_000 * 10**9, (_need(4.0),)), now=10_000.0, max_skew_seconds=300.0
    )
    assert engine.apply_rollup(validated, now=0.0).status == "applied"
    assert engine.needs_of("c1")[0].aggregate == {"cpu": 4.0}


def test_the_engine_refuses_to_apply_a_plain_rollup_naming_the_parameter() -> None:
    engine = ShardEngine()
    plain = Rollup("c1", 1, (_need(4.0),))
    with pytest.raises(TypeError, match=r"apply_rollup: rollup must be a ValidatedRollup.*Rollup"):
        engine.apply_rollup(plain, now=0.0)  # type: ignore[arg-type]
    assert engine.needs_of("c1") == ()


def test_the_engines_validate_judges_a_plain_rollup_clock_included() -> None:
    engine = ShardEngine()
    with pytest.raises(RollupRejected, match="ahead of the shard's clock"):
        engine.validate(Rollup("c1", 10_000 * 10**9, (_need(4.0),)), now=0.0)
    validated = engine.validate(Rollup("c1", 1, (_need(4.0),)), now=0.0)
    assert engine.apply_rollup(validated, now=0.0).status == "applied"


def test_a_changed_row_is_judged_beside_rows_reused_from_the_previous_value() -> None:
    rows = (_need(1.0), _need(2.0, priority=5), _need(3.0, priority=9))
    first = ValidatedRollup.check(Rollup("c1", 1, rows))
    bad = Need(requirements=(), aggregate={"cpu": float("nan")}, priority=5)
    with pytest.raises(RollupRejected) as caught:
        ValidatedRollup.check(Rollup("c1", 2, (rows[0], bad, rows[2])), first)
    assert caught.value.field == "needs[1].aggregate[cpu]"
    resized = ValidatedRollup.check(
        Rollup("c1", 3, (rows[0], _need(7.0, priority=5), rows[2])), first
    )
    fresh = ValidatedRollup.check(Rollup("c1", 3, (rows[0], _need(7.0, priority=5), rows[2])))
    assert dict(resized.merged) == dict(fresh.merged)
    assert [r[1:] for r in resized.rows] == [r[1:] for r in fresh.rows]
    assert resized.rows[0][1] is first.rows[0][1], "an unchanged row is reused, not judged again"


def test_a_previous_value_of_another_cluster_is_not_reused() -> None:
    rows = (_need(1.0),)
    other = ValidatedRollup.check(Rollup("c1", 1, rows))
    mine = ValidatedRollup.check(Rollup("c2", 1, rows), other)
    assert mine.rows is not other.rows and mine.cluster_id == "c2"
