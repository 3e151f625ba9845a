"""Consolidation churn: the real shard engine under rising, falling, noisy and wavy demand.

``python -m bench churn [--only SCENARIO ...] [--hours H] [--seed S] [--clusters N]``
``[--hysteresis-cycles N] [--min-age S] [--window S] [--swing-margin F]`` (engine overrides)

A fleet of clusters sends roll-ups every 10 s to one shard engine cycling
every 5 s, in virtual time (no Temporal, no PostgreSQL: the question is what
the engine decides). Every action is carried out as a well-behaved provider
would: Create takes 60 s, Configure 30 s, a drain the smaller of its grace
and 45 s, Delete 30 s; the machine is reported in its transitional state
while the operation runs and settled with its final state.

Scenarios (per cluster, around a base demand in CPU cores, memory 4 GiB a core):

* ``rising``  — from 30 % to 100 % of the base over the run, ±5 % noise per roll-up;
* ``falling`` — from 100 % to 30 %, ±5 % noise;
* ``noisy``   — the base with ±20 % noise per roll-up;
* ``wave``    — the dev stack's demo rhythm: ±50 % over a 5-minute period, ±5 % noise.

Figures, one JSON line each, tagged with the scenario:

* ``reclaims_per_cluster_hour`` — Reclaim actions per cluster per hour;
* ``flaps`` — a machine drained from a cluster and assigned back to the same
  cluster within 10 minutes of the drain decision;
* ``reclaims_undone`` — reclaims from a cluster followed within 10 minutes by
  any scale-up of that cluster (the cluster-level form of a flap);
* ``cost`` — dollars for every machine that held a host, per cluster-hour;
* ``unmet_cpu_hours`` — demand not covered by configured machines, integrated
  (what being slow to scale up, or too quick to scale down, costs the clusters).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import (
    Action,
    AssignIdle,
    CapacityType,
    MachineRecord,
    MachineState,
    Need,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Rollup,
    Verify,
)

GI = float(2**30)
CYCLE_S = 5.0
ROLLUP_S = 10.0
CREATE_S = 60.0
CONFIGURE_S = 30.0
DRAIN_S = 45.0
DELETE_S = 30.0
FLAP_WINDOW_S = 600.0
BASES = (24.0, 48.0, 64.0, 96.0, 128.0, 160.0, 200.0, 256.0)

# Shapes: (instance type, cpu, price per hour, capacity type, interruption probability).
SHAPES = (
    ("m.xlarge", 4.0, 0.20, CapacityType.ON_DEMAND, 0.0),
    ("m.2xlarge", 8.0, 0.40, CapacityType.ON_DEMAND, 0.0),
    ("m.xlarge-spot", 4.0, 0.07, CapacityType.SPOT, 0.05),
)
ZONES = ("zone-a", "zone-b")

Demand = Callable[[float, float, random.Random], float]


def _rising(t: float, span: float, rng: random.Random) -> float:
    return (0.3 + 0.7 * t / span) * (1.0 + rng.uniform(-0.05, 0.05))


def _falling(t: float, span: float, rng: random.Random) -> float:
    return (1.0 - 0.7 * t / span) * (1.0 + rng.uniform(-0.05, 0.05))


def _noisy(t: float, span: float, rng: random.Random) -> float:
    return 1.0 + rng.uniform(-0.2, 0.2)


def _wave(t: float, span: float, rng: random.Random) -> float:
    return (1.0 + 0.5 * math.sin(2 * math.pi * t / 300.0)) * (1.0 + rng.uniform(-0.05, 0.05))


SCENARIOS: dict[str, Demand] = {
    "rising": _rising,
    "falling": _falling,
    "noisy": _noisy,
    "wave": _wave,
}


@dataclass
class Tally:
    """What one scenario run counted."""

    reclaims: int = 0
    preempts: int = 0
    releases: int = 0
    scale_ups: int = 0
    flaps: int = 0
    reclaims_undone: int = 0
    cost: float = 0.0
    unmet_cpu_hours: float = 0.0
    # machine -> (cluster, time) of its last drain decision.
    drained: dict[str, tuple[str, float]] = field(default_factory=dict)
    # cluster -> times of reclaims not yet followed by a scale-up.
    open_reclaims: dict[str, list[float]] = field(default_factory=dict)


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    machine_id: str = field(compare=False)
    record: MachineRecord | None = field(compare=False)
    settle: bool = field(compare=False)


class World:
    """One engine, its machines as a provider sees them, and the clusters' demand."""

    def __init__(
        self, *, clusters: int, scenario: Demand, span: float, seed: int, config: EngineConfig
    ) -> None:
        self.engine = ShardEngine(config)
        self.rng = random.Random(seed)
        self.scenario = scenario
        self.span = span
        self.clusters = [f"c{i:02d}" for i in range(clusters)]
        self.base = {c: BASES[i % len(BASES)] for i, c in enumerate(self.clusters)}
        self.priority = {c: 100_000 * (1 + i % 8) for i, c in enumerate(self.clusters)}
        self.demand = dict.fromkeys(self.clusters, 0.0)
        self.events: list[_Event] = []
        self._seq = 0
        self.tally = Tally()
        slots = int(sum(self.base.values()) * 2 / 4 / (len(SHAPES) * len(ZONES))) + 8
        for name, cpu, price, capacity, probability in SHAPES:
            for zone in ZONES:
                for k in range(slots):
                    record = MachineRecord(
                        id=f"{name}-{zone}-{k:04d}",
                        state=MachineState.SPECULATIVE,
                        provider="sim",
                        instance_type=name,
                        zone=zone,
                        capacity_type=capacity,
                        price_per_hour=price,
                        interruption_probability=probability,
                        allocatable={"cpu": cpu, "memory": 4 * cpu * GI},
                        labels={"topology.kubernetes.io/zone": zone},
                    )
                    self.engine.upsert_machine(record, now=0.0)

    # -- demand ---------------------------------------------------------------------
    def rollup(self, cluster: str, now: float) -> None:
        cpu = max(1.0, self.base[cluster] * self.scenario(now, self.span, self.rng))
        self.demand[cluster] = cpu
        need = Need(
            requirements=(),
            aggregate={"cpu": cpu, "memory": 4 * cpu * GI},
            priority=self.priority[cluster],
            min_unit={"cpu": 1.0, "memory": 2 * GI},
            interruption_penalty=8.0,
        )
        plain = Rollup(cluster, int(now * 1e9) + 1, (need,))
        self.engine.apply_rollup(self.engine.validate(plain, now=now), now=now)

    # -- carrying actions out -----------------------------------------------------------
    def _later(self, at: float, record: MachineRecord | None, *, settle: bool) -> None:
        machine_id = record.id if record is not None else ""
        self._seq += 1
        heapq.heappush(self.events, _Event(at, self._seq, machine_id, record, settle))

    def carry(self, actions: Sequence[Action], now: float) -> None:
        for action in actions:
            if isinstance(action, Provision):
                for machine_id in action.machine_ids:
                    self._assign(machine_id, action.cluster_id, now, create=True)
            elif isinstance(action, AssignIdle):
                self._assign(action.machine_id, action.cluster_id, now, create=False)
            elif isinstance(action, Reclaim | Preempt):
                cluster = (
                    action.cluster_id if isinstance(action, Reclaim) else (action.victim_cluster_id)
                )
                self._drain(action.machine_id, cluster, action.grace_seconds, now)
                if isinstance(action, Reclaim):
                    self.tally.reclaims += 1
                    self.tally.open_reclaims.setdefault(cluster, []).append(now)
                else:
                    self.tally.preempts += 1
            elif isinstance(action, Release):
                self._release(action.machine_id, now)
            elif isinstance(action, Verify):
                self.engine.settle(
                    action.machine_id, self.engine.machine(action.machine_id), now=now
                )

    def _record(self, machine_id: str) -> MachineRecord:
        record = self.engine.machine(machine_id)
        assert record is not None, machine_id
        return record

    def _assign(self, machine_id: str, cluster: str, now: float, *, create: bool) -> None:
        tally = self.tally
        tally.scale_ups += 1
        last = tally.drained.get(machine_id)
        if last is not None and last[0] == cluster and now - last[1] < FLAP_WINDOW_S:
            tally.flaps += 1
        undone = tally.open_reclaims.pop(cluster, [])
        tally.reclaims_undone += sum(1 for t in undone if now - t < FLAP_WINDOW_S)
        record = self._record(machine_id)
        host = record.host_ref or f"host-{machine_id}"
        configure_at = now
        if create:
            self.engine.upsert_machine(
                replace(record, state=MachineState.CREATING, cluster=cluster), now=now
            )
            configure_at = now + CREATE_S
        configuring = replace(
            record, state=MachineState.CONFIGURING, cluster=cluster, host_ref=host
        )
        done = replace(configuring, state=MachineState.CONFIGURED)
        if create:
            self._later(configure_at, configuring, settle=False)
        else:
            self.engine.upsert_machine(configuring, now=now)
        self._later(configure_at + CONFIGURE_S, done, settle=True)

    def _drain(self, machine_id: str, cluster: str, grace: int, now: float) -> None:
        self.tally.drained[machine_id] = (cluster, now)
        record = self._record(machine_id)
        self.engine.upsert_machine(replace(record, state=MachineState.DRAINING), now=now)
        idle = replace(record, state=MachineState.IDLE, cluster="")
        self._later(now + min(float(grace), DRAIN_S), idle, settle=True)

    def _release(self, machine_id: str, now: float) -> None:
        self.tally.releases += 1
        record = self._record(machine_id)
        self.engine.upsert_machine(replace(record, state=MachineState.DELETING), now=now)
        gone = replace(record, state=MachineState.SPECULATIVE, cluster="", host_ref="")
        self._later(now + DELETE_S, gone, settle=True)

    def advance(self, now: float) -> None:
        """Finish every operation due by ``now``."""
        while self.events and self.events[0].at <= now:
            event = heapq.heappop(self.events)
            assert event.record is not None
            if event.settle:
                self.engine.settle(event.machine_id, event.record, now=event.at)
            else:
                self.engine.upsert_machine(event.record, now=event.at)

    # -- accounting -------------------------------------------------------------------------
    def account(self, seconds: float) -> None:
        hours = seconds / 3600.0
        configured: dict[str, float] = dict.fromkeys(self.clusters, 0.0)
        for record in self.engine.machines():
            if record.state.has_host or record.state == MachineState.CREATING:
                self.tally.cost += record.price_per_hour * hours
            if record.state == MachineState.CONFIGURED and record.cluster in configured:
                configured[record.cluster] += record.allocatable.get("cpu", 0.0)
        for cluster, want in self.demand.items():
            self.tally.unmet_cpu_hours += max(0.0, want - configured[cluster]) * hours


def run(
    name: str, *, hours: float, clusters: int, seed: int, config: EngineConfig
) -> dict[str, float]:
    """Run one scenario; returns its figures."""
    span = hours * 3600.0
    world = World(clusters=clusters, scenario=SCENARIOS[name], span=span, seed=seed, config=config)
    steps = int(span / CYCLE_S)
    per_rollup = max(1, int(ROLLUP_S / CYCLE_S))
    for step in range(steps):
        now = step * CYCLE_S
        world.advance(now)
        for i, cluster in enumerate(world.clusters):
            if (step + i) % per_rollup == 0 or step == 0:
                world.rollup(cluster, now)
        plan = world.engine.cycle(now=now)
        world.carry(plan.actions, now)
        world.account(CYCLE_S)
    t = world.tally
    cluster_hours = clusters * hours
    return {
        "reclaims_per_cluster_hour": t.reclaims / cluster_hours,
        "reclaims": float(t.reclaims),
        "flaps": float(t.flaps),
        "reclaims_undone": float(t.reclaims_undone),
        "preempts": float(t.preempts),
        "releases": float(t.releases),
        "cost": t.cost / cluster_hours,
        "unmet_cpu_hours": t.unmet_cpu_hours,
    }


UNITS = {
    "reclaims_per_cluster_hour": "1/cluster-hour",
    "cost": "$/cluster-hour",
    "unmet_cpu_hours": "core-hours",
}


def emit(scenario: str, metric: str, value: float, unit: str) -> None:
    """Print one JSON line."""
    line: dict[str, Any] = {
        "bench": "churn",
        "scenario": scenario,
        "metric": metric,
        "value": round(value, 3),
        "unit": unit,
    }
    print(json.dumps(line), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the churn scenarios (all by default); print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m bench churn", description=__doc__)
    parser.add_argument("--only", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--clusters", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--hysteresis-cycles", type=int, default=None, help="override the engine default"
    )
    parser.add_argument("--min-age", type=float, default=None, help="seconds; engine default")
    parser.add_argument("--window", type=float, default=None, help="demand window seconds")
    parser.add_argument("--swing-margin", type=float, default=None, help="engine default")
    args = parser.parse_args(argv)
    if args.hours <= 0:
        parser.error("--hours: must be positive")
    if args.clusters < 1:
        parser.error("--clusters: must be at least 1")
    overrides: dict[str, Any] = {}
    if args.hysteresis_cycles is not None:
        overrides["reclaim_hysteresis_cycles"] = args.hysteresis_cycles
    if args.min_age is not None:
        overrides["reclaim_min_age_seconds"] = args.min_age
    if args.swing_margin is not None:
        overrides["reclaim_swing_margin"] = args.swing_margin
    if args.window is not None:
        overrides["reclaim_window_seconds"] = args.window
    try:
        config = EngineConfig(**overrides)
    except ValueError as err:
        parser.error(str(err))
    for name in SCENARIOS:
        if name not in args.only:
            continue
        figures = run(name, hours=args.hours, clusters=args.clusters, seed=args.seed, config=config)
        for metric, value in figures.items():
            emit(name, metric, value, UNITS.get(metric, "count"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
