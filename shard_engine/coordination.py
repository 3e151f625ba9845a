"""Coordinator planning: which shard gives what to whom. Pure: values in, instructions out.

Shards report what they could spare and what they are missing. The planner
walks shortfalls from the highest priority down and resolves each in the
paper's order, stopping at the first step that covers it:

    1. idle machines of another shard          (bookkeeping only, no drain)
    2. speculative quota of another shard      (the receiver creates them)
    3. cross-shard preemption                  (only for escalated shortfalls,
                                                strictly lower priority only)

Every instruction respects a sanity limit: no donor gives away more than
``max_share`` of its machines in one planning round. Supply handed out is
subtracted as the plan grows, so two shortfalls never claim the same
machines. Topology constraints never cross shards: a need with a ``Same``
requirement is served by one donor profile or not at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from shard_engine.model import Operator, Requirement

__all__ = [
    "Instruction",
    "ProfileSupply",
    "ShardShortfall",
    "ShardView",
    "TransferKind",
    "distribute_evenly",
    "labels_satisfy",
    "plan_transfers",
    "units_needed",
]

TransferKind = Literal["idle", "speculative", "preempt"]


@dataclass(frozen=True, slots=True)
class ProfileSupply:
    """Machines of one shape a shard holds, by what they are doing.

    ``configured_by_priority`` counts configured machines by the priority
    they serve; they are preemption candidates for strictly higher priorities.
    """

    provider: str
    instance_type: str
    zone: str
    capacity_type: int
    labels: Mapping[str, str]
    allocatable: Mapping[str, float]
    idle: int = 0
    speculative: int = 0
    configured_by_priority: Mapping[int, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.provider, self.instance_type, self.zone, self.capacity_type)


@dataclass(frozen=True, slots=True)
class ShardShortfall:
    """Demand a shard could not meet locally."""

    cluster_id: str
    need_key: str
    priority: int
    deficit: Mapping[str, float]
    requirements: tuple[Requirement, ...] = ()
    min_unit: Mapping[str, float] = field(default_factory=dict)
    age_cycles: int = 0
    escalated: bool = False


@dataclass(frozen=True, slots=True)
class ShardView:
    """The latest report of one shard."""

    shard_id: str
    total_machines: int
    supply: tuple[ProfileSupply, ...] = ()
    shortfalls: tuple[ShardShortfall, ...] = ()


@dataclass(frozen=True, slots=True)
class Instruction:
    """Move ``count`` machines of one profile from ``donor`` to ``receiver``."""

    kind: TransferKind
    donor: str
    receiver: str
    provider: str
    instance_type: str
    zone: str
    capacity_type: int
    count: int
    cluster_id: str
    need_key: str
    priority: int
    # For preemption: the victims' priority must be strictly below this.
    below_priority: int = 0


def labels_satisfy(requirements: Iterable[Requirement], labels: Mapping[str, str]) -> bool:
    """Do a machine's labels satisfy every requirement? (SAME checks existence and values.)"""
    for req in requirements:
        value = labels.get(req.key)
        op = req.operator
        if op is Operator.IN and value not in req.values:
            return False
        if op is Operator.NOT_IN and value in req.values:
            return False
        if op is Operator.EXISTS and value is None:
            return False
        if op is Operator.DOES_NOT_EXIST and value is not None:
            return False
        if op is Operator.SAME and (value is None or (req.values and value not in req.values)):
            return False
    return True


def _covers(allocatable: Mapping[str, float], unit: Mapping[str, float]) -> bool:
    return all(allocatable.get(k, 0.0) >= v for k, v in unit.items() if v > 0)


def units_needed(deficit: Mapping[str, float], allocatable: Mapping[str, float]) -> int:
    """Machines of this shape needed to cover ``deficit``; 0 if it covers nothing needed."""
    count = 0
    for name, amount in deficit.items():
        if amount <= 0:
            continue
        per = allocatable.get(name, 0.0)
        if per <= 0:
            return 0
        count = max(count, math.ceil(amount / per - 1e-9))
    return count


def plan_transfers(views: Mapping[str, ShardView], *, max_share: float = 0.05) -> list[Instruction]:
    """Plan instructions for every reported shortfall, highest priority first."""
    budget = {sid: max(1, int(v.total_machines * max_share)) for sid, v in views.items()}
    left: dict[tuple[str, tuple[str, str, str, int]], dict[str, int]] = {}
    for sid, view in views.items():
        for s in view.supply:
            left[(sid, s.key)] = {"idle": s.idle, "speculative": s.speculative}
            for prio, n in s.configured_by_priority.items():
                left[(sid, s.key)][f"p{prio}"] = n
    shortfalls = sorted(
        ((sid, sf) for sid, v in views.items() for sf in v.shortfalls),
        key=lambda item: (-item[1].priority, -item[1].age_cycles, item[0], item[1].cluster_id),
    )
    out: list[Instruction] = []
    for receiver, sf in shortfalls:
        kinds: tuple[TransferKind, ...] = ("idle", "speculative", "preempt")
        for kind in kinds:
            if kind == "preempt" and not sf.escalated:
                break
            instruction = _resolve(views, receiver, sf, kind, left, budget)
            if instruction is not None:
                out.append(instruction)
                break
    return out


def _resolve(
    views: Mapping[str, ShardView],
    receiver: str,
    sf: ShardShortfall,
    kind: TransferKind,
    left: dict[tuple[str, tuple[str, str, str, int]], dict[str, int]],
    budget: dict[str, int],
) -> Instruction | None:
    """The cheapest single-profile donation that covers ``sf`` (fewest machines wins)."""
    best: tuple[int, str, ProfileSupply, list[str]] | None = None
    for donor, view in sorted(views.items()):
        if donor == receiver or budget[donor] <= 0:
            continue
        for supply in view.supply:
            if not labels_satisfy(sf.requirements, supply.labels):
                continue
            if not _covers(supply.allocatable, sf.min_unit):
                continue
            need = units_needed(sf.deficit, supply.allocatable)
            if need <= 0:
                continue
            pool = left[(donor, supply.key)]
            if kind == "preempt":
                buckets = sorted(
                    (k for k in pool if k.startswith("p") and int(k[1:]) < sf.priority),
                    key=lambda k: int(k[1:]),
                )
                available = sum(pool[k] for k in buckets)
            else:
                buckets = [kind]
                available = pool.get(kind, 0)
            if available < need or need > budget[donor]:
                continue
            if best is None or need < best[0]:
                best = (need, donor, supply, buckets)
    if best is None:
        return None
    need, donor, supply, buckets = best
    remaining = need
    pool = left[(donor, supply.key)]
    for bucket in buckets:
        take = min(pool.get(bucket, 0), remaining)
        pool[bucket] -= take
        remaining -= take
        if remaining == 0:
            break
    budget[donor] -= need
    return Instruction(
        kind=kind,
        donor=donor,
        receiver=receiver,
        provider=supply.provider,
        instance_type=supply.instance_type,
        zone=supply.zone,
        capacity_type=supply.capacity_type,
        count=need,
        cluster_id=sf.cluster_id,
        need_key=sf.need_key,
        priority=sf.priority,
        below_priority=sf.priority if kind == "preempt" else 0,
    )


def distribute_evenly(
    groups: Mapping[str, Sequence[str]],
    shards: Sequence[str],
    current: Mapping[str, Mapping[str, int]],
) -> dict[str, list[str]]:
    """Spread unowned items of each group over ``shards`` so counts per group even out.

    ``groups`` maps a group key (provider/zone/instance type, or a whole rack)
    to its unowned item ids; ``current`` gives each shard's count per group
    already owned. Items go one at a time to the shard with the fewest of
    that group (ties broken by shard id), so repeated runs are stable.
    Returns shard -> items assigned.
    """
    if not shards:
        return {}
    out: dict[str, list[str]] = {s: [] for s in shards}
    for group, items in sorted(groups.items()):
        counts = {s: current.get(s, {}).get(group, 0) for s in shards}
        for item in sorted(items):
            target = min(shards, key=lambda s: (counts[s], s))
            out[target].append(item)
            counts[target] += 1
    return {s: ids for s, ids in out.items() if ids}
