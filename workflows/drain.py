"""DrainWorkflow: one configured machine back to Idle, with the grace the engine chose.

    tell the operator (ReclaimInstruction: nodes, grace, preemptor priority)
      -> provider Drain(grace)                    [fenced]
      -> wait for IDLE                            deadline: grace + margin
           escalate(g)  new instruction + Drain(g), deadline shortened
           force()      forced termination now: instruction + Drain(0)
           past grace with a preemptor waiting -> report the blocked drain (shortfall)
      -> deadline: FAILED, last_error kept -> forced termination (Drain(0), deadline: margin)
      -> that too: AwaitingOperator  (retry/force: force again · resolve: re-read · abandon)
      -> [release_after] Delete -> SPECULATIVE
      -> record the outcome once (inventory + store; a preemption's machine is promised on)

Cancellation is not offered: a partly drained workload has already lost
state (paper §5), so the drain always runs to Idle or to an operator.

A provider answers a repeated Drain for a machine already DRAINING with the
operation in flight (idempotency); whether it also honours the shorter
grace is the provider's business (the simulated providers do: the drain
finishes no later than the new grace from now). The workflow notes a
repeated operation id in the view, and always shortens its own deadline, so
an escalation reaches forced termination and then an operator on the
shorter clock.
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never

from temporalio import workflow

from workflows.contracts import (
    CONFIGURED,
    DRAIN_MACHINE,
    DRAINING,
    FAILED,
    IDLE,
    NOTIFY_RECLAIM,
    OP_DRAIN,
    REPORT_BLOCKED_DRAIN,
    SPECULATIVE,
    BlockedDrain,
    DrainInput,
    DrainMachineInput,
    MachineOutcome,
    MachineResult,
    NotifyReclaimInput,
    OperatorSignal,
    ReclaimDelivery,
    TransitionAnswer,
)
from workflows.errors import NOT_FOUND
from workflows.machine import (
    MAX_REFUSALS,
    REASONS_PATCH,
    Command,
    MachineWorkflow,
    WaitEnd,
)


class DrainStep(StrEnum):
    """The steps of a drain's loop (``DrainWorkflow.run``); local to one run, never recorded."""

    DRAIN = "drain"  # tell the operator, ask the provider to Drain with the current grace
    FORCE = "force"  # the same with zero grace: forced termination
    WAIT = "wait"  # wait for IDLE, bounded by grace + margin
    LOOK = "look"  # re-read the provider and decide
    AWAIT = "await"  # park for an operator
    ABANDON = "abandon"  # the operator gave up on the machine
    GONE = "gone"  # the provider does not know the machine
    DRAINED = "drained"  # IDLE (or SPECULATIVE): finish, or release first


@workflow.defn(name="DrainWorkflow")
class DrainWorkflow(MachineWorkflow):
    """Durable drain of one machine; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._inp: DrainInput | None = None
        self._grace = 0
        self._forced = False
        self._instructions = 0
        self._last_blocked_report: float | None = None

    @workflow.run
    async def run(self, inp: DrainInput) -> MachineResult:
        self._inp = inp
        self._grace = max(0, inp.grace_seconds)
        if workflow.patched(REASONS_PATCH):
            # BigFleetPriority on a drain is the priority of what it takes away.
            priority, reason = inp.victim_priority, inp.reason
        else:
            priority = inp.waiter.priority if inp.waiter is not None else inp.victim_priority
            reason = ""
        self._begin(
            operation=OP_DRAIN,
            shard_id=inp.shard_id,
            machine=inp.machine,
            cluster_id=inp.cluster_id,
            operation_seq=inp.operation_seq,
            priority=priority,
            phase=DRAINING,
            grace_seconds=self._grace,
            reason=reason,
        )
        self._view.waiting = inp.waiter
        requested = workflow.now()
        step = DrainStep.DRAIN
        while True:
            match step:
                case DrainStep.DRAIN:
                    step = await self._start_drain()
                case DrainStep.FORCE:
                    self._forced = True
                    self._grace = 0
                    self._set_grace(0)
                    step = await self._start_drain()
                case DrainStep.WAIT:
                    step = await self._wait_drained(requested.timestamp())
                case DrainStep.LOOK:
                    step = self._after_look(await self._observe())
                case DrainStep.AWAIT:
                    step = self._on_command(await self._await_operator(self._view.last_error))
                case DrainStep.ABANDON:
                    return await self._abandoned()
                case DrainStep.GONE:
                    return await self._finish(
                        FAILED, succeeded=False, last_error=self._view.last_error
                    )
                case DrainStep.DRAINED:
                    return await self._drained()
                case _:
                    assert_never(step)

    # ------------------------------------------------------------------ steps

    async def _start_drain(self) -> DrainStep:
        """Tell the operator, then ask the provider (again) with the current grace."""
        inp = self._require()
        self._set_phase(DRAINING)
        await self._tell_operator()
        answer = await self._activity(
            DRAIN_MACHINE,
            DrainMachineInput(inp.shard_id, inp.machine, self._grace),
            TransitionAnswer,
        )
        what = f"a {'forced ' if self._forced else ''}drain with grace {self._grace} s"
        if self._accepted(answer, what):
            margin = inp.deadlines.draining_margin_s
            deadline = self._deadline_in(self._grace + margin)
            if self._deadline is not None and not self._forced:
                deadline = min(deadline, self._deadline)
            self._set_deadline(deadline)
            return DrainStep.WAIT
        if answer.refusal == NOT_FOUND:
            self._view.last_error = answer.detail
            return DrainStep.GONE
        if self._refusals >= MAX_REFUSALS:
            self._fail_reason(f"the provider refused Drain {self._refusals} times")
            return DrainStep.AWAIT
        return DrainStep.LOOK

    async def _tell_operator(self) -> None:
        """ReclaimInstruction to the cluster's operator; best effort (the provider drains too)."""
        inp = self._require()
        self._instructions += 1
        delivery = await self._activity(
            NOTIFY_RECLAIM,
            NotifyReclaimInput(
                shard_id=inp.shard_id,
                cluster_id=inp.cluster_id,
                instruction_id=f"{self._view.workflow_id}#{self._instructions}",
                machine_ids=[inp.machine.machine_id],
                grace_seconds=self._grace,
                preemptor_priority=inp.waiter.priority if inp.waiter is not None else 0,
            ),
            ReclaimDelivery,
        )
        if not delivery.delivered:
            self._note(
                f"cluster {inp.cluster_id} has no open session; the reclaim instruction "
                "was not delivered (the provider's drain still proceeds)"
            )

    async def _wait_drained(self, requested_unix: float) -> DrainStep:
        inp = self._require()

        async def tick() -> None:
            await self._report_if_blocked(requested_unix)

        waited = await self._wait_until(
            lambda s: s.state in (IDLE, SPECULATIVE), inp.poll, on_tick=tick
        )
        match waited.how:
            case WaitEnd.DONE:
                return DrainStep.DRAINED
            case WaitEnd.FAILED:
                self._fail_reason(f"provider failed the drain: {waited.seen.last_error}")
                return DrainStep.AWAIT if self._forced else DrainStep.FORCE
            case WaitEnd.DEADLINE:
                if self._forced:
                    self._fail_reason(
                        "forced drain exceeded its deadline of "
                        f"{inp.deadlines.draining_margin_s:g} s "
                        f"(provider still reports {waited.seen.state})"
                    )
                    return DrainStep.AWAIT
                self._fail_reason(
                    f"draining exceeded its deadline (grace {self._grace} s + "
                    f"{inp.deadlines.draining_margin_s:g} s; provider still reports "
                    f"{waited.seen.state}): escalating to forced termination"
                )
                return DrainStep.FORCE
            case WaitEnd.COMMAND:
                command = self._take_command()
                assert command is not None
                return self._on_command(command, draining=True)
            case _:
                assert_never(waited.how)

    def _after_look(self, seen: MachineOutcome) -> DrainStep:
        """Continue from what the provider reports now."""
        inp = self._require()
        state = seen.state
        if state in (IDLE, SPECULATIVE):
            return DrainStep.DRAINED
        if state == DRAINING:
            if self._deadline is None:
                self._set_deadline(self._deadline_in(self._grace + inp.deadlines.draining_margin_s))
            return DrainStep.WAIT
        if state == CONFIGURED:
            return DrainStep.DRAIN
        if state == FAILED:
            self._fail_reason(f"provider reports FAILED: {seen.last_error or 'no reason given'}")
            return DrainStep.AWAIT if self._forced else DrainStep.FORCE
        self._fail_reason(f"the machine is {state}; there is nothing to drain")
        return DrainStep.AWAIT

    def _on_command(self, command: Command, *, draining: bool = False) -> DrainStep:
        match command.kind:
            case OperatorSignal.ESCALATE:
                if draining and command.grace_seconds >= self._grace:
                    self._note(
                        f"escalate to {command.grace_seconds} s ignored: the grace is already "
                        f"{self._grace} s"
                    )
                    return DrainStep.WAIT
                self._grace = command.grace_seconds
                self._set_grace(self._grace)
                self._note(f"escalated by an operator to a grace of {self._grace} s")
                return DrainStep.DRAIN
            case OperatorSignal.FORCE:
                self._note("forced termination requested by an operator")
                return DrainStep.FORCE
            case OperatorSignal.RETRY:
                self._note("retry requested by an operator")
                return DrainStep.FORCE if self._forced else DrainStep.DRAIN
            case OperatorSignal.RESOLVE:
                self._note(f"resolved by an operator: {command.note or '(no note)'}")
                self._set_deadline(None)
                return DrainStep.LOOK
            case OperatorSignal.ABANDON:
                return DrainStep.ABANDON
            case _:
                assert_never(command.kind)

    async def _report_if_blocked(self, requested_unix: float) -> None:
        """Past its grace with a preemptor waiting: tell the shard (it becomes a shortfall)."""
        inp = self._require()
        if inp.waiter is None:
            return
        now = workflow.now().timestamp()
        blocked_since = requested_unix + inp.grace_seconds
        if now < blocked_since:
            return
        last = self._last_blocked_report
        if last is not None and now - last < inp.blocked_report_every_s:
            return
        self._last_blocked_report = now
        self._view.blocked_since_unix = blocked_since
        if last is None:
            self._note(
                f"drain outlasted its grace of {inp.grace_seconds} s; priority "
                f"{inp.waiter.priority} of {inp.waiter.cluster_id} is waiting (reported)"
            )
        await self._activity(
            REPORT_BLOCKED_DRAIN,
            BlockedDrain(
                shard_id=inp.shard_id,
                machine_id=inp.machine.machine_id,
                victim_cluster_id=inp.cluster_id,
                waiter=inp.waiter,
                requested_unix=requested_unix,
                grace_seconds=inp.grace_seconds,
                workflow_id=self._view.workflow_id,
            ),
            type(None),
        )

    async def _drained(self) -> MachineResult:
        inp = self._require()
        if inp.release_after:
            self._note("drained; releasing the machine")
            return await self._release(inp.deadlines, inp.poll)
        state = self._view.machine_state if self._view.machine_state == SPECULATIVE else IDLE
        return await self._finish(state, succeeded=True)

    def _require(self) -> DrainInput:
        assert self._inp is not None
        return self._inp
