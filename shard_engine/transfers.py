"""A donor shard's decisions for the coordinator's cross-shard instructions.

The coordinator decides *how many* machines of which profile move between
shards (``coordination.plan_transfers``); the donor decides *which*. Both
choices are pure: they take the donor's machines and what it knows about
them as values, and return the chosen machines. The shard process carries
the choice out (takes the machines out of its engine, moves them in
PostgreSQL, starts the drains).

Donations (idle or speculative capacity)
    1. Feasibility: unbound machines of the instruction's profile in the wanted
       state, none in flight or promised.
    2. Order: by machine id, so the same inventory gives the same answer
       after a restart.
    3. Take: the first ``count``.

Cross-shard victims (a preemption for another shard's need)
    1. Feasibility: configured machines of the instruction's profile, none in
       flight or promised, serving a priority strictly below the preemptor's
       (never at equal priority, as for a local preemption).
    2. Score: the local preemption's victim score (``preemption.victim_scores``,
       ADR 0004): priority gap, drain speed and both penalties, each bounded in
       [0, 1], weighted between the normal and the saturated weights by this
       shard's saturation.
    3. Order: by score, with app class deciding among equal priorities
       (``preemption.victim_order``: best-effort, then batch, then
       latency-sensitive).
    4. Take: the first ``count``; each victim's drain grace follows its
       priority gap (``costs.drain_grace_seconds``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shard_engine.config import EngineConfig
from shard_engine.coordination import DOMAIN_LABEL
from shard_engine.costs import drain_grace_seconds
from shard_engine.model import AppClass, MachineRecord, MachineState
from shard_engine.preemption import blend_weights, victim_order, victim_scores
from shard_engine.resources import APP_CLASS_VICTIM_RANK

__all__ = [
    "CrossShardVictim",
    "TransferProfile",
    "VictimTerms",
    "choose_cross_shard_victims",
    "choose_donations",
    "saturation_of",
]


@dataclass(frozen=True, slots=True)
class TransferProfile:
    """The machines an instruction is about: one (provider, instance type, zone, capacity),
    and one rack when ``domain`` is set (its ``topology.kubernetes.io/rack`` label)."""

    provider: str
    instance_type: str
    zone: str
    capacity_type: int
    domain: str = ""

    def matches(self, record: MachineRecord) -> bool:
        return (
            record.provider == self.provider
            and record.instance_type == self.instance_type
            and record.zone == self.zone
            and int(record.capacity_type) == self.capacity_type
            and (not self.domain or record.labels.get(DOMAIN_LABEL) == self.domain)
        )


@dataclass(frozen=True, slots=True)
class VictimTerms:
    """What the need a configured machine serves is worth to its cluster (ADR 0004)."""

    interruption_penalty: float = 0.0
    reclamation_penalty: float = 0.0
    app_class: AppClass = AppClass.BATCH


@dataclass(frozen=True, slots=True)
class CrossShardVictim:
    """One machine to drain for another shard's need, and the grace it gets."""

    machine_id: str
    cluster_id: str
    priority: int
    grace_seconds: int


def choose_donations(
    machines: Iterable[MachineRecord],
    *,
    profile: TransferProfile,
    state: MachineState,
    count: int,
    busy: Collection[str],
) -> tuple[MachineRecord, ...]:
    """Up to ``count`` unbound machines of ``profile`` in ``state`` to give away.

    Machines in ``busy`` (in flight or promised to a preemptor) never move.
    """
    if count <= 0:
        return ()
    feasible = [
        r
        for r in machines
        if r.state == state and not r.cluster and r.id not in busy and profile.matches(r)
    ]
    feasible.sort(key=lambda r: r.id)
    return tuple(feasible[:count])


def saturation_of(machines: Iterable[MachineRecord], *, busy: Collection[str]) -> float:
    """How full the shard is: 1 − free / machines, in [0, 1] (as Phase 2 measures it).

    Free machines are unbound idle and speculative ones not in flight;
    failed machines are not counted at all.
    """
    total = free = 0
    for r in machines:
        if r.state == MachineState.FAILED:
            continue
        total += 1
        if r.id in busy or r.cluster:
            continue
        if r.state in (MachineState.IDLE, MachineState.SPECULATIVE):
            free += 1
    if total == 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - free / total))


def choose_cross_shard_victims(
    machines: Iterable[MachineRecord],
    *,
    profile: TransferProfile,
    preemptor_priority: int,
    count: int,
    busy: Collection[str],
    priorities: Mapping[str, int],
    terms: Mapping[str, VictimTerms],
    drain_seconds: Mapping[str, float],
    saturation: float,
    config: EngineConfig,
) -> tuple[CrossShardVictim, ...]:
    """Up to ``count`` configured machines of ``profile`` to drain for a higher priority.

    ``priorities`` is the priority each machine's workload runs at (0 when
    unknown), ``terms`` the penalties and app class of the need it serves
    (the defaults when unknown), ``drain_seconds`` the drain estimate per
    cluster (``config.default_drain_seconds`` when unknown).
    """
    if count <= 0:
        return ()
    feasible: Sequence[MachineRecord] = [
        r
        for r in machines
        if r.state == MachineState.CONFIGURED
        and r.id not in busy
        and profile.matches(r)
        and priorities.get(r.id, 0) < preemptor_priority
    ]
    if not feasible:
        return ()
    feasible = sorted(feasible, key=lambda r: r.id)
    default = VictimTerms()
    priority = np.array([priorities.get(r.id, 0) for r in feasible], dtype=np.int64)
    term = [terms.get(r.id, default) for r in feasible]
    score = victim_scores(
        gap=(preemptor_priority - priority).astype(np.float64),
        drain=np.array(
            [drain_seconds.get(r.cluster, config.default_drain_seconds) for r in feasible],
            dtype=np.float64,
        ),
        interruption=np.array([t.interruption_penalty for t in term], dtype=np.float64),
        reclamation=np.array([t.reclamation_penalty for t in term], dtype=np.float64),
        weights=blend_weights(
            config.victim_weights_normal, config.victim_weights_saturated, saturation
        ),
        config=config,
    )
    app_rank = np.array([APP_CLASS_VICTIM_RANK[t.app_class] for t in term], dtype=np.int64)
    order = victim_order(score, priority, app_rank)
    chosen: list[CrossShardVictim] = []
    for index in order[:count].tolist():
        record = feasible[index]
        victim_priority = int(priority[index])
        chosen.append(
            CrossShardVictim(
                machine_id=record.id,
                cluster_id=record.cluster,
                priority=victim_priority,
                grace_seconds=drain_grace_seconds(
                    preemptor_priority - victim_priority,
                    config.grace_thresholds,
                    config.grace_default_seconds,
                ),
            )
        )
    return tuple(chosen)
