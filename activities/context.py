"""What activities need from the shard process that runs them.

Activities depend on this protocol, not on the shard process, so tests can
run them against a small context built from real parts (a provider server,
a database) without starting the whole process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from temporalio.exceptions import ApplicationError

from bigfleet.v1alpha1 import provider_pb2
from providers.client import FencingToken
from workflows.contracts import (
    BlockedDrain,
    NotifyReclaimInput,
    RecordMachineInput,
    RecordOutcomesInput,
    RecoverInput,
    RequirementSpec,
)
from workflows.errors import LEASE_LOST, NOT_LEASE_HOLDER


@dataclass(frozen=True)
class BootstrapBlob:
    """An operator's answer to a bootstrap request."""

    user_data: bytes
    ttl_seconds: int
    error: str = ""


class ProviderCalls(Protocol):
    """The subset of :class:`providers.client.ProviderClient` the activities use.

    ``timeout`` is the longest a call may take (its gRPC deadline); a mutation
    may be given a shorter one, so it cannot outlast the shard's lease.
    """

    timeout: float

    async def create(
        self, machine_id: str, token: FencingToken, *, deadline_s: float | None = None
    ) -> provider_pb2.TransitionAck: ...

    async def configure(
        self,
        machine_id: str,
        cluster_id: str,
        bootstrap_blob: bytes,
        token: FencingToken,
        shard_metadata: dict[str, str] | None = None,
        *,
        deadline_s: float | None = None,
    ) -> provider_pb2.TransitionAck: ...

    async def drain(
        self,
        machine_id: str,
        grace_seconds: int,
        token: FencingToken,
        *,
        deadline_s: float | None = None,
    ) -> provider_pb2.TransitionAck: ...

    async def delete(
        self, machine_id: str, token: FencingToken, *, deadline_s: float | None = None
    ) -> provider_pb2.TransitionAck: ...

    async def get(self, machine_id: str) -> provider_pb2.Machine: ...

    async def list(
        self,
        states: Sequence[int] = (),
        max_results: int = 0,
        since_revision: bytes = b"",
    ) -> provider_pb2.MachineList: ...


class ActiveGuard(Protocol):
    """Whether the shard process may act (it holds its lease and was not fenced)."""

    def check_active(self) -> None:
        """Raise :class:`ShardInactive` if this process may no longer act (lease lost, fenced)."""


def ensure_active(guard: ActiveGuard, *, retryable: bool = False) -> None:
    """Refuse to run an activity for a shard that may not act: a ``LeaseLost`` failure.

    Machine operations make it non-retryable (their workflows wait it out on a
    durable timer); membership moves retry it, because the next attempt may
    reach the process that holds the lease now.
    """
    try:
        guard.check_active()
    except ShardInactive as err:
        raise ApplicationError(str(err), type=LEASE_LOST, non_retryable=not retryable) from err


def ensure_holder(guard: ActiveGuard) -> None:
    """Refuse, *retryably*, to record an outcome in a process that may not act.

    Recording is retried until it lands (ADR 0101): the next attempt may
    reach the process that holds the shard's lease now, which records it.
    """
    try:
        guard.check_active()
    except ShardInactive as err:
        raise not_holder(err) from err


def not_holder(err: ShardInactive) -> ApplicationError:
    """The retryable refusal of a record attempt that reached a process that cannot act."""
    return ApplicationError(
        f"{err}; the outcome is recorded by the process that holds the lease",
        type=NOT_LEASE_HOLDER,
    )


class ShardContext(ActiveGuard, Protocol):
    """The live shard process, as activities see it."""

    @property
    def shard_id(self) -> str: ...

    def provider(self, name: str) -> ProviderCalls:
        """The client for a configured provider; ``KeyError`` if unknown."""

    def next_token(self) -> FencingToken:
        """A fresh fencing token: this process's epoch and a new sequence number."""

    def acting_for_s(self) -> float:
        """Seconds this process may still act: a provider mutation's deadline is cut to it,
        so no mutation lands after the lease may have ended (ADR 0100). Raises
        :class:`ShardInactive` when it may not act at all."""

    def on_fenced(self, provider: str, machine_id: str, detail: str) -> None:
        """A provider refused our token: stop acting until the lease is re-taken."""

    async def request_bootstrap(
        self, cluster_id: str, requirements: Sequence[RequirementSpec], *, wait_seconds: float
    ) -> BootstrapBlob:
        """Ask the cluster's operator for a bootstrap blob over its session."""

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        """Fold a fresh provider observation into the shard's inventory."""

    async def record_outcomes(self, outcome: RecordOutcomesInput) -> None:
        """Persist and settle a finished operation (idempotent: safe to call twice)."""

    def send_reclaim(self, instruction: NotifyReclaimInput) -> bool:
        """Queue a ReclaimInstruction on the cluster's session; False if it has none open.

        A newer instruction for the same machines replaces one not yet sent.
        """

    def report_blocked_drain(self, report: BlockedDrain) -> None:
        """A preemption drain outlasted its grace: keep it as a shortfall until it settles."""

    async def start_recovery(self, recovery: RecoverInput) -> str:
        """Start (or find) the RecoverWorkflow for one failed machine; returns its id."""

    async def record_machine(self, record: RecordMachineInput) -> None:
        """Persist and settle one machine's finished operation (idempotent: safe to call twice).

        Also forgets any blocked-drain report for the machine, and with
        ``quarantine`` stops using the machine.
        """


class ShardInactive(RuntimeError):
    """The shard process no longer holds its lease or has been fenced."""
