"""A deliberately incompatible DrainWorkflow for the replay test (kept out of the test
module, which the workflow sandbox would otherwise re-import with its file access)."""

from __future__ import annotations

from temporalio import workflow

from workflows.contracts import DrainInput, MachineResult
from workflows.drain import DrainWorkflow


@workflow.defn(name="DrainWorkflow")
class DrainWithAnExtraTimer(DrainWorkflow):
    """A 'harmless' pause before draining: a command the recorded history never saw."""

    @workflow.run
    async def run(self, inp: DrainInput) -> MachineResult:
        await workflow.sleep(1)
        return await super().run(inp)
