"""What every per-machine workflow shares.

    signals  escalate · force · retry · abandon · resolve   -> a queue of operator commands
    query    view                                           -> MachineView
    search   BigFleetMachineId, ...Phase, ...GraceSeconds    kept current on every change
    waiting  observe + durable timer, woken early by a command, bounded by a deadline
    parking  AwaitingOperator: no timers, no polls — only a command moves it on

Signal handlers only enqueue; the workflow's own loop decides, at points it
chooses, what a command means in its current phase. That keeps every
decision in one place per workflow and makes a signal that does not apply
(escalating a delete) a visible note rather than a surprise.

A provider that fences the shard ends the workflow (``Fenced``). A shard
process that lost its lease answers ``LeaseLost``; the workflow waits on a
durable timer and tries again, so a drain survives a lease hand-over instead
of dying with the old holder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar, assert_never

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import search_attributes as sa
from workflows.contracts import (
    DELETE_MACHINE,
    DELETING,
    FAILED,
    IDLE,
    OBSERVE_MACHINES,
    RECORD_MACHINE,
    SPECULATIVE,
    Deadlines,
    DeleteMachineInput,
    EscalateSignal,
    MachineOutcome,
    MachineResult,
    MachineTarget,
    MachineView,
    ObservedMachines,
    ObserveMachinesInput,
    OperatorSignal,
    PollPolicy,
    RecordMachineInput,
    ResolveSignal,
    ShardModeSignal,
    ShardSignal,
    TransitionAnswer,
    WorkflowQuery,
)
from workflows.errors import (
    FENCED,
    LEASE_LOST,
    NOT_FOUND,
    UNIMPLEMENTED,
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

T = TypeVar("T")

MAX_NOTES = 20

# Workflows started before reasons were carried set neither BigFleetReason nor the
# victim's priority on a drain; the patch keeps their histories replaying.
REASONS_PATCH = "reasons-and-victim-priority"
# A provider that keeps refusing a step this many times in a row is left to an operator.
MAX_REFUSALS = 3


@dataclass
class Command:
    """One operator signal, queued until the workflow reaches a point that consumes it."""

    kind: OperatorSignal
    grace_seconds: int = 0
    note: str = ""


class WaitEnd(StrEnum):
    """How a wait on the provider ended."""

    DONE = "done"  # the provider reports what the workflow waited for
    FAILED = "failed"  # the provider reports FAILED
    DEADLINE = "deadline"  # the state's deadline passed first
    COMMAND = "command"  # an operator's command arrived first


@dataclass
class Waited:
    """How a wait on the provider ended, and what the provider reported last."""

    how: WaitEnd
    seen: MachineOutcome


class DeleteStep(StrEnum):
    """The steps of releasing a machine (``MachineWorkflow._release``); local to one run."""

    DELETE = "delete"  # ask the provider to Delete
    LOOK = "look"  # re-read the provider and decide
    WAIT = "wait"  # wait for SPECULATIVE, bounded by the deleting deadline
    AWAIT = "await"  # park for an operator
    ABANDON = "abandon"  # the operator gave up on the machine
    RELEASED = "released"  # the provider reports it gone (SPECULATIVE)
    MOVED = "moved"  # it is in some other state: not released


class MachineWorkflow:
    """Base of the per-machine workflows (not a workflow itself)."""

    def __init__(self) -> None:
        self._view = MachineView("", "", "", "", "", "", phase="")
        self._commands: list[Command] = []
        self._target = MachineTarget("", "")
        self._deadline: datetime | None = None
        self._refusals = 0

    # ------------------------------------------------------------- signals

    @workflow.signal(name=OperatorSignal.ESCALATE.value)
    def escalate(self, sig: EscalateSignal) -> None:
        """Shorten a running drain's grace period."""
        self._enqueue(
            Command(OperatorSignal.ESCALATE, grace_seconds=max(0, int(sig.grace_seconds)))
        )

    @workflow.signal(name=OperatorSignal.FORCE.value)
    def force(self) -> None:
        """Forced termination now (a drain with zero grace)."""
        self._enqueue(Command(OperatorSignal.FORCE))

    @workflow.signal(name=OperatorSignal.RETRY.value)
    def retry(self) -> None:
        """Try the corrective action again."""
        self._enqueue(Command(OperatorSignal.RETRY))

    @workflow.signal(name=OperatorSignal.ABANDON.value)
    def abandon(self) -> None:
        """Give up: the machine is marked failed and kept out of use for investigation."""
        self._enqueue(Command(OperatorSignal.ABANDON))

    @workflow.signal(name=OperatorSignal.RESOLVE.value)
    def resolve(self, sig: ResolveSignal) -> None:
        """An operator fixed it out of band: re-read the provider and continue."""
        self._enqueue(Command(OperatorSignal.RESOLVE, note=sig.note))

    @workflow.signal(name=ShardSignal.MODE.value)
    def shard_mode(self, sig: ShardModeSignal) -> None:
        """The shard was paused, put in dry run or resumed: say so in BigFleetShardMode.

        Visibility only: work in flight finishes either way (ADR 0142, ADR 0153).
        """
        if sa.upsert_shard_mode(sig):
            note = f" ({sig.reason})" if sig.reason else ""
            self._view.notes.append(f"{_stamp(workflow.now())} shard {sig.mode}{note}")

    @workflow.query(name=WorkflowQuery.VIEW.value)
    def view(self) -> MachineView:
        """The current view: machine, phase, deadline, attempts, last error, who waits."""
        return self._view

    def _enqueue(self, command: Command) -> None:
        detail = ""
        if command.kind is OperatorSignal.ESCALATE:
            detail = f" grace={command.grace_seconds}s"
        elif command.note:
            detail = f" note={command.note!r}"
        self._view.signals.append(f"{_stamp(workflow.now())} {command.kind.value}{detail}")
        self._commands.append(command)

    def _take_command(self) -> Command | None:
        return self._commands.pop(0) if self._commands else None

    # ---------------------------------------------------------- view & search

    def _begin(
        self,
        *,
        operation: str,
        shard_id: str,
        machine: MachineTarget,
        cluster_id: str,
        operation_seq: int,
        priority: int,
        phase: str,
        grace_seconds: int | None = None,
        reason: str = "",
    ) -> None:
        """Fill the view and set every search attribute, before the first activity.

        ``reason`` (a drain's, delete's or recovery's) becomes ``BigFleetReason``
        for workflows started after reasons were carried (``REASONS_PATCH``).
        """
        now = workflow.now()
        self._target = machine
        # A signal sent with the start (or before the first task ran) is handled
        # before ``run`` begins: keep what its handler recorded.
        earlier = self._view
        self._view = MachineView(
            workflow_id=workflow.info().workflow_id,
            operation=operation,
            machine_id=machine.machine_id,
            provider=machine.provider,
            shard_id=shard_id,
            cluster_id=cluster_id,
            phase=phase,
            operation_seq=operation_seq,
            started_unix=now.timestamp(),
            phase_since_unix=now.timestamp(),
            grace_seconds=grace_seconds,
            reason=reason,
            priority=priority,
        )
        self._view.notes.extend(earlier.notes)
        self._view.signals.extend(earlier.signals)
        updates: list[SearchAttributeUpdate[Any]] = [
            sa.MACHINE_ID.value_set(machine.machine_id),
            sa.MACHINE_IDS.value_set([machine.machine_id]),
            sa.CLUSTER_ID.value_set(cluster_id),
            sa.SHARD_ID.value_set(shard_id),
            sa.OPERATION.value_set(operation),
            sa.PHASE.value_set(phase),
            sa.PRIORITY.value_set(priority),
        ]
        if grace_seconds is not None:
            updates.append(sa.GRACE_SECONDS.value_set(grace_seconds))
        if reason and workflow.patched(REASONS_PATCH):
            updates.append(sa.REASON.value_set(reason))
        workflow.upsert_search_attributes(updates)
        self._show()

    def _show(self) -> None:
        """What the Temporal UI shows as this workflow's current state (not a command).

        One line of where it stands, then the reason, the cluster and the
        latest note: the UI's "current details" stay in step with the view.
        """
        view = self._view
        since = _stamp(datetime.fromtimestamp(view.phase_since_unix, tz=workflow.now().tzinfo))
        lines = [f"**{view.phase}** since {since} · {view.operation} of {view.machine_id}"]
        facts = []
        if view.reason:
            facts.append(f"reason: {view.reason}")
        if view.cluster_id:
            facts.append(f"cluster: {view.cluster_id}")
        if view.priority:
            facts.append(f"priority: {view.priority}")
        if view.grace_seconds is not None:
            facts.append(f"grace: {view.grace_seconds} s")
        if facts:
            lines.append(" · ".join(facts))
        if view.awaiting_operator:
            lines.append("waiting for an operator: bigfleet machine show " + view.machine_id)
        if view.notes:
            lines.append(f"latest: {view.notes[-1]}")
        workflow.set_current_details("\n\n".join(lines))

    def _set_phase(self, phase: str) -> None:
        if phase == self._view.phase:
            return
        self._view.phase = phase
        self._view.phase_since_unix = workflow.now().timestamp()
        workflow.upsert_search_attributes([sa.PHASE.value_set(phase)])
        self._show()

    def _set_grace(self, grace_seconds: int) -> None:
        if grace_seconds == self._view.grace_seconds:
            return
        self._view.grace_seconds = grace_seconds
        workflow.upsert_search_attributes([sa.GRACE_SECONDS.value_set(grace_seconds)])
        self._show()

    def _set_deadline(self, deadline: datetime | None) -> None:
        self._deadline = deadline
        self._view.deadline_unix = None if deadline is None else deadline.timestamp()

    def _deadline_in(self, seconds: float) -> datetime:
        return workflow.now() + timedelta(seconds=seconds)

    def _note(self, text: str) -> None:
        self._view.notes.append(f"{_stamp(workflow.now())} {text}")
        del self._view.notes[:-MAX_NOTES]
        self._show()

    def _fail_reason(self, reason: str) -> None:
        self._view.last_error = reason
        self._note(reason)

    # ------------------------------------------------------------ activities

    async def _activity(
        self, name: str, arg: Any, result_type: type[T], *, retry: RetryPolicy = PROVIDER_RETRY
    ) -> T:
        """Run an activity; stop on ``Fenced``, wait out ``LeaseLost``, re-raise the rest."""
        wait_s = LEASE_WAIT_INITIAL_S
        while True:
            try:
                result: T = await workflow.execute_activity(
                    name,
                    arg,
                    result_type=result_type,
                    start_to_close_timeout=CALL_TIMEOUT,
                    retry_policy=retry,
                )
                return result
            except ActivityError as err:
                kind = error_type(err)
                if kind == FENCED:
                    self._set_phase(sa.FENCED_PHASE)
                    self._fail_reason(error_message(err))
                    raise ApplicationError(
                        f"shard {self._view.shard_id} was fenced by a provider; stopping",
                        type=FENCED,
                        non_retryable=True,
                    ) from err
                if kind != LEASE_LOST:
                    raise
                self._note(f"the shard is not acting ({error_message(err)}); waiting {wait_s:g} s")
                await workflow.sleep(timedelta(seconds=wait_s))
                wait_s = min(wait_s * 2, LEASE_WAIT_MAX_S)

    async def _observe(self) -> MachineOutcome:
        """Read the machine from its provider (and fold it into the shard's inventory)."""
        observed = await self._activity(
            OBSERVE_MACHINES,
            ObserveMachinesInput(self._view.shard_id, [self._target]),
            ObservedMachines,
        )
        seen = observed.machines[0]
        self._view.machine_state = seen.state
        return seen

    def _accepted(self, answer: TransitionAnswer, what: str) -> bool:
        """Note a provider's answer; True when it accepted (or repeated) the operation."""
        self._view.attempts += 1
        if answer.state:
            self._view.machine_state = answer.state
        if not answer.accepted:
            self._refusals += 1
            self._note(f"provider refused {what}: {answer.refusal}: {answer.detail}")
            return False
        self._refusals = 0
        ids = self._view.provider_operation_ids
        if answer.operation_id in ids:
            self._note(
                f"provider kept operation {answer.operation_id} for {what} (an idempotent repeat)"
            )
        else:
            ids.append(answer.operation_id)
            self._note(f"provider accepted {what} as operation {answer.operation_id}")
        return True

    async def _record(
        self,
        outcome: MachineOutcome,
        *,
        succeeded: bool,
        cluster_id: str = "",
        need_key: str = "",
        quarantine: bool = False,
        note: str = "",
        persist: bool = True,
    ) -> None:
        await self._activity(
            RECORD_MACHINE,
            RecordMachineInput(
                shard_id=self._view.shard_id,
                operation=self._view.operation,
                operation_seq=self._view.operation_seq,
                outcome=outcome,
                succeeded=succeeded,
                cluster_id=cluster_id,
                need_key=need_key,
                quarantine=quarantine,
                note=note,
                persist=persist,
            ),
            type(None),
            retry=RECORD_RETRY,
        )

    async def _finish(
        self,
        state: str,
        *,
        succeeded: bool,
        last_error: str = "",
        cluster_id: str = "",
        need_key: str = "",
        quarantine: bool = False,
        note: str = "",
        persist: bool = True,
    ) -> MachineResult:
        """Record the outcome exactly once, show the final phase, and return it."""
        t = self._target
        if last_error:
            self._view.last_error = last_error
        if note:
            self._note(note)
        await self._record(
            MachineOutcome(t.machine_id, t.provider, state, last_error),
            succeeded=succeeded,
            cluster_id=cluster_id,
            need_key=need_key,
            quarantine=quarantine,
            note=note,
            persist=persist,
        )
        self._set_deadline(None)
        self._set_phase(state)
        return MachineResult(t.machine_id, state, succeeded, last_error, note)

    async def _abandoned(self) -> MachineResult:
        """An operator gave up: mark the machine failed and keep it out of use."""
        reason = f"abandoned by an operator in phase {self._view.phase}"
        if self._view.last_error:
            reason += f" (last error: {self._view.last_error})"
        return await self._finish(FAILED, succeeded=False, last_error=reason, quarantine=True)

    # --------------------------------------------------------------- waiting

    async def _pause(self, seconds: float) -> None:
        """A durable timer that an operator command cuts short."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: bool(self._commands), timeout=timedelta(seconds=max(seconds, 0.001))
            )

    async def _wait_until(
        self,
        done: Callable[[MachineOutcome], bool],
        poll: PollPolicy,
        *,
        on_tick: Callable[[], Awaitable[None]] | None = None,
    ) -> Waited:
        """Re-read the provider until ``done``, a provider FAILED, the deadline, or a command."""
        started = workflow.now()
        delay = poll.initial_s
        while True:
            seen = await self._observe()
            if done(seen):
                return Waited(WaitEnd.DONE, seen)
            if seen.state == FAILED:
                return Waited(WaitEnd.FAILED, seen)
            if self._commands:
                return Waited(WaitEnd.COMMAND, seen)
            if on_tick is not None:
                await on_tick()
            now = workflow.now()
            if self._deadline is not None and now >= self._deadline:
                return Waited(WaitEnd.DEADLINE, seen)
            pause = delay
            if self._deadline is not None:
                pause = min(pause, (self._deadline - now).total_seconds())
            await self._pause(pause)
            delay = poll.next_delay(delay, (workflow.now() - started).total_seconds())

    async def _await_operator(self, reason: str) -> Command:
        """Park until an operator sends a command; nothing runs meanwhile."""
        self._fail_reason(reason)
        self._set_deadline(None)
        self._view.awaiting_operator = True
        self._set_phase(sa.AWAITING_OPERATOR)
        await workflow.wait_condition(lambda: bool(self._commands))
        self._view.awaiting_operator = False
        command = self._take_command()
        assert command is not None
        return command

    # ----------------------------------------------------------------- delete

    async def _release(self, deadlines: Deadlines, poll: PollPolicy) -> MachineResult:
        """Idle -> Deleting -> Speculative, with the deleting deadline and operator parking.

        Bare metal has no Delete: the machine stays idle (that is not a failure).
        Shared by DeleteWorkflow and a drain that releases its machine afterwards.
        """
        step = DeleteStep.DELETE
        while True:
            match step:
                case DeleteStep.DELETE:
                    self._set_phase(DELETING)
                    answer = await self._activity(
                        DELETE_MACHINE,
                        DeleteMachineInput(self._view.shard_id, self._target),
                        TransitionAnswer,
                    )
                    if self._accepted(answer, "delete"):
                        self._set_deadline(self._deadline_in(deadlines.deleting_s))
                        step = DeleteStep.WAIT
                    elif answer.refusal == UNIMPLEMENTED:
                        return await self._finish(
                            IDLE,
                            succeeded=True,
                            note="the provider has no Delete; idle bare metal stays idle",
                        )
                    elif answer.refusal == NOT_FOUND:
                        return await self._finish(FAILED, succeeded=False, last_error=answer.detail)
                    else:
                        step = DeleteStep.LOOK
                case DeleteStep.LOOK:
                    seen = await self._observe()
                    step = self._after_delete_look(seen, deadlines)
                case DeleteStep.RELEASED:
                    return await self._finish(SPECULATIVE, succeeded=True)
                case DeleteStep.MOVED:
                    return await self._finish(
                        seen.state,
                        succeeded=False,
                        note=f"not released: the machine is {seen.state}",
                    )
                case DeleteStep.WAIT:
                    waited = await self._wait_until(lambda s: s.state == SPECULATIVE, poll)
                    match waited.how:
                        case WaitEnd.DONE:
                            return await self._finish(SPECULATIVE, succeeded=True)
                        case WaitEnd.FAILED:
                            self._fail_reason(
                                f"provider failed the delete: {waited.seen.last_error}"
                            )
                            step = DeleteStep.AWAIT
                        case WaitEnd.DEADLINE:
                            self._fail_reason(
                                f"deleting exceeded its deadline of {deadlines.deleting_s:g} s "
                                f"(provider still reports {waited.seen.state})"
                            )
                            step = DeleteStep.AWAIT
                        case WaitEnd.COMMAND:
                            step = self._delete_command(self._take_command(), waiting=True)
                        case _:
                            assert_never(waited.how)
                case DeleteStep.AWAIT:
                    command = await self._await_operator(self._view.last_error)
                    step = self._delete_command(command, waiting=False)
                case DeleteStep.ABANDON:
                    return await self._abandoned()
                case _:
                    assert_never(step)

    def _after_delete_look(self, seen: MachineOutcome, deadlines: Deadlines) -> DeleteStep:
        if seen.state == SPECULATIVE:
            return DeleteStep.RELEASED
        if seen.state == DELETING:
            self._set_deadline(self._deadline_in(deadlines.deleting_s))
            return DeleteStep.WAIT
        if seen.state == IDLE:
            if self._refusals >= MAX_REFUSALS:
                self._fail_reason(f"the provider refused Delete {self._refusals} times")
                return DeleteStep.AWAIT
            return DeleteStep.DELETE
        if seen.state == FAILED:
            self._fail_reason(f"provider reports FAILED: {seen.last_error}")
            return DeleteStep.AWAIT
        return DeleteStep.MOVED

    def _delete_command(self, command: Command | None, *, waiting: bool) -> DeleteStep:
        if command is None:
            return DeleteStep.WAIT if waiting else DeleteStep.AWAIT
        match command.kind:
            case OperatorSignal.RETRY | OperatorSignal.FORCE:
                return DeleteStep.DELETE
            case OperatorSignal.RESOLVE:
                self._note(f"resolved by an operator: {command.note or '(no note)'}")
                return DeleteStep.LOOK
            case OperatorSignal.ABANDON:
                return DeleteStep.ABANDON
            case OperatorSignal.ESCALATE:
                self._note(f"{command.kind.value} does not apply to a delete; ignored")
                return DeleteStep.WAIT if waiting else DeleteStep.AWAIT
            case _:
                assert_never(command.kind)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
