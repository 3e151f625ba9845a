"""Carries out a cycle's plan: one Temporal workflow start per action (or batch).

Workflow IDs are derived from (operation, machine or batch, operation
sequence), and starts use ``USE_EXISTING`` on conflict, so starting the same
operation twice — after a crash, or a retried cycle — finds the running
workflow instead of creating a second one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from bigfleet.shard.convert import requirement_specs
from shard_engine.model import AssignIdle, Plan, Provision
from workflows import search_attributes as sa
from workflows.contracts import CONFIGURING, CREATING, MachineTarget, ProvisionInput
from workflows.provision import ProvisionWorkflow

if TYPE_CHECKING:
    from bigfleet.shard.process import ShardProcess

log = logging.getLogger(__name__)


def workflow_id(shard_id: str, operation: str, machine_ids: list[str], seq: int) -> str:
    """Deterministic workflow id: the same operation on the same machines maps to one id."""
    subject = (
        machine_ids[0] if len(machine_ids) == 1 else f"{machine_ids[0]}+{len(machine_ids) - 1}"
    )
    return f"{shard_id}/{operation}/{subject}/{seq}"


class Executor:
    """Turns engine actions into workflow starts on the shard's task queue."""

    def __init__(self, shard: ShardProcess) -> None:
        self._shard = shard

    async def execute(self, plan: Plan) -> int:
        started = 0
        for action in plan.actions:
            if isinstance(action, (Provision, AssignIdle)):
                started += await self._provision(action)
            else:
                # Drain, delete and verify workflows are added with the machine
                # lifecycle (issue 4); until then the action is released so
                # the engine can plan it again rather than hold it forever.
                log.info("no workflow yet for %s; releasing it", type(action).__name__)
                machine_id = getattr(action, "machine_id", "")
                self._shard.engine.settle(
                    machine_id, self._shard.engine.machine(machine_id), now=self._shard.clock()
                )
        return started

    async def _provision(self, action: Provision | AssignIdle) -> int:
        shard = self._shard
        create = isinstance(action, Provision)
        ids = list(action.machine_ids) if isinstance(action, Provision) else [action.machine_id]
        machines = []
        for mid in ids:
            record = shard.engine.machine(mid)
            if record is None:
                log.warning("planned machine %s vanished before its workflow started", mid)
                continue
            machines.append(MachineTarget(mid, record.provider))
        if not machines:
            return 0
        seq = shard.next_operation_seq([m.machine_id for m in machines])
        operation = "provision" if create else "configure"
        wf_id = workflow_id(shard.shard_id, operation, [m.machine_id for m in machines], seq)
        inp = ProvisionInput(
            shard_id=shard.shard_id,
            cluster_id=action.cluster_id,
            need_key=action.need_key,
            priority=action.priority,
            operation_seq=seq,
            machines=machines,
            requirements=requirement_specs(action.requirements),
            create=create,
            deadlines=shard.options.deadlines,
            poll=shard.options.poll,
        )
        attrs: list[SearchAttributePair[Any]] = [
            SearchAttributePair(sa.SHARD_ID, shard.shard_id),
            SearchAttributePair(sa.CLUSTER_ID, action.cluster_id),
            SearchAttributePair(sa.OPERATION, operation),
            SearchAttributePair(sa.PHASE, CREATING if create else CONFIGURING),
            SearchAttributePair(sa.PRIORITY, action.priority),
            SearchAttributePair(sa.MACHINE_IDS, [m.machine_id for m in machines]),
        ]
        if len(machines) == 1:
            attrs.append(SearchAttributePair(sa.MACHINE_ID, machines[0].machine_id))
        try:
            await shard.temporal.start_workflow(
                ProvisionWorkflow.run,
                inp,
                id=wf_id,
                task_queue=shard.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=TypedSearchAttributes(attrs),
            )
        except WorkflowAlreadyStartedError:
            log.info("workflow %s already ran; not starting it again", wf_id)
            return 0
        return 1
