"""Activities for shard membership: planning a drain, and the donor's half of each move.

Coordinator side (:class:`MembershipPlanner`, task queue ``bigfleet-coordinator``):
read PostgreSQL and the providers' List, plan with
``shard_engine.membership.plan_drain``, record instructions. Also
:func:`plan_decommission`, the proportional split of a domain being retired.

Shard side (:class:`MembershipActivities`, task queue ``shard-<id>``): the
donor releases a cluster or hands unbound machines over. The receiver's half
is the coordinator's existing ``adopt_machines``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.context import ActiveGuard, ProviderCalls, ensure_active
from activities.records import MachineOwners, MembershipRecords
from bigfleet.v1alpha1 import provider_pb2
from shard_engine.catalog import LABEL_RACK
from shard_engine.coordination import quota_group
from shard_engine.decommission import take_evenly
from shard_engine.membership import DrainingMachine, plan_drain
from workflows import membership_contracts as ms
from workflows.contracts import MachineTarget

__all__ = [
    "MachinesInMotion",
    "MembershipActivities",
    "MembershipContext",
    "MembershipPlanner",
    "plan_decommission",
]

BARE_METAL = provider_pb2.CAPACITY_TYPE_BARE_METAL
SPECULATIVE = provider_pb2.MACHINE_STATE_SPECULATIVE
IDLE = provider_pb2.MACHINE_STATE_IDLE
FAILED = provider_pb2.MACHINE_STATE_FAILED
CONFIGURED = provider_pb2.MACHINE_STATE_CONFIGURED
# States in which nothing is happening to a machine, so it can change owner.
SETTLED = frozenset({SPECULATIVE, IDLE, FAILED, CONFIGURED})


class MachinesInMotion(RuntimeError):
    """A cluster cannot move yet: some of its machines are being created, configured or
    drained. The move is retried until they settle."""


def _group(provider: str, m: provider_pb2.Machine) -> str:
    """The quota group a machine counts in (``shard_engine.coordination.quota_group``)."""
    return quota_group(provider, m.zone, m.instance_type, int(m.capacity_type))


def _rack(m: provider_pb2.Machine) -> str:
    return m.labels.get(LABEL_RACK, m.zone) if m.capacity_type == BARE_METAL else ""


class MembershipPlanner:
    """Coordinator side: plan what draining shards give away, and record it."""

    def __init__(self, store: MembershipRecords, providers: Mapping[str, ProviderCalls]) -> None:
        self._store = store
        self._providers = providers

    @activity.defn(name=ms.PLAN_MEMBERSHIP)
    async def plan_membership(self, inp: ms.MembershipPlanInput) -> ms.MembershipPlan:
        """Cluster moves and handovers for every draining shard (nothing when none drains).

        Machines in motion are left for a later round. Speculative cloud
        quota is left to the rebalance of ``distribute``.
        """
        rows = await self._store.shards()
        draining = {r.id for r in rows if r.state == "draining"}
        if not draining:
            return ms.MembershipPlan()
        active = [r.id for r in rows if r.state == "active"]
        clusters = {c.cluster_id: c.shard_id for c in await self._store.clusters()}
        assignments = {a.machine_id: a for a in await self._store.machines()}
        movable: list[DrainingMachine] = []
        holdings: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        group_load: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        listed: set[str] = set()
        for provider, client in sorted(self._providers.items()):
            for m in (await client.list()).machines:
                listed.add(m.id)
                owned = assignments.get(m.id)
                if owned is None:
                    continue
                rack, group = _rack(m), _group(provider, m)
                if owned.shard_id not in draining:
                    if rack:
                        holdings[rack][owned.shard_id] += 1
                    else:
                        group_load[owned.shard_id][group] += 1
                    continue
                cluster = m.cluster or owned.cluster_id or ""
                if not cluster and (m.state not in SETTLED or m.state == CONFIGURED):
                    continue  # in motion; or configured for nobody we know: wait
                if not cluster and not rack and m.state == SPECULATIVE:
                    continue  # cloud quota: the rebalance moves it
                movable.append(DrainingMachine(m.id, owned.shard_id, group, rack, cluster))
        for a in assignments.values():
            if a.shard_id in draining and a.machine_id not in listed and not a.cluster_id:
                # No provider lists it any more: the record is all that is left to hand over.
                movable.append(DrainingMachine(a.machine_id, a.shard_id, f"{a.provider}/unlisted"))
        plan = plan_drain(
            clusters={c: s for c, s in clusters.items() if s in draining},
            machines=movable,
            active=active,
            cluster_load={r.id: r.clusters for r in rows if r.state == "active"},
            domain_holdings=holdings,
            group_load=group_load,
        )
        return ms.MembershipPlan(
            moves=[ms.ClusterMoveSpec(m.cluster_id, m.donor, m.receiver) for m in plan.moves],
            handovers=[
                ms.HandoverSpec(
                    h.donor,
                    h.receiver,
                    [MachineTarget(i, assignments[i].provider) for i in h.machine_ids],
                )
                for h in plan.handovers
            ],
        )

    @activity.defn(name=ms.RECORD_MEMBERSHIP)
    async def record_membership(self, inp: ms.MembershipRecord) -> None:
        payload: dict[str, object] = {"kind": inp.kind}
        if inp.cluster_id:
            payload["cluster_id"] = inp.cluster_id
        if inp.machine_ids:
            payload["machine_ids"] = inp.machine_ids
        await self._store.record_instruction(
            term=inp.term,
            seq=inp.seq,
            kind=inp.kind,
            donor=inp.donor,
            receiver=inp.receiver,
            payload=payload,
        )


async def plan_decommission(
    store: MachineOwners,
    provider: str,
    client: ProviderCalls,
    *,
    label: str,
    value: str,
    count: int,
) -> dict[str, list[str]]:
    """Which machines each shard gives up when ``count`` machines of a domain are retired.

    The domain is every machine of ``provider`` whose ``label`` is ``value``
    (a zone, a hall, a rack). Each shard gives up the same share of what it
    holds there; within a shard unbound machines go first (speculative,
    then idle or failed), configured ones last.
    """
    domain = [m for m in (await client.list()).machines if m.labels.get(label) == value]
    owners = await store.owners([m.id for m in domain])
    rank = {SPECULATIVE: 0, IDLE: 1, FAILED: 1}
    held: dict[str, list[provider_pb2.Machine]] = defaultdict(list)
    for m in domain:
        if m.id in owners:
            held[owners[m.id]].append(m)
    ordered = {
        shard: [m.id for m in sorted(ms_, key=lambda m: (rank.get(m.state, 2), m.id))]
        for shard, ms_ in held.items()
    }
    return take_evenly(ordered, count)


class MembershipContext(Protocol):
    """What the shard process offers for membership moves."""

    async def release_cluster(self, inp: ms.ReleaseClusterInput) -> ms.ReleaseClusterResult: ...

    async def hand_over(self, inp: ms.HandOverInput) -> ms.HandOverResult: ...


class MembershipActivities:
    """Shard side: the donor's half of a cluster move or a handover."""

    def __init__(self, ctx: MembershipContext, *, guard: ActiveGuard) -> None:
        self._ctx = ctx
        self._guard = guard

    def _ensure_active(self) -> None:
        # Retryable, unlike a machine operation's: the next attempt may reach
        # the process that holds the lease now.
        ensure_active(self._guard, retryable=True)

    @activity.defn(name=ms.RELEASE_CLUSTER)
    async def release_cluster(self, inp: ms.ReleaseClusterInput) -> ms.ReleaseClusterResult:
        """Give a cluster and its bound machines to another shard (the donor must be draining)."""
        self._ensure_active()
        try:
            return await self._ctx.release_cluster(inp)
        except MachinesInMotion as err:
            raise ApplicationError(str(err), type=ms.MACHINES_IN_MOTION) from err

    @activity.defn(name=ms.HAND_OVER)
    async def hand_over(self, inp: ms.HandOverInput) -> ms.HandOverResult:
        """Give unbound machines to another shard (the donor must be draining)."""
        self._ensure_active()
        return await self._ctx.hand_over(inp)
