"""Seeded random engine histories, written down as text, for the decision-equivalence test.

A history builds a small shard (a few hundred machines of several shapes,
zones, racks and capacity types; half a dozen clusters whose needs use
zone and instance-type requirements, ``NotIn``, gangs in one rack, zone
spreads and ``min_unit``) and then takes random steps: roll-ups that grow,
shrink, add or drop needs (some stale, some reporting nodes so machines get
verified, some naming the machines their cluster gives up), committing and
dry-run cycles, settles (some failed, some with the machine gone), fresh
observations, removals, pauses, forgotten clusters and claims. Everything
that comes out of the engine — every plan's actions, shortfalls and
why-not reasons, and what is in flight or promised after each committed
cycle — is written as one line of text per fact.

The digest of that text, per seed, is recorded in ``plan_digests.json``.
It was produced by the engine before actions became arrays and must not
change while the engine is only made faster. A change that alters
decisions on purpose regenerates it (``python tests/unit/engine/plan_history.py
--write``) and says so in its commit message.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from shard_engine.engine import RollupRejected, ShardEngine
from shard_engine.model import (
    Action,
    AppClass,
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
    Rollup,
    TopologySpread,
    WhenUnsatisfiable,
)
from tests.rollups import apply

DIGESTS = Path(__file__).with_name("plan_digests.json")
SEEDS = tuple(range(24))

GI = 2.0**30
ZONE = "topology.kubernetes.io/zone"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
CAPACITY = "bigfleet.io/capacity-type"
ZONES = ("z0", "z1", "z2")
RACKS = ("r0", "r1", "r2", "r3")
CLUSTERS = ("c0", "c1", "c2", "c3", "c4", "c5")
# name, cpu, memory, gpu
TYPES = (
    ("small", 2.0, 8 * GI, 0.0),
    ("large", 8.0, 32 * GI, 0.0),
    ("xl", 16.0, 64 * GI, 0.0),
    ("gpu", 16.0, 128 * GI, 2.0),
)
PRIORITIES = (0, 10, 1000, 100_000, 500_001, 1_000_000)


def _shape_record(
    rng: random.Random, machine_id: str, state: MachineState, cluster: str
) -> MachineRecord:
    name, cpu, memory, gpu = rng.choice(TYPES)
    capacity = rng.choice(
        (CapacityType.ON_DEMAND, CapacityType.ON_DEMAND, CapacityType.SPOT, CapacityType.RESERVED)
    )
    labels = {"family": name}
    if name == "gpu" and rng.random() < 0.7:
        capacity = CapacityType.BARE_METAL
        labels["rack"] = rng.choice(RACKS)
    price = {"small": 0.1, "large": 0.4, "xl": 0.8, "gpu": 3.0}[name]
    price *= {CapacityType.SPOT: 0.35, CapacityType.RESERVED: 0.6}.get(capacity, 1.0)
    if capacity == CapacityType.BARE_METAL:
        price = 0.0
    allocatable = {"cpu": cpu, "memory": memory}
    if gpu:
        allocatable["nvidia.com/gpu"] = gpu
    zone = rng.choice(ZONES)
    if "rack" in labels:
        zone = ZONES[RACKS.index(labels["rack"]) % len(ZONES)]
    return MachineRecord(
        id=machine_id,
        state=state,
        provider="metal" if capacity == CapacityType.BARE_METAL else "sim",
        instance_type=name,
        zone=zone,
        capacity_type=capacity,
        price_per_hour=round(price, 4),
        interruption_probability=rng.choice((0.05, 0.1)) if capacity == CapacityType.SPOT else 0.0,
        allocatable=allocatable,
        labels=labels,
        cluster=cluster if state.has_host or state == MachineState.CREATING else "",
        host_ref=f"h-{machine_id}" if state.has_host else "",
    )


_STATES = (
    (MachineState.IDLE, 15),
    (MachineState.SPECULATIVE, 25),
    (MachineState.CONFIGURED, 50),
    (MachineState.CONFIGURING, 4),
    (MachineState.CREATING, 3),
    (MachineState.DRAINING, 2),
    (MachineState.FAILED, 1),
)


def _random_machine(rng: random.Random, machine_id: str) -> MachineRecord:
    state = rng.choices([s for s, _ in _STATES], weights=[w for _, w in _STATES])[0]
    cluster = ""
    bound = state in (MachineState.CONFIGURED, MachineState.CONFIGURING, MachineState.DRAINING)
    if bound or (state == MachineState.CREATING and rng.random() < 0.6):
        cluster = rng.choice(CLUSTERS)
    return _shape_record(rng, machine_id, state, cluster)


def _random_need(rng: random.Random) -> Need:
    requirements: list[Requirement] = []
    spread: tuple[TopologySpread, ...] = ()
    roll = rng.random()
    gpu = 0.0
    if roll < 0.12:
        requirements = [
            Requirement("rack", Operator.SAME),
            Requirement("family", Operator.IN, ("gpu",)),
        ]
        gpu = float(rng.choice((2, 4, 6)))
    elif roll < 0.35:
        requirements = [Requirement(ZONE, Operator.IN, tuple(rng.sample(ZONES, rng.randint(1, 2))))]
    elif roll < 0.45:
        requirements = [Requirement(ZONE, Operator.NOT_IN, (rng.choice(ZONES),))]
    elif roll < 0.60:
        requirements = [
            Requirement(INSTANCE_TYPE, Operator.IN, (rng.choice(("small", "large", "xl")),))
        ]
    elif roll < 0.70:
        requirements = [Requirement(CAPACITY, Operator.IN, (rng.choice(("spot", "on-demand")),))]
    elif roll < 0.75:
        requirements = [Requirement("rack", Operator.EXISTS)]
        gpu = float(rng.choice((0, 2)))
    if not any(r.operator == Operator.SAME for r in requirements) and rng.random() < 0.15:
        when = rng.choice((WhenUnsatisfiable.DO_NOT_SCHEDULE, WhenUnsatisfiable.SCHEDULE_ANYWAY))
        spread = (TopologySpread(ZONE, rng.choice((1, 2)), when),)
        requirements = [r for r in requirements if r.key != ZONE]
    aggregate = {"cpu": float(rng.choice((4, 8, 16, 32, 64, 128, 256)))}
    if rng.random() < 0.4:
        aggregate["memory"] = aggregate["cpu"] * rng.choice((2, 4)) * GI
    if gpu:
        aggregate["nvidia.com/gpu"] = gpu
    unit = {"cpu": float(rng.choice((4, 8)))} if rng.random() < 0.15 else {}
    return Need(
        requirements=tuple(requirements),
        aggregate=aggregate,
        priority=rng.choice(PRIORITIES),
        min_unit=unit,
        spread=spread,
        interruption_penalty=rng.choice((0.0, 0.5, 5.0, 50.0)),
        reclamation_penalty=rng.choice((0.0, 8.0, 8192.0)),
        app_class=rng.choice(list(AppClass)),
    )


def _resized(rng: random.Random, need: Need) -> Need:
    factor = rng.choice((0.25, 0.5, 1.5, 2.0, 3.0))
    return replace(
        need, aggregate={k: max(1.0, round(v * factor)) for k, v in need.aggregate.items()}
    )


@dataclass
class History:
    """One seeded history: the engine, what it was told, and the text it produced."""

    seed: int
    rng: random.Random = field(init=False)
    engine: ShardEngine = field(default_factory=ShardEngine)
    needs: dict[str, list[Need]] = field(default_factory=dict)
    reporting: set[str] = field(default_factory=set)
    naming: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    pending: list[Action] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    plans: list[Plan] | None = None  # every plan, when a test wants to look at them
    now: float = 0.0
    ts: int = 0
    serial: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # -- steps ---------------------------------------------------------------------
    def machine_id(self) -> str:
        self.serial += 1
        return f"m-{self.serial:05d}"

    def populate(self) -> None:
        for _ in range(self.rng.randint(150, 300)):
            self.engine.upsert_machine(_random_machine(self.rng, self.machine_id()), now=self.now)
        for record in self.engine.machines():
            if record.state == MachineState.CONFIGURED and self.rng.random() < 0.04:
                self.lost.add(record.id)
        for cluster in CLUSTERS:
            if self.rng.random() < 0.5:
                self.reporting.add(cluster)
            if self.rng.random() < 0.3:
                self.naming.add(cluster)
            self.needs[cluster] = [_random_need(self.rng) for _ in range(self.rng.randint(0, 6))]
            self.send(cluster)

    def send(self, cluster: str, *, stale: bool = False) -> None:
        self.ts += 1
        stamp = self.ts - 5 if stale else self.ts
        reported = None
        if cluster in self.reporting:
            # A reporting cluster lists its configured machines, except a few it lost.
            reported = frozenset(
                r.id
                for r in self.engine.machines()
                if r.cluster == cluster and r.id not in self.lost
            )
        release = None
        if cluster in self.naming:
            # A cluster that names what it gives up offers some of its machines.
            ours = sorted(r.id for r in self.engine.machines() if r.cluster == cluster)
            release = frozenset(m for m in ours if self.rng.random() < 0.4)
        rollup = Rollup(cluster, stamp, tuple(self.needs[cluster]), reported, release)
        try:
            outcome = apply(self.engine, rollup, now=self.now)
            self.lines.append(f"rollup {cluster} {outcome.status}")
        except RollupRejected as exc:
            self.lines.append(f"rollup {cluster} rejected {exc.field}")

    def change_needs(self) -> None:
        rng = self.rng
        cluster = rng.choice(CLUSTERS)
        wanted = self.needs[cluster]
        roll = rng.random()
        if roll < 0.45 and wanted:
            i = rng.randrange(len(wanted))
            wanted[i] = _resized(rng, wanted[i])
        elif roll < 0.70 or not wanted:
            wanted.append(_random_need(rng))
        elif roll < 0.85:
            wanted.pop(rng.randrange(len(wanted)))
        self.send(cluster, stale=rng.random() < 0.05)

    def cycle(self, *, dry_run: bool) -> None:
        self.now += 1
        plan = self.engine.cycle(now=self.now, dry_run=dry_run)
        if self.plans is not None:
            self.plans.append(plan)
        self.lines.extend(describe(plan))
        if not dry_run:
            self.pending.extend(plan.actions)
            flying = sorted(self.engine.in_flight().items())
            promised = sorted(self.engine.promised().items())
            self.lines.append(f"in-flight {flying}")
            self.lines.append(f"promised {promised}")
        for action in plan.actions:
            self.kinds[type(action).__name__] += 1

    def settle_some(self) -> None:
        rng = self.rng
        if not self.pending:
            return
        count = rng.randint(1, len(self.pending))
        done, self.pending = self.pending[:count], self.pending[count:]
        for action in done:
            ids = action.machine_ids if isinstance(action, Provision) else (action.machine_id,)
            for machine_id in ids:
                record = self.engine.machine(machine_id)
                if record is None:
                    continue
                outcome: MachineRecord | None = _outcome(action, record)
                roll = rng.random()
                if roll < 0.05:
                    outcome = replace(record, state=MachineState.FAILED, last_error="boom")
                elif roll < 0.07:
                    outcome = None
                self.engine.settle(machine_id, outcome, now=self.now)

    def observe(self) -> None:
        rng = self.rng
        if rng.random() < 0.5:
            self.engine.upsert_machine(_random_machine(rng, self.machine_id()), now=self.now)
            return
        known = sorted(r.id for r in self.engine.machines())
        if known:
            machine_id = rng.choice(known)
            self.engine.upsert_machine(_random_machine(rng, machine_id), now=self.now)

    def remove(self) -> None:
        known = sorted(r.id for r in self.engine.machines())
        if known:
            self.engine.remove_machine(self.rng.choice(known))

    def claim(self) -> None:
        known = sorted(r.id for r in self.engine.machines() if r.state == MachineState.IDLE)
        if known:
            operation = self.rng.choice(("configure", "drain", "delete", "verify"))
            claimed = self.engine.claim(
                self.rng.choice(known),
                operation=operation,
                target_cluster=self.rng.choice(("", *CLUSTERS)),
                now=self.now,
            )
            self.lines.append(f"claim {operation} {claimed}")

    def run(self, steps: int = 60) -> None:
        self.populate()
        rng = self.rng
        for _ in range(steps):
            roll = rng.random()
            if roll < 0.30:
                self.change_needs()
            elif roll < 0.55:
                self.cycle(dry_run=False)
            elif roll < 0.60:
                self.cycle(dry_run=True)
            elif roll < 0.78:
                self.settle_some()
            elif roll < 0.88:
                self.observe()
            elif roll < 0.93:
                self.remove()
            elif roll < 0.95:
                self.engine.paused = not self.engine.paused
                self.lines.append(f"paused {self.engine.paused}")
            elif roll < 0.97:
                cluster = rng.choice(CLUSTERS)
                self.lines.append(f"forget {cluster} {self.engine.forget_cluster(cluster)}")
            else:
                self.claim()
            self.now += rng.choice((0, 1, 30, 400))
        self.engine.paused = False
        for _ in range(3):
            self.settle_some()
            self.cycle(dry_run=False)
        summary = self.engine.summary()
        self.lines.append(f"summary {summary}")


def _outcome(action: Action, record: MachineRecord) -> MachineRecord:
    """What a well-behaved provider reports when ``action`` finished."""
    if isinstance(action, AssignIdle | Provision):
        return replace(
            record,
            state=MachineState.CONFIGURED,
            cluster=action.cluster_id,
            host_ref=record.host_ref or f"h-{record.id}",
        )
    if isinstance(action, Preempt | Reclaim):
        return replace(record, state=MachineState.IDLE, cluster="")
    if isinstance(action, Release):
        return replace(record, state=MachineState.SPECULATIVE, cluster="", host_ref="")
    return record


def describe(plan: Plan) -> Iterator[str]:
    """Every fact of a plan as a line of text (floats to 9 significant digits)."""
    yield f"plan now={plan.now} dry={plan.dry_run} actions={len(plan.actions)}"
    for action in plan.actions:
        yield repr(action)
    for s in plan.shortfalls:
        deficit = sorted((k, f"{v:.9g}") for k, v in s.deficit.items())
        yield (
            f"shortfall {s.cluster_id} {s.need_key} {s.priority} {deficit} {s.age_cycles} "
            f"{s.escalated} {s.reason!r} {s.interruption_penalty!r}"
        )
    for (cluster, key), reason in sorted(plan.why_not.items()):
        yield f"why-not {cluster} {key} {reason!r}"


def digest(seed: int) -> tuple[str, Counter[str]]:
    """The digest of one seeded history's text, and how many actions of each kind it planned."""
    history = History(seed)
    history.run()
    text = "\n".join(history.lines).encode()
    return hashlib.sha256(text).hexdigest(), history.kinds


def main(argv: list[str]) -> int:
    """Print (or with ``--write`` record) every seed's digest."""
    found = {str(seed): digest(seed)[0] for seed in SEEDS}
    if "--write" in argv:
        DIGESTS.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(json.dumps(found, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
