"""Roll-ups that only resize needs reuse the compiled masks and still equal a fresh compile."""

from __future__ import annotations

import random
from dataclasses import fields, replace

import numpy as np
import pytest

from shard_engine.model import Rollup
from shard_engine.needs import Demand
from tests.unit.engine.plan_history import CLUSTERS, History, _random_need, _resized

CACHES = {"slack_rows", "slack_tolerance"}


def assert_same_demand(found: Demand, fresh: Demand) -> None:
    for f in fields(Demand):
        if f.name in CACHES:
            continue
        a, b = getattr(found, f.name), getattr(fresh, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), f.name
        else:
            assert a == b, f.name


@pytest.mark.parametrize("seed", range(4))
def test_every_compiled_demand_equals_a_fresh_compile_after_random_roll_ups(seed: int) -> None:
    rng = random.Random(seed)
    history = History(seed)
    history.populate()
    engine, table = history.engine, history.engine._table
    ts = 10_000
    for step in range(150):
        cluster = rng.choice(CLUSTERS)
        wanted = history.needs[cluster]
        roll = rng.random()
        if roll < 0.6 and wanted:
            i = rng.randrange(len(wanted))
            wanted[i] = _resized(rng, wanted[i])
        elif roll < 0.8:
            wanted.append(_random_need(rng))
        elif wanted:
            wanted.pop(rng.randrange(len(wanted)))
        ts += 1
        engine.apply_rollup(Rollup(cluster, ts, tuple(wanted)), now=float(step))
        if step % 10 == 0:
            engine.cycle(now=float(step))  # gang domains chosen, catalog unchanged
        for entry in table.entries():
            assert_same_demand(table.demand(entry), table._compile(entry))
        assert table.count() == sum(len(e.needs) for e in table.entries())


def test_a_resized_need_reuses_the_matrix_and_a_new_min_unit_does_not() -> None:
    history = History(0)
    history.populate()
    engine, table = history.engine, history.engine._table
    cluster = next(c for c in CLUSTERS if history.needs[c])
    entry = table.entry(engine._clusters.index_of(cluster))
    assert entry is not None
    before = table.demand(entry)
    wanted = history.needs[cluster]

    wanted[0] = _resized(random.Random(1), wanted[0])
    engine.apply_rollup(Rollup(cluster, 1_000, tuple(wanted)), now=0)
    resized = table.demand(entry)
    wanted[0] = replace(wanted[0], min_unit={"cpu": 1.0})
    engine.apply_rollup(Rollup(cluster, 1_001, tuple(wanted)), now=0)
    recompiled = table.demand(entry)

    assert resized.matrix is before.matrix
    assert resized.version != before.version
    assert recompiled.matrix is not resized.matrix
    assert_same_demand(recompiled, table._compile(entry))
