"""Budgets and do-not-disrupt inside the engine's cycle: what they hold back, and what not.

Time is virtual: every cycle is given its ``now`` (epoch seconds), so a
window opening at 18:00 is one cycle away.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from bigfleet.decisions.entries import Mode, decisions_of
from shard_engine.budgets import Budget, CronSchedule, DrainReason, Scope, Window
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineState, Preempt, Reclaim
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, machine_ids, need, of_kind, rollup

EAGER = EngineConfig(
    reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
)
GPU = "nvidia.com/gpu"


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


TUESDAY_MORNING = at("2026-12-01T10:00:00")


def excess_cluster(engine: ShardEngine, machines: int, *, now: float) -> list[str]:
    """A cluster holding ``machines`` configured machines and needing one."""
    ids = fleet(engine, machines, state=MachineState.CONFIGURED, cluster="c1", now=now)
    apply(engine, rollup("c1", 1, need(cpu=1)), now=now)
    return ids


def test_a_count_budget_caps_the_machines_draining_at_once_across_cycles() -> None:
    engine = ShardEngine(EAGER)
    excess_cluster(engine, 100, now=TUESDAY_MORNING)
    engine.budgets = (Budget("two-at-a-time", count=2),)

    first = engine.cycle(now=TUESDAY_MORNING + 1)
    held_first = engine.holds
    second = engine.cycle(now=TUESDAY_MORNING + 2)  # the first two still draining

    assert len(of_kind(first, Reclaim)) == 2  # the rate cap alone would take 5
    assert len(held_first) == 3
    assert {h.budget for h in held_first} == {"two-at-a-time"}
    assert held_first[0].describe() == (
        "reclaim held by disruption budget 'two-at-a-time' (2 of 2 draining)"
    )
    assert of_kind(second, Reclaim) == []
    assert all(h.draining == 2 for h in engine.holds)


def test_drains_continue_once_the_earlier_ones_settle() -> None:
    engine = ShardEngine(EAGER)
    excess_cluster(engine, 100, now=TUESDAY_MORNING)
    engine.budgets = (Budget("two-at-a-time", count=2),)
    carrier = Carrier(engine)

    plans = carrier.run(now=TUESDAY_MORNING + 1, cycles=3)

    assert [len(of_kind(p, Reclaim)) for p in plans] == [2, 2, 2]


def test_a_budget_blocks_a_drain_in_its_window_and_lets_it_through_when_the_window_ends() -> None:
    office_hours = Window(CronSchedule.parse("0 8 * * 1-5"), 10 * 3600)
    engine = ShardEngine(EAGER)
    excess_cluster(engine, 10, now=TUESDAY_MORNING)
    engine.budgets = (Budget("no-reclaim-in-office-hours", count=0, window=office_hours),)

    during = engine.cycle(now=at("2026-12-01T17:59:00"))
    after = engine.cycle(now=at("2026-12-01T18:00:00"))

    assert of_kind(during, Reclaim) == []
    assert [h.budget for h in engine.holds] == []  # the last cycle held nothing
    assert len(of_kind(after, Reclaim)) == 1


def test_a_percentage_budget_over_gpu_shapes_leaves_other_shapes_alone() -> None:
    engine = ShardEngine(EAGER)
    fleet(
        engine,
        40,
        prefix="gpu",
        state=MachineState.CONFIGURED,
        cluster="c1",
        gpu=1,
        instance_type="gpu.1x",
        now=TUESDAY_MORNING,
    )
    fleet(
        engine, 40, prefix="cpu", state=MachineState.CONFIGURED, cluster="c2", now=TUESDAY_MORNING
    )
    apply(engine, rollup("c1", 1, need(gpu=1)), now=TUESDAY_MORNING)
    apply(engine, rollup("c2", 1, need(cpu=1)), now=TUESDAY_MORNING)
    engine.budgets = (Budget("gpu-fleet", scope=Scope(resources=(GPU,)), percent=2.5),)

    plan = engine.cycle(now=TUESDAY_MORNING + 1)

    reclaimed = machine_ids(of_kind(plan, Reclaim))
    assert len([m for m in reclaimed if m.startswith("gpu")]) == 1  # 2.5 % of 40
    assert len([m for m in reclaimed if m.startswith("cpu")]) == 2  # 5 % of 40, no budget
    assert {h.cluster_id for h in engine.holds} == {"c1"}


def preemption_story(engine: ShardEngine) -> list[str]:
    """A holds 4 GPU machines at a low priority; B needs 2 at a strictly higher one."""
    ids = fleet(
        engine,
        4,
        prefix="gpu",
        state=MachineState.CONFIGURED,
        cluster="A",
        gpu=1,
        instance_type="gpu.1x",
        now=TUESDAY_MORNING,
    )
    apply(
        engine,
        rollup("A", 1, replace(need(gpu=4, priority=100), do_not_disrupt_seconds=3600)),
        now=TUESDAY_MORNING,
    )
    apply(engine, rollup("B", 1, need(gpu=2, priority=900_000)), now=TUESDAY_MORNING)
    return ids


def test_preemption_by_a_higher_priority_ignores_a_budget_that_does_not_name_it() -> None:
    engine = ShardEngine(EAGER)
    preemption_story(engine)
    engine.budgets = (Budget("no-reclaim", count=0),)

    plan = engine.cycle(now=TUESDAY_MORNING + 1)

    assert len(of_kind(plan, Preempt)) == 2
    assert engine.holds == ()


def test_a_budget_that_names_preemption_holds_it_and_the_need_stays_short() -> None:
    engine = ShardEngine(EAGER)
    preemption_story(engine)
    engine.budgets = (Budget("one-gpu-drain", count=1, reasons=frozenset(DrainReason)),)

    plan = engine.cycle(now=TUESDAY_MORNING + 1)

    assert len(of_kind(plan, Preempt)) == 1
    [hold] = engine.holds
    assert hold.reason is DrainReason.PREEMPT
    assert hold.cluster_id == "A"
    assert hold.budget == "one-gpu-drain"


def test_do_not_disrupt_does_not_stand_against_preemption() -> None:
    engine = ShardEngine(EAGER)
    preemption_story(engine)  # A's need asks for an hour of do-not-disrupt

    plan = engine.cycle(now=TUESDAY_MORNING + 1)

    assert len(of_kind(plan, Preempt)) == 2


def test_do_not_disrupt_keeps_excess_machines_until_the_duration_has_passed() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 10, state=MachineState.CONFIGURED, cluster="c1", now=TUESDAY_MORNING)
    protected = replace(need(cpu=1), do_not_disrupt_seconds=3600)
    apply(engine, rollup("c1", 1, protected), now=TUESDAY_MORNING)

    within = engine.cycle(now=TUESDAY_MORNING + 3599)
    holds = engine.holds
    after = engine.cycle(now=TUESDAY_MORNING + 3600)

    assert of_kind(within, Reclaim) == []
    assert [h.cause for h in holds] == ["do-not-disrupt"]
    assert holds[0].need_key == protected.key
    assert holds[0].until == TUESDAY_MORNING + 3600
    assert holds[0].describe() == f"reclaim held by do-not-disrupt of need {protected.key}"
    assert len(of_kind(after, Reclaim)) == 1


def test_without_budgets_or_do_not_disrupt_the_plan_is_unchanged() -> None:
    plain, budgeted = ShardEngine(EAGER), ShardEngine(EAGER)
    for engine in (plain, budgeted):
        excess_cluster(engine, 100, now=TUESDAY_MORNING)
    budgeted.budgets = (Budget("other-clusters", scope=Scope(clusters=("x-*",)), count=0),)

    assert machine_ids(plain.cycle(now=TUESDAY_MORNING + 1).actions) == machine_ids(
        budgeted.cycle(now=TUESDAY_MORNING + 1).actions
    )


def test_while_paused_the_why_not_of_a_need_it_would_serve_says_actuation_paused() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 4, state=MachineState.IDLE, now=TUESDAY_MORNING)
    apply(engine, rollup("c1", 1, need(cpu=8)), now=TUESDAY_MORNING)
    engine.paused = True

    plan = engine.cycle(now=TUESDAY_MORNING + 1)
    [verdict] = engine.inspect_needs("c1").verdicts

    assert plan.actions == ()
    assert set(plan.why_not.values()) == {"actuation paused"}
    assert (verdict.satisfied, verdict.detail) == (False, "actuation paused")
    engine.paused = False
    engine.cycle(now=TUESDAY_MORNING + 2)
    assert engine.inspect_needs("c1").verdicts[0].detail != "actuation paused"


def test_a_need_whose_preemption_a_budget_holds_back_is_told_which_budget() -> None:
    engine = ShardEngine(EAGER)
    preemption_story(engine)
    engine.budgets = (Budget("one-gpu-drain", count=1, reasons=frozenset(DrainReason)),)

    plan = engine.cycle(now=TUESDAY_MORNING + 1)

    # B needed 2 machines: one victim was admitted (1 of a cap of 1), the second held.
    expected = "preemption held by budget one-gpu-drain (1/1 draining)"
    [(key, reason)] = engine.why_not("B").items()
    assert reason == expected
    assert engine.why_not("A") == {}
    [hold] = engine.holds
    assert (hold.for_cluster, hold.for_need) == ("B", key)
    [verdict] = engine.inspect_needs("B").verdicts
    assert (verdict.satisfied, verdict.detail) == (False, expected)
    rows = list(
        decisions_of(
            plan,
            shard_id="s",
            cycle=1,
            mode=Mode.ACTIVE,
            holds=engine.holds,
            profile_of=engine.profile_of,
        )
    )
    [unmet] = [r for r in rows if r.kind == "unmet" and r.cluster_id == "B"]
    assert (unmet.need_key, unmet.reason) == (key, expected)
    [held] = [r for r in rows if r.kind == "held"]
    assert (held.inputs["for_cluster"], held.inputs["for_need"]) == ("B", key)


def test_a_held_reclaim_names_no_need_to_tell() -> None:
    engine = ShardEngine(EAGER)
    excess_cluster(engine, 100, now=TUESDAY_MORNING)
    engine.budgets = (Budget("two-at-a-time", count=2),)

    engine.cycle(now=TUESDAY_MORNING + 1)

    assert engine.holds and all(h.for_need == "" for h in engine.holds)
    assert engine.why_not("c1") == {}


def test_a_shards_share_of_a_fleet_wide_count_is_its_cap() -> None:
    engine = ShardEngine(EAGER)
    excess_cluster(engine, 100, now=TUESDAY_MORNING)
    engine.budgets = (Budget("five-fleet-wide", count=5),)
    engine.budget_shares = {"five-fleet-wide": 1}  # the coordinator dealt this shard 1 of 5

    plan = engine.cycle(now=TUESDAY_MORNING + 1)

    assert len(of_kind(plan, Reclaim)) == 1
    assert engine.holds[0].describe() == (
        "reclaim held by disruption budget 'five-fleet-wide' "
        "(1 of 1 draining, this shard's share of 5)"
    )
    # 100 machines in scope, 1 draining, 4 held (the rate cap let 5 be asked for).
    [(budget, in_scope, draining, held)] = engine.budget_census()
    assert (budget.name, in_scope, draining, held) == ("five-fleet-wide", 100, 1, 4)


def test_a_shard_dealt_nothing_of_a_count_drains_nothing_under_it() -> None:
    engine = ShardEngine(EAGER)
    excess_cluster(engine, 100, now=TUESDAY_MORNING)
    engine.budgets = (Budget("five-fleet-wide", count=5), Budget("ten-percent", percent=10))
    engine.budget_shares = {}  # never heard from the coordinator: the safe default, 0

    plan = engine.cycle(now=TUESDAY_MORNING + 1)

    assert of_kind(plan, Reclaim) == []
    assert {h.budget for h in engine.holds} == {"five-fleet-wide"}
    # Percentages are not dealt: only count budgets are in the census.
    assert [b.name for b, _, _, _ in engine.budget_census()] == ["five-fleet-wide"]
