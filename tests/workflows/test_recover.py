"""A batch hands each failed machine to its own RecoverWorkflow: the corrective actions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.context import BootstrapBlob
from providers.config import ProviderConfig
from providers.errors import InvalidTransition
from tests.workflows.harness import PROVIDER
from tests.workflows.rig import FAST_POLL, Rig, next_seq, rig_for
from workflows import search_attributes as sa
from workflows.contracts import (
    CONFIGURED,
    CREATING,
    FAILED,
    IDLE,
    Deadlines,
    MachineTarget,
    ProvisionInput,
    ProvisionResult,
    RequirementSpec,
    ResolveSignal,
)
from workflows.provision import ProvisionWorkflow
from workflows.recover import RecoverWorkflow


def _config(**rates: float) -> ProviderConfig:
    return ProviderConfig(
        kind="sim-cloud",
        quota_scale=0.1,
        interruption_scale=0.0,
        error_rate=dict(rates),
    )


@pytest.fixture
async def rig(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Rig]:
    async with rig_for(time_skipping_env) as rig:
        yield rig


def _provision(machine_ids: list[str], *, create: bool = True, **kw: Any) -> ProvisionInput:
    seq = next_seq()
    _last_seq[machine_ids[0]] = seq
    return ProvisionInput(
        shard_id="shard-t",
        cluster_id="c1",
        need_key="need-1",
        priority=500_000,
        operation_seq=seq,
        machines=[MachineTarget(m, PROVIDER) for m in machine_ids],
        requirements=[RequirementSpec("topology.kubernetes.io/zone", 1, ["zone-a"])],
        create=create,
        poll=FAST_POLL,
        **kw,
    )


async def _batch(rig: Rig, inp: ProvisionInput) -> ProvisionResult:
    handle = await rig.start(ProvisionWorkflow.run, inp, wf_id=f"batch-{uuid.uuid4()}")
    result = await handle.result()
    assert isinstance(result, ProvisionResult)
    return result


_last_seq: dict[str, int] = {}


def _recovery(rig: Rig, machine_id: str) -> WorkflowHandle[Any, Any]:
    """The recovery a batch started for ``machine_id`` (id from the batch's sequence)."""
    seq = _last_seq[machine_id]
    return rig.client.get_workflow_handle_for(
        RecoverWorkflow.run, f"shard-t/recover/{machine_id}/{seq}"
    )


async def test_a_create_the_provider_fails_for_capacity_marks_the_slot_bad(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    async with rig_for(time_skipping_env, config=_config(create=1.0)) as rig:
        rig.fake.step_s = 45.0
        failing, fine = (m.id for m in rig.fake.speculative()[:2])
        rig.fake.next_error_for.clear()
        batch = await _batch(rig, _provision([failing]))
        assert batch.handed_off == [failing]
        assert rig.ctx.recorded == [], "the batch does not settle a machine it handed off"

        result = await rig.result(_recovery(rig, failing))
        assert result.state == FAILED and not result.succeeded
        assert "InsufficientInstanceCapacity" in result.last_error
        (record,) = rig.ctx.records
        assert record.quarantine, "a slot the provider calls bad is taken out of use"
        assert (record.operation, record.operation_seq) == ("recover", _last_seq[failing])
        assert fine != failing


async def test_a_failed_create_without_a_capacity_reason_is_left_to_the_providers_clean_up(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    async with rig_for(time_skipping_env, config=_config(create=1.0)) as rig:
        rig.fake.step_s = 45.0
        machine_id = rig.fake.speculative()[0].id
        handle = await rig.start(
            RecoverWorkflow.run,
            _recover_input(machine_id, CREATING, "create failed"),
        )
        # The machine is still speculative: nothing to clean up, the engine retries elsewhere.
        result = await rig.result(handle)
        assert result.state == "SPECULATIVE" and not rig.ctx.records[0].quarantine


def _recover_input(machine_id: str, failed_in: str, error: str) -> Any:
    from workflows.contracts import RecoverInput

    return RecoverInput(
        shard_id="shard-t",
        machine=MachineTarget(machine_id, PROVIDER),
        failed_in=failed_in,
        last_error=error,
        cluster_id="c1",
        need_key="need-1",
        priority=500_000,
        operation_seq=next_seq(),
        poll=FAST_POLL,
    )


async def test_a_create_still_running_past_two_deadlines_waits_for_an_operator(rig: Rig) -> None:
    rig.fake.step_s = 0.0  # the provider never finishes on its own
    machine_id = rig.fake.speculative()[0].id
    await _batch(rig, _provision([machine_id], deadlines=Deadlines(creating_s=600)))
    recovery = _recovery(rig, machine_id)
    await rig.advance(600 + 120)
    view = await rig.until(recovery, lambda v: v.awaiting_operator, what="AwaitingOperator")
    assert "still CREATING" in view.last_error
    attrs = (await recovery.describe()).typed_search_attributes
    assert attrs.get(sa.MACHINE_ID) == machine_id
    assert attrs.get(sa.OPERATION) == "recover"
    assert attrs.get(sa.PHASE) == sa.AWAITING_OPERATOR

    rig.fake.advance(3600)  # the boot finished after all
    await recovery.signal(RecoverWorkflow.resolve, ResolveSignal("checked the console"))
    result = await rig.result(recovery)
    assert result.state == IDLE, "a machine created late is kept idle for other use"
    (record,) = rig.ctx.records
    assert record.outcome.state == IDLE and not record.quarantine


async def test_a_refused_configure_is_retried_once_with_a_fresh_bootstrap_blob(rig: Rig) -> None:
    rig.fake.step_s = 45.0
    machine_id = rig.idle_machine()
    rig.fake.next_error_for["configure"] = InvalidTransition("the node agent was restarting")
    batch = await _batch(rig, _provision([machine_id], create=False))
    assert batch.handed_off == [machine_id]

    result = await rig.result(_recovery(rig, machine_id))
    assert result.state == CONFIGURED and result.succeeded
    assert len(rig.ctx.bootstrap_requests) == 2, "the retry fetches a fresh blob"
    calls = rig.fake.calls_to("configure")
    assert len(calls) == 2
    assert calls[0].args["token"].sequence != calls[1].args["token"].sequence
    (record,) = rig.ctx.records
    assert record.cluster_id == "c1" and record.need_key == "need-1" and record.succeeded


async def test_a_retry_without_a_bootstrap_blob_returns_the_machine_to_idle(rig: Rig) -> None:
    rig.fake.step_s = 45.0
    machine_id = rig.idle_machine()
    rig.fake.next_error_for["configure"] = InvalidTransition("the node agent was restarting")
    rig.ctx.bootstrap_queue = [
        BootstrapBlob(b"join-token", 600),
        BootstrapBlob(b"", 0, "the cluster's token signer is down"),
    ]
    await _batch(rig, _provision([machine_id], create=False))
    result = await rig.result(_recovery(rig, machine_id))
    assert result.state == IDLE and not result.succeeded
    assert "token signer is down" in result.last_error
    assert len(rig.fake.calls_to("configure")) == 1


async def test_a_configure_the_provider_failed_is_not_retried_into_a_refusal_loop(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    async with rig_for(time_skipping_env, config=_config(configure=1.0)) as rig:
        rig.fake.step_s = 45.0
        machine_id = rig.idle_machine()
        await _batch(rig, _provision([machine_id], create=False))
        result = await rig.result(_recovery(rig, machine_id))
        assert result.state == FAILED
        assert "kubelet did not register" in result.last_error
        # One retry was attempted (and refused: FAILED accepts no transition).
        assert len(rig.fake.calls_to("configure")) == 2
        assert not rig.ctx.records[0].quarantine


async def test_retry_and_escalate_on_a_parked_recovery(rig: Rig) -> None:
    rig.fake.step_s = 0.0
    machine_id = rig.idle_machine()
    await _batch(rig, _provision([machine_id], create=False, deadlines=Deadlines(configuring_s=60)))
    recovery = _recovery(rig, machine_id)
    await rig.advance(200)
    await rig.until(recovery, lambda v: v.awaiting_operator, what="AwaitingOperator")

    await recovery.signal(RecoverWorkflow.escalate, _escalate(5))
    view = await rig.until(
        recovery, lambda v: any("does not apply" in n for n in v.notes), what="escalate ignored"
    )
    assert view.awaiting_operator

    await recovery.signal(RecoverWorkflow.retry)
    await rig.advance(200)
    view = await rig.until(
        recovery, lambda v: v.awaiting_operator and len(v.signals) == 2, what="parked again"
    )
    assert any("retry requested" in n for n in view.notes)
    await recovery.signal(RecoverWorkflow.abandon)
    result = await rig.result(recovery)
    assert result.state == FAILED and rig.ctx.records[0].quarantine


def _escalate(grace: int) -> Any:
    from workflows.contracts import EscalateSignal

    return EscalateSignal(grace)
