"""Phase 2: strictly lower priorities only, the §8 story, grace from the gap, victim order."""

from __future__ import annotations

import numpy as np
import pytest

from shard_engine.config import EngineConfig, VictimWeights
from shard_engine.costs import drain_grace_seconds
from shard_engine.engine import ShardEngine
from shard_engine.model import AppClass, AssignIdle, MachineState, Preempt
from shard_engine.preemption import victim_order, victim_scores
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

GPU = "nvidia.com/gpu"


def gpu_fleet(engine: ShardEngine, cluster: str, count: int, prefix: str) -> list[str]:
    return fleet(
        engine,
        count,
        prefix=prefix,
        state=MachineState.CONFIGURED,
        cluster=cluster,
        instance_type="gpu.1x",
        gpu=1,
        cpu=8,
    )


def test_the_paper_story_preempts_a_with_the_tables_grace_and_gives_b_the_machines() -> None:
    # §8: A holds 64 GPU machines at 500000; B asks for 64 at 1000000; nothing is free.
    engine = ShardEngine()
    a_machines = gpu_fleet(engine, "A", 64, "gpu-east")
    apply(engine, rollup("A", 1, need(gpu=64, priority=500_000, interruption_penalty=1.0)), now=0)
    apply(engine, rollup("B", 1, need(gpu=64, priority=1_000_000)), now=7)

    plan = engine.cycle(now=10)

    preempts = of_kind(plan, Preempt)
    assert len(preempts) == 64 == len(plan.actions)
    assert sorted(machine_ids(preempts)) == sorted(a_machines)
    for action in preempts:
        assert isinstance(action, Preempt)
        assert action.victim_cluster_id == "A"
        assert action.preemptor_cluster_id == "B"
        # Gap exactly 500000: the function (normative) says two minutes.
        assert action.grace_seconds == 120
    assert set(engine.in_flight().values()) == {"B"}

    Carrier(engine).carry(plan, now=40)
    assert set(engine.promised().values()) == {"B"}
    following = engine.cycle(now=50)

    assigns = of_kind(following, AssignIdle)
    assert len(assigns) == 64
    assert {a.cluster_id for a in assigns} == {"B"}
    assert engine.promised() == {}


def test_a_second_cycle_does_not_preempt_again_while_victims_drain() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 8, "a")
    apply(engine, rollup("A", 1, need(gpu=8, priority=10)), now=0)
    apply(engine, rollup("B", 1, need(gpu=4, priority=20)), now=0)

    first = engine.cycle(now=1)
    second = engine.cycle(now=2)

    assert len(of_kind(first, Preempt)) == 4
    assert second.actions == ()


def test_nothing_is_preempted_at_equal_priority() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 8, "a")
    apply(engine, rollup("A", 1, need(gpu=8, priority=500)), now=0)
    apply(engine, rollup("B", 1, need(gpu=8, priority=500)), now=0)

    plan = engine.cycle(now=1)

    assert plan.actions == ()
    assert engine.why_not("B")
    assert next(iter(engine.why_not("B").values())).startswith("priority-starved")


def test_nothing_is_preempted_for_a_lower_priority() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 8, "a")
    apply(engine, rollup("A", 1, need(gpu=8, priority=500)), now=0)
    apply(engine, rollup("B", 1, need(gpu=8, priority=499)), now=0)

    assert engine.cycle(now=1).actions == ()


def test_a_promised_machine_goes_to_its_preemptor_even_if_someone_higher_arrives() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 2, "a")
    apply(engine, rollup("A", 1, need(gpu=2, priority=10)), now=0)
    apply(engine, rollup("B", 1, need(gpu=2, priority=20)), now=0)
    Carrier(engine).carry(engine.cycle(now=1), now=2)

    apply(engine, rollup("C", 1, need(gpu=2, priority=99)), now=3)
    plan = engine.cycle(now=4)

    assigns = of_kind(plan, AssignIdle)
    assert {a.cluster_id for a in assigns} == {"B"}
    assert len(assigns) == 2


def test_a_promise_is_dropped_when_the_preemptor_stops_asking() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 2, "a")
    apply(engine, rollup("A", 1, need(gpu=2, priority=10)), now=0)
    apply(engine, rollup("B", 1, need(gpu=2, priority=20)), now=0)
    Carrier(engine).carry(engine.cycle(now=1), now=2)

    apply(engine, rollup("B", 2), now=3)
    engine.cycle(now=4)

    assert engine.promised() == {}
    later = engine.cycle(now=5)
    assert {a.cluster_id for a in of_kind(later, AssignIdle)} == {"A"}


def test_a_preemption_that_fails_to_drain_frees_no_promise() -> None:
    engine = ShardEngine()
    [victim] = gpu_fleet(engine, "A", 1, "a")
    apply(engine, rollup("A", 1, need(gpu=1, priority=10)), now=0)
    apply(engine, rollup("B", 1, need(gpu=1, priority=20)), now=0)
    engine.cycle(now=1)

    still = engine.machine(victim)
    assert still is not None
    engine.settle(victim, still, now=2)

    assert engine.promised() == {}
    assert engine.in_flight() == {}


@pytest.mark.parametrize(
    ("gap", "grace"),
    [
        (1_000_000, 10),
        (900_001, 10),
        (900_000, 30),
        (500_001, 30),
        (500_000, 120),
        (100_001, 120),
        (100_000, 600),
        (1, 600),
    ],
)
def test_grace_follows_the_papers_function_with_strict_boundaries(gap: int, grace: int) -> None:
    config = EngineConfig()
    assert drain_grace_seconds(gap, config.grace_thresholds, config.grace_default_seconds) == grace


@pytest.mark.parametrize(("gap", "grace"), [(500_000, 120), (500_001, 30)])
def test_preempt_actions_carry_the_grace_of_their_gap(gap: int, grace: int) -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 1, "a")
    apply(engine, rollup("A", 1, need(gpu=1, priority=0)), now=0)
    apply(engine, rollup("B", 1, need(gpu=1, priority=gap)), now=0)

    [action] = engine.cycle(now=1).actions

    assert isinstance(action, Preempt)
    assert action.grace_seconds == grace


def test_the_lowest_priority_victim_is_taken_first_under_normal_conditions() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "mid", 2, "mid")
    gpu_fleet(engine, "low", 2, "low")
    fleet(engine, 100, prefix="cpu", state=MachineState.IDLE)  # plenty free, none fits
    apply(engine, rollup("mid", 1, need(gpu=2, priority=500)), now=0)
    apply(engine, rollup("low", 1, need(gpu=2, priority=100)), now=0)
    apply(engine, rollup("hi", 1, need(gpu=2, priority=1_000_000)), now=0)

    plan = engine.cycle(now=1)

    assert {a.victim_cluster_id for a in of_kind(plan, Preempt)} == {"low"}


def test_among_equal_priorities_best_effort_goes_before_batch_before_latency_sensitive() -> None:
    engine = ShardEngine()
    for name, app in [
        ("latency", AppClass.LATENCY_SENSITIVE),
        ("batch", AppClass.BATCH),
        ("besteffort", AppClass.BEST_EFFORT),
    ]:
        gpu_fleet(engine, name, 1, name)
        apply(engine, rollup(name, 1, need(gpu=1, priority=100, app_class=app)), now=0)
    apply(engine, rollup("hi", 1, need(gpu=2, priority=1_000)), now=0)

    plan = engine.cycle(now=1)

    victims = sorted(a.victim_cluster_id for a in of_kind(plan, Preempt))
    assert victims == ["batch", "besteffort"]


def test_a_machine_serving_no_need_is_the_first_victim() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 2, "a")
    apply(
        engine,
        rollup("A", 1, need(cpu=1, priority=900_000, requirements=[zone_in("elsewhere")])),
        now=0,
    )
    apply(
        engine, rollup("B", 1, need(gpu=1, priority=0)), now=0
    )  # even priority 0 outranks serving nothing

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Preempt)) == 1


def test_machines_of_a_cluster_that_never_sent_a_roll_up_are_never_victims() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "silent", 4, "s")
    apply(engine, rollup("B", 1, need(gpu=1, priority=1_000_000)), now=0)

    plan = engine.cycle(now=1)

    assert plan.actions == ()


def test_zero_penalties_score_finitely_and_best() -> None:
    config = EngineConfig()
    weights = config.victim_weights_normal
    score = victim_scores(
        gap=np.array([100.0, 100.0]),
        drain=np.array([0.0, 0.0]),
        interruption=np.array([0.0, 50.0]),
        reclamation=np.array([0.0, 0.0]),
        weights=weights,
        config=config,
    )
    assert np.isfinite(score).all()
    assert score[0] > score[1]


def test_drain_speed_dominates_when_the_shard_is_saturated() -> None:
    config = EngineConfig()
    gap = np.array([900_000.0, 100_000.0])  # first: much lower priority victim
    drain = np.array([3_600.0, 5.0])  # but it drains in an hour; the second in 5 s
    zeros = np.zeros(2)

    def best(weights: VictimWeights) -> int:
        score = victim_scores(
            gap=gap,
            drain=drain,
            interruption=zeros,
            reclamation=zeros,
            weights=weights,
            config=config,
        )
        return int(victim_order(score, np.array([100, 900_000]), np.zeros(2, np.int64))[0])

    assert best(config.victim_weights_normal) == 0
    assert best(config.victim_weights_saturated) == 1


def test_a_victim_is_never_taken_for_a_need_it_cannot_help() -> None:
    engine = ShardEngine()
    fleet(engine, 4, prefix="cpu", state=MachineState.CONFIGURED, cluster="A")
    apply(engine, rollup("A", 1, need(cpu=16, priority=1)), now=0)
    apply(engine, rollup("B", 1, need(gpu=1, priority=1_000_000)), now=0)

    plan = engine.cycle(now=1)

    assert plan.actions == ()
    assert next(iter(engine.why_not("B").values())).startswith("no matching supply")


def test_preemption_takes_only_what_the_deficit_needs() -> None:
    engine = ShardEngine()
    gpu_fleet(engine, "A", 10, "a")
    apply(engine, rollup("A", 1, need(gpu=10, priority=1)), now=0)
    apply(engine, rollup("B", 1, need(gpu=3, priority=2)), now=0)

    assert len(engine.cycle(now=1).actions) == 3


def test_a_victims_drain_time_is_learned_from_settles() -> None:
    engine = ShardEngine()
    [victim] = gpu_fleet(engine, "A", 1, "a")
    apply(engine, rollup("A", 1, need(gpu=1, priority=1)), now=0)
    apply(engine, rollup("B", 1, need(gpu=1, priority=2)), now=0)
    engine.cycle(now=100)
    record = engine.machine(victim)
    assert record is not None
    engine.settle(victim, machine(victim, instance_type="gpu.1x", gpu=1, cpu=8), now=130)

    assert engine._memory.drain_seconds[engine._clusters.index_of("A")] == pytest.approx(30.0)
