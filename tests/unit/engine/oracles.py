"""Formulations the engine's compiled code replaced, kept as the tests' oracles."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shard_engine.costs import dominant_dimension, machines_needed
from shard_engine.selection import settle_deficit


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
    deficit = settle_deficit(deficit.copy(), aggregate, tolerance)
