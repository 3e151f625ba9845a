"""Phase 2: resolve priority inversions by preempting strictly lower priorities.

After Phase 1 some needs are still short and every free machine that could
serve them is gone. Machines configured for *other* clusters may be serving
lower-priority work; Phase 2 takes some of them, in a documented order, and
promises them to the preemptor:

1. **Victim groups.** Settled configured machines of one (cluster, profile)
   are interchangeable from every angle the engine can see, so victims are
   scored as groups. A group's priority is that of the highest-priority
   need of its cluster it can serve; a machine serving no need of its
   cluster is excess and has the lowest priority of all. Clusters that
   never sent a roll-up are never victims.
2. **Feasibility.** Only groups strictly below the preemptor's priority,
   of another cluster, matching the need's requirements and ``min_unit``.
   Never at equal priority.
3. **Score.** A bounded, monotone blend of four terms in [0, 1] — priority
   gap ``g/(g+G)``, drain speed ``1/(1+t/T)``, and ``1/(1+x/X)`` for the
   victim's interruption and reclamation penalties — so a zero penalty is
   the best case, not a division by zero. The weights move from
   priority-dominant to drain-speed-dominant as the shard saturates
   (see ``docs/adr/0004``). Among victims of *equal priority* the app class
   decides first: best-effort, then batch, then latency-sensitive.
4. **Take.** Best groups first, only as many machines as the residual
   deficit needs. Each victim gets a :class:`Preempt` with the grace its
   priority gap earns, counts toward the preemptor at once, and once
   drained is promised to it (``engine``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from shard_engine.actions import ActionKind
from shard_engine.catalog import ProfileCatalog
from shard_engine.config import EngineConfig, VictimWeights
from shard_engine.costs import drain_grace_seconds
from shard_engine.fleet_idle import FleetIdle
from shard_engine.linear import combine
from shard_engine.model import MachineState
from shard_engine.needs import Demand
from shard_engine.pending import PendingNeed
from shard_engine.phase1 import claims_now, idle_shapes
from shard_engine.pools import TIER_BOUND, TIER_IDLE, TIER_SPECULATIVE, PoolKey
from shard_engine.selection import cover_in_order, cover_with_spread, settle_deficit
from shard_engine.topology import SpreadState, choose_gang_domain, domain_codes
from shard_engine.worksheet import Worksheet

__all__ = [
    "EXCESS_PRIORITY",
    "VictimGroups",
    "blend_weights",
    "preempt",
    "saturation",
    "victim_order",
    "victim_scores",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

EXCESS_PRIORITY = -(2**31) - 1
"""Priority of a configured machine that serves no need of its cluster: below every need."""


VictimAttrs = tuple[IntArray, IntArray, IntArray, FloatArray, FloatArray, IntArray]
"""Per pool of one cluster: pool id, profile, priority, penalties, app-class rank."""


def _cluster_victims(sheet: Worksheet, demand: Demand) -> VictimAttrs | None:
    """What each configured pool of one cluster is worth, cached until its needs change."""
    pools = sheet.inventory.pools
    ids = pools.by_cluster.get(demand.cluster)
    if not ids:
        return None
    key = (demand.version, demand.profiles, len(ids))
    cached = sheet.memo.victims.get(demand.cluster)
    if cached is not None and cached[0] == key:
        return cached[1]
    pool = pools.bound_of(demand.cluster)  # the ids as an array, kept while they stay
    profile = pools.profile[pool].astype(np.int64)
    count = len(pool)
    priority = np.full(count, EXCESS_PRIORITY, dtype=np.int64)
    interruption = np.zeros(count)
    reclamation = np.zeros(count)
    app_rank = np.zeros(count, dtype=np.int64)
    if demand.needs:
        serving = demand.serving[profile]
        serves = serving >= 0
        need = serving[serves]
        priority[serves] = demand.priority[need]
        interruption[serves] = demand.interruption_penalty[need]
        reclamation[serves] = demand.reclamation_penalty[need]
        app_rank[serves] = demand.app_rank[need]
    attrs = (pool, profile, priority, interruption, reclamation, app_rank)
    sheet.memo.victims[demand.cluster] = (key, attrs)
    return attrs


class VictimGroups:
    """Settled configured machines per (cluster, profile), with what each group is worth.

    A group's worth to its cluster is read off the cluster's highest-priority
    need the profile can serve; it is cached per cluster and only rebuilt
    when that cluster's needs change, so assembling all groups is a
    concatenation plus this cycle's availability.
    """

    def __init__(
        self,
        *,
        sheet: Worksheet,
        demands: Mapping[int, Demand],
        drain_seconds: Mapping[int, float],
        default_drain: float,
    ) -> None:
        parts: list[VictimAttrs] = []
        clusters: list[int] = []
        lengths: list[int] = []
        for cluster, demand in demands.items():
            attrs = _cluster_victims(sheet, demand)
            if attrs is None:
                continue
            parts.append(attrs)
            clusters.append(cluster)
            lengths.append(len(attrs[0]))
        pools = sheet.inventory.pools
        if parts:
            columns = [np.concatenate([p[i] for p in parts]) for i in range(6)]
        else:
            columns = [np.zeros(0, dtype=np.int64)] * 6
        pool = columns[0].astype(np.int64, copy=False)
        available = pools.counts[pool].astype(np.int64, copy=False)
        consumed = sheet.consumed
        if consumed:
            taken = np.zeros(len(pools), dtype=np.int64)
            taken[np.fromiter(consumed, np.int64, len(consumed))] = np.fromiter(
                consumed.values(), np.int64, len(consumed)
            )
            available -= taken[pool]
        owner = np.repeat(np.array(clusters, dtype=np.int64), lengths)
        drain = np.repeat(
            np.array([drain_seconds.get(c, default_drain) for c in clusters], dtype=np.float64),
            lengths,
        )
        live = available > 0
        self.pool = pool[live]
        self.cluster = owner[live]
        self.profile = columns[1].astype(np.int64, copy=False)[live]
        self.priority = columns[2].astype(np.int64, copy=False)[live]
        self.interruption = columns[3].astype(np.float64, copy=False)[live]
        self.reclamation = columns[4].astype(np.float64, copy=False)[live]
        self.app_rank = columns[5].astype(np.int64, copy=False)[live]
        self.drain = drain[live]
        self.available = available[live]

    def __len__(self) -> int:
        return len(self.pool)


def saturation(sheet: Worksheet) -> float:
    """How full the shard is: 1 - (free idle + free speculative) / machines, in [0, 1]."""
    counts = sheet.inventory.state_counts
    total = float(counts.sum() - counts[int(MachineState.FAILED)])
    if total <= 0:
        return 1.0
    free = float(sheet.free[TIER_IDLE].sum() + sheet.free[TIER_SPECULATIVE].sum())
    return float(min(1.0, max(0.0, 1.0 - free / total)))


def blend_weights(normal: VictimWeights, saturated: VictimWeights, level: float) -> VictimWeights:
    """The victim weights at saturation ``level``: linear between normal (0) and saturated (1)."""

    def mix(a: float, b: float) -> float:
        return (1.0 - level) * a + level * b

    return VictimWeights(
        priority=mix(normal.priority, saturated.priority),
        drain_speed=mix(normal.drain_speed, saturated.drain_speed),
        interruption=mix(normal.interruption, saturated.interruption),
        reclamation=mix(normal.reclamation, saturated.reclamation),
    )


def victim_scores(
    *,
    gap: FloatArray,
    drain: FloatArray,
    interruption: FloatArray,
    reclamation: FloatArray,
    weights: VictimWeights,
    config: EngineConfig,
) -> FloatArray:
    """Higher is a better victim. Every term is bounded in [0, 1] and monotone."""
    gap_term = gap / (gap + config.priority_gap_scale)
    speed = 1.0 / (1.0 + np.maximum(drain, 0.0) / config.drain_scale_seconds)
    cheap_interrupt = 1.0 / (1.0 + interruption / config.penalty_scale_dollars)
    cheap_reclaim = 1.0 / (1.0 + reclamation / config.penalty_scale_dollars)
    result: FloatArray = (
        weights.priority * gap_term
        + weights.drain_speed * speed
        + weights.interruption * cheap_interrupt
        + weights.reclamation * cheap_reclaim
    )
    return result


def victim_order(score: FloatArray, priority: IntArray, app_rank: IntArray) -> IntArray:
    """Best victims first: by score, except that app class decides among equal priorities.

    The positions that victims of one priority occupy in the score order
    stay theirs, but are refilled best-effort first, then batch, then
    latency-sensitive (score order within a class).
    """
    order = np.argsort(-score, kind="stable").astype(np.int64)
    if len(order) < 2:
        return order
    prios = priority[order]
    apps = app_rank[order]
    result = order.copy()
    levels, counts = np.unique(prios, return_counts=True)
    for level in levels[counts > 1].tolist():
        at = np.flatnonzero(prios == level)
        result[at] = order[at][np.lexsort((at, apps[at]))]
    return result


def preempt(
    *,
    sheet: Worksheet,
    pending: list[PendingNeed],
    demands: Mapping[int, Demand],
    catalog: ProfileCatalog,
    config: EngineConfig,
    drain_seconds: Mapping[int, float],
    tolerance: float,
    fleet: FleetIdle | None = None,
    ages: Mapping[tuple[int, str], int] | None = None,
) -> list[PendingNeed]:
    """Run Phase 2 over the needs Phase 1 left short; returns them with updated deficits.

    With ``fleet`` (the other shards' shortfalls) a need leaves excess machines (those
    their cluster no longer needs) to an older or more important want of another shard
    that could use them, as Phase 1 leaves idle ones (ADR 0177): the coordinator's
    cross-shard preemption takes them at its next round. ``ages`` as for Phase 1.
    """
    if not pending:
        return pending
    groups = VictimGroups(
        sheet=sheet,
        demands=demands,
        drain_seconds=drain_seconds,
        default_drain=config.default_drain_seconds,
    )
    if len(groups) == 0:
        return pending
    alloc = catalog.alloc
    weights = blend_weights(
        config.victim_weights_normal, config.victim_weights_saturated, saturation(sheet)
    )
    for item in pending:
        if not item.unsatisfied or item.awaiting_transfer:
            continue  # a need waiting for another shard's idle machine does not preempt
        _preempt_for(
            sheet, item, groups, catalog, alloc, weights, config, tolerance, fleet, ages or {}
        )
    return pending


def _excess_yielded(
    sheet: Worksheet,
    item: PendingNeed,
    groups: VictimGroups,
    eligible: BoolArray,
    catalog: ProfileCatalog,
    fleet: FleetIdle,
    ages: Mapping[tuple[int, str], int],
) -> BoolArray:
    """The eligible excess groups the need leaves to an older want of another shard."""
    excess = eligible & (groups.priority == EXCESS_PRIORITY)
    at = np.flatnonzero(excess)
    if not fleet.wants or len(at) == 0:
        return np.zeros(len(eligible), dtype=np.bool_)
    shapes = idle_shapes(catalog, groups.profile[at].tolist(), groups.available[at].tolist())
    yields = fleet.yields(
        cluster=item.cluster,
        key=item.key,
        need=item.need,
        age_cycles=ages.get((item.cluster, item.key), 0),
        idle=shapes,
        now=sheet.now,
    )
    return excess if yields else np.zeros(len(eligible), dtype=np.bool_)


def _preempt_for(
    sheet: Worksheet,
    item: PendingNeed,
    groups: VictimGroups,
    catalog: ProfileCatalog,
    alloc: FloatArray,
    weights: VictimWeights,
    config: EngineConfig,
    tolerance: float,
    fleet: FleetIdle | None,
    ages: Mapping[tuple[int, str], int],
) -> None:
    priority = item.priority
    mask = item.mask
    eligible = (
        (groups.priority < priority)
        & (groups.cluster != item.cluster)
        & (groups.available > 0)
        & mask[groups.profile]
    )
    if fleet is not None:
        eligible &= ~_excess_yielded(sheet, item, groups, eligible, catalog, fleet, ages)
    demand = item.demand
    gang = demand.gang_keys[item.index]
    aggregate = demand.aggregate[item.index]
    deficit = item.deficit
    if gang and item.topology_block:
        eligible, placed, deficit = _place_gang(
            sheet, item, groups, eligible, catalog, alloc, tolerance
        )
        if placed is None:
            return
        mask = placed
    # Of the eligible groups, those offering something still missing. Judged on the
    # eligible few only: gathering every group's shape cost more than the rest of
    # the need's Phase 2 together.
    at = np.flatnonzero(eligible)
    at = at[(alloc[groups.profile[at]][:, deficit > 0] > 0).any(axis=1)]
    item.victims_available += int(groups.available[at].sum())
    if len(at) == 0 or not deficit.any():
        return
    gap = (priority - groups.priority[at]).astype(np.float64)
    score = victim_scores(
        gap=gap,
        drain=groups.drain[at],
        interruption=groups.interruption[at],
        reclamation=groups.reclamation[at],
        weights=weights,
        config=config,
    )
    order = victim_order(score, groups.priority[at], groups.app_rank[at])
    shapes = alloc[groups.profile[at]]
    need = item.need
    if need.spread:
        rank = np.empty(len(at))
        rank[order] = np.arange(len(at), dtype=np.float64)
        spread = SpreadState(
            catalog=catalog,
            spreads=need.spread,
            mask=mask,
            present=sheet.inventory.members > 0,
            held=(sheet.supply_row(item.cluster) * mask).astype(np.float64),
        )
        picks, residual, blocked = cover_with_spread(
            deficit=deficit,
            aggregate=aggregate,
            available=groups.available[at],
            alloc=shapes,
            profiles=groups.profile[at],
            preference=rank,
            spread=spread,
            max_steps=config.max_spread_steps,
            tolerance=tolerance,
        )
        if blocked and residual.any():
            item.topology_block = (
                "hard topology spread leaves no allowed domain with free or preemptible capacity"
            )
        elif not residual.any():
            item.topology_block = ""
    else:
        picks, residual = cover_in_order(
            deficit=deficit,
            aggregate=aggregate,
            available=groups.available[at],
            alloc=shapes,
            order=order,
            tolerance=tolerance,
        )
    ref = (item.key, need.requirements)
    for position, machines in picks:
        g = int(at[position])
        victim = int(groups.cluster[g])
        profile = int(groups.profile[g])
        rows, pool = sheet.take(PoolKey(TIER_BOUND, victim, profile), machines)
        groups.available[g] -= len(rows)
        sheet.move_supply(victim, profile, -len(rows))
        sheet.move_supply(item.cluster, profile, len(rows))
        item.victims_taken += len(rows)
        victim_priority = int(groups.priority[g])
        grace = drain_grace_seconds(
            priority - victim_priority, config.grace_thresholds, config.grace_default_seconds
        )
        sheet.log.add(
            ActionKind.PREEMPT,
            rows,
            cluster=item.cluster,
            pool=pool,
            source=victim,
            need=ref,
            priority=priority,
            victim_priority=max(victim_priority, -(2**31)),
            grace=grace,
        )
    if gang and item.victims_taken:
        item.topology_block = ""
    item.deficit = np.maximum(item.deficit - (deficit - residual), 0.0)
    item.deficit = settle_deficit(item.deficit, aggregate, tolerance)


def _place_gang(
    sheet: Worksheet,
    item: PendingNeed,
    groups: VictimGroups,
    eligible: npt.NDArray[np.bool_],
    catalog: ProfileCatalog,
    alloc: FloatArray,
    tolerance: float,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_] | None, FloatArray]:
    """Choose a gang domain counting preemptible machines; victims cover what free ones cannot.

    Free machines in the chosen domain are left for the next cycle's Phase 1
    (the domain is remembered), so only the remainder is preempted now.
    """
    demand = item.demand
    gang = demand.gang_keys[item.index]
    codes = domain_codes(catalog, gang)
    base = item.mask
    free = (sheet.free[TIER_IDLE] + sheet.free[TIER_SPECULATIVE]).astype(np.float64)
    # Preemptible machines per profile. Whole counts, so summing them in float64
    # is exact in any order (``np.add.at`` said the same, several times slower).
    victims = np.bincount(
        groups.profile[eligible],
        weights=groups.available[eligible].astype(np.float64),
        minlength=len(catalog),
    )
    previous_key = demand.keys[item.index]
    # What the gang may count as held: less what the cluster's other needs claim (ADR 0128).
    supply = sheet.supply_row(item.cluster)
    claims = claims_now(sheet, demand, alloc)
    row = supply.astype(np.float64) if claims is None else claims.supply(item.index, len(supply))
    choice = choose_gang_domain(
        codes=codes,
        mask=base,
        held=row,
        available=free + victims,
        aggregate=demand.aggregate[item.index],
        alloc=alloc,
        previous=None,
        tolerance=tolerance,
    )
    if choice.domain is None:
        return eligible, None, item.deficit
    in_domain = base & (codes == choice.domain)
    sheet.gang_choices[(item.cluster, previous_key)] = choice.domain
    held = np.flatnonzero(row * in_domain)
    have = combine(row[held], alloc[held])
    deficit = np.maximum(demand.aggregate[item.index] - have, 0.0)
    item.deficit = deficit.copy()
    free_cover = combine(free * in_domain, alloc)
    remainder = np.maximum(deficit - free_cover, 0.0)
    remainder = settle_deficit(remainder, demand.aggregate[item.index], tolerance)
    item.mask = in_domain
    return eligible & in_domain[groups.profile], in_domain, remainder
