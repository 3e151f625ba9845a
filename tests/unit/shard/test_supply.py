"""What a donor reads from the engine's counters and pools equals the count over every machine."""

from __future__ import annotations

import random

import pytest

from bigfleet.shard.choices import TransferProfile, busy, donations
from bigfleet.shard.supply import Held, free_supply, profile_supply
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState, Need, Rollup
from shard_engine.transfers import choose_donations
from tests.rollups import apply

_STATES = [
    MachineState.IDLE,
    MachineState.SPECULATIVE,
    MachineState.CONFIGURED,
    MachineState.CREATING,
    MachineState.FAILED,
]


def _fleet(rng: random.Random, count: int) -> list[MachineRecord]:
    out = []
    for i in range(count):
        state = rng.choice(_STATES)
        out.append(
            MachineRecord(
                id=f"m{i:04d}",
                state=state,
                provider=rng.choice(["simcloud", "metal"]),
                instance_type=rng.choice(["m6i.large", "c6i.xlarge"]),
                zone=rng.choice(["z1", "z2"]),
                capacity_type=rng.choice([CapacityType.ON_DEMAND, CapacityType.SPOT]),
                # Racks and prices split one reported profile into several engine profiles.
                price_per_hour=rng.choice([0.1, 0.12]),
                interruption_probability=0.0,
                labels={"rack": rng.choice(["r1", "r2", "r3"])},
                allocatable={"cpu": 4.0, "memory": 16.0},
                cluster=rng.choice(["c1", "c2"]) if state is MachineState.CONFIGURED else "",
                host_ref="" if state is MachineState.SPECULATIVE else f"host-{i}",
            )
        )
    return out


def _columns(supply: tuple[object, ...]) -> dict[tuple[str, str, str, int], tuple[int, int]]:
    return {
        (s.provider, s.instance_type, s.zone, s.capacity_type): (s.idle, s.speculative)  # type: ignore[attr-defined]
        for s in supply
    }


@pytest.mark.parametrize("seed", range(8))
def test_free_supply_counts_what_profile_supply_counts(seed: int) -> None:
    rng = random.Random(seed)
    engine = ShardEngine(EngineConfig())
    for record in _fleet(rng, 300):
        engine.upsert_machine(record, now=0.0)
    # A cycle puts some machines in flight or promises them: neither column counts them.
    apply(
        engine,
        Rollup(
            "c3",
            timestamp_ns=1,
            needs=(
                Need(
                    requirements=(),
                    aggregate={"cpu": 4.0 * rng.randint(5, 40)},
                    priority=100,
                    min_unit={"cpu": 4.0},
                ),
            ),
        ),
        now=1.0,
    )
    engine.cycle(now=2.0)
    taken = busy(engine)
    assert taken, "the cycle should have put machines in flight"
    records = list(engine.machines())  # alive throughout: profile_supply keys its samples by id
    by_machine = profile_supply(
        Held(r, r.state, bound=r.state is MachineState.CONFIGURED, priority=0, busy=r.id in taken)
        for r in records
    )
    assert _columns(free_supply(engine.free_by_profile())) == _columns(by_machine)


@pytest.mark.parametrize("seed", range(8))
def test_donations_from_the_free_pools_are_those_from_every_machine(seed: int) -> None:
    rng = random.Random(seed)
    engine = ShardEngine(EngineConfig())
    fleet = _fleet(rng, 300)
    for record in fleet:
        engine.upsert_machine(record, now=0.0)
    apply(
        engine,
        Rollup(
            "c3",
            timestamp_ns=1,
            needs=(
                Need(
                    requirements=(),
                    aggregate={"cpu": 4.0 * rng.randint(5, 40)},
                    priority=100,
                    min_unit={"cpu": 4.0},
                ),
            ),
        ),
        now=1.0,
    )
    engine.cycle(now=2.0)
    extra = {r.id for r in rng.sample(fleet, 20)}
    for r in fleet[:40]:
        profile = TransferProfile(r.provider, r.instance_type, r.zone, int(r.capacity_type))
        for state in (MachineState.IDLE, MachineState.SPECULATIVE):
            count = rng.randint(1, 30)
            expected = choose_donations(
                engine.machines(),
                profile=profile,
                state=state,
                count=count,
                busy=busy(engine, extra),
            )
            got = donations(engine, profile=profile, state=state, count=count, extra_busy=extra)
            assert got == expected


def test_free_machines_are_only_idle_or_speculative() -> None:
    with pytest.raises(ValueError, match="state: free machines are IDLE or SPECULATIVE"):
        ShardEngine(EngineConfig()).free_machines(
            MachineState.CONFIGURED, provider="p", instance_type="t", zone="z", capacity_type=1
        )
