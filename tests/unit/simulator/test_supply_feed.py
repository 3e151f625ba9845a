"""The coordinator round's supply sent as changes rebuilds exactly what the full count says."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bigfleet.shard.supply import free_supply
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState, Need, Rollup
from simulator.engines import SupplyMirror, free_supply_changes
from tests.rollups import apply

_STATES = [
    MachineState.IDLE,
    MachineState.SPECULATIVE,
    MachineState.CONFIGURED,
    MachineState.CREATING,
    MachineState.FAILED,
]


def _machine(rng: random.Random, i: int) -> MachineRecord:
    state = rng.choice(_STATES)
    return MachineRecord(
        id=f"m{i:04d}",
        state=state,
        provider=rng.choice(["simcloud", "metal"]),
        instance_type=rng.choice(["m6i.large", "c6i.xlarge", "r6i.large"]),
        zone=rng.choice(["z1", "z2"]),
        capacity_type=rng.choice([CapacityType.ON_DEMAND, CapacityType.SPOT]),
        # Racks and prices split one reported key into several engine profiles,
        # so a key's sample changes when its first profile empties.
        price_per_hour=rng.choice([0.1, 0.12]),
        interruption_probability=0.0,
        labels={"rack": rng.choice(["r1", "r2", "r3"])},
        allocatable={"cpu": 4.0, "memory": 16.0},
        cluster=rng.choice(["c1", "c2"]) if state is MachineState.CONFIGURED else "",
        host_ref="" if state is MachineState.SPECULATIVE else f"host-{i}",
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_mirror_equals_the_full_count_round_after_round(seed: int) -> None:
    rng = random.Random(seed)
    engine = ShardEngine(EngineConfig())
    mirror = SupplyMirror()
    held: dict[str, MachineRecord] = {}
    next_id = 0
    unchanged_rounds = 0
    for round_ in range(40):
        for _ in range(rng.randint(0, 30)):
            action = rng.random()
            if action < 0.5 or not held:
                record = _machine(rng, next_id)
                next_id += 1
            elif action < 0.8:
                # A machine changes state (and maybe shape's rack): the same id again.
                old = rng.choice(sorted(held))
                record = _machine(rng, int(old[1:]))
            else:
                gone = rng.choice(sorted(held))
                engine.remove_machine(gone)
                del held[gone]
                continue
            engine.upsert_machine(record, now=float(round_))
            held[record.id] = record
        if rng.random() < 0.3:
            apply(
                engine,
                Rollup(
                    "c3",
                    timestamp_ns=round_ + 1,
                    needs=(
                        Need(
                            requirements=(),
                            aggregate={"cpu": 4.0 * rng.randint(1, 20)},
                            priority=100,
                            min_unit={"cpu": 4.0},
                        ),
                    ),
                ),
                now=float(round_),
            )
            engine.cycle(now=round_ + 0.5)
        changes = free_supply_changes(engine)
        unchanged_rounds += not changes.changed and not changes.removed
        assert mirror.apply(changes) == free_supply(engine.free_by_profile()), round_
    # Nothing moved: nothing is sent, and the mirror still answers in full.
    changes = free_supply_changes(engine)
    assert changes.changed == () and changes.removed == ()
    assert mirror.apply(changes) == free_supply(engine.free_by_profile())


def test_a_key_whose_machines_all_leave_is_removed_and_comes_back_with_its_labels() -> None:
    engine = ShardEngine(EngineConfig())
    mirror = SupplyMirror()
    record = MachineRecord(
        id="m1",
        state=MachineState.IDLE,
        provider="simcloud",
        instance_type="m6i.large",
        zone="z1",
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=0.1,
        interruption_probability=0.0,
        labels={"rack": "r1"},
        allocatable={"cpu": 2.0},
        host_ref="host-1",
    )
    engine.upsert_machine(record, now=0.0)
    (entry,) = mirror.apply(free_supply_changes(engine))
    assert (entry.idle, entry.labels["rack"]) == (1, "r1")
    engine.remove_machine("m1")
    changes = free_supply_changes(engine)
    assert changes.removed == (("simcloud", "m6i.large", "z1", int(CapacityType.ON_DEMAND), ""),)
    assert mirror.apply(changes) == free_supply(engine.free_by_profile()) == ()
    engine.upsert_machine(replace(record, id="m2", labels={"rack": "r2"}), now=1.0)
    assert mirror.apply(free_supply_changes(engine)) == free_supply(engine.free_by_profile())
    (entry,) = mirror.apply(free_supply_changes(engine))
    assert entry.labels["rack"] == "r2"
