"""Shard-side halves of coordinator instructions: release machines, adopt machines.

Both check the coordinator's term first: an instruction from a term lower
than the highest this shard has seen comes from a zombie coordinator and is
refused (and the refusal is the instruction's outcome, not an error).
"""

from __future__ import annotations

from typing import Protocol

from temporalio import activity

from activities.context import ActiveGuard, ensure_active
from workflows import coordinator_contracts as co


class TransferContext(Protocol):
    """What the shard process offers for coordinator instructions."""

    async def release_machines(self, inp: co.ReleaseInput) -> co.ReleaseResult: ...

    async def adopt_machines(self, inp: co.AdoptInput) -> co.AdoptResult: ...

    async def prepare_preemption(self, inp: co.ReleaseInput) -> co.PreemptionPlan: ...

    async def retire_machines(self, inp: co.RetireInput) -> co.RetireResult: ...


class TransferActivities:
    """The shard's half of coordinator instructions, refused while the shard may not act."""

    def __init__(self, ctx: TransferContext, *, guard: ActiveGuard) -> None:
        self._ctx = ctx
        self._guard = guard

    def _ensure_active(self) -> None:
        ensure_active(self._guard)

    @activity.defn(name=co.RELEASE_MACHINES)
    async def release_machines(self, inp: co.ReleaseInput) -> co.ReleaseResult:
        """Give unbound machines of one profile to another shard (CAS in PostgreSQL)."""
        self._ensure_active()
        return await self._ctx.release_machines(inp)

    @activity.defn(name=co.PREPARE_PREEMPTION)
    async def prepare_preemption(self, inp: co.ReleaseInput) -> co.PreemptionPlan:
        """Pick lower-priority victims for another shard's need and prepare their drains."""
        self._ensure_active()
        return await self._ctx.prepare_preemption(inp)

    @activity.defn(name=co.RETIRE_MACHINES)
    async def retire_machines(self, inp: co.RetireInput) -> co.RetireResult:
        """Take machines of a decommissioned domain out of use for good."""
        self._ensure_active()
        return await self._ctx.retire_machines(inp)

    @activity.defn(name=co.ADOPT_MACHINES)
    async def adopt_machines(self, inp: co.AdoptInput) -> co.AdoptResult:
        """Take ownership of machines PostgreSQL now records as this shard's."""
        self._ensure_active()
        return await self._ctx.adopt_machines(inp)


__all__ = ["TransferActivities", "TransferContext"]
