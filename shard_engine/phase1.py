"""Phase 1: walk the needs top-down and cover each deficit from free capacity.

For every need, in priority order then arrival:

1. **Have.** Supply is what the cluster's machines that match the need
   hold of it in whole units (``usable``: a 7.9-core machine holds one
   4-core pod, not two): configured, configuring, creating for it, and in
   flight or promised toward it. In-flight machines count, so a second cycle never
   provisions again for the same gap.
2. **Deficit.** ``aggregate - have`` per resource; a need within rounding of
   zero is satisfied and costs nothing more this cycle. The satisfied check
   is one matrix product per cluster, so the per-need loop below runs only
   for needs that are actually short.
3. **Topology.** A ``Same`` gang first picks one domain that can hold all
   of it (see ``topology``); a need with a spread fills domains water-level.
4. **Idle, then speculative.** Idle machines need no Create call and are
   already paid for; speculative slots come second. Within each tier the
   shape with the lowest effective cost per ``min_unit`` it actually hosts
   wins, counted so those units fit when packed (``cover_by_units``; a need
   without a unit: per dominant unit covered), and every shape must hold
   ``min_unit`` on its own (the mask says so).

Idle picks become one :class:`AssignIdle` per machine; speculative picks for
one need become one batched :class:`Provision` (recorded as segments of an
:class:`~shard_engine.actions.ActionLog`, see ``actions``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from shard_engine.actions import ActionKind
from shard_engine.binding import pinned_first
from shard_engine.catalog import ProfileCatalog
from shard_engine.claims import Claims, claim
from shard_engine.coordination import RemoteIdle, labels_satisfy
from shard_engine.costs import dominant_dimension, effective_cost
from shard_engine.fleet_idle import FleetIdle, IdleShape, OwnRack
from shard_engine.linear import combine
from shard_engine.needs import Demand, NeedsTable
from shard_engine.pending import PendingNeed
from shard_engine.pools import TIER_IDLE, TIER_SPECULATIVE, PoolKey
from shard_engine.requirements import RequirementMasks
from shard_engine.selection import cover_by_cost, cover_by_units, cover_with_spread, settle_deficit
from shard_engine.shortfalls import reported_requirements
from shard_engine.topology import SpreadState, choose_gang_domain, domain_codes
from shard_engine.usable import have_rows, usable_shapes
from shard_engine.worksheet import MemoKey, Starved, Worksheet

__all__ = [
    "assign",
    "bound_reader",
    "claim_bound",
    "claims_now",
    "cluster_have",
    "demand_supply",
    "idle_shapes",
    "memo_key",
    "shortages",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def demand_supply(demand: Demand, supply: npt.NDArray[np.int64], alloc: FloatArray) -> FloatArray:
    """Have per need of one cluster: ``matrix × supply × usable``, over held profiles only.

    A machine counts for what it holds of the need in whole units
    (``shard_engine.usable``), not for its allocatable.
    """
    held = supply.nonzero()[0]
    if len(held) == 0:
        return np.zeros_like(demand.aggregate)
    weights = demand.matrix[:, held] * supply[held]
    return have_rows(weights, usable_shapes(alloc[held], demand.min_unit))


def memo_key(sheet: Worksheet, demand: Demand) -> MemoKey:
    """What a cluster's supply-derived results depend on (see ``ClusterMemo``).

    Claims read the cluster's bindings, which a takeover changes at commit
    without moving a machine, so their version is part of it.
    """
    cluster = demand.cluster
    bindings = 0 if sheet.bindings is None else sheet.bindings.version(cluster)
    return (
        sheet.inventory.version(cluster),
        bindings,
        demand.version,
        demand.profiles,
        demand.dims,
    )


def cluster_have(
    sheet: Worksheet, demand: Demand, catalog: ProfileCatalog, tolerance: float
) -> tuple[FloatArray, list[int]]:
    """Have per need of one cluster and which needs are short, reused while nothing changed.

    A cluster this cycle already moved supply for is always recomputed from
    the worksheet; any other cluster's result is remembered under its
    inventory and needs versions, so a steady cluster costs a dictionary
    lookup per cycle. A gang whose machines cover it in total but in no one
    domain is short too (ADR 0180).
    """
    alloc = catalog.alloc
    cluster = demand.cluster
    touched = sheet.touched(cluster)
    key = memo_key(sheet, demand)
    if not touched:
        cached = sheet.memo.have.get(cluster)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
    supply = sheet.supply_row(cluster)
    claims = claims_now(sheet, demand, alloc, key)
    if claims is None:
        have = demand_supply(demand, supply, alloc)
    else:  # machines shared by several needs count for one each
        have = have_rows(claims.own * claims.sub, usable_shapes(claims.shapes, demand.min_unit))
        if claims.displaced:
            keys = demand.keys
            sheet.rebinds[cluster] = [
                (keys[j], keys[i], profile, machines)
                for j, i, profile, machines in claims.displaced
            ]
        else:
            sheet.rebinds.pop(cluster, None)
    deficit = demand.aggregate - have
    slack = demand.slack(tolerance)
    short: list[int] = np.logical_or.reduce(deficit > slack, axis=1).nonzero()[0].tolist()
    split = [
        i
        for i, gang in enumerate(demand.gang_keys)
        if gang and i not in short and not _whole_in_a_domain(sheet, demand, i, catalog, slack)
    ]
    if split:
        short = sorted((*short, *split))
    if not touched:
        sheet.memo.have[cluster] = (key, have, short)
    return have, short


def _whole_in_a_domain(
    sheet: Worksheet, demand: Demand, index: int, catalog: ProfileCatalog, slack: FloatArray
) -> bool:
    """Do the machines gang ``index`` may count hold it whole in one domain of its key?

    A gang's pods all land in one domain, so machines it holds in several
    do not cover it, however many: a cluster that held three empty servers
    of one rack and two of another counted five for a new gang of four,
    and the gang waited, never short, until its cluster gave some up (the
    `mixed` day, one day, seed 3: 4,100 s).
    """
    if demand.pinned[index] or demand.keys[index] in demand.gang_domain:
        return True  # its mask allows one domain: the have that covered it is all there
    codes = domain_codes(catalog, demand.gang_keys[index])
    supply = sheet.supply_row(demand.cluster)
    width = min(len(codes), len(supply), len(demand.matrix[index]))
    # The cluster holds a few profiles of thousands: look at those only.
    present = np.flatnonzero(supply[:width])
    present = present[demand.matrix[index][present] & (codes[present] >= 0)]
    found = codes[present]
    if len(found) and found.min() == found.max():
        # Everything it could count is in one domain: the have that covered it is there.
        return True
    own = own_supply(sheet, demand, index, catalog.alloc)[:width]
    aggregate = demand.aggregate[index]
    held = present[own[present] > 0]
    return any(
        np.all(aggregate - have <= slack[index])
        for _, _, have in _domain_haves(demand, index, codes, held, own, catalog)
    )


def _domain_haves(
    demand: Demand,
    index: int,
    codes: npt.NDArray[np.int64],
    rows: IntArray,
    own: FloatArray,
    catalog: ProfileCatalog,
) -> list[tuple[int, IntArray, FloatArray]]:
    """Per domain code among ``rows`` (profiles), its rows and what gang ``index`` has there.

    "Has" as ``_need_have`` counts it over a mask: ``own`` machines per
    profile, each hosting what its shape can of the need's ``min_unit``.
    """
    unit = demand.min_unit[index : index + 1]
    alloc = catalog.alloc
    out = []
    for code in np.unique(codes[rows]).tolist():
        there = rows[codes[rows] == code]
        out.append((int(code), there, combine(own[there], usable_shapes(alloc[there], unit)[0])))
    return out


def claims_now(
    sheet: Worksheet, demand: Demand, alloc: FloatArray, version: MemoKey | None = None
) -> Claims | None:
    """The cluster's claims on its supply as the worksheet stands, computed once per state.

    A claim reads the cluster's supply and its bound counts, and within a
    cycle those move only when supply moves toward or away from the cluster
    or the cycle names machines: the worksheet keeps one claim per such
    state, for Phase 1's needs and Phase 2's gangs alike. A cluster nothing
    touched and nothing named keeps its claims across cycles under its
    versions (``memo_key``, which a caller that read it passes as
    ``version``), as its "have" is kept.
    """
    cluster = demand.cluster
    state = sheet.count_state(cluster)
    supply = sheet.supply_row(cluster)
    if state == (0, 0) and not sheet.touched(cluster):
        version = memo_key(sheet, demand) if version is None else version
        kept = sheet.memo.claims.get(cluster)
        if kept is not None and kept[0] == version:
            return kept[1]
        claims = _claim(sheet, demand, supply, alloc)
        sheet.memo.claims[cluster] = (version, claims)
        return claims
    key = (cluster, demand.version, *state, supply.tobytes())
    if key not in sheet.claims:
        sheet.claims[key] = _claim(sheet, demand, supply, alloc)
    return sheet.claims[key]


def _claim(
    sheet: Worksheet, demand: Demand, supply: npt.NDArray[np.int64], alloc: FloatArray
) -> Claims | None:
    return claim_bound(
        sheet, demand, demand.matrix, demand.aggregate, supply, alloc, priority=demand.priority
    )


def claim_bound(
    sheet: Worksheet,
    demand: Demand,
    matrix: BoolArray,
    aggregate: FloatArray,
    supply: npt.NDArray[np.int64],
    alloc: FloatArray,
    *,
    priority: IntArray | None = None,
    settled_only: bool = False,
) -> Claims | None:
    """:func:`~shard_engine.claims.claim` over ``matrix``'s rows with the cluster's bindings.

    The bindings as counted (``Worksheet.counted``) make the claim one
    compiled call; a cluster with a pinned gang reads them through
    :func:`bound_reader`, whose pinned-first reordering is Python.
    """
    if not any(demand.pinned):
        counted = partial(sheet.counted, demand.cluster, demand.keys, settled_only=settled_only)
        return claim(matrix, aggregate, supply, alloc, priority=priority, counted=counted)
    bound = bound_reader(sheet, demand, alloc, matrix, aggregate, settled_only=settled_only)
    return claim(matrix, aggregate, supply, alloc, bound, priority)


def own_supply(sheet: Worksheet, demand: Demand, index: int, alloc: FloatArray) -> FloatArray:
    """The cluster's supply as need ``index`` may count it: less what its other needs claimed."""
    claims = claims_now(sheet, demand, alloc)
    supply = sheet.supply_row(demand.cluster)
    if claims is None:
        return supply.astype(np.float64)
    return claims.supply(index, len(supply))


def _claimed_have(sheet: Worksheet, demand: Demand, index: int, alloc: FloatArray) -> FloatArray:
    """What need ``index`` has of the cluster's supply as the worksheet stands.

    :func:`_need_have` over :func:`own_supply` and the need's own mask, read
    straight off the claims, as :func:`cluster_have` reads every need's
    (the same sums in the same order: the profiles the need does not count
    add zeros).
    """
    claims = claims_now(sheet, demand, alloc)
    if claims is None:
        return _need_have(demand, index, demand.matrix[index], sheet, alloc)
    row = slice(index, index + 1)
    have: FloatArray = have_rows(
        claims.own[row] * claims.sub[row], usable_shapes(claims.shapes, demand.min_unit[row])
    )[0]
    return have


def shortages(
    demands: list[Demand], sheet: Worksheet, catalog: ProfileCatalog, tolerance: float
) -> list[tuple[Demand, int]]:
    """Needs short of anything, in cycle order (priority descending, then arrival)."""
    found: list[tuple[int, int, Demand, int]] = []
    for demand in demands:
        if not demand.needs:
            continue
        _, short = cluster_have(sheet, demand, catalog, tolerance)
        for i in short:
            found.append((-int(demand.priority[i]), int(demand.arrival[i]), demand, i))
    found.sort(key=lambda t: (t[0], t[1]))
    return [(demand, i) for _, _, demand, i in found]


def bound_reader(
    sheet: Worksheet,
    demand: Demand,
    alloc: FloatArray,
    matrix: BoolArray,
    aggregate: FloatArray,
    *,
    settled_only: bool = False,
) -> Callable[[IntArray], FloatArray | None]:
    """What :func:`~shard_engine.claims.claim` asks for as ``bound``: the cluster's bindings
    over the profiles it holds, a pinned gang's rack counted for it first
    (:func:`~shard_engine.binding.pinned_first`).

    ``matrix`` and ``aggregate`` are the rows the claim divides supply among
    (the compiled demand's, or Phase 3's peaks, whose first rows are the same needs).
    """

    def read(held: IntArray) -> FloatArray | None:
        placed = sheet.bound(demand.cluster, demand.keys, held, settled_only=settled_only)
        if placed is None or not any(demand.pinned):
            return placed
        loose = [bool(g) and not p for g, p in zip(demand.gang_keys, demand.pinned, strict=True)]
        return pinned_first(placed, demand.pinned, loose, matrix[:, held], aggregate, alloc[held])

    return read


def _need_have(
    demand: Demand,
    index: int,
    mask: BoolArray,
    sheet: Worksheet,
    alloc: FloatArray,
    row: FloatArray | None = None,
) -> FloatArray:
    supply: FloatArray = sheet.supply_row(demand.cluster).astype(np.float64) if row is None else row
    held = (supply * mask).nonzero()[0]
    usable = usable_shapes(alloc[held], demand.min_unit[index : index + 1])[0]
    result = combine(supply[held], usable)
    return result


def assign(
    *,
    sheet: Worksheet,
    table: NeedsTable,
    demands: list[Demand],
    catalog: ProfileCatalog,
    masks: RequirementMasks,
    tolerance: float,
    max_spread_steps: int,
    fleet: FleetIdle | None = None,
    ages: Mapping[tuple[int, str], int] | None = None,
) -> list[PendingNeed]:
    """Run Phase 1 over every short need; return those still short, in cycle order.

    ``fleet`` holds the idle machines other shards reported: a need one of
    them fits waits for it (a shortfall the coordinator answers with an idle
    transfer) instead of drawing on speculative capacity, for a while. It
    also holds the other shards' shortfalls: a need leaves its shard's idle
    machines to an older one of them that could use them (ADR 0176), judged
    against ``ages``, the cycles each of this shard's needs has been short.
    """
    alloc = catalog.alloc
    names = catalog.dims.names
    pending: list[PendingNeed] = []
    price = catalog.price
    probability = catalog.interruption_probability
    for demand, index in shortages(demands, sheet, catalog, tolerance):
        need = demand.needs[index]
        aggregate = demand.aggregate[index]
        mask = demand.matrix[index]
        block = ""
        gang = demand.gang_keys[index]
        scope = masks.mask(demand.mask_keys[index]) if gang else mask
        untouched = not sheet.touched(demand.cluster)
        starved_key = (demand.cluster, demand.keys[index])
        before = memo_key(sheet, demand)
        arrivals = int(sheet.inventory.free_arrivals[scope].sum()) if untouched else -1
        if untouched:
            starved = sheet.memo.starved.get(starved_key)
            if starved is not None and starved.key == before and starved.arrivals == arrivals:
                pending.append(
                    PendingNeed(
                        demand,
                        index,
                        starved.deficit.copy(),
                        starved.mask,
                        starved.block,
                        domain=starved.domain,
                    )
                )
                continue
        took = False
        have: FloatArray | None = None
        if not gang and untouched:
            have = cluster_have(sheet, demand, catalog, tolerance)[0][index]
        own: FloatArray | None = None
        # Oldest first, fleet-wide: an older (or more important) shortfall of another
        # shard that this shard's idle machines could serve gets them (ADR 0176).
        yielded = fleet is not None and _yields(
            fleet, sheet, catalog, demand, index, scope, (ages or {}).get(starved_key, 0)
        )
        if gang:
            own = own_supply(sheet, demand, index, alloc)
            base = masks.mask(demand.mask_keys[index])
            codes = domain_codes(catalog, gang)
            idle = sheet.free[TIER_IDLE].astype(np.float64)
            if yielded:
                idle = np.zeros_like(idle)
            free = idle + sheet.free[TIER_SPECULATIVE]
            entry = table.entry(demand.cluster)
            previous = entry.gang_domain.get(demand.keys[index]) if entry is not None else None
            choice = choose_gang_domain(
                codes=codes,
                mask=base,
                held=own,
                available=free,
                aggregate=aggregate,
                alloc=alloc,
                previous=previous,
                tolerance=tolerance,
                idle=idle,
            )
            if choice.domain is None:
                block = choice.reason
                mask = base & (codes == previous) if previous is not None else base
            else:
                mask = base & (codes == choice.domain)
                if choice.domain != previous:
                    sheet.gang_choices[(demand.cluster, demand.keys[index])] = choice.domain
        if have is None:
            if own is None:  # not a gang: its claim, over its own mask
                have = _claimed_have(sheet, demand, index, alloc)
            else:
                have = _need_have(demand, index, mask, sheet, alloc, own)
        deficit = aggregate - have
        deficit = np.where(deficit > demand.slack(tolerance)[index], deficit, 0.0)
        # A blocked gang is short even when its machines in several domains add up to it.
        if block and (np.count_nonzero(deficit) or (gang and not demand.pinned[index])):
            # A gang no domain can hold is short of a whole domain, not of the sum of
            # what several domains lack: it asks the coordinator for all of it, which
            # one donor's rack can then give whole (ADR 0126). A pinned gang (its
            # running pods hold a rack, which its Same requirement names) can only
            # grow where it runs: it asks for what that rack lacks of it, or no donor
            # could ever complete the rack around the machines it already has (ADR 0160).
            # A gang that holds at least half of itself in one domain but runs nothing,
            # where other shards hold idle machines that would complete it, asks for what
            # that domain lacks and names it: completing it reuses idle machines and moves
            # fewer than a whole domain elsewhere would (ADR 0180).
            whole = gang and not demand.pinned[index]
            named = ""
            if whole and own is not None and fleet is not None and fleet.offers:
                named, lacking = _held_domain(
                    catalog, demand, index, base, own, tolerance, fleet.offers
                )
                if named:
                    deficit = lacking
            deficit = aggregate.copy() if whole and not named else np.maximum(deficit, 0.0)
            pending.append(PendingNeed(demand, index, deficit, mask, block, domain=named))
            if untouched and not yielded:  # a yield ends by the clock: look again
                sheet.memo.starved[starved_key] = Starved(
                    before, arrivals, deficit.copy(), mask, block, scope, named
                )
            continue
        if block or not np.count_nonzero(deficit):
            sheet.memo.starved.pop(starved_key, None)
            if fleet is not None and not np.count_nonzero(deficit):
                fleet.met(demand.cluster, demand.keys[index])
            continue
        spread = None
        awaiting = False
        if need.spread:
            spread = SpreadState(
                catalog=catalog,
                spreads=need.spread,
                mask=mask,
                present=sheet.inventory.members > 0,
                held=(sheet.supply_row(demand.cluster) * mask).astype(np.float64),
            )
        if spread is None:
            # A need with a unit is covered by units hosted (shape per pod, ADR 0127).
            unit = demand.min_unit[index] if np.count_nonzero(demand.min_unit[index]) else None
            # A gang may be served from another shard's rack only while it holds none of
            # its machines (ADR 0172). Then, when its rack's idle machines cannot hold it
            # whole, it asks before taking any of them: a few idle machines here plus new
            # ones would cost servers a rack of idle ones elsewhere saves.
            movable = bool(gang) and not demand.pinned[index] and not np.count_nonzero(have)
            wait_at = (
                TIER_IDLE
                if movable
                and fleet is not None
                and not _idle_holds(sheet, mask, alloc, deficit, demand.slack(tolerance)[index])
                else TIER_SPECULATIVE
            )
            # Such a gang may also wait for a domain completed with the donors' unclaimed
            # slots there, if that reuses more idle machines (ADR 0173).
            own_racks = (
                _own_racks(sheet, catalog, masks.mask(demand.mask_keys[index]), gang)
                if wait_at == TIER_IDLE and fleet is not None
                else None
            )
            for tier in (TIER_IDLE, TIER_SPECULATIVE):
                if not np.count_nonzero(deficit):
                    break
                if (
                    tier == wait_at
                    and fleet is not None
                    and fleet.wait(
                        cluster=demand.cluster,
                        key=demand.keys[index],
                        need=need,
                        deficit={names[d]: float(deficit[d]) for d in np.flatnonzero(deficit)},
                        now=sheet.now,
                        holds_none=not gang or (movable and not took),
                        own=own_racks,
                    )
                ):
                    awaiting = True
                    break
                candidates = (mask & (sheet.free[tier] > 0)).nonzero()[0]
                if len(candidates) == 0:
                    continue
                if tier == TIER_IDLE and yielded:
                    continue  # an older need of another shard gets them (ADR 0176)
                cost = effective_cost(
                    price[candidates], probability[candidates], need.interruption_penalty
                )
                if unit is not None:
                    picks, deficit = cover_by_units(
                        deficit=deficit,
                        aggregate=aggregate,
                        unit=unit,
                        available=sheet.free[tier][candidates],
                        alloc=alloc[candidates],
                        cost=cost,
                        tolerance=tolerance,
                    )
                else:
                    picks, deficit = cover_by_cost(
                        deficit=deficit,
                        aggregate=aggregate,
                        available=sheet.free[tier][candidates],
                        alloc=alloc[candidates],
                        cost=cost,
                        names=names,
                        tolerance=tolerance,
                    )
                _emit(sheet, demand, index, tier, candidates, picks)
                took = took or bool(picks)
        else:
            # A need that yields leaves the idle tier to the older want (ADR 0176).
            deficit, blocked, took = _fill_spread(
                sheet,
                demand,
                index,
                mask,
                deficit,
                spread,
                catalog,
                tolerance,
                max_spread_steps,
                idle_too=not yielded,
            )
            if blocked and np.count_nonzero(deficit):
                block = "hard topology spread leaves no allowed domain with free capacity"
        if np.count_nonzero(deficit):
            pending.append(
                PendingNeed(demand, index, deficit, mask, block, awaiting_transfer=awaiting)
            )
        if untouched and not took and np.count_nonzero(deficit) and not awaiting and not yielded:
            sheet.memo.starved[starved_key] = Starved(
                before, arrivals, deficit.copy(), mask, block, scope
            )
        else:
            sheet.memo.starved.pop(starved_key, None)
    return pending


def _yields(
    fleet: FleetIdle,
    sheet: Worksheet,
    catalog: ProfileCatalog,
    demand: Demand,
    index: int,
    scope: BoolArray,
    age_cycles: int,
) -> bool:
    """Does need ``index`` leave the idle machines ``scope`` allows to another shard's want?"""
    if not fleet.wants:
        return False
    idle = np.flatnonzero(scope & (sheet.free[TIER_IDLE] > 0))
    if len(idle) == 0:
        return False
    return fleet.yields(
        cluster=demand.cluster,
        key=demand.keys[index],
        need=demand.needs[index],
        age_cycles=age_cycles,
        idle=idle_shapes(catalog, idle.tolist(), sheet.free[TIER_IDLE][idle].tolist()),
        now=sheet.now,
    )


def idle_shapes(
    catalog: ProfileCatalog, profiles: Sequence[int], counts: Sequence[int]
) -> list[IdleShape]:
    """Machines of these profiles, so many of each, as ``FleetIdle.yields`` reads them."""
    names = catalog.dims.names
    return [
        IdleShape(
            labels=catalog.labels(p),
            allocatable={
                names[d]: float(catalog.alloc[p, d]) for d in np.flatnonzero(catalog.alloc[p])
            },
            count=int(n),
        )
        for p, n in zip(profiles, counts, strict=True)
    ]


def _held_domain(
    catalog: ProfileCatalog,
    demand: Demand,
    index: int,
    base: BoolArray,
    own: FloatArray,
    tolerance: float,
    offers: Sequence[RemoteIdle],
) -> tuple[str, FloatArray]:
    """The domain blocked gang ``index`` holds at least half of itself in, and what it lacks there.

    ``own`` is the cluster's supply as the gang may count it. Of the domains
    its mask allows, the one holding the largest share of the gang (its
    positive dimensions averaged, as :func:`choose_gang_domain` scores them)
    is named when that share is at least half, and when the other shards'
    idle machines there (``offers``, with the unclaimed slots offered beside
    them) hold what it lacks: completing it then reuses machines already
    paid for and moves no more of them than the gang already holds there.
    ("", zeros) when no domain qualifies, or the gang spans several topology
    keys (a domain is then a combination the wire cannot name in one value).
    """
    gang = demand.gang_keys[index]
    aggregate = demand.aggregate[index]
    nothing = ("", np.zeros_like(aggregate))
    positive = aggregate > 0
    if len(gang) != 1 or not positive.any():
        return nothing
    codes = domain_codes(catalog, gang)
    holding = np.flatnonzero(base & (codes >= 0) & (own > 0))
    best: tuple[float, IntArray, FloatArray] | None = None
    for _, rows, have in _domain_haves(demand, index, codes, holding, own, catalog):
        share = float(
            (np.minimum(have[positive], aggregate[positive]) / aggregate[positive]).mean()
        )
        if best is None or share > best[0] + 1e-12:
            best = (share, rows, have)
    if best is None or best[0] < 0.5 - 1e-9:
        return nothing
    _, rows, have = best
    lacking = settle_deficit(np.maximum(aggregate - have, 0.0), aggregate, tolerance)
    value = catalog.labels(int(rows[0])).get(gang[0], "")
    if not np.count_nonzero(lacking) or not value:
        return nothing
    there = reported_requirements(demand.needs[index].requirements, value)
    names = catalog.dims.names
    offered = np.zeros_like(aggregate)
    for offer in offers:
        if offer.labels.get(gang[0]) != value or not labels_satisfy(there, offer.labels):
            continue
        shape = np.array([offer.allocatable.get(name, 0.0) for name in names])
        offered += (offer.count + offer.speculative) * shape
    if np.any(offered[lacking > 0] + 1e-9 < lacking[lacking > 0]):
        return nothing
    return value, lacking


def _own_racks(
    sheet: Worksheet, catalog: ProfileCatalog, base: BoolArray, keys: Sequence[str]
) -> dict[tuple[str, ...], OwnRack]:
    """The shard's free machines per domain of a gang (its ``Same`` label values).

    Only the profiles ``base`` (the gang's requirements, every domain) allows
    that hold an idle machine or an unclaimed slot; the domains a few racks
    at most, so a loop over them costs little beside the cycle.
    """
    idle = sheet.free[TIER_IDLE]
    spec = sheet.free[TIER_SPECULATIVE]
    codes = domain_codes(catalog, keys)
    names = catalog.dims.names
    out: dict[tuple[str, ...], tuple[dict[str, float], dict[str, float]]] = {}
    for i in np.flatnonzero(base & (codes >= 0) & ((idle > 0) | (spec > 0))).tolist():
        labels = catalog.labels(i)
        paid, free = out.setdefault(tuple(labels.get(k, "") for k in keys), ({}, {}))
        row = catalog.alloc[i]
        for d in np.flatnonzero(row).tolist():
            name = names[d]
            paid[name] = paid.get(name, 0.0) + float(idle[i]) * float(row[d])
            free[name] = free.get(name, 0.0) + float(idle[i] + spec[i]) * float(row[d])
    return {key: OwnRack(paid, free) for key, (paid, free) in out.items()}


def _idle_holds(
    sheet: Worksheet, mask: BoolArray, alloc: FloatArray, deficit: FloatArray, slack: FloatArray
) -> bool:
    """Do the shard's idle machines that ``mask`` allows cover ``deficit`` (within ``slack``)?"""
    idle = np.flatnonzero(mask & (sheet.free[TIER_IDLE] > 0))
    if len(idle) == 0:
        return False
    room = combine(sheet.free[TIER_IDLE][idle].astype(np.float64), alloc[idle])
    return not bool(np.any(deficit - room > slack))


def _fill_spread(
    sheet: Worksheet,
    demand: Demand,
    index: int,
    mask: BoolArray,
    deficit: FloatArray,
    spread: SpreadState,
    catalog: ProfileCatalog,
    tolerance: float,
    max_steps: int,
    *,
    idle_too: bool = True,
) -> tuple[FloatArray, bool, bool]:
    """Water-fill a spread need from idle and speculative capacity together.

    Both tiers are candidates at once, because filling idle first and
    speculative second would stop at the skew limit in the zones that have
    idle machines and leave idle machines a later cycle would still take.
    The emptiest allowed domain wins; within it idle beats speculative, and
    cheaper effective cost per dominant unit beats dearer. Returns the
    residual deficit, whether a hard spread blocked progress, and whether
    anything was taken. Without ``idle_too`` (the need yields its shard's idle
    machines to an older want of another shard, ADR 0176) speculative only.
    """
    alloc = catalog.alloc
    need = demand.needs[index]
    idle = np.flatnonzero(mask & (sheet.free[TIER_IDLE] > 0)) if idle_too else np.zeros(0, np.intp)
    spec = np.flatnonzero(mask & (sheet.free[TIER_SPECULATIVE] > 0))
    profiles = np.concatenate([idle, spec]).astype(np.int64)
    if len(profiles) == 0:
        return deficit, False, False
    tiers = np.concatenate(
        [np.full(len(idle), TIER_IDLE), np.full(len(spec), TIER_SPECULATIVE)]
    ).astype(np.int64)
    available = np.concatenate(
        [sheet.free[TIER_IDLE][idle], sheet.free[TIER_SPECULATIVE][spec]]
    ).astype(np.int64)
    shapes = alloc[profiles]
    cost = effective_cost(
        catalog.price[profiles],
        catalog.interruption_probability[profiles],
        need.interruption_penalty,
    )
    dstar = dominant_dimension(deficit, shapes.max(axis=0), catalog.dims.names)
    unit = shapes[:, dstar] if dstar is not None else np.ones(len(profiles))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_unit = np.where(unit > 0, cost / unit, np.inf)
    rank = np.empty(len(profiles))
    rank[np.lexsort((per_unit, tiers))] = np.arange(len(profiles), dtype=np.float64)
    picks, deficit, blocked = cover_with_spread(
        deficit=deficit,
        aggregate=demand.aggregate[index],
        available=available,
        alloc=shapes,
        profiles=profiles,
        preference=rank,
        spread=spread,
        max_steps=max_steps,
        tolerance=tolerance,
    )
    for tier in (TIER_IDLE, TIER_SPECULATIVE):
        chosen = [(g, n) for g, n in picks if int(tiers[g]) == tier]
        _emit(sheet, demand, index, tier, profiles, chosen)
    return deficit, blocked, bool(picks)


def _emit(
    sheet: Worksheet,
    demand: Demand,
    index: int,
    tier: int,
    candidates: npt.NDArray[np.intp],
    picks: list[tuple[int, int]],
) -> None:
    """Turn picks into rows taken from the pools, supply moved, and actions.

    Idle picks are one AssignIdle per machine; speculative picks for one
    need are one batched Provision (its segments after the first join it).
    """
    cluster = demand.cluster
    need = demand.needs[index]
    ref = (demand.keys[index], need.requirements)
    priority = need.priority
    kind = ActionKind.ASSIGN_IDLE if tier == TIER_IDLE else ActionKind.PROVISION
    opened = False
    for group, machines in picks:
        profile = int(candidates[group])
        rows, pool = sheet.take(PoolKey(tier, -1, profile), machines)
        sheet.move_supply(cluster, profile, len(rows))
        sheet.pick(cluster, demand.keys[index], profile, len(rows))
        sheet.drawn.add(profile)
        if not len(rows):
            continue
        sheet.log.add(
            kind,
            rows,
            cluster=cluster,
            pool=pool,
            need=ref,
            priority=priority,
            opens=tier == TIER_IDLE or not opened,
        )
        opened = True
