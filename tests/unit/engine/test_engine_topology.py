"""Topology in Phase 1: Same gangs in one domain (sticky), spread within max skew."""

from __future__ import annotations

from collections import Counter

import numpy as np

from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState
from shard_engine.topology import _distinct
from tests.rollups import apply
from tests.unit.engine.engine_fleet import (
    Carrier,
    fleet,
    machine_ids,
    need,
    rollup,
    same,
    spread_over,
)

ZONE = "topology.kubernetes.io/zone"


def zones_of(engine: ShardEngine, ids: list[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for machine_id in ids:
        record = engine.machine(machine_id)
        assert record is not None
        out[record.zone] += 1
    return out


def test_a_gang_goes_to_one_rack_that_can_hold_all_of_it() -> None:
    engine = ShardEngine()
    fleet(engine, 3, prefix="r1", state=MachineState.IDLE, labels={"rack": "r1"}, price=0.1)
    fleet(engine, 5, prefix="r2", state=MachineState.IDLE, labels={"rack": "r2"}, price=0.2)
    apply(engine, rollup("c1", 1, need(cpu=16, requirements=[same("rack")])), now=0)

    ids = machine_ids(engine.cycle(now=1).actions)

    assert len(ids) == 4
    assert all(i.startswith("r2") for i in ids)


def test_a_gang_stays_in_its_domain_when_it_grows() -> None:
    engine = ShardEngine()
    fleet(engine, 4, prefix="r1", state=MachineState.IDLE, labels={"rack": "r1"})
    fleet(engine, 4, prefix="r2", state=MachineState.IDLE, labels={"rack": "r2"})
    carrier = Carrier(engine)
    apply(engine, rollup("c1", 1, need(cpu=8, requirements=[same("rack")])), now=0)
    first = machine_ids(carrier.run(now=1)[0].actions)
    rack = first[0][:2]

    apply(engine, rollup("c1", 2, need(cpu=12, requirements=[same("rack")])), now=2)
    grown = machine_ids(carrier.run(now=3)[0].actions)

    assert {i[:2] for i in first} == {rack}
    assert {i[:2] for i in grown} == {rack}


def test_a_gang_restricted_by_values_only_uses_those_domains() -> None:
    engine = ShardEngine()
    fleet(engine, 4, prefix="r1", state=MachineState.IDLE, labels={"rack": "r1"})
    fleet(engine, 4, prefix="r2", state=MachineState.IDLE, labels={"rack": "r2"})
    apply(engine, rollup("c1", 1, need(cpu=8, requirements=[same("rack", "r2")])), now=0)

    ids = machine_ids(engine.cycle(now=1).actions)

    assert {i[:2] for i in ids} == {"r2"}


def test_a_hard_spread_keeps_zones_within_max_skew() -> None:
    engine = ShardEngine()
    for zone in ("a", "b", "c"):
        fleet(engine, 10, prefix=zone, state=MachineState.IDLE, zone=zone, price=1.0)
    apply(engine, rollup("c1", 1, need(cpu=36, spread=[spread_over(ZONE, 1)])), now=0)

    ids = machine_ids(engine.cycle(now=1).actions)

    assert zones_of(engine, ids) == {"a": 3, "b": 3, "c": 3}


def test_a_hard_spread_stops_at_max_skew_when_a_zone_runs_dry() -> None:
    engine = ShardEngine()
    fleet(engine, 10, prefix="a", state=MachineState.IDLE, zone="a")
    fleet(engine, 1, prefix="b", state=MachineState.IDLE, zone="b")
    apply(engine, rollup("c1", 1, need(cpu=40, spread=[spread_over(ZONE, 2)])), now=0)

    plan = engine.cycle(now=1)

    assert zones_of(engine, machine_ids(plan.actions)) == {"a": 3, "b": 1}
    assert plan.shortfalls


def test_a_soft_spread_prefers_balance_but_places_everything() -> None:
    engine = ShardEngine()
    fleet(engine, 10, prefix="a", state=MachineState.IDLE, zone="a")
    fleet(engine, 1, prefix="b", state=MachineState.IDLE, zone="b")
    apply(engine, rollup("c1", 1, need(cpu=40, spread=[spread_over(ZONE, 1, hard=False)])), now=0)

    plan = engine.cycle(now=1)

    assert zones_of(engine, machine_ids(plan.actions)) == {"a": 9, "b": 1}
    assert plan.shortfalls == ()


def test_existing_machines_count_toward_the_spread() -> None:
    engine = ShardEngine()
    fleet(engine, 2, prefix="have", state=MachineState.CONFIGURED, zone="a", cluster="c1")
    for zone in ("a", "b"):
        fleet(engine, 5, prefix=zone, state=MachineState.IDLE, zone=zone)
    apply(engine, rollup("c1", 1, need(cpu=16, spread=[spread_over(ZONE, 1)])), now=0)

    ids = machine_ids(engine.cycle(now=1).actions)

    assert zones_of(engine, ids) == {"b": 2}


def test_distinct_domain_codes_equal_numpy_unique_with_inverse() -> None:
    rng = np.random.default_rng(1)
    for _ in range(500):
        top = int(rng.integers(1, 5000))
        codes = rng.integers(0, top, size=int(rng.integers(1, 300))).astype(np.int64)
        uniq, inverse = np.unique(codes, return_inverse=True)
        found, dense = _distinct(codes)
        assert found.dtype == uniq.dtype
        assert np.array_equal(found, uniq)
        assert np.array_equal(dense, inverse.reshape(-1))


def test_distinct_rows_equal_numpys_unique_over_rows() -> None:
    from shard_engine.topology import distinct_rows

    rng = np.random.default_rng(5)
    tables = [np.zeros((0, 2), dtype=np.int64), np.zeros((4, 0), dtype=np.int64)]
    for _ in range(300):
        rows, columns = int(rng.integers(1, 400)), int(rng.integers(1, 4))
        high = int(rng.choice([2, 7, 40, 5_000]))
        tables.append(rng.integers(-1, high, size=(rows, columns)).astype(np.int64))
    # Keys too wide for one integer: the fallback.
    tables.append(rng.integers(0, 2**40, size=(50, 3)).astype(np.int64))
    for table in tables:
        expected, which = np.unique(table, axis=0, return_inverse=True)
        got, got_which = distinct_rows(table)
        assert got.shape == expected.shape and np.array_equal(got, expected)
        assert np.array_equal(got_which, which.reshape(-1))
        assert got.dtype == np.int64 and got_which.dtype == np.int64
