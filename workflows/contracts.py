"""Inputs and outputs of the machine workflows and the activities they call.

One dataclass in and one out per workflow and activity, so fields can be
added compatibly. Activities are referenced by the names below; their
implementations live in ``activities/`` and register under these names.
Durations are carried as seconds (the default converter has no timedelta).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

# Activity names (the contract between workflows/ and activities/).
CREATE_MACHINES = "bigfleet.create_machines"
CONFIGURE_MACHINES = "bigfleet.configure_machines"
OBSERVE_MACHINES = "bigfleet.observe_machines"
RECORD_OUTCOMES = "bigfleet.record_outcomes"
DRAIN_MACHINE = "bigfleet.drain_machine"
DELETE_MACHINE = "bigfleet.delete_machine"
NOTIFY_RECLAIM = "bigfleet.notify_reclaim"
REPORT_BLOCKED_DRAIN = "bigfleet.report_blocked_drain"
RECORD_MACHINE = "bigfleet.record_machine"
START_RECOVERIES = "bigfleet.start_recoveries"

# Machine state names as they appear in phases, outcomes and search attributes.
SPECULATIVE = "SPECULATIVE"
CREATING = "CREATING"
IDLE = "IDLE"
CONFIGURING = "CONFIGURING"
CONFIGURED = "CONFIGURED"
DRAINING = "DRAINING"
DELETING = "DELETING"
FAILED = "FAILED"


class OperatorSignal(StrEnum):
    """An operator's command to a per-machine workflow (drain, delete, recovery).

    Each value is the signal's name on the wire: recorded histories and a
    running workflow's pending signals carry it, so a value never changes.
    Senders signal by method reference (``handle.signal(DrainWorkflow.force)``);
    the workflow queues the command under this kind and decides what it means.
    """

    ESCALATE = "escalate"
    FORCE = "force"
    RETRY = "retry"
    ABANDON = "abandon"
    RESOLVE = "resolve"


class ShardSignal(StrEnum):
    """A shard's own signal to every workflow it started (not an operator's command)."""

    # The shard was paused, put in dry run, or resumed (ShardModeSignal).
    MODE = "shard-mode"


# Values of the BigFleetShardMode search attribute: what the starting shard was
# allowed to do when the workflow started, or last since (ADR 0153).
SHARD_ACTIVE = "active"
SHARD_PAUSED = "paused"
SHARD_DRY_RUN = "dry-run"
SHARD_MODES = frozenset({SHARD_ACTIVE, SHARD_PAUSED, SHARD_DRY_RUN})


class WorkflowQuery(StrEnum):
    """Queries every machine workflow answers (per-machine and provisioning batches alike)."""

    VIEW = "view"


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
    """Seconds each transitional state may last before the machine is declared FAILED.

    A drain may last its grace period plus ``draining_margin_s``; a forced
    drain (zero grace) gets the margin alone.
    """

    creating_s: float = 600.0
    configuring_s: float = 600.0
    draining_margin_s: float = 300.0
    deleting_s: float = 600.0


def capacity_label(capacity_type: str) -> str:
    """``BARE_METAL`` / ``bare-metal`` -> ``bare-metal`` (the provider's label)."""
    return capacity_type.lower().replace("_", "-")


def default_deadline_overrides() -> dict[str, dict[str, float]]:
    """Bare metal may need commissioning (firmware, OS install, burn-in): 6 h to create."""
    return {"bare-metal": {"creating_s": 6 * 3600.0}}


@dataclass
class DeadlinePolicy:
    """Deadlines per provider and capacity type: a default plus field overrides.

    ``overrides`` maps a key to ``{field: seconds}``; keys are tried from the
    most to the least specific: ``"<provider>/<capacity>"``, ``"<provider>"``,
    ``"<capacity>"`` (capacity as its label, e.g. ``bare-metal``, ``spot``).
    Every matching override applies, the more specific winning.
    """

    default: Deadlines = field(default_factory=Deadlines)
    overrides: dict[str, dict[str, float]] = field(default_factory=default_deadline_overrides)

    def for_machine(self, provider: str, capacity_type: str) -> Deadlines:
        label = capacity_label(capacity_type)
        values = dict(vars(self.default))
        for key in (label, provider, f"{provider}/{label}"):
            for name, seconds in self.overrides.get(key, {}).items():
                if name not in values:
                    raise ValueError(f"deadline override {key!r}: unknown field {name!r}")
                values[name] = float(seconds)
        return Deadlines(**values)


@dataclass
class PollPolicy:
    """How often a waiting workflow re-reads the provider: exponential backoff, capped.

    The cap grows with the time already spent waiting (``elapsed_fraction``
    of it), so an hours-long drain or commissioning is read a few hundred
    times at most and its history stays small.
    """

    initial_s: float = 0.5
    max_s: float = 15.0
    multiplier: float = 2.0
    elapsed_fraction: float = 0.05

    def next_delay(self, delay: float, waited_s: float) -> float:
        """The delay after ``delay``, given ``waited_s`` seconds spent waiting so far."""
        cap = max(self.max_s, waited_s * self.elapsed_fraction)
        return min(delay * self.multiplier, cap)


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
    # Failed machines handed to a RecoverWorkflow each (they record their own outcome).
    handed_off: list[str] = field(default_factory=list)

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


# ------------------------------------------------------ per-machine workflows
#
# Every drain, delete, verification and every machine that failed in a batch
# has its own workflow (ADR 0002), findable by ``BigFleetMachineId`` and
# driven by the same five signals and one query.

# Operations as they appear in workflow ids and ``BigFleetOperation``.
OP_PROVISION = "provision"
OP_CONFIGURE = "configure"
OP_DRAIN = "drain"
OP_DELETE = "delete"
OP_VERIFY = "verify"
OP_RECOVER = "recover"

# Why a drain, delete or recovery runs (BigFleetReason, the UI summary, the CLI,
# bigfleet_shard_actions_total{reason}). One word per cause, DESIGN §8.
REASON_RECLAIM = "reclaim"  # excess its cluster no longer needs (Phase 3)
REASON_PREEMPT = "preempt"  # freed for a higher-priority need, here or on another shard
REASON_RELEASE = "release"  # an idle cloud machine past its hold is deleted
REASON_OPERATOR = "operator"  # a person asked for it
REASON_DECOMMISSION = "decommission"  # its domain is being retired
REASON_SHARD_DRAIN = "shard-drain"  # its shard is being drained
REASON_VERIFY_FAILED = "verify-failed"  # its cluster stopped reporting it and the provider agrees
REASON_CREATE_FAILED = "create-failed"  # a batch's Create failed for it
REASON_CONFIGURE_FAILED = "configure-failed"  # a batch's Configure failed for it
REASON_INTERRUPTION = "interruption"  # its provider announced it is about to be taken back
REASONS = (
    REASON_RECLAIM,
    REASON_PREEMPT,
    REASON_RELEASE,
    REASON_OPERATOR,
    REASON_DECOMMISSION,
    REASON_SHARD_DRAIN,
    REASON_VERIFY_FAILED,
    REASON_CREATE_FAILED,
    REASON_CONFIGURE_FAILED,
    REASON_INTERRUPTION,
)


@dataclass
class Waiter:
    """Who is waiting for this machine: the preemptor a drain frees it for."""

    cluster_id: str
    need_key: str
    priority: int


@dataclass
class DrainInput:
    """Drain one configured machine back to Idle (optionally then release it).

    ``grace_seconds`` is the engine's choice (by priority gap for a
    preemption). ``waiter`` is set for a preemption: the drain is reported
    as blocking that need once it outlasts its grace.
    """

    shard_id: str
    machine: MachineTarget
    cluster_id: str
    grace_seconds: int
    operation_seq: int
    reason: str = REASON_RECLAIM
    victim_priority: int = 0
    waiter: Waiter | None = None
    release_after: bool = False
    deadlines: Deadlines = field(default_factory=Deadlines)
    poll: PollPolicy = field(default_factory=PollPolicy)
    # How often a blocked preemption is re-reported while it stays blocked.
    blocked_report_every_s: float = 300.0


@dataclass
class DeleteInput:
    """Release one idle cloud machine: Idle -> Deleting -> Speculative."""

    shard_id: str
    machine: MachineTarget
    operation_seq: int
    deadlines: Deadlines = field(default_factory=Deadlines)
    poll: PollPolicy = field(default_factory=PollPolicy)
    reason: str = REASON_RELEASE


@dataclass
class VerifyInput:
    """Ask the provider whether a configured machine its cluster stopped reporting is alive."""

    shard_id: str
    machine: MachineTarget
    cluster_id: str
    operation_seq: int


@dataclass
class RecoverInput:
    """One machine of a batch that failed while ``failed_in`` (CREATING or CONFIGURING).

    Carries what the batch knew, so the corrective action can finish the
    original operation (configure for ``cluster_id``) or give the machine
    back. The outcome is recorded at the batch's ``operation_seq``.
    """

    shard_id: str
    machine: MachineTarget
    failed_in: str
    last_error: str
    cluster_id: str
    need_key: str
    priority: int
    operation_seq: int
    requirements: list[RequirementSpec] = field(default_factory=list)
    deadlines: Deadlines = field(default_factory=Deadlines)
    poll: PollPolicy = field(default_factory=PollPolicy)
    # Provider errors meaning the slot itself is bad (the engine stops using it).
    bad_slot_markers: list[str] = field(
        default_factory=lambda: ["InsufficientInstanceCapacity", "quota", "slot is bad"]
    )


@dataclass
class StartRecoveriesInput:
    """Start one RecoverWorkflow per failed machine of a batch (idempotent by workflow id)."""

    shard_id: str
    recoveries: list[RecoverInput]


@dataclass
class StartedWorkflows:
    workflow_ids: list[str]


@dataclass
class MachineResult:
    """How a per-machine workflow ended."""

    machine_id: str
    state: str
    succeeded: bool
    last_error: str = ""
    note: str = ""


# Signals (one dataclass for each that carries data).


@dataclass
class EscalateSignal:
    """Shorten a running drain's grace period to ``grace_seconds``."""

    grace_seconds: int


@dataclass
class ShardModeSignal:
    """The starting shard's control changed: ``mode`` is one of ``SHARD_MODES``."""

    mode: str
    reason: str = ""


@dataclass
class ResolveSignal:
    """An operator fixed the machine out of band; re-read the provider and continue."""

    note: str = ""


@dataclass
class MachineView:
    """What the ``view`` query returns: everything a person needs to decide a signal."""

    workflow_id: str
    operation: str
    machine_id: str
    provider: str
    shard_id: str
    cluster_id: str
    phase: str
    machine_state: str = ""
    operation_seq: int = 0
    started_unix: float = 0.0
    phase_since_unix: float = 0.0
    deadline_unix: float | None = None
    grace_seconds: int | None = None
    attempts: int = 0
    last_error: str = ""
    provider_operation_ids: list[str] = field(default_factory=list)
    waiting: Waiter | None = None
    blocked_since_unix: float | None = None
    awaiting_operator: bool = False
    signals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Why the operation runs (REASON_*); empty for provisioning and verification.
    reason: str = ""
    priority: int = 0


# Activities of the per-machine workflows.


@dataclass
class DrainMachineInput:
    shard_id: str
    machine: MachineTarget
    grace_seconds: int


@dataclass
class DeleteMachineInput:
    shard_id: str
    machine: MachineTarget


@dataclass
class TransitionAnswer:
    """One provider's answer to one lifecycle call.

    ``accepted`` with the provider's ``operation_id`` (a repeat of an
    operation in flight returns the same id), or refused with the provider
    error's name in ``refusal`` (``InvalidTransition``, ``NotFound``,
    ``Unimplemented``) and its message in ``detail``.
    """

    accepted: bool
    state: str = ""
    operation_id: str = ""
    refusal: str = ""
    detail: str = ""


@dataclass
class NotifyReclaimInput:
    """Tell the cluster's operator, over its session, to drain these nodes."""

    shard_id: str
    cluster_id: str
    instruction_id: str
    machine_ids: list[str]
    grace_seconds: int
    preemptor_priority: int = 0


@dataclass
class ReclaimDelivery:
    delivered: bool


@dataclass
class BlockedDrain:
    """A preemption drain that outlasted its grace while a higher priority waits."""

    shard_id: str
    machine_id: str
    victim_cluster_id: str
    waiter: Waiter
    requested_unix: float
    grace_seconds: int
    workflow_id: str


@dataclass
class RecordMachineInput:
    """Fold one machine's finished operation into the inventory and the store, once.

    ``cluster_id`` is the machine's binding afterwards ("" when unbound).
    ``quarantine`` tells the shard to stop using the machine (a bad slot, or
    one an operator abandoned for investigation). ``succeeded`` says whether
    the operation reached its goal (its name in the assignment log gets a
    ``-failed`` suffix otherwise).
    """

    shard_id: str
    operation: str
    operation_seq: int
    outcome: MachineOutcome
    succeeded: bool
    cluster_id: str = ""
    need_key: str = ""
    quarantine: bool = False
    note: str = ""
    # False when nothing durable changed (a verification that found the machine alive).
    persist: bool = True
