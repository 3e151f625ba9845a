"""What the coordinator-side activities need from PostgreSQL, as Protocols they own.

The activities do not import the store: they name the few reads and writes
they make, and the rows' fields they read, here. ``bigfleet.store.Store``
satisfies every Protocol structurally (the type checker proves it where the
bootstrap hands a ``Store`` to ``registry.coordinator_activities``), and a
test may hand in any object that does. An import contract forbids
``activities`` to import ``bigfleet.store``.

    CoordinatorActivities  ── CoordinatorRecords  (shards, owners, assign_unowned, instructions)
    MembershipPlanner      ── MembershipRecords   (shards, clusters, machines, instructions)
    plan_decommission      ── MachineOwners
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = [
    "ClusterFacts",
    "CoordinatorRecords",
    "CoordinatorStore",
    "InstructionLog",
    "MachineFacts",
    "MachineOwners",
    "MembershipRecords",
    "ShardFacts",
]


class ShardFacts(Protocol):
    """One shard's membership row, as far as planning reads it."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> str: ...  # active, draining or removed
    @property
    def clusters(self) -> int: ...  # clusters it serves


class ClusterFacts(Protocol):
    """Which shard serves a cluster."""

    @property
    def cluster_id(self) -> str: ...
    @property
    def shard_id(self) -> str: ...


class MachineFacts(Protocol):
    """A machine's owner, provider and recorded binding."""

    @property
    def machine_id(self) -> str: ...
    @property
    def shard_id(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def cluster_id(self) -> str | None: ...


class MachineOwners(Protocol):
    """Who owns which machine."""

    async def owners(self, machine_ids: Sequence[str] | None = None) -> dict[str, str]:
        """machine id -> owning shard (all machines when ``machine_ids`` is None)."""
        ...


class InstructionLog(Protocol):
    """The coordinator's instruction log: persisted before an instruction is carried out."""

    async def record_instruction(
        self,
        *,
        term: int,
        seq: int,
        kind: str,
        donor: str | None,
        receiver: str | None,
        payload: Mapping[str, object],
    ) -> int:
        """Persist an instruction (idempotent on (term, seq)); returns its row id."""
        ...

    async def finish_instruction(self, *, term: int, seq: int, status: str, outcome: str) -> None:
        """Record what became of an instruction."""
        ...


class CoordinatorRecords(MachineOwners, InstructionLog, Protocol):
    """What distribution, planning and decommission plans read and write."""

    async def active_shards(self) -> list[str]:
        """Shards that take new clusters and quota, in id order."""
        ...

    async def shards(self) -> Sequence[ShardFacts]:
        """Every shard's membership row, in id order."""
        ...

    async def assign_unowned(
        self, shard_id: str, provider: str, machine_ids: Sequence[str], *, term: int
    ) -> list[str]:
        """Give machines nobody owns to an active shard; returns those actually assigned."""
        ...


class MembershipRecords(MachineOwners, InstructionLog, Protocol):
    """What planning a shard's drain reads (membership, clusters, machines) and records."""

    async def shards(self) -> Sequence[ShardFacts]:
        """Every shard's membership row, in id order."""
        ...

    async def clusters(self) -> Sequence[ClusterFacts]:
        """Every cluster's shard."""
        ...

    async def machines(self) -> Sequence[MachineFacts]:
        """Every machine's ownership row."""
        ...


class CoordinatorStore(CoordinatorRecords, MembershipRecords, Protocol):
    """Everything the coordinator process's activities use (``registry.coordinator_activities``)."""
