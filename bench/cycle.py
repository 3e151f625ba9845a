"""Shard engine benchmarks: cycle latency at 500K machines, per-need cost, inventory size.

``python -m bench cycle [--only NAME ...] [--cycles N] [--seed S]`` prints one
JSON line per figure: ``{"bench": ..., "metric": ..., "value": ..., "unit": ...}``.

The worlds are synthetic but shaped like a shard: a catalog of instance
types x zones x capacity types (plus bare-metal racks), clusters whose needs
use varied requirements (zone, family, capacity type, architecture, gangs
in one rack, zone spreads, min units), most demand already met by configured
machines, and a pool of idle machines and speculative slots.

Each measured cycle is a real (committing) cycle in a *moving* steady
state: before it, untimed, the previous plan is carried out (every action
settles as a well-behaved provider would report it) and a slice of clusters
re-sends its roll-up, some with more demand (creating the pending needs),
some with less (creating excess for Phase 3), the rest unchanged.
"Pending" is the fraction of need rows that are short at cycle start.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import random
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import (
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
    Verify,
    WhenUnsatisfiable,
)

GI = float(2**30)
ZONE = "topology.kubernetes.io/zone"
CAPACITY = "bigfleet.io/capacity-type"
FAMILIES = ("m", "c", "r", "g")
SIZES = (("large", 2), ("xlarge", 4), ("2xlarge", 8), ("4xlarge", 16), ("8xlarge", 32))


@dataclass(frozen=True)
class Shape:
    """One machine profile of the synthetic catalog."""

    instance_type: str
    family: str
    zone: str
    capacity_type: CapacityType
    cpu: float
    memory: float
    gpu: float
    price: float
    probability: float
    labels: tuple[tuple[str, str], ...]


def catalog(types: int, zones: int, racks: int, rng: random.Random) -> list[Shape]:
    """``types`` instance types x ``zones`` zones x cloud capacity types, plus bare-metal racks."""
    shapes: list[Shape] = []
    names: list[tuple[str, str, float]] = []
    for i in range(types):
        family = FAMILIES[i % len(FAMILIES)]
        size, cores = SIZES[(i // len(FAMILIES)) % len(SIZES)]
        generation = 5 + i // (len(FAMILIES) * len(SIZES))
        names.append((f"{family}{generation}.{size}", family, float(cores)))
    zone_names = [f"zone-{chr(97 + z)}" for z in range(zones)]
    for name, family, cpu in names:
        memory = cpu * {"m": 4, "c": 2, "r": 8, "g": 8}[family] * GI
        gpu = cpu / 8 if family == "g" else 0.0
        base = cpu * 0.048 + gpu * 2.5
        # A stable hash (not ``hash``, which changes per process): the same world every run.
        arch = (
            "arm64" if name.endswith("xlarge") and zlib.crc32(name.encode()) % 3 == 0 else "amd64"
        )
        for zone in zone_names:
            for ctype, factor, prob in (
                (CapacityType.ON_DEMAND, 1.0, 0.0),
                (CapacityType.SPOT, 0.35, rng.choice((0.05, 0.1, 0.15))),
                (CapacityType.RESERVED, 0.6, 0.0),
            ):
                shapes.append(
                    Shape(
                        name,
                        family,
                        zone,
                        ctype,
                        cpu,
                        memory,
                        gpu,
                        round(base * factor, 4),
                        prob,
                        (("family", family), ("kubernetes.io/arch", arch)),
                    )
                )
    for rack in range(racks):
        zone = zone_names[rack % zones]
        shapes.append(
            Shape(
                "bm.gpu8",
                "g",
                zone,
                CapacityType.BARE_METAL,
                96.0,
                1024 * GI,
                8.0,
                0.0,
                0.0,
                (("family", "g"), ("kubernetes.io/arch", "amd64"), ("rack", f"rack-{rack:03d}")),
            )
        )
    return shapes


def record(machine_id: str, shape: Shape, state: MachineState, cluster: str = "") -> MachineRecord:
    """A machine of ``shape`` in ``state`` (bound to ``cluster`` when it has one)."""
    allocatable = {"cpu": shape.cpu, "memory": shape.memory}
    if shape.gpu:
        allocatable["nvidia.com/gpu"] = shape.gpu
    return MachineRecord(
        id=machine_id,
        state=state,
        provider="sim" if shape.capacity_type != CapacityType.BARE_METAL else "metal",
        instance_type=shape.instance_type,
        zone=shape.zone,
        capacity_type=shape.capacity_type,
        price_per_hour=shape.price,
        interruption_probability=shape.probability,
        allocatable=allocatable,
        labels=dict(shape.labels),
        cluster=cluster if state.has_host else "",
        host_ref=host_ref(machine_id) if state.has_host else "",
    )


def host_ref(machine_id: str) -> str:
    """A cloud-style instance reference: ``i-`` and 17 hex digits that look random."""
    serial = int(machine_id.rsplit("-", 1)[1])
    return f"i-{(serial * 0x9E3779B97F4A7C15 + 0x1F) % (16**17):017x}"


@dataclass
class NeedPlan:
    """A need of the world: its base demand (what the layout covers) plus churn in machines."""

    need: Need
    shape: Shape
    base_cpu: float = 0.0
    base_memory: float = 0.0
    machines: int = 0
    laid: int = 0


@dataclass
class World:
    """The synthetic shard: engine plus the needs per cluster it was built from."""

    engine: ShardEngine
    needs: dict[str, list[NeedPlan]]
    shapes: list[Shape]
    timestamp: int = 1
    now: float = 1_000.0
    serial: int = 0
    pending_actions: list[object] = field(default_factory=list)


def requirement_templates(shape: Shape, rng: random.Random) -> list[Requirement]:
    """Varied requirements that ``shape`` satisfies."""
    ctype = shape.capacity_type.name.lower().replace("_", "-")
    choice = rng.random()
    if shape.capacity_type == CapacityType.BARE_METAL:
        return [Requirement("rack", Operator.SAME), Requirement("family", Operator.IN, ("g",))]
    if choice < 0.30:
        return [
            Requirement(ZONE, Operator.IN, (shape.zone,)),
            Requirement("family", Operator.IN, (shape.family,)),
        ]
    if choice < 0.50:
        return [
            Requirement(CAPACITY, Operator.IN, (ctype,)),
            Requirement("family", Operator.IN, (shape.family,)),
        ]
    if choice < 0.65:
        return [
            Requirement("node.kubernetes.io/instance-type", Operator.IN, (shape.instance_type,)),
            Requirement(ZONE, Operator.IN, (shape.zone,)),
        ]
    if choice < 0.80:
        return [
            Requirement(
                "kubernetes.io/arch", Operator.IN, (dict(shape.labels)["kubernetes.io/arch"],)
            ),
            Requirement(ZONE, Operator.NOT_IN, ("zone-z",)),
            Requirement(ZONE, Operator.IN, (shape.zone,)),
        ]
    return [
        Requirement("family", Operator.IN, (shape.family,)),
        Requirement(ZONE, Operator.IN, (shape.zone,)),
        Requirement(CAPACITY, Operator.IN, (ctype,)),
    ]


def build(
    *,
    machines: int,
    clusters: int,
    needs_per_cluster: int,
    types: int,
    zones: int,
    racks: int,
    seed: int,
    config: EngineConfig | None = None,
) -> World:
    """Lay out a shard: ~70 % configured for needs, ~5 % idle, the rest speculative."""
    rng = random.Random(seed)
    shapes = catalog(types, zones, racks, rng)
    cloud = [s for s in shapes if s.capacity_type != CapacityType.BARE_METAL]
    metal = [s for s in shapes if s.capacity_type == CapacityType.BARE_METAL]
    engine = ShardEngine(config)
    world = World(engine=engine, needs={}, shapes=shapes)
    configured_total = int(machines * 0.70)
    total_needs = clusters * needs_per_cluster
    per_need = max(1, configured_total // total_needs)
    serial = 0
    for c in range(clusters):
        cluster = f"cluster-{c:03d}"
        plans: list[NeedPlan] = []
        for n in range(needs_per_cluster):
            use_metal = metal and rng.random() < 0.03
            shape = rng.choice(metal if use_metal else cloud)
            requirements = requirement_templates(shape, rng)
            count = max(1, int(rng.expovariate(1.0 / per_need)))
            if use_metal:
                count = min(count, 8)
            spread: tuple[TopologySpread, ...] = ()
            if not use_metal and rng.random() < 0.05:
                requirements = [r for r in requirements if r.key != ZONE]
                spread = (TopologySpread(ZONE, 2, WhenUnsatisfiable.SCHEDULE_ANYWAY),)
            unit = {"cpu": shape.cpu} if rng.random() < 0.1 else {}
            wanted = Need(
                requirements=tuple(requirements),
                aggregate={},
                priority=rng.choice((0, 100, 1000, 10_000, 100_000, 500_000, 1_000_000)) + n,
                min_unit=unit,
                spread=spread,
                interruption_penalty=rng.choice((0.0, 0.5, 5.0, 50.0)),
                reclamation_penalty=rng.choice((0.0, 0.0, 8.0, 8192.0)),
            )
            plan = NeedPlan(wanted, shape, laid=count)
            plans.append(plan)
            # A machine counts for one need of its cluster (ADR 0128): each need's
            # base demand is what was laid out for it, and its machines are bound
            # to it as a shard's are after a restart (the provider's attribution).
            plan.base_cpu = count * shape.cpu * 0.95
            plan.base_memory = count * shape.memory * 0.5
            plan.need = replace(plan.need, aggregate=_aggregate(plan))
            for _ in range(count):
                engine.upsert_machine(
                    record(f"sim-{serial:09d}", shape, MachineState.CONFIGURED, cluster),
                    now=world.now,
                    need_key=plan.need.key,
                )
                serial += 1
        world.needs[cluster] = plans
    while serial < machines:
        shape = rng.choice(shapes if rng.random() < 0.17 else cloud)
        state = MachineState.IDLE if rng.random() < 0.17 else MachineState.SPECULATIVE
        if shape.capacity_type == CapacityType.BARE_METAL:
            state = MachineState.IDLE
        engine.upsert_machine(record(f"sim-{serial:09d}", shape, state), now=world.now)
        serial += 1
    world.serial = serial
    for cluster, plans in world.needs.items():
        engine.apply_rollup(
            engine.validate(rollup(world, cluster, plans), now=world.now), now=world.now
        )
    # Let the world settle once: whatever the layout left short is served now.
    for _ in range(3):
        carry(world, engine.cycle(now=world.now))
        world.now += 1
    return world


def rollup(world: World, cluster: str, plans: list[NeedPlan]) -> Rollup:
    """A roll-up of a cluster's current needs, newer than the last."""
    world.timestamp += 1
    return Rollup(cluster, world.timestamp, tuple(p.need for p in plans))


def outcome(engine: ShardEngine, action: object, machine_id: str) -> MachineRecord | None:
    """What a well-behaved provider reports when ``action`` finishes."""
    current = engine.machine(machine_id)
    if current is None:
        return None
    if isinstance(action, AssignIdle | Provision):
        host = current.host_ref or host_ref(machine_id)
        return replace(
            current, state=MachineState.CONFIGURED, cluster=action.cluster_id, host_ref=host
        )
    if isinstance(action, Preempt | Reclaim):
        return replace(current, state=MachineState.IDLE, cluster="")
    if isinstance(action, Release):
        return replace(current, state=MachineState.SPECULATIVE, host_ref="")
    if isinstance(action, Verify):
        return current
    return current


def carry(world: World, plan: Plan) -> None:
    """Settle every action of ``plan`` as finished."""
    engine = world.engine
    for action in plan.actions:
        ids = action.machine_ids if isinstance(action, Provision) else (action.machine_id,)
        for machine_id in ids:
            engine.settle(machine_id, outcome(engine, action, machine_id), now=world.now)


def churn(world: World, rng: random.Random, *, pending: float, excess: float, grow: int) -> None:
    """One cycle's worth of roll-ups: a slice of clusters re-sends its needs.

    Roll-ups arrive every ten seconds per cluster and the cycle runs every
    second, so about a tenth of the clusters report before each cycle
    (more in a burst, so that the grown needs fit). Within them, needs
    amounting to ``pending`` of all need rows grow by up to ``grow``
    machines and ``excess`` of them shrink by as much, so demand neither
    runs away nor dries up over a long run; the rest are re-sent unchanged.
    """
    engine = world.engine
    names = sorted(world.needs)
    total = sum(len(p) for p in world.needs.values())
    growing = max(1, int(total * pending))
    shrinking = max(1, int(total * excess))
    per_cluster = max(1, total // len(names))
    count = min(len(names), max(len(names) // 10, math.ceil((growing + shrinking) / per_cluster)))
    start = world.serial % len(names)
    world.serial += count
    chosen = [names[(start + i) % len(names)] for i in range(count)]
    rows = [(c, i) for c in chosen for i in range(len(world.needs[c]))]
    rng.shuffle(rows)
    for n, (cluster, index) in enumerate(rows[: growing + shrinking]):
        plan = world.needs[cluster][index]
        if n < growing:
            plan.machines += rng.randint(1, grow)
        else:
            plan.machines -= rng.randint(1, grow)
        plan.need = replace(plan.need, aggregate=_aggregate(plan))
    for cluster in chosen:
        payload = rollup(world, cluster, world.needs[cluster])
        engine.apply_rollup(engine.validate(payload, now=world.now), now=world.now)


def _aggregate(plan: NeedPlan) -> dict[str, float]:
    return {
        "cpu": max(0.0, plan.base_cpu + plan.machines * plan.shape.cpu),
        "memory": max(0.0, plan.base_memory + plan.machines * plan.shape.memory * 0.5),
    }


def world_500k(*, seed: int, config: EngineConfig | None) -> World:
    """The 500K-machine shard of ``cycle_steady_500k`` and ``cycle_burst_500k``.

    ``bench adoption`` runs its burst on the same world, so its figures
    compare with these.
    """
    return build(
        machines=500_000,
        clusters=100,
        needs_per_cluster=15,
        types=40,
        zones=6,
        racks=40,
        seed=seed,
        config=config,
    )


def advance(
    world: World,
    rng: random.Random,
    plan: Plan | None,
    *,
    pending: float,
    excess: float,
    grow: int,
) -> None:
    """The second between two cycles: the last plan carried out, demand moved, the clock on."""
    if plan is not None:
        carry(world, plan)
    churn(world, rng, pending=pending, excess=excess, grow=grow)
    world.now += 1


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def emit(bench: str, metric: str, value: float, unit: str) -> None:
    """Print one JSON line."""
    print(
        json.dumps({"bench": bench, "metric": metric, "value": round(value, 3), "unit": unit}),
        flush=True,
    )


@dataclass
class Samples:
    """Per-cycle measurements."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    # Seconds per action to build ``plan.actions`` from the plan's table (outside the cycle).
    values: list[float] = field(default_factory=list)


def run_cycles(
    world: World, *, cycles: int, warmup: int, pending: float, excess: float, grow: int, seed: int
) -> Samples:
    """Measured cycles in a moving steady state (after ``warmup`` unmeasured ones).

    Wall time is what the shard waits; CPU time (this process only) is
    reported beside it because the benchmark machine is shared and wall
    time then includes other processes' turns on the two cores.
    """
    rng = random.Random(seed)
    engine = world.engine
    samples = Samples()
    plan: Plan | None = None
    gc.collect()
    for n in range(warmup + cycles):
        advance(world, rng, plan, pending=pending, excess=excess, grow=grow)
        gc.disable()
        cpu = time.process_time()
        start = time.perf_counter()
        plan = engine.cycle(now=world.now)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        built = time.perf_counter()
        count = len(plan.actions)  # what a consumer of the values pays, once per plan
        built = time.perf_counter() - built
        gc.enable()
        if n >= warmup:
            samples.wall.append(elapsed)
            samples.cpu.append(cpu)
            samples.actions.append(count)
            if count:
                samples.values.append(built / count)
    return samples


RECLAIM_AT_ONCE = EngineConfig(
    reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0.0, reclaim_window_seconds=0.0
)
"""Reclaim on the first sight of excess (ADR 0090's settings for self-scaling clusters).

The benchmark's churn shrinks as many needs as it grows, a cycle a second
for a few minutes. Under the default persistence rules (a 600 s window,
three cycles, 600 s minimum age) almost none of that excess is reclaimed
within a run, so the worlds would carry a few dozen actions a cycle instead
of the volumes the goals are stated for; the action-volume benchmarks
reclaim at once, and ``cycle_steady_500k_default_reclaim`` measures the
defaults."""


def bench_cycle(
    name: str,
    *,
    pending: float,
    grow: int,
    cycles: int,
    seed: int,
    config: EngineConfig | None = RECLAIM_AT_ONCE,
) -> None:
    """cycle_steady_500k / cycle_burst_500k / cycle_steady_500k_default_reclaim."""
    start = time.perf_counter()
    world = world_500k(seed=seed, config=config)
    emit(name, "build_s", time.perf_counter() - start, "s")
    samples = run_cycles(
        world,
        cycles=cycles,
        warmup=WARMUP,
        pending=pending,
        excess=pending,
        grow=grow,
        seed=seed + 1,
    )
    summary = world.engine.summary()
    emit(name, "machines", summary.machines, "count")
    emit(name, "needs", summary.needs, "count")
    emit(name, "profiles", summary.profiles, "count")
    emit(name, "actions_per_cycle_mean", sum(samples.actions) / len(samples.actions), "count")
    emit(name, "cycle_p50_ms", percentile(samples.wall, 50) * 1e3, "ms")
    emit(name, "cycle_p99_ms", percentile(samples.wall, 99) * 1e3, "ms")
    emit(name, "cycle_max_ms", max(samples.wall) * 1e3, "ms")
    emit(name, "cycle_cpu_p50_ms", percentile(samples.cpu, 50) * 1e3, "ms")
    emit(name, "cycle_cpu_p99_ms", percentile(samples.cpu, 99) * 1e3, "ms")
    emit(name, "plan_values_per_action_us", percentile(samples.values, 50) * 1e6, "us")


def bench_realistic(*, cycles: int, seed: int) -> None:
    """cycle_realistic_8k_needs: ~8,000 needs over hundreds of types x zones x capacity types."""
    name = "cycle_realistic_8k_needs"
    start = time.perf_counter()
    world = build(
        machines=200_000,
        clusters=400,
        needs_per_cluster=20,
        types=300,
        zones=6,
        racks=60,
        seed=seed,
        config=RECLAIM_AT_ONCE,
    )
    emit(name, "build_s", time.perf_counter() - start, "s")
    needs = world.engine.summary().needs
    samples = run_cycles(
        world, cycles=cycles, warmup=WARMUP, pending=0.02, excess=0.02, grow=8, seed=seed + 1
    )
    per_need = [t / needs * 1e6 for t in samples.wall]
    per_need_cpu = [t / needs * 1e6 for t in samples.cpu]
    emit(name, "machines", world.engine.summary().machines, "count")
    emit(name, "needs", needs, "count")
    emit(name, "profiles", world.engine.summary().profiles, "count")
    emit(name, "actions_per_cycle_mean", sum(samples.actions) / len(samples.actions), "count")
    emit(name, "cycle_p99_ms", percentile(samples.wall, 99) * 1e3, "ms")
    emit(name, "per_need_p50_us", percentile(per_need, 50), "us")
    emit(name, "per_need_p99_us", percentile(per_need, 99), "us")
    emit(name, "per_need_cpu_p99_us", percentile(per_need_cpu, 99), "us")
    emit(name, "plan_values_per_action_us", percentile(samples.values, 50) * 1e6, "us")


def bench_rollup(*, rollups: int, seed: int) -> None:
    """rollup_apply_20_needs: ``apply_rollup`` of one cluster's 20 needs on the realistic catalog.

    Three kinds of roll-up, each timed on its own: *changed* (three of the
    20 needs grow or shrink by a machine — the usual edit), *unchanged*
    (the same needs re-sent with a newer timestamp, every ten seconds per
    cluster) and *reshaped* (one need's requirements replaced by another
    cluster's, so the masks are compiled afresh).
    """
    name = "rollup_apply_20_needs"
    world = build(
        machines=200_000,
        clusters=400,
        needs_per_cluster=20,
        types=300,
        zones=6,
        racks=60,
        seed=seed,
    )
    engine = world.engine
    rng = random.Random(seed + 2)
    names = sorted(world.needs)
    kinds = ("changed", "unchanged", "reshaped")
    timings: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}

    def timed(kind: str, cluster: str) -> None:
        payload = rollup(world, cluster, world.needs[cluster])
        gc.disable()
        used = time.process_time()
        start = time.perf_counter()
        # Validation and application together: the work a roll-up costs the engine.
        engine.apply_rollup(engine.validate(payload, now=world.now), now=world.now)
        timings[kind].append(time.perf_counter() - start)
        cpu[kind].append(time.process_time() - used)
        gc.enable()

    for n in range(rollups):
        cluster = names[n % len(names)]
        plans = world.needs[cluster]
        for plan in rng.sample(plans, 3):
            plan.machines += rng.choice((-1, 1))
            plan.need = replace(plan.need, aggregate=_aggregate(plan))
        timed("changed", cluster)
        timed("unchanged", cluster)
        if n % 5 == 0:
            donor = world.needs[names[(n * 7 + 3) % len(names)]]
            plan = rng.choice(plans)
            plan.need = replace(plan.need, requirements=rng.choice(donor).need.requirements)
            timed("reshaped", cluster)
    for kind in kinds:
        emit(name, f"{kind}_p50_us", percentile(timings[kind], 50) * 1e6, "us")
        emit(name, f"{kind}_p99_us", percentile(timings[kind], 99) * 1e6, "us")
        emit(name, f"{kind}_cpu_p50_us", percentile(cpu[kind], 50) * 1e6, "us")
        emit(name, f"{kind}_cpu_p99_us", percentile(cpu[kind], 99) * 1e6, "us")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def stream(count: int, seed: int) -> Iterator[MachineRecord]:
    """``count`` machines of a realistic mix, generated one at a time."""
    rng = random.Random(seed)
    shapes = catalog(40, 6, 40, rng)
    clusters = [f"cluster-{c:03d}" for c in range(100)]
    for serial in range(count):
        roll = rng.random()
        if roll < 0.65:
            # A cluster runs on a dozen shapes, not on the whole catalog.
            cluster = serial % len(clusters)
            shape = shapes[(cluster * 37 + rng.randrange(12)) % len(shapes)]
            yield record(f"sim-{serial:09d}", shape, MachineState.CONFIGURED, clusters[cluster])
            continue
        shape = shapes[serial % len(shapes)]
        if roll < 0.75:
            yield record(f"sim-{serial:09d}", shape, MachineState.IDLE)
        else:
            yield record(f"sim-{serial:09d}", shape, MachineState.SPECULATIVE)


def _load(count: int, seed: int, *, reserve: bool) -> tuple[float, float, int]:
    """Load ``count`` machines into a fresh engine; (bytes per machine, seconds, machines)."""
    gc.collect()
    before = _rss_bytes()
    engine = ShardEngine(EngineConfig(expected_machines=count if reserve else 0))
    start = time.perf_counter()
    for item in stream(count, seed):
        engine.upsert_machine(item, now=0.0)
    elapsed = time.perf_counter() - start
    gc.collect()
    after = _rss_bytes()
    machines = engine.summary().machines
    del engine
    gc.collect()
    return (after - before) / count, elapsed, machines


def bench_inventory(*, seed: int) -> None:
    """inventory_1m: RSS growth per machine after loading 1M machines.

    The headline figure reserves room for the machines up front, as the
    shard process can once it knows its inventory; growing from empty is
    reported beside it (outgrown columns stay with the allocator). Each is
    measured in a fresh process so neither inherits the other's heap.
    """
    count = 1_000_000
    context = multiprocessing.get_context("spawn")
    with context.Pool(1, maxtasksperchild=1) as pool:
        reserved, elapsed, machines = pool.apply(_load, (count, seed), {"reserve": True})
    with context.Pool(1, maxtasksperchild=1) as pool:
        grown, _, _ = pool.apply(_load, (count, seed), {"reserve": False})
    emit("inventory_1m", "machines", machines, "count")
    emit("inventory_1m", "load_s", elapsed, "s")
    emit("inventory_1m", "bytes_per_machine", reserved, "B")
    emit("inventory_1m", "bytes_per_machine_grown_from_empty", grown, "B")


WARMUP = 20
"""Unmeasured cycles first: the layout's own leftovers settle before measuring."""

BENCHES = (
    "inventory_1m",
    "cycle_steady_500k",
    "cycle_burst_500k",
    "cycle_realistic_8k_needs",
    "cycle_steady_500k_default_reclaim",
    "rollup_apply_20_needs",
)


def main(argv: list[str] | None = None) -> int:
    """Run the shard engine benchmarks (all by default); print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m bench cycle", description=__doc__)
    parser.add_argument("--only", nargs="*", choices=BENCHES, default=list(BENCHES))
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    for name in BENCHES:
        if name not in args.only:
            continue
        if name == "inventory_1m":
            bench_inventory(seed=args.seed)
        elif name == "cycle_steady_500k":
            bench_cycle(name, pending=0.02, grow=8, cycles=args.cycles, seed=args.seed)
        elif name == "cycle_burst_500k":
            bench_cycle(name, pending=0.18, grow=40, cycles=args.cycles, seed=args.seed)
        elif name == "cycle_realistic_8k_needs":
            bench_realistic(cycles=min(args.cycles, 100), seed=args.seed)
        elif name == "cycle_steady_500k_default_reclaim":
            bench_cycle(name, pending=0.02, grow=8, cycles=args.cycles, seed=args.seed, config=None)
        else:
            bench_rollup(rollups=1_000, seed=args.seed)
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
