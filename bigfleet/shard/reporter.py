"""The coordinator reporter: what this shard tells the coordinator every report interval.

    engine machines (not in flight, not promised) -> ProfileReport per (provider,
        instance type, zone, capacity type): idle, speculative, configured by priority
        (bigfleet.shard.supply, the rule the simulator's coordinator reads too)
    blocked preemption drains + the engine's shortfalls -> up to 100 ShortfallReports
        (with the need's requirements and min_unit, from the needs in force)
    -> signal CoordinatorWorkflow.report

When the coordinator is not running the shard carries on alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from temporalio.client import Client
from temporalio.service import RPCError

from bigfleet.shard.convert import requirement_specs
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.state import ShardState
from bigfleet.shard.supply import Held, profile_supply
from bigfleet.shard.terms import CoordinatorTerms
from shard_engine.engine import ShardEngine
from shard_engine.model import Shortfall
from workflows import coordinator as co

log = logging.getLogger(__name__)

__all__ = ["MAX_REPORTED_SHORTFALLS", "CoordinatorReporter"]

MAX_REPORTED_SHORTFALLS = 100


class CoordinatorReporter:
    """Builds and sends this shard's periodic report to the coordinator."""

    def __init__(
        self,
        temporal: Client,
        *,
        lease: LeaseKeeper,
        state: ShardState[ShardEngine],
        terms: CoordinatorTerms,
        clock: Callable[[], float],
    ) -> None:
        self._temporal = temporal
        self._lease = lease
        self._state = state
        self._terms = terms
        self._clock = clock

    def shortfalls(self) -> list[Shortfall]:
        """Preemption drains blocked past their grace first, then the engine's shortfalls."""

        def allocatable(machine_id: str) -> Mapping[str, float]:
            record = self._state.engine.machine(machine_id)
            return record.allocatable if record is not None else {}

        blocked = self._state.lifecycle.shortfalls(now=self._clock(), deficit_of=allocatable)
        return [*blocked, *self._state.engine.shortfalls()]

    def build_report(self) -> co.ShardReport:
        """Summary + up to 100 shortfalls for the coordinator."""
        engine = self._state.engine
        busy = self._state.busy()
        records = list(engine.machines())
        supply = profile_supply(
            Held(
                sample=r,
                state=r.state,
                bound=bool(r.cluster),
                priority=self._state.priority(r.id),
                busy=r.id in busy,
            )
            for r in records
        )
        profiles = [
            co.ProfileReport(
                provider=p.provider,
                instance_type=p.instance_type,
                zone=p.zone,
                capacity_type=p.capacity_type,
                labels=dict(p.labels),
                allocatable=dict(p.allocatable),
                idle=p.idle,
                speculative=p.speculative,
                configured_by_priority={str(k): v for k, v in p.configured_by_priority.items()},
            )
            for p in supply
        ]
        shortfalls = []
        for sf in self.shortfalls()[:MAX_REPORTED_SHORTFALLS]:
            need = self._state.need(sf.cluster_id, sf.need_key)
            shortfalls.append(
                co.ShortfallReport(
                    cluster_id=sf.cluster_id,
                    need_key=sf.need_key,
                    priority=sf.priority,
                    deficit=dict(sf.deficit),
                    requirements=requirement_specs(need.requirements) if need else [],
                    min_unit=dict(need.min_unit) if need else {},
                    age_cycles=sf.age_cycles,
                    escalated=sf.escalated,
                    reason=sf.reason,
                )
            )
        return co.ShardReport(
            shard_id=self._lease.shard_id,
            epoch=self._lease.epoch,
            sent_at=self._clock(),
            total_machines=len(records),
            profiles=profiles,
            shortfalls=shortfalls,
            highest_term_seen=self._terms.highest,
        )

    async def send_report(self) -> bool:
        """Signal the coordinator; False when it is not running (shards carry on alone)."""
        try:
            handle = self._temporal.get_workflow_handle(co.COORDINATOR_ID)
            await handle.signal(co.CoordinatorWorkflow.report, self.build_report())
        except RPCError as err:
            log.debug("coordinator unreachable (%s); carrying on alone", err)
            return False
        return True
