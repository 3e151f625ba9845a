"""Phase 3: reclaim excess most-expensive first under a rate cap; release idle cloud machines."""

from __future__ import annotations

import pytest

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import CapacityType, MachineState, Reclaim, Release
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


def test_excess_machines_are_reclaimed_most_expensive_first() -> None:
    engine = ShardEngine()
    fleet(engine, 1, prefix="cheap", state=MachineState.CONFIGURED, cluster="c1", price=0.1)
    fleet(engine, 1, prefix="dear", state=MachineState.CONFIGURED, cluster="c1", price=9.0)
    engine.apply_rollup(rollup("c1", 1, need(cpu=4)), now=0)

    plan = engine.cycle(now=1)

    assert machine_ids(plan.actions) == ["dear-0000"]
    [action] = plan.actions
    assert isinstance(action, Reclaim)
    assert action.cluster_id == "c1"
    assert action.grace_seconds == EngineConfig().reclaim_grace_seconds


def test_at_equal_price_the_lower_reclamation_penalty_goes_first() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="precious", state=MachineState.CONFIGURED, cluster="c1", zone="z1")
    fleet(engine, 2, prefix="plain", state=MachineState.CONFIGURED, cluster="c1", zone="z2")
    engine.apply_rollup(
        rollup(
            "c1",
            1,
            need(cpu=4, requirements=[zone_in("z1")], reclamation_penalty=8000),
            need(cpu=4, requirements=[zone_in("z2")], reclamation_penalty=0),
        ),
        now=0,
    )

    plan = engine.cycle(now=1)

    assert [m[:5] for m in machine_ids(plan.actions)] == ["plain"]


def test_machines_matching_no_need_are_excess() -> None:
    engine = ShardEngine()
    fleet(engine, 3, prefix="z2", state=MachineState.CONFIGURED, cluster="c1", zone="z2")
    engine.apply_rollup(rollup("c1", 1, need(cpu=1, requirements=[zone_in("z1")])), now=0)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Reclaim)) == 1  # rate cap: max(1, 5 % of 3)


@pytest.mark.parametrize(("configured", "per_cycle"), [(10, 1), (40, 2), (100, 5), (1000, 50)])
def test_reclaims_per_cluster_and_cycle_are_capped_at_five_percent(
    configured: int, per_cycle: int
) -> None:
    engine = ShardEngine()
    fleet(engine, configured, state=MachineState.CONFIGURED, cluster="c1")
    engine.apply_rollup(rollup("c1", 1, need(cpu=1)), now=0)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Reclaim)) == per_cycle


def test_reclaim_continues_over_cycles_until_only_the_need_is_left() -> None:
    engine = ShardEngine()
    fleet(engine, 10, state=MachineState.CONFIGURED, cluster="c1")
    engine.apply_rollup(rollup("c1", 1, need(cpu=8)), now=0)

    Carrier(engine).run(now=1, cycles=20)

    assert engine.summary().machines_by_state[MachineState.CONFIGURED] == 2


def test_a_cluster_that_never_sent_a_roll_up_keeps_its_machines() -> None:
    engine = ShardEngine()
    fleet(engine, 5, state=MachineState.CONFIGURED, cluster="quiet")
    engine.apply_rollup(rollup("other", 1), now=0)

    assert engine.cycle(now=1).actions == ()


def test_a_quarantined_roll_up_does_not_reclaim_anything() -> None:
    engine = ShardEngine()
    rows = []
    for p in range(20):
        fleet(engine, 1, prefix=f"z{p}", state=MachineState.CONFIGURED, cluster="c1", zone=f"z{p}")
        rows.append(need(cpu=4, priority=p, requirements=[zone_in(f"z{p}")]))
    engine.apply_rollup(rollup("c1", 1, *rows), now=0)
    engine.cycle(now=1)

    assert engine.apply_rollup(rollup("c1", 2), now=2).status == "quarantined"

    assert engine.cycle(now=3).actions == ()


def test_machines_in_flight_are_never_reclaimed() -> None:
    engine = ShardEngine()
    fleet(engine, 4, prefix="spec", state=MachineState.SPECULATIVE)
    engine.apply_rollup(rollup("c1", 1, need(cpu=8)), now=0)
    engine.cycle(now=1)
    engine.apply_rollup(rollup("c1", 2), now=2)

    assert engine.cycle(now=3).actions == ()


def idle_machine(machine_id: str, capacity_type: CapacityType) -> object:
    return machine(machine_id, state=MachineState.IDLE, capacity_type=capacity_type)


@pytest.mark.parametrize(
    ("capacity_type", "released_after"),
    [
        (CapacityType.ON_DEMAND, 600),
        (CapacityType.SPOT, 60),
        (CapacityType.RESERVED, None),
        (CapacityType.BARE_METAL, None),
    ],
)
def test_idle_machines_are_released_after_their_capacity_types_hold(
    capacity_type: CapacityType, released_after: int | None
) -> None:
    engine = ShardEngine()
    engine.upsert_machine(machine("m", state=MachineState.IDLE, capacity_type=capacity_type), now=0)

    before = engine.cycle(now=(released_after or 600) - 1, dry_run=True)
    after = engine.cycle(now=(released_after or 10_000_000), dry_run=True)

    assert before.actions == ()
    if released_after is None:
        assert after.actions == ()
    else:
        assert machine_ids(of_kind(after, Release)) == ["m"]


def test_recent_demand_for_a_shape_holds_its_idle_machines() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="idle", state=MachineState.IDLE, capacity_type=CapacityType.SPOT)
    engine.apply_rollup(rollup("c1", 1, need(cpu=4)), now=0)
    carrier = Carrier(engine)
    carrier.run(now=100)  # draws one machine of the shape at t=100

    assert of_kind(engine.cycle(now=200, dry_run=True), Release) == []
    assert len(of_kind(engine.cycle(now=800, dry_run=True), Release)) == 1


def test_a_released_machine_is_in_flight_until_it_settles() -> None:
    engine = ShardEngine()
    engine.upsert_machine(machine("m", state=MachineState.IDLE), now=0)

    plan = engine.cycle(now=1000)
    again = engine.cycle(now=1001)

    assert machine_ids(plan.actions) == ["m"]
    assert dict(engine.in_flight()) == {"m": ""}
    assert again.actions == ()
    Carrier(engine).carry(plan, now=1002)
    record = engine.machine("m")
    assert record is not None
    assert record.state == MachineState.SPECULATIVE
