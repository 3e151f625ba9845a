"""The baseline: one Karpenter-like autoscaler per cluster, on the same providers and trace.

Each cluster owns a fixed share of the fleet's quota — cloud slots spread
evenly over the clusters per (provider, zone, instance type, capacity
type), bare-metal racks dealt out whole, GPU racks to the clusters whose
pods ask for GPUs (``gpu_clusters``) and the others to the rest, as an
operator sizing each cluster's quota for its workload would — and
autoscales alone:

* **provisioning** every ``batch_s``: the cluster's pending pods that no
  machine in flight has room for (its allocatable less the pods still
  waiting for it, as Karpenter counts capacity in flight; a gang's pods
  wait for all of the gang's machines, ADR 0179) are grouped by their
  constraints; for each
  group every instance type it may use (from the cluster's own free slots
  and idle bare metal) is tried by packing the pods onto it with FFD, and
  the type with the lowest ``price × nodes / dominant units packed`` wins
  (seed 004's node-pool rule). Spot is just a price: its interruption risk
  is not priced. A gang that must share a rack is tried rack by rack.
  Nodes are created, then configured for the cluster; the pods wait for them;
* **consolidation**: a node that has been empty for ``consolidate_after_s``
  is drained and, on a cloud, deleted (its slot returns to the cluster's
  share); idle bare metal stays with the cluster;
* no fleet-level reuse of another cluster's idle machines, no preemption
  across clusters, no pricing of spot risk.

It drives the same provider cores, with the same latencies, launch rate
limits and interruptions, as the BigFleet policy.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from clusters.packing import FloatArray, Heuristic, pack
from clusters.pods import DIMENSIONS, PodSpec
from providers.errors import ProviderError
from shard_engine.coordination import distribute_evenly, labels_satisfy
from shard_engine.model import CapacityType, MachineRecord, MachineState, Requirement
from simulator.cluster import ClusterModel
from simulator.fleet import Fleet

__all__ = ["BaselineOptions", "BaselinePolicy"]

GI = float(2**30)
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class BaselineOptions:
    """Cadences of the per-cluster autoscalers (virtual seconds)."""

    batch_s: float = 10.0
    consolidate_after_s: float = 60.0
    consolidate_every_s: float = 30.0


@dataclass(slots=True)
class _Share:
    """One cluster's machines: its quota share and what it launched."""

    machines: list[str] = field(default_factory=list)
    nominated: dict[str, str] = field(default_factory=dict)  # pod -> machine launching for it
    launching: dict[str, list[str]] = field(default_factory=dict)  # machine -> pods
    empty_since: dict[str, float] = field(default_factory=dict)
    # machine launched for a gang -> the gang; its pods stay nominated until all have landed
    gang_of: dict[str, str] = field(default_factory=dict)
    landed: dict[str, list[str]] = field(default_factory=dict)  # gang -> its landed pods


class BaselinePolicy:
    """Per-cluster Karpenter-like autoscaling (see the module docstring)."""

    name = "baseline"

    def __init__(
        self,
        fleet: Fleet,
        clusters: Mapping[str, ClusterModel],
        options: BaselineOptions,
        *,
        gpu_clusters: frozenset[str] = frozenset(),
    ) -> None:
        self.fleet = fleet
        self.gpu_clusters = gpu_clusters
        self.clusters = clusters
        self.options = options
        self.shares: dict[str, _Share] = {c: _Share() for c in clusters}
        self.owner: dict[str, str] = {}
        self.records: dict[str, MachineRecord] = {}
        self.state_of: dict[str, MachineState] = {}
        self.stats: Counter[str] = Counter()
        self._next_batch = 0.0
        self._next_consolidate = options.consolidate_every_s

    def close(self) -> None:
        """Nothing to stop: the baseline runs in this process."""

    def worker_cpu_seconds(self) -> float:
        """The baseline has no worker processes."""
        return 0.0

    def start(self, now: float) -> None:
        """Deal the fleet's quota out to the clusters."""
        records = list(self.fleet.records())
        groups: dict[str, list[str]] = defaultdict(list)
        racks: dict[str, list[str]] = defaultdict(list)
        for r in records:
            self.records[r.id] = r
            self.state_of[r.id] = r.state
            rack = r.labels.get("topology.kubernetes.io/rack")
            if rack:
                racks[rack].append(r.id)
            else:
                groups[f"{r.provider}/{r.zone}/{r.instance_type}/{int(r.capacity_type)}"].append(
                    r.id
                )
        names = sorted(self.clusters)
        for cluster, ids in distribute_evenly(groups, names, {}).items():
            self.shares[cluster].machines.extend(ids)
        # Racks go whole to the clusters that can use them: GPU racks to the clusters
        # whose pods ask for GPUs, the others to the rest (each to everyone if no one).
        gpu = sorted(self.gpu_clusters & set(names)) or names
        other = [n for n in names if n not in self.gpu_clusters] or names
        dealt = {True: 0, False: 0}
        for rack in sorted(racks):
            has_gpu = any(
                self.records[m].allocatable.get("nvidia.com/gpu", 0) > 0 for m in racks[rack]
            )
            takers = gpu if has_gpu else other
            self.shares[takers[dealt[has_gpu] % len(takers)]].machines.extend(racks[rack])
            dealt[has_gpu] += 1
        for cluster, share in self.shares.items():
            for mid in share.machines:
                self.owner[mid] = cluster

    # -- periodic work ------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Provision for pending pods and consolidate empty nodes, each on its cadence."""
        if now >= self._next_batch:
            self._next_batch = now + self.options.batch_s
            for cluster_id, cluster in self.clusters.items():
                if cluster.pending:
                    self._provision(cluster_id, cluster, now)
        if now >= self._next_consolidate:
            self._next_consolidate = now + self.options.consolidate_every_s
            for cluster_id, cluster in self.clusters.items():
                self._consolidate(cluster_id, cluster, now)

    def _provision(self, cluster_id: str, cluster: ClusterModel, now: float) -> None:
        share = self.shares[cluster_id]
        waiting = [s.spec for s in cluster.pending_pods() if s.spec.name not in share.nominated]
        if waiting and share.launching:
            waiting = self._into_flight(cluster, share, waiting)
        if not waiting:
            return
        groups: dict[tuple[tuple[Requirement, ...], str], list[PodSpec]] = defaultdict(list)
        for pod in waiting:
            groups[(pod.requirements, pod.colocation)].append(pod)
        free = [
            mid
            for mid in share.machines
            if self.state_of[mid] in (MachineState.SPECULATIVE, MachineState.IDLE)
            and mid not in share.launching
        ]
        for (requirements, colocation), pods in groups.items():
            self._launch_for(cluster_id, share, pods, requirements, colocation, free, now)

    def _into_flight(
        self, cluster: ClusterModel, share: _Share, waiting: list[PodSpec]
    ) -> list[PodSpec]:
        """Nominate waiting pods to machines in flight that still have room; the rest.

        A machine's room is its allocatable less the pods nominated to it
        that still wait: the cluster's scheduler may have put another pod
        on the first machine to land, and the pod launched for it then
        waits for the machine that pod was launched for. Karpenter counts
        the capacity of machines in flight, not which pod each was launched
        for, so it does not launch again for that pod. A gang keeps its own
        machines (its pods must share a rack), and its pods are left out.
        """
        rooms: dict[str, FloatArray] = {}
        for mid, names in share.launching.items():
            if mid in share.gang_of:
                continue
            room = self._allocatable(mid)
            for name in names:
                if name in cluster.pending and share.nominated.get(name) == mid:
                    room = room - self._size(cluster, cluster.pods[name].spec)
            rooms[mid] = room
        left: list[PodSpec] = []
        for pod in waiting:
            size = self._size(cluster, pod)
            home = None
            if not pod.colocation:
                home = next(
                    (
                        mid
                        for mid, room in rooms.items()
                        if np.all(room + _EPS >= size)
                        and labels_satisfy(pod.requirements, self.records[mid].labels)
                    ),
                    None,
                )
            if home is None:
                left.append(pod)
                continue
            rooms[home] = rooms[home] - size
            share.launching[home].append(pod.name)
            share.nominated[pod.name] = home
        return left

    def _allocatable(self, mid: str) -> FloatArray:
        record = self.records[mid]
        return np.array([record.allocatable.get(d, 0.0) for d in DIMENSIONS])

    @staticmethod
    def _size(cluster: ClusterModel, pod: PodSpec) -> FloatArray:
        """What a pod takes of a node, as the cluster's scheduler counts it."""
        return np.array(pod.placement(gap=False) if pod.in_gap else pod.placement(gap=cluster.gap))

    def _launch_for(
        self,
        cluster_id: str,
        share: _Share,
        pods: list[PodSpec],
        requirements: tuple[Requirement, ...],
        colocation: str,
        free: list[str],
        now: float,
    ) -> None:
        cluster = self.clusters[cluster_id]
        sizes = np.array([self._size(cluster, p) for p in pods])
        if not sizes.any():
            return
        gang_key = pods[0].colocation_key if colocation else ""
        # Candidate profiles: (provider, type, zone, capacity, rack-if-gang) -> free machine ids.
        candidates: dict[tuple[str, str, str, str, str], list[str]] = defaultdict(list)
        for mid in free:
            record = self.records[mid]
            if not labels_satisfy(requirements, record.labels):
                continue
            if gang_key and gang_key not in record.labels:
                continue
            key = (
                record.provider,
                record.instance_type,
                record.zone,
                str(int(record.capacity_type)),
                record.labels.get(gang_key, "") if gang_key else "",
            )
            candidates[key].append(mid)
        gpu = sizes[:, 2].sum() > 0
        dominant = 2 if gpu else (0 if sizes[:, 0].sum() * 4 * GI >= sizes[:, 1].sum() else 1)
        remaining = list(range(len(pods)))
        while remaining and candidates:
            best: (
                tuple[float, tuple[str, str, str, str, str], list[int], list[list[int]]] | None
            ) = None
            for key, mids in candidates.items():
                record = self.records[mids[0]]
                alloc = self._allocatable(mids[0])
                items = sizes[remaining]
                packing = pack(items, alloc, Heuristic.FFD_SUM)
                nodes = min(packing.nodes, len(mids))
                bins = [
                    [remaining[i] for i in np.flatnonzero(packing.assignment == b)]
                    for b in range(nodes)
                ]
                packed = [i for b in bins for i in b]
                if not packed or (gang_key and len(packed) < len(remaining)):
                    continue
                units = float(sizes[packed, dominant].sum())
                price = record.price_per_hour
                if (
                    record.capacity_type == CapacityType.BARE_METAL
                    or self.state_of[mids[0]] is MachineState.IDLE
                ):
                    price = 0.0  # already held: free to use
                score = (price * nodes) / max(units, 1e-9)
                if best is None or score < best[0]:
                    best = (score, key, packed, bins)
            if best is None:
                break
            _, key, packed, bins = best
            mids = candidates.pop(key)
            gang = pods[0].colocation if colocation else ""
            for bin_pods, mid in zip(bins, mids, strict=False):
                names = [pods[i].name for i in bin_pods]
                self._launch(cluster_id, share, mid, names, now, gang=gang)
                free.remove(mid)
            remaining = [i for i in remaining if i not in set(packed)]

    def _launch(
        self, cluster_id: str, share: _Share, mid: str, pods: list[str], now: float, *, gang: str
    ) -> None:
        core = self.fleet.providers[self.records[mid].provider]
        try:
            if self.state_of[mid] is MachineState.IDLE:
                core.configure(mid, cluster_id)
            else:
                core.create(mid)
        except ProviderError as err:
            self.stats[f"refused:{type(err).__name__}"] += 1
            return
        self.stats["launches"] += 1
        share.launching[mid] = pods
        if gang:
            share.gang_of[mid] = gang
        for name in pods:
            share.nominated[name] = mid

    def _consolidate(self, cluster_id: str, cluster: ClusterModel, now: float) -> None:
        share = self.shares[cluster_id]
        for mid in cluster.node_ids():
            if cluster.pods_on(mid):
                share.empty_since.pop(mid, None)
                continue
            since = share.empty_since.setdefault(mid, now)
            if now - since < self.options.consolidate_after_s:
                continue
            share.empty_since.pop(mid, None)
            cluster.remove_node(mid, now, reason="reclaim")
            self.stats["consolidations"] += 1
            try:
                self.fleet.providers[self.records[mid].provider].drain(mid, 0)
            except ProviderError:
                self.stats["refused:drain"] += 1

    # -- observing --------------------------------------------------------------------------
    def on_changes(self, changes: list[tuple[str, str]], now: float) -> None:
        """Follow launches to CONFIGURED, drains to deletion, and interruptions."""
        seen: set[str] = set()
        for provider, mid in changes:
            if mid in seen:
                continue
            seen.add(mid)
            cluster_id = self.owner.get(mid)
            if cluster_id is None:
                continue
            record = self.fleet.machine(provider, mid)
            self.records[mid] = record
            self.state_of[mid] = record.state
            share = self.shares[cluster_id]
            cluster = self.clusters[cluster_id]
            core = self.fleet.providers[provider]
            state = record.state
            if state is MachineState.IDLE and mid in share.launching:
                try:
                    core.configure(mid, cluster_id)
                except ProviderError:
                    self._forget_launch(share, mid)
            elif state is MachineState.IDLE and record.capacity_type != CapacityType.BARE_METAL:
                try:  # drained by consolidation: give the slot back
                    core.delete(mid)
                except ProviderError:
                    self.stats["refused:delete"] += 1
            elif state is MachineState.CONFIGURED and mid in share.launching:
                self._forget_launch(share, mid)
                cluster.add_node(mid, record.allocatable, record.labels, now)
            elif state is MachineState.FAILED:
                self._forget_launch(share, mid)
                if cluster.has_node(mid):
                    self.stats["interruptions"] += 1
                    cluster.remove_node(mid, now, reason="interrupt")

    def _forget_launch(self, share: _Share, mid: str) -> None:
        """A launch has landed or failed: its pods are no longer waiting for it.

        A gang's pods stay nominated until every machine launched for the
        gang has landed or failed: a gang scheduler binds none of them
        before all are ready, and forgetting the first machine's pods as it
        landed had the next batch launch again for pods whose machines were
        a few seconds behind.
        """
        pods = share.launching.pop(mid, [])
        gang = share.gang_of.pop(mid, "")
        if gang:
            share.landed.setdefault(gang, []).extend(pods)
            if gang in share.gang_of.values():
                return
            pods = share.landed.pop(gang)
        for name in pods:
            if gang or share.nominated.get(name) == mid:
                share.nominated.pop(name, None)

    def machines_by_state(self) -> Counter[str]:
        """Machines per state over every cluster's share (for the time series)."""
        return Counter(s.name for s in self.state_of.values())
