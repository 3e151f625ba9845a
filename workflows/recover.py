"""RecoverWorkflow: the corrective action for one machine a provisioning batch lost.

A batch (ProvisionWorkflow) hands each machine that missed a deadline or
failed to a RecoverWorkflow of its own (a child it abandons on completion),
so the machine can be found by ``BigFleetMachineId``, queried and signalled.
The outcome is recorded at the batch's operation sequence, and until then
the engine keeps the machine in flight (it is never picked twice).

Failed while CREATING (paper §5 / DESIGN §2: clean up, retry elsewhere or mark the slot bad)::

    look at the provider
      IDLE         the create finished late: keep the machine idle, usable
      CREATING     still under way: wait one more creating deadline, then an operator
      FAILED       the provider cleans it up; if its error says the slot is bad
                   (capacity, quota) the slot is quarantined: the engine stops using it
      SPECULATIVE  already cleaned up
    -> record; the engine's next cycle covers the need from another
       speculative slot (a FAILED or quarantined slot is never speculative)

Failed while CONFIGURING (fresh bootstrap blob and retry once, else back to Idle)::

    look at the provider
      CONFIGURED   it made it after all: record it configured
      CONFIGURING  still under way: wait one more configuring deadline
      IDLE/FAILED  retry once: Configure with a fresh blob, wait for CONFIGURED
    after the retry: CONFIGURED, else IDLE (for other use) or FAILED as the
    provider reports; a machine stuck CONFIGURING parks for an operator.

Choosing *which* slot to retry on is the engine's decision, not the
workflow's: decisions are values made in one place (ADR 0030).
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.contracts import (
    CONFIGURE_MACHINES,
    CONFIGURED,
    CONFIGURING,
    CREATING,
    FAILED,
    IDLE,
    OP_RECOVER,
    REASON_CONFIGURE_FAILED,
    REASON_CREATE_FAILED,
    SPECULATIVE,
    ConfigureMachinesInput,
    MachineResult,
    OperatorSignal,
    RecoverInput,
    TransitionResults,
)
from workflows.errors import BOOTSTRAP_UNAVAILABLE, error_message, error_type
from workflows.machine import Command, MachineWorkflow, WaitEnd


class RecoverStep(StrEnum):
    """The steps of a recovery's loops; local to one run, never recorded."""

    LOOK = "look"  # re-read the provider and decide
    RETRY = "retry"  # configure again with a fresh bootstrap blob (once)
    WAIT = "wait"  # wait for the provider, bounded by the state's deadline
    AWAIT = "await"  # park for an operator
    ABANDON = "abandon"  # the operator gave up on the machine


@workflow.defn(name="RecoverWorkflow")
class RecoverWorkflow(MachineWorkflow):
    """Corrective action for one failed machine; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._inp: RecoverInput | None = None
        self._waited = False
        self._retried = False

    @workflow.run
    async def run(self, inp: RecoverInput) -> MachineResult:
        self._inp = inp
        self._begin(
            operation=OP_RECOVER,
            shard_id=inp.shard_id,
            machine=inp.machine,
            cluster_id=inp.cluster_id,
            operation_seq=inp.operation_seq,
            priority=inp.priority,
            phase=FAILED,
            reason=REASON_CREATE_FAILED if inp.failed_in == CREATING else REASON_CONFIGURE_FAILED,
        )
        self._fail_reason(f"failed while {inp.failed_in}: {inp.last_error}")
        if inp.failed_in == CREATING:
            return await self._recover_create()
        return await self._recover_configure()

    # ---------------------------------------------------------------- creating

    async def _recover_create(self) -> MachineResult:
        inp = self._require()
        step = RecoverStep.LOOK
        while True:
            if step is RecoverStep.LOOK:
                seen = await self._observe()
                if seen.state == IDLE:
                    return await self._finish(
                        IDLE,
                        succeeded=False,
                        last_error=self._view.last_error,
                        note="the create finished after its deadline; kept idle for other use",
                    )
                if seen.state == SPECULATIVE:
                    return await self._finish(
                        SPECULATIVE,
                        succeeded=False,
                        last_error=self._view.last_error,
                        note="the provider cleaned the slot up; the engine retries elsewhere",
                    )
                if seen.state == FAILED:
                    reason = seen.last_error or self._view.last_error
                    bad = self._slot_is_bad(reason)
                    return await self._finish(
                        FAILED,
                        succeeded=False,
                        last_error=reason,
                        quarantine=bad,
                        note="slot marked bad: the engine stops using it"
                        if bad
                        else "the provider cleans the slot up; the engine retries elsewhere",
                    )
                if seen.state == CREATING and not self._waited:
                    self._waited = True
                    self._set_phase(CREATING)
                    self._set_deadline(self._deadline_in(inp.deadlines.creating_s))
                    step = RecoverStep.WAIT
                else:
                    self._fail_reason(
                        f"still {seen.state} one more creating deadline "
                        f"({inp.deadlines.creating_s:g} s) after it failed"
                    )
                    step = RecoverStep.AWAIT
            elif step is RecoverStep.WAIT:
                waited = await self._wait_until(lambda s: s.state != CREATING, inp.poll)
                if waited.how is WaitEnd.COMMAND:
                    step = self._on_command(self._take_command(), waiting=True)
                else:
                    step = RecoverStep.LOOK
            elif step is RecoverStep.AWAIT:
                step = self._on_command(await self._await_operator(self._view.last_error))
            elif step is RecoverStep.ABANDON:
                return await self._abandoned()
            elif step is RecoverStep.RETRY:
                raise RuntimeError("internal: a failed create is not configured again")
            else:
                assert_never(step)

    def _slot_is_bad(self, reason: str) -> bool:
        lowered = reason.lower()
        return any(marker.lower() in lowered for marker in self._require().bad_slot_markers)

    # ------------------------------------------------------------- configuring

    async def _recover_configure(self) -> MachineResult:
        inp = self._require()
        step = RecoverStep.LOOK
        while True:
            if step is RecoverStep.LOOK:
                seen = await self._observe()
                if seen.state == CONFIGURED:
                    return await self._finish(
                        CONFIGURED,
                        succeeded=True,
                        cluster_id=inp.cluster_id,
                        need_key=inp.need_key,
                        note="configured after all",
                    )
                if seen.state in (IDLE, FAILED) and not self._retried:
                    step = RecoverStep.RETRY
                elif seen.state == IDLE:
                    return await self._finish(
                        IDLE,
                        succeeded=False,
                        last_error=self._view.last_error,
                        note="returned to idle for other use",
                    )
                elif seen.state == FAILED:
                    return await self._finish(
                        FAILED,
                        succeeded=False,
                        last_error=seen.last_error or self._view.last_error,
                        note="the provider holds it FAILED; its clean-up returns the slot",
                    )
                elif seen.state == CONFIGURING and not self._waited:
                    self._waited = True
                    self._set_phase(CONFIGURING)
                    self._set_deadline(self._deadline_in(inp.deadlines.configuring_s))
                    step = RecoverStep.WAIT
                elif seen.state == CONFIGURING:
                    self._fail_reason(
                        f"still CONFIGURING one more configuring deadline "
                        f"({inp.deadlines.configuring_s:g} s) after it failed"
                    )
                    step = RecoverStep.AWAIT
                else:
                    return await self._finish(
                        seen.state,
                        succeeded=False,
                        last_error=self._view.last_error,
                        note=f"the machine is {seen.state}; nothing to configure",
                    )
            elif step is RecoverStep.RETRY:
                step = await self._configure_again()
            elif step is RecoverStep.WAIT:
                waited = await self._wait_until(lambda s: s.state == CONFIGURED, inp.poll)
                match waited.how:
                    case WaitEnd.COMMAND:
                        step = self._on_command(self._take_command(), waiting=True)
                    case WaitEnd.DEADLINE:
                        self._fail_reason(
                            "configuring exceeded its deadline of "
                            f"{inp.deadlines.configuring_s:g} s "
                            f"(provider still reports {waited.seen.state})"
                        )
                        step = RecoverStep.LOOK
                    case WaitEnd.FAILED:
                        self._fail_reason(
                            f"provider failed the configure: {waited.seen.last_error}"
                        )
                        step = RecoverStep.LOOK
                    case WaitEnd.DONE:
                        step = RecoverStep.LOOK
                    case _:
                        assert_never(waited.how)
            elif step is RecoverStep.AWAIT:
                step = self._on_command(await self._await_operator(self._view.last_error))
            elif step is RecoverStep.ABANDON:
                return await self._abandoned()
            else:
                assert_never(step)

    async def _configure_again(self) -> RecoverStep:
        """The one retry: a fresh bootstrap blob (fetched inside the activity) and Configure."""
        inp = self._require()
        self._retried = True
        self._waited = True
        self._set_phase(CONFIGURING)
        try:
            results = await self._activity(
                CONFIGURE_MACHINES,
                ConfigureMachinesInput(
                    inp.shard_id,
                    inp.cluster_id,
                    inp.need_key,
                    inp.priority,
                    inp.operation_seq,
                    [inp.machine],
                    inp.requirements,
                ),
                TransitionResults,
            )
        except ActivityError as err:
            if error_type(err) != BOOTSTRAP_UNAVAILABLE:
                raise
            self._view.attempts += 1
            self._fail_reason(f"bootstrap unavailable: {error_message(err)}")
            return RecoverStep.LOOK
        self._view.attempts += 1
        if results.refused:
            self._fail_reason(f"the provider refused the retry: {results.refused[0].last_error}")
            return RecoverStep.LOOK
        self._note("retrying Configure with a fresh bootstrap blob")
        self._set_deadline(self._deadline_in(inp.deadlines.configuring_s))
        return RecoverStep.WAIT

    # ---------------------------------------------------------------- commands

    def _on_command(self, command: Command | None, *, waiting: bool = False) -> RecoverStep:
        if command is None:
            return RecoverStep.WAIT if waiting else RecoverStep.AWAIT
        match command.kind:
            case OperatorSignal.RETRY | OperatorSignal.FORCE:
                self._note(f"{command.kind.value} requested by an operator")
                self._waited = False
                self._retried = False
                self._set_deadline(None)
                return RecoverStep.LOOK
            case OperatorSignal.RESOLVE:
                self._note(f"resolved by an operator: {command.note or '(no note)'}")
                self._waited = False
                self._set_deadline(None)
                return RecoverStep.LOOK
            case OperatorSignal.ABANDON:
                return RecoverStep.ABANDON
            case OperatorSignal.ESCALATE:
                self._note(f"{command.kind.value} does not apply to a recovery; ignored")
                return RecoverStep.WAIT if waiting else RecoverStep.AWAIT
            case _:
                assert_never(command.kind)

    def _require(self) -> RecoverInput:
        assert self._inp is not None
        return self._inp
