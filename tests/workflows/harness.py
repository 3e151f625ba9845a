"""A real ShardContext for workflow tests: activities run for real against a provider fake.

The provider is the recording fake from ``providers.fake`` (a real provider
core on a manual clock). :class:`AdvancingProvider` moves that clock forward
on every read, so transitions progress while a workflow polls — the way a
real provider's machines boot while a shard waits.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.context import BootstrapBlob, ShardInactive
from bigfleet.v1alpha1 import provider_pb2
from providers.fake import FakeProvider
from providers.model import FencingToken
from workflows.contracts import (
    OP_RECOVER,
    BlockedDrain,
    NotifyReclaimInput,
    RecordMachineInput,
    RecordOutcomesInput,
    RecoverInput,
    RequirementSpec,
)
from workflows.ids import workflow_id

PROVIDER = "fake"


class AdvancingProvider(FakeProvider):
    """The fake provider whose clock moves ``step_s`` simulated seconds per Get."""

    step_s: float = 0.0

    async def get(self, machine_id: str) -> provider_pb2.Machine:
        if self.step_s:
            self.advance(self.step_s)
        return await super().get(machine_id)


@dataclass
class HarnessContext:
    """Implements :class:`activities.context.ShardContext` with inspectable effects."""

    fake: FakeProvider
    shard_id: str = "shard-t"
    epoch: int = 3
    bootstrap: BootstrapBlob = field(default_factory=lambda: BootstrapBlob(b"join-token", 600))
    # Answers used (first to last) before falling back to ``bootstrap``.
    bootstrap_queue: list[BootstrapBlob] = field(default_factory=list)
    fenced: bool = False
    bootstrap_requests: list[tuple[str, list[RequirementSpec]]] = field(default_factory=list)
    observed: list[tuple[str, int]] = field(default_factory=list)
    recorded: list[RecordOutcomesInput] = field(default_factory=list)
    records: list[RecordMachineInput] = field(default_factory=list)
    reclaims: list[NotifyReclaimInput] = field(default_factory=list)
    blocked: list[BlockedDrain] = field(default_factory=list)
    # Clusters with an open operator session (reclaim instructions are delivered to these).
    sessions: set[str] = field(default_factory=lambda: {"c1"})
    lease_ok: bool = True
    # Seconds the harness's lease has left (provider calls' deadlines are cut to it).
    lease_left_s: float = 3600.0
    # Record attempts refused as by a process that lost its lease (then they succeed).
    refuse_records: int = 0
    # check_active calls refused once the first Create was sent (a lease outage mid-batch).
    outage_after_create: int = 0
    # Where hand-offs start their RecoverWorkflows (set by the rig that runs the worker).
    client: Client | None = None
    task_queue: str = ""
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def check_active(self) -> None:
        if self.outage_after_create > 0 and self.fake.calls_to("create"):
            self.outage_after_create -= 1
            raise ShardInactive("lease not renewed in time")
        if self.fenced:
            raise ShardInactive("fenced")
        if not self.lease_ok:
            raise ShardInactive("lease lost")

    def acting_for_s(self) -> float:
        self.check_active()
        return self.lease_left_s

    def provider(self, name: str) -> FakeProvider:
        if name != PROVIDER:
            raise KeyError(name)
        return self.fake

    def next_token(self) -> FencingToken:
        return FencingToken(self.shard_id, self.epoch, next(self._seq))

    def on_fenced(self, provider: str, machine_id: str, detail: str) -> None:
        self.fenced = True

    async def request_bootstrap(
        self, cluster_id: str, requirements: Sequence[RequirementSpec], *, wait_seconds: float
    ) -> BootstrapBlob:
        self.bootstrap_requests.append((cluster_id, list(requirements)))
        if self.bootstrap_queue:
            return self.bootstrap_queue.pop(0)
        return self.bootstrap

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        self.observed.append((machine.id, int(machine.state)))

    async def record_outcomes(self, outcome: RecordOutcomesInput) -> None:
        self._maybe_refuse_record()
        self.recorded.append(outcome)

    def _maybe_refuse_record(self) -> None:
        if self.refuse_records > 0:
            self.refuse_records -= 1
            raise ShardInactive("lease on shard 'shard-t' at epoch 3 was lost")

    def send_reclaim(self, instruction: NotifyReclaimInput) -> bool:
        if instruction.cluster_id not in self.sessions:
            return False
        self.reclaims.append(instruction)
        return True

    def report_blocked_drain(self, report: BlockedDrain) -> None:
        self.blocked.append(report)

    async def record_machine(self, record: RecordMachineInput) -> None:
        self._maybe_refuse_record()
        self.records.append(record)

    async def start_recovery(self, recovery: RecoverInput) -> str:
        from workflows.recover import RecoverWorkflow

        assert self.client is not None, "the rig sets the client"
        wf_id = workflow_id(
            recovery.shard_id, OP_RECOVER, [recovery.machine.machine_id], recovery.operation_seq
        )
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await self.client.start_workflow(
                RecoverWorkflow.run,
                recovery,
                id=wf_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        return wf_id
