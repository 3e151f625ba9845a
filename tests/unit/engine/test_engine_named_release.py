"""Phase 3 with named release: a cluster that names machines loses excess from those only."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineState, Preempt, Reclaim, Rollup
from shard_engine.needs import RollupRejected
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, machine_ids, need, of_kind, rollup

# Reclaim on the first sight of excess, so one cycle shows which machines go
# (waiting for excess to persist is ADR 0090's, tested in test_engine_reclaim).
EAGER = EngineConfig(
    reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
)


def releasing(base: Rollup, *machine_ids: str) -> Rollup:
    """``base`` with ``machine_ids`` offered for release."""
    return replace(base, release=frozenset(machine_ids))


def configured_of(engine: ShardEngine, cluster: str) -> set[str]:
    return {
        m.id
        for m in engine.machines()
        if m.cluster == cluster and m.state == MachineState.CONFIGURED
    }


def test_only_the_named_machines_are_reclaimed_for_excess() -> None:
    engine = ShardEngine(EAGER)
    ids = fleet(engine, 6, state=MachineState.CONFIGURED, cluster="nanook")
    named = ids[1:5]
    apply(engine, releasing(rollup("nanook", 1, need(cpu=8)), *named), now=0)

    plans = Carrier(engine).run(now=1, cycles=10)

    reclaimed = [m for plan in plans for m in machine_ids(of_kind(plan, Reclaim))]
    assert sorted(reclaimed) == sorted(named)
    assert configured_of(engine, "nanook") == {ids[0], ids[5]}


def test_when_too_few_machines_are_named_the_rest_of_the_excess_stays() -> None:
    engine = ShardEngine(EAGER)
    ids = fleet(engine, 6, state=MachineState.CONFIGURED, cluster="nanook")
    apply(engine, releasing(rollup("nanook", 1, need(cpu=8)), ids[3]), now=0)

    plans = Carrier(engine).run(now=1, cycles=10)

    assert [m for p in plans for m in machine_ids(p.actions)] == [ids[3]]
    assert configured_of(engine, "nanook") == set(ids) - {ids[3]}


def test_naming_more_machines_than_the_excess_reclaims_only_the_excess() -> None:
    engine = ShardEngine(EAGER)
    ids = fleet(engine, 6, state=MachineState.CONFIGURED, cluster="nanook")
    apply(engine, releasing(rollup("nanook", 1, need(cpu=16)), *ids), now=0)

    Carrier(engine).run(now=1, cycles=10)

    assert len(configured_of(engine, "nanook")) == 4


def test_a_new_release_list_with_unchanged_needs_takes_effect_at_the_next_cycle() -> None:
    engine = ShardEngine(EAGER)
    ids = fleet(engine, 4, state=MachineState.CONFIGURED, cluster="nanook")
    apply(engine, releasing(rollup("nanook", 1, need(cpu=12)), "not-a-machine"), now=0)
    assert Carrier(engine).run(now=1, cycles=3)[-1].actions == ()

    apply(engine, releasing(rollup("nanook", 2, need(cpu=12)), ids[2]), now=4)
    plan = engine.cycle(now=5)

    assert machine_ids(plan.actions) == [ids[2]]


def test_without_a_release_list_any_excess_is_reclaimed_as_before() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 4, state=MachineState.CONFIGURED, cluster="nanook")
    apply(engine, rollup("nanook", 1, need(cpu=4)), now=0)

    Carrier(engine).run(now=1, cycles=10)

    assert len(configured_of(engine, "nanook")) == 1


def test_an_empty_release_list_keeps_every_machine_despite_excess() -> None:
    engine = ShardEngine(EAGER)
    ids = fleet(engine, 4, state=MachineState.CONFIGURED, cluster="nanook")
    apply(engine, releasing(rollup("nanook", 1, need(cpu=4))), now=0)

    plans = Carrier(engine).run(now=1, cycles=5)

    assert all(p.actions == () for p in plans)
    assert configured_of(engine, "nanook") == set(ids)


def test_a_cluster_that_names_nothing_does_not_use_up_the_reclaim_budget() -> None:
    # One cluster examined per cycle; the one that names nothing comes first in the
    # round robin and must not hold back the one that names a machine.
    engine = ShardEngine(replace(EAGER, reclaim_clusters_per_cycle=1))
    fleet(engine, 4, prefix="keep", state=MachineState.CONFIGURED, cluster="a-keeps")
    gives = fleet(engine, 4, prefix="give", state=MachineState.CONFIGURED, cluster="b-gives")
    apply(engine, releasing(rollup("a-keeps", 1, need(cpu=4))), now=0)
    apply(engine, releasing(rollup("b-gives", 1, need(cpu=4)), gives[0]), now=0)

    plan = engine.cycle(now=1)

    assert machine_ids(of_kind(plan, Reclaim)) == [gives[0]]


def test_a_machine_of_another_cluster_named_for_release_is_not_touched() -> None:
    engine = ShardEngine(EAGER)
    mine = fleet(engine, 2, prefix="mine", state=MachineState.CONFIGURED, cluster="nanook")
    theirs = fleet(engine, 2, prefix="theirs", state=MachineState.CONFIGURED, cluster="other")
    apply(engine, rollup("other", 1, need(cpu=8)), now=0)
    apply(engine, releasing(rollup("nanook", 1, need(cpu=4)), theirs[0]), now=0)

    plans = Carrier(engine).run(now=1, cycles=5)

    assert all(p.actions == () for p in plans)
    assert configured_of(engine, "nanook") == set(mine)
    assert configured_of(engine, "other") == set(theirs)


def test_preemption_by_a_higher_priority_may_still_take_an_unnamed_machine() -> None:
    engine = ShardEngine(EAGER)
    ids = fleet(engine, 2, state=MachineState.CONFIGURED, cluster="nanook")
    apply(engine, releasing(rollup("nanook", 1, need(cpu=8, priority=100))), now=0)
    apply(engine, rollup("urgent", 1, need(cpu=4, priority=900_000)), now=0)

    plan = engine.cycle(now=1)

    [preempt] = of_kind(plan, Preempt)
    assert machine_ids([preempt])[0] in ids


@pytest.mark.parametrize("bad", ["", 7])
def test_a_release_list_with_an_empty_or_non_string_id_is_rejected(bad: object) -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 2, state=MachineState.CONFIGURED, cluster="nanook")
    apply(engine, rollup("nanook", 1, need(cpu=8)), now=0)
    bad_rollup = releasing(rollup("nanook", 2, need(cpu=8)), bad)  # type: ignore[arg-type]

    with pytest.raises(RollupRejected, match="release"):
        apply(engine, bad_rollup, now=1)
    with pytest.raises(RollupRejected, match="release"):
        apply(engine, replace(bad_rollup, needs=(need(cpu=4),)), now=1)

    assert configured_of(engine, "nanook") and engine.cycle(now=2).actions == ()


@settings(max_examples=120, deadline=None)
@given(
    machines=st.integers(min_value=1, max_value=24),
    wanted=st.integers(min_value=0, max_value=24),
    named=st.sets(st.integers(min_value=0, max_value=23), max_size=24),
    prices=st.lists(st.sampled_from([0.1, 1.0, 3.0]), min_size=24, max_size=24),
    steps=st.lists(st.tuples(st.integers(0, 24), st.sets(st.integers(0, 23))), max_size=4),
)
def test_a_machine_not_named_for_release_is_never_reclaimed_for_excess(
    machines: int,
    wanted: int,
    named: set[int],
    prices: list[float],
    steps: list[tuple[int, set[int]]],
) -> None:
    engine = ShardEngine(EAGER)
    ids = []
    for i in range(machines):
        ids += fleet(
            engine,
            1,
            prefix=f"w{i:02d}",
            state=MachineState.CONFIGURED,
            cluster="nanook",
            price=prices[i],
        )
    carrier = Carrier(engine)
    now = 0.0
    for timestamp, (amount, offered) in enumerate([(wanted, named), *steps], start=1):
        release = frozenset(ids[i] for i in offered if i < machines)
        apply(
            engine,
            releasing(rollup("nanook", timestamp, need(cpu=4.0 * amount)), *release),
            now=now,
        )
        for plan in carrier.run(now=now + 1, cycles=6):
            for action in of_kind(plan, Reclaim):
                assert isinstance(action, Reclaim)
                assert action.machine_id in release, (action.machine_id, sorted(release))
        now += 10
        # The cluster never drops below what it asked for through named release.
        assert len(configured_of(engine, "nanook")) >= min(amount, machines)


def test_named_machines_go_at_the_next_cycle_whatever_the_anti_churn_rules() -> None:
    # A named release is an explicit request, not excess (ADR 0125): no window,
    # minimum age or hysteresis holds it, on default settings.
    engine = ShardEngine()
    ids = fleet(engine, 4, state=MachineState.CONFIGURED, cluster="nanook", now=0)
    apply(engine, rollup("nanook", 1, need(cpu=16)), now=0)
    engine.cycle(now=1)
    apply(engine, releasing(rollup("nanook", 2, need(cpu=12)), ids[3]), now=2)

    soon = engine.cycle(now=3)

    assert machine_ids(soon.actions) == [ids[3]]


def test_a_named_machine_is_kept_while_its_need_is_short() -> None:
    engine = ShardEngine(EAGER)
    ids = fleet(engine, 2, state=MachineState.CONFIGURED, cluster="nanook", now=0)
    apply(engine, releasing(rollup("nanook", 1, need(cpu=40)), ids[0]), now=0)

    plan = engine.cycle(now=1)

    assert of_kind(plan, Reclaim) == []
