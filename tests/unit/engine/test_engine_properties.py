"""Properties of the engine over random fleets, needs and histories.

"Something bad never happens": no machine is named twice, nothing in motion
or without a host is picked or bound, nothing is preempted for an equal or
lower priority, a cycle with its predecessor's actions in flight never
repeats them, and the inventory's derived counts always equal a recount
from scratch. A rule-based state machine drives random histories (roll-ups,
observations, cycles, settles, removals); single-shot properties cover the
monotonicity of shortfall in supply.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shard_engine.catalog import (
    LABEL_CAPACITY_TYPE,
    LABEL_INSTANCE_TYPE,
    LABEL_ZONE,
    capacity_type_label,
)
from shard_engine.clusters import NO_CLUSTER
from shard_engine.engine import ShardEngine
from shard_engine.model import (
    Action,
    AssignIdle,
    CapacityType,
    MachineRecord,
    MachineState,
    Need,
    Operator,
    Plan,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Requirement,
    Verify,
)
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, machine, machine_ids, need, rollup, spread_over

CLUSTERS = ("c0", "c1", "c2", "c3")
ZONES = ("z0", "z1", "z2")
PRIORITIES = (0, 10, 500_000, 1_000_000)
BOUND_STATES = (MachineState.CONFIGURING, MachineState.CONFIGURED, MachineState.DRAINING)

SOURCE_STATE: dict[type, MachineState] = {
    AssignIdle: MachineState.IDLE,
    Provision: MachineState.SPECULATIVE,
    Preempt: MachineState.CONFIGURED,
    Reclaim: MachineState.CONFIGURED,
    Release: MachineState.IDLE,
    Verify: MachineState.CONFIGURED,
}


@st.composite
def machine_records(draw: st.DrawFn, machine_id: str) -> MachineRecord:
    state = draw(st.sampled_from(list(MachineState)[1:]))
    cluster = draw(st.sampled_from(CLUSTERS)) if state in BOUND_STATES else ""
    return machine(
        machine_id,
        state=state,
        cluster=cluster,
        zone=draw(st.sampled_from(ZONES)),
        instance_type=draw(st.sampled_from(("small", "large", "gpu"))),
        capacity_type=draw(st.sampled_from(list(CapacityType)[1:])),
        price=draw(st.sampled_from((0.0, 0.5, 1.8, 6.0))),
        probability=draw(st.sampled_from((0.0, 0.1))),
        cpu=draw(st.sampled_from((2.0, 4.0, 8.0))),
        gpu=draw(st.sampled_from((0.0, 0.0, 1.0))),
    )


@st.composite
def needs(draw: st.DrawFn) -> Need:
    requirements = []
    if draw(st.booleans()):
        requirements.append(
            Requirement(
                LABEL_ZONE,
                draw(st.sampled_from((Operator.IN, Operator.NOT_IN))),
                tuple(draw(st.lists(st.sampled_from(ZONES), min_size=1, max_size=2))),
            )
        )
    spread = [spread_over(LABEL_ZONE, draw(st.integers(1, 2)))] if draw(st.booleans()) else []
    return need(
        cpu=draw(st.sampled_from((0.0, 2.0, 6.0, 16.0))),
        gpu=draw(st.sampled_from((0.0, 0.0, 1.0, 2.0))),
        priority=draw(st.sampled_from(PRIORITIES)),
        requirements=requirements,
        min_cpu=draw(st.sampled_from((0.0, 0.0, 4.0))),
        spread=spread,
        interruption_penalty=draw(st.sampled_from((0.0, 5.0, 50.0))),
        reclamation_penalty=draw(st.sampled_from((0.0, 8000.0))),
    )


def labels_of(record: MachineRecord) -> dict[str, str]:
    labels = dict(record.labels)
    labels.setdefault(LABEL_ZONE, record.zone)
    labels.setdefault(LABEL_INSTANCE_TYPE, record.instance_type)
    labels.setdefault(LABEL_CAPACITY_TYPE, capacity_type_label(record.capacity_type))
    return labels


def serves(record: MachineRecord, wanted: Need) -> bool:
    """Independent oracle: may this machine serve the need (requirements and min_unit)?"""
    labels = labels_of(record)
    for req in wanted.requirements:
        value = labels.get(req.key)
        if req.operator == Operator.IN and value not in req.values:
            return False
        if req.operator == Operator.NOT_IN and value in req.values:
            return False
    return all(record.allocatable.get(k, 0.0) >= v for k, v in wanted.min_unit.items())


def check_plan(
    engine: ShardEngine,
    plan: Plan,
    rollups: dict[str, tuple[Need, ...]],
    flying: set[str],
) -> None:
    """Properties every plan must have; ``flying`` is what was in flight before the cycle."""
    named = machine_ids(plan.actions)
    assert len(named) == len(set(named)), f"machine named twice: {Counter(named)}"
    for action in plan.actions:
        ids = action.machine_ids if isinstance(action, Provision) else (action.machine_id,)
        for machine_id in ids:
            assert machine_id not in flying, f"{machine_id} picked while in flight"
            record = engine.machine(machine_id)
            assert record is not None
            assert record.state == SOURCE_STATE[type(action)], (action, record.state)
        if isinstance(action, Preempt):
            victim = engine.machine(action.machine_id)
            assert victim is not None
            held = [n.priority for n in rollups[action.victim_cluster_id] if serves(victim, n)]
            assert action.preemptor_priority > max(held, default=-(2**31) - 1)
            assert action.preemptor_cluster_id != action.victim_cluster_id


def check_inventory(engine: ShardEngine) -> None:
    """Derived structures equal a recount from the columns; hostless machines are unbound."""
    inv = engine._inventory
    rows = inv.ids.live_rows()
    supply = np.zeros_like(inv._supply)
    free = np.zeros_like(inv._free)
    for row in rows:
        owner = inv.owner(row)
        if owner != NO_CLUSTER:
            supply[owner, int(inv.profile[row])] += 1
        key = inv.pool_key(row)
        if key is not None:
            pool = inv.pools.find(key)
            assert pool is not None
            assert row in inv.pools.members(pool).tolist()
            if key.tier != 2:
                free[key.tier, key.profile] += 1
    assert (supply == inv._supply).all()
    assert (free == inv._free).all()
    assert sum(inv.pools.count(p) for p in range(len(inv.pools))) == sum(
        1 for r in rows if inv.pool_key(r) is not None
    )
    for record in engine.machines():
        if not record.state.has_host:
            assert record.cluster == "", record
    summary = engine.summary()
    assert sum(summary.machines_by_state.values()) == summary.machines == len(rows)


class EngineHistory(RuleBasedStateMachine):
    """Random histories against one engine, with the invariants checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = ShardEngine()
        self.carrier = Carrier(self.engine)
        self.now = 0.0
        self.ts = 0
        self.rollups: dict[str, tuple[Need, ...]] = {c: () for c in CLUSTERS}
        self.pending: list[Action] = []

    @initialize(
        records=st.lists(st.integers(0, 10**6), min_size=5, max_size=40, unique=True),
        data=st.data(),
    )
    def fleet(self, records: list[int], data: st.DataObject) -> None:
        for n in records:
            self.engine.upsert_machine(data.draw(machine_records(f"m{n}")), now=self.now)

    @rule(cluster=st.sampled_from(CLUSTERS), wanted=st.lists(needs(), max_size=4))
    def roll_up(self, cluster: str, wanted: list[Need]) -> None:
        self.ts += 1
        outcome = apply(self.engine, rollup(cluster, self.ts, *wanted), now=self.now)
        if outcome.status == "applied":
            entry = self.engine._table.entry(self.engine._clusters.index_of(cluster))
            assert entry is not None
            self.rollups[cluster] = entry.needs

    @rule(dry=st.booleans())
    def cycle(self, dry: bool) -> None:
        self.now += 1
        flying = set(self.engine.in_flight())
        plan = self.engine.cycle(now=self.now, dry_run=dry)
        check_plan(self.engine, plan, self.rollups, flying)
        if not dry:
            for machine_id in machine_ids(plan.actions):
                assert machine_id in self.engine.in_flight()
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
                if fail and outcome is not None:
                    outcome = replace(outcome, state=MachineState.FAILED, cluster="")
                self.engine.settle(machine_id, outcome, now=self.now)
                assert machine_id not in self.engine.in_flight()

    @rule(data=st.data())
    def observe(self, data: st.DataObject) -> None:
        known = [r.id for r in self.engine.machines()]
        if not known:
            return
        machine_id = data.draw(st.sampled_from(known))
        self.engine.upsert_machine(data.draw(machine_records(machine_id)), now=self.now)

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        known = [r.id for r in self.engine.machines()]
        if known:
            self.engine.remove_machine(data.draw(st.sampled_from(known)))

    @rule()
    def second_cycle_repeats_nothing(self) -> None:
        self.now += 1
        flying = set(self.engine.in_flight())
        first = self.engine.cycle(now=self.now)
        check_plan(self.engine, first, self.rollups, flying)
        self.pending.extend(first.actions)
        flying = set(self.engine.in_flight())
        second = self.engine.cycle(now=self.now)
        check_plan(self.engine, second, self.rollups, flying)
        self.pending.extend(second.actions)
        assert not set(machine_ids(first.actions)) & set(machine_ids(second.actions))

    @invariant()
    def inventory_is_consistent(self) -> None:
        check_inventory(self.engine)


EngineHistory.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineHistory = EngineHistory.TestCase


@settings(max_examples=80, deadline=None)
@given(
    records=st.lists(st.tuples(st.sampled_from(CLUSTERS), st.integers(0, 4)), max_size=30),
    wanted=st.lists(st.tuples(st.sampled_from(CLUSTERS), needs()), min_size=1, max_size=8),
)
# The case the search found (ADR 0128): four slots in z0, one idle machine in z1;
# 12 cores anywhere, 6 spread over zones, 2 pinned to z0. The second cycle buys
# one more z0 machine for the pinned need.
@example(
    records=[("c0", 0), ("c0", 0), ("c0", 0), ("c0", 0), ("c0", 1)],
    wanted=[
        ("c0", need(priority=0)),
        ("c0", need(cpu=6.0, priority=0)),
        ("c0", need(cpu=6.0, priority=0)),
        ("c0", need(cpu=6.0, priority=0, spread=[spread_over("topology.kubernetes.io/zone", 1)])),
        (
            "c0",
            need(
                cpu=2.0,
                priority=0,
                requirements=[Requirement("topology.kubernetes.io/zone", Operator.IN, ("z0",))],
            ),
        ),
    ],
)
def test_with_nothing_configured_a_second_cycle_issues_no_action(
    records: list[tuple[str, int]], wanted: list[tuple[str, Need]]
) -> None:
    engine = ShardEngine()
    for i, (_, kind) in enumerate(records):
        state = MachineState.IDLE if kind % 2 else MachineState.SPECULATIVE
        engine.upsert_machine(machine(f"m{i}", state=state, zone=ZONES[kind % 3]), now=0)
    by_cluster: dict[str, list[Need]] = {}
    for cluster, n in wanted:
        by_cluster.setdefault(cluster, []).append(n)
    for cluster, ns in by_cluster.items():
        apply(engine, rollup(cluster, 2, *ns), now=0)

    engine.cycle(now=1)
    second = engine.cycle(now=2)

    assert second.actions == ()


def test_a_narrow_need_after_a_broad_one_buys_in_the_first_cycle() -> None:
    # Found by the search above: five z0 slots and one idle z1 machine of 4 cores;
    # cluster c3 wants 2 cores anywhere (priority 1), 16 anywhere, then 2 in z0. The
    # first cycle gives the idle machine to the first need and four z0 slots to the
    # second. The third used to claim a share of those four, not yet bound to the second
    # need (bindings are made at commit), look covered, and buy the fifth slot only at
    # the second cycle. A cycle's own picks now count as bound to the need they were
    # made for (``Worksheet.pick``).
    engine = ShardEngine()
    for i, zone in enumerate(["z0"] * 5):
        engine.upsert_machine(machine(f"m{i}", state=MachineState.SPECULATIVE, zone=zone), now=0)
    engine.upsert_machine(machine("m5", state=MachineState.IDLE, zone="z1"), now=0)
    z0 = Requirement("topology.kubernetes.io/zone", Operator.IN, ("z0",))
    wanted = (
        need(cpu=2.0, priority=1),
        need(cpu=16.0, priority=0),
        need(cpu=2.0, priority=0, requirements=[z0]),
    )
    apply(engine, rollup("c3", 2, *wanted), now=0)

    first = engine.cycle(now=1)
    second = engine.cycle(now=2)

    assert sorted(machine_ids(first.actions)) == ["m0", "m1", "m2", "m3", "m4", "m5"]
    assert second.actions == ()


def total_shortfall(plan: Plan) -> float:
    return sum(s.deficit.get("cpu", 0.0) for s in plan.shortfalls)


@settings(max_examples=150, deadline=None)
@given(
    states=st.lists(
        st.tuples(
            st.sampled_from((MachineState.IDLE, MachineState.SPECULATIVE, MachineState.CONFIGURED)),
            st.sampled_from(CLUSTERS),
            st.sampled_from((0.5, 1.0, 3.0)),
        ),
        max_size=25,
    ),
    demand=st.lists(
        st.tuples(st.sampled_from(CLUSTERS), st.integers(1, 40), st.sampled_from(PRIORITIES)),
        min_size=1,
        max_size=8,
    ),
    extra=st.tuples(
        st.sampled_from((MachineState.IDLE, MachineState.SPECULATIVE)),
        st.sampled_from((0.1, 1.0, 9.0)),
    ),
)
def test_adding_free_supply_never_increases_total_shortfall(
    states: list[tuple[MachineState, str, float]],
    demand: list[tuple[str, int, int]],
    extra: tuple[MachineState, float],
) -> None:
    """Machines of one shape, needs without requirements: more free supply, less shortfall.

    The precondition is deliberate. With several shapes or requirement sets
    a cost-minimising greedy can spend the extra machine on a cheaper mix
    that overshoots, or on a shape a later need needed, and total shortfall
    can rise although every need is served in priority order; what stays
    true there is tested below for the highest-priority need.
    """
    by_cluster: dict[str, list[Need]] = {}
    for cluster, cpu, priority in demand:
        by_cluster.setdefault(cluster, []).append(need(cpu=float(cpu), priority=priority))

    def run(with_extra: bool) -> float:
        engine = ShardEngine()
        for i, (state, cluster, price) in enumerate(states):
            bound = cluster if state == MachineState.CONFIGURED else ""
            engine.upsert_machine(machine(f"m{i}", state=state, cluster=bound, price=price), now=0)
        if with_extra:
            engine.upsert_machine(machine("extra", state=extra[0], price=extra[1]), now=0)
        for cluster, ns in by_cluster.items():
            apply(engine, rollup(cluster, 1, *ns), now=0)
        return total_shortfall(engine.cycle(now=1, dry_run=True))

    assert run(True) <= run(False) + 1e-9


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(st.integers(0, 10**6), max_size=25, unique=True),
    extra=st.integers(0, 10**6),
    top=needs(),
    rest=st.lists(needs(), max_size=5),
    data=st.data(),
)
def test_adding_free_supply_never_hurts_the_highest_priority_need(
    records: list[int], extra: int, top: Need, rest: list[Need], data: st.DataObject
) -> None:
    assume(extra not in records)
    top = replace(top, priority=2_000_000, spread=())
    fleet = [data.draw(machine_records(f"m{n}")) for n in records]
    added = data.draw(machine_records(f"m{extra}"))
    assume(added.state in (MachineState.IDLE, MachineState.SPECULATIVE))

    def deficit(with_extra: bool) -> float:
        engine = ShardEngine()
        for record in fleet + ([added] if with_extra else []):
            engine.upsert_machine(record, now=0)
        apply(engine, rollup("top", 1, top), now=0)
        apply(engine, rollup("rest", 1, *rest), now=0)
        plan = engine.cycle(now=1, dry_run=True)
        return sum(sum(s.deficit.values()) for s in plan.shortfalls if s.cluster_id == "top")

    assert deficit(True) <= deficit(False) + 1e-6
