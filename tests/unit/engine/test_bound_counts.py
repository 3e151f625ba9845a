"""Bound machines counted from counts kept per pool are the ones a recount finds.

``Worksheet.bound`` no longer walks a cluster's few thousand bound machines
each time it is asked: each bound pool's members per binding code are kept
under the pool's generation (``PoolCodes``), and a count takes off the rows
the cycle took and adds the machines in flight. Here every count of every
cycle of a churning shard is checked against the definition, read from
scratch: the machines of the cluster's bound pools not taken this cycle,
plus those in flight toward it, none named this cycle, per need they are
bound to and profile. The shard leaves part of each plan in flight, forgets
machines, and re-reads bindings from provider attributions, so counts are
read across every way a pool or a binding changes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest

from bench.cycle import RECLAIM_AT_ONCE, World, build, carry, churn, outcome
from shard_engine import phase1, preemption
from shard_engine.binding import Bindings
from shard_engine.claims import Claims, claim
from shard_engine.engine import EngineConfig
from shard_engine.model import Provision
from shard_engine.needs import Demand
from shard_engine.worksheet import Counted, Worksheet


def recounted(
    sheet: Worksheet,
    cluster: int,
    keys: Sequence[str],
    settled_only: bool,
    *,
    picks: bool = False,
) -> Counted:
    """The count by its definition, every row read; with ``picks``, this cycle's placements.

    A machine the cycle placed for a need counts as bound to it (``Worksheet.pick``),
    in the count a claim reads (``Worksheet.bound``); the rows' own count
    (``Worksheet._bound``) is of bindings only.
    """
    assert sheet.bindings is not None
    pools = sheet.inventory.pools
    rows: list[int] = []
    for pool in pools.by_cluster.get(cluster, []):
        rows += pools.members(pool)[: pools.count(pool) - sheet.consumed.get(pool, 0)].tolist()
    if not settled_only and sheet.flying is not None:
        rows += list(sheet.flying(cluster))
    profiles = sheet.inventory.profile
    counts: dict[int, np.ndarray] = {}
    for row in rows:
        bound = sheet.bindings.need_of(row)
        if row in sheet.taken or bound is None or bound[0] != cluster or bound[1] not in keys:
            continue
        column = counts.setdefault(int(profiles[row]), np.zeros(len(keys)))
        column[list(keys).index(bound[1])] += 1
    if picks and not settled_only:
        for (key, profile), machines in sheet.picked.get(cluster, {}).items():
            if key in keys:
                column = counts.setdefault(profile, np.zeros(len(keys)))
                column[list(keys).index(key)] += machines
    present = sorted(counts)
    table = np.array([counts[p] for p in present]).T if present else np.zeros((len(keys), 0))
    return np.array(present, dtype=np.int64), table


@contextmanager
def checked() -> Iterator[list[int]]:
    """Check every count a cycle makes; yields how many were checked (and found any)."""
    original = Worksheet._bound
    seen = [0, 0]

    def compare(
        self: Worksheet, cluster: int, keys: Sequence[str], *, settled_only: bool
    ) -> Counted | None:
        got = original(self, cluster, keys, settled_only=settled_only)
        present, table = recounted(self, cluster, keys, settled_only)
        seen[0] += 1
        if got is None:
            assert not table.any(), (cluster, settled_only)
        else:
            seen[1] += 1
            assert got[0].tolist() == present.tolist(), (cluster, settled_only)
            assert got[1].tolist() == table.tolist(), (cluster, settled_only)
        return got

    Worksheet._bound = compare  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Worksheet._bound = original  # type: ignore[method-assign]


def unsettled(world: World, plan_actions: Sequence[object], rng: random.Random) -> None:
    """Settle most actions; leave some in flight, forget a few machines, re-read others."""
    engine = world.engine
    for action in plan_actions:
        ids = action.machine_ids if isinstance(action, Provision) else (action.machine_id,)  # type: ignore[attr-defined]
        for machine_id in ids:
            draw = rng.random()
            if draw < 0.25:
                continue  # still in flight next cycle
            found = outcome(engine, action, machine_id)
            if draw < 0.28 and found is not None:
                engine.settle(machine_id, None, now=world.now)
                engine.remove_machine(machine_id)
                continue
            engine.settle(machine_id, found, now=world.now)
            if draw > 0.95 and found is not None and found.cluster:
                # A restart reads the binding back from the attribution.
                key = engine.placed_for(machine_id)
                engine.upsert_machine(replace(found), now=world.now, need_key=key)


def _shard(seed: int, config: EngineConfig | None) -> World:
    """The churning shard these tests run: 8 clusters of 6 needs on 4,000 machines."""
    return build(
        machines=4_000,
        clusters=8,
        needs_per_cluster=6,
        types=6,
        zones=3,
        racks=4,
        seed=seed,
        config=config,
    )


@pytest.mark.parametrize(
    ("seed", "config"),
    [(1, RECLAIM_AT_ONCE), (2, RECLAIM_AT_ONCE), (3, None), (4, EngineConfig())],
)
def test_every_bound_count_of_a_churning_shard_is_the_recount(
    seed: int, config: EngineConfig | None
) -> None:
    world = _shard(seed, config)
    rng = random.Random(seed)
    plan = world.engine.cycle(now=world.now)
    with checked() as seen:
        for n in range(25):
            if n % 3 == 0:
                carry(world, plan)
            else:
                unsettled(world, plan.actions, rng)
            churn(world, rng, pending=0.2, excess=0.2, grow=30)
            world.now += 1
            plan = world.engine.cycle(now=world.now)
    # The counts checked were many, and most found machines bound.
    assert seen[0] > 100 and seen[1] > seen[0] // 2


def test_rows_named_or_taken_from_a_tail_this_cycle_are_not_counted() -> None:
    """A row named this cycle (a release, a verify) is out of the count, once, wherever it sits."""
    world = build(
        machines=3_000, clusters=4, needs_per_cluster=5, types=5, zones=2, racks=2, seed=9
    )
    engine = world.engine
    plan = engine.cycle(now=world.now)
    carry(world, plan)
    world.now += 1
    inventory = engine._inventory
    pools = inventory.pools
    rng = random.Random(9)
    checked_rows = 0
    for cluster in range(4):
        demand = engine._table.demand(engine._table.entry(cluster))  # type: ignore[arg-type]
        sheet = Worksheet(
            inventory,
            world.now,
            engine._memo,
            bindings=engine._bindings,
            flying=engine._flying_toward(),
        )
        before = sheet._bound(cluster, demand.keys, settled_only=False)
        assert before is not None
        mine = pools.by_cluster[cluster]
        for pool in mine[:2]:  # take from two tails, as a claim or a preemption would
            sheet.take(pools.key(pool), rng.randint(1, pools.count(pool)))
        for pool in mine:  # and name rows anywhere, some inside those tails
            members = pools.members(pool).tolist()
            sheet.taken.update(rng.sample(members, min(len(members), 3)))
        checked_rows += len(sheet.taken)
        got = sheet._bound(cluster, demand.keys, settled_only=False)
        present, table = recounted(sheet, cluster, demand.keys, settled_only=False)
        assert got is not None and table.any()
        assert got[0].tolist() == present.tolist()
        assert got[1].tolist() == table.tolist()
        assert got[1].sum() < before[1].sum()
    assert checked_rows > 20


@pytest.mark.parametrize("seed", [5, 7])
def test_every_count_and_have_reused_across_cycles_is_what_a_fresh_one_gives(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results kept under a cluster's versions are never stale when read again.

    Counts and "have" are reused while the cluster's inventory and bindings
    versions stand still; a bindings version moves only for bindings that can
    enter the cluster's counts (an idle machine placed anew is still bound to
    the need of the cluster it left, ADR 0165). With reclaims at once, idle
    machines go from cluster to cluster every cycle: each reused result is
    checked against one computed from scratch. (Keying "have" without the
    bindings version fails here: a takeover changes what a need counts
    without moving a machine.)
    """
    world = _shard(seed, RECLAIM_AT_ONCE)
    engine = world.engine
    rng = random.Random(seed)
    original_bound = Worksheet.bound
    original_have = phase1.cluster_have
    checked = {
        "counts": 0,
        "haves": 0,
        "moved to another cluster": 0,
        "claims kept": 0,
        "kept with machines named": 0,
    }

    def bound(
        self: Worksheet,
        cluster: int,
        keys: Sequence[str],
        columns: np.ndarray,
        *,
        settled_only: bool = False,
    ) -> np.ndarray | None:
        got = original_bound(self, cluster, keys, columns, settled_only=settled_only)
        present, table = recounted(self, cluster, keys, settled_only, picks=True)
        expected = np.zeros((len(keys), len(columns)))
        for c, profile in enumerate(columns.tolist()):
            if profile in present.tolist():
                expected[:, c] = table[:, present.tolist().index(profile)]
        if got is None:
            assert not expected.any(), (cluster, settled_only)
        else:
            assert got.tolist() == expected.tolist(), (cluster, settled_only)
        checked["counts"] += 1
        return got

    def have(
        sheet: Worksheet, demand: object, catalog: object, tolerance: float
    ) -> tuple[np.ndarray, list[int]]:
        got = original_have(sheet, demand, catalog, tolerance)  # type: ignore[arg-type]
        cluster = demand.cluster  # type: ignore[attr-defined]
        kept = sheet.memo.have.pop(cluster, None)
        fresh = original_have(sheet, demand, catalog, tolerance)  # type: ignore[arg-type]
        if kept is not None:
            sheet.memo.have[cluster] = kept
        assert got[0].tolist() == fresh[0].tolist(), cluster
        assert got[1] == fresh[1], cluster
        checked["haves"] += 1
        return got

    original_claims = phase1.claims_now

    def claims_now(
        sheet: Worksheet, demand: Demand, alloc: np.ndarray, version: object = None
    ) -> Claims | None:
        known = (len(sheet.claims), sheet.memo.claims.get(demand.cluster))
        got = original_claims(sheet, demand, alloc, version)  # type: ignore[arg-type]
        assert _same_claims(got, _fresh_claims(sheet, demand)), demand.cluster
        now = (len(sheet.claims), sheet.memo.claims.get(demand.cluster))
        if now[0] == known[0] and now[1] is known[1]:  # kept this cycle or across cycles
            checked["claims kept"] += 1
            checked["kept with machines named"] += bool(sheet.taken)
        return got

    bindings = engine._bindings
    before = bindings.codes.copy()
    monkeypatch.setattr(Worksheet, "bound", bound)
    monkeypatch.setattr(phase1, "cluster_have", have)
    monkeypatch.setattr(phase1, "claims_now", claims_now)
    monkeypatch.setattr(preemption, "claims_now", claims_now)
    plan = engine.cycle(now=world.now)
    for n in range(60):
        if n % 4 == 3:
            unsettled(world, plan.actions, rng)
        else:
            carry(world, plan)
        churn(world, rng, pending=0.2, excess=0.2, grow=30)
        world.now += 1
        plan = engine.cycle(now=world.now)
        codes = bindings.codes
        width = min(len(codes), len(before))
        was, now = before[:width], codes[:width]
        # Rows now bound to a need of another cluster than before: the idle reuse
        # whose old cluster's version no longer moves.
        again = (was >= 0) & (now >= 0)
        elsewhere = bindings._cluster[was[again]] != bindings._cluster[now[again]]
        checked["moved to another cluster"] += int(elsewhere.sum())
        before = codes.copy()
    assert checked["counts"] > 100 and checked["haves"] > 100
    assert checked["moved to another cluster"] > 10, checked
    assert checked["claims kept"] > 20 and checked["kept with machines named"] > 5, checked


def test_placing_an_idle_machine_anew_moves_only_the_versions_of_clusters_that_count_it() -> None:
    """The cluster an idle machine last served keeps its bindings version when it is placed anew."""
    holding = {7: 0}  # row 7 counts for cluster 0 only
    bindings = Bindings(
        holds=lambda rows, clusters: np.array(
            [holding.get(int(r)) == int(c) for r, c in zip(rows, clusters, strict=True)]
        )
    )
    bindings.bind([7, 8], 1, "old")  # both were placed for cluster 1's need "old"
    before = (bindings.version(0), bindings.version(1))
    bindings.bind([8], 0, "new")  # row 8 left cluster 1 (counts for nobody) and is placed anew
    assert bindings.version(1) == before[1]  # cluster 1 never counted it again
    assert bindings.version(0) == before[0] + 1
    bindings.bind([7], 0, "new")  # row 7 counts for cluster 0: its old cluster's changes do not
    assert bindings.version(1) == before[1]
    holding[9] = 1
    bindings.bind([9], 1, "old")
    placed = bindings.version(1)
    bindings.bind([9], 1, "other")  # a takeover inside cluster 1 moves it
    assert bindings.version(1) != placed
    assert Bindings().version(3) == 0


def test_a_binding_asks_whether_a_machine_counts_only_for_clusters_it_does_not_bind_to() -> None:
    """A version is compared for equality only, so a cluster being bound to needs no check."""
    asked: list[tuple[int, int]] = []

    def holds(rows: np.ndarray, clusters: np.ndarray) -> np.ndarray:
        asked.extend(zip(rows.tolist(), clusters.tolist(), strict=True))
        return np.ones(len(rows), dtype=np.bool_)

    bindings = Bindings(holds=holds)
    bindings.bind_all([(np.array([1, 2]), 0, "a"), (np.array([3]), 1, "b")])
    assert asked == []  # nothing was bound before
    bindings.bind([1, 2], 0, "c")  # a takeover inside cluster 0
    assert asked == []
    versions = (bindings.version(0), bindings.version(1), bindings.version(2))
    bindings.bind_all([(np.array([1]), 1, "b"), (np.array([3]), 2, "d")])
    # Row 1 leaves cluster 0 for cluster 1 (cluster 0 is asked about); row 3
    # leaves cluster 1, which this commit binds to anyway (not asked).
    assert asked == [(1, 0)]
    assert all(bindings.version(c) != v for c, v in enumerate(versions))


def _worksheet(world: World) -> Worksheet:
    """A cycle's worksheet as ``ShardEngine.cycle`` opens it."""
    engine = world.engine
    engine._catalog.ensure_dimensions()
    engine._inventory.ensure_tables()
    return Worksheet(
        engine._inventory,
        world.now,
        engine._memo,
        bindings=engine._bindings,
        flying=engine._flying_toward(),
    )


def _fresh_claims(sheet: Worksheet, demand: Demand) -> Claims | None:
    alloc = sheet.inventory.catalog.alloc
    reader = phase1.bound_reader(sheet, demand, alloc, demand.matrix, demand.aggregate)
    supply = sheet.supply_row(demand.cluster)
    return claim(demand.matrix, demand.aggregate, supply, alloc, reader, demand.priority)


def _same_claims(got: Claims | None, fresh: Claims | None) -> bool:
    if got is None or fresh is None:
        return got is fresh
    return (
        got.held.tolist() == fresh.held.tolist()
        and got.own.tolist() == fresh.own.tolist()
        and got.displaced == fresh.displaced
    )


@pytest.mark.parametrize("where", ["bound pool", "in flight"])
def test_a_machine_the_cycle_names_leaves_its_clusters_counts_and_claims_at_once(
    where: str,
) -> None:
    """Counts and claims kept within a cycle, or across cycles, follow the machines named.

    A machine the cycle names (promised, released, verified) is left out of
    its cluster's counts, whether it sits in one of the cluster's bound pools
    or is in flight toward it. A count or claim read before the naming is not
    the answer after it, and one read while a machine was named is not kept
    for a cycle that names none (``Worksheet.count_state``).
    """
    world = _shard(5, RECLAIM_AT_ONCE)
    engine = world.engine
    rng = random.Random(5)
    plan = engine.cycle(now=world.now)
    for _ in range(5):
        carry(world, plan)
        churn(world, rng, pending=0.2, excess=0.2, grow=30)
        world.now += 1
        plan = engine.cycle(now=world.now)
    if where == "in flight":
        churn(world, rng, pending=0.2, excess=0.2, grow=30)
        world.now += 1
        plan = engine.cycle(now=world.now)  # its plan stays in flight
    demands = [engine._table.demand(e) for e in engine._table.entries() if e.applied_ns]
    sheet = _worksheet(world)
    bindings = engine._bindings
    pools = sheet.inventory.pools
    chosen: tuple[Demand, int] | None = None
    for demand in demands:
        if where == "bound pool":
            rows = [
                row
                for pool in pools.by_cluster.get(demand.cluster, [])
                for row in pools.members(pool)[: pools.count(pool)].tolist()
            ]
        else:
            rows = list(sheet.flying(demand.cluster)) if sheet.flying is not None else []
        for row in rows:
            bound = bindings.need_of(row)
            if bound is not None and bound[0] == demand.cluster and bound[1] in demand.keys:
                chosen = (demand, row)
                break
        if chosen is not None and _fresh_claims(sheet, chosen[0]) is not None:
            break
        chosen = None
    assert chosen is not None, f"no cluster with a machine {where} bound to its needs"
    demand, row = chosen
    keys = demand.keys
    columns = np.arange(len(sheet.inventory.catalog), dtype=np.int64)
    alloc = sheet.inventory.catalog.alloc

    def count(at: Worksheet) -> list[list[float]]:
        got = at.bound(demand.cluster, keys, columns)
        return [] if got is None else got.tolist()

    before = count(sheet)
    claims_before = phase1.claims_now(sheet, demand, alloc)
    sheet.taken.add(row)  # as a promise or a release names it
    after = count(sheet)
    assert after != before
    present, table = recounted(sheet, demand.cluster, keys, False)
    expected = np.zeros((len(keys), len(columns)))
    expected[:, present] = table
    assert after == expected.tolist()
    named = phase1.claims_now(sheet, demand, alloc)
    assert named is not claims_before
    assert _same_claims(named, _fresh_claims(sheet, demand))
    # A cycle that names it before its first read does not take what was kept unnamed...
    named_first = _worksheet(world)
    named_first.taken.add(row)
    assert count(named_first) == after
    assert _same_claims(phase1.claims_now(named_first, demand, alloc), named)
    # ...and what it read is not kept for a cycle that names nothing.
    nothing_named = _worksheet(world)
    assert count(nothing_named) == before
    assert _same_claims(phase1.claims_now(nothing_named, demand, alloc), claims_before)


def test_picks_merged_into_a_count_are_the_count_plus_each_pick() -> None:
    """``_with_picks`` against its definition: counts holding none, some or all picked profiles.

    It widens a count by sorted insertion when a pick is of a profile the
    cluster holds none of, and copies it otherwise; either way the count it
    was given is never written to (it is kept for later reads).
    """
    from shard_engine.worksheet import _with_picks

    rng = random.Random(5)
    for _ in range(2000):
        keys = tuple(f"k{i}" for i in range(rng.randint(1, 6)))
        held = sorted(rng.sample(range(12), rng.randint(0, 6)))
        table = np.arange(len(keys) * len(held), dtype=float).reshape(len(keys), len(held))
        found = (np.array(held, dtype=np.int64), table)
        given = found[1].copy()
        picked = {
            (f"k{rng.randint(0, len(keys) + 1)}", rng.randint(0, 11)): rng.randint(1, 3)
            for _ in range(rng.randint(1, 5))
        }
        expected: dict[int, np.ndarray] = {p: given[:, c] for c, p in enumerate(held)}
        mine = False
        for (key, profile), machines in picked.items():
            if key in keys:
                mine = True
                column = expected.setdefault(profile, np.zeros(len(keys))).copy()
                column[keys.index(key)] += machines
                expected[profile] = column

        got = _with_picks(found if held else None, keys, picked)

        assert np.array_equal(found[1], given)
        if not mine:
            assert got is (found if held else None)
            continue
        assert got is not None
        assert got[0].tolist() == sorted(expected)
        assert np.array_equal(got[1], np.array([expected[p] for p in sorted(expected)]).T)
