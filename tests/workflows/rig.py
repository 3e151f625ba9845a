"""A worker with every machine workflow and its real activities, over the harness context.

Tests drive a workflow with ``start``, wait for a condition on its ``view``
query with ``until`` (while a background ``result`` wait lets the
time-skipping server jump over timers), then send signals.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.registry import activities_for
from bigfleet.temporal import start_time_skipping
from providers.config import ProviderConfig
from providers.fake import default_fake_config
from providers.model import FencingToken
from tests.workflows.harness import PROVIDER, AdvancingProvider, HarnessContext
from workflows.contracts import (
    Deadlines,
    DeleteInput,
    DrainInput,
    MachineResult,
    MachineTarget,
    MachineView,
    PollPolicy,
    Waiter,
)
from workflows.registry import ALL_WORKFLOWS

SETUP = FencingToken("setup", 1, 1)
# Operation sequences unique within a test session: workflow ids derived from them
# never meet a closed run of an earlier test on the shared server.
_SEQ = itertools.count(100)


def next_seq() -> int:
    return next(_SEQ)


# Polls every few virtual seconds at most: hours of waiting stay a few hundred reads.
FAST_POLL = PollPolicy(initial_s=1.0, max_s=60.0, multiplier=2.0, elapsed_fraction=0.1)


@dataclass
class Rig:
    client: Client
    env: WorkflowEnvironment
    ctx: HarnessContext
    fake: AdvancingProvider
    task_queue: str
    _setup_seq: int = 1

    def token(self) -> FencingToken:
        """A setup token newer than every one used so far (setup acts as another shard)."""
        self._setup_seq += 1
        return FencingToken("setup", 1, self._setup_seq)

    async def start(
        self, run: Any, arg: Any, *, wf_id: str | None = None
    ) -> WorkflowHandle[Any, Any]:
        """Start a workflow. Virtual time stands still until ``advance`` or ``result``.

        So a test can look at a workflow, and signal it, in a phase before it
        moves on. (A result wait left running while a workflow is parked would
        let the server skip to the workflow's timeout.)
        """
        handle: WorkflowHandle[Any, Any] = await self.client.start_workflow(
            run,
            arg,
            id=wf_id or f"wf-{uuid.uuid4()}",
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        return handle

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass (timers fire, activities run)."""
        await self.env.sleep(seconds)

    async def view(self, handle: WorkflowHandle[Any, Any]) -> MachineView:
        view: MachineView = await handle.query("view", result_type=MachineView)
        return view

    async def until(
        self,
        handle: WorkflowHandle[Any, Any],
        check: Callable[[MachineView], bool],
        *,
        what: str,
        attempts: int = 400,
    ) -> MachineView:
        """Poll the view until ``check`` holds; fail (naming ``what``) if it never does."""
        view = await self.view(handle)
        for _ in range(attempts):
            if check(view):
                return view
            await asyncio.sleep(0.025)
            view = await self.view(handle)
        raise AssertionError(f"never reached: {what}; last view: {view}")

    async def result(self, handle: WorkflowHandle[Any, Any]) -> MachineResult:
        result = await handle.result()
        assert isinstance(result, MachineResult), result
        return result

    # ------------------------------------------------------- machines in states

    def idle_machine(self, index: int = 0) -> str:
        machine = self.fake.speculative()[index]
        self.fake.provider.create(machine.id, self.token())
        self.fake.advance(3600)
        return machine.id

    def configured_machine(self, cluster: str = "c1", index: int = 0) -> str:
        machine_id = self.idle_machine(index)
        self.fake.provider.configure(machine_id, cluster, b"blob", self.token(), {})
        self.fake.advance(3600)
        return machine_id

    def draining_calls(self) -> list[int]:
        return [c.args["grace_seconds"] for c in self.fake.calls_to("drain")]


@asynccontextmanager
async def rig_for(
    env: WorkflowEnvironment, *, config: ProviderConfig | None = None
) -> AsyncIterator[Rig]:
    fake = AdvancingProvider(config=config or default_fake_config())
    queue = f"tq-{uuid.uuid4()}"
    ctx = HarnessContext(fake, client=env.client, task_queue=queue)
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=list(ALL_WORKFLOWS),
        activities=activities_for(ctx),
    ):
        yield Rig(env.client, env, ctx, fake, queue)


def drain_input(
    machine_id: str,
    *,
    grace: int = 30,
    waiter: Waiter | None = None,
    deadlines: Deadlines | None = None,
    release_after: bool = False,
    seq: int | None = None,
) -> DrainInput:
    return DrainInput(
        shard_id="shard-t",
        machine=MachineTarget(machine_id, PROVIDER),
        cluster_id="c1",
        grace_seconds=grace,
        operation_seq=next_seq() if seq is None else seq,
        reason="preempt" if waiter else "reclaim",
        victim_priority=100_000,
        waiter=waiter,
        release_after=release_after,
        deadlines=deadlines or Deadlines(),
        poll=FAST_POLL,
    )


def delete_input(machine_id: str, *, deadlines: Deadlines | None = None) -> DeleteInput:
    return DeleteInput(
        shard_id="shard-t",
        machine=MachineTarget(machine_id, PROVIDER),
        operation_seq=next_seq(),
        deadlines=deadlines or Deadlines(),
        poll=FAST_POLL,
    )


@asynccontextmanager
async def time_skipping_server() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping test server of its own, shut down on the way out.

    For a fixture of any scope: the session's shared one (``conftest``), or a
    module's or test's own where a shared server's clock must not wait on what
    others left.
    """
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()
