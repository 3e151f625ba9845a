"""Inputs and outputs of the machine workflows and the activities they call.

One dataclass in and one out per workflow and activity, so fields can be
added compatibly. Activities are referenced by the names below; their
implementations live in ``activities/`` and register under these names.
Durations are carried as seconds (the default converter has no timedelta).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Activity names (the contract between workflows/ and activities/).
CREATE_MACHINES = "bigfleet.create_machines"
CONFIGURE_MACHINES = "bigfleet.configure_machines"
OBSERVE_MACHINES = "bigfleet.observe_machines"
RECORD_OUTCOMES = "bigfleet.record_outcomes"

# Machine state names as they appear in phases, outcomes and search attributes.
SPECULATIVE = "SPECULATIVE"
CREATING = "CREATING"
IDLE = "IDLE"
CONFIGURING = "CONFIGURING"
CONFIGURED = "CONFIGURED"
DRAINING = "DRAINING"
DELETING = "DELETING"
FAILED = "FAILED"


@dataclass
class MachineTarget:
    """A machine and the provider (by configured name) that owns it."""

    machine_id: str
    provider: str


@dataclass
class RequirementSpec:
    """A node-selector requirement in workflow-safe form (operator as its wire number)."""

    key: str
    operator: int
    values: list[str] = field(default_factory=list)


@dataclass
class Deadlines:
    """Seconds each transitional state may last before the machine is declared FAILED."""

    creating_s: float = 600.0
    configuring_s: float = 600.0


@dataclass
class PollPolicy:
    """How often a waiting workflow re-reads the provider: exponential backoff, capped."""

    initial_s: float = 0.5
    max_s: float = 15.0
    multiplier: float = 2.0


@dataclass
class ProvisionInput:
    """Bring machines into ``cluster_id``: create them first unless they are already idle."""

    shard_id: str
    cluster_id: str
    need_key: str
    priority: int
    operation_seq: int
    machines: list[MachineTarget]
    requirements: list[RequirementSpec] = field(default_factory=list)
    create: bool = True
    deadlines: Deadlines = field(default_factory=Deadlines)
    poll: PollPolicy = field(default_factory=PollPolicy)


@dataclass
class MachineOutcome:
    """Where one machine ended up, and why if it is not where it was sent."""

    machine_id: str
    provider: str
    state: str
    last_error: str = ""


@dataclass
class ProvisionResult:
    outcomes: list[MachineOutcome]

    @property
    def configured(self) -> list[str]:
        return [o.machine_id for o in self.outcomes if o.state == CONFIGURED]


# ----------------------------------------------------------------- activities


@dataclass
class CreateMachinesInput:
    shard_id: str
    operation_seq: int
    machines: list[MachineTarget]


@dataclass
class ConfigureMachinesInput:
    shard_id: str
    cluster_id: str
    need_key: str
    priority: int
    operation_seq: int
    machines: list[MachineTarget]
    requirements: list[RequirementSpec] = field(default_factory=list)


@dataclass
class TransitionResults:
    """Per-machine answer of a batch of lifecycle calls: accepted, or refused with a reason."""

    accepted: list[str]
    refused: list[MachineOutcome] = field(default_factory=list)


@dataclass
class ObserveMachinesInput:
    shard_id: str
    machines: list[MachineTarget]


@dataclass
class ObservedMachines:
    machines: list[MachineOutcome]


@dataclass
class RecordOutcomesInput:
    """Fold a finished operation's outcomes into the shard's inventory and the store."""

    shard_id: str
    cluster_id: str
    need_key: str
    operation: str
    operation_seq: int
    outcomes: list[MachineOutcome]
