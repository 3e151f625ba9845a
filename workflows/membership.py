"""Shard membership: moving a draining shard's clusters and unbound machines to active shards.

    CoordinatorWorkflow round ── plan_membership ──▶ ClusterMoveWorkflow  one per cluster
                                                 └─▶ HandoverWorkflow     one per (donor, receiver)

    ClusterMoveWorkflow  record ▸ release_cluster on the donor ▸ adopt_machines on the receiver
                         ▸ finish.  The donor stops planning for the cluster, waits (retrying,
                         visibly) until none of its machines is in motion, moves the cluster
                         and its bound machines in PostgreSQL by compare-and-set, and closes
                         the operator's session naming the new shard.
    HandoverWorkflow     record ▸ hand_over on the donor ▸ adopt_machines on the receiver
                         ▸ finish.  Unbound machines (idle cloud machines, bare-metal racks).

Both carry the coordinator's (term, seq) like every instruction, and only a
shard whose state in PostgreSQL is 'draining' gives anything away this way —
an operator's ``bigfleet shards drain`` is the only thing that sets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.contracts import MachineTarget
from workflows.retries import INSTRUCTION_RETRY, QUICK

# Coordinator-side activities (task queue bigfleet-coordinator).
PLAN_MEMBERSHIP = "bigfleet.coordinator.plan_membership"
RECORD_MEMBERSHIP = "bigfleet.coordinator.record_membership"
# Shard-side activities (task queue shard-<id>).
RELEASE_CLUSTER = "bigfleet.shard.release_cluster"
HAND_OVER = "bigfleet.shard.hand_over"
# Shared with the coordinator's transfers.
ADOPT_MACHINES = "bigfleet.shard.adopt_machines"
FINISH_INSTRUCTION = "bigfleet.coordinator.finish_instruction"

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


# The shapes of the shared activities (same fields as workflows.coordinator's).
@dataclass
class _AdoptInput:
    term: int
    seq: int
    machines: list[MachineTarget]


@dataclass
class _AdoptResult:
    adopted: int
    refused: str = ""


@dataclass
class _Outcome:
    term: int
    seq: int
    status: str
    outcome: str


# A donor waits for machines in motion by failing retryably: the wait is visible
# in the Temporal UI as the activity's last failure, and bounded by the schedule.
_WAIT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=1.5,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
)


async def _record(record: MembershipRecord) -> None:
    await workflow.execute_activity(
        RECORD_MEMBERSHIP, record, start_to_close_timeout=QUICK, retry_policy=INSTRUCTION_RETRY
    )


async def _finish(term: int, seq: int, status: str, moved: int, outcome: str) -> MembershipResult:
    await workflow.execute_activity(
        FINISH_INSTRUCTION,
        _Outcome(term, seq, status, outcome),
        start_to_close_timeout=QUICK,
        retry_policy=INSTRUCTION_RETRY,
    )
    return MembershipResult(status, moved, outcome)


async def _adopt(term: int, seq: int, receiver: str, machines: list[MachineTarget]) -> str:
    """Tell the receiver to act on what PostgreSQL now records as its own; '' when it did."""
    if not machines:
        return ""
    try:
        adopted = await workflow.execute_activity(
            ADOPT_MACHINES,
            _AdoptInput(term, seq, machines),
            result_type=_AdoptResult,
            task_queue=f"shard-{receiver}",
            schedule_to_close_timeout=timedelta(minutes=2),
            retry_policy=INSTRUCTION_RETRY,
        )
    except ActivityError as err:
        # Ownership is in PostgreSQL already: the receiver loads it when it
        # (re)starts, and adopts a cluster's machines when its operator connects.
        return f"; the receiver will load them itself ({err.cause or err})"
    return f"; receiver: {adopted.refused}" if adopted.refused else ""


@workflow.defn(name="ClusterMoveWorkflow")
class ClusterMoveWorkflow:
    """Move one cluster, with its bound machines, off a draining shard."""

    def __init__(self) -> None:
        self._phase = "starting"

    @workflow.query(name="phase")
    def phase(self) -> str:
        return self._phase

    @workflow.run
    async def run(self, inp: ClusterMoveInput) -> MembershipResult:
        spec = inp.spec
        await _record(
            MembershipRecord(
                inp.term, inp.seq, "cluster-move", spec.donor, spec.receiver, spec.cluster_id
            )
        )
        self._phase = f"releasing {spec.cluster_id} on {spec.donor}"
        try:
            released = await workflow.execute_activity(
                RELEASE_CLUSTER,
                ReleaseClusterInput(inp.term, inp.seq, spec.cluster_id, spec.receiver),
                result_type=ReleaseClusterResult,
                task_queue=f"shard-{spec.donor}",
                start_to_close_timeout=timedelta(minutes=1),
                schedule_to_close_timeout=timedelta(minutes=30),
                retry_policy=_WAIT,
            )
        except ActivityError as err:
            self._phase = "failed"
            return await _finish(
                inp.term, inp.seq, "failed", 0, f"donor {spec.donor}: {err.cause or err}"
            )
        if released.refused:
            self._phase = "refused"
            return await _finish(
                inp.term, inp.seq, "refused", 0, f"donor {spec.donor}: {released.refused}"
            )
        receiver = released.receiver or spec.receiver
        self._phase = f"adopting on {receiver}"
        note = await _adopt(inp.term, inp.seq, receiver, released.machines)
        self._phase = "done"
        return await _finish(
            inp.term,
            inp.seq,
            "applied",
            len(released.machines),
            f"cluster {spec.cluster_id} and {len(released.machines)} machine(s) moved from "
            f"{spec.donor} to {receiver}{note}",
        )


@workflow.defn(name="HandoverWorkflow")
class HandoverWorkflow:
    """Hand a draining shard's unbound machines to one active shard."""

    @workflow.run
    async def run(self, inp: HandoverInput) -> MembershipResult:
        spec = inp.spec
        await _record(
            MembershipRecord(
                inp.term,
                inp.seq,
                "handover",
                spec.donor,
                spec.receiver,
                machine_ids=[m.machine_id for m in spec.machines],
            )
        )
        try:
            result = await workflow.execute_activity(
                HAND_OVER,
                HandOverInput(inp.term, inp.seq, spec.receiver, spec.machines),
                result_type=HandOverResult,
                task_queue=f"shard-{spec.donor}",
                schedule_to_close_timeout=timedelta(minutes=5),
                retry_policy=INSTRUCTION_RETRY,
            )
        except ActivityError as err:
            return await _finish(
                inp.term, inp.seq, "failed", 0, f"donor {spec.donor}: {err.cause or err}"
            )
        if result.refused:
            return await _finish(
                inp.term, inp.seq, "refused", 0, f"donor {spec.donor}: {result.refused}"
            )
        note = await _adopt(inp.term, inp.seq, spec.receiver, result.moved)
        return await _finish(
            inp.term,
            inp.seq,
            "applied",
            len(result.moved),
            f"handed {len(result.moved)} of {len(spec.machines)} machine(s) to "
            f"{spec.receiver}{note}",
        )


__all__ = [
    "HAND_OVER",
    "MACHINES_IN_MOTION",
    "PLAN_MEMBERSHIP",
    "RECORD_MEMBERSHIP",
    "RELEASE_CLUSTER",
    "ClusterMoveInput",
    "ClusterMoveSpec",
    "ClusterMoveWorkflow",
    "HandOverInput",
    "HandOverResult",
    "HandoverInput",
    "HandoverSpec",
    "HandoverWorkflow",
    "MembershipPlan",
    "MembershipPlanInput",
    "MembershipRecord",
    "MembershipResult",
    "ReleaseClusterInput",
    "ReleaseClusterResult",
]
