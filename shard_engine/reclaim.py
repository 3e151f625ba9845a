"""Phase 3: give back what clusters no longer need, then release idle cloud machines.

**Reclaim excess.** A configured machine is excess when its cluster's needs
stay covered without it: removing it leaves every need it matches at or
above its aggregate (a machine that matches no need of its cluster is
excess outright). Excess is drained back to *idle*, not deleted, because
another need arriving in minutes is served far faster from idle. Which
excess goes first: the most expensive per hour (holding on-demand costs
money, holding bare metal does not), then the lower reclamation penalty
(keep the machine with more accumulated value). At most
``max(1, 5 %)`` of a cluster's configured machines are reclaimed per cycle
— a wrong roll-up must not empty a cluster in one step. Clusters that never
sent a roll-up, and machines in flight, are left alone.

**Named release.** A cluster whose roll-up names machines it can give up
(``Rollup.release``, even none) loses excess only from those machines: the bound on
how many may go is computed as above, and the machines taken are the named
ones of each group, never any other. A scheduler that keeps particular
workers (a Nanook cluster's ``workers_to_keep``) thus never sees them
reclaimed for excess; if too few named machines are configured, less is
reclaimed and the rest waits for a later roll-up (ADR 0070). A cluster
that names nothing (or only machines this shard does not know) is skipped
outright and does not use up a place among the clusters examined per cycle.
Preemption (Phase 2) is not restricted.

**Release idle.** An idle cloud machine is deleted once it has been idle for
its capacity type's hold period, unless Phase 1 drew on that shape within
the demand window (recent demand says it will be wanted again). Bare metal
and reserved capacity are never released.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from shard_engine.actions import ActionKind
from shard_engine.catalog import ProfileCatalog
from shard_engine.clusters import NO_CLUSTER
from shard_engine.config import EngineConfig
from shard_engine.model import CapacityType
from shard_engine.needs import Demand
from shard_engine.phase1 import cluster_have, memo_key
from shard_engine.pools import TIER_BOUND, TIER_IDLE, PoolKey
from shard_engine.worksheet import Worksheet

__all__ = ["excess_groups", "reclaim_excess", "release_idle"]

FloatArray = npt.NDArray[np.float64]


def excess_groups(
    demand: Demand, surplus: FloatArray, profiles: npt.NDArray[np.int64], alloc: FloatArray
) -> npt.NDArray[np.int64]:
    """How many machines of each candidate profile could go without any need falling short.

    ``surplus`` is have minus aggregate per need (rows) and resource
    (columns). For a profile, the bound from each need it matches is
    ``min_d floor(surplus_d / allocatable_d)`` over resources it offers; a
    profile no need matches is unbounded (``2**62``).
    """
    unbounded = np.int64(2**62)
    shapes = alloc[profiles]
    if not demand.needs:
        return np.full(len(profiles), unbounded, dtype=np.int64)
    matches = demand.matrix[:, profiles]
    offered = shapes > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(
            offered[None, :, :],
            np.floor(surplus[:, None, :] / np.where(offered, shapes, 1.0)[None, :, :] + 1e-9),
            np.inf,
        )
    per_need = ratio.min(axis=2)
    per_need = np.where(matches, per_need, np.inf)
    bound = per_need.min(axis=0)
    bound = np.where(np.isinf(bound), float(unbounded), np.maximum(bound, 0.0))
    result: npt.NDArray[np.int64] = bound.astype(np.int64)
    return result


def _excess_of(demand: Demand, surplus: FloatArray, profile: int, alloc: FloatArray) -> int:
    """:func:`excess_groups` for one profile, in plain Python (it runs inside a loop)."""
    if not demand.needs:
        return 2**62
    shape = alloc[profile].tolist()
    offered = [d for d, amount in enumerate(shape) if amount > 0]
    best = 2**62
    for n in np.flatnonzero(demand.matrix[:, profile]).tolist():
        row = surplus[n].tolist()
        for d in offered:
            best = min(best, math.floor(row[d] / shape[d] + 1e-9))
    return max(best, 0)


def reclaim_excess(
    *,
    sheet: Worksheet,
    demands: list[Demand],
    catalog: ProfileCatalog,
    config: EngineConfig,
    tolerance: float,
    release: Mapping[int, frozenset[str]] | None = None,
) -> None:
    """Plan :class:`Reclaim` actions for excess configured machines (see module docstring).

    ``release`` maps a cluster index to the machine ids its roll-up offered
    for release; such a cluster's excess is taken from those machines only.

    Clusters whose supply and needs did not change since they were last
    found to have no excess are skipped. Of the others at most
    ``reclaim_clusters_per_cycle`` are examined, round-robin, so a cycle in
    which many clusters changed stays short; the rest wait a cycle or two,
    which a reclaim with minutes of grace does not notice.
    """
    inventory = sheet.inventory
    pools = inventory.pools
    alloc = catalog.alloc
    price = catalog.price
    memo = sheet.memo
    examined = 0
    start = memo.reclaim_cursor % len(demands) if demands else 0
    for offset in range(len(demands)):
        demand = demands[(start + offset) % len(demands)]
        cluster = demand.cluster
        ids = pools.by_cluster.get(cluster)
        if not ids:
            continue
        named = _named_rows(sheet, release.get(cluster)) if release else None
        if named is not None and not named:
            # It named nothing it can give up (present and empty, or no machine we know):
            # nothing of it may go for excess, so it costs neither work nor a place in
            # this cycle's budget of examined clusters.
            continue
        quiet_key = memo_key(sheet, demand)
        touched = sheet.touched(cluster)
        if not touched and memo.quiet.get(cluster) == quiet_key:
            continue
        if examined >= config.reclaim_clusters_per_cycle:
            memo.reclaim_cursor = start + offset
            break
        examined += 1
        pool_ids = np.array(ids, dtype=np.int64)
        counts = pools.counts[pool_ids]
        consumed = sheet.consumed
        available = (
            counts - np.array([consumed.get(pool, 0) for pool in ids], dtype=np.int64)
            if consumed
            else counts.copy()
        )
        live = available > 0
        if not live.any():
            if not touched:
                sheet.memo.quiet[cluster] = quiet_key
            continue
        pool_ids = pool_ids[live]
        available = available[live]
        profiles = pools.profile[pool_ids].astype(np.int64)
        have, _ = cluster_have(sheet, demand, alloc, tolerance)
        surplus = have - demand.aggregate
        surplus += tolerance * np.maximum(demand.aggregate, 1.0)
        bound = excess_groups(demand, surplus, profiles, alloc)
        if not (bound > 0).any():
            if not touched:
                sheet.memo.quiet[cluster] = quiet_key
            continue
        configured = int(counts.sum())
        budget = max(
            config.reclaim_minimum_per_cycle,
            math.floor(config.reclaim_fraction_per_cycle * configured),
        )
        serving = demand.serving[profiles]
        penalty = (
            np.where(serving >= 0, demand.reclamation_penalty[np.maximum(serving, 0)], 0.0)
            if len(demand.needs)
            else np.zeros(len(profiles))
        )
        order = np.lexsort((profiles, penalty, -price[profiles]))
        bounds: list[int] = bound.tolist()
        left: list[int] = available.tolist()
        profile_of: list[int] = profiles.tolist()
        # Per position, which needs its profile matches: a bound is recomputed only
        # when the surplus of one of those needs shrank since it was computed.
        matched: list[list[bool]] = demand.matrix[:, profiles].T.tolist() if demand.needs else []
        shrunk: set[int] = set()
        for position in order.tolist():
            if budget <= 0:
                break
            if bounds[position] <= 0:
                continue  # bounds only shrink as machines are taken
            profile = profile_of[position]
            if shrunk and any(matched[position][n] for n in shrunk):
                bounds[position] = _excess_of(demand, surplus, profile, alloc)
            machines = min(bounds[position], left[position], budget)
            if machines <= 0:
                continue
            key = PoolKey(TIER_BOUND, cluster, profile)
            tail = named is None
            if named is None:
                rows, pool = sheet.take(key, machines)
            else:
                found = pools.find(key)
                rows, pool = sheet.take_named(key, named, machines), -1 if found is None else found
            if not len(rows):
                continue
            budget -= len(rows)
            sheet.move_supply(cluster, profile, -len(rows))
            if demand.needs:
                matches = demand.matrix[:, profile]
                surplus[matches] -= len(rows) * alloc[profile]
                shrunk.update(np.flatnonzero(matches).tolist())
            sheet.log.add(
                ActionKind.RECLAIM,
                rows,
                cluster=cluster,
                pool=pool,
                tail=tail,
                grace=config.reclaim_grace_seconds,
            )


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
    now_s = inventory.seconds(sheet.now)
    budget = config.max_releases_per_cycle
    remembered = sheet.memo.release_after
    for pool, profile, hold in zip(
        idle_pools[eligible].tolist(),
        profiles[eligible].tolist(),
        holds[eligible].tolist(),
        strict=True,
    ):
        if budget <= 0:
            return
        if profile in sheet.drawn or remembered.get(pool, -np.inf) > sheet.now:
            continue
        skip = sheet.consumed.get(pool, 0)
        rows = pools.members(pool)[: max(0, pools.count(pool) - skip)]
        since = inventory.since[rows]
        expired_mask = (now_s - since) >= hold
        expired = rows[expired_mask][:budget]
        waiting = since[~expired_mask]
        if len(waiting):
            remembered[pool] = sheet.now + float(waiting.min()) + hold - now_s
        else:
            remembered.pop(pool, None)
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
