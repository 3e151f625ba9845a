"""Shortfalls (bounded, aged, escalated) and why-not reasons per need."""

from __future__ import annotations

import pytest

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineState
from tests.rollups import apply
from tests.unit.engine.engine_fleet import fleet, need, rollup, same, spread_over


def test_a_shortfall_carries_the_residual_deficit_priority_and_penalty() -> None:
    engine = ShardEngine()
    fleet(engine, 1, state=MachineState.SPECULATIVE, cpu=4)
    apply(engine, rollup("c1", 1, need(cpu=10, priority=7, interruption_penalty=3.0)), now=0)

    [short] = engine.cycle(now=1).shortfalls

    assert short.cluster_id == "c1"
    assert short.priority == 7
    assert short.deficit == {"cpu": pytest.approx(6.0)}
    assert short.interruption_penalty == 3.0
    assert short.age_cycles == 1
    assert not short.escalated


def test_shortfalls_age_per_cycle_and_escalate_after_five() -> None:
    engine = ShardEngine()
    apply(engine, rollup("c1", 1, need(cpu=10)), now=0)

    ages = []
    for t in range(1, 8):
        [short] = engine.cycle(now=t).shortfalls
        ages.append((short.age_cycles, short.escalated))

    assert ages == [
        (1, False),
        (2, False),
        (3, False),
        (4, False),
        (5, False),
        (6, True),
        (7, True),
    ]


def test_a_dry_run_does_not_age_shortfalls() -> None:
    engine = ShardEngine()
    apply(engine, rollup("c1", 1, need(cpu=10)), now=0)
    engine.cycle(now=1)
    engine.cycle(now=2, dry_run=True)
    engine.cycle(now=3, dry_run=True)

    [short] = engine.cycle(now=4).shortfalls

    assert short.age_cycles == 2


def test_a_satisfied_need_forgets_its_age() -> None:
    engine = ShardEngine()
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)
    engine.cycle(now=1)
    engine.cycle(now=2)
    fleet(engine, 1, state=MachineState.IDLE)
    engine.cycle(now=3)
    engine.settle("m-0000", None, now=4)

    [short] = engine.cycle(now=5).shortfalls

    assert short.age_cycles == 1


def test_at_most_max_shortfalls_are_kept_highest_priority_first() -> None:
    engine = ShardEngine(EngineConfig(max_shortfalls=100))
    for c in range(150):
        apply(engine, rollup(f"c{c}", 1, need(cpu=1, priority=c)), now=0)

    shortfalls = engine.cycle(now=1).shortfalls

    assert len(shortfalls) == 100
    assert [s.priority for s in shortfalls] == list(range(149, 49, -1))


def test_why_not_says_no_matching_supply_when_nothing_fits() -> None:
    engine = ShardEngine()
    fleet(engine, 3, state=MachineState.IDLE, cpu=2)
    apply(engine, rollup("c1", 1, need(cpu=4, min_cpu=4)), now=0)
    engine.cycle(now=1)

    [reason] = engine.why_not("c1").values()

    assert reason.startswith("no matching supply")


def test_why_not_says_priority_starved_when_higher_priorities_hold_everything() -> None:
    engine = ShardEngine()
    fleet(engine, 2, state=MachineState.CONFIGURED, cluster="prod")
    apply(engine, rollup("prod", 1, need(cpu=8, priority=100)), now=0)
    apply(engine, rollup("batch", 1, need(cpu=4, priority=1)), now=0)
    engine.cycle(now=1)

    [reason] = engine.why_not("batch").values()

    assert reason.startswith("priority-starved")


def test_why_not_says_preemption_exhausted_when_victims_ran_out() -> None:
    engine = ShardEngine()
    fleet(engine, 1, state=MachineState.CONFIGURED, cluster="low")
    apply(engine, rollup("low", 1, need(cpu=4, priority=1)), now=0)
    apply(engine, rollup("high", 1, need(cpu=8, priority=100)), now=0)
    engine.cycle(now=1)

    [reason] = engine.why_not("high").values()

    assert reason.startswith("preemption exhausted")


def test_why_not_says_topology_unsatisfiable_for_a_gang_no_domain_can_hold() -> None:
    engine = ShardEngine()
    for rack in ("r1", "r2"):
        fleet(engine, 2, prefix=rack, state=MachineState.IDLE, labels={"rack": rack})
    apply(engine, rollup("c1", 1, need(cpu=12, requirements=[same("rack")])), now=0)
    plan = engine.cycle(now=1)

    [reason] = engine.why_not("c1").values()

    assert plan.actions == ()
    assert reason.startswith("topology unsatisfiable")


def test_why_not_names_a_hard_spread_that_cannot_be_met() -> None:
    engine = ShardEngine()
    fleet(engine, 4, prefix="a", state=MachineState.IDLE, zone="a")
    fleet(engine, 1, prefix="b", state=MachineState.CONFIGURED, zone="b", cluster="other")
    apply(engine, rollup("other", 1, need(cpu=4, priority=99)), now=0)
    apply(
        engine,
        rollup("c1", 1, need(cpu=16, spread=[spread_over("topology.kubernetes.io/zone")])),
        now=0,
    )
    engine.cycle(now=1)

    [reason] = engine.why_not("c1").values()

    assert reason.startswith("topology unsatisfiable")


def test_why_not_is_empty_for_a_satisfied_cluster_and_unknown_clusters() -> None:
    engine = ShardEngine()
    fleet(engine, 1, state=MachineState.IDLE)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)
    engine.cycle(now=1)

    assert engine.why_not("c1") == {}
    assert engine.why_not("nobody") == {}
