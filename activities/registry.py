"""Every activity a shard's worker serves, bound to that shard's context (wiring in one place)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.context import ShardContext
from activities.machines import MachineActivities
from activities.shard import ShardActivities


def activities_for(ctx: ShardContext) -> list[Callable[..., Any]]:
    """The activity callables to register on a worker for the shard behind ``ctx``."""
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
