"""Health: three missed reports -> Verify; confirmed dead -> FAILED and replaced."""

from __future__ import annotations

from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState, Provision, Verify
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, machine_ids, need, of_kind, rollup


def setup() -> tuple[ShardEngine, list[str]]:
    engine = ShardEngine()
    ids = fleet(engine, 3, prefix="node", state=MachineState.CONFIGURED, cluster="c1")
    fleet(engine, 3, prefix="spec", state=MachineState.SPECULATIVE)
    return engine, ids


def test_a_machine_missing_from_three_reports_is_verified() -> None:
    engine, ids = setup()
    present = ids[:2]
    for t in range(1, 3):
        apply(engine, rollup("c1", t, need(cpu=12), reported=present), now=t)
        assert of_kind(engine.cycle(now=t), Verify) == []

    apply(engine, rollup("c1", 3, need(cpu=12), reported=present), now=3)
    plan = engine.cycle(now=3)

    [verify] = of_kind(plan, Verify)
    assert isinstance(verify, Verify)
    assert verify.machine_id == ids[2]
    assert verify.cluster_id == "c1"
    assert dict(engine.in_flight()) == {ids[2]: "c1"}


def test_roll_ups_without_a_node_list_say_nothing_about_health() -> None:
    engine, _ = setup()
    for t in range(1, 6):
        apply(engine, rollup("c1", t, need(cpu=12)), now=t)

    assert of_kind(engine.cycle(now=6), Verify) == []


def test_a_reported_machine_resets_its_count() -> None:
    engine, ids = setup()
    apply(engine, rollup("c1", 1, need(cpu=12), reported=ids[:2]), now=1)
    apply(engine, rollup("c1", 2, need(cpu=12), reported=ids[:2]), now=2)
    apply(engine, rollup("c1", 3, need(cpu=12), reported=ids), now=3)
    apply(engine, rollup("c1", 4, need(cpu=12), reported=ids[:2]), now=4)

    assert of_kind(engine.cycle(now=5), Verify) == []


def test_a_machine_confirmed_dead_is_failed_and_replaced_by_phase_1() -> None:
    engine, ids = setup()
    for t in range(1, 4):
        apply(engine, rollup("c1", t, need(cpu=12), reported=ids[:2]), now=t)
    carrier = Carrier(engine, dead={ids[2]})
    carrier.carry(engine.cycle(now=4), now=5)

    record = engine.machine(ids[2])
    assert record is not None
    assert record.state == MachineState.FAILED
    replacement = engine.cycle(now=6)

    [provision] = of_kind(replacement, Provision)
    assert len(machine_ids([provision])) == 1


def test_a_machine_found_alive_is_not_verified_again_at_once() -> None:
    engine, ids = setup()
    for t in range(1, 4):
        apply(engine, rollup("c1", t, need(cpu=12), reported=ids[:2]), now=t)
    Carrier(engine).carry(engine.cycle(now=4), now=5)

    assert of_kind(engine.cycle(now=6), Verify) == []
