"""Why-not verdicts: every need's outcome in the last committed cycle, with the evidence."""

from __future__ import annotations

import pytest

from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState
from shard_engine.verdicts import UnmetReason
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, need, rollup, zone_in


def test_before_the_first_cycle_the_answer_is_cycle_zero_with_no_verdicts() -> None:
    engine = ShardEngine()
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)

    answer = engine.inspect_needs()

    assert (answer.cycle, answer.total, answer.verdicts) == (0, 0, ())


def test_a_covered_need_is_satisfied_and_counts_the_machines_sent_to_it() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="idle", state=MachineState.IDLE)
    fleet(engine, 3, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=16)), now=0)

    engine.cycle(now=10)
    (verdict,) = engine.inspect_needs().verdicts

    assert verdict.satisfied and verdict.reason == "" and verdict.deficit == {}
    assert (verdict.from_idle, verdict.from_speculative, verdict.claimed) == (2, 2, 4)
    assert verdict.arrival_seconds == 0
    assert verdict.matching is None


def test_a_need_nothing_can_serve_says_no_matching_supply_with_its_deficit_and_age() -> None:
    engine = ShardEngine()
    fleet(engine, 2, state=MachineState.IDLE, zone="zone-a")
    apply(engine, rollup("c1", 1, need(cpu=8, requirements=[zone_in("zone-z")])), now=0)

    engine.cycle(now=1)
    engine.cycle(now=2)
    answer = engine.inspect_needs("c1")
    (verdict,) = answer.verdicts

    assert answer.cycle == 2
    assert not verdict.satisfied
    assert verdict.reason == UnmetReason.NO_MATCHING_SUPPLY
    assert verdict.detail.startswith("no matching supply")
    assert verdict.deficit == {"cpu": 8.0}
    assert verdict.age_cycles == 2
    assert verdict.matching is not None
    assert (verdict.matching.idle, verdict.matching.configured) == (0, 0)


def test_a_need_held_off_by_higher_priorities_is_priority_starved_and_sees_the_supply() -> None:
    engine = ShardEngine()
    fleet(engine, 3, state=MachineState.CONFIGURED, cluster="high")
    apply(engine, rollup("high", 1, need(cpu=12, priority=900)), now=0)
    apply(engine, rollup("low", 1, need(cpu=4, priority=100)), now=0)

    engine.cycle(now=1)
    (low,) = engine.inspect_needs("low").verdicts

    assert low.reason == UnmetReason.PRIORITY_STARVED
    assert low.matching is not None and low.matching.configured == 3
    assert low.victims == 0


def test_preemption_reports_the_victims_it_took_and_what_they_hold() -> None:
    engine = ShardEngine()
    fleet(engine, 2, state=MachineState.CONFIGURED, cluster="low")
    apply(engine, rollup("low", 1, need(cpu=8, priority=10)), now=0)
    apply(engine, rollup("high", 1, need(cpu=8, priority=1_000_000)), now=0)

    engine.cycle(now=1)
    (high,) = engine.inspect_needs("high").verdicts

    assert high.victims == 2
    assert high.victims_hold["cpu"] == 8.0
    assert high.satisfied  # the victims count for the preemptor at once


def test_verdicts_come_highest_priority_first_and_a_limit_keeps_the_total() -> None:
    engine = ShardEngine()
    apply(engine, rollup("a", 1, need(cpu=1, priority=5), need(cpu=2, priority=50)), now=0)
    apply(engine, rollup("b", 1, need(cpu=1, priority=20)), now=0)
    engine.cycle(now=1)

    every = engine.inspect_needs()
    first = engine.inspect_needs(limit=1)

    assert [v.need.priority for v in every.verdicts] == [50, 20, 5]
    assert first.total == 3 and [v.need.priority for v in first.verdicts] == [50]


def test_an_unknown_cluster_has_no_verdicts_and_a_negative_limit_is_refused() -> None:
    engine = ShardEngine()
    apply(engine, rollup("a", 1, need(cpu=1)), now=0)
    engine.cycle(now=1)

    assert engine.inspect_needs("nobody").total == 0
    with pytest.raises(ValueError, match="limit"):
        engine.inspect_needs(limit=-1)


def test_dry_runs_leave_the_last_cycle_as_it_was() -> None:
    engine = ShardEngine()
    fleet(engine, 1, state=MachineState.IDLE)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)
    Carrier(engine).run(now=1)

    apply(engine, rollup("c1", 2, need(cpu=40)), now=2)
    engine.cycle(now=3, dry_run=True)
    answer = engine.inspect_needs()

    assert answer.cycle == 1 and answer.computed_at == 1
    assert answer.verdicts[0].satisfied
