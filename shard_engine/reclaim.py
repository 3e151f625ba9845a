"""Phase 3: give back what clusters no longer need, then release idle cloud machines.

**Reclaim excess.** A configured machine is excess when its cluster's needs
stay covered without it. Excess is drained back to *idle*, not deleted,
because another need arriving in minutes is served far faster from idle.
Reclaiming on the first sight of excess churns: roll-ups are noisy and
demand moves in waves, so a machine reclaimed on a dip is provisioned again
at the next rise. Reclaim therefore waits for the excess to *persist*, and
every rule below is a reason to keep a machine:

1. **Unmet demand blocks.** Only settled, configured machines count as
   covering a need: machines still creating or configuring for it do not
   (they may fail, and until they arrive the cluster is short). A need that
   is short, or that has machines on their way to it, blocks the reclaim of
   every machine that could serve it.
2. **Recent peak.** Each need is judged at the peak of its aggregate over
   the last ``reclaim_window_seconds`` (``demand_history``); a need that
   vanished from the roll-ups within the window still holds the machines it
   matched.
3. **Hysteresis.** A (cluster, profile) group must show excess in
   ``reclaim_hysteresis_cycles`` consecutive cycles; the count reclaimed is
   the smallest excess seen over that streak.
4. **Minimum age.** A machine configured less than
   ``reclaim_min_age_seconds`` ago stays: it was wanted that recently.
   The same holds for its need: while the youngest machine that could
   serve a need is younger than that, the need grew recently (demand is
   rising, or noisy enough to set new highs) and none of the machines that
   could serve it is reclaimed.

Which excess goes first: the most expensive per hour (holding on-demand
costs money, holding bare metal does not), then the lower reclamation
penalty (keep the machine with more accumulated value). At most
``max(1, 5 %)`` of a cluster's configured machines are reclaimed per cycle
— a wrong roll-up must not empty a cluster in one step. Clusters that never
sent a roll-up, and machines in flight, are left alone.

**Named release.** A cluster whose roll-up names machines it can give up
(``Rollup.release``, even none) loses excess only from those machines, never
any other. The list is an explicit request, not excess (ADR 0125): a named
machine goes at the next cycle when the cluster's needs *as they are now*
stay covered without it — rule 1 still holds, rules 2–4 (window, hysteresis,
minimum age) and the per-cycle rate cap do not apply, because they guard
against noisy *implicit* excess and a scheduler that names its workers (a
Nanook pool) has already decided. How many may go is the bound computed
from the current needs; the machines taken are the named ones. Kept
workers (``workers_to_keep``) are never named, so never reclaimed for
excess (ADR 0070). A cluster that names nothing (or only machines this
shard does not know) is skipped outright, its hysteresis record dropped,
and does not use up a place among the clusters examined per cycle.
A hysteresis streak that a reclaim used up ends, so the next scale-down
starts its own streak instead of inheriting a least excess of zero.
Preemption (Phase 2) is not restricted.

**Release idle.** An idle cloud machine is deleted once it has been idle for
its capacity type's hold period, unless Phase 1 drew on that shape within
the demand window (recent demand says it will be wanted again). Bare metal
and reserved capacity are never released.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shard_engine.actions import ActionKind
from shard_engine.catalog import ProfileCatalog
from shard_engine.clusters import NO_CLUSTER
from shard_engine.config import EngineConfig
from shard_engine.demand_history import DemandHistory, Peaks
from shard_engine.model import CapacityType
from shard_engine.needs import Demand
from shard_engine.phase1 import claim_bound, memo_key
from shard_engine.pools import TIER_BOUND, TIER_IDLE, PoolKey
from shard_engine.usable import have_rows, usable_shapes
from shard_engine.worksheet import Worksheet

__all__ = ["ReclaimMemory", "excess_groups", "reclaim_excess", "release_idle"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

_NO_ROWS: IntArray = np.zeros(0, dtype=np.int64)

_UNBOUNDED = 2**62
# Surplus of a need that blocks reclaim outright (finite, so bounds stay finite).
_BLOCKED = -1e18


@dataclass(slots=True)
class _Streak:
    """Consecutive cycles a (cluster, profile) group showed excess, and the least excess seen."""

    first_cycle: int
    least: int


@dataclass(slots=True)
class ReclaimMemory:
    """What Phase 3 carries from one committed cycle to the next.

    ``history`` holds each need's recent peak; ``streaks`` per cluster and
    profile the hysteresis count; ``recheck_at`` per cluster found quiet the
    instant time alone may change the answer (a peak leaving the window, a
    machine coming of age). ``cycle`` counts committed cycles.
    """

    history: DemandHistory
    cycle: int = 0
    streaks: dict[int, dict[int, _Streak]] = field(default_factory=dict)
    recheck_at: dict[int, float] = field(default_factory=dict)

    def forget(self, cluster: int) -> None:
        """Drop everything about a cluster that left this shard."""
        self.history.forget(cluster)
        self.streaks.pop(cluster, None)
        self.recheck_at.pop(cluster, None)


def excess_groups(
    matrix: BoolArray, surplus: FloatArray, profiles: npt.NDArray[np.int64], usable: FloatArray
) -> npt.NDArray[np.int64]:
    """How many machines of each candidate profile could go without any need falling short.

    ``matrix`` says which profiles may serve which need (rows); ``surplus``
    is have minus aggregate per need and resource (columns); ``usable[n, i]``
    is what one machine of ``profiles[i]`` holds of need ``n``
    (:func:`shard_engine.usable.usable_shapes`), the same measure ``have``
    was counted in. For a profile, the bound from each need it matches is
    ``min_d floor(surplus_d / usable_d)`` over resources it holds of that
    need; a profile no need matches is unbounded (``2**62``). Compiled
    (``kernels.excess``).
    """
    import shard_engine.kernels as kernels  # numba loads with the first cycle, not with the CLI

    return kernels.excess(
        np.ascontiguousarray(matrix),
        np.ascontiguousarray(surplus),
        profiles,
        np.ascontiguousarray(usable),
    )


def _excess_of(
    matrix: BoolArray, surplus: FloatArray, profile: int, usable: FloatArray, position: int
) -> int:
    """:func:`excess_groups` for one profile (Phase 3 asks again as it takes)."""
    import shard_engine.kernels as kernels  # numba loads with the first cycle, not with the CLI

    return int(
        kernels.excess_one(
            np.ascontiguousarray(matrix),
            np.ascontiguousarray(surplus),
            profile,
            np.ascontiguousarray(usable),
            position,
        )
    )


def _settled_have(
    matrix: BoolArray, settled: npt.NDArray[np.int64], alloc: FloatArray, units: FloatArray
) -> FloatArray:
    """Per need: what the settled configured machines that may serve it hold of it.

    In whole units where the need has one (``shard_engine.usable``), so what a
    machine strands for a need is never excess the need could give up.
    """
    held = settled[: matrix.shape[1]].nonzero()[0]
    if len(held) == 0:
        return np.zeros((matrix.shape[0], alloc.shape[1]))
    return have_rows(matrix[:, held] * settled[held], usable_shapes(alloc[held], units))


def _units(peaks: Peaks, demand: Demand) -> FloatArray:
    """Per row of ``peaks``: the need's ``min_unit`` (rows of vanished needs have none)."""
    units = np.zeros_like(peaks.aggregate)
    current = min(peaks.current, len(demand.min_unit))
    if current:
        width = min(units.shape[1], demand.min_unit.shape[1])
        units[:current, :width] = demand.min_unit[:current, :width]
    return units


def reclaim_excess(
    *,
    sheet: Worksheet,
    demands: list[Demand],
    catalog: ProfileCatalog,
    config: EngineConfig,
    tolerance: float,
    memory: ReclaimMemory,
    record: bool = True,
    release: Mapping[int, frozenset[str]] | None = None,
) -> int:
    """Plan :class:`Reclaim` actions for excess configured machines (see module docstring).

    Returns how many excess machines, ready to go, the per-cluster rate cap
    left for a later cycle.

    ``release`` maps a cluster index to the machine ids its roll-up offered
    for release; such a cluster's excess is taken from those machines only.

    Clusters whose supply and needs did not change since they were last
    found to have no excess are skipped until time alone could change that
    (``ReclaimMemory.recheck_at``). Of the others at most
    ``reclaim_clusters_per_cycle`` are examined, round-robin, so a cycle in
    which many clusters changed stays short; the rest wait a cycle or two,
    which a reclaim with minutes of grace does not notice. ``record`` is
    False on a dry run: hysteresis streaks are then read, not advanced.
    """
    inventory = sheet.inventory
    pools = inventory.pools
    alloc = catalog.alloc
    price = catalog.price
    memo = sheet.memo
    now = sheet.now
    cycle = memory.cycle + 1
    if record:
        memory.cycle = cycle
    hysteresis = config.reclaim_hysteresis_cycles
    now_s = inventory.seconds(now)
    oldest_since = now_s - config.reclaim_min_age_seconds
    examined = 0
    capped = 0
    start = memo.reclaim_cursor % len(demands) if demands else 0
    for offset in range(len(demands)):
        demand = demands[(start + offset) % len(demands)]
        cluster = demand.cluster
        ids = pools.by_cluster.get(cluster)
        if not ids:
            continue
        quiet_key = memo_key(sheet, demand)
        touched = sheet.touched(cluster)
        if (
            not touched
            and memo.quiet.get(cluster) == quiet_key
            and now < memory.recheck_at.get(cluster, math.inf)
        ):
            continue
        offered = release.get(cluster) if release else None
        named = _named_rows(sheet, offered) if offered else (None if offered is None else set())
        if named is not None and not named:
            # It named nothing it can give up (present and empty, or no machine we know):
            # nothing of it may go for excess, so it costs neither work nor a place in
            # this cycle's budget of examined clusters. Its hysteresis record goes: a
            # streak is consecutive cycles of excess, and this cycle did not count one.
            if record:
                memory.streaks.pop(cluster, None)
            continue
        # A named release is an explicit request (ADR 0125): judged against the demand
        # now, with no window, minimum age, hysteresis or rate cap.
        explicit = named is not None
        if examined >= config.reclaim_clusters_per_cycle:
            memo.reclaim_cursor = start + offset
            break
        examined += 1

        pool_ids = pools.bound_of(cluster)  # ``ids`` as an array, kept while they stay
        counts = pools.counts[pool_ids]
        consumed = sheet.consumed
        available = (
            counts - np.array([consumed.get(pool, 0) for pool in ids], dtype=np.int64)
            if consumed
            else counts.copy()
        )
        live = available > 0
        if not np.count_nonzero(live):
            if record:
                memory.streaks.pop(cluster, None)
            _mark_quiet(sheet, memory, demand, touched=touched, until=math.inf)
            continue
        pool_ids = pool_ids[live]
        available = available[live]
        profiles = pools.profile[pool_ids].astype(np.int64)

        peaks = _current(demand) if explicit else memory.history.peaks(demand, now=now)
        supply = sheet.supply_row(cluster)
        settled = np.zeros(len(supply), dtype=np.int64)
        settled[profiles] = available
        units = _units(peaks, demand)
        claims = claim_bound(
            sheet, demand, peaks.matrix, peaks.aggregate, settled, alloc, settled_only=True
        )
        if claims is None:
            have = _settled_have(peaks.matrix, settled, alloc, units)
        else:  # machines shared by several needs count for one each
            have = have_rows(claims.own * claims.sub, usable_shapes(claims.shapes, units))
        surplus = have - peaks.aggregate
        surplus -= config.reclaim_swing_margin * peaks.swing
        surplus += tolerance * np.maximum(peaks.aggregate, 1.0)
        moving = (supply - settled > 0).nonzero()[0]
        moving = moving[moving < peaks.matrix.shape[1]]
        if len(moving) and peaks.matrix.shape[0]:
            arriving = peaks.matrix[:, moving].any(axis=1)
            surplus[arriving] = _BLOCKED
        recheck = peaks.recheck_at
        if config.reclaim_min_age_seconds > 0 and peaks.matrix.shape[0] and not explicit:
            youngest = _youngest(sheet, pool_ids, profiles, peaks.matrix.shape[1])
            grew = youngest > oldest_since
            if grew.any():
                surplus[peaks.matrix[:, grew].any(axis=1)] = _BLOCKED
                recheck = min(recheck, now + float(youngest[grew].min() - oldest_since))
        # What one machine of each candidate holds of each need: have was counted in
        # it, so a machine leaves the surplus at it too (not at its allocatable).
        usable = usable_shapes(alloc[profiles], units)
        bound = excess_groups(peaks.matrix, surplus, profiles, usable)
        if not np.count_nonzero(bound > 0):
            if record:
                memory.streaks.pop(cluster, None)
            if not explicit:  # a new list with the same needs must be looked at again
                _mark_quiet(sheet, memory, demand, touched=touched, until=recheck)
            continue

        # Hysteresis: per profile, the least excess over a streak of consecutive cycles.
        known = memory.streaks.get(cluster, {})
        streaks: dict[int, _Streak] = {}
        needed = 1 if explicit else hysteresis
        profile_of: list[int] = profiles.tolist()
        ready = np.zeros(len(profile_of), dtype=np.int64)
        for position in np.flatnonzero(bound > 0).tolist():
            profile = profile_of[position]
            excess = int(bound[position])
            before = known.get(profile)
            streak = streaks[profile] = (
                _Streak(cycle, excess)
                if before is None or explicit
                else _Streak(before.first_cycle, min(before.least, excess))
            )
            if cycle - streak.first_cycle + 1 >= needed:
                ready[position] = streak.least
        if record:
            memory.streaks[cluster] = streaks
        if not np.count_nonzero(ready > 0):
            continue  # examined again next cycle, to count the streak

        configured = int(counts.sum())
        budget = (
            configured
            if explicit
            else max(
                config.reclaim_minimum_per_cycle,
                math.floor(config.reclaim_fraction_per_cycle * configured),
            )
        )
        serving = demand.serving[profiles]
        penalty = (
            np.where(serving >= 0, demand.reclamation_penalty[np.maximum(serving, 0)], 0.0)
            if len(demand.needs)
            else np.zeros(len(profiles))
        )
        order = np.lexsort((profiles, penalty, -price[profiles]))
        order = order[ready[order] > 0]  # the others have nothing to give, now or later
        allowed: list[int] = ready.tolist()
        left: list[int] = available.tolist()
        width = peaks.matrix.shape[1]
        # Per position, which needs its profile matches: its bound is recomputed only
        # when the surplus of one of those needs shrank since it was computed.
        inside = profiles < width
        columns = np.zeros((peaks.matrix.shape[0], len(profiles)), dtype=np.bool_)
        columns[:, inside] = peaks.matrix[:, profiles[inside]]
        shrunk = np.zeros(peaks.matrix.shape[0], dtype=np.bool_)
        any_shrunk = False
        changed = False
        coming_of_age = math.inf
        for position in order.tolist():
            if budget <= 0:
                capped += max(0, min(allowed[position], left[position]))
                continue
            if allowed[position] <= 0:
                continue  # bounds only shrink as machines are taken
            profile = profile_of[position]
            if any_shrunk and np.count_nonzero(shrunk & columns[:, position]):
                allowed[position] = min(
                    allowed[position], _excess_of(peaks.matrix, surplus, profile, usable, position)
                )
            machines = min(allowed[position], left[position], budget)
            if machines <= 0:
                continue
            taken = _take_old_enough(
                sheet,
                PoolKey(TIER_BOUND, cluster, profile),
                machines,
                math.inf if explicit else oldest_since,
                named,
            )
            if isinstance(taken, float):
                coming_of_age = min(coming_of_age, now + taken)
                continue
            rows, pool, tail = taken
            if not len(rows):
                continue
            budget -= len(rows)
            if budget <= 0:
                capped += max(0, min(allowed[position], left[position]) - len(rows))
            changed = True
            sheet.move_supply(cluster, profile, -len(rows))
            if peaks.matrix.shape[0] and profile < width:
                matches = columns[:, position]  # the needs this profile serves
                taken_away = len(rows) * usable[:, position]
                np.subtract(surplus, taken_away, out=surplus, where=matches[:, None])
                shrunk |= matches
                any_shrunk = True
            if record and profile in streaks:
                # What went is no longer excess; a streak used up ends, so the next
                # scale-down starts a streak of its own instead of inheriting zero.
                streaks[profile].least -= len(rows)
                if streaks[profile].least <= 0:
                    del streaks[profile]
            sheet.log.add(
                ActionKind.RECLAIM,
                rows,
                cluster=cluster,
                pool=pool,
                tail=tail,
                grace=config.reclaim_grace_seconds,
            )
        if not changed and coming_of_age < math.inf:
            _mark_quiet(sheet, memory, demand, touched=touched, until=min(coming_of_age, recheck))
    return capped


def _current(demand: Demand) -> Peaks:
    """The cluster's needs as they are now: what an explicit release is judged against."""
    dims = demand.aggregate.shape[1] if demand.aggregate.ndim == 2 else 0
    aggregate = demand.aggregate.reshape(-1, dims).copy()
    return Peaks(demand.matrix, aggregate, np.zeros_like(aggregate), len(demand.keys), math.inf)


def _youngest(
    sheet: Worksheet, pool_ids: npt.NDArray[np.int64], profiles: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.float64]:
    """Per profile (``width`` of them), when its youngest settled machine here was configured.

    In the inventory's seconds; ``-inf`` for profiles with no settled machine.
    One gather and one segmented maximum over all the cluster's pools.
    """
    inventory = sheet.inventory
    pools = inventory.pools
    youngest = np.full(width, -np.inf)
    consumed = sheet.consumed
    parts: list[npt.NDArray[np.int32]] = []
    owners: list[int] = []
    for pool, profile in zip(pool_ids.tolist(), profiles.tolist(), strict=True):
        if profile >= width:
            continue
        rows = pools.members(pool)[: pools.count(pool) - consumed.get(pool, 0)]
        if len(rows):
            parts.append(rows)
            owners.append(profile)
    if not parts:
        return youngest
    starts = np.zeros(len(parts), dtype=np.int64)
    np.cumsum([len(p) for p in parts[:-1]], out=starts[1:])
    since = inventory.since[np.concatenate(parts)]
    youngest[owners] = np.maximum.reduceat(since, starts).astype(np.float64)
    return youngest


def _mark_quiet(
    sheet: Worksheet, memory: ReclaimMemory, demand: Demand, *, touched: bool, until: float
) -> None:
    """Skip this cluster until its supply or needs change, or until ``until``."""
    if not touched:
        sheet.memo.quiet[demand.cluster] = memo_key(sheet, demand)
        memory.recheck_at[demand.cluster] = until


def _take_old_enough(
    sheet: Worksheet,
    key: PoolKey,
    machines: int,
    oldest_since: float,
    named: set[int] | None = None,
) -> tuple[IntArray, int, bool] | float:
    """Up to ``machines`` settled rows of pool ``key`` configured at or before ``oldest_since``.

    Returns (rows, pool, taken from the tail), or — when every candidate is
    too young — the seconds until the first of them comes of age. When the
    pool's tail is old enough the rows come from it (:meth:`Worksheet.take`);
    otherwise the old rows are picked from anywhere in the pool
    (:meth:`Worksheet.take_named`, which only the last phase to take from a
    pool may use — Phase 3 is). ``named`` (a cluster's named release)
    restricts the candidates to those rows.
    """
    inventory = sheet.inventory
    pools = inventory.pools
    pool = pools.find(key)
    if pool is None or machines <= 0:
        return _NO_ROWS, -1, False
    skip = sheet.consumed.get(pool, 0)
    if named is None:
        tail = pools.tail(pool, skip, machines)
        if len(tail) and np.count_nonzero(inventory.since[tail] <= oldest_since) == len(tail):
            sheet.take_tail(key, pool, tail)  # what ``sheet.take`` would read again
            return tail, pool, True
    members = pools.members(pool)[: pools.count(pool) - skip]
    offered = np.array(
        [r for r in members.tolist() if (named is None or r in named) and r not in sheet.taken],
        dtype=np.int64,
    )
    if len(offered) == 0:
        return _NO_ROWS, pool, False
    since = inventory.since[offered]
    old = since <= oldest_since
    if not np.count_nonzero(old):
        return float(since.min() - oldest_since)
    rows = sheet.take_named(key, set(offered[old].tolist()), machines)
    return rows, pool, False


def _named_rows(sheet: Worksheet, ids: frozenset[str] | None) -> set[int] | None:
    """Rows of the machines a cluster named for release, or None when it gave no list."""
    if ids is None:
        return None
    rows = sheet.inventory.ids
    return {row for machine_id in ids if (row := rows.get(machine_id)) is not None}


def release_idle(
    *,
    sheet: Worksheet,
    catalog: ProfileCatalog,
    config: EngineConfig,
    recent_draw: npt.NDArray[np.float64],
) -> None:
    """Plan :class:`Release` (Delete) for idle cloud machines whose hold has expired.

    Pools are filtered as a whole first (capacity type never released,
    shape drawn recently); a pool whose earliest possible expiry lies in
    the future is skipped without looking at its machines.
    """
    inventory = sheet.inventory
    pools = inventory.pools
    size = len(pools)
    idle_pools = np.flatnonzero((pools.tier[:size] == TIER_IDLE) & (pools.counts[:size] > 0))
    if len(idle_pools) == 0:
        return
    hold_by_type = np.array(
        [
            np.nan if (h := config.hold_seconds(t)) is None else float(h)
            for t in range(int(max(CapacityType)) + 1)
        ]
    )
    profiles = pools.profile[idle_pools]
    holds = hold_by_type[catalog.capacity_type[profiles]]
    eligible = ~np.isnan(holds) & (
        sheet.now - recent_draw[profiles] >= config.demand_window_seconds
    )
    memo = sheet.memo
    if len(memo.release_after) < size:
        grown = np.full(max(size, 2 * len(memo.release_after)), -np.inf)
        grown[: len(memo.release_after)] = memo.release_after
        memo.release_after = grown
    remembered = memo.release_after
    # A pool whose machines reach the end of their hold only later is looked at then.
    eligible &= remembered[idle_pools] <= sheet.now
    if sheet.drawn:
        drawn = np.zeros(len(catalog), dtype=np.bool_)
        drawn[np.fromiter(sheet.drawn, np.int64, len(sheet.drawn))] = True
        eligible &= ~drawn[profiles]
    now_s = inventory.seconds(sheet.now)
    budget = config.max_releases_per_cycle
    for pool, hold in zip(idle_pools[eligible].tolist(), holds[eligible].tolist(), strict=True):
        if budget <= 0:
            return
        skip = sheet.consumed.get(pool, 0)
        rows = pools.members(pool)[: max(0, pools.count(pool) - skip)]
        since = inventory.since[rows]
        expired_mask = (now_s - since) >= hold
        expired = rows[expired_mask][:budget]
        waiting = since[~expired_mask]
        remembered[pool] = (
            sheet.now + float(waiting.min()) + hold - now_s if len(waiting) else -np.inf
        )
        chosen = [row for row in expired.tolist() if row not in sheet.taken]
        if not chosen:
            continue
        sheet.taken.update(chosen)
        budget -= len(chosen)
        sheet.log.add(
            ActionKind.RELEASE,
            np.array(chosen, dtype=np.int64),
            cluster=NO_CLUSTER,
            pool=pool,
            tail=False,
        )
