"""Retiring a decommissioned domain's machines: none of them is planned with meanwhile.

``retire_machines`` writes a quarantine per machine (a store round trip each)
and starts a drain for each configured one. A cycle that ran between two of
those writes used to plan with the machines not yet reached: it could start
a Configure on one the next step then quarantined under it.
"""

from __future__ import annotations

import asyncio

import pytest

from bigfleet.shard.core import DrainOp
from bigfleet.shard.state import Workload
from shard_engine.model import MachineState
from tests.unit.shard.transfer_fakes import PROVIDER, SHARD, Ledger, Starts, World, record, world
from workflows.contracts import REASON_DECOMMISSION
from workflows.coordinator_contracts import RetireInput

IDLE = ["m0", "m1", "m2", "m3"]
CONFIGURED = ["c0", "c1"]
BUSY = "b0"


def _fleet(w: World) -> None:
    for mid in [*IDLE, *CONFIGURED, BUSY]:
        w.state.hold(mid, PROVIDER)
    for mid in IDLE:
        w.state.observe(record(mid), Workload())
    for mid in CONFIGURED:
        w.state.observe(record(mid, MachineState.CONFIGURED, "c1"), Workload(500, "need-a"))
    w.state.observe(record(BUSY), Workload())
    assert w.state.engine.claim(BUSY, operation="configure", target_cluster="c1", now=100.0)


def _retire(ids: list[str]) -> RetireInput:
    return RetireInput(machine_ids=ids, reason="rack r1 retired")


async def test_no_cycle_plans_with_a_machine_being_retired() -> None:
    w = world()
    _fleet(w)
    chosen = [*IDLE, *CONFIGURED]
    retiring = asyncio.create_task(w.transfers.retire_machines(_retire([*chosen, BUSY])))
    await asyncio.sleep(0)  # the retirement has begun
    seen: list[set[str]] = []
    while not retiring.done():
        seen.append(w.planned() & set(chosen))
        await asyncio.sleep(0)
    result = await retiring
    assert len(seen) > 10  # the store writes and drain starts did wait
    assert all(not s for s in seen)
    assert (result.retired, result.draining) == (6, 2)
    assert w.ledger.quarantined == chosen
    assert all(w.state.lifecycle.is_quarantined(m) and w.state.owns(m) for m in chosen)
    assert w.planned() == {BUSY}  # in flight: left for the next round, untouched
    assert not w.state.lifecycle.is_quarantined(BUSY)
    drains = [op for op in w.actuator.started if isinstance(op, DrainOp)]
    assert [(d.machine.id, d.cluster_id, d.reason) for d in drains] == [
        (m, "c1", REASON_DECOMMISSION) for m in CONFIGURED
    ]
    assert [d.victim_priority for d in drains] == [500, 500]


async def test_a_machine_the_record_does_not_give_us_comes_back_as_it_was() -> None:
    w = world(Ledger(SHARD, foreign={"c0"}))
    _fleet(w)
    result = await w.transfers.retire_machines(_retire(["m0", "c0"]))
    assert (result.retired, result.draining) == (1, 0)
    assert not w.state.lifecycle.is_quarantined("c0")
    back = w.state.machine("c0")
    assert back is not None and back.state is MachineState.CONFIGURED and back.cluster == "c1"
    assert w.state.priority("c0") == 500 and w.actuator.started == []


async def test_when_the_store_fails_the_machines_not_yet_recorded_come_back() -> None:
    w = world(Ledger(SHARD, fail_after=2))
    _fleet(w)
    with pytest.raises(ConnectionError):
        await w.transfers.retire_machines(_retire([*IDLE, *CONFIGURED]))
    assert w.ledger.quarantined == ["m0", "m1"]
    assert all(w.state.lifecycle.is_quarantined(m) for m in ("m0", "m1"))
    rest = ["m2", "m3", *CONFIGURED]
    assert not any(w.state.lifecycle.is_quarantined(m) for m in rest)
    assert w.planned() == {*rest, BUSY}
    assert w.state.priority("c0") == 500


async def test_a_refused_drain_is_retired_but_not_counted_draining() -> None:
    w = world(actuator=Starts(refuse={"c1"}))
    _fleet(w)
    result = await w.transfers.retire_machines(_retire(CONFIGURED))
    assert (result.retired, result.draining) == (2, 1)
    assert all(w.state.lifecycle.is_quarantined(m) for m in CONFIGURED)
