"""Gang accounting: each gang of a cluster counts only the machines it claims.

A gang is a need with a Same requirement (ADR 0126). "Have" is otherwise
computed per need as every matching machine of its cluster, which is right
for ordinary needs (any machine serves any pod that fits) but wrong for two
gangs of one cluster: the second gang, choosing the rack the first already
holds, would count the first gang's machines and ask for nothing.

So the cluster's gangs claim machines in cycle order (priority, then
arrival): each takes, from what earlier gangs left, as many machines of its
own domain as cover its aggregate. A gang's *supply* is then the cluster's
supply minus what the *other* gangs claimed. It covers the gang's own
claim and any unclaimed machine of its domain, so a spare machine still
counts as excess for Phase 3, and a machine another gang counts is never
counted twice.

Pure functions on arrays; the callers (Phase 1, Phase 3) keep their
matrix-product form for every other need.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["gang_rows", "gang_supply"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def gang_rows(gang_keys: tuple[tuple[str, ...], ...], count: int) -> list[int]:
    """Indices of the first ``count`` rows that are gangs (a non-empty Same key set)."""
    return [i for i in range(min(count, len(gang_keys))) if gang_keys[i]]


def _claim(
    mask: BoolArray, aggregate: FloatArray, left: IntArray, alloc: FloatArray, slack: FloatArray
) -> IntArray:
    """Machines per profile one gang takes from ``left`` to cover ``aggregate``.

    Profiles in index order (the catalog's, deterministic); from each as
    many machines as the largest remaining deficit over the resources that
    profile offers asks for.
    """
    taken = np.zeros(len(left), dtype=np.int64)
    deficit = aggregate.astype(np.float64).copy()
    for p in np.flatnonzero(mask[: len(left)] & (left[: len(mask)] > 0)).tolist():
        short = deficit > slack
        if not short.any():
            break
        shape = alloc[p]
        useful = short & (shape > 0)
        if not useful.any():
            continue
        wanted = max(math.ceil(float(x) - 1e-9) for x in (deficit[useful] / shape[useful]))
        machines = min(int(left[p]), max(wanted, 1))
        taken[p] = machines
        deficit -= machines * shape
    return taken


def gang_supply(
    matrix: BoolArray,
    aggregate: FloatArray,
    rows: list[int],
    supply: IntArray,
    alloc: FloatArray,
    slack: FloatArray,
) -> dict[int, IntArray]:
    """Per gang row, the cluster's supply minus what the other gangs claimed.

    ``rows`` are the gang rows in cycle order; ``supply`` machines per
    profile held by the cluster (of any width up to the catalog's);
    ``slack`` per row and resource, the rounding a deficit may keep.
    """
    if not rows:
        return {}
    width = len(supply)
    left = supply.astype(np.int64).copy()
    claims: dict[int, IntArray] = {}
    for i in rows:
        mask = np.zeros(width, dtype=np.bool_)
        cols = min(width, matrix.shape[1])
        mask[:cols] = matrix[i, :cols]
        taken = _claim(mask, aggregate[i], left, alloc, slack[i])
        claims[i] = taken
        left -= taken
    total = supply.astype(np.int64) - left
    return {i: supply.astype(np.int64) - total + claims[i] for i in rows}
