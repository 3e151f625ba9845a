"""Outcome recording: a finished operation's result, persisted and folded back into the shard.

    workflow activity (record_outcomes for a batch, record_machine for one machine)
      -> Store.record_operation     ownership row + assignment log; compare-and-set on
                                    (epoch, operation sequence), so a repeat is a no-op
      -> ShardState.settle          the machine leaves the engine's in-flight marks,
                                    the operator sees the new state

An outcome that says FAILED is declared to the lifecycle, so observations keep
the machine FAILED in the engine while the provider still reports it in motion.
A ``LeaseLost`` from the store means another process holds the shard now: this
one stops acting and the activity fails with
:class:`~activities.context.ShardInactive`.
"""

from __future__ import annotations

import logging

from bigfleet.attribution import META_NEED
from bigfleet.shard import telemetry
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.state import ShardState
from bigfleet.store import LeaseLost, Store
from shard_engine.engine import ShardEngine
from workflows.contracts import (
    CONFIGURED,
    FAILED,
    OP_CONFIGURE,
    OP_DELETE,
    OP_PROVISION,
    SPECULATIVE,
    MachineOutcome,
    RecordMachineInput,
    RecordOutcomesInput,
)

log = logging.getLogger(__name__)

__all__ = ["OutcomeRecorder"]

# The state each batch operation is meant to reach; anything else is recorded as its failure.
_TARGET_STATE = {OP_PROVISION: CONFIGURED, OP_CONFIGURE: CONFIGURED, OP_DELETE: SPECULATIVE}


class OutcomeRecorder:
    """Persists finished operations and settles their machines in the engine."""

    def __init__(
        self,
        store: Store,
        *,
        lease: LeaseKeeper,
        state: ShardState[ShardEngine],
    ) -> None:
        self._store = store
        self._lease = lease
        self._state = state

    async def record_outcomes(self, outcome: RecordOutcomesInput) -> None:
        """Persist and settle every machine of a finished batch (idempotent)."""
        for result in outcome.outcomes:
            if result.state == FAILED:
                telemetry.record_failed_outcome(outcome.operation)
            configured = result.state == CONFIGURED
            reached = result.state == _TARGET_STATE.get(outcome.operation, result.state)
            await self._persist(
                result,
                cluster_id=outcome.cluster_id if configured else None,
                operation=outcome.operation
                if reached and result.state != FAILED
                else f"{outcome.operation}-failed",
                operation_seq=outcome.operation_seq,
                shard_metadata={META_NEED: outcome.need_key} if configured else {},
                detail=result.last_error,
            )
            if self._state.is_leaving(result.machine_id):
                continue
            self._settle(result, cluster_hint=outcome.cluster_id)

    async def record_machine(self, record: RecordMachineInput) -> None:
        """Persist and settle one machine's finished operation (idempotent).

        Also forgets any blocked-drain report for the machine, and with
        ``quarantine`` stops using the machine.
        """
        result = record.outcome
        if result.state == FAILED:
            telemetry.record_failed_outcome(record.operation)
        reason = result.last_error or record.note
        if record.persist:
            bound = record.cluster_id if record.succeeded else ""
            await self._persist(
                result,
                cluster_id=bound or None,
                operation=record.operation if record.succeeded else f"{record.operation}-failed",
                operation_seq=record.operation_seq,
                shard_metadata={META_NEED: record.need_key} if bound and record.need_key else {},
                detail=reason,
            )
        if record.quarantine:
            # Written before any in-memory change, so a retry of this activity
            # after a store failure replays the whole step.
            await self._store.quarantine(result.machine_id, self._lease.shard_id, reason)
        self._state.lifecycle.settled(result.machine_id)
        self._settle(result, cluster_hint=record.cluster_id)
        if record.quarantine:
            self._state.quarantine(result.machine_id, reason)

    async def _persist(
        self,
        result: MachineOutcome,
        *,
        cluster_id: str | None,
        operation: str,
        operation_seq: int,
        shard_metadata: dict[str, str],
        detail: str,
    ) -> None:
        """One ownership write; ``LeaseLost`` stops this process acting."""
        try:
            await self._store.record_operation(
                machine_id=result.machine_id,
                shard_id=self._lease.shard_id,
                shard_epoch=self._lease.epoch,
                provider=result.provider,
                cluster_id=cluster_id,
                operation=operation,
                operation_seq=operation_seq,
                shard_metadata=shard_metadata,
                detail=detail,
            )
        except LeaseLost as err:
            raise self._lease.lost(err) from err

    def _settle(self, result: MachineOutcome, *, cluster_hint: str) -> None:
        """Take the machine out of the engine's in-flight marks, with its outcome's state."""
        self._state.settle(
            result.machine_id,
            self._state.machine(result.machine_id),
            failed=result.last_error if result.state == FAILED else None,
            cluster_hint=cluster_hint,
        )
