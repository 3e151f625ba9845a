"""The global coordinator: a singleton workflow that moves capacity between shards.

    shards ──report(ShardReport) signal──▶ CoordinatorWorkflow (id "bigfleet-coordinator")
        every round:  distribute unowned provider machines evenly over active shards
                      plan transfers for the reported shortfalls, and each active
                      shard's offers of the others' idle machines (pure, in an activity)
                      one TransferWorkflow per instruction (visible, retryable)
        continue-as-new carries the term, the sequence and the latest reports
    shards ──fleet_idle(FleetIdleQuery) query, after each report──▶ that shard's offers

Every instruction carries the coordinator's (term, seq). The term comes from
PostgreSQL and grows with every coordinator start; shards refuse instructions
from a term lower than the highest they have seen. While the coordinator is
down, shards keep serving from what they own (static stability); their
reports wait as signals.

Idle first, fleet-wide (ADR 0129): a shard that can still buy reports no
shortfall, so the planner alone would never move another shard's idle
machine to it. Each round therefore also computes, for every active shard,
the idle machines the others hold; the shard reads them with the
``fleet_idle`` query right after its report and hands them to its engine,
whose Phase 1 lets a need wait briefly for one (reported as a shortfall,
which a round's idle step answers). The machines of an idle transfer still
under way stay on offer to its receiver until it ends, so the waiting need
does not give up and buy while they move. The round's planning activity,
run every round since, is gated by ``FLEET_IDLE_PATCH``; a query writes
nothing to the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

from workflows import membership_contracts as ms
from workflows.coordinator_contracts import (
    ADOPT_MACHINES,
    BUDGET_SHARES,
    BUDGET_STALE_INTERVALS,
    COOLDOWN_REPORT_INTERVALS,
    COORDINATOR_ID,
    COORDINATOR_QUEUE,
    DISTRIBUTE,
    DOMAIN_LABEL,
    FINISH_INSTRUCTION,
    FLEET_IDLE,
    PLAN,
    PLAN_DECOMMISSION,
    PREPARE_PREEMPTION,
    RECORD_INSTRUCTION,
    RELEASE_MACHINES,
    RETIRE_MACHINES,
    AdoptInput,
    Adoption,
    AdoptResult,
    BudgetShareAnswer,
    BudgetShareAsk,
    CoordinatorInput,
    DecommissionInput,
    DecommissionPlan,
    DecommissionResult,
    DistributeInput,
    DistributeResult,
    DrainStart,
    FleetIdleQuery,
    FleetIdleReply,
    IdleOffer,
    InstructionOutcome,
    InstructionRecord,
    PlanInput,
    PlanResult,
    PreemptionPlan,
    ProfileReport,
    ReleaseInput,
    ReleaseResult,
    RetireInput,
    RetireResult,
    ShardReport,
    ShortfallReport,
    TransferInput,
    TransferKind,
    TransferResult,
    TransferSpec,
    WantOffer,
    answer_key,
    deal_shares,
)
from workflows.membership import ClusterMoveWorkflow, HandoverWorkflow
from workflows.retries import INSTRUCTION_RETRY, QUICK

# Marks histories in which a shortfall is answered again only from a report whose
# cycle ran after the last answer ended (ADR 0169); older histories replay without it.
FRESH_CYCLE_PATCH = "answer-from-a-later-cycle"
# How long an answer's end is remembered, in report intervals: a shard whose cycles
# stalled that long is answered again from whatever it reports.
ANSWERED_INTERVALS = 20
# Marks histories in which every round plans (not only one with a shortfall), so each
# shard can be told what the others hold idle (ADR 0129).
FLEET_IDLE_PATCH = "fleet-idle-offers"
# Marks histories in which no quota is rebalanced away from a shard a shortfall answer
# has just given some (ADR 0174).
ANSWERED_PATCH = "no-rebalance-after-an-answer"


@workflow.defn(name="TransferWorkflow")
class TransferWorkflow:
    """Move machines from a donor shard to a receiver: release, then adopt, then record."""

    @workflow.run
    async def run(self, inp: TransferInput) -> TransferResult:
        spec = inp.spec
        await workflow.execute_activity(
            RECORD_INSTRUCTION,
            InstructionRecord(inp.term, inp.seq, spec.kind, spec.donor, spec.receiver, spec),
            start_to_close_timeout=QUICK,
            retry_policy=INSTRUCTION_RETRY,
        )
        if spec.kind == TransferKind.PREEMPT:
            refused = await self._preempt(inp)
            if refused:
                return await self._finish(inp, "refused", 0, f"donor {spec.donor}: {refused}")
        try:
            released = await workflow.execute_activity(
                RELEASE_MACHINES,
                ReleaseInput(inp.term, inp.seq, spec),
                result_type=ReleaseResult,
                task_queue=f"shard-{spec.donor}",
                schedule_to_close_timeout=timedelta(minutes=2),
                retry_policy=INSTRUCTION_RETRY,
            )
        except ActivityError as err:
            return await self._finish(inp, "failed", 0, f"donor {spec.donor}: {err.cause or err}")
        if released.refused:
            return await self._finish(inp, "refused", 0, f"donor {spec.donor}: {released.refused}")
        if released.moved:
            try:
                adopted = await workflow.execute_activity(
                    ADOPT_MACHINES,
                    AdoptInput(inp.term, inp.seq, released.moved),
                    result_type=AdoptResult,
                    task_queue=f"shard-{spec.receiver}",
                    schedule_to_close_timeout=timedelta(minutes=2),
                    retry_policy=INSTRUCTION_RETRY,
                )
            except ActivityError as err:
                # Ownership already moved in PostgreSQL: the receiver loads it
                # at its next start, so nothing is lost, only delayed.
                return await self._finish(
                    inp,
                    "applied",
                    len(released.moved),
                    f"moved {len(released.moved)}; receiver will load them at restart ({err})",
                )
            if adopted.refused:
                return await self._finish(
                    inp, "applied", len(released.moved), f"receiver: {adopted.refused}"
                )
        return await self._finish(
            inp, "applied", len(released.moved), f"moved {len(released.moved)} of {spec.count}"
        )

    async def _preempt(self, inp: TransferInput) -> str:
        """Drain strictly-lower-priority victims on the donor before ownership moves.

        The donor picks the victims and the gap-scaled grace; each drain is a
        child workflow on the donor's task queue, so it is findable, queryable
        and signallable like any other drain. Returns a refusal, or "".
        """
        spec = inp.spec
        try:
            plan: PreemptionPlan = await workflow.execute_activity(
                PREPARE_PREEMPTION,
                ReleaseInput(inp.term, inp.seq, spec),
                result_type=PreemptionPlan,
                task_queue=f"shard-{spec.donor}",
                schedule_to_close_timeout=timedelta(minutes=2),
                retry_policy=INSTRUCTION_RETRY,
            )
        except ActivityError as err:
            return f"could not prepare the preemption: {err.cause or err}"
        if plan.refused:
            return plan.refused
        if not plan.drains:
            return "no strictly lower-priority machine of that profile to preempt"

        async def drain(start: DrainStart) -> None:
            try:
                await workflow.execute_child_workflow(
                    "DrainWorkflow",
                    start.input,
                    id=start.workflow_id,
                    task_queue=f"shard-{spec.donor}",
                    parent_close_policy=ParentClosePolicy.ABANDON,
                )
            except ChildWorkflowError as err:
                workflow.logger.warning("drain %s failed: %s", start.workflow_id, err)

        await asyncio.gather(*(drain(d) for d in plan.drains))
        return ""

    async def _finish(
        self, inp: TransferInput, status: str, moved: int, outcome: str
    ) -> TransferResult:
        await workflow.execute_activity(
            FINISH_INSTRUCTION,
            InstructionOutcome(inp.term, inp.seq, status, outcome),
            start_to_close_timeout=QUICK,
            retry_policy=INSTRUCTION_RETRY,
        )
        return TransferResult(status, moved, outcome)


def _describe(spec: TransferSpec | ms.ClusterMoveSpec | ms.HandoverSpec) -> dict[str, object]:
    if isinstance(spec, ms.ClusterMoveSpec):
        return {"kind": "cluster-move", **dataclasses.asdict(spec)}
    if isinstance(spec, ms.HandoverSpec):
        return {
            "kind": "handover",
            "donor": spec.donor,
            "receiver": spec.receiver,
            "count": len(spec.machines),
        }
    return dataclasses.asdict(spec)


@workflow.defn(name="DecommissionWorkflow")
class DecommissionWorkflow:
    """Retire machines of a domain evenly from every shard that holds some.

    Each shard takes its share out of use itself: unbound machines are
    quarantined at once, configured ones are drained first (their clusters
    see the loss and replace it). Quarantine is durable, so a retired machine
    never comes back after a restart.
    """

    @workflow.run
    async def run(self, inp: DecommissionInput) -> DecommissionResult:
        plan: DecommissionPlan = await workflow.execute_activity(
            PLAN_DECOMMISSION,
            inp,
            result_type=DecommissionPlan,
            start_to_close_timeout=QUICK,
            retry_policy=INSTRUCTION_RETRY,
        )

        async def retire(shard_id: str, ids: list[str]) -> tuple[str, int]:
            result: RetireResult = await workflow.execute_activity(
                RETIRE_MACHINES,
                RetireInput(ids, inp.reason),
                result_type=RetireResult,
                task_queue=f"shard-{shard_id}",
                schedule_to_close_timeout=timedelta(minutes=10),
                retry_policy=INSTRUCTION_RETRY,
            )
            return shard_id, result.retired

        done = await asyncio.gather(*(retire(s, ids) for s, ids in sorted(plan.by_shard.items())))
        return DecommissionResult(dict(done))


def _cooldown_key(spec: TransferSpec) -> str:
    return answer_key(spec.receiver, spec.cluster_id, spec.need_key)


@workflow.defn(name="CoordinatorWorkflow")
class CoordinatorWorkflow:
    """The singleton coordinator (workflow id ``bigfleet-coordinator``)."""

    @workflow.init
    def __init__(self, inp: CoordinatorInput) -> None:
        # Set before any signal is handled: reports that waited while no
        # coordinator ran arrive in the first task, before ``run`` starts.
        self._state: CoordinatorInput | None = inp
        self._new_reports = False
        # Instructions in progress: transfers, cluster moves and handovers.
        self._pending: dict[str, TransferSpec | ms.ClusterMoveSpec | ms.HandoverSpec] = {}
        self._recent: list[dict[str, object]] = []
        self._tasks: set[asyncio.Future[None]] = set()
        # The last round's idle offers (every shard's, once) and the shards they are for,
        # with that round's seq and time, and the machines of transfers under way, per
        # pending key (ADR 0129). The offers come through continue-as-new in the input;
        # the transfers under way need not (a run continues as new once none is).
        self._idle: list[IdleOffer] = list(inp.idle_offers)
        self._receivers: frozenset[str] = frozenset(inp.idle_receivers)
        self._offers_seq = inp.offers_seq
        self._offers_at = inp.offers_at
        self._arriving: dict[str, tuple[str, IdleOffer]] = {}

    @workflow.signal(name="report")
    def report(self, report: ShardReport) -> None:
        """A shard's periodic report; the newest per shard wins."""
        if self._state is None:
            return
        current = self._state.reports.get(report.shard_id)
        if current is None or report.sent_at >= current.sent_at:
            self._state.reports[report.shard_id] = report
            self._new_reports = True

    @workflow.update(name=BUDGET_SHARES)
    def budget_shares(self, ask: BudgetShareAsk) -> BudgetShareAnswer:
        """Deal a shard its shares of the fleet-wide count budgets (ADR 0140).

        The shard's census replaces its previous one; shards not heard from
        for ``BUDGET_STALE_INTERVALS`` report intervals give up their shares.
        The grant is recorded, so the next shard's share leaves room for it.
        """
        state = self._state
        assert state is not None  # set in __init__
        now = workflow.now().timestamp()
        state.budget_asks[ask.shard_id] = ask
        state.budget_asked_at[ask.shard_id] = now
        horizon = now - BUDGET_STALE_INTERVALS * state.interval_s
        for shard_id in [s for s, t in state.budget_asked_at.items() if t < horizon]:
            state.budget_asks.pop(shard_id, None)
            state.budget_asked_at.pop(shard_id, None)
            state.budget_grants.pop(shard_id, None)
        shares = deal_shares(state.budget_asks, state.budget_grants, ask)
        state.budget_grants[ask.shard_id] = shares
        return BudgetShareAnswer(term=state.term, shards=len(state.budget_asks), shares=shares)

    @budget_shares.validator
    def _check_budget_ask(self, ask: BudgetShareAsk) -> None:
        problems = ask.problems()
        if problems:
            raise ValueError("; ".join(problems))

    @workflow.query(name=FLEET_IDLE)
    def fleet_idle(self, query: FleetIdleQuery) -> FleetIdleReply:
        """What the other shards held idle at the last round, for ``query.shard_id``.

        With the machines of idle transfers still on their way to it. Empty for
        a shard that is not active or has not reported, and before the first
        round of the coordinator's term (a run started by continue-as-new
        answers with its previous run's last round until its own first).
        """
        return FleetIdleReply(
            self._offered(query.shard_id),
            self._offers_seq,
            self._offers_at,
            self._wanted(query.shard_id),
        )

    def _wanted(self, shard_id: str) -> list[WantOffer]:
        """The other active shards' shortfalls, in their latest reports (ADR 0176)."""
        if self._state is None or shard_id not in self._receivers:
            return []
        return [
            WantOffer(report.shard_id, sf)
            for report in self._state.reports.values()
            if report.shard_id != shard_id and report.shard_id in self._receivers
            for sf in report.shortfalls
            if any(amount > 0 for amount in sf.deficit.values())
        ]

    def _offered(self, shard_id: str) -> list[IdleOffer]:
        """The other shards' idle machines for ``shard_id``, and what is on its way to it."""
        others = (
            [o for o in self._idle if o.shard_id != shard_id] if shard_id in self._receivers else []
        )
        return others + [o for receiver, o in self._arriving.values() if receiver == shard_id]

    @workflow.query(name="status")
    def status(self) -> dict[str, object]:
        state = self._state
        return {
            "term": state.term if state else 0,
            "seq": state.seq if state else 0,
            "rounds": state.rounds if state else 0,
            "shards": sorted(state.reports) if state else [],
            "shortfalls": sum(len(r.shortfalls) for r in state.reports.values()) if state else 0,
            "top_shortfalls": sorted(
                (
                    {
                        "shard": r.shard_id,
                        "cluster": sf.cluster_id,
                        "priority": sf.priority,
                        "age_cycles": sf.age_cycles,
                        "escalated": sf.escalated,
                        "reason": sf.reason,
                    }
                    for r in (state.reports.values() if state else ())
                    for sf in r.shortfalls
                ),
                key=lambda d: (-int(str(d["priority"])), str(d["cluster"])),
            )[:20],
            "budget_shares": {s: dict(g) for s, g in state.budget_grants.items()} if state else {},
            "pending": [_describe(s) for s in self._pending.values()],
            "idle_offered": {
                shard: sum(o.count for o in self._offered(shard))
                for shard in sorted(self._receivers)
            },
            "recent": self._recent[-20:],
        }

    @workflow.run
    async def run(self, inp: CoordinatorInput) -> None:
        self._state = inp
        for _ in range(inp.rounds_per_run):
            await self._round(inp)
            inp.rounds += 1
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._new_reports, timeout=timedelta(seconds=inp.interval_s)
                )
            self._new_reports = False
            if workflow.info().is_continue_as_new_suggested():
                break
        await workflow.wait_condition(lambda: not self._pending)
        inp.idle_offers, inp.idle_receivers = list(self._idle), sorted(self._receivers)
        inp.offers_seq, inp.offers_at = self._offers_seq, self._offers_at
        workflow.continue_as_new(inp)

    async def _round(self, inp: CoordinatorInput) -> None:
        inp.seq += 1
        try:
            distributed = await workflow.execute_activity(
                DISTRIBUTE,
                DistributeInput(inp.term, inp.seq),
                result_type=DistributeResult,
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=INSTRUCTION_RETRY,
            )
        except ActivityError as err:
            workflow.logger.warning("distribution failed this round: %s", err)
            distributed = DistributeResult(adoptions=[])
        for adoption in distributed.adoptions:
            inp.seq += 1
            try:
                await workflow.execute_activity(
                    ADOPT_MACHINES,
                    AdoptInput(inp.term, inp.seq, adoption.machines),
                    result_type=AdoptResult,
                    task_queue=f"shard-{adoption.shard_id}",
                    schedule_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=2),
                )
            except ActivityError:
                # Ownership is in PostgreSQL already; the shard loads it when it runs.
                workflow.logger.info("shard %s did not take its machines now", adoption.shard_id)
        await self._membership(inp)
        now = workflow.now().timestamp()
        inp.cooldown = {k: v for k, v in inp.cooldown.items() if v > now}
        later = workflow.patched(FRESH_CYCLE_PATCH)
        if later:
            horizon = now - ANSWERED_INTERVALS * inp.interval_s
            inp.answered = {k: t for k, t in inp.answered.items() if t > horizon}

        def seen_since_answer(report: ShardReport, key: str) -> bool:
            # A report whose cycle ran before the last answer to ``key`` ended does not
            # show what that answer moved yet; a shard that does not say (0) is trusted.
            ended = inp.answered.get(key) if later else None
            return ended is None or report.cycle_at <= 0 or report.cycle_at > ended

        reports = [
            ShardReport(
                r.shard_id,
                r.epoch,
                r.sent_at,
                r.total_machines,
                r.profiles,
                [
                    s
                    for s in r.shortfalls
                    if answer_key(r.shard_id, s.cluster_id, s.need_key) not in inp.cooldown
                    and not self._in_flight(answer_key(r.shard_id, s.cluster_id, s.need_key))
                    and seen_since_answer(r, answer_key(r.shard_id, s.cluster_id, s.need_key))
                ],
                r.highest_term_seen,
                r.cycle_at,
            )
            for r in inp.reports.values()
        ]
        # A rebalance move still in flight (or just finished) is not planned again:
        # the listing it was computed from does not show its effect yet. Nor is quota
        # taken from a shard a shortfall answer has just given some (ADR 0174): until
        # the shard uses it, it looks spare, and the donor that gave its last slots of
        # the group looks like a shard that just joined.
        answered = self._answered_receivers(inp) if workflow.patched(ANSWERED_PATCH) else set()
        planned = PlanResult(
            transfers=[
                s
                for s in distributed.rebalance
                if not self._in_flight(_cooldown_key(s))
                and _cooldown_key(s) not in inp.cooldown
                and s.donor not in answered
            ]
        )
        # Before the patch a round planned only for reported shortfalls; now it plans
        # every round, since the idle offers are wanted whether or not anything lacks.
        offering = workflow.patched(FLEET_IDLE_PATCH)
        if offering or any(r.shortfalls for r in reports):
            result = await workflow.execute_activity(
                PLAN,
                PlanInput(reports, inp.max_share),
                result_type=PlanResult,
                start_to_close_timeout=QUICK,
                retry_policy=INSTRUCTION_RETRY,
            )
            planned.transfers += result.transfers
            if offering:
                self._idle, self._receivers = result.idle, frozenset(result.receivers)
                self._offers_seq, self._offers_at = inp.seq, workflow.now().timestamp()
        for spec in planned.transfers:
            inp.seq += 1
            key = _cooldown_key(spec)
            # A shortfall may take several donations in one round (ADR 0111).
            self._pending[f"{key}#{inp.seq}"] = spec
            arriving = _arriving(spec, inp.reports.get(spec.donor))
            if arriving is not None:
                self._arriving[f"{key}#{inp.seq}"] = (spec.receiver, arriving)
            task = asyncio.ensure_future(self._transfer(inp, inp.seq, spec, key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _membership(self, inp: CoordinatorInput) -> None:
        """Start a move for every cluster, and a handover for the unbound machines, of
        draining shards (``workflows.membership``); one at a time per cluster or pair."""
        try:
            plan = await workflow.execute_activity(
                ms.PLAN_MEMBERSHIP,
                ms.MembershipPlanInput(inp.term),
                result_type=ms.MembershipPlan,
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=INSTRUCTION_RETRY,
            )
        except ActivityError as err:
            workflow.logger.warning("membership planning failed this round: %s", err)
            return
        for move in plan.moves:
            key = f"move|{move.cluster_id}"
            if key not in self._pending:
                inp.seq += 1
                self._pending[key] = move
                self._spawn(self._member(inp, inp.seq, key, move))
        for handover in plan.handovers:
            key = f"handover|{handover.donor}|{handover.receiver}"
            if key not in self._pending:
                inp.seq += 1
                self._pending[key] = handover
                self._spawn(self._member(inp, inp.seq, key, handover))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _member(
        self,
        inp: CoordinatorInput,
        seq: int,
        key: str,
        spec: ms.ClusterMoveSpec | ms.HandoverSpec,
    ) -> None:
        kind = "cluster-move" if isinstance(spec, ms.ClusterMoveSpec) else "handover"
        try:
            if isinstance(spec, ms.ClusterMoveSpec):
                result = await workflow.execute_child_workflow(
                    ClusterMoveWorkflow.run,
                    ms.ClusterMoveInput(inp.term, seq, spec),
                    id=f"{COORDINATOR_ID}/{inp.term}/{seq}/move/{spec.cluster_id}",
                    parent_close_policy=ParentClosePolicy.ABANDON,
                )
            else:
                result = await workflow.execute_child_workflow(
                    HandoverWorkflow.run,
                    ms.HandoverInput(inp.term, seq, spec),
                    id=f"{COORDINATOR_ID}/{inp.term}/{seq}/handover/{spec.donor}-{spec.receiver}",
                    parent_close_policy=ParentClosePolicy.ABANDON,
                )
            outcome = {"seq": seq, "kind": kind, "status": result.status, "outcome": result.outcome}
        except ChildWorkflowError as err:
            outcome = {"seq": seq, "kind": kind, "status": "failed", "outcome": str(err)}
        self._recent.append(outcome)
        self._pending.pop(key, None)

    def _answered_receivers(self, inp: CoordinatorInput) -> set[str]:
        """Shards a shortfall answer is moving quota or machines to, or just has.

        A rebalance names no cluster; the cooldown holds the answer keys
        (``answer_key``) of the transfers that ended.
        """
        specs = self._pending.values()
        moving = {s.receiver for s in specs if isinstance(s, TransferSpec) and s.cluster_id}
        keys = (key.split("|", 2) for key in inp.cooldown)
        cooling = {receiver for receiver, cluster, _need in keys if cluster}
        return moving | cooling

    def _in_flight(self, key: str) -> bool:
        """True while an instruction for ``key`` (receiver|cluster|need) is running."""
        return key in self._pending or any(k.startswith(f"{key}#") for k in self._pending)

    async def _transfer(
        self, inp: CoordinatorInput, seq: int, spec: TransferSpec, key: str
    ) -> None:
        try:
            result = await workflow.execute_child_workflow(
                TransferWorkflow.run,
                TransferInput(inp.term, seq, spec),
                id=f"{COORDINATOR_ID}/{inp.term}/{seq}/{spec.kind}",
                parent_close_policy=ParentClosePolicy.ABANDON,
            )
            outcome = {
                "seq": seq,
                "kind": spec.kind,
                "status": result.status,
                "outcome": result.outcome,
            }
        except ChildWorkflowError as err:
            outcome = {"seq": seq, "kind": spec.kind, "status": "failed", "outcome": str(err)}
        self._recent.append(outcome)
        # Give the receiver a couple of rounds to report fresh numbers first, and
        # answer it again only from a cycle that ran after this answer ended.
        inp.cooldown[key] = workflow.now().timestamp() + COOLDOWN_REPORT_INTERVALS * inp.interval_s
        if workflow.patched(FRESH_CYCLE_PATCH):
            inp.answered[key] = workflow.now().timestamp()
        self._pending.pop(f"{key}#{seq}", None)
        self._arriving.pop(f"{key}#{seq}", None)


def _arriving(spec: TransferSpec, donor: ShardReport | None) -> IdleOffer | None:
    """What a transfer moves, as an offer to its receiver; None when nothing waits for it.

    An idle transfer's machines; and the unclaimed slots of a quota transfer
    that completes a gang's rack beside idle machines (ADR 0173), so the gang
    waits for the whole rack rather than for the idle machines alone. Their
    labels and allocatable are those of the donor's reported profile
    (provider, instance type, zone, capacity type and rack) they come from.
    """
    idle = spec.kind == TransferKind.IDLE
    slots = spec.kind == TransferKind.SPECULATIVE and bool(spec.domain and spec.cluster_id)
    if not (idle or slots) or donor is None:
        return None
    for p in donor.profiles:
        if (p.provider, p.instance_type, p.zone, p.capacity_type) == (
            spec.provider,
            spec.instance_type,
            spec.zone,
            spec.capacity_type,
        ) and p.labels.get(DOMAIN_LABEL, "") == spec.domain:
            count, speculative = (spec.count, 0) if idle else (0, spec.count)
            return IdleOffer(spec.donor, dict(p.labels), dict(p.allocatable), count, speculative)
    return None


__all__ = [
    "ADOPT_MACHINES",
    "COORDINATOR_ID",
    "COORDINATOR_QUEUE",
    "DISTRIBUTE",
    "FINISH_INSTRUCTION",
    "FLEET_IDLE",
    "FLEET_IDLE_PATCH",
    "PLAN",
    "PLAN_DECOMMISSION",
    "PREPARE_PREEMPTION",
    "RECORD_INSTRUCTION",
    "RELEASE_MACHINES",
    "RETIRE_MACHINES",
    "AdoptInput",
    "AdoptResult",
    "Adoption",
    "CoordinatorInput",
    "CoordinatorWorkflow",
    "DecommissionInput",
    "DecommissionPlan",
    "DecommissionResult",
    "DecommissionWorkflow",
    "DistributeInput",
    "DistributeResult",
    "DrainStart",
    "FleetIdleQuery",
    "FleetIdleReply",
    "IdleOffer",
    "InstructionOutcome",
    "InstructionRecord",
    "PlanInput",
    "PlanResult",
    "PreemptionPlan",
    "ProfileReport",
    "ReleaseInput",
    "ReleaseResult",
    "RetireInput",
    "RetireResult",
    "ShardReport",
    "ShortfallReport",
    "TransferInput",
    "TransferKind",
    "TransferResult",
    "TransferSpec",
    "TransferWorkflow",
]
