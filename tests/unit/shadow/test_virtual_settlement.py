"""A shadow shard's would-be operations settle in its memory, so later cycles can reclaim.

The real engine, shard state, core and gate; the actuator behind the gate
must never be reached. Time is the shard's clock, moved by hand.
"""

from __future__ import annotations

import asyncio

import pytest

from bigfleet.shard.core import DeleteOp, Operation, ShardCore, Started
from bigfleet.shard.gate import GatedActuator, Modes
from bigfleet.shard.state import ShardState, Workload
from bigfleet.shard.virtual import ShadowDelays, VirtualSettlement
from shard_engine.config import EngineConfig
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineRecord, MachineState, Plan, Provision, Reclaim
from tests.rollups import apply
from tests.unit.engine.engine_fleet import fleet, machine, need, of_kind, rollup

EAGER = EngineConfig(
    reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
)
DELAYS = ShadowDelays(create_s=100, configure_s=20, drain_margin_s=10, delete_s=30)


class NeverReached:
    """The actuator behind a shadow gate: reaching it would be acting."""

    acting = True

    async def start(self, op: Operation) -> Started:
        raise AssertionError(f"a shadow shard acted: {op}")


class Pushed:
    """The node view: a shadow shard must tell no operator of a would-be machine."""

    def __init__(self) -> None:
        self.records: list[MachineRecord] = []

    def push(self, record: MachineRecord, *, cluster_hint: str = "") -> None:
        self.records.append(record)

    def remember(self, machine_id: str, cluster_id: str) -> None:
        pass


class Shadow:
    """A shadow shard's parts over one engine."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.engine = ShardEngine(EAGER)
        self.nodes = Pushed()
        self.state = ShardState(self.engine, clock=lambda: self.now, nodes=self.nodes)
        self.settlement = VirtualSettlement(self.state, clock=lambda: self.now, delays=DELAYS)
        gate = GatedActuator(NeverReached(), Modes(shadow=True), settlement=self.settlement)
        self.core = ShardCore(self.state, gate, shard_id="shadow")

    def cycle(self) -> Plan:
        self.settlement.settle_due()
        plan = self.engine.cycle(now=self.now)
        asyncio.run(self.core.execute(plan.actions))
        return plan


def test_a_would_be_provision_settles_configured_for_its_need_after_create_and_configure() -> None:
    shard = Shadow()
    ids = fleet(shard.engine, 4, state=MachineState.SPECULATIVE, now=shard.now)
    apply(shard.engine, rollup("c1", 1, need(cpu=8)), now=shard.now)

    plan = shard.cycle()
    provisioned = [m for a in of_kind(plan, Provision) for m in a.machine_ids]
    assert len(provisioned) == 2 and shard.settlement.pending == 1

    shard.now += 119  # create 100 s + configure 20 s not yet passed
    assert shard.settlement.settle_due() == 0
    assert set(shard.engine.in_flight()) == set(provisioned)
    shard.now += 1
    assert shard.settlement.settle_due() == 2

    for mid in provisioned:
        record = shard.engine.machine(mid)
        assert record is not None and (record.state, record.cluster) == (
            MachineState.CONFIGURED,
            "c1",
        )
    assert shard.engine.in_flight() == {}
    assert shard.nodes.records == [], "no operator hears of a machine that never came"
    # The provider still shows the slot speculative: that is not news to the shadow shard.
    shard.state.observe(machine(provisioned[0], state=MachineState.SPECULATIVE), Workload())
    still = shard.engine.machine(provisioned[0])
    assert still is not None and still.state == MachineState.CONFIGURED
    # Covered now: the next cycle provisions nothing more.
    assert of_kind(shard.cycle(), Provision) == []
    assert len(ids) == 4


def test_when_demand_falls_a_settled_machine_is_reclaimed_and_settles_idle() -> None:
    shard = Shadow()
    fleet(shard.engine, 2, state=MachineState.SPECULATIVE, now=shard.now)
    apply(shard.engine, rollup("c1", 1, need(cpu=8)), now=shard.now)
    shard.cycle()
    shard.now += 120
    shard.settlement.settle_due()

    apply(shard.engine, rollup("c1", 2, need(cpu=4)), now=shard.now)  # one machine is enough
    shard.now += 1
    plan = shard.cycle()
    [reclaim] = of_kind(plan, Reclaim)
    shard.now += reclaim.grace_seconds + 9
    assert shard.settlement.settle_due() == 0
    shard.now += 1
    assert shard.settlement.settle_due() == 1

    record = shard.engine.machine(reclaim.machine_id)
    assert record is not None and (record.state, record.cluster) == (MachineState.IDLE, "")
    assert shard.settlement.settled == {"ProvisionOp": 2, "DrainOp": 1}
    assert shard.nodes.records == []


def test_a_would_be_delete_returns_the_slot_and_provider_reports_count_again() -> None:
    shard = Shadow()
    [mid] = fleet(shard.engine, 1, state=MachineState.IDLE, now=shard.now)
    record = shard.engine.machine(mid)
    assert record is not None
    shard.engine.claim(mid, operation="delete", target_cluster="", now=shard.now)
    shard.settlement.record(DeleteOp(record))
    shard.now += 30
    assert shard.settlement.settle_due() == 1

    gone = shard.engine.machine(mid)
    assert gone is not None and gone.state == MachineState.SPECULATIVE and gone.host_ref == ""
    assert not shard.state.is_virtual(mid)
    shard.state.observe(machine(mid, state=MachineState.IDLE), Workload())
    seen = shard.engine.machine(mid)
    assert seen is not None and seen.state == MachineState.IDLE


def test_a_negative_delay_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="shadow delays: create_s must be 0 or more, not -1"):
        ShadowDelays(create_s=-1)
