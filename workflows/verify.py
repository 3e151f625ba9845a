"""VerifyWorkflow: is a configured machine its cluster stopped reporting still alive?

One provider read, one record. Alive (CONFIGURED) clears the engine's
suspicion; anything else (FAILED, gone, unbound) is recorded as it is, so
the engine replaces the machine on its next cycle (DESIGN §3, health).
It has its own workflow so a verification is as visible as any other
operation on a machine, and costs two activities.
"""

from __future__ import annotations

from temporalio import workflow

from workflows import search_attributes as sa
from workflows.contracts import (
    CONFIGURED,
    OP_VERIFY,
    REASON_VERIFY_FAILED,
    MachineResult,
    VerifyInput,
)
from workflows.machine import MachineWorkflow

VERIFYING = "VERIFYING"
# Verifications started before a failed one carried a reason set no BigFleetReason;
# the patch keeps their histories replaying.
VERIFY_REASON_PATCH = "verify-failed-reason"


@workflow.defn(name="VerifyWorkflow")
class VerifyWorkflow(MachineWorkflow):
    """Durable health check of one machine; see the module docstring."""

    @workflow.run
    async def run(self, inp: VerifyInput) -> MachineResult:
        self._begin(
            operation=OP_VERIFY,
            shard_id=inp.shard_id,
            machine=inp.machine,
            cluster_id=inp.cluster_id,
            operation_seq=inp.operation_seq,
            priority=0,
            phase=VERIFYING,
        )
        seen = await self._observe()
        alive = seen.state == CONFIGURED
        if not alive:
            # The machine is replaced by the engine's next cycle; the reason makes
            # that replacement findable (BigFleetReason = 'verify-failed').
            self._view.reason = REASON_VERIFY_FAILED
            if workflow.patched(VERIFY_REASON_PATCH):
                workflow.upsert_search_attributes([sa.REASON.value_set(REASON_VERIFY_FAILED)])
        return await self._finish(
            seen.state,
            succeeded=alive,
            last_error="" if alive else seen.last_error or f"provider reports {seen.state}",
            cluster_id=inp.cluster_id if alive else "",
            note="alive" if alive else "not alive; the engine replaces it",
            persist=not alive,
        )
