"""Activities that reach the shard itself: its operator sessions, inventory and store.

    notify_reclaim        ReclaimInstruction on the cluster's session (best effort)
    start_recoveries      a batch hands each failed machine to its own workflow
    report_blocked_drain  a preemption drain past its grace becomes a shortfall
    record_machine        one machine's outcome -> Postgres (CAS on the operation
                          sequence) -> engine.settle, exactly once

All of them refuse to act for a shard that lost its lease or was fenced
(``LeaseLost``); the workflows wait that out on a durable timer. Recording
refuses retryably instead (``NotLeaseHolder``): it is retried until the
process holding the lease records it (ADR 0101).
"""

from __future__ import annotations

from temporalio import activity

from activities.context import (
    ShardContext,
    ShardInactive,
    ensure_active,
    ensure_holder,
    not_holder,
)
from workflows import contracts as c


class ShardActivities:
    """Shard-facing activities, bound to one shard process's context."""

    def __init__(self, ctx: ShardContext) -> None:
        self._ctx = ctx

    def _ensure_active(self) -> None:
        ensure_active(self._ctx)

    @activity.defn(name=c.NOTIFY_RECLAIM)
    async def notify_reclaim(self, inp: c.NotifyReclaimInput) -> c.ReclaimDelivery:
        """Tell the cluster's operator to drain the nodes (node name = machine id)."""
        self._ensure_active()
        return c.ReclaimDelivery(self._ctx.send_reclaim(inp))

    @activity.defn(name=c.REPORT_BLOCKED_DRAIN)
    async def report_blocked_drain(self, inp: c.BlockedDrain) -> None:
        """Keep a blocked preemption drain as a shortfall for the coordinator."""
        self._ensure_active()
        self._ctx.report_blocked_drain(inp)

    @activity.defn(name=c.START_RECOVERIES)
    async def start_recoveries(self, inp: c.StartRecoveriesInput) -> c.StartedWorkflows:
        """Start a RecoverWorkflow per failed machine; a repeat finds the same runs."""
        self._ensure_active()
        ids = [await self._ctx.start_recovery(r) for r in inp.recoveries]
        return c.StartedWorkflows(ids)

    @activity.defn(name=c.RECORD_MACHINE)
    async def record_machine(self, inp: c.RecordMachineInput) -> None:
        """Persist one machine's outcome and fold it into the live inventory, exactly once.

        A process that may not act refuses retryably (``NotLeaseHolder``), so
        the attempt is repeated until the lease holder records it.
        """
        ensure_holder(self._ctx)
        try:
            await self._ctx.record_machine(inp)
        except ShardInactive as err:
            raise not_holder(err) from err
