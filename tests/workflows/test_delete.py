"""DeleteWorkflow (release) and VerifyWorkflow on the time-skipping server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from providers.fake import default_fake_config
from tests.workflows.harness import PROVIDER
from tests.workflows.rig import Rig, delete_input, next_seq, rig_for
from workflows import search_attributes as sa
from workflows.contracts import (
    CONFIGURED,
    FAILED,
    IDLE,
    REASON_VERIFY_FAILED,
    SPECULATIVE,
    Deadlines,
    EscalateSignal,
    MachineTarget,
    ResolveSignal,
    VerifyInput,
)
from workflows.delete import DeleteWorkflow
from workflows.verify import VerifyWorkflow


@pytest.fixture
async def rig(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Rig]:
    async with rig_for(time_skipping_env) as rig:
        yield rig


async def test_an_idle_cloud_machine_is_released_to_speculative(rig: Rig) -> None:
    rig.fake.step_s = 5.0
    machine_id = rig.idle_machine()
    handle = await rig.start(DeleteWorkflow.run, delete_input(machine_id))
    result = await rig.result(handle)
    assert result.state == SPECULATIVE and result.succeeded
    (call,) = rig.fake.calls_to("delete")
    assert call.args["token"].shard_id == "shard-t"
    (record,) = rig.ctx.records
    assert (record.operation, record.outcome.state, record.succeeded) == (
        "delete",
        SPECULATIVE,
        True,
    )
    attrs = (await handle.describe()).typed_search_attributes
    assert attrs.get(sa.OPERATION) == "delete" and attrs.get(sa.PHASE) == SPECULATIVE


async def test_bare_metal_has_no_delete_and_stays_idle(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    async with rig_for(time_skipping_env, config=default_fake_config("bare-metal")) as rig:
        machine_id = rig.idle_machine()
        result = await rig.result(await rig.start(DeleteWorkflow.run, delete_input(machine_id)))
        assert result.state == IDLE and result.succeeded
        assert "no Delete" in result.note
        assert rig.ctx.records[0].outcome.state == IDLE


async def test_a_delete_past_its_deadline_holds_for_an_operator_until_resolved(rig: Rig) -> None:
    rig.fake.step_s = 0.0  # the termination hangs
    machine_id = rig.idle_machine()
    handle = await rig.start(
        DeleteWorkflow.run, delete_input(machine_id, deadlines=Deadlines(deleting_s=600))
    )
    await rig.advance(900)
    view = await rig.until(handle, lambda v: v.awaiting_operator, what="AwaitingOperator")
    assert "deleting exceeded its deadline of 600 s" in view.last_error
    assert "DELETING" in view.last_error
    assert rig.ctx.records == []

    await handle.signal(DeleteWorkflow.escalate, EscalateSignal(0))
    view = await rig.until(
        handle, lambda v: any("does not apply" in n for n in v.notes), what="escalate ignored"
    )
    await handle.signal(DeleteWorkflow.retry)
    view = await rig.until(handle, lambda v: v.attempts == 2, what="a second Delete")
    assert len(rig.fake.calls_to("delete")) == 2
    assert len(view.provider_operation_ids) == 1, "the provider kept its termination"

    rig.fake.advance(60)  # the termination went through
    await handle.signal(DeleteWorkflow.resolve, ResolveSignal("terminated in the console"))
    result = await rig.result(handle)
    assert result.state == SPECULATIVE and result.succeeded


async def test_an_abandoned_delete_marks_the_machine_failed(rig: Rig) -> None:
    rig.fake.step_s = 0.0
    machine_id = rig.idle_machine()
    handle = await rig.start(
        DeleteWorkflow.run, delete_input(machine_id, deadlines=Deadlines(deleting_s=60))
    )
    await rig.advance(300)
    await rig.until(handle, lambda v: v.awaiting_operator, what="AwaitingOperator")
    await handle.signal(DeleteWorkflow.abandon)
    result = await rig.result(handle)
    assert result.state == FAILED and "abandoned" in result.last_error
    assert rig.ctx.records[0].quarantine


async def test_releasing_a_machine_that_got_configured_meanwhile_leaves_it_alone(
    rig: Rig,
) -> None:
    machine_id = rig.configured_machine()
    result = await rig.result(await rig.start(DeleteWorkflow.run, delete_input(machine_id)))
    assert result.state == CONFIGURED and not result.succeeded
    assert rig.fake.calls_to("delete") and (await rig.fake.get(machine_id)).cluster == "c1"


def _verify(machine_id: str) -> VerifyInput:
    return VerifyInput("shard-t", MachineTarget(machine_id, PROVIDER), "c1", next_seq())


async def test_verify_finds_a_configured_machine_alive_and_changes_nothing_durable(
    rig: Rig,
) -> None:
    machine_id = rig.configured_machine()
    handle = await rig.start(VerifyWorkflow.run, _verify(machine_id))
    result = await rig.result(handle)
    assert result.state == CONFIGURED and result.succeeded
    assert (await handle.describe()).typed_search_attributes.get(sa.REASON) is None
    (record,) = rig.ctx.records
    assert record.operation == "verify" and not record.persist


async def test_verify_reports_a_vanished_machine_as_failed(rig: Rig) -> None:
    handle = await rig.start(VerifyWorkflow.run, _verify("no-such-machine"))
    result = await rig.result(handle)
    assert result.state == FAILED and not result.succeeded
    attrs = (await handle.describe()).typed_search_attributes
    assert attrs.get(sa.REASON) == REASON_VERIFY_FAILED
    (record,) = rig.ctx.records
    assert record.persist and record.outcome.state == FAILED
