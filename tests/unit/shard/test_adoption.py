"""A batch of machines the ledger hands this shard reaches its engine whole.

The receiver's side of a transfer or a distribution (``adopt_machines``) reads
each machine from its provider. Those reads wait; a cycle that ran in
between used to plan with part of the batch, and plan the rest a cycle later
(a shadow shard recorded one roll-up's provisions over two cycles).
"""

from __future__ import annotations

import asyncio

from tests.unit.shard.transfer_fakes import SHARD, Ledger, SlowReads, world
from workflows.contracts import MachineTarget
from workflows.coordinator_contracts import AdoptInput


async def test_a_cycle_during_an_adoption_sees_none_of_the_batch_or_all_of_it() -> None:
    w = world()
    ids = [f"m{i}" for i in range(8)]
    adoption = asyncio.create_task(
        w.transfers.adopt_machines(AdoptInput(1, 1, [MachineTarget(m, "simcloud") for m in ids]))
    )
    seen: set[tuple[int, int]] = set()  # (machines held, machines the engine plans with)
    while not adoption.done():
        seen.add((len(w.state.owned), len(w.planned())))
        await asyncio.sleep(0)
    assert (await adoption).adopted == 8
    seen.add((len(w.state.owned), len(w.planned())))
    assert w.reads.got == ids  # the reads did wait, one machine after another
    assert seen == {(0, 0), (8, 8)}


async def test_an_unreadable_or_foreign_machine_does_not_hold_back_the_rest() -> None:
    w = world(Ledger(SHARD, foreign={"m2"}), SlowReads(lost={"m1"}))
    targets = [MachineTarget(m, "simcloud") for m in ("m0", "m1", "m2", "m3")]
    result = await w.transfers.adopt_machines(AdoptInput(1, 1, targets))
    assert result.adopted == 2
    # The unreadable one is held (the next List loads it); the foreign one is not read.
    assert sorted(w.state.owned) == ["m0", "m1", "m3"]
    assert w.planned() == {"m0", "m3"}
    assert w.reads.got == ["m0", "m1", "m3"]
    # Each continues above the previous owner's operation sequence.
    assert [w.sequences.last(m) for m in ("m0", "m1", "m2")] == [7, 7, 0]


async def test_a_lower_coordinator_term_adopts_nothing() -> None:
    w = world()
    target = [MachineTarget("m0", "simcloud")]
    assert (await w.transfers.adopt_machines(AdoptInput(5, 1, target))).adopted == 1
    refused = await w.transfers.adopt_machines(AdoptInput(4, 2, [MachineTarget("m1", "simcloud")]))
    assert refused.adopted == 0 and refused.refused
    assert sorted(w.state.owned) == ["m0"] and w.reads.got == ["m0"]
