"""A shard's stop never waits for ever on an activity that ignores its cancellation.

Temporal's worker shutdown cancels running activities after its graceful
timeout, then waits for every one to return. An activity that swallows the
cancellation (a provider call wrapped in ``shield``, a thread) would hold
the stop, and the shard's lease with it, for ever; ``stop_worker`` gives up
after its bound and says so.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bigfleet.temporal import stop_worker
from workflows.registry import workflow_runner

_started = asyncio.Event()
_release = asyncio.Event()
_cancels = 0


@activity.defn(name="stubborn")
async def stubborn() -> str:
    """Runs until released, shrugging off every cancellation it is sent."""
    global _cancels
    _started.set()
    while not _release.is_set():
        try:
            await _release.wait()
        except asyncio.CancelledError:
            _cancels += 1
    return "released"


@activity.defn(name="prompt")
async def prompt() -> str:
    """Ends as soon as it is cancelled."""
    _started.set()
    await asyncio.sleep(3600)
    return "slept"


@workflow.defn(name="StopProbe", sandboxed=False)  # a probe, not product code
class StopProbe:
    @workflow.run
    async def run(self, name: str) -> str:
        return str(
            await workflow.execute_activity(
                name,
                start_to_close_timeout=timedelta(hours=1),
                heartbeat_timeout=None,
            )
        )


async def _running(env: WorkflowEnvironment, name: str) -> tuple[Worker, asyncio.Task[None]]:
    _started.clear()
    _release.clear()
    queue = f"stop-probe-{uuid.uuid4()}"
    worker = Worker(
        env.client,
        task_queue=queue,
        workflows=[StopProbe],
        activities=[stubborn, prompt],
        workflow_runner=workflow_runner(),
        graceful_shutdown_timeout=timedelta(seconds=0.5),
    )
    task = asyncio.create_task(worker.run())
    await env.client.start_workflow(StopProbe.run, name, id=queue, task_queue=queue)
    await asyncio.wait_for(_started.wait(), timeout=60)
    return worker, task


async def test_a_stop_gives_up_on_an_activity_that_ignores_its_cancellation(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    worker, task = await _running(time_skipping_env, "stubborn")
    done = await stop_worker(worker, task, name="probe", within_s=3.0)
    assert done is False
    assert _cancels >= 1, "the activity was never asked to stop"
    assert _started.is_set() and not _release.is_set()  # it is still running: nothing waited
    _release.set()


async def test_a_stop_with_activities_that_answer_their_cancellation_waits_for_them(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    worker, task = await _running(time_skipping_env, "prompt")
    assert await stop_worker(worker, task, name="probe", within_s=30.0) is True
    assert task.done()
