"""Contracts of the coordinator's workflows and activities: names, inputs and results.

One dataclass in and one out per workflow, activity and signal (the Temporal
samples' habit), so fields can be added compatibly. The workflows that use
them are in ``workflows.coordinator``; the activities in
``activities.coordinator`` (coordinator side) and ``activities.transfers``
(shard side).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The engine's instruction is the one definition of a transfer: the coordinator
# plans it (pure, stdlib only) and the workflows carry it as it is (ADR 0136).
from shard_engine.coordination import COOLDOWN_REPORT_INTERVALS as COOLDOWN_REPORT_INTERVALS
from shard_engine.coordination import DOMAIN_LABEL as DOMAIN_LABEL
from shard_engine.coordination import CountUse as CountUse
from shard_engine.coordination import Instruction
from shard_engine.coordination import TransferKind as TransferKind
from shard_engine.coordination import answer_key as answer_key
from shard_engine.coordination import grant_count as grant_count
from workflows.contracts import DrainInput, MachineTarget, RequirementSpec

COORDINATOR_ID = "bigfleet-coordinator"
COORDINATOR_QUEUE = "bigfleet-coordinator"

# Coordinator-side activities (task queue COORDINATOR_QUEUE).
DISTRIBUTE = "bigfleet.coordinator.distribute"
PLAN = "bigfleet.coordinator.plan"
RECORD_INSTRUCTION = "bigfleet.coordinator.record_instruction"
FINISH_INSTRUCTION = "bigfleet.coordinator.finish_instruction"
# Shard-side activities (task queue shard-<id>, run by the lease holder).
ADOPT_MACHINES = "bigfleet.shard.adopt_machines"
RELEASE_MACHINES = "bigfleet.shard.release_machines"
PREPARE_PREEMPTION = "bigfleet.shard.prepare_preemption"
RETIRE_MACHINES = "bigfleet.shard.retire_machines"
PLAN_DECOMMISSION = "bigfleet.coordinator.plan_decommission"


@dataclass
class ProfileReport:
    """One machine shape a shard holds, and how many are idle, speculative or configured."""

    provider: str
    instance_type: str
    zone: str
    capacity_type: int
    labels: dict[str, str]
    allocatable: dict[str, float]
    idle: int = 0
    speculative: int = 0
    # priority (as a string key: JSON objects have string keys) -> configured count
    configured_by_priority: dict[str, int] = field(default_factory=dict)


@dataclass
class ShortfallReport:
    cluster_id: str
    need_key: str
    priority: int
    deficit: dict[str, float]
    requirements: list[RequirementSpec] = field(default_factory=list)
    min_unit: dict[str, float] = field(default_factory=dict)
    age_cycles: int = 0
    escalated: bool = False
    # Why the shard could not meet it (e.g. "drain requested 12 min ago, priority 1000000 waiting").
    reason: str = ""


@dataclass
class ShardReport:
    """What a shard tells the coordinator every report interval."""

    shard_id: str
    epoch: int
    sent_at: float
    total_machines: int
    profiles: list[ProfileReport] = field(default_factory=list)
    shortfalls: list[ShortfallReport] = field(default_factory=list)
    highest_term_seen: int = 0
    # When the cycle its shortfalls come from ran (the shard's clock; 0: not said).
    cycle_at: float = 0.0


TransferSpec = Instruction
"""One planned instruction, as the coordinator's workflows carry it."""


@dataclass
class PlanInput:
    reports: list[ShardReport]
    max_share: float


@dataclass
class IdleOffer:
    """Idle machines of one shape that another shard holds (``coordination.RemoteIdle``)."""

    shard_id: str
    labels: dict[str, str]
    allocatable: dict[str, float]
    count: int
    # Unclaimed slots beside them a gang may take with them (ADR 0173).
    speculative: int = 0


@dataclass
class PlanResult:
    transfers: list[TransferSpec]
    # Every shard's idle machines, less what these transfers take (ADR 0129), once:
    # each receiver is offered those of the others. Filled by a coordinator running
    # the fleet-idle patch.
    idle: list[IdleOffer] = field(default_factory=list)
    # The shards that may take them (the active ones that reported).
    receivers: list[str] = field(default_factory=list)


@dataclass
class FleetIdleQuery:
    """A shard asks, right after its report, what the other shards hold idle."""

    shard_id: str


@dataclass
class WantOffer:
    """A shortfall another shard reported, as it reported it (``coordination.RemoteWant``,
    ADR 0176)."""

    shard_id: str
    shortfall: ShortfallReport


@dataclass
class FleetIdleReply:
    """The idle machines the coordinator's last round offered one shard.

    ``offers`` also holds the machines of idle transfers still on their way
    to the shard: its need keeps waiting for them rather than buying while
    they move. ``seq`` is the round's sequence (0: no round yet) and
    ``planned_at`` its time (the coordinator's clock), so a shard can tell
    offers gone stale from a coordinator that stopped planning. ``wants`` are
    the other shards' shortfalls in their latest reports: a need of the
    shard leaves its idle machines to an older one that could use them.
    """

    offers: list[IdleOffer] = field(default_factory=list)
    seq: int = 0
    planned_at: float = 0.0
    wants: list[WantOffer] = field(default_factory=list)


@dataclass
class DistributeInput:
    term: int
    seq: int


@dataclass
class Adoption:
    shard_id: str
    machines: list[MachineTarget]


@dataclass
class DistributeResult:
    adoptions: list[Adoption]
    rebalance: list[TransferSpec] = field(default_factory=list)


@dataclass
class AdoptInput:
    term: int
    seq: int
    machines: list[MachineTarget]


@dataclass
class AdoptResult:
    adopted: int
    refused: str = ""


@dataclass
class ReleaseInput:
    term: int
    seq: int
    spec: TransferSpec


@dataclass
class ReleaseResult:
    moved: list[MachineTarget]
    refused: str = ""


@dataclass
class DrainStart:
    """A drain the donor prepared for a cross-shard preemption (id and input)."""

    workflow_id: str
    input: DrainInput


@dataclass
class PreemptionPlan:
    drains: list[DrainStart]
    refused: str = ""


@dataclass
class DecommissionInput:
    """Retire ``count`` machines of a domain (``label`` = ``value``) at ``provider``."""

    provider: str
    label: str
    value: str
    count: int
    reason: str = "decommissioned"


@dataclass
class DecommissionPlan:
    # shard id -> machine ids it gives up (every shard the same share)
    by_shard: dict[str, list[str]]


@dataclass
class RetireInput:
    machine_ids: list[str]
    reason: str


@dataclass
class RetireResult:
    retired: int
    draining: int


@dataclass
class DecommissionResult:
    retired: dict[str, int]


@dataclass
class InstructionRecord:
    term: int
    seq: int
    kind: str
    donor: str
    receiver: str
    spec: TransferSpec


@dataclass
class InstructionOutcome:
    term: int
    seq: int
    status: str
    outcome: str


@dataclass
class TransferInput:
    term: int
    seq: int
    spec: TransferSpec


@dataclass
class TransferResult:
    status: str
    moved: int
    outcome: str


# The query a shard sends after its report to learn what the other shards hold
# idle (ADR 0129); queries write nothing to the coordinator's history.
FLEET_IDLE = "fleet_idle"
# The update a shard sends after its report to learn its shares of the fleet-wide
# count budgets (ADR 0140).
BUDGET_SHARES = "budget-shares"
#: A shard not heard from for this many report intervals no longer holds a share.
BUDGET_STALE_INTERVALS = 10


@dataclass
class BudgetCount:
    """One count budget as a shard sees it: its cap, its scope there, its drains there."""

    name: str
    cap: int
    in_scope: int
    draining: int
    # Drains the budget held back there in the shard's last cycle.
    held: int = 0
    # The share the shard drains under as it counts (its last answer or its fallback):
    # until it says it dropped a share, that share is not free for another (ADR 0168).
    in_force: int = 0


@dataclass
class BudgetShareAsk:
    """A shard's census of its count budgets; the answer is its share of each."""

    shard_id: str
    epoch: int
    counts: list[BudgetCount] = field(default_factory=list)

    def problems(self) -> list[str]:
        """What makes the ask unusable, each naming the field (empty when it is fine)."""
        found = [] if self.shard_id else ["shard_id: empty"]
        names = [c.name for c in self.counts]
        if len(set(names)) != len(names):
            found.append("counts: a budget appears twice")
        for i, c in enumerate(self.counts):
            if not c.name:
                found.append(f"counts[{i}].name: empty")
            for label, value in (
                ("cap", c.cap),
                ("in_scope", c.in_scope),
                ("draining", c.draining),
                ("in_force", c.in_force),
            ):
                if value < 0:
                    found.append(f"counts[{i}].{label}: {value} is negative")
        return found


@dataclass
class BudgetShareAnswer:
    """A shard's share of each count budget it asked about, under the coordinator's term."""

    term: int
    shards: int
    shares: dict[str, int] = field(default_factory=dict)


def deal_shares(
    asks: dict[str, BudgetShareAsk],
    granted: dict[str, dict[str, int]],
    asking: BudgetShareAsk,
) -> dict[str, int]:
    """The shares to grant ``asking``, from every shard's latest census and grants.

    A budget's cap is the smallest any shard reports (shards read the same
    file; while one is being changed, the tighter one holds).
    """
    shares: dict[str, int] = {}
    for count in asking.counts:
        reported = [
            (shard_id, c)
            for shard_id, ask in sorted(asks.items())
            for c in ask.counts
            if c.name == count.name
        ]
        cap = min(c.cap for _, c in reported)
        uses = [
            CountUse(shard_id, c.in_scope, c.draining, c.held, c.in_force)
            for shard_id, c in reported
        ]
        held = {s: g[count.name] for s, g in granted.items() if count.name in g}
        shares[count.name] = grant_count(cap, uses, asking=asking.shard_id, granted=held)
    return shares


@dataclass
class CoordinatorInput:
    """The coordinator's whole state, carried through continue-as-new."""

    term: int
    interval_s: float = 30.0
    max_share: float = 0.05
    seq: int = 0
    reports: dict[str, ShardReport] = field(default_factory=dict)
    # (receiver|cluster|need) -> workflow.now() timestamp before which it is not re-planned
    cooldown: dict[str, float] = field(default_factory=dict)
    # Per answer key, when its last instruction ended: a shortfall is answered again
    # only from a report whose cycle ran after that (``ShardReport.cycle_at``).
    answered: dict[str, float] = field(default_factory=dict)
    rounds_per_run: int = 200
    # Planning rounds completed by this coordinator term, across continue-as-new.
    rounds: int = 0
    # Fleet-wide count budgets: each shard's latest census, when it asked, and its grant.
    budget_asks: dict[str, BudgetShareAsk] = field(default_factory=dict)
    budget_asked_at: dict[str, float] = field(default_factory=dict)
    budget_grants: dict[str, dict[str, int]] = field(default_factory=dict)
    # The last round's idle offers, as ``PlanResult`` gave them, with the shards they
    # are for and that round's seq and time: a run started by continue-as-new answers
    # ``fleet_idle`` with them until its first round, so no shard reads an empty fleet
    # in between (ADR 0129). Transfers under way are not carried: a run continues as
    # new only once none is.
    idle_offers: list[IdleOffer] = field(default_factory=list)
    idle_receivers: list[str] = field(default_factory=list)
    offers_seq: int = 0
    offers_at: float = 0.0
