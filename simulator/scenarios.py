"""Built-in demand scenarios: seeded generators of traces.

* `diurnal-web`: latency-sensitive services whose replicas follow a day's
  sine, limits twice the reservation (a gap to reclaim), best-effort
  compaction jobs beside them;
* `bursty-batch`: batch jobs in Poisson bursts, CPU-heavy and memory-heavy
  shapes mixed (packing matters);
* `gpu-gangs`: training jobs of 2–4 pods × 8 GPUs that must share one rack
  (`Same` on `topology.kubernetes.io/rack`);
* `spot-tolerant`: cheap-to-interrupt batch ($0.50 penalty) for spot;
* `priority-tiers`: production, batch and best-effort tiers competing for a
  fleet sized below peak (preemption);
* `mixed`: every cluster runs one of the above in turn (the headline).

Every generator is deterministic in ``seed``. ``clusters`` and ``scale``
(pods per cluster, relative) size the demand; :func:`build` returns the
trace and the fleet scale that fits it (``quota_scale`` of the shipped
catalogs), so one scenario name gives a complete, reproducible run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from clusters.pods import PodSpec
from shard_engine.model import AppClass, Operator, Requirement, TopologySpread
from simulator.trace import Arrive, Event, Leave, Trace

__all__ = ["SCENARIOS", "TIER_NAMES", "Scenario", "build"]

GI = float(2**30)

#: What a scenario's priorities are called, for the tables that compare seeds.
TIER_NAMES: dict[str, dict[int, str]] = {
    "mixed": {
        1_000_000: "production",
        900_000: "GPU gangs",
        500_000: "web",
        100_000: "batch",
        50_000: "spot-tolerant",
        0: "best-effort",
    },
    "priority-tiers": {1_000_000: "production", 100_000: "batch", 0: "scavenger"},
}
ZONE = "topology.kubernetes.io/zone"
RACK = "topology.kubernetes.io/rack"
AMD64 = Requirement("kubernetes.io/arch", Operator.IN, ("amd64",))
# GPU servers are tainted for GPU work, as Kubernetes clusters keep them: pods that do not
# tolerate the taint cannot run there, so their roll-ups exclude GPU machines.
NO_GPU = Requirement("nvidia.com/gpu.count", Operator.DOES_NOT_EXIST)

# Cores and GPUs of the shipped catalogs at quota_scale 1 (sim cloud + bare metal).
FLEET_CORES_AT_SCALE_1 = 31_000.0
# Racks of GPU servers hold 4 at scale 1: gangs of up to 4 need at least that.
_MIN_SCALE = 0.5
_MIN_SCALE_GANGS = 1.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """A trace and the fleet to replay it on."""

    name: str
    trace: Trace
    quota_scale: float


@dataclass(slots=True)
class _Builder:
    rng: random.Random
    events: list[Event]
    counter: int = 0

    def pod_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter:06d}"

    def run(self, cluster: str, start: float, end: float, pod: PodSpec) -> None:
        self.events.append(Arrive(start, cluster, pod))
        self.events.append(Leave(end, cluster, pod.name))


def _diurnal_web(b: _Builder, cluster: str, duration: float, scale: float) -> float:
    """Services whose replica counts follow a daily sine; returns peak cores."""
    period = 86_400.0
    phase = b.rng.uniform(0, period)
    peak = 0.0
    for service in range(3):
        cpu = b.rng.choice((0.5, 1.0, 2.0))
        mem = cpu * b.rng.choice((2, 4)) * GI
        base = max(2, round(12 * scale * b.rng.uniform(0.6, 1.4)))
        spread = (TopologySpread(ZONE, 1),) if service == 0 else ()
        live: list[str] = []
        step = 300.0
        t = 0.0
        while t < duration:
            wave = 0.5 + 0.5 * math.sin(2 * math.pi * (t + phase) / period)
            want = max(1, round(base * (0.4 + 0.6 * wave)))
            while len(live) < want:
                pod = PodSpec.build(
                    b.pod_name(f"svc{service}"),
                    {"cpu": cpu, "memory": mem},
                    reservation={"cpu": cpu / 2, "memory": mem / 2},
                    app_class=AppClass.LATENCY_SENSITIVE,
                    priority=500_000,
                    requirements=(AMD64, NO_GPU),
                    spread=spread,
                    interruption_penalty=64.0,
                    reclamation_penalty=16.0,
                )
                b.events.append(Arrive(t, cluster, pod))
                live.append(pod.name)
            while len(live) > want:
                b.events.append(Leave(t, cluster, live.pop()))
            t += step
        peak += base * cpu
    # Best-effort compaction jobs that live in the services' gap.
    t = b.rng.uniform(0, 1800)
    while t < duration:
        pod = PodSpec.build(
            b.pod_name("compact"),
            {"cpu": 0.5, "memory": 1 * GI},
            app_class=AppClass.BEST_EFFORT,
            priority=0,
            requirements=(NO_GPU,),
        )
        b.run(cluster, t, min(duration, t + b.rng.uniform(600, 3600)), pod)
        t += b.rng.expovariate(1 / (900 / max(scale, 0.1)))
    return peak


def _bursty_batch(b: _Builder, cluster: str, duration: float, scale: float) -> float:
    """Jobs in bursts, CPU-heavy and memory-heavy pods mixed; returns a peak estimate."""
    t = b.rng.uniform(0, 600)
    peak = 0.0
    while t < duration:
        pods = max(2, round(b.rng.randint(4, 24) * scale))
        runtime = b.rng.uniform(600, 3600)
        for _ in range(pods):
            z = b.rng.gauss(0, 0.5)
            cpu = round(2.0 * math.exp(z), 2)
            mem = round(8.0 * math.exp(-z), 2) * GI
            pod = PodSpec.build(
                b.pod_name("job"),
                {"cpu": cpu, "memory": mem},
                priority=100_000,
                requirements=(AMD64, NO_GPU),
                interruption_penalty=4.0,
                reclamation_penalty=2.0,
            )
            b.run(cluster, t, min(duration, t + runtime * b.rng.uniform(0.8, 1.2)), pod)
            peak = max(peak, pods * 2.0)
        t += b.rng.expovariate(1 / 1800)
    return peak


def _gpu_gangs(b: _Builder, cluster: str, duration: float, scale: float) -> float:
    """Training gangs of 8-GPU pods in one rack; returns peak GPUs (as 'cores' × 28)."""
    t = b.rng.uniform(0, 900)
    gpus = 0.0
    while t < duration:
        size = b.rng.choice((2, 2, 3, 4))
        gang = b.pod_name("train")
        runtime = b.rng.uniform(3600, 4 * 3600)
        for member in range(size):
            pod = PodSpec.build(
                f"{gang}-{member}",
                {"cpu": 88.0, "memory": 900 * GI, "nvidia.com/gpu": 8.0},
                priority=900_000,
                interruption_penalty=4096.0,
                reclamation_penalty=4096.0,
                colocation=gang,
                colocation_key=RACK,
            )
            b.run(cluster, t, min(duration, t + runtime), pod)
        gpus = max(gpus, size * 8.0)
        t += b.rng.expovariate(scale / 7200)
    return gpus * 28


def _spot_tolerant(b: _Builder, cluster: str, duration: float, scale: float) -> float:
    """Checkpointing batch that spot should serve; returns a peak estimate."""
    t = 0.0
    peak = 0.0
    while t < duration:
        pods = max(1, round(b.rng.randint(8, 32) * scale))
        runtime = b.rng.uniform(1800, 7200)
        for _ in range(pods):
            pod = PodSpec.build(
                b.pod_name("spotjob"),
                {"cpu": 4.0, "memory": 14 * GI},
                priority=50_000,
                requirements=(NO_GPU,),
                interruption_penalty=0.5,
                reclamation_penalty=0.5,
            )
            b.run(cluster, t, min(duration, t + runtime), pod)
        peak = max(peak, pods * 4.0)
        t += b.rng.expovariate(1 / 2400)
    return peak


def _priority_tiers(b: _Builder, cluster: str, duration: float, scale: float) -> float:
    """Three tiers; production arrives in waves that need what batch holds."""
    peak = 0.0
    tiers = (
        ("prod", 1_000_000, AppClass.LATENCY_SENSITIVE, 1024.0),
        ("batch", 100_000, AppClass.BATCH, 8.0),
        ("scavenger", 0, AppClass.BEST_EFFORT, 0.0),
    )
    for name, priority, app_class, penalty in tiers:
        t = b.rng.uniform(0, 1200)
        while t < duration:
            pods = max(1, round(b.rng.randint(4, 16) * scale))
            runtime = b.rng.uniform(1200, 5400)
            for _ in range(pods):
                pod = PodSpec.build(
                    b.pod_name(name),
                    {"cpu": 4.0, "memory": 16 * GI},
                    app_class=app_class,
                    priority=priority,
                    requirements=(AMD64, NO_GPU),
                    interruption_penalty=penalty,
                    reclamation_penalty=penalty,
                )
                b.run(cluster, t, min(duration, t + runtime), pod)
            peak += pods * 4.0 / 3
            t += b.rng.expovariate(1 / 3600)
    return peak


_GENERATORS: dict[str, Callable[[_Builder, str, float, float], float]] = {
    "diurnal-web": _diurnal_web,
    "bursty-batch": _bursty_batch,
    "gpu-gangs": _gpu_gangs,
    "spot-tolerant": _spot_tolerant,
    "priority-tiers": _priority_tiers,
}
SCENARIOS: tuple[str, ...] = (*_GENERATORS, "mixed")
"""Names of the built-in scenarios."""

# How much fleet per unit of peak demand; priority-tiers is sized below peak on purpose.
_HEADROOM = {"priority-tiers": 0.8}


def build(
    name: str,
    *,
    clusters: int = 12,
    duration: float = 86_400.0,
    seed: int = 1,
    scale: float = 1.0,
    quota_scale: float | None = None,
) -> Scenario:
    """Generate scenario ``name`` (deterministic in ``seed``) and size its fleet.

    ``quota_scale`` overrides the fleet size (a multiple of the shipped
    catalogs' quotas); by default it is set so the fleet holds about twice
    the estimated peak demand (0.8× for ``priority-tiers``), and never
    below half the shipped catalogs (a whole one when gangs need racks).
    """
    if name not in SCENARIOS:
        raise ValueError(f"scenario: unknown {name!r}; choose from {', '.join(SCENARIOS)}")
    if clusters < 1:
        raise ValueError("clusters: must be at least 1")
    if not duration > 0:
        raise ValueError("duration: must be positive")
    rng = random.Random(seed)
    builder = _Builder(rng, [])
    peak = 0.0
    kinds = list(_GENERATORS)
    for index in range(clusters):
        kind = kinds[index % len(kinds)] if name == "mixed" else name
        cluster = f"{kind}-{index:04d}"
        peak += _GENERATORS[kind](builder, cluster, duration, scale)
    events = sorted(builder.events, key=lambda e: (e.t, isinstance(e, Arrive)))
    if quota_scale is None:
        headroom = _HEADROOM.get(name, 2.0)
        floor = _MIN_SCALE_GANGS if name in ("gpu-gangs", "mixed") else _MIN_SCALE
        quota_scale = max(floor, round(peak * headroom / FLEET_CORES_AT_SCALE_1, 3))
    trace = Trace(
        events=tuple(events),
        duration=duration,
        description=f"scenario {name}: {clusters} clusters, seed {seed}, scale {scale}",
    )
    return Scenario(name=name, trace=trace, quota_scale=quota_scale)
