"""A batch of machines the ledger hands this shard reaches its engine whole.

The receiver's side of a transfer or a distribution (``adopt_machines``) reads
each machine from its provider. Those reads wait; a cycle that ran in
between used to plan with part of the batch, and plan the rest a cycle later
(a shadow shard recorded one roll-up's provisions over two cycles).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from bigfleet.shard.choices import EngineChoices
from bigfleet.shard.core import Operation, ShardCore, Started
from bigfleet.shard.sequences import OperationSequences
from bigfleet.shard.state import ShardState, Sighting, Workload
from bigfleet.shard.terms import CoordinatorTerms
from bigfleet.shard.transfers import CrossShardTransfers
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState
from workflows.contracts import MachineTarget
from workflows.coordinator_contracts import AdoptInput

SHARD = "shard-0"


@dataclass(frozen=True)
class Row:
    machine_id: str
    shard_id: str
    operation_seq: int = 0


@dataclass
class Ledger:
    """The ownership ledger: every machine named is ``owner``'s, but ``foreign``."""

    owner: str
    foreign: set[str] = field(default_factory=set)

    async def transfer(
        self, *, donor: str, receiver: str, machine_ids: Sequence[str], term: int, seq: int
    ) -> list[str]:
        raise AssertionError("an adoption moves nothing in the ledger")

    async def machines_by_id(self, machine_ids: Sequence[str]) -> list[Row]:
        return [Row(m, "shard-9" if m in self.foreign else self.owner, 7) for m in machine_ids]

    async def quarantine(self, machine_id: str, shard_id: str, reason: str) -> bool:
        raise AssertionError("an adoption quarantines nothing")


@dataclass
class SlowReads:
    """A provider whose every Get waits a few loop turns; ``lost`` it cannot read."""

    lost: set[str] = field(default_factory=set)
    got: list[str] = field(default_factory=list)

    async def read_one(self, machine_id: str) -> Sighting | None:
        for _ in range(3):
            await asyncio.sleep(0)
        self.got.append(machine_id)
        if machine_id in self.lost:
            return None
        return Sighting(_record(machine_id), Workload())

    async def read_many(self, machines: Sequence[MachineTarget]) -> list[Sighting | None]:
        assert {m.provider for m in machines} <= {"simcloud"}
        return [await self.read_one(m.machine_id) for m in machines]


class Idle:
    """An actuator that is never asked to start anything here."""

    acting = True

    async def start(self, op: Operation) -> Started:
        raise AssertionError(f"an adoption starts nothing, yet {op} was started")


def _record(mid: str) -> MachineRecord:
    return MachineRecord(
        id=mid,
        state=MachineState.IDLE,
        provider="simcloud",
        instance_type="m6i.large",
        zone="z1",
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=0.096,
        interruption_probability=0.0,
        allocatable={"cpu": 2.0, "memory": 8.0},
        host_ref=f"host-{mid}",
    )


def _transfers(
    reads: SlowReads, ledger: Ledger
) -> tuple[CrossShardTransfers[ShardEngine], ShardState[ShardEngine], OperationSequences]:
    engine = ShardEngine(EngineConfig())
    state = ShardState(engine, clock=lambda: 100.0)
    sequences = OperationSequences()
    transfers = CrossShardTransfers(
        ledger,
        shard_id=SHARD,
        state=state,
        engine_config=EngineConfig(),
        sequences=sequences,
        reads=reads,
        choices=EngineChoices(engine),
        core=ShardCore(state, Idle(), shard_id=SHARD),
        terms=CoordinatorTerms(),
        max_share=0.05,
    )
    return transfers, state, sequences


async def test_a_cycle_during_an_adoption_sees_none_of_the_batch_or_all_of_it() -> None:
    reads = SlowReads()
    transfers, state, _ = _transfers(reads, Ledger(SHARD))
    ids = [f"m{i}" for i in range(8)]
    adoption = asyncio.create_task(
        transfers.adopt_machines(AdoptInput(1, 1, [MachineTarget(m, "simcloud") for m in ids]))
    )
    seen: set[tuple[int, int]] = set()  # (machines held, machines the engine plans with)
    while not adoption.done():
        seen.add((len(state.owned), sum(1 for _ in state.machines())))
        await asyncio.sleep(0)
    assert (await adoption).adopted == 8
    seen.add((len(state.owned), sum(1 for _ in state.machines())))
    assert reads.got == ids  # the reads did wait, one machine after another
    assert seen == {(0, 0), (8, 8)}


async def test_an_unreadable_or_foreign_machine_does_not_hold_back_the_rest() -> None:
    reads = SlowReads(lost={"m1"})
    transfers, state, sequences = _transfers(reads, Ledger(SHARD, foreign={"m2"}))
    targets = [MachineTarget(m, "simcloud") for m in ("m0", "m1", "m2", "m3")]
    result = await transfers.adopt_machines(AdoptInput(1, 1, targets))
    assert result.adopted == 2
    # The unreadable one is held (the next List loads it); the foreign one is not read.
    assert sorted(state.owned) == ["m0", "m1", "m3"]
    assert sorted(r.id for r in state.machines()) == ["m0", "m3"]
    assert reads.got == ["m0", "m1", "m3"]
    # Each continues above the previous owner's operation sequence.
    assert [sequences.last("m0"), sequences.last("m1"), sequences.last("m2")] == [7, 7, 0]


async def test_a_lower_coordinator_term_adopts_nothing() -> None:
    reads = SlowReads()
    transfers, state, _ = _transfers(reads, Ledger(SHARD))
    target = [MachineTarget("m0", "simcloud")]
    assert (await transfers.adopt_machines(AdoptInput(5, 1, target))).adopted == 1
    refused = await transfers.adopt_machines(AdoptInput(4, 2, [MachineTarget("m1", "simcloud")]))
    assert refused.adopted == 0 and refused.refused
    assert sorted(state.owned) == ["m0"] and reads.got == ["m0"]
