"""DrainWorkflow on the time-skipping server with its real activities over the provider fake."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from bigfleet.v1alpha1 import provider_pb2
from providers.config import LatencyRange, ProviderConfig
from providers.errors import Fenced
from tests.workflows.rig import Rig, drain_input, rig_for
from workflows import search_attributes as sa
from workflows.contracts import (
    FAILED,
    IDLE,
    SPECULATIVE,
    Deadlines,
    EscalateSignal,
    ResolveSignal,
    Waiter,
)
from workflows.drain import DrainWorkflow

PREEMPTOR = Waiter("c-urgent", "need-urgent", 900_000)


@pytest.fixture
async def rig(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Rig]:
    async with rig_for(time_skipping_env) as rig:
        yield rig


@pytest.fixture
async def slow_drain_rig(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Rig]:
    """Workloads that take a full minute to leave: a drain always runs into its grace."""
    config = ProviderConfig(
        kind="sim-cloud",
        quota_scale=0.1,
        interruption_scale=0.0,
        drain_latency_s=LatencyRange(60.0, 60.0),
    )
    async with rig_for(time_skipping_env, config=config) as rig:
        yield rig


@pytest.fixture
async def failing_drain_rig(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Rig]:
    """Every drain fails at the provider (the instance stops responding)."""
    config = ProviderConfig(
        kind="sim-cloud", quota_scale=0.1, interruption_scale=0.0, error_rate={"drain": 1.0}
    )
    async with rig_for(time_skipping_env, config=config) as rig:
        yield rig


async def test_a_reclaim_drains_the_machine_to_idle_and_records_it_once(rig: Rig) -> None:
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=30))
    result = await rig.result(handle)

    assert result.state == IDLE and result.succeeded
    machine = await rig.fake.get(machine_id)
    assert machine.state == provider_pb2.MACHINE_STATE_IDLE and machine.cluster == ""
    (drain,) = rig.fake.calls_to("drain")
    assert drain.args["grace_seconds"] == 30
    assert drain.args["token"].shard_id == "shard-t" and drain.args["token"].epoch == 3
    (instruction,) = rig.ctx.reclaims
    assert instruction.machine_ids == [machine_id] and instruction.grace_seconds == 30
    assert instruction.cluster_id == "c1" and instruction.preemptor_priority == 0
    (record,) = rig.ctx.records
    assert (record.operation, record.succeeded) == ("drain", True)
    assert record.outcome.state == IDLE and record.cluster_id == ""
    view = await rig.view(handle)
    assert view.phase == IDLE and view.attempts == 1 and view.waiting is None


async def test_a_preemption_drain_past_its_grace_is_reported_as_blocking_the_preemptor(
    slow_drain_rig: Rig,
) -> None:
    rig = slow_drain_rig
    rig.fake.step_s = 2.0  # the provider moves slower than the workflow's clock
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=10, waiter=PREEMPTOR))
    result = await rig.result(handle)

    assert result.state == IDLE and result.succeeded
    assert rig.ctx.reclaims[0].preemptor_priority == 900_000
    assert rig.ctx.blocked, "the blocked preemption must reach the shard"
    report = rig.ctx.blocked[0]
    assert report.machine_id == machine_id and report.waiter == PREEMPTOR
    assert report.grace_seconds == 10 and report.victim_cluster_id == "c1"
    view = await rig.view(handle)
    assert view.waiting == PREEMPTOR
    assert view.blocked_since_unix == pytest.approx(view.started_unix + 10, abs=1.0)
    described = await handle.describe()
    attrs = described.typed_search_attributes
    # BigFleetPriority on a drain is the victim's (the preemptor's is in the view's waiter).
    assert attrs.get(sa.PRIORITY) == 100_000
    assert attrs.get(sa.REASON) == "preempt"
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "reason: preempt" in metadata.current_details
    assert "priority: 100000" in metadata.current_details
    assert attrs.get(sa.MACHINE_ID) == machine_id
    assert attrs.get(sa.OPERATION) == "drain"
    assert attrs.get(sa.GRACE_SECONDS) == 10


async def test_a_drain_within_its_grace_blocks_nobody(rig: Rig) -> None:
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    await rig.result(
        await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=600, waiter=PREEMPTOR))
    )
    assert rig.ctx.blocked == []


async def test_a_drain_past_its_deadline_is_forced_then_parks_for_an_operator(rig: Rig) -> None:
    rig.fake.step_s = 0.0  # the provider never finishes on its own
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=30))
    await rig.advance(30 + 300 + 300 + 60)
    view = await rig.until(handle, lambda v: v.awaiting_operator, what="AwaitingOperator")

    assert view.phase == sa.AWAITING_OPERATOR
    assert "forced drain exceeded its deadline of 300 s" in view.last_error
    assert view.grace_seconds == 0 and view.attempts == 2
    assert rig.draining_calls() == [30, 0], "forced termination is a drain with zero grace"
    assert [r.grace_seconds for r in rig.ctx.reclaims] == [30, 0]
    assert len(view.provider_operation_ids) == 1
    assert any("kept operation" in n for n in view.notes), "an idempotent repeat must show"
    assert any("escalating to forced termination" in n for n in view.notes)
    attrs = (await handle.describe()).typed_search_attributes
    assert attrs.get(sa.PHASE) == sa.AWAITING_OPERATOR
    assert attrs.get(sa.GRACE_SECONDS) == 0
    assert rig.ctx.records == [], "nothing is settled while an operator is awaited"

    rig.fake.advance(120)  # someone restarted the kubelet by hand; the drain completes
    await handle.signal(DrainWorkflow.resolve, ResolveSignal("kubelet restarted by hand"))
    result = await rig.result(handle)
    assert result.state == IDLE and result.succeeded
    assert len(rig.ctx.records) == 1 and rig.ctx.records[0].outcome.state == IDLE
    view = await rig.view(handle)
    assert any("kubelet restarted by hand" in s for s in view.signals)


async def test_escalate_shortens_the_grace_for_the_operator_and_the_provider(rig: Rig) -> None:
    rig.fake.step_s = 0.0
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=600))
    before = await rig.until(handle, lambda v: v.attempts == 1, what="the first drain")

    await handle.signal(DrainWorkflow.escalate, EscalateSignal(10))
    after = await rig.until(handle, lambda v: v.attempts == 2, what="the escalated drain")
    assert after.grace_seconds == 10
    assert before.deadline_unix is not None and after.deadline_unix is not None
    assert after.deadline_unix < before.deadline_unix, "escalation must shorten the deadline"
    assert rig.draining_calls() == [600, 10]
    assert [r.grace_seconds for r in rig.ctx.reclaims] == [600, 10]
    assert rig.ctx.reclaims[0].instruction_id != rig.ctx.reclaims[1].instruction_id
    attrs = (await handle.describe()).typed_search_attributes
    assert attrs.get(sa.GRACE_SECONDS) == 10

    await handle.signal(DrainWorkflow.escalate, EscalateSignal(60))
    view = await rig.until(
        handle, lambda v: any("ignored" in n for n in v.notes), what="a longer grace ignored"
    )
    assert view.grace_seconds == 10 and rig.draining_calls() == [600, 10]

    rig.fake.advance(700)
    result = await rig.result(handle)
    assert result.state == IDLE and result.succeeded


async def test_an_escalation_also_shortens_the_drain_at_the_provider(slow_drain_rig: Rig) -> None:
    rig = slow_drain_rig
    rig.fake.step_s = 0.0
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=600))
    first = await rig.until(handle, lambda v: v.attempts == 1, what="the first drain")

    await handle.signal(DrainWorkflow.escalate, EscalateSignal(10))
    await rig.until(handle, lambda v: v.attempts == 2, what="the escalated drain")
    rig.fake.advance(10)  # workloads need 60 s; the escalated grace forces them at 10 s

    result = await rig.result(handle)
    assert result.state == IDLE and result.succeeded
    view = await rig.view(handle)
    assert view.provider_operation_ids == first.provider_operation_ids
    assert len(view.provider_operation_ids) == 1


async def test_force_drains_with_zero_grace_and_abandon_marks_the_machine_failed(
    rig: Rig,
) -> None:
    rig.fake.step_s = 0.0
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=600))
    await rig.until(handle, lambda v: v.attempts == 1, what="the first drain")

    await handle.signal(DrainWorkflow.force)
    view = await rig.until(handle, lambda v: v.attempts == 2, what="the forced drain")
    assert view.grace_seconds == 0 and rig.draining_calls() == [600, 0]

    await handle.signal(DrainWorkflow.abandon)
    result = await rig.result(handle)
    assert result.state == FAILED and not result.succeeded
    assert "abandoned by an operator" in result.last_error
    (record,) = rig.ctx.records
    assert record.quarantine, "an abandoned machine is kept out of use for investigation"
    assert record.outcome.state == FAILED and not record.succeeded


async def test_a_drain_the_provider_fails_is_forced_then_held_until_abandoned(
    failing_drain_rig: Rig,
) -> None:
    rig = failing_drain_rig
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id, grace=30))
    await rig.advance(600)
    view = await rig.until(handle, lambda v: v.awaiting_operator, what="AwaitingOperator")
    assert "FAILED" in view.last_error and "stopped responding" in view.last_error
    assert rig.draining_calls() == [30, 0], "the forced drain is attempted before parking"

    await handle.signal(DrainWorkflow.retry)
    view = await rig.until(
        handle, lambda v: v.awaiting_operator and v.attempts == 3, what="a retried force"
    )
    assert rig.draining_calls() == [30, 0, 0]

    await handle.signal(DrainWorkflow.abandon)
    result = await rig.result(handle)
    assert result.state == FAILED and rig.ctx.records[0].quarantine


async def test_a_fenced_drain_stops_the_workflow_and_tells_the_shard(rig: Rig) -> None:
    machine_id = rig.configured_machine()
    rig.fake.next_error_for["drain"] = Fenced("a newer epoch was seen for this machine")
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id))
    with pytest.raises(WorkflowFailureError) as caught:
        await handle.result()
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "Fenced"
    assert rig.ctx.fenced and rig.ctx.records == []
    assert (await rig.view(handle)).phase == sa.FENCED_PHASE


async def test_a_shard_without_its_lease_waits_instead_of_losing_the_drain(rig: Rig) -> None:
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    rig.ctx.lease_ok = False
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id))
    await rig.until(
        handle, lambda v: any("not acting" in n for n in v.notes), what="waiting for the lease"
    )
    assert rig.fake.calls_to("drain") == [], "no provider mutation without the lease"
    rig.ctx.lease_ok = True
    result = await rig.result(handle)
    assert result.state == IDLE and len(rig.fake.calls_to("drain")) == 1


async def test_a_drained_machine_is_recorded_even_when_recording_meets_a_lost_lease(
    rig: Rig,
) -> None:
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    rig.ctx.refuse_records = 3
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id))
    result = await rig.result(handle)
    assert result.state == IDLE and result.succeeded
    (record,) = rig.ctx.records
    assert record.outcome.machine_id == machine_id and rig.ctx.refuse_records == 0


async def test_starting_the_same_drain_twice_runs_it_once(rig: Rig) -> None:
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    inp = drain_input(machine_id)
    wf_id = f"shard-t/drain/{machine_id}/{inp.operation_seq}"
    first = await rig.start(DrainWorkflow.run, inp, wf_id=wf_id)
    second = await rig.start(DrainWorkflow.run, inp, wf_id=wf_id)
    assert first.result_run_id == second.result_run_id
    await rig.result(first)
    assert len(rig.fake.calls_to("drain")) == 1
    assert len(rig.ctx.records) == 1


async def test_a_drain_can_release_the_machine_afterwards(rig: Rig) -> None:
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    handle = await rig.start(
        DrainWorkflow.run, drain_input(machine_id, grace=30, release_after=True)
    )
    result = await rig.result(handle)
    assert result.state == SPECULATIVE and result.succeeded
    assert len(rig.fake.calls_to("delete")) == 1
    (record,) = rig.ctx.records
    assert record.operation == "drain" and record.outcome.state == SPECULATIVE


async def test_draining_an_already_idle_machine_finishes_without_waiting(rig: Rig) -> None:
    machine_id = rig.idle_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id))
    result = await rig.result(handle)
    assert result.state == IDLE and result.succeeded
    view = await rig.view(handle)
    # The provider answers with the operation that made it idle (same target state).
    assert view.attempts == 1 and view.machine_state == IDLE


async def test_a_cluster_without_a_session_still_gets_its_machine_drained(rig: Rig) -> None:
    rig.fake.step_s = 5.0
    rig.ctx.sessions.clear()
    machine_id = rig.configured_machine()
    handle = await rig.start(DrainWorkflow.run, drain_input(machine_id))
    result = await rig.result(handle)
    assert result.state == IDLE
    view = await rig.view(handle)
    assert any("not delivered" in n for n in view.notes)
    assert len(rig.fake.calls_to("drain")) == 1


async def test_the_view_shows_what_an_operator_needs_while_draining(rig: Rig) -> None:
    rig.fake.step_s = 0.0
    machine_id = rig.configured_machine()
    inp = drain_input(machine_id, grace=120, waiter=PREEMPTOR, deadlines=Deadlines())
    wf_id = f"shard-t/drain/{machine_id}/{inp.operation_seq}"
    handle = await rig.start(DrainWorkflow.run, inp, wf_id=wf_id)
    view = await rig.until(handle, lambda v: v.attempts == 1, what="the drain accepted")
    assert view.workflow_id == wf_id and view.operation_seq == inp.operation_seq
    assert (view.operation, view.machine_id, view.cluster_id) == ("drain", machine_id, "c1")
    assert view.phase == "DRAINING" and view.machine_state == "DRAINING"
    assert view.grace_seconds == 120 and view.waiting == PREEMPTOR
    assert view.deadline_unix == pytest.approx(view.started_unix + 120 + 300, abs=2.0)
    assert len(view.provider_operation_ids) == 1 and view.last_error == ""
    await handle.signal(DrainWorkflow.abandon)
    await rig.result(handle)
