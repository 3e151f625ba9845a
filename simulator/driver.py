"""The virtual-time driver: replay one trace under each policy on a fresh fleet.

One step is one virtual second (``step_s``)::

    trace events due          ──▶ cluster models (pods arrive, leave)
    provider state changes    ──▶ policy.on_changes   (engines settle / baseline follows)
    clusters that changed     ──▶ schedule (pack pending pods onto nodes)
    policy.tick(now)          ──▶ roll-ups, cycles, coordinator | per-cluster autoscalers
    every sample_s            ──▶ metrics.Recorder.sample
    scheduler.advance(step)   ──▶ provider timers fire (latencies, deadlines, interruptions)

Each policy gets its own fleet built from the same seed, so the providers
draw the same latencies and interruption times for the same calls; the
trace is the same object. A run is deterministic in its seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from clusters.packing import DEFAULT_HEURISTIC, Heuristic
from providers.clock import ManualScheduler
from shard_engine.engine import EngineConfig
from simulator.baseline import BaselineOptions, BaselinePolicy
from simulator.bigfleet_policy import BigFleetOptions, BigFleetPolicy, CoreTap
from simulator.cluster import ClusterModel
from simulator.fleet import Fleet, FleetOptions
from simulator.metrics import Recorder
from simulator.trace import Arrive, Trace

__all__ = ["POLICIES", "PolicyResult", "RunOptions", "run_policy", "simulate"]

POLICIES: tuple[str, ...] = ("bigfleet", "bigfleet-no-gap", "baseline")
"""BigFleet with gap reclamation, BigFleet without it, per-cluster Karpenter-like."""

Progress = Callable[[float], None]


class Policy(Protocol):
    """What the driver asks of a policy."""

    name: str

    def start(self, now: float) -> None: ...
    def tick(self, now: float) -> None: ...
    def on_changes(self, changes: list[tuple[str, str]], now: float) -> None: ...
    def close(self) -> None: ...
    def worker_cpu_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything a run needs besides the trace."""

    quota_scale: float = 1.0
    seed: int = 1
    shards: int = 2
    heuristic: Heuristic = DEFAULT_HEURISTIC
    step_s: float = 1.0
    sample_s: float = 60.0
    cycle_interval_s: float = 10.0
    rollup_interval_s: float = 10.0
    #: A shard with news reports this soon after its last report (ADR 0184).
    early_report_gap_s: float = 10.0
    interruption_scale: float = 1.0
    engine: EngineConfig = field(default_factory=EngineConfig)
    baseline: BaselineOptions = field(default_factory=BaselineOptions)
    #: Worker processes for the BigFleet policy's engines (1: none); results do not depend on it.
    workers: int = 1


@dataclass(slots=True)
class PolicyResult:
    """One policy's run: the summary, the time series, and how long it took."""

    policy: str
    summary: dict[str, Any]
    series: dict[str, list[float]]
    wall_s: float


def _gpu_clusters(trace: Trace) -> frozenset[str]:
    """Clusters some of whose pods ask for GPUs (the baseline deals GPU racks to them)."""
    return frozenset(
        e.cluster for e in trace.events if isinstance(e, Arrive) and e.pod.limit[2] > 0
    )


def _policy(
    name: str,
    fleet: Fleet,
    clusters: dict[str, ClusterModel],
    o: RunOptions,
    trace: Trace,
    tap: CoreTap | None = None,
) -> Policy:
    if name == "baseline":
        return BaselinePolicy(fleet, clusters, o.baseline, gpu_clusters=_gpu_clusters(trace))
    options = BigFleetOptions(
        shards=o.shards,
        cycle_interval_s=o.cycle_interval_s,
        rollup_interval_s=o.rollup_interval_s,
        early_report_gap_s=o.early_report_gap_s,
        engine=o.engine,
        workers=o.workers,
    )
    policy = BigFleetPolicy(fleet, clusters, options, tap=tap)
    policy.name = name
    return policy


def run_policy(
    trace: Trace,
    policy_name: str,
    options: RunOptions,
    *,
    progress: Progress | None = None,
    tap: CoreTap | None = None,
) -> PolicyResult:
    """Replay ``trace`` under one policy on a fresh fleet; returns its result.

    ``tap`` sees every plan the BigFleet shards' cores are given and every
    operation they issue (ignored by the baseline).
    """
    if policy_name not in POLICIES:
        raise ValueError(f"policy: unknown {policy_name!r}; choose from {', '.join(POLICIES)}")
    started = time.perf_counter()
    cpu_started = time.process_time()
    scheduler = ManualScheduler()
    fleet = Fleet.build(
        FleetOptions(
            quota_scale=options.quota_scale,
            seed=options.seed,
            interruption_scale=options.interruption_scale,
        ),
        scheduler,
    )
    gap = policy_name == "bigfleet"
    touched: set[str] = set()
    clusters = {
        c: ClusterModel(
            c, heuristic=options.heuristic, gap=gap, notify=touched, ends_at=trace.duration
        )
        for c in trace.clusters
    }
    policy = _policy(policy_name, fleet, clusters, options, trace, tap)
    try:
        policy.start(0.0)
        fleet.drain_changes()
        setup = time.perf_counter() - started
        setup_cpu = time.process_time() - cpu_started + policy.worker_cpu_seconds()
        recorder = Recorder(sample_s=options.sample_s)
        events = trace.events
        index = 0
        now = 0.0
        next_sample = 0.0
        step = options.step_s
        while now <= trace.duration:
            while index < len(events) and events[index].t <= now:
                event = events[index]
                cluster = clusters[event.cluster]
                if isinstance(event, Arrive):
                    cluster.arrive(event.pod, now)
                else:
                    cluster.leave(event.pod, now)
                index += 1
            changes = fleet.drain_changes()
            if changes:
                policy.on_changes(changes, now)
            for cluster_id in list(touched):
                clusters[cluster_id].schedule(now)
            touched.clear()
            policy.tick(now)
            if now >= next_sample:
                next_sample += options.sample_s
                recorder.sample(
                    now,
                    cost_rate=fleet.cost_rate,
                    billed_machines=fleet.billed_machines,
                    billed_alloc=fleet.billed_alloc,
                    clusters=clusters,
                )
                if progress is not None:
                    progress(now)
            scheduler.advance(step)
            now += step
        worker_cpu = policy.worker_cpu_seconds()
        policy.close()  # answers still on their way (roll-up outcomes) land in the stats
        stats: dict[str, int] = dict(getattr(policy, "stats", {}))
        summary = recorder.summary(
            cost=fleet.cost_so_far(), clusters=clusters, stats=stats, ended_at=trace.duration
        )
        summary["cost_by_category_usd"] = fleet.cost_by_category()
    finally:
        policy.close()
        fleet.close()
    wall = time.perf_counter() - started
    summary["wall_seconds"] = round(wall, 2)
    summary["setup_seconds"] = round(setup, 2)
    # CPU time of this process and its engine workers (if any): on a shared machine wall
    # time is several times larger.
    summary["cpu_seconds"] = round(time.process_time() - cpu_started + worker_cpu, 2)
    summary["setup_cpu_seconds"] = round(setup_cpu, 2)
    summary["speedup"] = round(trace.duration / wall, 1) if wall > 0 else 0.0
    return PolicyResult(policy_name, summary, recorder.series, wall)


def simulate(
    trace: Trace,
    options: RunOptions,
    *,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[str], Progress | None] | None = None,
) -> list[PolicyResult]:
    """Run every policy on the same trace."""
    return [
        run_policy(trace, name, options, progress=progress(name) if progress else None)
        for name in policies
    ]
