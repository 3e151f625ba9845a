"""The coordinator reporter: what this shard tells the coordinator every report interval.

    engine machines (not in flight, not promised) -> ProfileReport per (provider,
        instance type, zone, capacity type): idle, speculative, configured by priority
        (bigfleet.shard.supply, the rule the simulator's coordinator reads too)
    blocked preemption drains + the engine's shortfalls -> up to 100 ShortfallReports
        (with the need's requirements and min_unit, from the needs in force)
    -> signal CoordinatorWorkflow.report
    -> query CoordinatorWorkflow.fleet_idle -> engine.set_fleet_idle: the other shards'
       idle machines as the coordinator's last round saw them (ADR 0129)
    and between two intervals, after a cycle that found a shortfall not yet reported
    or more idle machines than last reported, or none yet since start
    (shard_engine.report_news; ADR 0184), the same report at once, no sooner than
    early_gap_s after the last; and every cycle interval the fleet_idle query alone
    (the shard process's offers loop), so a round planned on another shard's report
    reaches this one within a cycle
    count budgets: (cap, machines in scope, draining) here -> update budget-shares
        -> this shard's share of each, the engine's cap for it until the next answer

When the coordinator is not running the shard carries on alone. It waits
for no other shard's idle machine then: its offers are cleared when the
coordinator cannot be reached, does not answer the query, or last planned
more than ``stale_after_s`` ago (nobody would move the machine). The one
thing it cannot do alone is drain under a count budget, whose use by the
rest of the fleet it cannot know:
a shard without a fresh answer (never heard, or none for ``stale_after_s``)
takes the safe default, the smaller of its last share and
``floor(cap / shards last heard of)``; one that has never heard takes 0, so
it starts no drain under a count budget until the coordinator has dealt it
a share (ADR 0140).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from bigfleet.aio import within
from bigfleet.shard.convert import requirement_specs
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.state import ShardState
from bigfleet.shard.supply import Held, profile_supply
from bigfleet.shard.terms import CoordinatorTerms
from shard_engine.coordination import RemoteIdle, RemoteWant, requirements_from
from shard_engine.engine import ShardEngine
from shard_engine.model import Shortfall
from shard_engine.report_news import ReportNews
from shard_engine.shortfalls import reported_requirements
from workflows import coordinator as co
from workflows import coordinator_contracts as cc

log = logging.getLogger(__name__)

__all__ = ["MAX_REPORTED_SHORTFALLS", "CoordinatorReporter", "remote_idle"]

MAX_REPORTED_SHORTFALLS = 100


class CoordinatorReporter:
    """Builds and sends this shard's periodic report to the coordinator."""

    def __init__(
        self,
        temporal: Client,
        *,
        lease: LeaseKeeper,
        state: ShardState[ShardEngine],
        terms: CoordinatorTerms,
        clock: Callable[[], float],
        stale_after_s: float = 90.0,
        update_timeout_s: float = 5.0,
        early_gap_s: float = 10.0,
    ) -> None:
        self._temporal = temporal
        self._lease = lease
        self._state = state
        self._terms = terms
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._update_timeout_s = update_timeout_s
        # The coordinator's last answer about count budgets, and when it came.
        self._answer: cc.BudgetShareAnswer | None = None
        self._answered_at = 0.0
        # What the last report told the coordinator (ADR 0184).
        self.news = ReportNews(gap_s=early_gap_s)
        if any(b.count is not None for b in state.engine.budgets):
            state.engine.budget_shares = self.fallback_shares()

    def shortfalls(self) -> list[Shortfall]:
        """Preemption drains blocked past their grace first, then the engine's shortfalls."""

        def allocatable(machine_id: str) -> Mapping[str, float]:
            record = self._state.engine.machine(machine_id)
            return record.allocatable if record is not None else {}

        blocked = self._state.lifecycle.shortfalls(now=self._clock(), deficit_of=allocatable)
        return [*blocked, *self._state.engine.shortfalls()]

    def news_due(self) -> bool:
        """True if the coordinator should hear from this shard now, not at the interval."""
        return self.news.due(
            self.shortfalls(), self._state.engine.free_counters()[1], self._clock()
        )

    def build_report(self) -> co.ShardReport:
        """Summary + up to 100 shortfalls for the coordinator."""
        return self._build(self.shortfalls())

    def _build(self, lacking: list[Shortfall]) -> co.ShardReport:
        engine = self._state.engine
        busy = self._state.busy()
        records = list(engine.machines())
        serving = self._state.priorities()  # what each serves now (ADR 0177)
        supply = profile_supply(
            Held(
                sample=r,
                state=r.state,
                bound=bool(r.cluster),
                priority=serving.get(r.id, 0),
                busy=r.id in busy,
            )
            for r in records
        )
        profiles = [
            co.ProfileReport(
                provider=p.provider,
                instance_type=p.instance_type,
                zone=p.zone,
                capacity_type=p.capacity_type,
                labels=dict(p.labels),
                allocatable=dict(p.allocatable),
                idle=p.idle,
                speculative=p.speculative,
                configured_by_priority={str(k): v for k, v in p.configured_by_priority.items()},
            )
            for p in supply
        ]
        shortfalls = []
        for sf in lacking[:MAX_REPORTED_SHORTFALLS]:
            need = self._state.need(sf.cluster_id, sf.need_key)
            shortfalls.append(
                co.ShortfallReport(
                    cluster_id=sf.cluster_id,
                    need_key=sf.need_key,
                    priority=sf.priority,
                    deficit=dict(sf.deficit),
                    requirements=(
                        requirement_specs(reported_requirements(need.requirements, sf.domain))
                        if need
                        else []
                    ),
                    min_unit=dict(need.min_unit) if need else {},
                    age_cycles=sf.age_cycles,
                    escalated=sf.escalated,
                    reason=sf.reason,
                )
            )
        return co.ShardReport(
            shard_id=self._lease.shard_id,
            epoch=self._lease.epoch,
            sent_at=self._clock(),
            total_machines=len(records),
            profiles=profiles,
            shortfalls=shortfalls,
            highest_term_seen=self._terms.highest,
            cycle_at=engine.last_cycle_at or 0.0,
        )

    async def send_report(self) -> bool:
        """Signal the coordinator; False when it is not running (shards carry on alone).

        Then take its idle offers (:meth:`read_fleet_idle`) and ask for this
        shard's shares of the count budgets, if there are any.
        """
        lacking, idle = self.shortfalls(), self._state.engine.free_counters()[1]
        report = self._build(lacking)
        # While this report is on its way, a cycle does not ask for another.
        self.news.attempted(report.sent_at)
        try:
            handle = self._temporal.get_workflow_handle(co.COORDINATOR_ID)
            await handle.signal(co.CoordinatorWorkflow.report, report)
        except RPCError as err:
            log.debug("coordinator unreachable (%s); carrying on alone", err)
            self._state.engine.set_fleet_idle(())
            self._apply_shares()
            return False
        # Past the first 100 a shortfall is not carried, and an early report would
        # not carry it either: it counts as told.
        self.news.sent(lacking, idle, report.sent_at)
        await self.read_fleet_idle()
        await self.ask_budget_shares()
        return True

    async def read_fleet_idle(self) -> tuple[RemoteIdle, ...]:
        """Hand the engine what the other shards hold idle; the offers it was given.

        The coordinator's last round's offers for this shard (ADR 0129). None
        when the coordinator does not answer the query (unreachable, or one
        from before the query existed), or when its last round is older than
        ``stale_after_s``: a need must not wait for a transfer nobody plans.
        """
        offers: tuple[RemoteIdle, ...] = ()
        wants: tuple[RemoteWant, ...] = ()
        try:
            handle = self._temporal.get_workflow_handle(co.COORDINATOR_ID)
            reply = await within(
                handle.query(
                    co.CoordinatorWorkflow.fleet_idle, cc.FleetIdleQuery(self._lease.shard_id)
                ),
                self._update_timeout_s,
            )
        except (RPCError, WorkflowQueryFailedError, TimeoutError) as err:
            log.debug("no idle offers from the coordinator (%s); buying as a lone shard", err)
        else:
            age = self._clock() - reply.planned_at
            if reply.seq > 0 and age <= self._stale_after_s:
                offers, wants = remote_idle(reply), remote_wants(reply)
            elif reply.seq > 0:
                log.info("idle offers %.0f s old ignored: the coordinator is not planning", age)
        self._state.engine.set_fleet_idle(offers, wants)
        return offers

    def budget_ask(self) -> cc.BudgetShareAsk:
        """This shard's census of its count budgets, with the share each drains under now."""
        engine = self._state.engine
        shares = engine.budget_shares
        return cc.BudgetShareAsk(
            shard_id=self._lease.shard_id,
            epoch=self._lease.epoch,
            counts=[
                cc.BudgetCount(
                    b.name,
                    b.count or 0,
                    in_scope,
                    draining,
                    held,
                    # No share applied yet: the engine holds the budget's own count.
                    in_force=(b.count or 0) if shares is None else shares.get(b.name, 0),
                )
                for b, in_scope, draining, held in engine.budget_census()
            ],
        )

    async def ask_budget_shares(self) -> cc.BudgetShareAnswer | None:
        """Ask the coordinator for this shard's shares; apply the answer or the fallback."""
        ask = self.budget_ask()
        if not ask.counts:
            return None
        answer: cc.BudgetShareAnswer | None = None
        try:
            handle = self._temporal.get_workflow_handle(co.COORDINATOR_ID)
            answer = await within(
                handle.execute_update(co.CoordinatorWorkflow.budget_shares, ask),
                self._update_timeout_s,
            )
        except Exception as err:  # RPCError, a rejected update, a coordinator mid-restart
            log.info("no budget shares from the coordinator (%s); using the fallback", err)
        if answer is not None:
            refused = self._terms.check(answer.term)
            if refused:
                log.warning("budget shares ignored: %s", refused)
                answer = None
            else:
                self._answer, self._answered_at = answer, self._clock()
        self._apply_shares()
        return answer

    def fallback_shares(self) -> dict[str, int]:
        """The shares without a fresh answer (see the module docstring)."""
        last = self._answer
        shares: dict[str, int] = {}
        for budget in self._state.engine.budgets:
            if budget.count is None:
                continue
            if last is None or last.shards <= 0:
                shares[budget.name] = 0
                continue
            even = budget.count // last.shards
            shares[budget.name] = min(even, last.shares.get(budget.name, even))
        return shares

    def _apply_shares(self) -> None:
        engine = self._state.engine
        if not any(b.count is not None for b in engine.budgets):
            engine.budget_shares = None
            return
        fresh = self._answer is not None and (
            self._clock() - self._answered_at <= self._stale_after_s
        )
        if fresh and self._answer is not None:
            engine.budget_shares = dict(self._answer.shares)
        else:
            engine.budget_shares = self.fallback_shares()


def remote_idle(reply: cc.FleetIdleReply) -> tuple[RemoteIdle, ...]:
    """The coordinator's offers as the engine takes them (empty ones dropped, fields copied)."""
    return tuple(
        RemoteIdle(
            shard_id=o.shard_id,
            labels=dict(o.labels),
            allocatable=dict(o.allocatable),
            count=o.count,
            speculative=o.speculative,
        )
        for o in reply.offers
        if o.count > 0 or o.speculative > 0
    )


def remote_wants(reply: cc.FleetIdleReply) -> tuple[RemoteWant, ...]:
    """The other shards' shortfalls as the engine takes them (ADR 0176).

    A want whose requirement operator this shard does not know (a newer
    coordinator) is left out: the shard cannot tell what it could use.
    """
    wants: list[RemoteWant] = []
    for w in reply.wants:
        sf = w.shortfall
        try:
            requirements = requirements_from(sf.requirements)
        except ValueError:
            log.debug("want of shard %s with an unknown operator left out", w.shard_id)
            continue
        wants.append(
            RemoteWant(
                shard_id=w.shard_id,
                priority=sf.priority,
                requirements=requirements,
                deficit=dict(sf.deficit),
                min_unit=dict(sf.min_unit),
                age_cycles=sf.age_cycles,
            )
        )
    return tuple(wants)
