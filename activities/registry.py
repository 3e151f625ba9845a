"""Every activity a shard's worker serves, bound to that shard's parts (wiring in one place)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.context import ActiveGuard, ShardContext
from activities.machines import MachineActivities
from activities.membership import MembershipActivities, MembershipContext
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
