"""Cost functions: what a machine costs a need, and how long a victim gets to leave.

``effective_cost = price + interruption_probability × interruption_penalty``
(paper §4): the expected hourly cost of running the need on that machine,
interruptions included. Spot versus on-demand falls out of it with no tiers.

Choosing among shapes uses the node-pool score of "Tetris in d dimensions":
cost divided by the *dominant units actually covered*. A 64-core machine
has the lowest price per core and is still the worst choice for three
one-core pods, because it covers three cores, not sixty-four.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shard_engine.resources import is_accelerator

__all__ = [
    "dominant_dimension",
    "drain_grace_seconds",
    "effective_cost",
    "machines_needed",
]

FloatArray = npt.NDArray[np.float64]


def effective_cost(
    price: FloatArray | float, probability: FloatArray | float, penalty: float
) -> FloatArray:
    """``price + probability × penalty``, elementwise (dollars per hour)."""
    return np.asarray(price, dtype=np.float64) + np.asarray(probability, dtype=np.float64) * float(
        penalty
    )


def drain_grace_seconds(
    gap: int, thresholds: Sequence[tuple[int, int]], default_seconds: int
) -> int:
    """Drain grace for a preemption with priority ``gap`` (preemptor minus victim).

    Strict comparisons, first match wins, exactly as the paper's function:
    with the default thresholds a gap of exactly 500000 gets two minutes and
    500001 gets thirty seconds.
    """
    for threshold, seconds in thresholds:
        if gap > threshold:
            return seconds
    return default_seconds


def dominant_dimension(
    deficit: FloatArray, capacity: FloatArray, names: Sequence[str]
) -> int | None:
    """The resource that decides how many machines a deficit takes.

    An accelerator wins whenever the deficit has one. Otherwise it is the
    resource needing the most machines of the largest candidate shape
    (``deficit / max capacity``), which is "whichever is scarcer for the
    pool" in the node-pool score. Resources no candidate offers are skipped:
    they cannot be covered at all and must not hide the ones that can.
    Returns None when no remaining deficit can be covered.
    """
    best: int | None = None
    best_ratio = 0.0
    best_accelerator = False
    for d in np.flatnonzero(deficit > 0).tolist():
        top = float(capacity[d])
        if top <= 0:
            continue
        accelerator = d < len(names) and is_accelerator(names[d])
        ratio = float(deficit[d]) / top
        if (accelerator, ratio) > (best_accelerator, best_ratio):
            best, best_ratio, best_accelerator = d, ratio, accelerator
    return best


def machines_needed(deficit: FloatArray, alloc: FloatArray) -> npt.NDArray[np.int64]:
    """Per candidate shape (rows of ``alloc``), machines needed to cover what it can of ``deficit``.

    Resources a shape lacks are ignored for that shape (another shape must
    cover them); a shape that covers none of the deficit needs zero.
    """
    positive = deficit > 0
    if not positive.any():
        return np.zeros(len(alloc), dtype=np.int64)
    a = alloc[:, positive]
    d = deficit[positive]
    with np.errstate(divide="ignore", invalid="ignore"):
        counts = np.where(a > 0, np.ceil(d / np.where(a > 0, a, 1.0) - 1e-9), 0.0)
    result: npt.NDArray[np.int64] = counts.max(axis=1).astype(np.int64)
    return result
