"""Phase 1 through the façade: have, deficit, idle before speculative, cost, batching."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shard_engine.engine import ShardEngine
from shard_engine.model import AssignIdle, CapacityType, MachineState, Provision
from tests.rollups import apply
from tests.unit.engine.engine_fleet import (
    Carrier,
    fleet,
    machine,
    machine_ids,
    need,
    of_kind,
    rollup,
    zone_in,
)


def test_a_need_is_covered_from_idle_machines_before_speculative_ones() -> None:
    engine = ShardEngine()
    idle = fleet(engine, 2, prefix="idle", state=MachineState.IDLE, price=3.0)
    fleet(engine, 5, prefix="spec", state=MachineState.SPECULATIVE, price=0.5)
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)

    plan = engine.cycle(now=1)

    assert sorted(machine_ids(plan.actions)) == sorted(idle)
    assert all(isinstance(a, AssignIdle) for a in plan.actions)


def test_speculative_machines_for_one_need_come_as_one_batched_provision() -> None:
    engine = ShardEngine()
    fleet(engine, 10, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=12)), now=0)

    plan = engine.cycle(now=1)

    provisions = of_kind(plan, Provision)
    assert len(provisions) == 1
    assert isinstance(provisions[0], Provision)
    assert len(provisions[0].machine_ids) == 3
    assert provisions[0].cluster_id == "c1"


def test_machines_in_flight_count_as_have_so_a_second_cycle_issues_nothing() -> None:
    engine = ShardEngine()
    fleet(engine, 10, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=12)), now=0)

    first = engine.cycle(now=1)
    second = engine.cycle(now=2)

    assert len(machine_ids(first.actions)) == 3
    assert second.actions == ()
    assert set(engine.in_flight()) == set(machine_ids(first.actions))
    assert set(engine.in_flight().values()) == {"c1"}


def test_a_dry_run_returns_the_plan_and_marks_nothing() -> None:
    engine = ShardEngine()
    fleet(engine, 10, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=12)), now=0)

    dry = engine.cycle(now=1, dry_run=True)
    real = engine.cycle(now=2)

    assert dry.dry_run
    assert machine_ids(dry.actions) == machine_ids(real.actions)
    assert len(engine.in_flight()) == 3


def test_settled_machines_are_configured_and_the_need_stays_satisfied() -> None:
    engine = ShardEngine()
    fleet(engine, 10, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=12)), now=0)
    carrier = Carrier(engine)

    carrier.run(now=1)
    later = engine.cycle(now=5)

    assert later.actions == ()
    assert engine.in_flight() == {}
    assert engine.summary().machines_by_state[MachineState.CONFIGURED] == 3


def test_spot_at_a_five_dollar_penalty_beats_on_demand() -> None:
    # Paper §4: spot $1.80/h, 10 %/h interruption, $5 penalty -> $2.30/h < $6.00/h.
    engine = ShardEngine()
    engine.upsert_machine(
        machine(
            "spot",
            state=MachineState.SPECULATIVE,
            capacity_type=CapacityType.SPOT,
            price=1.80,
            probability=0.10,
        ),
        now=0,
    )
    engine.upsert_machine(machine("od", state=MachineState.SPECULATIVE, price=6.00), now=0)
    apply(engine, rollup("c1", 1, need(cpu=4, interruption_penalty=5.0)), now=0)

    assert machine_ids(engine.cycle(now=1).actions) == ["spot"]


def test_on_demand_wins_when_the_interruption_penalty_is_fifty_dollars() -> None:
    # Paper §4: the same spot at a $50 penalty costs $6.80/h > $6.00/h on demand.
    engine = ShardEngine()
    engine.upsert_machine(
        machine(
            "spot",
            state=MachineState.SPECULATIVE,
            capacity_type=CapacityType.SPOT,
            price=1.80,
            probability=0.10,
        ),
        now=0,
    )
    engine.upsert_machine(machine("od", state=MachineState.SPECULATIVE, price=6.00), now=0)
    apply(engine, rollup("c1", 1, need(cpu=4, interruption_penalty=50.0)), now=0)

    assert machine_ids(engine.cycle(now=1).actions) == ["od"]


def test_a_small_machine_beats_a_big_one_that_is_cheaper_per_core_for_a_small_need() -> None:
    # Seed 004: the 64-core box is cheapest per core and still wrong for three cores.
    engine = ShardEngine()
    engine.upsert_machine(machine("big", state=MachineState.SPECULATIVE, cpu=64, price=6.4), now=0)
    engine.upsert_machine(machine("small", state=MachineState.SPECULATIVE, cpu=4, price=0.8), now=0)
    apply(engine, rollup("c1", 1, need(cpu=3)), now=0)

    assert machine_ids(engine.cycle(now=1).actions) == ["small"]


def test_the_big_machine_wins_once_the_need_fills_it() -> None:
    engine = ShardEngine()
    engine.upsert_machine(machine("big", state=MachineState.SPECULATIVE, cpu=64, price=6.4), now=0)
    fleet(engine, 20, prefix="small", state=MachineState.SPECULATIVE, cpu=4, price=0.8)
    apply(engine, rollup("c1", 1, need(cpu=60)), now=0)

    assert machine_ids(engine.cycle(now=1).actions) == ["big"]


def test_every_machine_chosen_holds_the_min_unit_on_its_own() -> None:
    engine = ShardEngine()
    fleet(engine, 10, prefix="small", state=MachineState.IDLE, cpu=2, price=0.1)
    fleet(engine, 2, prefix="large", state=MachineState.SPECULATIVE, cpu=16, price=5.0)
    apply(engine, rollup("c1", 1, need(cpu=16, min_cpu=8)), now=0)

    plan = engine.cycle(now=1)

    assert all(mid.startswith("large") for mid in machine_ids(plan.actions))
    assert len(machine_ids(plan.actions)) == 1


def test_requirements_restrict_the_machines_chosen() -> None:
    engine = ShardEngine()
    fleet(engine, 3, prefix="a", zone="zone-a")
    fleet(engine, 3, prefix="b", zone="zone-b")
    apply(engine, rollup("c1", 1, need(cpu=8, requirements=[zone_in("zone-b")])), now=0)

    plan = engine.cycle(now=1)

    assert sorted(machine_ids(plan.actions)) == ["b-0001", "b-0002"] or all(
        m.startswith("b-") for m in machine_ids(plan.actions)
    )
    assert len(plan.actions) == 2


def test_configured_machines_of_the_cluster_are_counted_before_buying_more() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="have", state=MachineState.CONFIGURED, cluster="c1")
    fleet(engine, 5, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=12)), now=0)

    plan = engine.cycle(now=1)

    assert len(machine_ids(plan.actions)) == 1


def test_machines_of_another_cluster_do_not_count_as_have() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="other", state=MachineState.CONFIGURED, cluster="c2")
    fleet(engine, 5, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)

    plan = engine.cycle(now=1)

    assert len(machine_ids(plan.actions)) == 2
    assert all(m.startswith("spec") for m in machine_ids(plan.actions))


def test_higher_priority_needs_are_served_first_when_supply_is_short() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="idle")
    apply(engine, rollup("low", 1, need(cpu=8, priority=10)), now=0)
    apply(engine, rollup("high", 1, need(cpu=8, priority=20)), now=0)

    plan = engine.cycle(now=1)

    assert {a.cluster_id for a in of_kind(plan, AssignIdle)} == {"high"}
    assert [s.cluster_id for s in plan.shortfalls] == ["low"]


def test_at_equal_priority_the_earlier_arrival_is_served_first() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="idle")
    apply(engine, rollup("first", 1, need(cpu=8, priority=10)), now=0)
    apply(engine, rollup("second", 1, need(cpu=8, priority=10)), now=0)

    plan = engine.cycle(now=1)

    assert {a.cluster_id for a in of_kind(plan, AssignIdle)} == {"first"}


def test_transitional_and_failed_machines_are_never_picked() -> None:
    engine = ShardEngine()
    for i, state in enumerate(
        [
            MachineState.CREATING,
            MachineState.CONFIGURING,
            MachineState.DRAINING,
            MachineState.DELETING,
            MachineState.FAILED,
        ]
    ):
        cluster = "x" if state in (MachineState.CONFIGURING, MachineState.DRAINING) else ""
        engine.upsert_machine(machine(f"t{i}", state=state, cluster=cluster), now=0)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)

    plan = engine.cycle(now=1)

    assert plan.actions == ()
    assert len(plan.shortfalls) == 1


def test_a_creating_machine_reported_for_a_cluster_counts_toward_it() -> None:
    engine = ShardEngine()
    creating = replace(machine("c", state=MachineState.CREATING), cluster="c1")
    engine.upsert_machine(creating, now=0)
    fleet(engine, 3, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)

    assert engine.cycle(now=1).actions == ()
    assert engine.machine("c") is not None
    assert engine.machine("c").cluster == ""  # type: ignore[union-attr]


@pytest.mark.parametrize("cpu", [0.001, 3.999, 4.0, 4.001])
def test_machine_counts_round_up_to_cover_the_whole_deficit(cpu: float) -> None:
    engine = ShardEngine()
    fleet(engine, 5, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=cpu)), now=0)

    ids = machine_ids(engine.cycle(now=1).actions)

    assert len(ids) == (1 if cpu <= 4.0 else 2)
