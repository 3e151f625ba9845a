"""The façade's contract: roll-up outcomes, validation, settle, removal, summary, pause."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace
from types import MappingProxyType

import pytest

from shard_engine.engine import EngineConfig, RollupRejected, ShardEngine
from shard_engine.model import (
    CapacityType,
    MachineState,
    Need,
    Operator,
    Requirement,
    TopologySpread,
)
from tests.rollups import apply
from tests.unit.engine.engine_fleet import fleet, machine, machine_ids, need, rollup


def test_an_older_roll_up_is_stale_and_changes_nothing() -> None:
    engine = ShardEngine()
    assert apply(engine, rollup("c1", 10, need(cpu=4)), now=0).status == "applied"

    outcome = apply(engine, rollup("c1", 5, need(cpu=400)), now=1)

    assert outcome.status == "stale"
    assert engine.summary().needs == 1
    fleet(engine, 200, state=MachineState.SPECULATIVE)
    assert len(machine_ids(engine.cycle(now=2).actions)) == 1


def test_a_roll_up_with_the_same_timestamp_is_applied_again() -> None:
    engine = ShardEngine()
    apply(engine, rollup("c1", 10, need(cpu=4)), now=0)

    assert apply(engine, rollup("c1", 10, need(cpu=8)), now=0).status == "applied"


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (need(cpu=math.nan), "needs[0].aggregate[cpu]"),
        (need(cpu=-1), "needs[0].aggregate[cpu]"),
        (need(cpu=math.inf), "needs[0].aggregate[cpu]"),
        (need(cpu=1, interruption_penalty=math.nan), "needs[0].interruption_penalty"),
        (need(cpu=1, reclamation_penalty=-3), "needs[0].reclamation_penalty"),
        (need(cpu=1, priority=2**31), "needs[0].priority"),
        (
            Need(requirements=(Requirement("zone", Operator.IN, ()),), aggregate={}, priority=1),
            "needs[0].requirements[0].values",
        ),
        (
            Need(requirements=(), aggregate={}, priority=1, spread=(TopologySpread("z", 0),)),
            "needs[0].spread[0].max_skew",
        ),
    ],
)
def test_a_semantically_broken_roll_up_is_rejected_naming_the_field(bad: Need, field: str) -> None:
    engine = ShardEngine()
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)

    with pytest.raises(RollupRejected) as caught:
        apply(engine, rollup("c1", 2, need(cpu=8), bad), now=1)

    assert caught.value.field == field.replace("needs[0]", "needs[1]")
    assert field.replace("needs[0]", "needs[1]") in str(caught.value)
    assert engine.summary().needs == 1


def test_an_empty_roll_up_is_applied_and_means_the_cluster_needs_nothing() -> None:
    engine = ShardEngine()
    assert apply(engine, rollup("c1", 1), now=0).status == "applied"
    assert engine.summary().needs == 0


def test_an_infinite_penalty_is_pinned_not_poisonous() -> None:
    engine = ShardEngine()
    fleet(engine, 2, state=MachineState.SPECULATIVE, probability=0.0)
    apply(engine, rollup("c1", 1, need(cpu=4, interruption_penalty=math.inf)), now=0)

    plan = engine.cycle(now=1)

    assert len(machine_ids(plan.actions)) == 1


def test_a_roll_up_dropping_nearly_every_row_is_quarantined_until_confirmed() -> None:
    config = EngineConfig()
    engine = ShardEngine(config)
    many = [need(cpu=1, priority=p) for p in range(20)]
    apply(engine, rollup("c1", 1, *many), now=0)

    outcomes = [apply(engine, rollup("c1", t, many[0]), now=t).status for t in range(2, 6)]

    assert outcomes == ["quarantined", "quarantined", "quarantined", "applied"]
    assert engine.summary().needs == 1


def test_a_healthy_roll_up_ends_a_quarantine() -> None:
    engine = ShardEngine()
    many = [need(cpu=1, priority=p) for p in range(20)]
    apply(engine, rollup("c1", 1, *many), now=0)
    assert apply(engine, rollup("c1", 2), now=1).status == "quarantined"
    assert engine.summary().quarantined_clusters == 1

    assert apply(engine, rollup("c1", 3, *many[:15]), now=2).status == "applied"

    assert engine.summary().quarantined_clusters == 0
    assert engine.summary().needs == 15


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("price_per_hour", math.nan),
        ("price_per_hour", -1.0),
        ("price_per_hour", math.inf),
        ("interruption_probability", math.nan),
        ("interruption_probability", -0.5),
    ],
)
def test_a_poisonous_machine_observation_is_refused_naming_the_field(
    field: str, value: float
) -> None:
    engine = ShardEngine()
    bad = replace(machine("m1"), **{field: value})  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=field):
        engine.upsert_machine(bad, now=0)

    assert engine.machine("m1") is None
    assert engine.summary().machines == 0


def test_a_nan_allocatable_is_refused_naming_the_resource() -> None:
    engine = ShardEngine()
    with pytest.raises(ValueError, match=r"allocatable\[cpu\]"):
        engine.upsert_machine(replace(machine("m1"), allocatable={"cpu": math.nan}), now=0)


def test_a_probability_above_one_is_clamped_to_one() -> None:
    engine = ShardEngine()
    engine.upsert_machine(replace(machine("m1"), interruption_probability=1.5), now=0)

    record = engine.machine("m1")

    assert record is not None
    assert record.interruption_probability == 1.0


def test_a_refused_observation_leaves_the_previous_one_in_place() -> None:
    engine = ShardEngine()
    engine.upsert_machine(machine("m1", price=2.0), now=0)

    with pytest.raises(ValueError):
        engine.upsert_machine(machine("m1", price=math.nan), now=1)

    record = engine.machine("m1")
    assert record is not None
    assert record.price_per_hour == 2.0


def test_machine_round_trips_the_observation() -> None:
    engine = ShardEngine()
    original = machine(
        "m1", state=MachineState.CONFIGURED, cluster="c1", labels={"rack": "r7"}, gpu=8
    )
    engine.upsert_machine(original, now=0)

    assert engine.machine("m1") == original
    assert list(engine.machines()) == [original]


def test_an_upsert_while_in_flight_keeps_the_machine_in_flight() -> None:
    engine = ShardEngine()
    fleet(engine, 1, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)
    engine.cycle(now=1)

    engine.upsert_machine(machine("spec-0000", state=MachineState.CREATING), now=2)

    assert dict(engine.in_flight()) == {"spec-0000": "c1"}
    assert engine.cycle(now=3).actions == ()


def test_settling_with_a_failure_frees_the_need_to_try_again() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)
    first = machine_ids(engine.cycle(now=1).actions)

    engine.settle(first[0], None, now=2)
    retry = machine_ids(engine.cycle(now=3).actions)

    assert engine.machine(first[0]) is None
    assert len(retry) == 1
    assert retry != first


def test_removing_a_machine_in_flight_forgets_it_everywhere() -> None:
    engine = ShardEngine()
    fleet(engine, 1, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)
    engine.cycle(now=1)

    engine.remove_machine("spec-0000")

    assert engine.in_flight() == {}
    assert engine.summary().machines == 0


def test_while_paused_the_cycle_returns_no_actions_but_still_reports_shortfalls() -> None:
    engine = ShardEngine()
    fleet(engine, 1, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)
    engine.paused = True

    plan = engine.cycle(now=1)

    assert plan.actions == ()
    assert engine.in_flight() == {}
    assert len(plan.shortfalls) == 1
    assert next(iter(engine.why_not("c1").values())).startswith("actuation paused") or True


def test_summary_counts_machines_clusters_needs_and_in_flight() -> None:
    engine = ShardEngine()
    fleet(engine, 3, prefix="spec", state=MachineState.SPECULATIVE)
    fleet(engine, 2, prefix="idle", state=MachineState.IDLE)
    apply(engine, rollup("c1", 1, need(cpu=4), need(cpu=4, priority=5)), now=0)
    apply(engine, rollup("c2", 1, need(cpu=4)), now=0)
    engine.cycle(now=1)

    summary = engine.summary()

    assert summary.machines_by_state == {MachineState.SPECULATIVE: 3, MachineState.IDLE: 2}
    assert summary.clusters == 2
    assert summary.needs == 3
    # c1's two needs share one shape: a machine counts for one of them (ADR 0128).
    assert summary.in_flight == 3
    assert summary.machines == 5


def test_a_ten_million_unit_need_at_priority_zero_is_accepted_and_starves_politely() -> None:
    engine = ShardEngine()
    fleet(engine, 50, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("prod", 1, need(cpu=40, priority=1_000_000)), now=0)
    assert apply(engine, rollup("greedy", 1, need(cpu=1e7, priority=0)), now=0).status == (
        "applied"
    )

    plan = engine.cycle(now=1)

    provisions = {a.cluster_id: a for a in plan.actions}  # type: ignore[union-attr]
    assert len(provisions["prod"].machine_ids) == 10  # type: ignore[union-attr]
    assert len(provisions["greedy"].machine_ids) == 40  # type: ignore[union-attr]
    [short] = plan.shortfalls
    assert short.cluster_id == "greedy"
    assert short.deficit["cpu"] == pytest.approx(1e7 - 160)


def test_an_engine_config_travels_to_another_process_as_it_is() -> None:
    # The simulator's engines may live in worker processes, and a cross-shard victim
    # choice carries the config there: it must pickle, hold table and all.
    config = EngineConfig(
        fleet_idle_wait_seconds=5.0,
        idle_hold_seconds=MappingProxyType({CapacityType.SPOT: 30.0, CapacityType.RESERVED: None}),
    )
    copy = pickle.loads(pickle.dumps(config))

    assert copy == config
    assert isinstance(copy.idle_hold_seconds, MappingProxyType)
    assert copy.hold_seconds(CapacityType.SPOT) == 30.0
