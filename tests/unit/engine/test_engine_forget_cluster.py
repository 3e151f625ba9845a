"""Forgetting a cluster that moves to another shard: no planning for it, nothing reclaimed."""

from __future__ import annotations

from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState
from tests.rollups import apply
from tests.unit.engine.engine_fleet import fleet, machine_ids, need, rollup


def test_a_forgotten_cluster_is_no_longer_provisioned_for() -> None:
    engine = ShardEngine()
    fleet(engine, 4, state=MachineState.SPECULATIVE)
    apply(engine, rollup("leaving", 1, need(cpu=8)), now=0)

    assert engine.forget_cluster("leaving") is True

    assert engine.cycle(now=1).actions == ()
    assert engine.summary().needs == 0


def test_the_configured_machines_of_a_forgotten_cluster_are_neither_reclaimed_nor_preempted() -> (
    None
):
    engine = ShardEngine()
    kept = fleet(engine, 3, prefix="kept", state=MachineState.CONFIGURED, cluster="leaving")
    apply(engine, rollup("leaving", 1, need(cpu=4, priority=10)), now=0)
    apply(engine, rollup("staying", 1, need(cpu=8, priority=1_000_000)), now=0)
    engine.forget_cluster("leaving")

    plan = engine.cycle(now=1)

    assert not set(machine_ids(plan.actions)) & set(kept)
    assert any(sf.cluster_id == "staying" for sf in plan.shortfalls)


def test_without_forgetting_the_same_machines_would_be_taken() -> None:
    engine = ShardEngine()
    kept = fleet(engine, 3, prefix="kept", state=MachineState.CONFIGURED, cluster="leaving")
    apply(engine, rollup("leaving", 1, need(cpu=4, priority=10)), now=0)
    apply(engine, rollup("staying", 1, need(cpu=8, priority=1_000_000)), now=0)

    plan = engine.cycle(now=1)

    assert set(machine_ids(plan.actions)) & set(kept)


def test_forgetting_an_unknown_cluster_changes_nothing_and_a_later_roll_up_starts_afresh() -> None:
    engine = ShardEngine()
    assert engine.forget_cluster("never-seen") is False
    apply(engine, rollup("back", 50, need(cpu=4)), now=0)
    engine.forget_cluster("back")

    # An older timestamp than the forgotten entry's is accepted: the history went with it.
    assert apply(engine, rollup("back", 10, need(cpu=4)), now=1).status == "applied"
    fleet(engine, 2, state=MachineState.SPECULATIVE)
    assert len(machine_ids(engine.cycle(now=2).actions)) == 1
