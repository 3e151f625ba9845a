"""The roll-up builder: a cluster's pods → one ``ClusterCapacityNeeds`` (the wire message).

Aggregation follows the Go reference operator's semantics:

* the **key** is (requirements, priority, DoNotSchedule spreads,
  interruption penalty bucket, reclamation penalty bucket, co-location
  group); pods with equal keys become one ``CapacityNeed``;
* ``aggregate_resources`` is the **sum** of the pods' requests and
  ``min_unit`` the per-dimension **maximum** (the largest single pod: every
  machine serving the need must hold it);
* a co-location group adds a ``Same`` requirement on its topology key, so
  the group's machines share one rack or zone; groups stay separate needs
  even when everything else is equal; once some of a group's pods run, the
  requirement names the domain they run in (``pinned``): the rest can only
  join them there, so a machine in another rack would serve nobody;
* ``ScheduleAnyway`` spreads are dropped (a preference, not a constraint);
* raw dollar penalties become log-scale ``PenaltyBucket`` values here, the
  cluster side being where dollars are bucketed.

A pod's request is its placement size (:meth:`PodSpec.placement`). With gap
reclamation on, best-effort pods that fit in the reclaimable gap of the
cluster's nodes are not asked for at all; the rest are asked for at their
limit, as they would need nodes of their own.

Two extensions beyond the Go reference, both within its wire:
``extra`` adds capacity per pod the caller names (the simulator's cluster
model asks once more for a pod its nodes hold in total but cannot fit
because of fragmentation, so the shard brings a machine it fits on), and
every need's ``min_unit`` and aggregate name only resources some pod asked for.
A re-ask must not overshoot: :func:`reasks` drops the re-ask of a pod that a
machine on its way to the cluster will hold (issue 18: the last pods of a
burst were re-asked while their machine was still launching, and the extra
machine stayed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bigfleet.v1alpha1 import capacity_pb2
from clusters.pods import DIMENSIONS, PodSpec, Vector
from shard_engine.coordination import labels_satisfy
from shard_engine.model import Operator, Requirement, TopologySpread, WhenUnsatisfiable
from shard_engine.quantity import format_quantity

__all__ = [
    "AggregationKey",
    "Upcoming",
    "bucket_for_dollars",
    "build_rollup",
    "need_key_of",
    "reasks",
]

AggregationKey = tuple[
    tuple[tuple[str, int, tuple[str, ...]], ...],
    int,
    tuple[tuple[str, int], ...],
    int,
    int,
    str,
]


def bucket_for_dollars(dollars: float) -> int:
    """The smallest ``PenaltyBucket`` whose upper bound holds ``dollars``.

    $0 → ZERO, ≤ $0.50 → HALF_DOLLAR, then powers of two from $1 (bucket 3)
    to $8,388,608 (bucket 26), PINNED above. Inverse of
    :func:`shard_engine.model.penalty_bucket_dollars` on bucket bounds.
    """
    if dollars <= 0:
        return capacity_pb2.PENALTY_BUCKET_ZERO
    if dollars <= 0.5:
        return capacity_pb2.PENALTY_BUCKET_HALF_DOLLAR
    bound = 1.0
    for bucket in range(capacity_pb2.PENALTY_BUCKET_1, capacity_pb2.PENALTY_BUCKET_PINNED):
        if dollars <= bound:
            return bucket
        bound *= 2
    return capacity_pb2.PENALTY_BUCKET_PINNED


def _requirements(pod: PodSpec, pinned: str = "") -> tuple[Requirement, ...]:
    """The pod's requirements, its co-location group's ``Same`` included.

    ``pinned``: the domain the group's running pods hold ("" when none runs);
    the ``Same`` requirement then allows that value only.
    """
    reqs = list(pod.requirements)
    if pod.colocation and not any(
        r.operator is Operator.SAME and r.key == pod.colocation_key for r in reqs
    ):
        reqs.append(Requirement(pod.colocation_key, Operator.SAME))
    if pinned:
        reqs = [
            Requirement(r.key, r.operator, (pinned,))
            if r.operator is Operator.SAME and r.key == pod.colocation_key
            else r
            for r in reqs
        ]
    return tuple(sorted(reqs, key=lambda r: (r.key, int(r.operator), tuple(sorted(r.values)))))


def _hard_spreads(spreads: Iterable[TopologySpread]) -> tuple[TopologySpread, ...]:
    kept = (s for s in spreads if s.when_unsatisfiable is not WhenUnsatisfiable.SCHEDULE_ANYWAY)
    return tuple(sorted(kept, key=lambda s: (s.topology_key, s.max_skew)))


def need_key_of(pod: PodSpec) -> AggregationKey:
    """The aggregation key of a pod (see the module docstring)."""
    return (
        tuple((r.key, int(r.operator), tuple(sorted(r.values))) for r in _requirements(pod)),
        pod.priority,
        tuple((s.topology_key, s.max_skew) for s in _hard_spreads(pod.spread)),
        bucket_for_dollars(pod.interruption_penalty),
        bucket_for_dollars(pod.reclamation_penalty),
        pod.colocation,
    )


@dataclass(slots=True)
class _Group:
    pod: PodSpec
    total: list[float] = field(default_factory=lambda: [0.0] * len(DIMENSIONS))
    largest: list[float] = field(default_factory=lambda: [0.0] * len(DIMENSIONS))

    def add(self, request: Vector, times: int = 1) -> None:
        total, largest = self.total, self.largest
        for i, amount in enumerate(request):
            total[i] += amount * times
            if amount > largest[i]:
                largest[i] = amount


def _resources(values: list[float], names: set[str]) -> dict[str, str]:
    return {
        name: format_quantity(name, value)
        for name, value in zip(DIMENSIONS, values, strict=True)
        if name in names
    }


def build_rollup(
    cluster_id: str,
    pods: Iterable[PodSpec],
    *,
    timestamp_ns: int,
    gap: bool = True,
    in_gap: Iterable[str] = (),
    extra: Mapping[str, int] | None = None,
    prepared: Mapping[str, tuple[AggregationKey, Vector]] | None = None,
    pinned: Mapping[str, str] | None = None,
) -> capacity_pb2.ClusterCapacityNeeds:
    """One full-replacement roll-up for ``cluster_id`` from every pod it must run.

    ``in_gap`` names the best-effort pods that fit in the cluster's
    reclaimable gap (:func:`clusters.gap.fit_in_gap`); with ``gap`` on they
    are not asked for. ``extra`` maps a pod name to how many more times its
    request is added (the fragmentation allowance). ``prepared`` may hold,
    per pod name, its aggregation key (:func:`need_key_of`) and the request
    this function would add for it (a caller that builds roll-ups often
    keeps them per pod, as both are fixed for a pod's life). ``pinned`` maps
    a co-location group to the domain its running pods hold: its ``Same``
    requirement names that value. Needs come out in a stable order (highest
    priority first, then key).
    """
    skip = set(in_gap) if gap else set()
    extra = extra or {}
    groups: dict[AggregationKey, _Group] = {}
    known = prepared or {}
    for pod in pods:
        name = pod.name
        if skip and name in skip and pod.in_gap:
            continue
        entry = known.get(name)
        if entry is None:
            request = pod.placement(gap=False) if pod.in_gap else pod.placement(gap=gap)
            key = need_key_of(pod) if any(request) else None
        else:
            key, request = entry
        if not any(request):
            continue
        assert key is not None
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(pod)
        group.add(request, 1 + max(0, extra.get(name, 0)) if extra else 1)
    needs = []
    for key in sorted(groups, key=lambda k: (-k[1], repr(k))):
        group = groups[key]
        pod = group.pod
        names = {n for n, v in zip(DIMENSIONS, group.total, strict=True) if v > 0}
        needs.append(
            capacity_pb2.CapacityNeed(
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(
                        key=r.key,
                        operator=int(r.operator),  # type: ignore[arg-type]
                        values=list(r.values),
                    )
                    for r in _requirements(
                        pod, (pinned or {}).get(pod.colocation, "") if pod.colocation else ""
                    )
                ],
                aggregate_resources=_resources(group.total, names),
                priority=pod.priority,
                spread=[
                    capacity_pb2.TopologySpread(
                        topology_key=s.topology_key,
                        max_skew=s.max_skew,
                        when_unsatisfiable=capacity_pb2.TopologySpread.WHEN_UNSATISFIABLE_DO_NOT_SCHEDULE,
                    )
                    for s in _hard_spreads(pod.spread)
                ],
                interruption_penalty_bucket=key[3],  # type: ignore[arg-type]
                reclamation_penalty_bucket=key[4],  # type: ignore[arg-type]
                min_unit=_resources(group.largest, names),
                # The co-location group's name is the gang's identity (ADR 0161).
                gang_name=pod.colocation,
            )
        )
    return capacity_pb2.ClusterCapacityNeeds(
        cluster_id=cluster_id, timestamp_unix_nanos=timestamp_ns, needs=needs
    )


@dataclass(frozen=True, slots=True)
class Upcoming:
    """A machine on its way to the cluster (creating or configuring for it): what it will offer."""

    allocatable: Vector
    labels: Mapping[str, str]


def reasks(
    pending: Sequence[tuple[PodSpec, bool]], upcoming: Sequence[Upcoming], *, gap: bool = True
) -> dict[str, int]:
    """The fragmentation re-asks (``extra``) that machines on their way do not already cover.

    ``pending`` is the cluster's pending pods in scheduling order (highest
    priority, then oldest, first), each with whether it is fragmented;
    ``upcoming`` the machines on their way. Every pending pod is placed
    first-fit on the upcoming machines whose labels satisfy its
    requirements, because those machines were bought for pending pods; a
    fragmented pod that finds room asks for nothing more, one that does not
    is re-asked once. With nothing on its way, every fragmented pod is.
    """
    room = [list(u.allocatable) for u in upcoming]
    out: dict[str, int] = {}
    for pod, fragmented in pending:
        request = pod.placement(gap=False) if pod.in_gap else pod.placement(gap=gap)
        for i, machine in enumerate(upcoming):
            left = room[i]
            if all(r <= f + 1e-9 for r, f in zip(request, left, strict=True)) and labels_satisfy(
                _requirements(pod), machine.labels
            ):
                room[i] = [f - r for f, r in zip(left, request, strict=True)]
                break
        else:
            if fragmented:
                out[pod.name] = 1
    return out
