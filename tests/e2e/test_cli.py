"""`bigfleet drains` and `bigfleet machine …` against a real Temporal dev server.

The dev server comes from its wheel; a worker in this process serves the
machine workflows with their real activities over the recording provider
fake; the CLI runs as a subprocess, exactly as an operator would run it.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.registry import activities_for
from bigfleet.temporal import start_dev_server
from providers.model import FencingToken
from tests.ports import free_port
from tests.waiting import eventually
from tests.workflows.harness import PROVIDER, AdvancingProvider, HarnessContext
from workflows.contracts import (
    Deadlines,
    DrainInput,
    MachineTarget,
    MachineView,
    PollPolicy,
    Waiter,
)
from workflows.drain import DrainWorkflow
from workflows.registry import ALL_WORKFLOWS

pytestmark = pytest.mark.e2e

T = TypeVar("T")


@dataclass
class Cli:
    address: str
    client: Client
    ctx: HarnessContext
    fake: AdvancingProvider
    task_queue: str
    _seq: int = 10

    async def run(self, *args: str) -> tuple[int, str]:
        """Run ``bigfleet ARGS --address …``; returns (exit status, stdout + stderr)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bigfleet",
            *args,
            "--address",
            self.address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode()

    def configured_machine(self, index: int) -> str:
        machine = self.fake.speculative()[index]
        self._seq += 1
        self.fake.provider.create(machine.id, FencingToken("setup", 1, self._seq))
        self.fake.advance(3600)
        self._seq += 1
        self.fake.provider.configure(
            machine.id, "c1", b"blob", FencingToken("setup", 1, self._seq), {}
        )
        self.fake.advance(3600)
        return machine.id

    async def drain(
        self, machine_id: str, *, grace: int, margin_s: float
    ) -> WorkflowHandle[Any, Any]:
        inp = DrainInput(
            shard_id="shard-cli",
            machine=MachineTarget(machine_id, PROVIDER),
            cluster_id="c1",
            grace_seconds=grace,
            operation_seq=1,
            reason="preempt",
            victim_priority=100_000,
            waiter=Waiter("urgent", "need-u", 900_000),
            deadlines=Deadlines(draining_margin_s=margin_s),
            poll=PollPolicy(initial_s=0.2, max_s=0.5),
        )
        handle: WorkflowHandle[Any, Any] = await self.client.start_workflow(
            DrainWorkflow.run,
            inp,
            id=f"shard-cli/drain/{machine_id}/{uuid.uuid4().hex[:6]}",
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        return handle


@pytest.fixture(scope="module")
async def dev_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server(port=free_port(), ui=False)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
async def cli(dev_server: WorkflowEnvironment) -> AsyncIterator[Cli]:
    fake = AdvancingProvider()
    queue = f"cli-{uuid.uuid4()}"
    ctx = HarnessContext(fake, shard_id="shard-cli", client=dev_server.client, task_queue=queue)
    async with Worker(
        dev_server.client,
        task_queue=queue,
        workflows=list(ALL_WORKFLOWS),
        activities=activities_for(ctx),
    ):
        address = dev_server.client.service_client.config.target_host
        yield Cli(address, dev_server.client, ctx, fake, queue)


async def _view(handle: WorkflowHandle[Any, Any]) -> MachineView:
    view: MachineView = await handle.query(DrainWorkflow.view)
    return view


async def test_drains_lists_running_drains_and_the_stuck_ones(cli: Cli) -> None:
    machine_id = cli.configured_machine(0)
    handle = await cli.drain(machine_id, grace=600, margin_s=600)

    async def listed() -> str:
        code, out = await cli.run("drains")
        return out if code == 0 and machine_id in out else ""

    out = await eventually(listed, what="the drain to be listed")
    (row,) = [line for line in out.splitlines() if machine_id in line]
    # REASON, the victim's PRIORITY, AGE and GRACE (ADR 0090's vocabulary of reasons).
    assert "preempt" in row and "DRAINING" in row and "600s" in row and "100000" in row, row
    assert handle.id in row and "REASON: why the drain runs" in out

    code, out = await cli.run("drains", "--stuck", "--older-than", "1h")
    assert code == 0 and machine_id not in out and "no stuck drains" in out

    async def stuck() -> str:
        _, out = await cli.run("drains", "--stuck", "--older-than", "0s")
        return out if machine_id in out else ""

    await eventually(stuck, what="the drain to count as stuck after 0 s")
    await handle.signal(DrainWorkflow.abandon)


async def test_drains_prints_the_ui_query_for_stuck_drains(cli: Cli) -> None:
    code, out = await cli.run("drains", "--stuck", "--older-than", "30m", "--query")
    assert code == 0
    assert out.startswith("WorkflowType = 'DrainWorkflow' AND ExecutionStatus = 'Running'")
    assert "AND StartTime < '" in out


async def test_show_escalate_force_retry_and_resolve_a_drain(cli: Cli) -> None:
    machine_id = cli.configured_machine(1)
    cli.fake.step_s = 0.0  # the provider never finishes on its own
    handle = await cli.drain(machine_id, grace=600, margin_s=1.0)

    async def shown() -> str:
        code, out = await cli.run("machine", "show", machine_id)
        return out if code == 0 and "phase DRAINING" in out else ""

    out = await eventually(shown, what="machine show to find the drain")
    assert handle.id in out and "grace 600 s" in out and "priority 900000 of urgent" in out
    assert "reason     preempt (the workload it serves has priority 100000)" in out, out

    code, out = await cli.run("machine", "escalate", machine_id, "--grace", "10s")
    assert code == 0, out
    assert "sent escalate" in out and "grace_seconds: 600 -> 10" in out
    assert [c.args["grace_seconds"] for c in cli.fake.calls_to("drain")] == [600, 10]

    code, out = await cli.run("machine", "force", machine_id)
    assert code == 0 and "grace_seconds: 10 -> 0" in out, out

    # The forced drain has a one-second margin here: it parks for an operator.
    await eventually(lambda: _awaiting(handle), what="the drain to wait for an operator", within=30)
    code, out = await cli.run("machine", "retry", machine_id)
    assert code == 0 and "sent retry" in out, out
    assert "phase: AwaitingOperator -> DRAINING" in out and "retry requested" in out, out

    await eventually(lambda: _awaiting(handle), what="parked again", within=30)
    cli.fake.advance(3600)  # someone fixed the node by hand: the drain finished
    code, out = await cli.run("machine", "resolve", machine_id, "--note", "restarted kubelet")
    assert code == 0 and "phase: AwaitingOperator -> IDLE" in out, out
    result = await handle.result()
    assert result.state == "IDLE"
    assert [r.outcome.state for r in cli.ctx.records] == ["IDLE"]


async def _awaiting(handle: WorkflowHandle[Any, Any]) -> bool:
    return (await _view(handle)).awaiting_operator


async def test_abandon_marks_the_machine_failed(cli: Cli) -> None:
    machine_id = cli.configured_machine(2)
    cli.fake.step_s = 0.0
    handle = await cli.drain(machine_id, grace=600, margin_s=600)
    await eventually(lambda: _listed(cli, machine_id), what="the drain to be visible", within=60)
    code, out = await cli.run("machine", "abandon", machine_id)
    assert code == 0 and "phase: DRAINING -> FAILED" in out, out
    result = await handle.result()
    assert result.state == "FAILED" and cli.ctx.records[0].quarantine


async def _listed(cli: Cli, machine_id: str) -> bool:
    code, out = await cli.run("machine", "show", machine_id)
    return code == 0 and "DrainWorkflow" in out


async def test_a_machine_without_a_workflow_is_an_error(cli: Cli) -> None:
    code, out = await cli.run("machine", "show", "no-such-machine")
    assert code == 2 and "no workflow has touched machine no-such-machine" in out
    code, out = await cli.run("machine", "force", "no-such-machine")
    assert code == 2 and "no running drain" in out
    code, out = await cli.run("machine", "escalate", "m", "--grace", "soon")
    assert code == 2 and "not a duration" in out
