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
from shard_engine.engine import EngineConfig
from shard_engine.model import Provision
from shard_engine.worksheet import Counted, Worksheet


def recounted(sheet: Worksheet, cluster: int, keys: Sequence[str], settled_only: bool) -> Counted:
    """The count by its definition, every row read."""
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


@pytest.mark.parametrize(
    ("seed", "config"),
    [(1, RECLAIM_AT_ONCE), (2, RECLAIM_AT_ONCE), (3, None), (4, EngineConfig())],
)
def test_every_bound_count_of_a_churning_shard_is_the_recount(
    seed: int, config: EngineConfig | None
) -> None:
    world = build(
        machines=4_000,
        clusters=8,
        needs_per_cluster=6,
        types=6,
        zones=3,
        racks=4,
        seed=seed,
        config=config,
    )
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
