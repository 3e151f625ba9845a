"""The shard process's parts, as its activities see them (:class:`activities.context.ShardContext`).

Each method hands over to the one part that does the job:

    check_active, next_token, on_fenced   LeaseKeeper
    provider, observe                     ProviderObserver
    record_outcomes, record_machine       OutcomeRecorder
    request_bootstrap, send_reclaim       SessionHub (the operator's session)
    report_blocked_drain                  MachineLifecycle
    start_recovery                        Executor
"""

from __future__ import annotations

from collections.abc import Sequence

from activities.context import BootstrapBlob, ProviderCalls
from bigfleet.shard.executor import Executor
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.lifecycle import MachineLifecycle, reclaim_key
from bigfleet.shard.observer import ProviderObserver
from bigfleet.shard.outcomes import OutcomeRecorder
from bigfleet.shard.sessions import SessionHub
from bigfleet.v1alpha1 import provider_pb2, shard_pb2
from providers.client import FencingToken
from workflows.contracts import (
    BlockedDrain,
    NotifyReclaimInput,
    RecordMachineInput,
    RecordOutcomesInput,
    RecoverInput,
    RequirementSpec,
)

__all__ = ["ShardActivityContext"]


class ShardActivityContext:
    """Implements :class:`activities.context.ShardContext` over the shard's parts."""

    def __init__(
        self,
        *,
        lease: LeaseKeeper,
        observer: ProviderObserver,
        outcomes: OutcomeRecorder,
        hub: SessionHub,
        lifecycle: MachineLifecycle,
        executor: Executor,
    ) -> None:
        self._lease = lease
        self._observer = observer
        self._outcomes = outcomes
        self._hub = hub
        self._lifecycle = lifecycle
        self._executor = executor

    @property
    def shard_id(self) -> str:
        return self._lease.shard_id

    def check_active(self) -> None:
        self._lease.check_active()

    def acting_for_s(self) -> float:
        self._lease.check_active()
        return self._lease.remaining_s()

    def provider(self, name: str) -> ProviderCalls:
        return self._observer.provider(name)

    def next_token(self) -> FencingToken:
        return self._lease.next_token()

    def on_fenced(self, provider: str, machine_id: str, detail: str) -> None:
        self._lease.on_fenced(provider, machine_id, detail)

    async def request_bootstrap(
        self, cluster_id: str, requirements: Sequence[RequirementSpec], *, wait_seconds: float
    ) -> BootstrapBlob:
        return await self._hub.request_bootstrap(
            cluster_id, requirements, wait_seconds=wait_seconds
        )

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        self._observer.observe(provider, machine)

    async def record_outcomes(self, outcome: RecordOutcomesInput) -> None:
        await self._outcomes.record_outcomes(outcome)

    def send_reclaim(self, instruction: NotifyReclaimInput) -> bool:
        frame = shard_pb2.ShardMessage(
            reclaim_instruction=shard_pb2.ReclaimInstruction(
                instruction_id=instruction.instruction_id,
                nodes=list(instruction.machine_ids),
                grace_period_seconds=instruction.grace_seconds,
                preemptor_priority=instruction.preemptor_priority,
            )
        )
        return self._hub.send(instruction.cluster_id, frame, key=reclaim_key(instruction))

    def report_blocked_drain(self, report: BlockedDrain) -> None:
        self._lifecycle.report_blocked(report)

    async def start_recovery(self, recovery: RecoverInput) -> str:
        return await self._executor.start_recovery(recovery)

    async def record_machine(self, record: RecordMachineInput) -> None:
        await self._outcomes.record_machine(record)
