"""ProvisionWorkflow on the time-skipping server, with its real activities."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.context import BootstrapBlob
from activities.registry import activities_for
from bigfleet.v1alpha1 import provider_pb2
from providers.errors import Fenced
from providers.model import FencingToken
from tests.workflows.harness import PROVIDER, AdvancingProvider, HarnessContext
from workflows.contracts import (
    CONFIGURED,
    FAILED,
    IDLE,
    Deadlines,
    MachineTarget,
    ProvisionInput,
    ProvisionResult,
    RequirementSpec,
)
from workflows.provision import ProvisionWorkflow
from workflows.recover import RecoverWorkflow
from workflows.registry import ALL_WORKFLOWS


@dataclass
class Rig:
    client: Client
    env: WorkflowEnvironment
    ctx: HarnessContext
    fake: AdvancingProvider
    task_queue: str

    async def run(self, inp: ProvisionInput, *, wf_id: str | None = None) -> ProvisionResult:
        return await self.client.execute_workflow(
            ProvisionWorkflow.run,
            inp,
            id=wf_id or f"provision-{uuid.uuid4()}",
            task_queue=self.task_queue,
        )


@pytest.fixture
async def rig(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Rig]:
    fake = AdvancingProvider()
    queue = f"tq-{uuid.uuid4()}"
    ctx = HarnessContext(fake, client=time_skipping_env.client, task_queue=queue)
    async with Worker(
        time_skipping_env.client,
        task_queue=queue,
        workflows=list(ALL_WORKFLOWS),
        activities=activities_for(ctx),
    ):
        yield Rig(time_skipping_env.client, time_skipping_env, ctx, fake, queue)


def _inp(machine_ids: list[str], **kw: object) -> ProvisionInput:
    base: dict[str, object] = {
        "shard_id": "shard-t",
        "cluster_id": "c1",
        "need_key": "need-1",
        "priority": 500_000,
        "operation_seq": 1,
        "machines": [MachineTarget(m, PROVIDER) for m in machine_ids],
        "requirements": [RequirementSpec("topology.kubernetes.io/zone", 1, ["zone-a"])],
    }
    base.update(kw)
    return ProvisionInput(**base)  # type: ignore[arg-type]


def _idle_machine(fake: AdvancingProvider) -> str:
    machine = fake.speculative()[0]
    fake.provider.create(machine.id, FencingToken("setup", 1, 1))
    fake.advance(3600)
    return machine.id


async def test_a_batch_is_created_configured_and_recorded(rig: Rig) -> None:
    rig.fake.step_s = 45.0
    ids = [m.id for m in rig.fake.speculative()[:3]]
    result = await rig.run(_inp(ids))
    assert sorted(result.configured) == sorted(ids)
    for mid in ids:
        machine = await rig.fake.get(mid)
        assert machine.state == provider_pb2.MACHINE_STATE_CONFIGURED
        assert machine.cluster == "c1"
        assert machine.shard_metadata["bigfleet.io/need"] == "need-1"
    (recorded,) = rig.ctx.recorded
    assert recorded.operation == "provision" and {o.state for o in recorded.outcomes} == {
        CONFIGURED
    }
    # The blob reached the provider; the operator was asked with the need's requirements.
    configure_calls = rig.fake.calls_to("configure")
    assert {c.args["bootstrap_blob"] for c in configure_calls} == {b"join-token"}
    assert rig.ctx.bootstrap_requests[0][1][0].key == "topology.kubernetes.io/zone"


async def test_every_provider_mutation_carries_a_fresh_fencing_token(rig: Rig) -> None:
    rig.fake.step_s = 45.0
    ids = [m.id for m in rig.fake.speculative()[:2]]
    await rig.run(_inp(ids))
    mutations = rig.fake.calls_to("create") + rig.fake.calls_to("configure")
    tokens = [c.args["token"] for c in mutations]
    assert len(tokens) == 4
    assert all(t.shard_id == "shard-t" and t.epoch == 3 for t in tokens)
    assert len({t.sequence for t in tokens}) == len(tokens), "a sequence number was reused"


async def test_a_configuring_machine_past_its_deadline_is_handed_to_its_own_workflow(
    rig: Rig,
) -> None:
    machine_id = _idle_machine(rig.fake)
    rig.fake.step_s = 0.0  # the provider never finishes configuring
    deadlines = Deadlines(configuring_s=6 * 3600)
    result = await rig.run(_inp([machine_id], create=False, deadlines=deadlines))
    (outcome,) = result.outcomes
    assert outcome.state == FAILED
    assert "configuring exceeded its deadline of 21600 s" in outcome.last_error
    assert "CONFIGURING" in outcome.last_error
    assert result.handed_off == [machine_id]
    assert rig.ctx.recorded == [], "the batch leaves the failed machine to its own workflow"

    # The machine's own workflow waits one more deadline, then parks for an operator.
    child = rig.client.get_workflow_handle(f"shard-t/recover/{machine_id}/1")
    await rig.env.sleep(6 * 3600 + 600)
    view = await child.query(RecoverWorkflow.view)
    assert view.awaiting_operator and view.machine_id == machine_id
    assert "still CONFIGURING" in view.last_error
    await child.signal(RecoverWorkflow.abandon)
    await child.result()
    (record,) = rig.ctx.records
    assert record.outcome.state == FAILED and record.quarantine and record.operation_seq == 1


async def test_a_fenced_create_stops_the_workflow_and_tells_the_shard(rig: Rig) -> None:
    rig.fake.step_s = 45.0
    ids = [m.id for m in rig.fake.speculative()[:2]]
    rig.fake.next_error_for["create"] = Fenced("a newer epoch was seen for this machine")
    with pytest.raises(WorkflowFailureError) as caught:
        await rig.run(_inp(ids))
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "Fenced"
    assert rig.ctx.fenced, "the shard must learn it was fenced"
    assert rig.ctx.recorded == [], "a fenced shard records nothing"


async def test_a_bootstrap_error_leaves_machines_idle_with_the_reason(rig: Rig) -> None:
    machine_id = _idle_machine(rig.fake)
    rig.ctx.bootstrap = BootstrapBlob(b"", 0, "kubelet 1.20 is outside the skew window")
    result = await rig.run(_inp([machine_id], create=False))
    (outcome,) = result.outcomes
    assert outcome.state == IDLE
    assert "skew window" in outcome.last_error
    assert rig.fake.calls_to("configure") == []
    assert (await rig.fake.get(machine_id)).state == provider_pb2.MACHINE_STATE_IDLE


async def test_starting_the_same_operation_twice_runs_it_once(rig: Rig) -> None:
    rig.fake.step_s = 45.0
    ids = [rig.fake.speculative()[0].id]
    wf_id = f"shard-t/provision/{ids[0]}/1"
    first = await rig.client.start_workflow(
        ProvisionWorkflow.run,
        _inp(ids),
        id=wf_id,
        task_queue=rig.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    second = await rig.client.start_workflow(
        ProvisionWorkflow.run,
        _inp(ids),
        id=wf_id,
        task_queue=rig.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    assert first.result_run_id == second.result_run_id
    await first.result()
    assert len(rig.fake.calls_to("create")) == 1


async def test_a_batch_waits_out_a_lease_outage_mid_way_and_still_configures(rig: Rig) -> None:
    """Created, then the shard stops acting: the batch waits (durable timer) instead of
    failing, and carries on with the process that acts next."""
    rig.fake.step_s = 45.0
    ids = [m.id for m in rig.fake.speculative()[:2]]
    rig.ctx.outage_after_create = 3
    handle = await rig.client.start_workflow(
        ProvisionWorkflow.run, _inp(ids), id=f"provision-{uuid.uuid4()}", task_queue=rig.task_queue
    )
    result = await handle.result()
    assert sorted(result.configured) == sorted(ids)
    view = await handle.query("view")
    assert view["lease_waits"] == 3
    (recorded,) = rig.ctx.recorded
    assert {o.machine_id for o in recorded.outcomes} == set(ids)


async def test_a_configured_batch_is_recorded_even_when_recording_meets_a_lost_lease(
    rig: Rig,
) -> None:
    """The provider action succeeded; the store refused the old epoch twice. The record
    activity is retried until it lands, and the batch never ends FAILED."""
    rig.fake.step_s = 45.0
    ids = [m.id for m in rig.fake.speculative()[:2]]
    rig.ctx.refuse_records = 2
    result = await rig.run(_inp(ids))
    assert sorted(result.configured) == sorted(ids)
    (recorded,) = rig.ctx.recorded
    assert {o.state for o in recorded.outcomes} == {CONFIGURED}
    assert rig.ctx.refuse_records == 0
