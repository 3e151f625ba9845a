"""Work in flight carries its shard's mode: the shard-mode signal upserts BigFleetShardMode.

Time-skipping server, real workflows and activities. The workflows are
held mid-way (the provider never finishes on its own, and virtual time
stands still while nothing waits on a result), signalled, then described.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from tests.workflows.harness import PROVIDER
from tests.workflows.rig import Rig, drain_input, next_seq, rig_for
from workflows import search_attributes as sa
from workflows.contracts import (
    MachineTarget,
    ProvisionInput,
    ShardModeSignal,
    ShardSignal,
)
from workflows.drain import DrainWorkflow
from workflows.provision import ProvisionWorkflow


@pytest.fixture
async def rig(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Rig]:
    async with rig_for(time_skipping_env) as rig:
        rig.fake.step_s = 0.0  # nothing finishes: the workflow stays in flight
        yield rig


async def _mode_becomes(handle: WorkflowHandle[Any, Any], expected: str | None) -> str | None:
    """BigFleetShardMode once it reads ``expected`` (a signal is handled asynchronously)."""
    seen: str | None = None
    for _ in range(200):
        seen = (await handle.describe()).typed_search_attributes.get(sa.SHARD_MODE)
        if seen == expected:
            return seen
        await asyncio.sleep(0.025)
    return seen


async def test_a_drain_in_flight_is_marked_paused_then_active_again(rig: Rig) -> None:
    handle = await rig.start(DrainWorkflow.run, drain_input(rig.configured_machine(), grace=600))

    await handle.signal(ShardSignal.MODE.value, ShardModeSignal("paused", "incident 42"))
    assert await _mode_becomes(handle, "paused") == "paused"
    view = await rig.until(handle, lambda v: any("shard paused" in n for n in v.notes), what="note")
    assert any("(incident 42)" in n for n in view.notes)

    await handle.signal(DrainWorkflow.shard_mode, ShardModeSignal("active"))
    assert await _mode_becomes(handle, "active") == "active"
    assert (await rig.view(handle)).phase == "DRAINING", "a mark never changes what a drain does"
    await handle.terminate("test over")


async def test_a_mode_signalled_with_the_start_keeps_its_note(rig: Rig) -> None:
    # A signal delivered with the start is handled before the workflow's run begins;
    # filling the view at the start of the run used to drop its note (seen as a
    # flaky test when the signal happened to arrive before the first task ran).
    handle = await rig.client.start_workflow(
        DrainWorkflow.run,
        drain_input(rig.configured_machine(), grace=600),
        id=f"wf-{uuid.uuid4()}",
        task_queue=rig.task_queue,
        start_signal=ShardSignal.MODE.value,
        start_signal_args=[ShardModeSignal("paused", "incident 43")],
    )

    assert await _mode_becomes(handle, "paused") == "paused"
    view = await rig.until(handle, lambda v: v.phase == "DRAINING", what="draining")
    assert any("shard paused (incident 43)" in n for n in view.notes), view.notes
    await handle.terminate("test over")


async def test_a_mode_nobody_knows_is_ignored_and_the_workflow_keeps_going(rig: Rig) -> None:
    handle = await rig.start(DrainWorkflow.run, drain_input(rig.configured_machine(), grace=600))
    await handle.signal(ShardSignal.MODE.value, ShardModeSignal("sleepy"))
    await handle.signal(ShardSignal.MODE.value, ShardModeSignal("dry-run"))

    # Signals are handled in order: once dry-run shows, "sleepy" was seen and ignored.
    assert await _mode_becomes(handle, "dry-run") == "dry-run"
    view = await rig.view(handle)
    assert not any("sleepy" in n for n in view.notes)
    await handle.terminate("test over")


async def test_a_provisioning_batch_in_flight_is_marked_too(rig: Rig) -> None:
    ids = [m.id for m in rig.fake.speculative()[:2]]
    inp = ProvisionInput(
        shard_id="shard-t",
        cluster_id="c1",
        need_key="need-1",
        priority=500_000,
        operation_seq=next_seq(),
        machines=[MachineTarget(m, PROVIDER) for m in ids],
        requirements=[],
    )
    handle = await rig.start(ProvisionWorkflow.run, inp, wf_id=f"provision-{uuid.uuid4()}")

    await handle.signal(ProvisionWorkflow.shard_mode, ShardModeSignal("paused"))

    assert await _mode_becomes(handle, "paused") == "paused"
    view = await handle.query("view")
    assert view["shard_mode"] == "paused" and view["phase"] == "CREATING"
    await handle.terminate("test over")
