"""ProvisionWorkflow: speculative or idle machines -> configured members of a cluster.

    Create (skipped for idle machines) -> wait for IDLE -> Configure with a
    fresh bootstrap blob -> wait for CONFIGURED -> record the outcome.

One workflow serves a batch of machines for one need (DESIGN §4: the bulk
path may batch); the machines are listed in ``BigFleetMachineIds``. Each
transitional state has a deadline: a machine still CREATING or CONFIGURING
when it passes is declared FAILED with ``last_error`` saying which deadline.
Waiting is a backoff loop of provider reads and durable timers, so hours of
waiting cost a few dozen events and survive worker restarts.

A machine that fails (a deadline, a provider FAILED, a refusal) is not
settled here: it is handed to a RecoverWorkflow of its own (started by an
activity, with an id derived from the machine and this batch's operation
sequence, so a retried hand-off finds the same run). That workflow runs the
corrective action, can be found, queried and signalled by machine id, and
records the machine's outcome at this batch's operation sequence (ADR 0002,
ADR 0030).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import search_attributes as sa
from workflows.contracts import (
    CONFIGURE_MACHINES,
    CONFIGURED,
    CONFIGURING,
    CREATE_MACHINES,
    CREATING,
    FAILED,
    IDLE,
    OBSERVE_MACHINES,
    RECORD_OUTCOMES,
    SPECULATIVE,
    START_RECOVERIES,
    ConfigureMachinesInput,
    CreateMachinesInput,
    MachineOutcome,
    MachineTarget,
    ObservedMachines,
    ObserveMachinesInput,
    PollPolicy,
    ProvisionInput,
    ProvisionResult,
    RecordOutcomesInput,
    RecoverInput,
    ShardModeSignal,
    ShardSignal,
    StartedWorkflows,
    StartRecoveriesInput,
    TransitionResults,
    WorkflowQuery,
)
from workflows.errors import (
    BOOTSTRAP_UNAVAILABLE,
    FENCED,
    LEASE_LOST,
    error_message,
    error_type,
)
from workflows.retries import (
    CALL_TIMEOUT,
    LEASE_WAIT_INITIAL_S,
    LEASE_WAIT_MAX_S,
    PROVIDER_RETRY,
    RECORD_RETRY,
)

# Marks histories that hand failed machines to RecoverWorkflows; older ones
# recorded failures in the batch and still replay that way.
HANDOFF_PATCH = "recover-failed-machines"
# Marks histories in which a batch waited out a shard that was not acting
# (LeaseLost) instead of failing; before it, the batch failed and its
# already-configured machines were never recorded (ADR 0101).
LEASE_WAIT_PATCH = "wait-out-lease-loss"

T = TypeVar("T")

# Provider calls are quick (they only accept a transition); retries are cheap.


@workflow.defn(name="ProvisionWorkflow")
class ProvisionWorkflow:
    """Durable provisioning of one batch of machines for one need."""

    def __init__(self) -> None:
        self._phase = CREATING
        self._machines: dict[str, MachineOutcome] = {}
        self._deadline_unix: float | None = None
        self._input: ProvisionInput | None = None
        # The transitional state each machine was last sent toward (for hand-off).
        self._stage: dict[str, str] = {}
        self._handed_off: list[str] = []
        self._recoveries: list[str] = []
        # Times the batch waited for its shard to act again (LeaseLost).
        self._waits = 0
        # The shard's mode as last signalled ("" until a pause, dry run or resume lands).
        self._shard_mode = ""

    @workflow.signal(name=ShardSignal.MODE.value)
    def shard_mode(self, sig: ShardModeSignal) -> None:
        """The shard was paused, put in dry run or resumed: say so in BigFleetShardMode.

        Visibility only: the batch finishes either way (ADR 0142, ADR 0153).
        """
        if sa.upsert_shard_mode(sig):
            self._shard_mode = sig.mode

    @workflow.query(name=WorkflowQuery.VIEW.value)
    def view(self) -> dict[str, object]:
        """The workflow's current view: phase, deadline and every machine's state."""
        inp = self._input
        return {
            "operation": "provision" if inp is None or inp.create else "configure",
            "cluster_id": inp.cluster_id if inp else "",
            "priority": inp.priority if inp else 0,
            "phase": self._phase,
            "deadline_unix": self._deadline_unix,
            "machines": [vars(m) for m in self._machines.values()],
            "handed_off": list(self._handed_off),
            "recoveries": list(self._recoveries),
            "lease_waits": self._waits,
            "shard_mode": self._shard_mode,
        }

    @workflow.run
    async def run(self, inp: ProvisionInput) -> ProvisionResult:
        self._input = inp
        self._machines = {
            m.machine_id: MachineOutcome(
                m.machine_id, m.provider, SPECULATIVE if inp.create else IDLE
            )
            for m in inp.machines
        }
        self._stage = {m.machine_id: CREATING if inp.create else CONFIGURING for m in inp.machines}
        operation = "provision" if inp.create else "configure"
        updates: list[SearchAttributeUpdate[Any]] = [
            sa.SHARD_ID.value_set(inp.shard_id),
            sa.CLUSTER_ID.value_set(inp.cluster_id),
            sa.OPERATION.value_set(operation),
            sa.PRIORITY.value_set(inp.priority),
            # Never more than fits one search attribute (an oversized value
            # terminates the workflow); the executor sizes batches to fit.
            sa.MACHINE_IDS.value_set(sa.fitting_prefix([m.machine_id for m in inp.machines])),
        ]
        if len(inp.machines) == 1:
            updates.append(sa.MACHINE_ID.value_set(inp.machines[0].machine_id))
        workflow.upsert_search_attributes(updates)
        try:
            if inp.create:
                self._set_phase(CREATING)
                created = await self._call(
                    CREATE_MACHINES,
                    CreateMachinesInput(inp.shard_id, inp.operation_seq, inp.machines),
                    TransitionResults,
                )
                self._absorb_refusals(created)
                await self._wait_for(IDLE, CREATING, inp.deadlines.creating_s, inp.poll)
            ready = [m for m in inp.machines if self._machines[m.machine_id].state == IDLE]
            if ready:
                for m in ready:
                    self._stage[m.machine_id] = CONFIGURING
                self._set_phase(CONFIGURING)
                await self._configure(inp, ready)
        except ActivityError as err:
            if error_type(err) == FENCED:
                self._set_phase("Fenced")
                raise ApplicationError(
                    f"shard {inp.shard_id} was fenced by a provider; stopping",
                    type=FENCED,
                    non_retryable=True,
                ) from err
            raise
        outcomes = list(self._machines.values())
        failed = [o for o in outcomes if o.state == FAILED]
        settle_here = outcomes
        if failed and workflow.patched(HANDOFF_PATCH):
            await self._hand_off(inp, failed)
            settle_here = [o for o in outcomes if o.state != FAILED]
        if settle_here:
            # Retried until it lands, on whichever process holds the shard by then.
            await self._call(
                RECORD_OUTCOMES,
                RecordOutcomesInput(
                    inp.shard_id,
                    inp.cluster_id,
                    inp.need_key,
                    operation,
                    inp.operation_seq,
                    settle_here,
                ),
                type(None),
                retry=RECORD_RETRY,
            )
        self._set_phase(FAILED if failed else CONFIGURED)
        return ProvisionResult(outcomes, handed_off=list(self._handed_off))

    async def _hand_off(self, inp: ProvisionInput, failed: list[MachineOutcome]) -> None:
        """Start one RecoverWorkflow per failed machine; they outlive this batch."""
        started = await self._call(
            START_RECOVERIES,
            StartRecoveriesInput(
                inp.shard_id,
                [
                    RecoverInput(
                        shard_id=inp.shard_id,
                        machine=MachineTarget(o.machine_id, o.provider),
                        failed_in=self._stage.get(o.machine_id, CREATING),
                        last_error=o.last_error,
                        cluster_id=inp.cluster_id,
                        need_key=inp.need_key,
                        priority=inp.priority,
                        operation_seq=inp.operation_seq,
                        requirements=inp.requirements,
                        deadlines=inp.deadlines,
                        poll=inp.poll,
                    )
                    for o in failed
                ],
            ),
            StartedWorkflows,
        )
        self._handed_off = [o.machine_id for o in failed]
        self._recoveries = list(started.workflow_ids)

    async def _configure(self, inp: ProvisionInput, ready: list[MachineTarget]) -> None:
        targets = ready
        try:
            configured = await self._call(
                CONFIGURE_MACHINES,
                ConfigureMachinesInput(
                    inp.shard_id,
                    inp.cluster_id,
                    inp.need_key,
                    inp.priority,
                    inp.operation_seq,
                    targets,
                    inp.requirements,
                ),
                TransitionResults,
                start_to_close=CALL_TIMEOUT * 2,
            )
        except ActivityError as err:
            if error_type(err) != BOOTSTRAP_UNAVAILABLE:
                raise
            # The cluster cannot bootstrap a node right now: the machines stay
            # idle (usable by others) and the reason is kept on each of them.
            reason = error_message(err)
            for m in targets:
                self._machines[m.machine_id].last_error = f"bootstrap unavailable: {reason}"
            return
        self._absorb_refusals(configured)
        await self._wait_for(CONFIGURED, CONFIGURING, inp.deadlines.configuring_s, inp.poll)

    def _absorb_refusals(self, results: TransitionResults) -> None:
        """A refused machine is FAILED with the provider's reason (and handed off later)."""
        for refused in results.refused:
            self._machines[refused.machine_id] = refused

    async def _wait_for(
        self, target: str, moving: str, deadline_s: float, poll: PollPolicy
    ) -> None:
        """Re-read the provider until every machine reached ``target`` or failed.

        Machines still short of ``target`` when ``deadline_s`` has passed are
        marked FAILED with a ``last_error`` naming the state and the deadline.
        """
        inp = self._input
        assert inp is not None
        started = workflow.now()
        deadline = started + timedelta(seconds=deadline_s)
        self._deadline_unix = deadline.timestamp()
        delay = poll.initial_s
        while True:
            pending = self._pending(target)
            if not pending:
                return
            observed = await self._call(
                OBSERVE_MACHINES,
                ObserveMachinesInput(inp.shard_id, pending),
                ObservedMachines,
            )
            for seen in observed.machines:
                self._machines[seen.machine_id] = seen
            pending = self._pending(target)
            if not pending:
                return
            now = workflow.now()
            waited = (now - started).total_seconds()
            if now >= deadline:
                for m in pending:
                    last = self._machines[m.machine_id]
                    self._machines[m.machine_id] = MachineOutcome(
                        m.machine_id,
                        m.provider,
                        FAILED,
                        f"{moving.lower()} exceeded its deadline of {deadline_s:g} s "
                        f"(provider still reports {last.state})",
                    )
                return
            remaining = (deadline - now).total_seconds()
            await workflow.sleep(timedelta(seconds=max(0.001, min(delay, remaining))))
            delay = poll.next_delay(delay, waited)

    def _pending(self, target: str) -> list[MachineTarget]:
        inp = self._input
        assert inp is not None
        return [
            m for m in inp.machines if self._machines[m.machine_id].state not in (target, FAILED)
        ]

    async def _call(
        self,
        name: str,
        arg: Any,
        result_type: type[T],
        *,
        start_to_close: timedelta = CALL_TIMEOUT,
        retry: RetryPolicy = PROVIDER_RETRY,
    ) -> T:
        """Run an activity; a shard that is not acting (``LeaseLost``) is waited out on a
        durable timer, so the batch carries on with whichever process holds the lease next."""
        wait_s = LEASE_WAIT_INITIAL_S
        while True:
            try:
                result: T = await workflow.execute_activity(
                    name,
                    arg,
                    result_type=result_type,
                    start_to_close_timeout=start_to_close,
                    retry_policy=retry,
                )
                return result
            except ActivityError as err:
                if error_type(err) != LEASE_LOST or not workflow.patched(LEASE_WAIT_PATCH):
                    raise
                self._waits += 1
                await workflow.sleep(timedelta(seconds=wait_s))
                wait_s = min(wait_s * 2, LEASE_WAIT_MAX_S)

    def _set_phase(self, phase: str) -> None:
        self._phase = phase
        workflow.upsert_search_attributes([sa.PHASE.value_set(phase)])
