"""Roll-ups that only resize needs reuse the compiled masks and still equal a fresh compile."""

from __future__ import annotations

import random
from dataclasses import fields, replace

import numpy as np
import pytest

from shard_engine.model import AppClass, Need, Rollup
from shard_engine.needs import Demand, ValidatedRollup, _equal_prefix, validate_rollup
from shard_engine.needs import _resized as _resized_need
from tests.rollups import apply
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
        apply(engine, Rollup(cluster, ts, tuple(wanted)), now=float(step))
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
    apply(engine, Rollup(cluster, 1_000, tuple(wanted)), now=0)
    resized = table.demand(entry)
    wanted[0] = replace(wanted[0], min_unit={"cpu": 1.0})
    apply(engine, Rollup(cluster, 1_001, tuple(wanted)), now=0)
    recompiled = table.demand(entry)

    assert resized.matrix is before.matrix
    assert resized.version != before.version
    assert recompiled.matrix is not resized.matrix
    assert_same_demand(recompiled, table._compile(entry))


def test_resizing_a_validated_need_keeps_every_other_field() -> None:
    rng = random.Random(3)
    for _ in range(50):
        need = replace(
            _random_need(rng),
            priority=rng.randint(-5, 5),
            interruption_penalty=rng.random(),
            reclamation_penalty=rng.random(),
            app_class=rng.choice(list(AppClass)),
            do_not_disrupt_seconds=rng.choice((0.0, 60.0, 3600.0)),
            gang=rng.randint(0, 3),
        )
        aggregate, unit = {"cpu": 3.0}, {"memory": 1.0}
        assert _resized_need(need, aggregate, unit) == replace(
            need, aggregate=aggregate, min_unit=unit
        )


@pytest.mark.parametrize("seed", range(4))
def test_validation_that_reuses_rows_equals_validation_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    wanted = [_random_need(rng) for _ in range(rng.randint(1, 25))]
    _, previous = validate_rollup(Rollup("c", 1, tuple(wanted)))
    for step in range(40):
        i = rng.randrange(len(wanted))
        roll = rng.random()
        if roll < 0.6:
            wanted[i] = _resized(rng, wanted[i])
        elif roll < 0.8:
            wanted[i] = _random_need(rng)
        else:
            wanted.insert(i, wanted[rng.randrange(len(wanted))])  # a duplicate row merges
        rollup = Rollup("c", 2 + step, tuple(wanted))
        equal = _equal_prefix(rollup.needs, [v[0] for v in previous])
        reused, validated = validate_rollup(rollup, previous, equal=equal)
        fresh, _ = validate_rollup(rollup)
        assert list(reused.items()) == list(fresh.items())
        assert [v[1:] for v in validated] == [v[1:] for v in validate_rollup(rollup)[1]]
        previous = validated


def _parts(value: ValidatedRollup) -> dict[str, list[int]]:
    """The identities of the rows of each key, in order."""
    out: dict[str, list[int]] = {}
    for _, need, key in value.rows:
        out.setdefault(key, []).append(id(need))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_merges_reused_from_the_previous_roll_up_equal_merges_from_scratch(seed: int) -> None:
    # Rows with one key merge, unnamed gangs with one key are numbered; the
    # previous value's merges are reused when their parts are the very rows.
    rng = random.Random(seed)
    pool = [_random_need(rng) for _ in range(6)]
    wanted = [rng.choice(pool) for _ in range(rng.randint(2, 20))]
    previous = ValidatedRollup.check(Rollup("c", 1, tuple(wanted)))
    for step in range(60):
        roll = rng.random()
        if roll < 0.4:
            i = rng.randrange(len(wanted))
            wanted[i] = _resized(rng, wanted[i])
        elif roll < 0.6:
            wanted.insert(rng.randrange(len(wanted) + 1), rng.choice(pool))
        elif roll < 0.75 and len(wanted) > 1:
            wanted.pop(rng.randrange(len(wanted)))
        elif roll < 0.9:
            i, j = rng.randrange(len(wanted)), rng.randrange(len(wanted))
            wanted[i], wanted[j] = wanted[j], wanted[i]
        rollup = Rollup("c", 2 + step, tuple(wanted))
        checked = ValidatedRollup.check(rollup, previous)
        fresh, _ = validate_rollup(rollup)
        assert list(checked.merged.items()) == list(fresh.items())
        # A key whose rows are the very rows it had last time is the very need it was.
        before, now = _parts(previous), _parts(checked)
        for key, rows in now.items():
            if before.get(key) == rows and len(rows) > 1 and key in previous.merged:
                assert checked.merged[key] is previous.merged[key], key
        previous = checked


def test_a_resized_need_keeps_its_do_not_disrupt_and_a_changed_one_takes_the_new_value() -> None:
    # Found by hand: resizing, the usual edit, rebuilt the need without its
    # do_not_disrupt_seconds, so its machines lost their protection as soon as
    # the need grew or shrank.
    def row(cpu: float, hold: float) -> Need:
        return Need(
            requirements=(), aggregate={"cpu": cpu}, priority=1, do_not_disrupt_seconds=hold
        )

    _, previous = validate_rollup(Rollup("c", 1, (row(4.0, 3600.0),)))
    resized, previous = validate_rollup(Rollup("c", 2, (row(8.0, 3600.0),)), previous)
    [kept] = resized.values()
    assert (kept.aggregate["cpu"], kept.do_not_disrupt_seconds) == (8.0, 3600.0)

    changed, _ = validate_rollup(Rollup("c", 3, (row(6.0, 60.0),)), previous)
    [now] = changed.values()
    assert (now.aggregate["cpu"], now.do_not_disrupt_seconds) == (6.0, 60.0)
