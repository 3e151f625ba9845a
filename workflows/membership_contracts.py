"""Contracts of the membership workflows (cluster moves, handovers) and their activities.

The shard-side halves (``release_cluster``, ``hand_over``) are in
``activities.membership``; the receiver's half is the coordinator's
``adopt_machines`` (``workflows.coordinator_contracts``). The workflows are in
``workflows.membership``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workflows.contracts import MachineTarget

# Coordinator-side activities (task queue bigfleet-coordinator).
PLAN_MEMBERSHIP = "bigfleet.coordinator.plan_membership"
RECORD_MEMBERSHIP = "bigfleet.coordinator.record_membership"
# Shard-side activities (task queue shard-<id>).
RELEASE_CLUSTER = "bigfleet.shard.release_cluster"
HAND_OVER = "bigfleet.shard.hand_over"

# The error type a donor raises while the cluster still has machines in motion.
MACHINES_IN_MOTION = "MachinesInMotion"


@dataclass
class MembershipPlanInput:
    term: int


@dataclass
class ClusterMoveSpec:
    cluster_id: str
    donor: str
    receiver: str


@dataclass
class HandoverSpec:
    donor: str
    receiver: str
    machines: list[MachineTarget] = field(default_factory=list)


@dataclass
class MembershipPlan:
    moves: list[ClusterMoveSpec] = field(default_factory=list)
    handovers: list[HandoverSpec] = field(default_factory=list)


@dataclass
class MembershipRecord:
    """A membership instruction, persisted before it is carried out."""

    term: int
    seq: int
    kind: str
    donor: str
    receiver: str
    cluster_id: str = ""
    machine_ids: list[str] = field(default_factory=list)


@dataclass
class ClusterMoveInput:
    term: int
    seq: int
    spec: ClusterMoveSpec


@dataclass
class HandoverInput:
    term: int
    seq: int
    spec: HandoverSpec


@dataclass
class ReleaseClusterInput:
    term: int
    seq: int
    cluster_id: str
    receiver: str


@dataclass
class ReleaseClusterResult:
    """What moved, and the shard that now serves the cluster (may differ from the one asked
    for when an earlier move already won)."""

    machines: list[MachineTarget] = field(default_factory=list)
    receiver: str = ""
    refused: str = ""


@dataclass
class HandOverInput:
    term: int
    seq: int
    receiver: str
    machines: list[MachineTarget] = field(default_factory=list)


@dataclass
class HandOverResult:
    moved: list[MachineTarget] = field(default_factory=list)
    refused: str = ""


@dataclass
class MembershipResult:
    status: str
    moved: int
    outcome: str
