"""The shard engine façade: the one object the shard process talks to.

It owns the inventory and the needs table, and wires the cycle's pipeline in
one place (:meth:`ShardEngine.cycle`). Everything it decides comes back as a
:class:`~shard_engine.model.Plan`; carrying the plan out, and reporting each
machine's outcome through :meth:`ShardEngine.settle`, is the caller's job.

In-flight contract. Every machine named in an action of a committed
(non-dry-run, unpaused) cycle is *in flight* until ``settle`` is called for
it. In-flight machines are never picked again by any phase; machines in
flight toward a cluster count toward that cluster's "have". A preemption
that settles with the machine idle leaves it *promised* to the preemptor,
and the next cycle assigns it there before anything else.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, repeat
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from shard_engine import (
    budgets,
    health,
    interruptions,
    phase1,
    preemption,
    reclaim,
    shortfalls,
    verdicts,
)
from shard_engine.actions import ActionKind, ActionLog, ActionTable
from shard_engine.binding import Bindings
from shard_engine.catalog import Profile, ProfileCatalog
from shard_engine.clusters import NO_CLUSTER, ClusterIndex
from shard_engine.config import EngineConfig, VictimWeights
from shard_engine.demand_history import DemandHistory
from shard_engine.fleet_idle import FleetIdle, RemoteIdle, RemoteWant
from shard_engine.inventory import (
    FLAG_IN_FLIGHT,
    FLAG_PROMISED,
    InvalidMachine,
    Inventory,
    validate_record,
)
from shard_engine.model import (
    MachineRecord,
    MachineState,
    Need,
    Plan,
    Rollup,
    Shortfall,
)
from shard_engine.needs import (
    Demand,
    NeedsTable,
    RollupOutcome,
    RollupRejected,
    ValidatedRollup,
)
from shard_engine.pending import REASON_PAUSED
from shard_engine.pools import TIER_BOUND, TIER_IDLE, TIER_SPECULATIVE, PoolKey
from shard_engine.requirements import RELATIVE_TOLERANCE, RequirementMasks
from shard_engine.worksheet import ClusterMemo, Worksheet

__all__ = [
    "CycleStats",
    "EngineConfig",
    "EngineSummary",
    "InvalidMachine",
    "RollupOutcome",
    "RollupRejected",
    "ShardEngine",
    "VictimWeights",
]


@dataclass(frozen=True, slots=True)
class EngineSummary:
    """A snapshot of the engine for reports and the inspection CLI."""

    machines_by_state: Mapping[MachineState, int]
    clusters: int
    needs: int
    in_flight: int
    shortfalls: int
    promised: int = 0
    quarantined_clusters: int = 0
    paused: bool = False
    machines: int = 0
    profiles: int = 0


@dataclass(frozen=True, slots=True)
class CycleStats:
    """How the last cycle went, for metrics: time per stage and reclaims held back.

    ``phase_seconds`` is empty unless the engine was given a ``stopwatch``
    (the engine never reads a clock of its own). ``reclaims_capped`` counts
    excess machines the per-cluster rate cap left for a later cycle.
    """

    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    reclaims_capped: int = 0


@dataclass(slots=True)
class _Flight:
    """Why a machine is in flight: the action kind, where it goes, since when."""

    kind: ActionKind
    target: int
    started: float
    source: int = NO_CLUSTER
    need_key: str = ""
    priority: int = 0


@dataclass(slots=True)
class _Promise:
    """A preempted machine reserved for its preemptor's need."""

    cluster: int
    need_key: str
    priority: int


@dataclass(slots=True)
class _Memory:
    """What one cycle leaves for the next: shortfall ages, explanations, estimates."""

    ages: dict[tuple[int, str], int] = field(default_factory=dict)
    why_not: dict[int, dict[str, str]] = field(default_factory=dict)
    shortfalls: tuple[Shortfall, ...] = ()
    drain_seconds: dict[int, float] = field(default_factory=dict)


def _flight_target(kind: int, cluster: int) -> int:
    """Where a machine of an action (an ``ActionKind`` value) is headed while in flight.

    That is whose "have" it counts for: assigned, provisioned and preempted
    machines count for the cluster they go to; a verified machine stays its
    cluster's; a reclaimed or released machine counts for no one.
    """
    if kind == ActionKind.RECLAIM or kind == ActionKind.RELEASE or kind == ActionKind.INTERRUPT:
        return NO_CLUSTER
    return cluster


_PLACING = frozenset(
    {int(ActionKind.ASSIGN_IDLE), int(ActionKind.PROVISION), int(ActionKind.PREEMPT)}
)
"""Kinds that place a machine for a need: committing them binds it there (``binding``)."""

_KIND_OF: dict[int, ActionKind] = {int(kind): kind for kind in ActionKind}
"""``ActionKind`` members by value (a dictionary lookup is cheaper than the enum call)."""


# How a restarted shard's still-running workflows are re-marked (see ``claim``).
_CLAIM_KINDS = {
    "provision": ActionKind.PROVISION,
    "configure": ActionKind.ASSIGN_IDLE,
    "drain": ActionKind.RECLAIM,
    "delete": ActionKind.RELEASE,
    "verify": ActionKind.VERIFY,
    "recover": ActionKind.RECLAIM,
}


class ShardEngine:
    """In-memory decision engine of one shard (see module docstring)."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        stopwatch: Callable[[], float] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        # Measures the cycle's stages when given (time.perf_counter); see ``stats``.
        self._stopwatch = stopwatch
        self.stats = CycleStats()
        self.paused = False
        # Disruption budgets in force (set by the shard process) and what the
        # last cycle held back under them or under do-not-disrupt (budgets.py).
        self.budgets: tuple[budgets.Budget, ...] = ()
        self.holds: tuple[budgets.Hold, ...] = ()
        # This shard's shares of the fleet-wide count budgets, by name, as the
        # coordinator dealt them (None: each count holds per shard; ADR 0140).
        self.budget_shares: Mapping[str, int] | None = None
        self._catalog = ProfileCatalog()
        self._clusters = ClusterIndex()
        self._masks = RequirementMasks(self._catalog)
        self._inventory = Inventory(self._catalog, self._clusters)
        self._table = NeedsTable(
            clusters=self._clusters,
            catalog=self._catalog,
            masks=self._masks,
            quarantine=self.config.quarantine,
        )
        if self.config.expected_machines > 0:
            self._inventory.reserve(self.config.expected_machines)
        self._flights: dict[int, _Flight] = {}
        self._promises: dict[int, _Promise] = {}
        self._suspects: set[int] = set()
        self._memory = _Memory()
        self._memo = ClusterMemo()
        self._recent_draw = np.full(0, -np.inf)
        self._reclaim = reclaim.ReclaimMemory(DemandHistory(self.config.reclaim_window_seconds))
        self._arrivals = verdicts.Arrivals()
        self._last: verdicts.LastCycle | None = None
        self._cycles = 0
        self._fleet_idle = FleetIdle(self.config.fleet_idle_wait_seconds)
        self._bindings = Bindings(on_change=self._inventory.touch_bound, holds=self._holds)

    def _holds(
        self, rows: npt.NDArray[np.int64], clusters: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """Per row, whether it may count toward ``clusters[i]`` now (``Bindings.holds``).

        A superset of what a bound count reads (the cluster's bound pools and
        what is in flight or promised toward it): the machine's cluster, the
        cluster its supply counts for, and its flight's or promise's target.
        """
        inventory = self._inventory
        held: npt.NDArray[np.bool_] = inventory.cluster[rows] == clusters
        todo = (~held).nonzero()[0]
        if not len(todo):
            return held
        # A machine in flight or promised counts for its target (``Inventory.owner``):
        # read it straight, without working out where a settled machine counts.
        moving = (inventory.flags[rows[todo]] & (FLAG_IN_FLIGHT | FLAG_PROMISED)) != 0
        flights, promises = self._flights, self._promises
        pairs = zip(rows[todo].tolist(), clusters[todo].tolist(), strict=True)
        for k, (row, cluster), flagged in zip(todo.tolist(), pairs, moving.tolist(), strict=True):
            flight = flights.get(row)
            promise = promises.get(row)
            owner = inventory.target(row) if flagged else inventory.owner(row)
            held[k] = (
                owner == cluster
                or (flight is not None and flight.target == cluster)
                or (promise is not None and promise.cluster == cluster)
            )
        return held

    def _holds_placed(
        self, rows: npt.NDArray[np.int64], clusters: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """:meth:`_holds` for machines this commit placed, asked about their old clusters.

        They are in flight toward the cluster they were just placed for, as
        their flights and targets say, and ``Bindings.bind_all`` asks only
        about clusters no machine of the plan was placed for, so neither
        their target nor their flight counts them there. What still can: the
        cluster a machine sits in until it leaves (a preempted machine
        drains in its victim's), and a promise not yet dropped (the commit
        drops it after binding).
        """
        held: npt.NDArray[np.bool_] = self._inventory.cluster[rows] == clusters
        promises = self._promises
        if promises:
            for k, (row, cluster) in enumerate(zip(rows.tolist(), clusters.tolist(), strict=True)):
                promise = promises.get(row)
                if promise is not None and promise.cluster == cluster:
                    held[k] = True
        return held

    # -- observations ------------------------------------------------------------
    def set_fleet_idle(
        self, offers: Sequence[RemoteIdle], wants: Sequence[RemoteWant] = ()
    ) -> None:
        """The idle machines the *other* shards hold, and what they lack, as last seen.

        Replaces the previous sets. A need the offers cover waits for them
        (``fleet_idle``, ADR 0129) rather than creating or claiming capacity,
        for at most ``fleet_idle_wait_seconds``. A need leaves this shard's
        idle machines to an older or more important want that could use them
        (ADR 0176), for at most as long. Offers and wants come from
        ``coordination.idle_offers`` and ``coordination.fleet_wants`` every
        coordinator round: production's shard reads its own after each report
        (``CoordinatorReporter``), the simulator's coordinator round posts
        them. Until the first call (or after an empty one) the shard buys as a
        lone shard would.
        """
        self._fleet_idle.update(offers, wants)

    @property
    def fleet_wants(self) -> tuple[RemoteWant, ...]:
        """The other shards' shortfalls as last set (:meth:`set_fleet_idle`)."""
        return self._fleet_idle.wants

    @property
    def fleet_idle_offers(self) -> tuple[RemoteIdle, ...]:
        """The other shards' idle machines as last set (:meth:`set_fleet_idle`)."""
        return self._fleet_idle.offers

    def upsert_machine(self, record: MachineRecord, *, now: float, need_key: str = "") -> None:
        """Record a new or changed observation of a machine.

        ``need_key`` is the need of its cluster the machine serves, when its
        provider echoes it (the attribution a configure stamped): the
        machine is bound to that need (``binding``), as it was before a
        restart. Raises :class:`InvalidMachine` (a ``ValueError`` naming the
        field) for a NaN or negative price, probability or allocatable;
        nothing is changed then. A machine in flight stays in flight.
        """
        row = self._upsert(record, now=now)
        if need_key and record.cluster and record.state.has_host:
            self._bindings.bind([row], self._clusters.index_of(record.cluster), need_key)

    def placed_for(self, machine_id: str) -> str:
        """The key of the need the machine is bound to in its cluster ("" for none)."""
        row = self._inventory.row(machine_id)
        bound = None if row is None else self._bindings.need_of(row)
        return "" if bound is None else bound[1]

    def _upsert(self, record: MachineRecord, *, now: float) -> int:
        """The inventory's upsert; a machine new to its row starts bound to nothing."""
        fresh = self._inventory.row(record.id) is None
        row = self._inventory.upsert(record, now=now)
        if fresh:
            self._bindings.unbind([row])
        return row

    def remove_machine(self, machine_id: str) -> None:
        """Forget a machine (the provider no longer reports it)."""
        row = self._inventory.row(machine_id)
        if row is None:
            return
        self._forget(row)

    def _forget(self, row: int) -> None:
        self._flights.pop(row, None)
        self._promises.pop(row, None)
        self._suspects.discard(row)
        self._bindings.unbind([row])
        self._inventory.remove(row)

    def validate(self, rollup: Rollup, *, now: float) -> ValidatedRollup:
        """Judge a roll-up by the engine's rules and clock-skew bound, reusing its cluster's last.

        For callers that hold no validation cache of their own (the
        simulator, benches, tests); a shard process validates on its Session
        port against the cluster's previous roll-up there. Raises
        :class:`RollupRejected` naming the field.
        """
        return ValidatedRollup.check(
            rollup,
            self._table.accepted(rollup.cluster_id) if isinstance(rollup.cluster_id, str) else None,
            now=now,
            max_skew_seconds=self.config.rollup_max_skew_seconds,
        )

    def apply_rollup(self, rollup: ValidatedRollup, *, now: float) -> RollupOutcome:
        """Replace a cluster's needs with a validated roll-up's (see ``needs``).

        Returns ``applied``, ``stale`` (older than the newest seen) or
        ``quarantined`` (suspicious drop, waiting for confirmation). Only a
        :class:`ValidatedRollup` is accepted: it was judged where it entered
        (the Session port in a shard process, :meth:`validate` for everyone
        else), and nothing is judged here — not the rules, not the clock —
        so there is one validation path and one cache (ADR 0145). A
        :class:`RollupRejected` therefore comes from :meth:`validate`, never
        from here. Raises ``TypeError`` naming ``rollup`` for anything else,
        a plain :class:`Rollup` included, because applying an unjudged
        roll-up silently would let a caller skip the clock-skew bound.
        """
        if not isinstance(rollup, ValidatedRollup):
            raise TypeError(
                f"apply_rollup: rollup must be a ValidatedRollup (from ShardEngine.validate or "
                f"ValidatedRollup.check), got {type(rollup).__name__}"
            )
        outcome, entry = self._table.apply(rollup)
        if entry is not None:
            demand = self._table.demand(entry)  # compile now, on ingestion, not in the cycle
            self._reclaim.history.observe(demand, now=now)
            self._arrivals.observe(demand, now=now)
            health.observe_rollup(
                inventory=self._inventory,
                cluster=entry.index,
                reported=entry.reported_nodes,
                threshold=self.config.health_miss_threshold,
                suspects=self._suspects,
            )
            self._table.retain_masks()
        return outcome

    def forget_cluster(self, cluster_id: str) -> bool:
        """Stop planning for a cluster that is leaving this shard. True if it had needs.

        Its needs, shortfall ages and explanations go; its machines stay
        until the caller removes them. Afterwards its configured machines are
        neither reclaimed nor preemption victims (both require an applied
        roll-up), and a machine promised to it is released at the next cycle.
        A later roll-up of the same cluster starts afresh.
        """
        index = self._clusters.find(cluster_id)
        if index is None:
            return False
        forgot = self._table.forget(index)
        self._reclaim.forget(index)
        self._arrivals.forget(index)
        self._memory.ages = {k: v for k, v in self._memory.ages.items() if k[0] != index}
        self._memory.why_not.pop(index, None)
        return forgot

    # -- the cycle -------------------------------------------------------------------
    def cycle(self, *, now: float, dry_run: bool = False) -> Plan:
        """Decide everything for this instant and return it as a plan.

        The pipeline, in order:

        0. promised machines go to their preemptors (AssignIdle), and
           machines their provider warned are about to be interrupted are
           drained and stop counting as supply (``interruptions``);
        1. Phase 1 covers deficits from idle, then speculative capacity;
        2. Phase 2 preempts strictly lower priorities for what is still short;
        3. Phase 3 reclaims excess configured machines and releases idle
           cloud machines whose hold expired;
        4. health verifies machines their cluster stopped reporting;
        5. shortfalls and why-not reasons are read off what is left.

        ``dry_run`` returns the plan and marks nothing. While ``paused`` the
        plan carries no actions (and nothing is marked), but shortfalls and
        reasons are still computed.
        """
        config = self.config
        inventory = self._inventory
        laps: dict[str, float] = {}
        clock = self._stopwatch
        mark = clock() if clock is not None else 0.0

        def lap(stage: str) -> None:
            nonlocal mark
            if clock is not None:
                at = clock()
                laps[stage] = at - mark
                mark = at

        self._catalog.ensure_dimensions()
        inventory.ensure_tables()
        sheet = Worksheet(
            inventory, now, self._memo, bindings=self._bindings, flying=self._flying_toward()
        )
        demands = [
            self._table.demand(entry)
            for entry in self._table.entries()
            if entry.applied_ns is not None
        ]
        self._catalog.ensure_dimensions()
        for demand in demands:
            demand.widen(len(self._catalog.dims))
        by_cluster: dict[int, Demand] = {d.cluster: d for d in demands}

        lap("prepare")
        self._assign_promises(sheet, by_cluster)
        lap("promises")
        interruptions.drain_warned(
            sheet=sheet,
            catalog=self._catalog,
            threshold=config.interruption_drain_threshold,
            grace_seconds=config.interruption_grace_seconds,
        )
        lap("interruptions")
        self._fleet_idle.begin_cycle()
        pending = phase1.assign(
            sheet=sheet,
            table=self._table,
            demands=demands,
            catalog=self._catalog,
            masks=self._masks,
            tolerance=RELATIVE_TOLERANCE,
            max_spread_steps=config.max_spread_steps,
            fleet=self._fleet_idle if self._fleet_idle.active else None,
            ages=self._memory.ages,
        )
        lap("phase1")
        pending = preemption.preempt(
            sheet=sheet,
            pending=pending,
            demands=by_cluster,
            catalog=self._catalog,
            config=config,
            drain_seconds=self._memory.drain_seconds,
            tolerance=RELATIVE_TOLERANCE,
            fleet=self._fleet_idle if self._fleet_idle.wants else None,
            ages=self._memory.ages,
        )
        lap("preemption")
        capped = reclaim.reclaim_excess(
            sheet=sheet,
            demands=demands,
            catalog=self._catalog,
            config=config,
            tolerance=RELATIVE_TOLERANCE,
            memory=self._reclaim,
            record=not dry_run,
            release=self._table.releases(),
        )
        lap("reclaim")
        sheet.log, self.holds = budgets.apply(
            sheet,
            budgets=self.budgets,
            demands=by_cluster,
            catalog=self._catalog,
            names=self._clusters.name,
            draining=self._draining() if self.budgets else {},
            shares=self.budget_shares,
        )
        lap("budgets")
        reclaim.release_idle(
            sheet=sheet,
            catalog=self._catalog,
            config=config,
            recent_draw=self._recent_draw_view(),
        )
        lap("release")
        health.verify(sheet=sheet, suspects=self._suspects, in_flight=set(self._flights))
        lap("health")
        ages = dict(self._memory.ages) if dry_run else self._memory.ages
        found, why_not = shortfalls.collect(
            pending=pending,
            inventory=inventory,
            names=self._catalog.dims.names,
            ages=ages,
            config=config,
        )
        lap("shortfalls")
        # A preemption a budget held back leaves its need short: say which budget.
        for hold in self.holds:
            if hold.for_need and hold.cause == "budget":
                target = self._clusters.find(hold.for_cluster)
                if target is not None:
                    why_not.setdefault(target, {})[hold.for_need] = hold.why_not()
        log = sheet.log
        if self.paused:
            for s, need in enumerate(log.need):
                if need >= 0 and log.cluster[s] >= 0:
                    why_not.setdefault(log.cluster[s], {}).setdefault(
                        log.needs[need][0], REASON_PAUSED
                    )
        if not dry_run:
            self._memory.why_not = why_not
            self._memory.shortfalls = found
            self._cycles += 1
            self._last = verdicts.LastCycle.capture(
                number=self._cycles,
                now=now,
                sheet=sheet,
                demands=demands,
                pending=pending,
                catalog=self._catalog,
            )
        if self.paused:
            table = ActionTable.empty()
        else:
            table = ActionTable.build(log, ids=inventory.ids.strings, names=self._clusters.names)
            if not dry_run:
                self._commit(sheet, now)
        lap("commit")
        if not dry_run:
            self.stats = CycleStats(phase_seconds=laps, reclaims_capped=capped)
        plan_why_not = {
            (self._clusters.name(c), key): reason
            for c, reasons in why_not.items()
            for key, reason in reasons.items()
        }
        return Plan(now=now, table=table, shortfalls=found, why_not=plan_why_not, dry_run=dry_run)

    def budget_census(self) -> list[tuple[budgets.Budget, int, int, int]]:
        """(count budget, machines in its scope, draining under it, held by it) here.

        What the shard reports so the coordinator can deal each count over
        the fleet; counted as the budgets stage counts (drains in flight),
        with the drains the last cycle held back under the budget.
        """
        held = Counter(h.budget for h in self.holds if h.cause == "budget")
        return [
            (budget, in_scope, draining, held.get(budget.name, 0))
            for budget, in_scope, draining in budgets.census(
                self.budgets,
                self._inventory,
                catalog=self._catalog,
                names=self._clusters.name,
                draining=self._draining(),
            )
        ]

    def _draining(self) -> dict[int, budgets.DrainReason]:
        """Rows in flight for a drain, and the budget reason each counts under."""
        drains: dict[int, budgets.DrainReason] = {}
        for row, flight in self._flights.items():
            reason = budgets.drain_reason(flight.kind)
            if reason is not None:
                drains[row] = reason
        return drains

    def _flying_toward(self) -> Callable[[int], Sequence[int]]:
        """Rows in flight or promised toward a cluster; indexed on first use in a cycle."""
        index: dict[int, list[int]] | None = None

        def toward(cluster: int) -> Sequence[int]:
            nonlocal index
            if index is None:
                index = {}
                for row, flight in self._flights.items():
                    if flight.target >= 0:
                        index.setdefault(flight.target, []).append(row)
                for row, promise in self._promises.items():
                    index.setdefault(promise.cluster, []).append(row)
            return index.get(cluster, ())

        return toward

    def _assign_promises(self, sheet: Worksheet, demands: Mapping[int, Demand]) -> None:
        """Stage 0: a machine freed by preemption goes to its preemptor before anyone else."""
        inventory = self._inventory
        for row, promise in list(self._promises.items()):
            demand = demands.get(promise.cluster)
            still_wanted = demand is not None and promise.need_key in demand.keys
            if int(inventory.state[row]) != int(MachineState.IDLE) or not still_wanted:
                sheet.dropped.append(row)
                continue
            assert demand is not None
            sheet.taken.add(row)
            need = demand.needs[demand.keys.index(promise.need_key)]
            sheet.log.add(
                ActionKind.ASSIGN_IDLE,
                np.array([row], dtype=np.int64),
                cluster=promise.cluster,
                need=(promise.need_key, need.requirements),
                priority=promise.priority,
            )

    def _commit(self, sheet: Worksheet, now: float) -> None:
        """Apply the plan: every machine named becomes in flight.

        Pools see exactly the plan's order. Promises dropped in stage 0 go
        back to their pools first; then segments follow in plan order. A
        run of segments taken from the tails of pools nothing else touched
        this commit leaves them at once (each pool shortens, every count
        moves in a few vectorised steps); any other segment — released or
        named machines picked from inside a pool, verifications, takes from
        a pool a dropped promise re-entered — goes machine by machine.
        Flights are recorded in plan order.
        """
        inventory = self._inventory
        inventory.ensure_tables()
        pools = inventory.pools
        promises = self._promises
        suspects = self._suspects
        flights = self._flights
        log = sheet.log
        disturbed: set[int] = set()
        for row in sheet.dropped:
            promises.pop(row, None)
            inventory.set_flags(row, flags=0, target=NO_CLUSTER)
            entered = inventory.pool_key(row)
            if entered is not None:
                found = pools.find(entered)
                if found is not None:
                    disturbed.add(found)
        targets = [_flight_target(k, c) for k, c in zip(log.kind, log.cluster, strict=True)]
        run: list[int] = []
        for s, kind in enumerate(log.kind):
            pool = log.pool[s]
            if log.tail[s] and pool not in disturbed:
                run.append(s)
                continue
            self._commit_taken(log, run, targets)
            run = []
            if pool >= 0:
                disturbed.add(pool)
            rows: list[int] = log.rows[s].tolist()
            if kind == ActionKind.VERIFY:
                for row in rows:
                    inventory.set_flags(row, flags=FLAG_IN_FLIGHT, target=log.cluster[s])
            else:
                inventory.mark_in_flight(rows, targets[s])
        self._commit_taken(log, run, targets)
        if not len(log):
            named: list[int] = []
        else:
            named = np.concatenate(log.rows).tolist()
            records: list[_Flight] = []
            for s, kind in enumerate(log.kind):
                action = _KIND_OF[kind]
                if action is ActionKind.PREEMPT:
                    source = log.source[s]
                elif (
                    action is ActionKind.RECLAIM
                    or action is ActionKind.VERIFY
                    or action is ActionKind.INTERRUPT
                ):
                    source = log.cluster[s]
                else:
                    source = NO_CLUSTER
                records.append(
                    _Flight(
                        kind=action,
                        target=targets[s],
                        started=now,
                        source=source,
                        need_key=log.need_key(s),
                        priority=log.priority[s],
                    )
                )
            # Every machine of a segment shares its record; rows in plan order.
            flights.update(
                zip(
                    named,
                    chain.from_iterable(
                        repeat(record, len(rows))
                        for record, rows in zip(records, log.rows, strict=True)
                    ),
                    strict=True,
                )
            )
        bindings = self._bindings
        bindings.bind_all(
            [
                (log.rows[s], targets[s], log.need_key(s))
                for s, kind in enumerate(log.kind)
                if kind in _PLACING
            ],
            holds=self._holds_placed,
        )
        for cluster, moves in sheet.rebinds.items():
            for was, now_key, profile, machines in moves:
                bound_pool = pools.find(PoolKey(TIER_BOUND, cluster, profile))
                # Every row moved is in this pool, so it is the one pool marked changed.
                if bound_pool is not None and bindings.rebind(
                    pools.members(bound_pool),
                    cluster=cluster,
                    was=was,
                    now=now_key,
                    machines=math.ceil(machines - 1e-9),
                    notify=False,
                ):
                    pools.touch(bound_pool)
        if promises:
            for row in named:
                promises.pop(row, None)
        if suspects:
            suspects.difference_update(named)
        for (cluster, key), domain in sheet.gang_choices.items():
            entry = self._table.entry(cluster)
            if entry is not None and key in entry.arrival:
                entry.gang_domain[key] = domain
                self._table.touch(entry)
        if sheet.drawn:
            recent = self._recent_draw_view()
            recent[list(sheet.drawn)] = now

    def _commit_taken(self, log: ActionLog, segments: list[int], targets: list[int]) -> None:
        """Commit the segments taken from intact pool tails in one vectorised step."""
        if not segments:
            return
        self._inventory.mark_taken_in_flight(
            rows=np.concatenate([log.rows[s] for s in segments]),
            pools=np.array([log.pool[s] for s in segments], dtype=np.int64),
            counts=np.array([len(log.rows[s]) for s in segments], dtype=np.int64),
            targets=np.array([targets[s] for s in segments], dtype=np.int64),
        )

    def _recent_draw_view(self) -> np.ndarray:
        total = len(self._catalog)
        if len(self._recent_draw) < total:
            grown = np.full(max(total, 2 * len(self._recent_draw), 64), -np.inf)
            grown[: len(self._recent_draw)] = self._recent_draw
            self._recent_draw = grown
        return self._recent_draw[:total]

    # -- outcomes ----------------------------------------------------------------------
    def settle(self, machine_id: str, record: MachineRecord | None, *, now: float) -> None:
        """The operation started for this machine finished (success or failure).

        ``record`` is the final observation, or None when the machine is
        gone. A preemption that ends with the machine idle leaves it promised
        to the preemptor; drain durations feed the victim's drain estimate.
        """
        if record is not None:
            record = validate_record(record)
        row = self._inventory.row(machine_id)
        if row is None:
            if record is not None:
                self._upsert(record, now=now)
            return
        flight = self._flights.pop(row, None)
        if record is None:
            self._forget(row)
            return
        self._inventory.upsert(record, now=now)
        if flight is None:
            return
        if flight.kind in (ActionKind.PREEMPT, ActionKind.RECLAIM) and flight.source >= 0:
            self._learn_drain(flight.source, now - flight.started)
        if flight.kind is ActionKind.PREEMPT and record.state == MachineState.IDLE:
            self._promises[row] = _Promise(flight.target, flight.need_key, flight.priority)
            self._inventory.set_flags(row, flags=FLAG_PROMISED, target=flight.target)
        else:
            self._inventory.set_flags(row, flags=0, target=NO_CLUSTER)
        if flight.kind is ActionKind.VERIFY:
            self._inventory.set_missed(row, 0)

    def claim(
        self,
        machine_id: str,
        *,
        operation: str,
        target_cluster: str,
        now: float,
        need_key: str = "",
        priority: int = 0,
    ) -> bool:
        """Mark a machine in flight for an operation started outside this cycle.

        A restarted shard calls this for every machine of a workflow that is
        still running, so its rebuilt engine counts the machine toward the
        target cluster (no double provisioning) and never plans on it again
        until ``settle``. ``operation`` is the workflow's operation
        (provision, configure, drain, delete, verify, recover). Returns
        False when the machine is unknown (it will be settled or observed).
        """
        row = self._inventory.row(machine_id)
        if row is None:
            return False
        kind = _CLAIM_KINDS.get(operation, ActionKind.RECLAIM)
        target = self._clusters.index_of(target_cluster) if target_cluster else NO_CLUSTER
        source = int(self._inventory.cluster[row])
        self._promises.pop(row, None)
        self._inventory.set_flags(row, flags=FLAG_IN_FLIGHT, target=target)
        if need_key and target >= 0:
            self._bindings.bind([row], target, need_key)
        self._flights[row] = _Flight(
            kind=kind,
            target=target,
            started=now,
            source=source,
            need_key=need_key,
            priority=priority,
        )
        return True

    def _learn_drain(self, cluster: int, seconds: float) -> None:
        """Exponentially smoothed drain time per cluster (the victim score's speed term)."""
        if seconds < 0:
            return
        alpha = self.config.drain_estimate_smoothing
        known = self._memory.drain_seconds.get(cluster)
        self._memory.drain_seconds[cluster] = (
            seconds if known is None else (1 - alpha) * known + alpha * seconds
        )

    # -- reading ---------------------------------------------------------------------------
    def machine(self, machine_id: str) -> MachineRecord | None:
        """The latest observation of a machine, or None when unknown."""
        row = self._inventory.row(machine_id)
        return None if row is None else self._inventory.record(row)

    def profile_of(self, machine_id: str) -> Profile | None:
        """A machine's shape (the interned profile, shared by alike machines), or None.

        Far cheaper than :meth:`machine` for a reader that needs only the shape
        and price (the decision log, thousands of machines a burst cycle).
        """
        row = self._inventory.row(machine_id)
        return None if row is None else self._catalog.profile(int(self._inventory.profile[row]))

    def machines(self) -> Iterator[MachineRecord]:
        """Every machine's latest observation."""
        return self._inventory.records()

    def serving_priorities(self) -> dict[str, int]:
        """The priority each machine bound to a cluster serves now, as Phase 2 values victims.

        The highest priority among its cluster's needs in force that its
        profile can serve; 0 when it can serve none of them (it is excess:
        the cluster's gang left, say). Machines bound to no cluster, or to
        one that never sent a roll-up, are left out: what they serve is not
        known here (the provider's echo of their workload says).
        """
        inventory = self._inventory
        live = np.asarray(inventory.ids.live_rows(), dtype=np.int64)
        rows = live[inventory.cluster[live] >= 0] if len(live) else live
        out: dict[str, int] = {}
        if not len(rows):
            return out
        clusters = inventory.cluster[rows].astype(np.int64)
        profiles = inventory.profile[rows].astype(np.int64)
        id_of = inventory.ids.id_of
        for cluster in np.unique(clusters).tolist():
            entry = self._table.entry(cluster)
            if entry is None:
                continue
            mine = clusters == cluster
            demand = self._table.demand(entry)
            held = profiles[mine]
            served = np.zeros(len(held), dtype=np.int64)
            if demand.needs:  # compiled against the whole catalog: every profile has a column
                need = demand.serving[held]
                serves = need >= 0
                served[serves] = demand.priority[need[serves]]
            for row, priority in zip(rows[mine].tolist(), served.tolist(), strict=True):
                out[id_of(row)] = priority
        return out

    def in_flight(self) -> Mapping[str, str]:
        """machine_id -> target cluster ("" for a drain to idle or a release)."""
        ids = self._inventory.ids
        return MappingProxyType(
            {ids.id_of(row): self._clusters.name(f.target) for row, f in self._flights.items()}
        )

    def in_flight_since(self) -> Mapping[str, float]:
        """machine_id -> when it was marked in flight (the ``now`` of that cycle or claim)."""
        ids = self._inventory.ids
        return MappingProxyType({ids.id_of(row): f.started for row, f in self._flights.items()})

    def promised(self) -> Mapping[str, str]:
        """machine_id -> the preemptor cluster an idle machine is reserved for."""
        ids = self._inventory.ids
        return MappingProxyType(
            {ids.id_of(row): self._clusters.name(p.cluster) for row, p in self._promises.items()}
        )

    def summary(self) -> EngineSummary:
        """Counts for reports: machines by state, clusters, needs, in flight, shortfalls."""
        counts = self._inventory.state_counts
        by_state = MappingProxyType(
            {state: int(counts[int(state)]) for state in MachineState if counts[int(state)]}
        )
        entries = self._table.entries()
        return EngineSummary(
            machines_by_state=by_state,
            clusters=len(entries),
            needs=self._table.count(),
            in_flight=len(self._flights),
            shortfalls=len(self._memory.shortfalls),
            promised=len(self._promises),
            quarantined_clusters=sum(1 for e in entries if e.quarantined),
            paused=self.paused,
            machines=len(self._inventory),
            profiles=len(self._catalog),
        )

    def shortfalls(self) -> tuple[Shortfall, ...]:
        """The shortfalls of the last committed cycle (for the coordinator report)."""
        return self._memory.shortfalls

    @property
    def last_cycle_at(self) -> float | None:
        """The instant (``now``) of the last committed cycle, whose shortfalls are kept."""
        return None if self._last is None else self._last.now

    def needs_of(self, cluster_id: str) -> tuple[Need, ...]:
        """The needs in force for a cluster, normalised, in cycle order (empty if none)."""
        index = self._clusters.find(cluster_id)
        entry = self._table.entry(index) if index is not None else None
        return entry.needs if entry is not None else ()

    def inspect_needs(self, cluster_id: str = "", *, limit: int = 0) -> verdicts.Inspection:
        """Every need's verdict from the last committed cycle (see ``verdicts``).

        ``cluster_id`` restricts the answer to one cluster; ``limit`` > 0 cuts
        the list (``total`` still counts every need). Raises ``ValueError``
        for a negative limit.
        """
        found = verdicts.inspect(
            last=self._last,
            cluster_id=cluster_id or None,
            limit=limit,
            inventory=self._inventory,
            table=self._table,
            catalog=self._catalog,
            reasons=self._memory.why_not,
            ages=self._memory.ages,
            arrivals=self._arrivals,
        )
        # A paused cycle plans what it would do but starts none of it (ADR 0142), and a
        # preemption a budget held back serves no one this cycle (ADR 0140): the need
        # counted those machines as coming, so it reads satisfied unless told here.
        withheld = {
            (self._clusters.name(c), key): reason
            for c, reasons in self._memory.why_not.items()
            for key, reason in reasons.items()
            if (self.paused and reason == REASON_PAUSED)
            or reason.startswith(budgets.HELD_PREEMPTION)
        }
        if not withheld:
            return found
        return replace(
            found,
            verdicts=tuple(
                replace(v, satisfied=False, detail=withheld[(v.cluster_id, v.need_key)])
                if (v.cluster_id, v.need_key) in withheld
                else v
                for v in found.verdicts
            ),
        )

    def why_not(self, cluster_id: str) -> Mapping[str, str]:
        """need_key -> why that need was not satisfied in the last committed cycle."""
        index = self._clusters.find(cluster_id)
        if index is None:
            return MappingProxyType({})
        return MappingProxyType(dict(self._memory.why_not.get(index, {})))

    def free_by_profile(self) -> list[tuple[Profile, int, int]]:
        """(profile, free idle, free speculative) for every profile the shard holds a machine of.

        Free: in no flight and promised to no one (what a phase may take).
        Read from the inventory's per-profile counters, so it costs the number
        of profiles, not of machines.
        """
        inventory = self._inventory
        inventory.ensure_tables()
        idle, speculative = inventory.free_idle, inventory.free_speculative
        return [
            (self._catalog.profile(int(i)), int(idle[i]), int(speculative[i]))
            for i in np.flatnonzero(inventory.members > 0)
        ]

    def free_counters(
        self,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Per profile index: machines the shard holds, free idle, free speculative (copies).

        What :meth:`free_by_profile` reads, as arrays, for a caller that asks
        often and wants to see what changed since it last asked.
        """
        inventory = self._inventory
        inventory.ensure_tables()
        return (
            inventory.members.copy(),
            inventory.free_idle.copy(),
            inventory.free_speculative.copy(),
        )

    def profile_at(self, index: int) -> Profile:
        """The interned profile of index ``index`` (as :meth:`free_counters` numbers them)."""
        return self._catalog.profile(index)

    def free_machines(
        self,
        state: MachineState,
        *,
        provider: str,
        instance_type: str,
        zone: str,
        capacity_type: int,
    ) -> list[MachineRecord]:
        """The free idle or speculative machines of one shape (in no flight, promised to none).

        Read from the free pools of the matching profiles, so it costs the
        number of profiles and of those machines, not of the shard's machines:
        what a donor chooses from (``bigfleet.shard.choices.donations``).
        """
        if state is MachineState.IDLE:
            tier = TIER_IDLE
        elif state is MachineState.SPECULATIVE:
            tier = TIER_SPECULATIVE
        else:
            raise ValueError(f"state: free machines are IDLE or SPECULATIVE, not {state.name}")
        inventory, pools = self._inventory, self._inventory.pools
        key = (provider, instance_type, zone, int(capacity_type))
        out: list[MachineRecord] = []
        for index in range(len(self._catalog)):
            shape = self._catalog.profile(index)
            if (shape.provider, shape.instance_type, shape.zone, int(shape.capacity_type)) != key:
                continue
            pool = pools.find(PoolKey(tier, NO_CLUSTER, index))
            if pool is not None:
                out += [inventory.record(int(row)) for row in pools.members(pool)]
        return out

    def drain_estimates(self) -> Mapping[str, float]:
        """cluster_id -> smoothed drain time learned from its settled drains (seconds)."""
        names = self._clusters.name
        return MappingProxyType({names(c): t for c, t in self._memory.drain_seconds.items()})
