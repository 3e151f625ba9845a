"""A pause shows in the Temporal UI: work still finishing lists under BigFleetShardMode='paused'.

Real Temporal dev server (its visibility store answers the list queries),
real PostgreSQL for the control, the real workflows and activities over the
fake provider. A drain started by the shard's executor is held mid-way (the
provider never finishes it); an operator pauses the shard in PostgreSQL;
the shard's next control read marks the drain, and resuming marks it
active again. Deadlines bound the waits; nothing is timed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from bigfleet import temporal
from bigfleet.shard.executor import Executor
from bigfleet.shard.gate import Adoption, Modes
from bigfleet.shard.marks import ModeMarker
from bigfleet.shard.sequences import OperationSequences
from bigfleet.store import Database
from bigfleet.store.controls import ControlStore
from shard_engine.engine import ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState
from tests.ports import free_port
from tests.waiting import eventually
from tests.workflows.harness import PROVIDER
from tests.workflows.rig import FAST_POLL, Rig, rig_for
from workflows import search_attributes as sa
from workflows.contracts import DeadlinePolicy, Deadlines

SHARD = "shard-t"


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    env = await temporal.start_dev_server(port=free_port(), ui=False)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
async def controls(empty_database_url: str) -> AsyncIterator[ControlStore]:
    db = Database.connect(empty_database_url)
    await db.migrate()
    try:
        yield ControlStore(db.engine)
    finally:
        await db.close()


def _record(machine_id: str) -> MachineRecord:
    return MachineRecord(
        id=machine_id,
        state=MachineState.CONFIGURED,
        provider=PROVIDER,
        instance_type="m6i.large",
        zone="z1",
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=0.1,
        interruption_probability=0.0,
        allocatable={"cpu": 2.0},
        cluster="c1",
    )


async def _listed(env: WorkflowEnvironment, query: str) -> list[str] | None:
    found = [w.id async for w in env.client.list_workflows(query)]
    return found or None


async def _marked(env: WorkflowEnvironment, wf_id: str, mode: str) -> bool | None:
    handle = env.client.get_workflow_handle(wf_id)
    return (await handle.describe()).typed_search_attributes.get(sa.SHARD_MODE) == mode or None


async def test_a_pause_marks_the_work_still_in_flight_and_a_resume_unmarks_it(
    env: WorkflowEnvironment, controls: ControlStore
) -> None:
    async with rig_for(env) as rig:
        await _scenario(env, controls, rig)


async def _scenario(env: WorkflowEnvironment, controls: ControlStore, rig: Rig) -> None:
    rig.fake.step_s = 0.0  # the drain never finishes on its own: it stays in flight
    modes = Modes()
    executor = Executor(
        env.client,
        shard_id=SHARD,
        task_queue=rig.task_queue,
        sequences=OperationSequences(),
        deadlines=DeadlinePolicy(Deadlines()),
        poll=FAST_POLL,
        mode=lambda: modes.shard_mode,
    )
    marker = ModeMarker(env.client, shard_id=SHARD, settle_s=0.0)
    adoption = Adoption(
        shard_id=SHARD,
        engine=ShardEngine(),
        modes=modes,
        controls=controls,
        decisions=None,
        marker=marker,
    )
    await adoption.start()
    wf_id = await executor.start_operator_drain(
        _record(rig.configured_machine()), grace_seconds=3600
    )
    await eventually(lambda: _marked(env, wf_id, "active"), within=30, what="started active")
    assert await _listed(env, sa.paused_work_query(SHARD)) is None

    await controls.set(SHARD, paused=True, reason="incident 42", changed_by="test")

    async def refreshed_and_listed() -> list[str] | None:
        await adoption.refresh()  # the cycle loop's read, once per cycle
        return await _listed(env, sa.paused_work_query(SHARD))

    listed = await eventually(refreshed_and_listed, within=60, what="the drain listed as paused")
    assert listed == [wf_id]
    assert await _listed(env, sa.paused_work_query()) == [wf_id]
    assert modes.paused, "the control itself took effect at the first read"
    view = await rig.view(env.client.get_workflow_handle(wf_id))
    assert view.phase == "DRAINING" and any("shard paused (incident 42)" in n for n in view.notes)

    await controls.set(SHARD, paused=False, changed_by="test")

    async def resumed() -> bool | None:
        await adoption.refresh()
        return await _marked(env, wf_id, "active")

    await eventually(resumed, within=60, what="the drain marked active again")
    assert await _listed(env, sa.paused_work_query(SHARD)) is None
    assert marker.marked == 2
    await adoption.close()
    await env.client.get_workflow_handle(wf_id).terminate("test over")
