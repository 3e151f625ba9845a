"""DeleteWorkflow: release one idle cloud machine (Idle -> Deleting -> Speculative).

    provider Delete                 [fenced]   (bare metal: no Delete, it stays idle)
      -> wait for SPECULATIVE       deadline: deleting_s
      -> deadline or provider FAILED: AwaitingOperator (paper §5: "operator
         intervention is usually needed")  retry/force: Delete again ·
         resolve: re-read and continue · abandon: failed, kept out of use
      -> record the outcome once

The steps live in :meth:`MachineWorkflow._release` because a drain may
release its machine afterwards with exactly the same rules.
"""

from __future__ import annotations

from temporalio import workflow

from workflows.contracts import DELETING, OP_DELETE, DeleteInput, MachineResult
from workflows.machine import MachineWorkflow


@workflow.defn(name="DeleteWorkflow")
class DeleteWorkflow(MachineWorkflow):
    """Durable release of one machine; see the module docstring."""

    @workflow.run
    async def run(self, inp: DeleteInput) -> MachineResult:
        self._begin(
            operation=OP_DELETE,
            shard_id=inp.shard_id,
            machine=inp.machine,
            cluster_id="",
            operation_seq=inp.operation_seq,
            priority=0,
            phase=DELETING,
            reason=inp.reason,
        )
        return await self._release(inp.deadlines, inp.poll)
