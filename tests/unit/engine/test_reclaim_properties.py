"""Property: a machine is never reclaimed while its cluster has unmet demand it could serve.

Random fleets, roll-ups, cycles and partial settles drive an engine whose
reclaim settings are drawn too (from eager to patient). After every
committed cycle, each reclaimed machine is checked against an independent
oracle: for every need of its cluster that the machine could serve
(requirements and ``min_unit`` fit, and it offers a resource the need asks
for), the cluster's settled configured machines that serve the need —
leaving out every machine the plan drains — still cover the need's
aggregate in each resource the reclaimed machine offers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from shard_engine.catalog import LABEL_ZONE
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import (
    Action,
    MachineRecord,
    MachineState,
    Need,
    Operator,
    Plan,
    Preempt,
    Provision,
    Reclaim,
    Requirement,
)
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, machine, need, rollup

CLUSTERS = ("c0", "c1", "c2")
ZONES = ("z0", "z1", "z2")
TOLERANCE = 1e-6


@st.composite
def needs(draw: st.DrawFn) -> Need:
    requirements = []
    if draw(st.booleans()):
        zones = tuple(draw(st.lists(st.sampled_from(ZONES), min_size=1, max_size=2, unique=True)))
        requirements.append(Requirement(LABEL_ZONE, Operator.IN, zones))
    return need(
        cpu=draw(st.sampled_from((0.0, 2.0, 4.0, 8.0, 12.0, 24.0))),
        gpu=draw(st.sampled_from((0.0, 0.0, 1.0))),
        priority=draw(st.sampled_from((10, 1000, 500_000))),
        requirements=requirements,
        min_cpu=draw(st.sampled_from((0.0, 0.0, 4.0))),
    )


def serves(record: MachineRecord, wanted: Need) -> bool:
    """Independent oracle: requirements and min_unit fit."""
    for req in wanted.requirements:
        if req.operator == Operator.IN and record.zone not in req.values:
            return False
    return all(record.allocatable.get(k, 0.0) >= v for k, v in wanted.min_unit.items())


def drained(plan: Plan) -> set[str]:
    return {a.machine_id for a in plan.actions if isinstance(a, Reclaim | Preempt)}


def check_reclaims(
    engine: ShardEngine,
    plan: Plan,
    rollups: Mapping[str, tuple[Need, ...]],
    flying: set[str],
) -> None:
    leaving = drained(plan)
    records = {r.id: r for r in engine.machines()}
    for action in plan.actions:
        if not isinstance(action, Reclaim):
            continue
        gone = records[action.machine_id]
        settled = [
            r
            for r in records.values()
            if r.state == MachineState.CONFIGURED
            and r.cluster == action.cluster_id
            and r.id not in flying
            and r.id not in leaving
        ]
        for wanted in rollups[action.cluster_id]:
            if not serves(gone, wanted):
                continue
            for resource, amount in wanted.aggregate.items():
                if gone.allocatable.get(resource, 0.0) <= 0 or amount <= 0:
                    continue
                have = sum(r.allocatable.get(resource, 0.0) for r in settled if serves(r, wanted))
                assert have >= amount * (1 - TOLERANCE), (
                    f"{action.machine_id} reclaimed from {action.cluster_id} while a need it "
                    f"could serve has {have} of {amount} {resource} settled"
                )


class ReclaimHistory(RuleBasedStateMachine):
    """Random histories; the reclaim property is checked after every committed cycle."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = ShardEngine()
        self.carrier = Carrier(self.engine)
        self.now = 0.0
        self.ts = 0
        self.rollups: dict[str, tuple[Need, ...]] = dict.fromkeys(CLUSTERS, ())
        self.pending: list[Action] = []

    @initialize(
        hysteresis=st.integers(1, 3),
        min_age=st.sampled_from((0.0, 0.0, 30.0)),
        window=st.sampled_from((0.0, 0.0, 60.0)),
        margin=st.sampled_from((0.0, 0.5)),
        fleet=st.lists(
            st.tuples(
                st.sampled_from(
                    (MachineState.CONFIGURED, MachineState.IDLE, MachineState.SPECULATIVE)
                ),
                st.sampled_from(CLUSTERS),
                st.sampled_from(ZONES),
                st.sampled_from((2.0, 4.0, 8.0)),
                st.booleans(),
            ),
            min_size=3,
            max_size=30,
        ),
    )
    def build(
        self,
        hysteresis: int,
        min_age: float,
        window: float,
        margin: float,
        fleet: list[tuple[MachineState, str, str, float, bool]],
    ) -> None:
        self.engine = ShardEngine(
            EngineConfig(
                reclaim_hysteresis_cycles=hysteresis,
                reclaim_min_age_seconds=min_age,
                reclaim_window_seconds=window,
                reclaim_swing_margin=margin,
            )
        )
        self.carrier = Carrier(self.engine)
        for i, (state, cluster, zone, cpu, gpu) in enumerate(fleet):
            record = machine(
                f"m{i}",
                state=state,
                cluster=cluster,
                zone=zone,
                cpu=cpu,
                gpu=1.0 if gpu else 0.0,
                price=cpu / 4,
            )
            self.engine.upsert_machine(record, now=self.now)

    @rule(cluster=st.sampled_from(CLUSTERS), wanted=st.lists(needs(), max_size=3))
    def roll_up(self, cluster: str, wanted: list[Need]) -> None:
        self.ts += 1
        outcome = apply(self.engine, rollup(cluster, self.ts, *wanted), now=self.now)
        if outcome.status == "applied":
            entry = self.engine._table.entry(self.engine._clusters.index_of(cluster))
            assert entry is not None
            self.rollups[cluster] = entry.needs

    @rule(seconds=st.sampled_from((1.0, 5.0, 40.0)))
    def cycle(self, seconds: float) -> None:
        self.now += seconds
        flying = set(self.engine.in_flight())
        plan = self.engine.cycle(now=self.now)
        check_reclaims(self.engine, plan, self.rollups, flying)
        self.pending.extend(plan.actions)

    @rule(data=st.data())
    def settle_some(self, data: st.DataObject) -> None:
        if not self.pending:
            return
        count = data.draw(st.integers(1, len(self.pending)))
        done, self.pending = self.pending[:count], self.pending[count:]
        fail = data.draw(st.booleans())
        for action in done:
            ids = action.machine_ids if isinstance(action, Provision) else (action.machine_id,)
            for machine_id in ids:
                if self.engine.machine(machine_id) is None:
                    continue
                outcome = self.carrier.outcome(action, machine_id)
                if fail and outcome is not None and not isinstance(action, Reclaim):
                    outcome = replace(outcome, state=MachineState.FAILED, cluster="")
                self.engine.settle(machine_id, outcome, now=self.now)


ReclaimHistory.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestReclaimNeverLeavesAServableNeedShort = ReclaimHistory.TestCase
