"""Covering a deficit with machines: how many of which shape.

Every phase that adds machines to a need ends in the same question: given a
deficit vector and candidate *groups* of identical machines (a profile in a
free pool, or a victim cluster's machines of one profile), how many of each
to take. Three strategies, all greedy and all vectorised over candidates:

* :func:`cover_by_cost` — Phase 1: repeatedly take the group with the lowest
  effective cost per dominant unit actually covered (node-pool score);
* :func:`cover_in_order` — Phase 2: groups arrive ranked by victim score;
  take from the best until the deficit is covered;
* :func:`cover_with_spread` — either phase, for needs with topology spread:
  one machine at a time into the emptiest allowed domain.

Each returns ``(group position, machines)`` picks and the residual deficit;
the caller turns picks into rows and actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from shard_engine.costs import machines_needed
from shard_engine.resources import is_accelerator
from shard_engine.topology import SpreadState, distinct_rows

__all__ = [
    "Pick",
    "cover_by_cost",
    "cover_by_units",
    "cover_in_order",
    "cover_with_spread",
    "cover_with_spread_stepwise",
    "settle_deficit",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Pick = tuple[int, int]


def settle_deficit(deficit: FloatArray, aggregate: FloatArray, tolerance: float) -> FloatArray:
    """Zero out deficits within rounding distance of zero (sums of floats drift)."""
    return _settled(deficit, aggregate, tolerance)[0]


def _settled(
    deficit: FloatArray, aggregate: FloatArray, tolerance: float
) -> tuple[FloatArray, FloatArray]:
    """:func:`settle_deficit` and the slack it used (what the compiled covers take)."""
    slack = (tolerance * np.maximum(aggregate, 1.0)).astype(np.float64, copy=False)
    return np.where(deficit > slack, deficit, 0.0).astype(np.float64, copy=False), slack


def cover_by_cost(
    *,
    deficit: FloatArray,
    aggregate: FloatArray,
    available: IntArray,
    alloc: FloatArray,
    cost: FloatArray,
    names: Sequence[str],
    tolerance: float,
) -> tuple[list[Pick], FloatArray]:
    """Greedy cover by effective cost per dominant unit covered.

    For each group the score is ``k × cost / min(k × capacity_d*, deficit_d*)``
    where ``k`` is how many machines of the group the deficit needs (or all
    the group has) and ``d*`` the dominant resource. The best group is taken
    whole (up to ``k``), the deficit shrinks, and the rest are re-scored.
    Ties break on the lower cost per unit of capacity, then the lower group
    position, so the result is deterministic.

    One compiled pass (``kernels.cover``) at any number of groups: 5–7×
    faster than the numpy formulation it replaced from a few dozen groups to
    a thousand, with the same arithmetic and tie-breaks (the numpy and the
    plain-Python formulations are the tests' oracles).
    """
    import shard_engine.kernels as kernels  # numba loads with the first cycle, not with the CLI

    dims = len(deficit)
    picks, need = kernels.cover(
        *_settled(deficit, aggregate, tolerance),
        np.ascontiguousarray(available, dtype=np.int64),
        np.ascontiguousarray(alloc, dtype=np.float64),
        np.ascontiguousarray(cost, dtype=np.float64),
        np.array(_accelerators(tuple(names), dims), dtype=np.bool_),
    )
    return [(int(g), int(n)) for g, n in picks.tolist()], need


@lru_cache(maxsize=64)
def _accelerators(names: tuple[str, ...], dims: int) -> tuple[bool, ...]:
    """Per dimension, whether it is an accelerator (names are few and reused every call)."""
    return tuple(j < len(names) and is_accelerator(names[j]) for j in range(dims))


def cover_by_units(
    *,
    deficit: FloatArray,
    aggregate: FloatArray,
    unit: FloatArray,
    available: IntArray,
    alloc: FloatArray,
    cost: FloatArray,
    tolerance: float,
) -> tuple[list[Pick], FloatArray]:
    """Greedy cover of a need with a ``min_unit``, by cost per unit actually hosted.

    A shape's worth to the need is how many of its units one machine holds
    after every dimension binds, not how much of one
    resource it offers: for 4-core/16 GiB pods a 16-core, 58 GiB machine
    holds three, an 8-core, 58 GiB one holds one. For each group ``k`` is
    the larger of the machines its units take (``ceil(units ÷ hosted)``)
    and the machines the aggregate takes (:func:`machines_needed`), capped by
    what the group has; its score is ``k × cost ÷ min(k × hosted, units)``.
    The best group is taken (up to ``k``), and the rest are re-scored. Ties
    break on cost per hosted unit, then group position (deterministic).
    Sizing by units is what makes the count survive packing: ceil(aggregate
    ÷ machine) is the optimum only when pods pack perfectly (ADR 0127).

    One compiled pass (``kernels.cover_units``); the numpy loop it replaced
    is the tests' oracle.
    """
    import shard_engine.kernels as kernels  # numba loads with the first cycle, not with the CLI

    picks, need = kernels.cover_units(
        *_settled(deficit, aggregate, tolerance),
        np.ascontiguousarray(unit, dtype=np.float64),
        np.ascontiguousarray(available, dtype=np.int64),
        np.ascontiguousarray(alloc, dtype=np.float64),
        np.ascontiguousarray(cost, dtype=np.float64),
    )
    return [(int(g), int(n)) for g, n in picks.tolist()], need


def cover_in_order(
    *,
    deficit: FloatArray,
    aggregate: FloatArray,
    available: IntArray,
    alloc: FloatArray,
    order: IntArray,
    tolerance: float,
) -> tuple[list[Pick], FloatArray]:
    """Take from groups in the given preference order until the deficit is covered.

    A group that covers none of what is still missing is skipped, so a
    victim is never drained for nothing.
    """
    deficit = settle_deficit(deficit.copy(), aggregate, tolerance)
    picks: list[Pick] = []
    for group in order.tolist():
        if not np.count_nonzero(deficit):
            break
        have = int(available[group])
        if have <= 0:
            continue
        need = int(machines_needed(deficit, alloc[group : group + 1])[0])
        if need <= 0:
            continue
        take = min(have, need)
        picks.append((group, take))
        deficit = np.maximum(
            settle_deficit(deficit - take * alloc[group], aggregate, tolerance), 0.0
        )
    return picks, deficit


def cover_with_spread(
    *,
    deficit: FloatArray,
    aggregate: FloatArray,
    available: IntArray,
    alloc: FloatArray,
    profiles: IntArray,
    preference: FloatArray,
    spread: SpreadState,
    max_steps: int,
    tolerance: float,
) -> tuple[list[Pick], FloatArray, bool]:
    """Water-fill: one machine at a time into the emptiest domain the spreads allow.

    Among groups that still cover part of the deficit and that no hard
    spread forbids, the one whose domains hold the fewest of the need's
    machines wins; ``preference`` (lower is better), then the group's
    position, break ties. Returns the picks (merged per group, in the order
    groups were first chosen), the residual deficit, and whether a hard
    spread blocked progress.

    Groups whose profiles sit in the same domains of every spread share
    their level and whether a spread allows them, so a step compares
    domains, not groups: each domain offers its best group still able to
    help (lowest preference, then position). A group that runs out, or
    stops covering anything still missing, never comes back within one
    call, because the deficit only shrinks. ``spread`` is updated with the
    picks, as one machine at a time would.
    """
    import shard_engine.kernels as kernels  # numba loads with the first cycle, not with the CLI

    count = len(available)
    kinds = len(spread.codes)
    # Each group's domain in every spread; groups alike in all share a signature.
    by_group = (
        np.stack([np.asarray(c)[profiles] for c in spread.codes], axis=1).astype(np.int64)
        if kinds and count
        else np.zeros((count, kinds), dtype=np.int64)
    )
    signature, which = distinct_rows(by_group)
    prefs = np.ascontiguousarray(preference, dtype=np.float64)
    queue = np.lexsort((np.arange(count), prefs, which)).astype(np.int64)
    start = np.searchsorted(which[queue], np.arange(len(signature) + 1)).astype(np.int64)
    width = max((len(c) for c in spread.counts), default=0)
    counts = np.zeros((kinds, max(width, 1)))
    eligible = np.zeros((kinds, max(width, 1)), dtype=np.bool_)
    for i, (c, e) in enumerate(zip(spread.counts, spread.eligible, strict=True)):
        counts[i, : len(c)] = c
        eligible[i, : len(e)] = e
    hard = [i for i, h in enumerate(spread.hard) if h]
    picks, need, blocked = kernels.spread_fill(
        *_settled(deficit, aggregate, tolerance),
        np.ascontiguousarray(available, dtype=np.int64),
        np.ascontiguousarray(alloc, dtype=np.float64),
        prefs,
        np.ascontiguousarray(signature, dtype=np.int64),
        queue,
        start,
        counts,
        eligible,
        np.array(hard, dtype=np.int64),
        np.array([float(spread.spreads[i].max_skew) for i in hard]),
        max_steps,
    )
    taken = [(int(g), int(n)) for g, n in picks.tolist()]
    for group, machines in taken:
        spread.add(int(profiles[group]), machines)
    return taken, need, bool(blocked)


def cover_with_spread_stepwise(
    *,
    deficit: FloatArray,
    aggregate: FloatArray,
    available: IntArray,
    alloc: FloatArray,
    profiles: IntArray,
    preference: FloatArray,
    spread: SpreadState,
    max_steps: int,
    tolerance: float,
) -> tuple[list[Pick], FloatArray, bool]:
    """:func:`cover_with_spread` stated step by step over arrays: the rule's reference.

    Each step re-scores every candidate group, which costs a dozen numpy
    calls per machine; :func:`cover_with_spread` decides identically by
    domain and is what the phases use. Tests hold the two to each other.
    """
    deficit = settle_deficit(deficit.copy(), aggregate, tolerance)
    left = available.astype(np.int64).copy()
    taken: dict[int, int] = {}
    blocked = False
    steps = 0
    while deficit.any() and steps < max_steps:
        steps += 1
        useful = (left > 0) & (alloc[:, deficit > 0] > 0).any(axis=1)
        live = np.flatnonzero(useful)
        if len(live) == 0:
            break
        ok = spread.allowed(profiles[live])
        if not ok.any():
            blocked = True
            break
        live = live[ok]
        level = spread.level(profiles[live])
        order = np.lexsort((live, preference[live], level))
        group = int(live[order[0]])
        taken[group] = taken.get(group, 0) + 1
        left[group] -= 1
        spread.add(int(profiles[group]), 1)
        deficit = np.maximum(settle_deficit(deficit - alloc[group], aggregate, tolerance), 0.0)
    return list(taken.items()), deficit, blocked
