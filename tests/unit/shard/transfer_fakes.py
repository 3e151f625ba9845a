"""The ports a shard's ``CrossShardTransfers`` reaches the outside through, for its tests.

Each port waits a few loop turns, as a database write or a provider Get
would, so a test can look at the shard's state between any two steps of a
transfer, where a cycle would run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from bigfleet.shard.choices import EngineChoices
from bigfleet.shard.core import Operation, ShardCore, Started, machines_of
from bigfleet.shard.sequences import OperationSequences
from bigfleet.shard.state import ShardState, Sighting, Workload
from bigfleet.shard.terms import CoordinatorTerms
from bigfleet.shard.transfers import CrossShardTransfers
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState
from workflows.contracts import MachineTarget

SHARD = "shard-0"
PROVIDER = "simcloud"


async def turns(n: int = 3) -> None:
    """A few turns of the event loop: what one round trip gives a cycle."""
    for _ in range(n):
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Row:
    machine_id: str
    shard_id: str
    operation_seq: int = 0


@dataclass
class Ledger:
    """The ownership ledger: every machine named is ``owner``'s but ``foreign``.

    A quarantine of a ``foreign`` machine finds no row of ours; the one
    after ``fail_after`` quarantines raises, as a store that went away would.
    """

    owner: str
    foreign: set[str] = field(default_factory=set)
    fail_after: int | None = None
    quarantined: list[str] = field(default_factory=list)

    async def transfer(
        self, *, donor: str, receiver: str, machine_ids: Sequence[str], term: int, seq: int
    ) -> list[str]:
        raise AssertionError("these tests move nothing in the ledger")

    async def machines_by_id(self, machine_ids: Sequence[str]) -> list[Row]:
        return [Row(m, "shard-9" if m in self.foreign else self.owner, 7) for m in machine_ids]

    async def quarantine(self, machine_id: str, shard_id: str, reason: str) -> bool:
        await turns()
        if self.fail_after is not None and len(self.quarantined) >= self.fail_after:
            raise ConnectionError("the store went away")
        if machine_id in self.foreign or shard_id != self.owner:
            return False
        self.quarantined.append(machine_id)
        return True


@dataclass
class SlowReads:
    """A provider whose every Get waits a few loop turns; ``lost`` it cannot read."""

    lost: set[str] = field(default_factory=set)
    got: list[str] = field(default_factory=list)

    async def read_many(self, machines: Sequence[MachineTarget]) -> list[Sighting | None]:
        assert {m.provider for m in machines} <= {PROVIDER}
        out: list[Sighting | None] = []
        for m in machines:
            await turns()
            self.got.append(m.machine_id)
            out.append(
                None if m.machine_id in self.lost else Sighting(record(m.machine_id), Workload())
            )
        return out


@dataclass
class Starts:
    """An actuator that starts what it is given (after a round trip), or refuses ``refuse``."""

    refuse: set[str] = field(default_factory=set)
    started: list[Operation] = field(default_factory=list)
    acting: bool = True

    async def start(self, op: Operation) -> Started:
        await turns()
        mine = machines_of(op)
        if self.refuse & set(mine):
            return Started(refused=tuple(mine))
        self.started.append(op)
        return Started(1)


def record(mid: str, state: MachineState = MachineState.IDLE, cluster: str = "") -> MachineRecord:
    """An on-demand m6i.large of the shard's one provider (no host while speculative)."""
    return MachineRecord(
        id=mid,
        state=state,
        provider=PROVIDER,
        instance_type="m6i.large",
        zone="z1",
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=0.096,
        interruption_probability=0.0,
        allocatable={"cpu": 2.0, "memory": 8.0},
        cluster=cluster,
        host_ref="" if state is MachineState.SPECULATIVE else f"host-{mid}",
    )


@dataclass
class World:
    transfers: CrossShardTransfers[ShardEngine]
    state: ShardState[ShardEngine]
    sequences: OperationSequences
    ledger: Ledger
    reads: SlowReads
    actuator: Starts

    def planned(self) -> set[str]:
        """The machines a cycle run now would plan with."""
        return {r.id for r in self.state.machines()}


def world(
    ledger: Ledger | None = None, reads: SlowReads | None = None, actuator: Starts | None = None
) -> World:
    ledger = ledger if ledger is not None else Ledger(SHARD)
    reads = reads if reads is not None else SlowReads()
    actuator = actuator if actuator is not None else Starts()
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
        core=ShardCore(state, actuator, shard_id=SHARD),
        terms=CoordinatorTerms(),
        max_share=0.05,
    )
    return World(transfers, state, sequences, ledger, reads, actuator)
