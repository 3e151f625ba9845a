"""The coordinator's activities: read providers and PostgreSQL, plan, record instructions.

They run on the coordinator's task queue in the coordinator process. The
shard-side halves of an instruction (release, adopt) run in the shards.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Collection, Mapping

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.context import ProviderCalls
from activities.membership import plan_decommission
from activities.records import CoordinatorRecords
from bigfleet.metrics import COORDINATOR_INSTRUCTIONS, COORDINATOR_ROUNDS
from bigfleet.v1alpha1 import provider_pb2
from shard_engine.catalog import LABEL_RACK
from shard_engine.coordination import (
    DOMAIN_LABEL,
    ProfileSupply,
    ShardShortfall,
    ShardView,
    offered_idle,
    plan_transfers,
    quota_group,
    requirements_from,
)
from shard_engine.dealing import Dealable, deal, rack_of
from shard_engine.shortfalls import awaits_idle
from workflows import coordinator_contracts as co
from workflows.contracts import MachineTarget

log = logging.getLogger(__name__)

BARE_METAL = provider_pb2.CAPACITY_TYPE_BARE_METAL


def cloud_group(provider: str, m: provider_pb2.Machine) -> str:
    """Quota is distributed per (provider, zone, instance type, capacity type)."""
    return quota_group(provider, m.zone, m.instance_type, int(m.capacity_type))


class CoordinatorActivities:
    """Bound to the coordinator process's store and provider clients."""

    def __init__(
        self,
        store: CoordinatorRecords,
        providers: Mapping[str, ProviderCalls],
        *,
        rebalance_share: float = 0.05,
    ) -> None:
        self._store = store
        self._providers = providers
        self._rebalance_share = rebalance_share

    @activity.defn(name=co.DISTRIBUTE)
    async def distribute(self, inp: co.DistributeInput) -> co.DistributeResult:
        """Assign unowned machines evenly; plan moves toward new and away from draining shards.

        Cloud quota spreads per (provider, zone, instance type, capacity type);
        bare metal moves in whole racks, so a shard can satisfy rack gangs.
        """
        shards = await self._store.active_shards()
        everyone = {row.id: row.state for row in await self._store.shards()}
        if not shards:
            return co.DistributeResult(adoptions=[])
        owners = await self._store.owners()
        owned_total: dict[str, int] = defaultdict(int)
        for owner in owners.values():
            owned_total[owner] += 1
        adoptions: dict[str, list[MachineTarget]] = defaultdict(list)
        rebalance: list[co.TransferSpec] = []
        for provider, client in sorted(self._providers.items()):
            listing = await client.list()
            cloud_current: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            cloud_spare: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            samples: dict[str, provider_pb2.Machine] = {}
            for m in listing.machines:
                if m.capacity_type == BARE_METAL:
                    continue
                group = cloud_group(provider, m)
                samples.setdefault(group, m)
                if m.id in owners:
                    cloud_current[owners[m.id]][group] += 1
                    if m.state == provider_pb2.MACHINE_STATE_SPECULATIVE:
                        cloud_spare[owners[m.id]][group] += 1
            # The same dealing as the simulator's: quota evenly, bare metal in whole racks.
            dealt = deal([_dealable(provider, m, owners) for m in listing.machines], shards)
            for shard in shards:
                batches = [dealt.cloud.get(shard, [])]
                batches += [ids for _rack, ids in sorted(dealt.racks.get(shard, {}).items())]
                for ids in batches:
                    if not ids:
                        continue
                    taken = await self._store.assign_unowned(shard, provider, ids, term=inp.term)
                    adoptions[shard] += [MachineTarget(i, provider) for i in taken]
            rebalance += self._rebalance(
                provider, shards, everyone, cloud_current, cloud_spare, samples, owned_total
            )
        return co.DistributeResult(
            adoptions=[co.Adoption(s, ms) for s, ms in sorted(adoptions.items()) if ms],
            rebalance=rebalance,
        )

    def _rebalance(
        self,
        provider: str,
        active: list[str],
        everyone: Mapping[str, str],
        current: Mapping[str, Mapping[str, int]],
        spare: Mapping[str, Mapping[str, int]],
        samples: Mapping[str, provider_pb2.Machine],
        owned_total: dict[str, int],
    ) -> list[co.TransferSpec]:
        """Speculative moves for membership changes only.

        A draining shard hands all its speculative quota to active shards; an
        active shard that owns nothing of a quota group (it just joined)
        receives its even share from the shards with the most. Otherwise
        quota stays where shortfall transfers put it — evening it out again
        would undo them. No instruction moves more than ``rebalance_share`` of
        the donor's machines: the donor refuses larger ones (its sanity
        limit), so a draining shard's quota leaves over several rounds.
        """
        out: list[co.TransferSpec] = []
        for group, sample in sorted(samples.items()):
            free = {s: spare.get(s, {}).get(group, 0) for s in everyone}
            target = sum(free.values()) // max(1, len(active))
            wants: dict[str, int] = {}
            for s in active:
                if current.get(s, {}).get(group, 0) == 0 and target > 0:
                    wants[s] = target
            donors = [s for s in sorted(free) if everyone[s] != "active" and free[s] > 0]
            donors += sorted(
                (s for s in active if s not in wants and free[s] > target),
                key=lambda s: -free[s],
            )
            receivers = sorted(wants) or sorted(active, key=lambda s: free[s])
            for donor in donors:
                surplus = free[donor] - (target if everyone[donor] == "active" else 0)
                for receiver in receivers:
                    if receiver == donor or surplus <= 0:
                        continue
                    want = wants.get(receiver, surplus if everyone[donor] != "active" else 0)
                    limit = max(1, int(owned_total.get(donor, 0) * self._rebalance_share))
                    step = min(surplus, want, limit)
                    if step <= 0:
                        continue
                    out.append(
                        co.TransferSpec(
                            kind=co.TransferKind.SPECULATIVE,
                            donor=donor,
                            receiver=receiver,
                            provider=provider,
                            instance_type=sample.instance_type,
                            zone=sample.zone,
                            capacity_type=int(sample.capacity_type),
                            count=step,
                            cluster_id="",
                            need_key=f"rebalance:{group}",
                            priority=0,
                        )
                    )
                    surplus -= step
                    free[donor] -= step
                    # The donor checks each instruction against what it owns then.
                    owned_total[donor] = owned_total.get(donor, 0) - step
                    free[receiver] += step
                    wants[receiver] = wants.get(receiver, 0) - step
        return out

    @activity.defn(name=co.PLAN)
    async def plan(self, inp: co.PlanInput) -> co.PlanResult:
        """Turn the shards' latest reports into transfer instructions and idle offers."""
        result = plan_round(inp, active=await self._store.active_shards())
        COORDINATOR_ROUNDS.labels("planned" if result.transfers else "nothing-to-do").inc()
        return result

    @activity.defn(name=co.PLAN_DECOMMISSION)
    async def plan_decommission(self, inp: co.DecommissionInput) -> co.DecommissionPlan:
        """Which machines each shard gives up (the same share of what it holds there)."""
        client = self._providers.get(inp.provider)
        if client is None:
            raise ApplicationError(
                f"provider: {inp.provider!r} is not configured", non_retryable=True
            )
        if inp.count < 0:
            raise ApplicationError(f"count: {inp.count} is negative", non_retryable=True)
        plan = await plan_decommission(
            self._store, inp.provider, client, label=inp.label, value=inp.value, count=inp.count
        )
        return co.DecommissionPlan(by_shard={s: list(ids) for s, ids in plan.items() if ids})

    @activity.defn(name=co.RECORD_INSTRUCTION)
    async def record_instruction(self, inp: co.InstructionRecord) -> None:
        COORDINATOR_INSTRUCTIONS.labels(inp.kind).inc()
        await self._store.record_instruction(
            term=inp.term,
            seq=inp.seq,
            kind=inp.kind,
            donor=inp.donor,
            receiver=inp.receiver,
            payload=dataclasses.asdict(inp.spec),
        )

    @activity.defn(name=co.FINISH_INSTRUCTION)
    async def finish_instruction(self, inp: co.InstructionOutcome) -> None:
        await self._store.finish_instruction(
            term=inp.term, seq=inp.seq, status=inp.status, outcome=inp.outcome
        )


def _dealable(provider: str, m: provider_pb2.Machine, owners: Mapping[str, str]) -> Dealable:
    """A listed machine as ``shard_engine.dealing`` sees it."""
    return Dealable(
        machine_id=m.id,
        provider=provider,
        zone=m.zone,
        instance_type=m.instance_type,
        capacity_type=int(m.capacity_type),
        rack=rack_of(m.labels, m.zone, LABEL_RACK) if m.capacity_type == BARE_METAL else "",
        speculative=m.state == provider_pb2.MACHINE_STATE_SPECULATIVE,
        owner=owners.get(m.id, ""),
    )


def _without_shortfalls(report: co.ShardReport) -> co.ShardReport:
    return co.ShardReport(
        report.shard_id,
        report.epoch,
        report.sent_at,
        report.total_machines,
        report.profiles,
        [],
        report.highest_term_seen,
    )


def plan_round(inp: co.PlanInput, *, active: Collection[str]) -> co.PlanResult:
    """One round's plan from the shards' latest reports (pure; the plan activity's body).

    A shard that is not ``active`` (draining) takes nothing new: its
    shortfalls wait and it is offered nothing, but its machines are planned
    and offered to the others like any shard's. ``idle`` is every shard's
    idle machines on offer, once; each of ``receivers`` (the active shards
    that reported) is offered those of the others (ADR 0129).
    """
    views = {
        r.shard_id: shard_view(r if r.shard_id in active else _without_shortfalls(r))
        for r in inp.reports
    }
    planned = plan_transfers(views, max_share=inp.max_share)
    return co.PlanResult(
        transfers=planned,
        idle=[
            co.IdleOffer(o.shard_id, dict(o.labels), dict(o.allocatable), o.count, o.speculative)
            for o in offered_idle(views, planned=planned, max_share=inp.max_share)
        ],
        receivers=sorted(set(active) & views.keys()),
    )


def shard_view(report: co.ShardReport) -> ShardView:
    """A shard's report as the planner reads it.

    A profile's rack is its :data:`DOMAIN_LABEL` (the shard groups its
    supply by it), so a gang's machines are planned and released inside
    one rack, as the simulator's coordinator plans them.
    """
    return ShardView(
        shard_id=report.shard_id,
        total_machines=report.total_machines,
        supply=tuple(
            ProfileSupply(
                provider=p.provider,
                instance_type=p.instance_type,
                zone=p.zone,
                capacity_type=p.capacity_type,
                labels=p.labels,
                allocatable=p.allocatable,
                idle=p.idle,
                speculative=p.speculative,
                configured_by_priority={int(k): v for k, v in p.configured_by_priority.items()},
                domain=p.labels.get(DOMAIN_LABEL, ""),
            )
            for p in report.profiles
        ),
        shortfalls=tuple(
            ShardShortfall(
                cluster_id=s.cluster_id,
                need_key=s.need_key,
                priority=s.priority,
                deficit=s.deficit,
                requirements=requirements_from(s.requirements),
                min_unit=s.min_unit,
                age_cycles=s.age_cycles,
                escalated=s.escalated,
                awaiting_idle=awaits_idle(s.reason),
            )
            for s in report.shortfalls
        ),
    )


__all__ = ["CoordinatorActivities", "cloud_group", "plan_round", "shard_view"]
