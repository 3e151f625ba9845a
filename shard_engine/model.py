"""The engine's vocabulary: machines, needs, roll-ups and the actions a cycle plans.

These are plain frozen values shared by the engine and its callers. The
integer values of the enums equal the wire enums of ``bigfleet.v1alpha1`` so
conversion at the edge is a cast, but nothing here imports the wire code.
Resource maps are ``name -> float`` in canonical units (see ``quantity``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shard_engine.actions import ActionTable

__all__ = [
    "Action",
    "AppClass",
    "AssignIdle",
    "CapacityType",
    "MachineRecord",
    "MachineState",
    "Need",
    "Operator",
    "Plan",
    "Preempt",
    "Provision",
    "Reclaim",
    "Release",
    "Requirement",
    "Rollup",
    "Shortfall",
    "TopologySpread",
    "Verify",
    "WhenUnsatisfiable",
    "penalty_bucket_dollars",
]


class MachineState(IntEnum):
    """The eight machine states (values equal ``bigfleet.v1alpha1.MachineState``)."""

    UNSPECIFIED = 0
    SPECULATIVE = 1
    CREATING = 2
    IDLE = 3
    CONFIGURING = 4
    CONFIGURED = 5
    DRAINING = 6
    DELETING = 7
    FAILED = 8

    @property
    def transitional(self) -> bool:
        """True while the machine is moving between stable states."""
        return self in _TRANSITIONAL

    @property
    def has_host(self) -> bool:
        """A real host exists in every state but SPECULATIVE and CREATING."""
        return self not in (
            MachineState.SPECULATIVE,
            MachineState.CREATING,
            MachineState.UNSPECIFIED,
        )


_TRANSITIONAL = frozenset(
    {MachineState.CREATING, MachineState.CONFIGURING, MachineState.DRAINING, MachineState.DELETING}
)


class CapacityType(IntEnum):
    """Cost-of-holding category (values equal ``bigfleet.v1alpha1.CapacityType``)."""

    UNSPECIFIED = 0
    BARE_METAL = 1
    RESERVED = 2
    ON_DEMAND = 3
    SPOT = 4


class Operator(IntEnum):
    """Node-selector operators (values equal the wire's ``NodeSelectorRequirement.Operator``)."""

    IN = 1
    NOT_IN = 2
    EXISTS = 3
    DOES_NOT_EXIST = 4
    SAME = 5


class WhenUnsatisfiable(IntEnum):
    """Topology-spread strictness (values equal the wire's enum)."""

    UNSPECIFIED = 0
    DO_NOT_SCHEDULE = 1
    SCHEDULE_ANYWAY = 2


class AppClass(Enum):
    """Application class from "Reclaiming the Gap": orders victims of equal priority.

    Best-effort work is preempted before batch, batch before latency-sensitive.
    """

    LATENCY_SENSITIVE = "latency-sensitive"
    BATCH = "batch"
    BEST_EFFORT = "best-effort"


# PenaltyBucket wire values -> dollars (the bucket's upper bound).
_PINNED_DOLLARS = 1e12


def penalty_bucket_dollars(bucket: int) -> float:
    """Map a wire ``PenaltyBucket`` value to dollars: the bucket's upper bound.

    UNSPECIFIED and ZERO are $0, HALF_DOLLAR is $0.50, bucket ``k`` (3..26) is
    ``2**(k-3)`` dollars, and PINNED is effectively infinite (a large finite
    number, so arithmetic stays finite). Unknown values raise ``ValueError``.
    """
    if bucket in (0, 1):
        return 0.0
    if bucket == 2:
        return 0.5
    if 3 <= bucket <= 26:
        return float(2 ** (bucket - 3))
    if bucket == 27:
        return _PINNED_DOLLARS
    raise ValueError(f"unknown penalty bucket {bucket}")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node-selector requirement on a machine's labels."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TopologySpread:
    """Spread the need's machines over values of ``topology_key`` with at most ``max_skew``."""

    topology_key: str
    max_skew: int
    when_unsatisfiable: WhenUnsatisfiable = WhenUnsatisfiable.DO_NOT_SCHEDULE


@dataclass(frozen=True, slots=True)
class Need:
    """A constrained aggregate request from one cluster.

    ``aggregate`` is the total demand; ``min_unit`` is what every machine
    serving the need must hold on its own. Penalties are in dollars.
    """

    requirements: tuple[Requirement, ...]
    aggregate: Mapping[str, float]
    priority: int
    min_unit: Mapping[str, float] = field(default_factory=dict)
    spread: tuple[TopologySpread, ...] = ()
    interruption_penalty: float = 0.0
    reclamation_penalty: float = 0.0
    app_class: AppClass = AppClass.BATCH
    # Machines able to serve this need are not reclaimed as excess within this
    # many seconds of being configured (a wire extension; shard_engine.budgets).
    # Not part of the key: asking for it does not make it another need.
    do_not_disrupt_seconds: float = 0.0
    # Which gang of its cluster with otherwise equal key this is (0: the first). The
    # wire has no gang field: each need with a Same requirement is one gang, never
    # merged with another (ADR 0126); the roll-up's validation numbers them in order.
    gang: int = 0
    # The gang's own name (the wire extension ``gang_name``, ADR 0161): when given, it
    # is the gang's identity and ``gang`` stays 0; gangs then keep their keys whatever
    # other gangs of the cluster come and go.
    gang_name: str = ""

    @property
    def key(self) -> str:
        """Stable identity of the need within its cluster: the aggregation key.

        Two roll-ups that list a need with the same requirements, priority,
        spread and penalties refer to the same need even if its size changed.
        A gang with a name (``gang_name``) is told apart by it; the second and
        later unnamed gangs with such a key are told apart by ``gang``.
        The values of a ``Same`` requirement are not part of it: a gang whose
        first pods run names their domain from then on (ADR 0158), and stays
        the same need, with its machines, arrival and history.
        """
        parts = [
            repr(
                sorted(
                    (
                        r.key,
                        int(r.operator),
                        () if r.operator is Operator.SAME else tuple(sorted(r.values)),
                    )
                    for r in self.requirements
                )
            ),
            str(self.priority),
            repr(
                sorted((s.topology_key, s.max_skew, int(s.when_unsatisfiable)) for s in self.spread)
            ),
            repr(self.interruption_penalty),
            repr(self.reclamation_penalty),
        ]
        if self.gang_name:
            parts.append(f"gang name {self.gang_name}")
        elif self.gang:
            parts.append(f"gang {self.gang}")
        return hashlib.blake2b("|".join(parts).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Rollup:
    """A cluster's complete demand at one instant (full replacement)."""

    cluster_id: str
    timestamp_ns: int
    needs: tuple[Need, ...]
    # Node names the cluster currently reports, when it reports them (health checks).
    reported_nodes: frozenset[str] | None = None
    # Machines the cluster offers for release. When given (even empty), Phase 3
    # reclaims the cluster's excess from these machines only and never from any
    # other of its machines (a scheduler keeping named workers; ADR 0070).
    # None: any excess may go.
    release: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class MachineRecord:
    """What the shard knows of one machine (usually as a provider reported it)."""

    id: str
    state: MachineState
    provider: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    price_per_hour: float
    interruption_probability: float
    allocatable: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)
    cluster: str = ""
    host_ref: str = ""
    last_error: str = ""


# ---------------------------------------------------------------------------
# Actions: what a cycle decides. The shard process turns each into a workflow.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignIdle:
    """Configure an idle machine for ``cluster_id`` (no Create needed)."""

    machine_id: str
    cluster_id: str
    need_key: str
    priority: int
    requirements: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Provision:
    """Create these speculative machines, then configure them for ``cluster_id``."""

    machine_ids: tuple[str, ...]
    cluster_id: str
    need_key: str
    priority: int
    requirements: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Preempt:
    """Drain a lower-priority cluster's machine; it is promised to the preemptor."""

    machine_id: str
    victim_cluster_id: str
    victim_priority: int
    preemptor_cluster_id: str
    preemptor_need_key: str
    preemptor_priority: int
    grace_seconds: int


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Drain an excess machine back to Idle (its cluster no longer needs it).

    ``reason`` says why, for the workflow's BigFleetReason: the engine's own
    reclaims are ``reclaim``, its drains of a machine its provider warned
    will be interrupted are ``interruption``; the shard process drains
    through this action for other causes too (``decommission``).
    """

    machine_id: str
    cluster_id: str
    grace_seconds: int
    reason: str = "reclaim"  # REASON_RECLAIM


REASON_RECLAIM = "reclaim"
"""``Reclaim.reason`` of the engine's own reclaim of excess (Phase 3)."""
REASON_INTERRUPTION = "interruption"
"""``Reclaim.reason`` of a drain ahead of an announced interruption (``interruptions``)."""


@dataclass(frozen=True, slots=True)
class Release:
    """Delete an idle cloud machine whose hold period expired."""

    machine_id: str


@dataclass(frozen=True, slots=True)
class Verify:
    """Ask the provider whether a configured machine the cluster stopped reporting is alive."""

    machine_id: str
    cluster_id: str


Action = AssignIdle | Provision | Preempt | Reclaim | Release | Verify


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Demand the shard could not meet this cycle."""

    cluster_id: str
    need_key: str
    priority: int
    deficit: Mapping[str, float]
    age_cycles: int
    escalated: bool
    reason: str
    interruption_penalty: float = 0.0
    # A gang that holds part of one domain but runs nothing is short of what that
    # domain lacks, and names it (the value of its Same key; ADR 0180). "" otherwise.
    domain: str = ""


class Plan:
    """Everything one cycle decided. Carrying it out is the caller's job.

    ``actions`` is the tuple of action values. A plan made by the engine
    carries them as columns (``table``, an
    :class:`~shard_engine.actions.ActionTable`) and builds the values the
    first time ``actions`` is read, so the cycle itself never constructs
    them; consumers that want speed read the table instead. A plan can also
    be made from values directly (``Plan(now=..., actions=(...))``), and
    then has no table. Plans are immutable.
    """

    __slots__ = ("_actions", "_table", "dry_run", "now", "shortfalls", "why_not")

    now: float
    shortfalls: tuple[Shortfall, ...]
    # (cluster_id, need_key) -> why that need is not satisfied.
    why_not: Mapping[tuple[str, str], str]
    dry_run: bool
    _actions: tuple[Action, ...] | None
    _table: ActionTable | None

    def __init__(
        self,
        now: float,
        actions: tuple[Action, ...] | None = None,
        shortfalls: tuple[Shortfall, ...] = (),
        why_not: Mapping[tuple[str, str], str] | None = None,
        dry_run: bool = False,
        *,
        table: ActionTable | None = None,
    ) -> None:
        if actions is not None and table is not None:
            raise ValueError("a plan takes its actions either as values or as a table, not both")
        setter = object.__setattr__
        setter(self, "now", now)
        setter(self, "_actions", () if actions is None and table is None else actions)
        setter(self, "_table", table)
        setter(self, "shortfalls", shortfalls)
        setter(self, "why_not", {} if why_not is None else why_not)
        setter(self, "dry_run", dry_run)

    @property
    def actions(self) -> tuple[Action, ...]:
        """The actions, in plan order (built from the table on first use)."""
        if self._actions is None:
            assert self._table is not None
            object.__setattr__(self, "_actions", self._table.actions())
        assert self._actions is not None
        return self._actions

    @property
    def table(self) -> ActionTable | None:
        """The actions as columns, when the engine made this plan (None for a hand-made one)."""
        return self._table

    @property
    def action_count(self) -> int:
        """``len(plan.actions)`` without building the values."""
        if self._actions is not None:
            return len(self._actions)
        assert self._table is not None
        return self._table.actions_count

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Plan is immutable: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (
            self.now == other.now
            and self.actions == other.actions
            and self.shortfalls == other.shortfalls
            and dict(self.why_not) == dict(other.why_not)
            and self.dry_run == other.dry_run
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Plan(now={self.now!r}, actions={self.actions!r}, shortfalls={self.shortfalls!r}, "
            f"why_not={self.why_not!r}, dry_run={self.dry_run!r})"
        )
