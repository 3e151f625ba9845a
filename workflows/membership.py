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

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import search_attributes as sa
from workflows.contracts import REASON_SHARD_DRAIN, MachineTarget
from workflows.coordinator_contracts import (
    ADOPT_MACHINES,
    FINISH_INSTRUCTION,
    AdoptInput,
    AdoptResult,
    InstructionOutcome,
)
from workflows.membership_contracts import (
    HAND_OVER,
    MACHINES_IN_MOTION,
    PLAN_MEMBERSHIP,
    RECORD_MEMBERSHIP,
    RELEASE_CLUSTER,
    ClusterMoveInput,
    ClusterMoveSpec,
    HandOverInput,
    HandoverInput,
    HandOverResult,
    HandoverSpec,
    MembershipPlan,
    MembershipPlanInput,
    MembershipRecord,
    MembershipResult,
    ReleaseClusterInput,
    ReleaseClusterResult,
)
from workflows.retries import INSTRUCTION_RETRY, QUICK

# A donor waits for machines in motion by failing retryably: the wait is visible
# in the Temporal UI as the activity's last failure, and bounded by the schedule.
_WAIT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=1.5,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
)


# Workflows started before shard drains carried a reason set no search attributes;
# the patch keeps their histories replaying.
SHARD_DRAIN_REASON_PATCH = "shard-drain-reason"


def _show_shard_drain(donor: str, receiver: str, what: str, cluster_id: str = "") -> None:
    """Make a shard drain's workflow findable and readable in the Temporal UI.

    ``BigFleetReason = 'shard-drain'`` and ``BigFleetShardId`` (the donor) are
    search attributes; the current details (not a command) say what moves where.
    """
    if workflow.patched(SHARD_DRAIN_REASON_PATCH):
        updates = [sa.REASON.value_set(REASON_SHARD_DRAIN), sa.SHARD_ID.value_set(donor)]
        if cluster_id:
            updates.append(sa.CLUSTER_ID.value_set(cluster_id))
        workflow.upsert_search_attributes(updates)
    workflow.set_current_details(
        f"**shard drain** of {donor}: {what} to {receiver}\n\nreason: {REASON_SHARD_DRAIN}"
    )


async def _record(record: MembershipRecord) -> None:
    await workflow.execute_activity(
        RECORD_MEMBERSHIP, record, start_to_close_timeout=QUICK, retry_policy=INSTRUCTION_RETRY
    )


async def _finish(term: int, seq: int, status: str, moved: int, outcome: str) -> MembershipResult:
    await workflow.execute_activity(
        FINISH_INSTRUCTION,
        InstructionOutcome(term, seq, status, outcome),
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
            AdoptInput(term, seq, machines),
            result_type=AdoptResult,
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
        _show_shard_drain(spec.donor, spec.receiver, f"cluster {spec.cluster_id}", spec.cluster_id)
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
        _show_shard_drain(spec.donor, spec.receiver, f"{len(spec.machines)} unbound machine(s)")
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
