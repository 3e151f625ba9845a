"""CoordinatorWorkflow on the time-skipping server.

With the scripted shards of the replay histories (``histories/coordinator.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from temporalio.client import WorkflowContinuedAsNewError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment

from bigfleet.temporal import start_time_skipping
from tests.workflows.histories.coordinator import _shards, _workers, report
from workflows import coordinator as co


@pytest.fixture(scope="module")
async def own_env() -> AsyncIterator[WorkflowEnvironment]:
    """A server of its own: the coordinator continues as new into a run that is then
    terminated, and the shared server's clock must not wait on anything it left."""
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()


async def test_a_report_waiting_when_the_coordinator_starts_is_planned_in_its_first_round(
    own_env: WorkflowEnvironment,
) -> None:
    env = own_env
    shards = _shards()
    async with _workers(env, shards):
        handle = await env.client.start_workflow(
            co.CoordinatorWorkflow.run,
            co.CoordinatorInput(term=3, interval_s=30.0, max_share=0.5, rounds_per_run=1),
            id="coordinator-early-report",
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            start_signal="report",
            start_signal_args=[report()],
        )
        with contextlib.suppress(WorkflowContinuedAsNewError):
            await handle.result(follow_runs=False)
        await handle.terminate("done")
    assert shards.calls[:2] == ["distribute 1", "a adopt 1"]
    assert "plan" in shards.calls, "the shortfall that arrived with the start was planned"
    finished = sorted(c for c in shards.calls if c.startswith("finish"))
    # seq 3 the cluster move, 4 the handover, 5 the idle transfer, 6 the preemption
    assert finished == [f"finish {seq} applied" for seq in (3, 4, 5, 6)]
