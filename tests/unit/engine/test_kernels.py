"""The compiled claim passes decide exactly what the numpy code they replaced did (ADR 0162).

``reference_claim`` below is that numpy code, kept here as the oracle, with
one change the compiled code makes on purpose: a take walks the profiles
one by one however many there are (the numpy code summed past a dozen
candidates and then over-claimed; ``test_engine_claims`` shows the case).
The engine's plans are only reproducible (recorded plan digests, golden
traces, two shards compared by the coordinator) if the compiled loops
perform the same floating-point operations in the same order, so every
comparison is exact, not within a tolerance. The inputs are shaped like a
cluster's (up to 16 needs, up to 30 held profiles, ties in shapes and
priorities, bindings narrower than the needs, negative asks).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pytest

from bench.cycle import build, carry, churn
from shard_engine import kernels, selection
from shard_engine.binding import Bindings, PoolCodes
from shard_engine.claims import Claims, claim
from shard_engine.engine import ShardEngine
from shard_engine.inventory import _widened
from shard_engine.linear import combine
from shard_engine.model import MachineState
from shard_engine.pools import TIER_BOUND, PoolKey, Pools
from shard_engine.resources import is_accelerator
from shard_engine.usable import have_rows, usable_shapes
from tests.rollups import apply
from tests.unit.engine.engine_fleet import fleet, need, rollup
from tests.unit.engine.oracles import reference_cover_by_units


def reference_claim(
    matrix: np.ndarray,
    aggregate: np.ndarray,
    supply: np.ndarray,
    alloc: np.ndarray,
    bound: Callable[[], np.ndarray | None] | None = None,
    priority: np.ndarray | None = None,
    spares: list[float] | None = None,
) -> tuple[np.ndarray, np.ndarray, tuple[tuple[int, int, int, float], ...]] | None:
    """``claim`` as numpy calls: (held, own, displaced), or None.

    ``spares``, when given, receives for each takeover that also moves the
    lower need's unclaimed bound machines how many of them it moves.
    """
    width = min(len(supply), matrix.shape[1])
    held = np.flatnonzero(supply[:width])
    if len(held) == 0 or matrix.shape[0] < 2:
        return None
    sub = matrix[:, held]
    if not (sub.sum(axis=0) > 1).any():
        return None
    shapes = alloc[held]
    counts = supply[held].astype(np.float64)
    later = np.add.accumulate(sub[::-1].astype(np.int64), axis=0)[::-1] - sub
    own_bound = None
    placed = bound() if bound is not None else None
    if placed is not None:
        mine = np.zeros(sub.shape)
        rows = min(len(placed), sub.shape[0])
        cols = held < placed.shape[1]
        mine[:rows, cols] = placed[:rows, held[cols]]
        mine *= sub
        if mine.any():
            own_bound = mine
    left = counts.copy()
    claims = np.zeros((matrix.shape[0], len(held)))
    wanted = np.maximum(aggregate, 0.0)
    if own_bound is not None:
        if (own_bound.sum(axis=0) <= counts).all():
            single = (own_bound > 0).sum(axis=1) == 1
            rows_ = np.flatnonzero(single)
            if len(rows_):
                at = (own_bound[rows_] > 0).argmax(axis=1)
                shape = shapes[at]
                ask = wanted[rows_]
                per = np.divide(ask, shape, out=np.zeros_like(ask), where=(ask > 0) & (shape > 0))
                taken = np.minimum(own_bound[rows_, at], per.max(axis=1))
                claims[rows_, at] = taken
                np.subtract.at(left, at, taken)
                wanted[rows_] = np.maximum(ask - taken[:, None] * shape, 0.0)
            partial_rows = np.flatnonzero(~single & own_bound.any(axis=1)).tolist()
        else:
            partial_rows = np.flatnonzero(own_bound.any(axis=1)).tolist()
        for i in partial_rows:
            available = np.minimum(own_bound[i], left)
            taken = _reference_take(wanted[i], available, later[i], shapes)
            claims[i] += taken
            left -= taken
            wanted[i] = np.maximum(wanted[i] - combine(taken, shapes), 0.0)
    open_rows = np.flatnonzero(wanted.any(axis=1) & (sub & (left > 0)).any(axis=1))
    second = np.zeros(claims.shape)
    for i in open_rows.tolist():
        if not (left * sub[i]).any():
            continue
        taken = _reference_take(wanted[i], left * sub[i], later[i], shapes)
        claims[i] += taken
        second[i] += taken
        left -= taken
        wanted[i] = np.maximum(wanted[i] - combine(taken, shapes), 0.0)
    displaced: list[tuple[int, int, int, float]] = []
    if priority is not None and len(priority) >= sub.shape[0]:
        # Bound machines a need does not claim: what the taker took of them as
        # anyone's moves with the take.
        unclaimed = (
            np.maximum(own_bound - claims, 0.0) if own_bound is not None else np.zeros(claims.shape)
        )
        for i in np.flatnonzero(wanted.any(axis=1)).tolist():
            for j in range(sub.shape[0] - 1, i, -1):
                if not wanted[i].any():
                    break
                if priority[j] >= priority[i]:
                    break
                offered = claims[j] * sub[i]
                if not offered.any():
                    continue
                taken = _reference_take(wanted[i], offered, later[i], shapes)
                moved = np.flatnonzero(taken > 0)
                if len(moved) == 0:
                    continue
                given = np.where(taken > 0, np.minimum(unclaimed[j], second[i]), 0.0)
                unclaimed[j] -= given
                second[i] -= given
                if spares is not None and given.any():
                    spares.append(float(given.sum()))
                claims[j] -= taken
                claims[i] += taken
                wanted[i] = np.maximum(wanted[i] - combine(taken, shapes), 0.0)
                displaced.extend(
                    (j, i, int(held[p]), float(taken[p] + given[p])) for p in moved.tolist()
                )
    own = counts - claims.sum(axis=0) + claims
    return held, own, tuple(displaced)


def _reference_take(
    wanted: np.ndarray, available: np.ndarray, contest: np.ndarray, shapes: np.ndarray
) -> np.ndarray:
    taken = np.zeros(len(available))
    asked = wanted > 0
    if not asked.any():
        return taken
    inside = np.flatnonzero(available > 0)
    if len(inside) == 0:
        return taken
    rest = wanted.tolist()
    have = available[inside].tolist()
    rows = shapes[inside].tolist()
    for _, k in sorted(zip(contest[inside].tolist(), range(len(have)), strict=True)):
        shape = rows[k]
        machines = 0.0
        for d in range(len(rest)):
            if rest[d] > 0 and shape[d] > 0:
                machines = max(machines, rest[d] / shape[d])
        if machines <= 0:
            continue
        count = min(have[k], machines)
        taken[inside[k]] = count
        done = True
        for d in range(len(rest)):
            if rest[d] > 0:
                rest[d] = max(0.0, rest[d] - count * shape[d])
                done = done and rest[d] <= 0
        if done:
            break
    return taken


def cluster(seed: int) -> dict[str, object]:
    """One cluster's claim inputs, drawn to hit ties, partial bindings and many profiles."""
    rng = np.random.default_rng(seed)
    needs = int(rng.integers(2, 17))
    profiles = int(rng.integers(1, 31))
    dims = int(rng.integers(1, 5))
    matrix = rng.random((needs, profiles)) < rng.uniform(0.3, 1.0)
    supply = rng.integers(0, 6, profiles) * (rng.random(profiles) < 0.8)
    # Whole-number shapes and asks make exact ties common; some resources absent.
    alloc = rng.integers(0, 5, (profiles, dims)).astype(np.float64) * rng.choice([1.0, 0.5, 4.0])
    aggregate = rng.integers(-2, 24, (needs, dims)).astype(np.float64) * rng.choice([1.0, 0.25])
    placed = None
    if rng.random() < 0.7:
        rows = int(rng.integers(1, needs + 1))
        cols = int(rng.integers(1, profiles + 1))
        placed = rng.integers(0, 4, (rows, cols)).astype(np.float64)
        placed *= rng.random((rows, cols)) < 0.4
    priority = None
    if rng.random() < 0.7:
        priority = -np.sort(-rng.choice([10, 100, 1_000], needs)).astype(np.int64)
    return {
        "matrix": matrix,
        "aggregate": aggregate,
        "supply": supply.astype(np.int64),
        "alloc": alloc,
        "placed": placed,
        "priority": priority,
    }


def both(inputs: dict[str, object]) -> tuple[object, object]:
    """The reference's answer (bindings by profile) and the engine's (by held profile)."""
    placed = inputs.pop("placed")
    assert placed is None or isinstance(placed, np.ndarray)
    by_profile = None if placed is None else (lambda: placed)
    by_held = None if placed is None else (lambda held: _columns(placed, held))
    expected = reference_claim(**inputs, bound=by_profile)  # type: ignore[arg-type]
    got = claim(**inputs, bound=by_held)  # type: ignore[arg-type]
    return expected, got


def _columns(placed: np.ndarray, held: np.ndarray) -> np.ndarray:
    """``placed``'s columns of the profiles ``held`` (none bound beyond its width)."""
    out = np.zeros((placed.shape[0], len(held)))
    inside = held < placed.shape[1]
    out[:, inside] = placed[:, held[inside]]
    return out


@pytest.mark.parametrize("seed", range(400))
def test_a_compiled_claim_is_the_numpy_claim_bit_for_bit(seed: int) -> None:
    expected, got = both(cluster(seed))

    if expected is None:
        assert got is None
        return
    assert isinstance(got, Claims) and isinstance(expected, tuple)
    held, own, displaced = expected
    assert got.held.tolist() == held.tolist()
    assert got.own.tolist() == own.tolist()
    assert got.displaced == displaced


@pytest.mark.parametrize("seed", range(400))
def test_a_claim_in_one_compiled_call_is_the_claim_in_three(seed: int) -> None:
    """``claim(counted=...)`` (``kernels.claim_all``) gives what ``claim(bound=...)`` gives."""
    inputs = cluster(seed)
    placed = inputs.pop("placed")
    assert placed is None or isinstance(placed, np.ndarray)
    by_held = None if placed is None else (lambda held: _columns(placed, held))
    found = None
    if placed is not None:
        present = np.flatnonzero(placed.any(axis=0)).astype(np.int64)
        found = (present, np.ascontiguousarray(placed[:, present]))
    asked: list[bool] = []

    def counted() -> tuple[np.ndarray, np.ndarray] | None:
        asked.append(True)
        return found

    three = claim(**inputs, bound=by_held)  # type: ignore[arg-type]
    one = claim(**inputs, counted=counted)  # type: ignore[arg-type]

    if three is None:
        assert one is None
        return
    assert one is not None and asked == [True]
    assert one.held.tolist() == three.held.tolist()
    assert one.sub.tolist() == three.sub.tolist()
    assert one.shapes.tolist() == three.shapes.tolist()
    assert one.own.tolist() == three.own.tolist()
    assert one.displaced == three.displaced


def spare_cluster(seed: int) -> dict[str, object]:
    """Claim inputs where lower needs hold more bound machines than they want and higher
    needs, short, take those as anyone's and then take over from the lower needs' claims."""
    rng = np.random.default_rng(seed)
    needs = int(rng.integers(2, 6))
    profiles = int(rng.integers(1, 4))
    matrix = rng.random((needs, profiles)) < 0.8
    matrix[:, 0] = True
    supply = rng.integers(2, 12, profiles).astype(np.int64)
    alloc = rng.integers(1, 5, (profiles, 1)).astype(np.float64)
    placed = np.zeros((needs, profiles))
    for p in range(profiles):  # the lowest needs hold every machine of the profile
        placed[needs - 1 - p % 2 if needs > 2 else needs - 1, p] = supply[p]
    aggregate = rng.integers(1, 30, (needs, 1)).astype(np.float64)
    priority = -np.sort(-rng.choice([10, 100, 1_000], needs)).astype(np.int64)
    priority[0] = 10_000
    return {
        "matrix": matrix,
        "aggregate": aggregate,
        "supply": supply,
        "alloc": alloc,
        "placed": placed,
        "priority": priority,
    }


@pytest.mark.parametrize("seed", range(200))
def test_a_takeover_moves_the_spare_machines_the_taker_used_bit_for_bit(seed: int) -> None:
    """Where the lower need holds bound machines it does not claim, the compiled claim
    moves the same spare machines with a takeover as the numpy one."""
    expected, got = both(spare_cluster(seed))

    assert (expected is None) == (got is None)
    if expected is None:
        return
    assert isinstance(got, Claims) and isinstance(expected, tuple)
    assert got.own.tolist() == expected[1].tolist()
    assert got.displaced == expected[2]


def test_the_spare_clusters_move_spare_machines_with_takeovers() -> None:
    """The clusters above reach the case: a takeover that moves spare machines too."""
    sparing = 0
    for seed in range(200):
        inputs = spare_cluster(seed)
        placed = inputs.pop("placed")
        assert isinstance(placed, np.ndarray)
        spares: list[float] = []
        reference_claim(**inputs, bound=partial(_same, placed), spares=spares)  # type: ignore[arg-type]
        sparing += bool(spares)
    assert sparing > 30


def _same(placed: np.ndarray) -> np.ndarray:
    return placed


def test_a_takeover_moves_the_lower_needs_spare_machines_the_taker_used() -> None:
    """Worked on paper: one 4-core profile, 5 machines all bound to batch (12 cores,
    priority 1,000); production (12 cores, priority 2,000) has none bound.

    Batch claims 3 of its 5; its other 2 are anyone's and production takes them
    (8 cores), then takes 1 machine over from batch for its last 4 cores.
    Rebinding only that 1 would leave batch with 4 bound, of which it still
    claims 3, so production would take over again next cycle; rebinding the 2
    spare machines production took with it leaves batch 2, all claimed.
    """
    matrix = np.array([[True], [True]])
    aggregate = np.array([[12.0], [12.0]])
    supply = np.array([5], dtype=np.int64)
    alloc = np.array([[4.0]])
    placed = np.array([[0.0], [5.0]])
    priority = np.array([2_000, 1_000], dtype=np.int64)

    got = claim(matrix, aggregate, supply, alloc, lambda held: placed[:, held], priority)

    assert got is not None
    assert got.own.tolist() == [[3.0], [2.0]]
    assert got.displaced == ((1, 0, 0, 3.0),)


def test_the_inputs_reach_every_way_of_claiming() -> None:
    """The random clusters above exercise what the oracle can tell apart."""
    many = bound = moved = none = 0
    for seed in range(400):
        inputs = cluster(seed)
        supply = inputs["supply"]
        assert isinstance(supply, np.ndarray)
        many += int((supply > 0).sum() > 12)
        bound += inputs["placed"] is not None
        result, _ = both(inputs)
        assert result is None or isinstance(result, tuple)
        none += result is None
        moved += result is not None and bool(result[2])
    assert many > 40 and bound > 200 and moved > 20 and 0 < none < 200


@pytest.mark.parametrize("seed", range(20))
def test_pool_codes_counted_in_the_arena_are_each_pools_own(seed: int) -> None:
    """``PoolCodes`` (``kernels.refresh_codes`` over the pools' arena) gives each pool's own codes.

    Pools grow past their room (their stacks move in the arena), lose rows,
    and change bindings between refreshes; after each refresh every pool
    asked about holds what :func:`kernels.member_codes` counts for it alone,
    widening the tables when a pool holds more codes than they have columns.
    """
    rng = np.random.default_rng(seed)
    pools = Pools()
    pools.ensure_rows(500)
    ids = [pools.pool(PoolKey(TIER_BOUND, 0, p)) for p in range(int(rng.integers(1, 12)))]
    codes = rng.integers(-1, int(rng.integers(1, 30)), 400).astype(np.int32)
    free = list(rng.permutation(480))  # rows past ``codes`` too
    where: dict[int, int] = {}
    kept = PoolCodes()
    for _ in range(4):
        for _ in range(int(rng.integers(0, 120))):
            if where and rng.random() < 0.3:
                row = int(rng.choice(list(where)))
                pools.remove(row, where.pop(row))
                free.append(row)
            elif free:
                row, pool = int(free.pop()), int(rng.choice(ids))
                pools.add(row, pool)
                where[row] = pool
        changed = rng.random(len(codes)) < 0.1
        codes[changed] = rng.integers(-1, 40, int(changed.sum()))
        for pool in {where[r] for r in np.flatnonzero(changed).tolist() if r in where}:
            pools.touch(pool)
        asked = np.array(sorted(rng.choice(ids, int(rng.integers(1, len(ids) + 1)))))
        kept.refresh(pools, asked.astype(np.int64), codes)
        for pool in asked.tolist():
            alone, counts = kernels.member_codes(pools.members(pool), codes)
            width = int(kept.width[pool])
            assert kept.code[pool, :width].tolist() == alone.tolist()
            assert kept.count[pool, :width].tolist() == counts.tolist()


@pytest.mark.parametrize("seed", range(60))
def test_bound_machines_are_counted_per_need_and_profile(seed: int) -> None:
    """Counts kept per pool, less rows taken, plus rows in flight: every row counted once."""
    rng = np.random.default_rng(seed)
    bindings = Bindings()
    keys = [f"need-{i}" for i in range(int(rng.integers(1, 6)))]
    machines = int(rng.integers(1, 300))
    for row in range(machines):
        if rng.random() < 0.8:
            cluster_ = int(rng.integers(0, 2))
            bindings.bind([row], cluster_, str(rng.choice([*keys, "gone"])))
    codes = bindings.codes
    profile = rng.integers(0, 9, machines + 50).astype(np.int16)
    # The cluster's pools: rows of one profile each, some past the bound rows.
    rows = rng.permutation(machines + 50)[: int(rng.integers(1, machines + 50))]
    by_profile = {p: rows[profile[rows] == p].astype(np.int32) for p in range(9)}
    mine = np.array([p for p in range(9) if len(by_profile[p])], dtype=np.int64)
    width = np.zeros(9, dtype=np.int64)
    table_code = np.zeros((9, 16), dtype=np.int64)
    table_count = np.zeros((9, 16), dtype=np.int64)
    for p in mine.tolist():
        found, many = kernels.member_codes(by_profile[p], codes)
        held = [int(codes[r]) for r in by_profile[p] if r < len(codes) and codes[r] >= 0]
        assert found.tolist() == sorted(set(held))
        assert many.tolist() == [held.count(c) for c in sorted(set(held))]
        width[p] = len(found)
        table_code[p, : len(found)] = found
        table_count[p, : len(found)] = many
    minus = rng.choice(rows, int(rng.integers(0, len(rows) + 1)), replace=False).astype(np.int64)
    outside = np.setdiff1d(np.arange(machines + 50), rows)
    plus = rng.choice(outside, int(rng.integers(0, len(outside) + 1)), replace=False)
    plus = plus.astype(np.int64)
    skip = np.sort(rng.choice(machines + 50, int(rng.integers(0, 20)), replace=False))
    lookup = bindings.lookup(1, keys)
    if lookup is None:
        return

    present, counts = kernels.bound_tally(
        mine,
        np.arange(9, dtype=np.int32),
        width,
        table_code,
        table_count,
        minus,
        plus,
        skip,
        profile,
        codes,
        lookup,
        len(keys),
    )

    expected = np.zeros((len(keys), 9))
    counted = [r for r in rows.tolist() if r not in minus.tolist()]
    counted += [r for r in plus.tolist() if r not in skip.tolist()]
    for row in counted:
        bound = bindings.need_of(row)
        if bound is None or bound[0] != 1 or bound[1] not in keys:
            continue
        expected[keys.index(bound[1]), profile[row]] += 1
    assert present.tolist() == np.flatnonzero(expected.any(axis=0)).tolist()
    assert counts.tolist() == expected[:, present].tolist()
    # Read over any profiles, sorted: a profile not counted reads zero.
    columns = np.sort(rng.choice(12, int(rng.integers(1, 12)), replace=False)).astype(np.int64)
    padded = np.zeros((len(keys), 12))
    padded[:, :9] = expected
    assert kernels.columns_of(present, counts, columns).tolist() == padded[:, columns].tolist()


def reference_usable(shapes: np.ndarray, units: np.ndarray) -> np.ndarray:
    """``usable_shapes`` as numpy calls (the code ``kernels.usable`` replaced)."""
    needs, width = units.shape[0], min(units.shape[1], shapes.shape[1])
    out = np.broadcast_to(shapes, (needs, *shapes.shape)).copy()
    if needs == 0 or shapes.shape[0] == 0:
        return out
    unit = units[:, :width]
    asked = unit > 0
    if not asked.any():
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(
            asked[:, None, :],
            np.floor(shapes[None, :, :width] / np.where(asked, unit, 1.0)[:, None, :] + 1e-9),
            np.inf,
        )
    has_unit: np.ndarray = np.asarray(asked.any(axis=1))
    fewest = ratio.min(axis=2)
    hosted = np.where(has_unit[:, None], np.maximum(fewest, 0.0), 0.0)
    worth = hosted[:, :, None] * unit[:, None, :]
    binding = has_unit[:, None, None] & asked[:, None, :] & (ratio <= fewest[:, :, None])
    out[:, :, :width] = np.where(
        binding, np.minimum(worth, shapes[None, :, :width]), out[:, :, :width]
    )
    return out


@pytest.mark.parametrize("seed", range(300))
def test_usable_shapes_and_have_are_the_numpy_ones_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    needs, profiles, dims = (int(rng.integers(lo, hi)) for lo, hi in ((0, 6), (0, 20), (1, 5)))
    # Decimal quantities (0.1 cores) are where the 1e-9 of slack matters.
    shapes = rng.integers(0, 64, (profiles, dims)) * rng.choice([1.0, 0.5, 0.1, 1.9])
    units = rng.integers(0, 8, (needs, int(rng.integers(1, dims + 2)))) * rng.choice([1.0, 0.1])
    units *= rng.random((needs, 1)) < 0.7  # some needs without a unit
    weights = rng.random((needs, profiles)) * rng.integers(0, 5, (needs, profiles))

    expected = reference_usable(shapes, units)
    got = usable_shapes(shapes, units)

    assert got.tolist() == expected.tolist()
    if needs:
        assert have_rows(weights, got).tolist() == [
            [
                float(np.add.accumulate(weights[n] * expected[n, :, d])[-1]) if profiles else 0.0
                for d in range(dims)
            ]
            for n in range(needs)
        ]


def test_warming_compiles_what_a_cycle_calls() -> None:
    kernels.warm()
    every: list[Any] = [kernels.gather, kernels.divide, kernels.columns_of, kernels.usable]
    every += [kernels.have_rows, kernels.member_codes, kernels.refresh_codes]
    every += [kernels.bound_tally, kernels.claim_all]
    every += [kernels.excess, kernels.excess_one, kernels.cover, kernels.spread_fill]
    compiled = {k: len(k.signatures) for k in every}

    # A cycle's claims and counts, bound and ranked or not, find every signature compiled.
    for seed in range(30):
        both(cluster(seed))
    engine = ShardEngine()
    fleet(engine, 3, prefix="held", state=MachineState.CONFIGURED, cluster="c")
    apply(engine, rollup("c", 1, need(cpu=4), need(cpu=4, priority=10)), now=0)
    engine.cycle(now=1)
    # A shard whose machines are bound to needs, some in flight, some reclaimed.
    world = build(
        machines=2_000, clusters=3, needs_per_cluster=4, types=4, zones=2, racks=2, seed=5
    )
    rng = random.Random(5)
    plan = world.engine.cycle(now=world.now)
    for _ in range(4):
        carry(world, plan)
        churn(world, rng, pending=0.3, excess=0.3, grow=20)
        world.now += 1
        plan = world.engine.cycle(now=world.now)
    # Past 32,767 profiles the inventory's profile column widens to int32.
    wide = _widened(np.zeros(3, dtype=np.int16), 40_000)
    rows, table = np.arange(3, dtype=np.int64), np.zeros((3, 1), dtype=np.int64)
    codes = np.zeros(3, dtype=np.int32)
    kernels.bound_tally(rows, codes, rows, table, table, rows, rows, rows, wide, codes, rows, 1)

    assert {k: len(k.signatures) for k in compiled} == compiled


def reference_excess(
    matrix: np.ndarray, surplus: np.ndarray, profiles: np.ndarray, usable: np.ndarray
) -> np.ndarray:
    """``reclaim.excess_groups`` as numpy calls (the code ``kernels.excess`` replaced)."""
    if matrix.shape[0] == 0:
        return np.full(len(profiles), kernels.UNBOUNDED, dtype=np.int64)
    width = matrix.shape[1]
    inside = profiles < width
    matches = np.zeros((matrix.shape[0], len(profiles)), dtype=np.bool_)
    matches[:, inside] = matrix[:, profiles[inside]]
    offered = usable > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(
            offered,
            np.floor(surplus[:, None, :] / np.where(offered, usable, 1.0) + 1e-9),
            np.inf,
        )
    per_need = np.where(matches, ratio.min(axis=2), np.inf)
    bound = per_need.min(axis=0)
    bound = np.where(np.isinf(bound), float(kernels.UNBOUNDED), np.maximum(bound, 0.0))
    return bound.astype(np.int64)


@pytest.mark.parametrize("seed", range(200))
def test_excess_is_the_numpy_one(seed: int) -> None:
    """Phase 3's excess per profile, and per profile one at a time, as the numpy code had it."""
    rng = np.random.default_rng(seed)
    needs, width, dims = (int(rng.integers(lo, hi)) for lo, hi in ((0, 8), (1, 20), (1, 5)))
    matrix = rng.random((needs, width)) < 0.4
    # Decimal quantities, negative surplus, blocked needs (-1e18) and machines holding nothing.
    surplus = rng.integers(-40, 200, (needs, dims)) * rng.choice([1.0, 0.1, 0.25])
    surplus[rng.random(needs) < 0.15] = -1e18
    profiles = rng.choice(width + 3, int(rng.integers(1, width + 3)), replace=False)
    usable = rng.integers(0, 16, (needs, len(profiles), dims)) * rng.choice([1.0, 0.1, 0.5])

    expected = reference_excess(matrix, surplus, profiles, usable)

    assert kernels.excess(matrix, surplus, profiles, usable).tolist() == expected.tolist()
    for position, profile in enumerate(profiles.tolist()):
        one = kernels.excess_one(matrix, surplus, profile, usable, position)
        assert one == expected[position]


def reference_cover(
    *,
    deficit: np.ndarray,
    aggregate: np.ndarray,
    available: np.ndarray,
    alloc: np.ndarray,
    cost: np.ndarray,
    names: Sequence[str],
    tolerance: float,
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """``selection.cover_by_cost`` in plain Python below 96 groups (``kernels.cover`` now)."""
    dims = len(deficit)
    slack = [tolerance * max(a, 1.0) for a in aggregate.tolist()]
    need = [d if d > s else 0.0 for d, s in zip(deficit.tolist(), slack, strict=True)]
    left = available.tolist()
    shapes = alloc.tolist()
    prices = cost.tolist()
    accelerator = tuple(j < len(names) and is_accelerator(names[j]) for j in range(dims))
    ceil = math.ceil
    picks: list[tuple[int, int]] = []
    live = [g for g, n in enumerate(left) if n > 0]
    by_unit: dict[int, list[tuple[float, int]]] = {}
    while any(need):
        if not live:
            break
        short = [j for j in range(dims) if need[j] > 0]
        dstar = -1
        best_key = (False, 0.0)
        for j in short:
            top = max([shapes[g][j] for g in live])
            if top <= 0:
                continue
            key = (accelerator[j], need[j] / top)
            if key > best_key:
                dstar, best_key = j, key
        if dstar < 0:
            break
        order = by_unit.get(dstar)
        if order is None:
            # Groups offering d*, cheapest per unit of it first. A group's score is
            # never below its cost per unit (it covers at most what it holds), so
            # once that exceeds the best score found no later group can win.
            order = sorted(
                (prices[g] / shapes[g][dstar], g) for g in range(len(left)) if shapes[g][dstar] > 0
            )
            by_unit[dstar] = order
        wanted = need[dstar]
        best: tuple[float, float, int] | None = None
        best_take = 0
        limit = math.inf
        for unit, g in order:
            if unit > limit:
                break
            have = left[g]
            if have <= 0:
                continue
            shape = shapes[g]
            capacity = shape[dstar]
            count = 0  # machines of this group the deficit needs: max over what it offers
            for j in short:
                amount = shape[j]
                if amount > 0:
                    machines = ceil(need[j] / amount - 1e-9)
                    if machines > count:
                        count = machines
            take = have if have < count else max(count, 1)
            covered = min(take * capacity, wanted)
            price = prices[g]
            candidate = (take * price / covered, price / capacity, g)
            if best is None or candidate < best:
                best, best_take = candidate, take
                # Rounding can put a score a few ulps under its unit cost; the margin
                # keeps every group that could tie or win.
                limit = candidate[0] * (1 + 1e-9)
        if best is None:
            break
        group = best[2]
        picks.append((group, best_take))
        left[group] -= best_take
        if left[group] <= 0:
            live.remove(group)
        shape = shapes[group]
        need = [
            max(n - best_take * a, 0.0) if (n - best_take * a) > s else 0.0
            for n, a, s in zip(need, shape, slack, strict=True)
        ]
    return picks, np.array(need, dtype=np.float64)


def unit_cover(seed: int) -> dict[str, Any]:
    """One cover by units' inputs, drawn for ties (few shapes, prices and counts) and units
    that some shapes cannot hold."""
    rng = np.random.default_rng(seed)
    groups, dims = int(rng.integers(1, 40)), int(rng.integers(1, 4))
    alloc = rng.choice([0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 96.0], (groups, dims))
    available = rng.integers(0, 6, groups).astype(np.int64)
    cost = rng.choice([0.0, 0.1, 1.0, 2.3, 6.0, 0.35, np.inf], groups)
    deficit = rng.choice([0.0, 0.3, 3.0, 17.0, 250.5], dims)
    aggregate = deficit * rng.choice([1.0, 2.0], dims)
    unit = rng.choice([0.0, 0.25, 1.0, 3.0, 16.0], dims)
    return {
        "deficit": deficit,
        "aggregate": aggregate,
        "unit": unit,
        "available": available,
        "alloc": alloc,
        "cost": cost,
        "tolerance": float(rng.choice([1e-9, 1e-3])),
    }


@pytest.mark.parametrize("seed", range(300))
def test_the_unit_cover_is_the_numpy_one(seed: int) -> None:
    """The compiled cover by units hosted picks what the numpy loop did, and leaves the same
    deficit."""
    arguments = unit_cover(seed)

    expected = reference_cover_by_units(**arguments)
    got = selection.cover_by_units(**arguments)

    assert got[0] == expected[0]
    assert got[1].tolist() == expected[1].tolist()


def test_the_unit_covers_drawn_reach_every_way_of_choosing() -> None:
    """The inputs above take several groups and stop with capacity short."""
    several = short = 0
    for seed in range(300):
        picks, left = reference_cover_by_units(**unit_cover(seed))
        several += len(picks) > 1
        short += bool(np.count_nonzero(left))
    assert several > 50 and short > 50


@pytest.mark.parametrize("seed", range(300))
def test_the_cost_cover_is_the_python_one(seed: int) -> None:
    """The compiled cover picks what the plain-Python one did, and leaves the same deficit.

    The plain-Python loop ran below 96 candidate groups; above, the numpy
    formulation (``oracles.vectorised_cover``, checked in ``test_engine_selection``).
    """
    rng = np.random.default_rng(seed)
    groups, dims = int(rng.integers(1, 40)), int(rng.integers(1, 4))
    # Ties on purpose: few distinct shapes, prices and counts.
    alloc = rng.choice([0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 96.0], (groups, dims))
    available = rng.integers(0, 6, groups).astype(np.int64)
    cost = rng.choice([0.0, 0.1, 1.0, 2.3, 6.0, 0.35], groups)
    deficit = rng.choice([0.0, 0.3, 3.0, 17.0, 250.5], dims)
    aggregate = deficit * rng.choice([1.0, 2.0], dims)
    names = ("cpu", "memory", "nvidia.com/gpu")[:dims]
    arguments = dict(
        deficit=deficit,
        aggregate=aggregate,
        available=available,
        alloc=alloc,
        cost=cost,
        names=names,
        tolerance=float(rng.choice([1e-9, 1e-3])),
    )

    expected = reference_cover(**arguments)
    got = selection.cover_by_cost(**arguments)

    assert got[0] == expected[0]
    assert got[1].tolist() == expected[1].tolist()
