"""Draining a shard: where its clusters and machines go. Pure: values in, a plan out.

A draining shard gives away everything it owns, in two kinds of move:

    cluster move   a cluster with every machine bound to it, to one active shard
                   (the one manual path where a cluster changes shard)
    handover       unbound machines: idle or failed cloud machines, and every
                   unbound bare-metal machine, rack by rack

Speculative cloud quota is not planned here: the coordinator's rebalance
already hands a draining shard's quota to the active shards.

Racks stay whole where the plan can keep them whole. Clusters whose machines
share a rack travel together (a connected component of the "shares a rack"
relation goes to one receiver), and a rack's unbound machines follow the
rack's bound ones. Otherwise receivers are the least loaded: fewest clusters
for cluster moves, fewest racks for racks, fewest machines of the quota group
for cloud machines. Ties go to the lower shard id, so a plan is reproducible.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shard_engine.coordination import distribute_evenly

__all__ = ["ClusterMovePlan", "DrainPlan", "DrainingMachine", "Handover", "plan_drain"]


@dataclass(frozen=True, slots=True)
class DrainingMachine:
    """A machine a draining shard owns that can move now (nothing in flight on it).

    ``domain`` is its rack (bare metal) or "" (cloud); ``group`` its quota
    group; ``cluster`` the cluster it is bound to, or "".
    """

    machine_id: str
    shard_id: str
    group: str
    domain: str = ""
    cluster: str = ""


@dataclass(frozen=True, slots=True)
class ClusterMovePlan:
    cluster_id: str
    donor: str
    receiver: str


@dataclass(frozen=True, slots=True)
class Handover:
    donor: str
    receiver: str
    machine_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DrainPlan:
    moves: tuple[ClusterMovePlan, ...] = ()
    handovers: tuple[Handover, ...] = ()


class _Components:
    """Union-find over cluster ids."""

    def __init__(self, items: Sequence[str]) -> None:
        self._parent = {i: i for i in items}

    def find(self, item: str) -> str:
        root = item
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[item] != root:
            self._parent[item], item = root, self._parent[item]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)

    def groups(self) -> list[list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for item in sorted(self._parent):
            out[self.find(item)].append(item)
        return sorted(out.values(), key=lambda g: (-len(g), g[0]))


def plan_drain(
    *,
    clusters: Mapping[str, str],
    machines: Sequence[DrainingMachine],
    active: Sequence[str],
    cluster_load: Mapping[str, int],
    domain_holdings: Mapping[str, Mapping[str, int]],
    group_load: Mapping[str, Mapping[str, int]],
) -> DrainPlan:
    """Plan every move out of the draining shards.

    ``clusters``: cluster -> its draining shard. ``machines``: what those
    shards own and could move now. ``active``: shards that may receive.
    ``cluster_load``: clusters per active shard. ``domain_holdings``: rack ->
    active shard -> machines it owns there. ``group_load``: active shard ->
    quota group -> machines owned.
    """
    if not active:
        return DrainPlan()
    load = {s: cluster_load.get(s, 0) for s in active}
    racks_held: dict[str, int] = defaultdict(int)
    for holders in domain_holdings.values():
        for shard, count in holders.items():
            if shard in load and count > 0:
                racks_held[shard] += 1

    # Clusters sharing a rack form one component and go to one receiver.
    components = _Components(sorted(clusters))
    cluster_domains: dict[str, set[str]] = defaultdict(set)
    first_in_domain: dict[str, str] = {}
    for m in machines:
        if m.cluster and m.cluster in clusters and m.domain:
            cluster_domains[m.cluster].add(m.domain)
            other = first_in_domain.setdefault(m.domain, m.cluster)
            components.union(other, m.cluster)
    receiver_of_domain: dict[str, str] = {}
    moves: list[ClusterMovePlan] = []
    for group in components.groups():
        domains = set().union(*(cluster_domains[c] for c in group))
        receiver = _rack_affine(domains, domain_holdings, load) or min(
            load, key=lambda s: (load[s], s)
        )
        load[receiver] += len(group)
        for domain in sorted(domains):
            if domain in receiver_of_domain:
                continue
            receiver_of_domain[domain] = receiver
            if not domain_holdings.get(domain, {}).get(receiver):
                racks_held[receiver] += 1
        moves += [ClusterMovePlan(c, clusters[c], receiver) for c in group]

    # Unbound machines: racks whole, cloud machines evened out per quota group.
    handed: dict[tuple[str, str], list[str]] = defaultdict(list)
    by_domain: dict[str, list[DrainingMachine]] = defaultdict(list)
    cloud: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for m in machines:
        if m.cluster:
            continue
        if m.domain:
            by_domain[m.domain].append(m)
        else:
            cloud[m.shard_id][m.group].append(m.machine_id)
    for domain, rack in sorted(by_domain.items()):
        target = receiver_of_domain.get(domain) or _rack_affine({domain}, domain_holdings, load)
        if target is None:
            target = min(load, key=lambda s: (racks_held[s], s))
            racks_held[target] += 1
        receiver_of_domain[domain] = target
        for m in rack:
            handed[(m.shard_id, target)].append(m.machine_id)
    current = {s: dict(group_load.get(s, {})) for s in active}
    for donor, groups in sorted(cloud.items()):
        for target, ids in distribute_evenly(groups, list(active), current).items():
            handed[(donor, target)] += ids
            for quota_group, group_ids in groups.items():
                took = len(set(group_ids) & set(ids))
                current[target][quota_group] = current[target].get(quota_group, 0) + took
    return DrainPlan(
        moves=tuple(moves),
        handovers=tuple(
            Handover(donor, receiver, tuple(sorted(ids)))
            for (donor, receiver), ids in sorted(handed.items())
        ),
    )


def _rack_affine(
    domains: set[str], holdings: Mapping[str, Mapping[str, int]], load: Mapping[str, int]
) -> str | None:
    """The active shard already holding the most machines in ``domains``, if any does."""
    held: dict[str, int] = defaultdict(int)
    for domain in domains:
        for shard, count in holdings.get(domain, {}).items():
            if shard in load and count > 0:
                held[shard] += count
    if not held:
        return None
    return min(held, key=lambda s: (-held[s], load[s], s))
