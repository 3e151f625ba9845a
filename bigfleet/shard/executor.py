"""The production actuator: each operation of the shard core becomes a Temporal workflow.

    ProvisionOp -> ProvisionWorkflow   (batches sized to fit one search attribute)
    DrainOp     -> DrainWorkflow       (a preemptor waiting, or back to idle)
    DeleteOp    -> DeleteWorkflow
    VerifyOp    -> VerifyWorkflow
    (a batch's failed machine, via an activity) -> RecoverWorkflow

What an action means is decided by :class:`bigfleet.shard.core.ShardCore`,
for production and the simulator alike; this module only says how it is
carried out here. Workflow IDs are derived from (shard, operation, machine
or batch, operation sequence), and starts use ``USE_EXISTING`` on conflict,
so starting the same operation twice — after a crash, or a retried cycle —
finds the running workflow instead of creating a second one. Deadlines come
from the shard's :class:`~workflows.contracts.DeadlinePolicy` for each
machine's provider and capacity type.

A start Temporal refuses names its machines in the answer; the core settles
them, so the engine can plan them again rather than hold them in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from bigfleet import metrics
from bigfleet.shard.convert import requirement_specs
from bigfleet.shard.core import DeleteOp, DrainOp, Operation, ProvisionOp, Started, VerifyOp
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineRecord
from workflows import ids
from workflows import search_attributes as sa
from workflows.contracts import (
    CONFIGURING,
    CREATING,
    DELETING,
    DRAINING,
    FAILED,
    OP_CONFIGURE,
    OP_DELETE,
    OP_DRAIN,
    OP_PROVISION,
    OP_RECOVER,
    OP_VERIFY,
    REASON_CONFIGURE_FAILED,
    REASON_CREATE_FAILED,
    REASON_DECOMMISSION,
    REASON_INTERRUPTION,
    REASON_OPERATOR,
    REASON_RECLAIM,
    REASON_RELEASE,
    SHARD_ACTIVE,
    DeadlinePolicy,
    Deadlines,
    DeleteInput,
    DrainInput,
    MachineTarget,
    PollPolicy,
    ProvisionInput,
    RecoverInput,
    VerifyInput,
    Waiter,
)
from workflows.delete import DeleteWorkflow
from workflows.drain import DrainWorkflow
from workflows.provision import ProvisionWorkflow
from workflows.recover import RecoverWorkflow
from workflows.verify import VERIFYING, VerifyWorkflow

log = logging.getLogger(__name__)

__all__ = [
    "Executor",
    "SequenceSource",
    "StartGuard",
    "claim_running",
    "workflow_id",
]


# Machines per ProvisionWorkflow: the paper's batched Create (64), and never more
# than the BigFleetMachineIds search attribute can list (~40 ids of 45 characters).
MAX_BATCH = 64


def workflow_id(shard_id: str, operation: str, machine_ids: list[str], seq: int) -> str:
    """Deterministic workflow id: the same operation on the same machines maps to one id."""
    return ids.workflow_id(shard_id, operation, machine_ids, seq)


@dataclass(frozen=True)
class _Start:
    """One workflow to start: what, where, and how it is found in the Temporal UI."""

    run: Any
    arg: Any
    operation: str
    machine_ids: list[str]
    seq: int
    attrs: list[SearchAttributePair[Any]]
    # Why a drain, delete or recovery runs (metrics, search attribute, UI summary).
    reason: str = ""
    # What the Temporal UI shows: one line in lists and the header, more on the page.
    summary: str = ""
    details: str = ""


class StartGuard(Protocol):
    """Whether the shard may still act (see :class:`bigfleet.shard.lease.LeaseKeeper`)."""

    @property
    def active(self) -> bool: ...


class SequenceSource(Protocol):
    """Hands out operation sequences (see :class:`bigfleet.shard.sequences.OperationSequences`)."""

    def next(self, machine_ids: Iterable[str]) -> int: ...


class Executor:
    """The production :class:`~bigfleet.shard.core.Actuator`: operations become workflow
    starts on the shard's task queue."""

    def __init__(
        self,
        temporal: Client,
        *,
        shard_id: str,
        task_queue: str,
        sequences: SequenceSource,
        deadlines: DeadlinePolicy,
        poll: PollPolicy,
        guard: StartGuard | None = None,
        mode: Callable[[], str] | None = None,
    ) -> None:
        self._temporal = temporal
        # The shard's mode at each start, for BigFleetShardMode ("active" without one).
        self._mode = mode or (lambda: SHARD_ACTIVE)
        # Checked before every action: a plan outliving the lease starts nothing more.
        self._guard = guard
        self._shard_id = shard_id
        self._task_queue = task_queue
        self._sequences = sequences
        self._deadlines = deadlines
        self._poll = poll

    def deadlines_for(self, record: MachineRecord) -> Deadlines:
        """The deadlines of an operation on this machine (by provider and capacity type)."""
        return self._deadlines.for_machine(record.provider, record.capacity_type.name)

    @property
    def acting(self) -> bool:
        """The lease is held (always, without a guard)."""
        return self._guard is None or self._guard.active

    async def start(self, op: Operation) -> Started:
        """Start the workflow(s) of one operation."""
        match op:
            case ProvisionOp():
                return await self._provision(op)
            case DrainOp():
                return await self._start(self._drain(op))
            case DeleteOp():
                return await self._start(self._delete(op))
            case VerifyOp():
                return await self._start(self._verify(op))
            case _:
                assert_never(op)

    # ----------------------------------------------------------- provisioning

    async def _provision(self, op: ProvisionOp) -> Started:
        by_id = {r.id: r for r in op.machines}
        started = 0
        refused: list[str] = []
        for chunk in sa.chunks_that_fit(list(by_id), at_most=MAX_BATCH):
            answer = await self._start(self._provision_batch([by_id[m] for m in chunk], op))
            started += answer.started
            refused += answer.refused
        return Started(started, tuple(refused))

    def _provision_batch(self, records: list[MachineRecord], action: ProvisionOp) -> _Start:
        create = action.create
        machines = [MachineTarget(r.id, r.provider) for r in records]
        seq = self._sequences.next([m.machine_id for m in machines])
        operation = OP_PROVISION if create else OP_CONFIGURE
        inp = ProvisionInput(
            shard_id=self._shard_id,
            cluster_id=action.cluster_id,
            need_key=action.need_key,
            priority=action.priority,
            operation_seq=seq,
            machines=machines,
            requirements=requirement_specs(action.requirements),
            create=create,
            deadlines=self.deadlines_for(records[0]),
            poll=self._poll,
        )
        attrs: list[SearchAttributePair[Any]] = [
            SearchAttributePair(sa.CLUSTER_ID, action.cluster_id),
            SearchAttributePair(sa.PHASE, CREATING if create else CONFIGURING),
            SearchAttributePair(sa.PRIORITY, action.priority),
        ]
        what = "create and configure" if create else "configure"
        count = f"{len(machines)} machine{'s' if len(machines) != 1 else ''}"
        return _Start(
            ProvisionWorkflow.run,
            inp,
            operation,
            [m.machine_id for m in machines],
            seq,
            attrs,
            summary=f"{what} {count} for {action.cluster_id} (priority {action.priority})",
            details=_details(
                ("operation", f"{what} ({'from speculative' if create else 'from idle'})"),
                ("cluster", action.cluster_id),
                ("need", action.need_key),
                ("priority", str(action.priority)),
                ("machines", ", ".join(m.machine_id for m in machines)),
                ("provider", records[0].provider),
                ("shard", self._shard_id),
            ),
        )

    # ------------------------------------------------------- per-machine work

    def _drain(self, op: DrainOp) -> _Start:
        record = op.machine
        seq = self._sequences.next([record.id])
        cluster_id, reason, victim_priority = op.cluster_id, op.reason, op.victim_priority
        waiter = (
            Waiter(op.preemptor.cluster_id, op.preemptor.need_key, op.preemptor.priority)
            if op.preemptor is not None
            else None
        )
        # BigFleetPriority on a drain is the priority of the workload it takes away.
        priority = victim_priority
        inp = DrainInput(
            shard_id=self._shard_id,
            machine=MachineTarget(record.id, record.provider),
            cluster_id=cluster_id,
            grace_seconds=op.grace_seconds,
            operation_seq=seq,
            reason=reason,
            victim_priority=victim_priority,
            waiter=waiter,
            deadlines=self.deadlines_for(record),
            poll=self._poll,
        )
        attrs: list[SearchAttributePair[Any]] = [
            SearchAttributePair(sa.CLUSTER_ID, cluster_id),
            SearchAttributePair(sa.PHASE, DRAINING),
            SearchAttributePair(sa.PRIORITY, priority),
            SearchAttributePair(sa.GRACE_SECONDS, op.grace_seconds),
            SearchAttributePair(sa.REASON, reason),
        ]
        why = {
            REASON_RECLAIM: f"{cluster_id} no longer needs it",
            REASON_DECOMMISSION: "its domain is being retired",
            REASON_OPERATOR: "a person asked for it",
            REASON_INTERRUPTION: "its provider announced an interruption; a replacement "
            "is provisioned",
        }.get(reason, reason)
        if waiter is not None:
            why = f"for {waiter.cluster_id} at priority {waiter.priority}"
        return _Start(
            DrainWorkflow.run,
            inp,
            OP_DRAIN,
            [record.id],
            seq,
            attrs,
            reason=reason,
            summary=f"drain {record.id} from {cluster_id}: {reason} ({why})",
            details=_details(
                ("reason", reason),
                ("why", why),
                ("machine", f"{record.id} ({record.instance_type}, {record.zone})"),
                ("cluster", cluster_id),
                ("victim priority", str(victim_priority)),
                ("grace", f"{op.grace_seconds} s"),
                (
                    "preemptor",
                    "" if waiter is None else f"{waiter.cluster_id} need {waiter.need_key}",
                ),
                ("shard", self._shard_id),
            ),
        )

    def _delete(self, op: DeleteOp) -> _Start:
        record = op.machine
        seq = self._sequences.next([record.id])
        inp = DeleteInput(
            shard_id=self._shard_id,
            machine=MachineTarget(record.id, record.provider),
            operation_seq=seq,
            reason=REASON_RELEASE,
            deadlines=self.deadlines_for(record),
            poll=self._poll,
        )
        attrs: list[SearchAttributePair[Any]] = [
            SearchAttributePair(sa.PHASE, DELETING),
            SearchAttributePair(sa.PRIORITY, 0),
            SearchAttributePair(sa.REASON, REASON_RELEASE),
        ]
        return _Start(
            DeleteWorkflow.run,
            inp,
            OP_DELETE,
            [record.id],
            seq,
            attrs,
            reason=REASON_RELEASE,
            summary=f"delete {record.id}: release (idle past its hold)",
            details=_details(
                ("reason", REASON_RELEASE),
                ("why", "an idle cloud machine is deleted once its capacity type's hold ends"),
                ("machine", f"{record.id} ({record.instance_type}, {record.zone})"),
                ("capacity type", record.capacity_type.name),
                ("shard", self._shard_id),
            ),
        )

    def _verify(self, action: VerifyOp) -> _Start:
        record = action.machine
        seq = self._sequences.next([record.id])
        inp = VerifyInput(
            shard_id=self._shard_id,
            machine=MachineTarget(record.id, record.provider),
            cluster_id=action.cluster_id,
            operation_seq=seq,
        )
        attrs: list[SearchAttributePair[Any]] = [
            SearchAttributePair(sa.CLUSTER_ID, action.cluster_id),
            SearchAttributePair(sa.PHASE, VERIFYING),
            SearchAttributePair(sa.PRIORITY, 0),
        ]
        return _Start(VerifyWorkflow.run, inp, OP_VERIFY, [record.id], seq, attrs)

    async def start_operator_drain(
        self, record: MachineRecord, *, grace_seconds: int, deadlines: Deadlines | None = None
    ) -> str:
        """Drain one configured machine because a person asked (reason ``operator``).

        The caller has taken the machine out of the engine's planning
        (``engine.claim``); the drain's outcome settles it like any other.
        ``deadlines`` overrides the machine's own (rehearsals shorten them).
        Returns the workflow id; raises on a Temporal error.
        """
        start = self._drain(
            DrainOp(
                machine=record,
                cluster_id=record.cluster,
                grace_seconds=grace_seconds,
                reason=REASON_OPERATOR,
                victim_priority=0,
            )
        )
        if deadlines is not None:
            inp: DrainInput = start.arg
            inp.deadlines = deadlines
        await self._submit(start)
        metrics.WORKFLOW_STARTS.labels("DrainWorkflow", REASON_OPERATOR).inc()
        return self._id(start)

    async def start_recovery(self, recovery: RecoverInput) -> str:
        """Start (or find) the RecoverWorkflow of one machine a batch failed; returns its id.

        Raises on a Temporal error so the activity that asked retries it.
        """
        mid = recovery.machine.machine_id
        reason = REASON_CREATE_FAILED if recovery.failed_in == CREATING else REASON_CONFIGURE_FAILED
        attrs: list[SearchAttributePair[Any]] = [
            SearchAttributePair(sa.CLUSTER_ID, recovery.cluster_id),
            SearchAttributePair(sa.PHASE, FAILED),
            SearchAttributePair(sa.PRIORITY, recovery.priority),
            SearchAttributePair(sa.REASON, reason),
        ]
        start = _Start(
            RecoverWorkflow.run,
            recovery,
            OP_RECOVER,
            [mid],
            recovery.operation_seq,
            attrs,
            reason=reason,
            summary=f"recover {mid} for {recovery.cluster_id}: {reason}",
            details=_details(
                ("reason", reason),
                ("failed while", recovery.failed_in),
                ("error", recovery.last_error),
                ("cluster", recovery.cluster_id),
                ("priority", str(recovery.priority)),
                ("shard", self._shard_id),
            ),
        )
        wf_id = self._id(start)
        try:
            await self._submit(start)
        except WorkflowAlreadyStartedError:
            log.info("recovery %s already ran; not starting it again", wf_id)
        return wf_id

    # ----------------------------------------------------------------- start

    def _id(self, start: _Start) -> str:
        return workflow_id(self._shard_id, start.operation, start.machine_ids, start.seq)

    async def _submit(self, start: _Start) -> None:
        """Start the workflow, or find the running one with the same id."""
        attrs: list[SearchAttributePair[Any]] = [
            SearchAttributePair(sa.SHARD_ID, self._shard_id),
            SearchAttributePair(sa.OPERATION, start.operation),
            SearchAttributePair(sa.MACHINE_IDS, list(start.machine_ids)),
            SearchAttributePair(sa.SHARD_MODE, self._mode()),
            *start.attrs,
        ]
        if len(start.machine_ids) == 1:
            attrs.append(SearchAttributePair(sa.MACHINE_ID, start.machine_ids[0]))
        await self._temporal.start_workflow(
            start.run,
            start.arg,
            id=self._id(start),
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=TypedSearchAttributes(attrs),
            static_summary=start.summary or None,
            static_details=start.details or None,
        )

    async def _start(self, start: _Start) -> Started:
        """Submit one workflow; if Temporal refuses, its machines are named as refused."""
        wf_id = self._id(start)
        workflow = _workflow_type(start)
        try:
            await self._submit(start)
        except WorkflowAlreadyStartedError:
            log.info("workflow %s already ran; not starting it again", wf_id)
            return Started()
        except RPCError as err:
            # Temporal is unreachable or refused: the core gives the machines back to
            # the engine so a later cycle plans them again.
            metrics.WORKFLOW_FAILURES.labels(workflow, "start").inc()
            log.error("could not start %s: %s; releasing its machines", wf_id, err)
            return Started(refused=tuple(start.machine_ids))
        metrics.WORKFLOW_STARTS.labels(workflow, start.reason).inc()
        return Started(1)


def _details(*rows: tuple[str, str]) -> str:
    """A workflow's static details for the Temporal UI (markdown), empty rows left out."""
    return "\n".join(f"- **{name}**: {value}" for name, value in rows if value)


def _workflow_type(start: _Start) -> str:
    """The workflow type a start names (``DrainWorkflow``), for metrics."""
    return str(getattr(start.run, "__qualname__", "workflow")).split(".", 1)[0]


# Operations that bind their machines to the workflow's cluster.
_BINDING_OPS = (OP_PROVISION, OP_CONFIGURE, OP_RECOVER)


async def claim_running(
    temporal: Client,
    *,
    shard_id: str,
    engine: ShardEngine,
    owned: Container[str],
    clock: Callable[[], float],
) -> int:
    """Re-mark the machines of this shard's still-running workflows (restart recovery).

    A restarted process rebuilds its engine from PostgreSQL and the
    providers, but an operation its predecessor started may still be
    running in Temporal. Its machines are claimed as in flight so the
    first cycle neither plans on them nor provisions their cluster twice;
    the workflows finish on this process's worker and settle them.
    Visibility lags about a second; a workflow missed here is still safe,
    because its deterministic id makes a re-planned start find it.
    Returns how many machines were claimed.
    """
    query = f"{sa.SHARD_ID.name}='{shard_id}' AND ExecutionStatus='Running'"
    claimed = 0
    async for wf in temporal.list_workflows(query):
        attrs = wf.typed_search_attributes
        operation = attrs.get(sa.OPERATION) or ""
        ids = list(attrs.get(sa.MACHINE_IDS) or [])
        single = attrs.get(sa.MACHINE_ID)
        if single and single not in ids:
            ids.append(single)
        target = (attrs.get(sa.CLUSTER_ID) or "") if operation in _BINDING_OPS else ""
        for machine_id in ids:
            if machine_id in owned and engine.claim(
                machine_id,
                operation=operation,
                target_cluster=target,
                now=clock(),
                priority=attrs.get(sa.PRIORITY) or 0,
            ):
                claimed += 1
    if claimed:
        log.info("shard %s resumed %d machines of running workflows", shard_id, claimed)
    return claimed
