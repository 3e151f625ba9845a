"""Formulations the engine's compiled code replaced, kept as the tests' oracles."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shard_engine.costs import dominant_dimension, machines_needed
from shard_engine.selection import settle_deficit
from shard_engine.topology import SpreadState


def vectorised_cover(
    *,
    deficit: npt.NDArray[np.float64],
    aggregate: npt.NDArray[np.float64],
    available: npt.NDArray[np.int64],
    alloc: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    names: Sequence[str],
    tolerance: float,
) -> tuple[list[tuple[int, int]], npt.NDArray[np.float64]]:
    """``selection.cover_by_cost`` as numpy calls over the candidate groups.

    The engine ran this above 96 groups and a plain-Python loop below, each
    checked against the other; ``kernels.cover`` replaced both.
    """
    deficit = settle_deficit(deficit.copy(), aggregate, tolerance)
    left = available.astype(np.int64).copy()
    picks: list[tuple[int, int]] = []
    while deficit.any():
        live = np.flatnonzero(left > 0)
        if len(live) == 0:
            break
        capacity = alloc[live]
        dstar = dominant_dimension(deficit, capacity.max(axis=0), names)
        if dstar is None:
            break
        useful = capacity[:, dstar] > 0
        live = live[useful]
        if len(live) == 0:
            break
        capacity = alloc[live]
        k = np.minimum(left[live], np.maximum(machines_needed(deficit, capacity), 1))
        covered = np.minimum(k * capacity[:, dstar], deficit[dstar])
        score = k * cost[live] / covered
        unit = cost[live] / capacity[:, dstar]
        order = np.lexsort((live, unit, score))
        best = int(order[0])
        group = int(live[best])
        take = int(k[best])
        picks.append((group, take))
        left[group] -= take
        deficit = settle_deficit(deficit - take * alloc[group], aggregate, tolerance)
        deficit = np.maximum(deficit, 0.0)
    return picks, deficit


def domain_water_fill(
    *,
    deficit: npt.NDArray[np.float64],
    aggregate: npt.NDArray[np.float64],
    available: npt.NDArray[np.int64],
    alloc: npt.NDArray[np.float64],
    profiles: npt.NDArray[np.int64],
    preference: npt.NDArray[np.float64],
    spread: SpreadState,
    max_steps: int,
    tolerance: float,
) -> tuple[list[tuple[int, int]], npt.NDArray[np.float64], bool]:
    """``selection.cover_with_spread`` in plain Python (``kernels.spread_fill`` replaced it)."""
    slack = [tolerance * max(a, 1.0) for a in aggregate.tolist()]
    need = [d if d > s else 0.0 for d, s in zip(deficit.tolist(), slack, strict=True)]
    dims = range(len(need))
    left = available.astype(np.int64).tolist()
    shapes = alloc.tolist()
    prefs = preference.tolist()
    count = len(left)
    codes = [c[profiles].tolist() for c in spread.codes] if count else []
    domains: dict[tuple[int, ...], list[int]] = {}
    for g, signature in enumerate(zip(*codes, strict=True) if codes else [()] * count):
        domains.setdefault(signature, []).append(g)
    signatures = list(domains)
    queues = [sorted(domains[sig], key=lambda g: (prefs[g], g)) for sig in signatures]
    heads = [0] * len(signatures)
    counts = [c.tolist() for c in spread.counts]
    eligible = [e.tolist() for e in spread.eligible]
    hard = [
        (i, s.max_skew)
        for i, (h, s) in enumerate(zip(spread.hard, spread.spreads, strict=True))
        if h
    ]
    taken: dict[int, int] = {}
    blocked = False
    steps = 0
    while any(need) and steps < max_steps:
        steps += 1
        short = [j for j in dims if need[j] > 0]
        floors = [
            min((n for n, e in zip(counts[i], eligible[i], strict=True) if e), default=None)
            for i, _ in hard
        ]
        best: tuple[float, float, int] | None = None
        live = False
        for k, sig in enumerate(signatures):
            queue = queues[k]
            head = heads[k]
            while head < len(queue):
                g = queue[head]
                if left[g] > 0 and any(shapes[g][j] > 0 for j in short):
                    break
                head += 1
            heads[k] = head
            if head == len(queue):
                continue
            live = True
            allowed = True
            for (i, skew), floor in zip(hard, floors, strict=True):
                d = sig[i]
                if d < 0 or (floor is not None and counts[i][d] + 1 - floor > skew):
                    allowed = False
                    break
            if not allowed:
                continue
            level = 0.0
            for i, d in enumerate(sig):
                level += counts[i][d] if d >= 0 else 0.0
            g = queue[head]
            candidate = (level, prefs[g], g)
            if best is None or candidate < best:
                best = candidate
        if not live:
            break
        if best is None:
            blocked = True
            break
        group = best[2]
        taken[group] = taken.get(group, 0) + 1
        left[group] -= 1
        for i, d in enumerate(codes):
            domain = d[group]
            if domain >= 0:
                counts[i][domain] += 1
                eligible[i][domain] = True
        shape = shapes[group]
        need = [
            max(n - a, 0.0) if (n - a) > s else 0.0
            for n, a, s in zip(need, shape, slack, strict=True)
        ]
    for group, machines in taken.items():
        spread.add(int(profiles[group]), machines)
    return list(taken.items()), np.array(need, dtype=np.float64), blocked


def units_hosted(
    alloc: npt.NDArray[np.float64], unit: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """Per shape (rows of ``alloc``), how many ``unit``-sized pieces one machine holds.

    Every dimension of the unit binds: a 16-core, 58 GiB machine holds three
    pods of 4 cores and 16 GiB, not four. Dimensions the unit does not ask
    for do not bind. A unit asking for nothing gives 0 (no unit to count).
    """
    asked = unit > 0
    if not asked.any():
        return np.zeros(len(alloc), dtype=np.int64)
    fits = np.floor(alloc[:, asked] / unit[asked] + 1e-9)
    result: npt.NDArray[np.int64] = np.maximum(fits.min(axis=1), 0.0).astype(np.int64)
    return result


def units_wanted(deficit: npt.NDArray[np.float64], unit: npt.NDArray[np.float64]) -> int:
    """How many ``unit``-sized pieces ``deficit`` amounts to (the largest over dimensions).

    ``unit`` is the need's ``min_unit``: the largest pod of the need in
    every dimension, so a machine that holds ``n`` units holds any ``n`` of
    its pods. A deficit in a dimension the unit does not ask for counts
    nothing here (the aggregate bound covers it).
    """
    asked = (unit > 0) & (deficit > 0)
    if not asked.any():
        return 0
    return math.ceil(float((deficit[asked] / unit[asked]).max()) - 1e-9)


def reference_cover_by_units(
    *,
    deficit: npt.NDArray[np.float64],
    aggregate: npt.NDArray[np.float64],
    unit: npt.NDArray[np.float64],
    available: npt.NDArray[np.float64],
    alloc: npt.NDArray[np.float64],
    cost: npt.NDArray[np.float64],
    tolerance: float,
) -> tuple[list[tuple[int, int]], npt.NDArray[np.float64]]:
    """``selection.cover_by_units`` as the numpy loop ``kernels.cover_units`` replaced."""
    deficit = settle_deficit(deficit.copy(), aggregate, tolerance)
    left = available.astype(np.int64).copy()
    hosted = units_hosted(alloc, unit)
    units = units_wanted(deficit, unit)
    picks: list[tuple[int, int]] = []
    while units > 0 or np.count_nonzero(deficit):
        live = ((left > 0) & (hosted > 0)).nonzero()[0]
        if len(live) == 0:
            break
        per = hosted[live]
        by_units = -(-units // per) if units > 0 else np.zeros(len(live), dtype=np.int64)
        by_aggregate = machines_needed(deficit, alloc[live])
        k = np.minimum(left[live], np.maximum(np.maximum(by_units, by_aggregate), 1))
        covered = np.minimum(k * per, units) if units > 0 else k * per
        score = k * cost[live] / np.maximum(covered, 1)
        order = np.lexsort((live, cost[live] / per, score))
        best = int(order[0])
        group = int(live[best])
        take = int(k[best])
        picks.append((group, take))
        left[group] -= take
        units = max(0, units - take * int(hosted[group]))
        deficit = np.maximum(
            settle_deficit(deficit - take * alloc[group], aggregate, tolerance), 0.0
        )
    return picks, deficit
