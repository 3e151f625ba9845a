"""Record the histories the replay test checks: ``python -m tests.workflows.histories.record``.

Each scenario runs a machine workflow on the time-skipping server with its
real activities over the provider fake, and writes the finished workflow's
history to ``<scenario>.json`` beside this file. The coordinator's scenarios
(``coordinator.py`` beside this file) write one file per workflow they ran. Re-run it after an
*intentional* change to a workflow's commands (and keep the old files if
running workflows must still replay: add the new ones under new names).

``provision_before_handoff.json`` is not recorded here: it is a batch whose
machine missed its creating deadline, recorded with the ProvisionWorkflow
from before failed machines were handed to RecoverWorkflows (commit
214c718). It proves the ``recover-failed-machines`` patch keeps such
histories replaying; keep it. Likewise ``coordinator_rounds_before_fleet_idle.json``:
the coordinator's two rounds from before every round planned (its second
round, with no shortfall, ran no plan activity); it proves the
``fleet-idle-offers`` patch keeps running coordinators replaying.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle

from bigfleet.temporal import start_time_skipping
from providers.config import LatencyRange, ProviderConfig
from providers.errors import InvalidTransition
from tests.workflows.harness import PROVIDER
from tests.workflows.histories.coordinator import SCENARIOS as COORDINATOR_SCENARIOS
from tests.workflows.rig import FAST_POLL, Rig, delete_input, drain_input, rig_for
from workflows.contracts import (
    CREATING,
    Deadlines,
    EscalateSignal,
    MachineTarget,
    ProvisionInput,
    RecoverInput,
    ResolveSignal,
    VerifyInput,
    Waiter,
)
from workflows.delete import DeleteWorkflow
from workflows.drain import DrainWorkflow
from workflows.provision import ProvisionWorkflow
from workflows.recover import RecoverWorkflow
from workflows.verify import VerifyWorkflow

HERE = Path(__file__).resolve().parent
PREEMPTOR = Waiter("c-urgent", "need-urgent", 900_000)
Scenario = Callable[[Rig], Awaitable[list[WorkflowHandle[Any, Any]]]]


def _provision(ids: list[str], *, create: bool = True, seq: int = 1) -> ProvisionInput:
    return ProvisionInput(
        shard_id="shard-t",
        cluster_id="c1",
        need_key="need-1",
        priority=500_000,
        operation_seq=seq,
        machines=[MachineTarget(m, PROVIDER) for m in ids],
        create=create,
        poll=FAST_POLL,
    )


async def provision_batch(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    rig.fake.step_s = 45.0
    ids = [m.id for m in rig.fake.speculative()[:2]]
    handle = await rig.start(ProvisionWorkflow.run, _provision(ids), wf_id="provision_batch")
    await handle.result()
    return [handle]


async def provision_handoff(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    """A refused configure: the batch hands the machine to a RecoverWorkflow that retries."""
    rig.fake.step_s = 45.0
    machine_id = rig.idle_machine()
    rig.fake.next_error_for["configure"] = InvalidTransition("the node agent was restarting")
    batch = await rig.start(
        ProvisionWorkflow.run,
        _provision([machine_id], create=False, seq=2),
        wf_id="provision_handoff",
    )
    await batch.result()
    recovery = rig.client.get_workflow_handle(f"shard-t/recover/{machine_id}/2")
    await recovery.result()
    return [batch, recovery]


async def drain_preempt_blocked(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    rig.fake.step_s = 2.0
    machine_id = rig.configured_machine()
    handle = await rig.start(
        DrainWorkflow.run,
        drain_input(machine_id, grace=10, waiter=PREEMPTOR, seq=1),
        wf_id="drain_preempt_blocked",
    )
    await handle.result()
    return [handle]


async def drain_signals(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    """Escalate, force, park for an operator, retry, then resolve."""
    rig.fake.step_s = 0.0
    machine_id = rig.configured_machine()
    handle = await rig.start(
        DrainWorkflow.run, drain_input(machine_id, grace=600, seq=1), wf_id="drain_signals"
    )
    await rig.until(handle, lambda v: v.attempts == 1, what="drain accepted")
    await handle.signal(DrainWorkflow.escalate, EscalateSignal(10))
    await rig.until(handle, lambda v: v.attempts == 2, what="escalated")
    await handle.signal(DrainWorkflow.force)
    await rig.until(handle, lambda v: v.attempts == 3, what="forced")
    await rig.advance(400)
    await rig.until(handle, lambda v: v.awaiting_operator, what="parked")
    await handle.signal(DrainWorkflow.retry)
    await rig.until(handle, lambda v: v.attempts == 4, what="retried")
    await rig.advance(400)
    await rig.until(handle, lambda v: v.awaiting_operator, what="parked again")
    rig.fake.advance(3600)
    await handle.signal(DrainWorkflow.resolve, ResolveSignal("kubelet restarted"))
    await handle.result()
    return [handle]


async def drain_abandoned(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    rig.fake.step_s = 0.0
    machine_id = rig.configured_machine()
    handle = await rig.start(
        DrainWorkflow.run,
        drain_input(machine_id, grace=30, release_after=True, seq=1),
        wf_id="drain_abandoned",
    )
    await rig.advance(1000)
    await rig.until(handle, lambda v: v.awaiting_operator, what="parked")
    await handle.signal(DrainWorkflow.abandon)
    await handle.result()
    return [handle]


async def drain_then_release(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    rig.fake.step_s = 5.0
    machine_id = rig.configured_machine()
    handle = await rig.start(
        DrainWorkflow.run,
        drain_input(machine_id, grace=30, release_after=True, seq=1),
        wf_id="drain_then_release",
    )
    await handle.result()
    return [handle]


async def delete_parked_then_resolved(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    rig.fake.step_s = 0.0
    machine_id = rig.idle_machine()
    handle = await rig.start(
        DeleteWorkflow.run,
        delete_input(machine_id, deadlines=Deadlines(deleting_s=600)),
        wf_id="delete_parked_then_resolved",
    )
    await rig.advance(900)
    await rig.until(handle, lambda v: v.awaiting_operator, what="parked")
    rig.fake.advance(60)
    await handle.signal(DeleteWorkflow.resolve, ResolveSignal("terminated in the console"))
    await handle.result()
    return [handle]


async def recover_create_parked(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    rig.fake.step_s = 0.0
    machine = rig.fake.speculative()[0]
    rig.fake.provider.create(machine.id, rig.token())
    handle = await rig.start(
        RecoverWorkflow.run,
        RecoverInput(
            shard_id="shard-t",
            machine=MachineTarget(machine.id, PROVIDER),
            failed_in=CREATING,
            last_error="creating exceeded its deadline of 600 s",
            cluster_id="c1",
            need_key="need-1",
            priority=500_000,
            operation_seq=1,
            poll=FAST_POLL,
        ),
        wf_id="recover_create_parked",
    )
    await rig.advance(1200)
    await rig.until(handle, lambda v: v.awaiting_operator, what="parked")
    rig.fake.advance(3600)
    await handle.signal(RecoverWorkflow.resolve, ResolveSignal("booted"))
    await handle.result()
    return [handle]


async def verify_alive(rig: Rig) -> list[WorkflowHandle[Any, Any]]:
    machine_id = rig.configured_machine()
    handle = await rig.start(
        VerifyWorkflow.run,
        VerifyInput("shard-t", MachineTarget(machine_id, PROVIDER), "c1", 1),
        wf_id="verify_alive",
    )
    await handle.result()
    return [handle]


SCENARIOS: dict[str, Scenario] = {
    "provision_batch": provision_batch,
    "provision_handoff": provision_handoff,
    "drain_preempt_blocked": drain_preempt_blocked,
    "drain_signals": drain_signals,
    "drain_abandoned": drain_abandoned,
    "drain_then_release": drain_then_release,
    "delete_parked_then_resolved": delete_parked_then_resolved,
    "recover_create_parked": recover_create_parked,
    "verify_alive": verify_alive,
}

SLOW_DRAINS = ProviderConfig(
    kind="sim-cloud",
    quota_scale=0.1,
    interruption_scale=0.0,
    drain_latency_s=LatencyRange(60.0, 60.0),
)


async def record(names: list[str]) -> None:
    env = await start_time_skipping()
    try:
        for name in names or [*SCENARIOS, *COORDINATOR_SCENARIOS]:
            if name in COORDINATOR_SCENARIOS:
                for file, handle in (await COORDINATOR_SCENARIOS[name](env)).items():
                    history = await handle.fetch_history()
                    (HERE / f"{file}.json").write_text(history.to_json())
                    print(f"wrote {file}.json ({len(history.events)} events)")
                continue
            config = SLOW_DRAINS if name == "drain_preempt_blocked" else None
            async with rig_for(env, config=config) as rig:
                handles = await SCENARIOS[name](rig)
                for i, handle in enumerate(handles):
                    history = await handle.fetch_history()
                    suffix = "" if i == 0 else f".{i}"
                    path = HERE / f"{name}{suffix}.json"
                    path.write_text(history.to_json())
                    print(f"wrote {path.name} ({len(history.events)} events)")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1:]))
