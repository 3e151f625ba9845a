"""Phase 3: reclaim excess most-expensive first under a rate cap; release idle cloud machines.

Most tests here use ``EAGER``: no hysteresis, no minimum age, no demand
window, so one cycle shows the order and caps. The rules that make reclaim
wait for excess to persist are tested at the end with the defaults.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import CapacityType, MachineState, Reclaim, Release
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

EAGER = EngineConfig(
    reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
)


def test_excess_machines_are_reclaimed_most_expensive_first() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 1, prefix="cheap", state=MachineState.CONFIGURED, cluster="c1", price=0.1)
    fleet(engine, 1, prefix="dear", state=MachineState.CONFIGURED, cluster="c1", price=9.0)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)

    plan = engine.cycle(now=1)

    assert machine_ids(plan.actions) == ["dear-0000"]
    [action] = plan.actions
    assert isinstance(action, Reclaim)
    assert action.cluster_id == "c1"
    assert action.grace_seconds == EngineConfig().reclaim_grace_seconds


def test_at_equal_price_the_lower_reclamation_penalty_goes_first() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 2, prefix="precious", state=MachineState.CONFIGURED, cluster="c1", zone="z1")
    fleet(engine, 2, prefix="plain", state=MachineState.CONFIGURED, cluster="c1", zone="z2")
    apply(
        engine,
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
    engine = ShardEngine(EAGER)
    fleet(engine, 3, prefix="z2", state=MachineState.CONFIGURED, cluster="c1", zone="z2")
    apply(engine, rollup("c1", 1, need(cpu=1, requirements=[zone_in("z1")])), now=0)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Reclaim)) == 1  # rate cap: max(1, 5 % of 3)


@pytest.mark.parametrize(("configured", "per_cycle"), [(10, 1), (40, 2), (100, 5), (1000, 50)])
def test_reclaims_per_cluster_and_cycle_are_capped_at_five_percent(
    configured: int, per_cycle: int
) -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, configured, state=MachineState.CONFIGURED, cluster="c1")
    apply(engine, rollup("c1", 1, need(cpu=1)), now=0)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Reclaim)) == per_cycle


def test_reclaim_continues_over_cycles_until_only_the_need_is_left() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 10, state=MachineState.CONFIGURED, cluster="c1")
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)

    Carrier(engine).run(now=1, cycles=20)

    assert engine.summary().machines_by_state[MachineState.CONFIGURED] == 2


def test_a_cluster_that_never_sent_a_roll_up_keeps_its_machines() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 5, state=MachineState.CONFIGURED, cluster="quiet")
    apply(engine, rollup("other", 1), now=0)

    assert engine.cycle(now=1).actions == ()


def test_a_quarantined_roll_up_does_not_reclaim_anything() -> None:
    engine = ShardEngine(EAGER)
    rows = []
    for p in range(20):
        fleet(engine, 1, prefix=f"z{p}", state=MachineState.CONFIGURED, cluster="c1", zone=f"z{p}")
        rows.append(need(cpu=4, priority=p, requirements=[zone_in(f"z{p}")]))
    apply(engine, rollup("c1", 1, *rows), now=0)
    engine.cycle(now=1)

    assert apply(engine, rollup("c1", 2), now=2).status == "quarantined"

    assert engine.cycle(now=3).actions == ()


def test_machines_in_flight_are_never_reclaimed() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 4, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)
    engine.cycle(now=1)
    apply(engine, rollup("c1", 2), now=2)

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
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)
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


# -- excess must persist: hysteresis, minimum age, recent peak, unmet demand --------------


def reclaims(plan: object) -> list[str]:
    return machine_ids(of_kind(plan, Reclaim))  # type: ignore[arg-type]


def test_excess_is_reclaimed_only_after_the_hysteresis_cycles() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=3, reclaim_min_age_seconds=0, reclaim_window_seconds=0
    )
    engine = ShardEngine(config)
    fleet(engine, 3, state=MachineState.CONFIGURED, cluster="c1")
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)

    plans = [engine.cycle(now=t) for t in (1, 2, 3)]

    assert [len(reclaims(p)) for p in plans] == [0, 0, 1]


def test_a_dip_shorter_than_the_hysteresis_reclaims_nothing() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=3, reclaim_min_age_seconds=0, reclaim_window_seconds=0
    )
    engine = ShardEngine(config)
    fleet(engine, 3, state=MachineState.CONFIGURED, cluster="c1")
    apply(engine, rollup("c1", 1, need(cpu=12)), now=0)
    engine.cycle(now=1)
    apply(engine, rollup("c1", 2, need(cpu=4)), now=2)  # the dip
    dip = [engine.cycle(now=t) for t in (2, 3)]
    apply(engine, rollup("c1", 3, need(cpu=12)), now=4)  # back
    after = [engine.cycle(now=t) for t in (4, 5, 6)]

    assert [reclaims(p) for p in dip + after] == [[]] * 5


def test_dry_runs_do_not_advance_the_hysteresis() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=2, reclaim_min_age_seconds=0, reclaim_window_seconds=0
    )
    engine = ShardEngine(config)
    fleet(engine, 2, state=MachineState.CONFIGURED, cluster="c1")
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)

    for t in range(1, 6):
        assert reclaims(engine.cycle(now=t, dry_run=True)) == []
    first = engine.cycle(now=6)
    second = engine.cycle(now=7)

    assert reclaims(first) == []
    assert len(reclaims(second)) == 1


def test_a_machine_configured_less_than_the_minimum_age_ago_is_kept() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=600, reclaim_window_seconds=0
    )
    engine = ShardEngine(config)
    fleet(engine, 2, state=MachineState.CONFIGURED, cluster="c1", now=0)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=0)

    early = [engine.cycle(now=t) for t in (1, 300, 599)]
    due = engine.cycle(now=600)

    assert [reclaims(p) for p in early] == [[], [], []]
    assert len(reclaims(due)) == 1


def test_of_machines_no_need_wants_only_those_past_the_minimum_age_go() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=600, reclaim_window_seconds=0
    )
    engine = ShardEngine(config)
    fleet(engine, 1, prefix="old", state=MachineState.CONFIGURED, cluster="c1", zone="z9", now=0)
    fleet(
        engine, 2, prefix="young", state=MachineState.CONFIGURED, cluster="c1", zone="z9", now=500
    )
    apply(engine, rollup("c1", 1, need(cpu=4, requirements=[zone_in("z1")])), now=500)

    plan = engine.cycle(now=700)

    assert reclaims(plan) == ["old-0000"]


def test_a_need_that_grew_recently_keeps_every_machine_that_could_serve_it() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=600, reclaim_window_seconds=0
    )
    engine = ShardEngine(config)
    fleet(engine, 3, prefix="old", state=MachineState.CONFIGURED, cluster="c1", now=0)
    fleet(engine, 1, prefix="young", state=MachineState.CONFIGURED, cluster="c1", now=500)
    apply(engine, rollup("c1", 1, need(cpu=4)), now=500)

    while_growing = engine.cycle(now=700)
    later = engine.cycle(now=1100)

    assert reclaims(while_growing) == []
    assert len(reclaims(later)) == 1


def test_excess_is_judged_against_the_peak_of_the_demand_window() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=600
    )
    engine = ShardEngine(config)
    fleet(engine, 4, state=MachineState.CONFIGURED, cluster="c1")
    apply(engine, rollup("c1", 1, need(cpu=16)), now=0)
    apply(engine, rollup("c1", 2, need(cpu=4)), now=10)

    within = [engine.cycle(now=t) for t in range(10, 600, 10)]
    after = engine.cycle(now=700)

    assert all(reclaims(p) == [] for p in within)
    assert len(reclaims(after)) == 1


def test_a_need_that_vanished_within_the_window_keeps_its_machines() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=600
    )
    engine = ShardEngine(config)
    fleet(engine, 2, prefix="a", state=MachineState.CONFIGURED, cluster="c1", zone="z1")
    fleet(engine, 1, prefix="b", state=MachineState.CONFIGURED, cluster="c1", zone="z2")
    job = need(cpu=8, requirements=[zone_in("z1")])
    web = need(cpu=4, requirements=[zone_in("z2")])
    apply(engine, rollup("c1", 1, job, web), now=0)
    apply(engine, rollup("c1", 2, web), now=60)  # the job finished

    within = engine.cycle(now=300)
    after = engine.cycle(now=800)

    assert reclaims(within) == []
    assert [m[:2] for m in reclaims(after)] == ["a-"]


def test_machines_on_their_way_to_a_need_block_its_reclaim() -> None:
    # The churn: configured machines drained while others still configured.
    engine = ShardEngine(EAGER)
    fleet(engine, 10, prefix="up", state=MachineState.CONFIGURED, cluster="c1")
    fleet(engine, 2, prefix="idle", state=MachineState.IDLE)
    apply(engine, rollup("c1", 1, need(cpu=48)), now=0)
    rising = engine.cycle(now=1)  # two idle machines are sent to configure
    apply(engine, rollup("c1", 2, need(cpu=36)), now=2)

    falling = engine.cycle(now=3)

    assert len(machine_ids(rising.actions)) == 2
    assert reclaims(falling) == []


def test_a_short_need_blocks_the_reclaim_of_machines_that_could_serve_it() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 3, state=MachineState.CONFIGURED, cluster="c1", zone="z1")
    apply(engine, rollup("c1", 1, need(cpu=4), need(cpu=40, requirements=[zone_in("z1")])), now=0)

    plan = engine.cycle(now=1)

    assert reclaims(plan) == []
    assert plan.shortfalls


def test_a_short_need_the_machine_cannot_serve_does_not_block_it() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 3, prefix="z1", state=MachineState.CONFIGURED, cluster="c1", zone="z1")
    apply(engine, rollup("c1", 1, need(cpu=4), need(cpu=40, requirements=[zone_in("z9")])), now=0)

    assert len(reclaims(engine.cycle(now=1))) == 1


def test_invalid_reclaim_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="reclaim_hysteresis_cycles"):
        EngineConfig(reclaim_hysteresis_cycles=0)
    with pytest.raises(ValueError, match="reclaim_min_age_seconds"):
        EngineConfig(reclaim_min_age_seconds=-1)
    with pytest.raises(ValueError, match="reclaim_window_seconds"):
        EngineConfig(reclaim_window_seconds=float("nan"))


def test_a_swinging_need_keeps_half_its_swing_above_its_peak() -> None:
    config = EngineConfig(
        reclaim_hysteresis_cycles=1,
        reclaim_min_age_seconds=0,
        reclaim_window_seconds=600,
        reclaim_swing_margin=0.5,
    )

    def reclaimed(config: EngineConfig) -> int:
        engine = ShardEngine(config)
        fleet(engine, 6, state=MachineState.CONFIGURED, cluster="c1")  # 24 cores
        apply(engine, rollup("c1", 1, need(cpu=8)), now=0)
        apply(engine, rollup("c1", 2, need(cpu=16)), now=10)  # peak 16, swing 8
        return sum(len(reclaims(engine.cycle(now=t))) for t in (20, 25, 30, 35))

    assert reclaimed(config) == 1  # keeps 16 + 8 / 2 = 20 cores
    assert reclaimed(replace(config, reclaim_swing_margin=0.0)) == 2  # keeps 16


def test_excess_left_by_the_rate_cap_is_counted_for_metrics() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 10, state=MachineState.CONFIGURED, cluster="c1")
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)

    plan = engine.cycle(now=1)

    assert len(reclaims(plan)) == 1  # max(1, 5 % of 10)
    assert engine.stats.reclaims_capped == 7  # the other excess machines wait


def test_a_stopwatch_times_every_stage_of_the_cycle() -> None:
    ticks = iter(range(100))
    engine = ShardEngine(EAGER, stopwatch=lambda: float(next(ticks)))
    apply(engine, rollup("c1", 1, need(cpu=8)), now=0)

    engine.cycle(now=1)

    assert set(engine.stats.phase_seconds) == {
        "prepare",
        "promises",
        "interruptions",
        "phase1",
        "preemption",
        "reclaim",
        "budgets",
        "release",
        "health",
        "shortfalls",
        "commit",
    }
    assert all(seconds == 1.0 for seconds in engine.stats.phase_seconds.values())
