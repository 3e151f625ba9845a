"""A restarted shard re-marks machines of still-running workflows with ``claim``."""

from __future__ import annotations

from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState, Provision, Rollup
from tests.rollups import apply
from tests.unit.engine.engine_fleet import machine, need


def _engine_with_two_slots() -> ShardEngine:
    engine = ShardEngine()
    for i in range(2):
        engine.upsert_machine(machine(f"s{i}", state=MachineState.SPECULATIVE), now=0.0)
    apply(engine, Rollup("c1", 1, (need(cpu=4.0),)), now=0.0)
    return engine


def test_a_claimed_creating_machine_counts_toward_its_cluster() -> None:
    engine = _engine_with_two_slots()
    engine.upsert_machine(machine("s0", state=MachineState.CREATING), now=1.0)
    assert engine.claim("s0", operation="provision", target_cluster="c1", now=1.0)
    plan = engine.cycle(now=2.0)
    provisions = [a for a in plan.actions if isinstance(a, Provision)]
    assert provisions == [], "the restarted shard must not provision a second machine"
    assert engine.in_flight() == {"s0": "c1"}


def test_without_the_claim_the_same_need_would_be_provisioned_again() -> None:
    engine = _engine_with_two_slots()
    engine.upsert_machine(machine("s0", state=MachineState.CREATING), now=1.0)
    plan = engine.cycle(now=2.0)
    assert [a.machine_ids for a in plan.actions if isinstance(a, Provision)] == [("s1",)]


def test_settling_a_claimed_machine_ends_its_flight() -> None:
    engine = _engine_with_two_slots()
    engine.claim("s0", operation="provision", target_cluster="c1", now=1.0)
    engine.settle("s0", machine("s0", state=MachineState.CONFIGURED, cluster="c1"), now=3.0)
    assert engine.in_flight() == {}


def test_claiming_an_unknown_machine_changes_nothing() -> None:
    engine = _engine_with_two_slots()
    assert not engine.claim("ghost", operation="drain", target_cluster="", now=1.0)
    assert engine.in_flight() == {}
