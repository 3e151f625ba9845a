"""Plans as columns: the table and the action values say the same thing, whenever they are read.

The cycle records its actions as segments and hands back an
:class:`~shard_engine.actions.ActionTable`; ``Plan.actions`` builds the
values from it on first use. These tests hold the two forms to each other
over random histories, and pin down what lazy building must not change: a
plan read after the engine moved on (rows reused, clusters added) still
names what the cycle decided.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_engine.actions import ActionKind, ActionTable
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.identifiers import CompactStrings
from shard_engine.model import (
    Action,
    AssignIdle,
    MachineState,
    Plan,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Verify,
)
from shard_engine.pools import TIER_IDLE, PoolKey
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, machine, machine_ids, need, rollup
from tests.unit.engine.plan_history import History

TYPES: dict[ActionKind, type] = {
    ActionKind.ASSIGN_IDLE: AssignIdle,
    ActionKind.PROVISION: Provision,
    ActionKind.PREEMPT: Preempt,
    ActionKind.RECLAIM: Reclaim,
    ActionKind.RELEASE: Release,
    ActionKind.VERIFY: Verify,
}


def assert_table_matches_actions(plan: Plan) -> None:
    """Every entry of the table agrees with the action value it belongs to."""
    table = plan.table
    assert table is not None
    actions = plan.actions
    assert plan.action_count == table.actions_count == len(actions)
    assert table.machine_ids() == machine_ids(actions)
    assert len(table) == len(machine_ids(actions))
    for i in range(len(table)):
        action: Action = actions[int(table.action[i])]
        kind = ActionKind(int(table.kind[i]))
        assert isinstance(action, TYPES[kind])
        cluster = table.cluster_id(int(table.cluster[i]))
        need = int(table.need[i])
        key, requirements = table.needs[need] if need >= 0 else ("", ())
        if isinstance(action, AssignIdle | Provision):
            assert (action.cluster_id, action.need_key, action.requirements) == (
                cluster,
                key,
                requirements,
            )
            assert action.priority == int(table.priority[i])
        elif isinstance(action, Preempt):
            assert action.preemptor_cluster_id == cluster
            assert action.victim_cluster_id == table.cluster_id(int(table.source[i]))
            assert action.preemptor_need_key == key
            assert action.preemptor_priority == int(table.priority[i])
            assert action.victim_priority == int(table.victim_priority[i])
            assert action.grace_seconds == int(table.grace[i])
        elif isinstance(action, Reclaim):
            assert (action.cluster_id, action.grace_seconds) == (cluster, int(table.grace[i]))
        elif isinstance(action, Verify):
            assert action.cluster_id == cluster
        else:
            assert cluster == ""
    # Entries of one action are contiguous and actions appear in order.
    assert (np.diff(table.action) >= 0).all()
    assert (np.diff(table.action) <= 1).all()


@pytest.mark.parametrize("seed", range(6))
def test_the_table_and_the_actions_of_every_plan_agree(seed: int) -> None:
    history = History(seed, plans=[])
    history.run()

    assert history.plans
    for plan in history.plans:
        assert_table_matches_actions(plan)


def test_a_plan_read_after_its_machines_left_still_names_them() -> None:
    engine = ShardEngine()
    idle = fleet(engine, 4, prefix="old")
    apply(engine, rollup("a", 1, need(cpu=16.0)), now=0)
    plan = engine.cycle(now=1)
    for machine_id in idle:
        engine.remove_machine(machine_id)
    fleet(engine, 4, prefix="new")  # the same rows, other machines
    apply(engine, rollup("b", 1, need(cpu=4.0)), now=1)

    assert sorted(machine_ids(plan.actions)) == idle
    assert {a.cluster_id for a in plan.actions if isinstance(a, AssignIdle)} == {"a"}


def test_a_plan_made_by_hand_has_its_actions_and_no_table() -> None:
    action = Reclaim(machine_id="m-1", cluster_id="a", grace_seconds=30)
    plan = Plan(now=5.0, actions=(action,))

    assert plan.actions == (action,)
    assert plan.table is None
    assert plan.action_count == 1
    assert plan == Plan(5.0, (action,))
    with pytest.raises(ValueError, match="either as values or as a table"):
        Plan(now=5.0, actions=(action,), table=ActionTable.empty())


def test_a_plan_cannot_be_changed() -> None:
    plan = ShardEngine().cycle(now=1)

    with pytest.raises(AttributeError, match="immutable"):
        plan.now = 2.0
    assert plan.actions == ()
    assert plan.table is not None and len(plan.table) == 0


def test_a_paused_engine_plans_an_empty_table_and_a_dry_run_a_full_one() -> None:
    engine = ShardEngine()
    fleet(engine, 3)
    apply(engine, rollup("a", 1, need(cpu=12.0)), now=0)

    dry = engine.cycle(now=1, dry_run=True)
    engine.paused = True
    paused = engine.cycle(now=2)

    assert dry.table is not None and len(dry.table) == 3
    assert_table_matches_actions(dry)
    assert paused.actions == () and paused.table is not None and len(paused.table) == 0


def idle_pool_rows(engine: ShardEngine, profile_of: str) -> list[int]:
    inventory = engine._inventory
    row = inventory.row(profile_of)
    assert row is not None
    pool = inventory.pools.find(PoolKey(TIER_IDLE, -1, int(inventory.profile[row])))
    assert pool is not None
    return sorted(inventory.pools.members(pool).tolist())


def test_a_dropped_promise_returning_to_a_pool_the_cycle_took_from_keeps_that_pool_exact() -> None:
    """The promise goes back to its pool before the cycle's takes leave it, as in plan order."""
    engine = ShardEngine()
    carrier = Carrier(engine)
    for i in range(2):
        engine.upsert_machine(
            machine(f"low-{i}", state=MachineState.CONFIGURED, cluster="low"), now=0
        )
    apply(engine, rollup("low", 1, need(cpu=8.0, priority=10)), now=0)
    apply(engine, rollup("high", 1, need(cpu=4.0, priority=1_000_000)), now=0)
    [preempt] = engine.cycle(now=1).actions
    assert isinstance(preempt, Preempt)
    carrier.carry(Plan(now=1, actions=(preempt,)), now=2)
    assert set(engine.promised()) == {preempt.machine_id}
    # The preemptor no longer wants it; idle machines of the same shape appear,
    # and a third cluster takes one of them in the cycle that drops the promise.
    apply(engine, rollup("high", 2, need(cpu=4.0, priority=999_999)), now=2)
    fleet(engine, 3, prefix="spare", now=2)
    apply(engine, rollup("third", 1, need(cpu=4.0, priority=500)), now=2)
    engine.cycle(now=3)
    taken = set(engine.in_flight())

    assert preempt.machine_id not in engine.promised()
    free = idle_pool_rows(engine, "spare-0000")
    inventory = engine._inventory
    assert {inventory.ids.id_of(r) for r in free}.isdisjoint(taken)
    assert preempt.machine_id in {inventory.ids.id_of(r) for r in free} | taken
    assert len(free) + len({m for m in taken if m.startswith("spare") or m.startswith("low")}) == 4


@given(
    st.lists(st.text(max_size=12), max_size=20),
    st.lists(st.integers(0, 16**17 - 1), max_size=20),
)
def test_a_snapshot_decodes_the_strings_as_they_were_when_taken(
    texts: list[str], later: list[int]
) -> None:
    column = CompactStrings()
    column.ensure_rows(len(texts))
    for row, text in enumerate(texts):
        column.set(row, text)
    snapshot = column.snapshot(np.arange(len(texts), dtype=np.int64))
    for row, number in enumerate(later[: len(texts)]):
        column.set(row, f"i-{number:017x}")

    assert snapshot.decode() == texts
    assert [snapshot.get(i) for i in range(len(texts))] == texts
    assert snapshot.decode(1, 3) == texts[1:3]


def test_a_suspect_reclaimed_in_the_same_cycle_is_not_also_verified() -> None:
    """A machine taken from its pool's tail counts as taken for every later phase."""
    # Reclaim on the first sight of excess (ADR 0090's waiting is tested with reclaim).
    engine = ShardEngine(
        EngineConfig(
            reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
        )
    )
    [suspect] = fleet(engine, 1, prefix="node", state=MachineState.CONFIGURED, cluster="c1")
    for t in range(1, 4):  # three reports without it make it a suspect; no need keeps it
        apply(engine, rollup("c1", t, reported=()), now=t)

    plan = engine.cycle(now=4)

    assert [type(a).__name__ for a in plan.actions] == ["Reclaim"]
    assert machine_ids(plan.actions) == [suspect]
