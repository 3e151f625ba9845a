"""Every activity BigFleet's workers serve, bound to their process's parts (wiring in one place).

shard_activities        task queue shard-<id>: machine operations, and the shard's
                        halves of coordinator and membership instructions
coordinator_activities  task queue bigfleet-coordinator: distribution, planning,
                        instruction records, decommission and membership planning
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from activities.context import ActiveGuard, ProviderCalls, ShardContext
from activities.coordinator import CoordinatorActivities
from activities.machines import MachineActivities
from activities.membership import MembershipActivities, MembershipContext, MembershipPlanner
from activities.records import CoordinatorStore
from activities.shard import ShardActivities
from activities.transfers import TransferActivities, TransferContext


def activities_for(ctx: ShardContext) -> list[Callable[..., Any]]:
    """The machine workflows' activities, for the shard behind ``ctx``."""
    machines = MachineActivities(ctx)
    shard = ShardActivities(ctx)
    return [
        machines.create_machines,
        machines.configure_machines,
        machines.observe_machines,
        machines.record_outcomes,
        machines.drain_machine,
        machines.delete_machine,
        shard.notify_reclaim,
        shard.report_blocked_drain,
        shard.start_recoveries,
        shard.record_machine,
    ]


def shard_activities(
    ctx: ShardContext,
    *,
    transfers: TransferContext,
    membership: MembershipContext,
    guard: ActiveGuard,
) -> list[Callable[..., Any]]:
    """Every activity a shard process serves on its task queue ``shard-<id>``.

    The machine workflows' activities, and the shard's halves of the
    coordinator's transfer and membership workflows.
    """
    moves = TransferActivities(transfers, guard=guard)
    members = MembershipActivities(membership, guard=guard)
    return [
        *activities_for(ctx),
        moves.release_machines,
        moves.adopt_machines,
        moves.prepare_preemption,
        moves.retire_machines,
        members.release_cluster,
        members.hand_over,
    ]


def coordinator_activities(
    store: CoordinatorStore, providers: Mapping[str, ProviderCalls], *, rebalance_share: float
) -> list[Callable[..., Any]]:
    """Every activity the coordinator process serves on ``bigfleet-coordinator``."""
    acts = CoordinatorActivities(store, providers, rebalance_share=rebalance_share)
    membership = MembershipPlanner(store, providers)
    return [
        acts.distribute,
        acts.plan,
        acts.record_instruction,
        acts.finish_instruction,
        acts.plan_decommission,
        membership.plan_membership,
        membership.record_membership,
    ]
