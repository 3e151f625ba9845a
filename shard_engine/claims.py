"""Claims: each machine of a cluster counts for one of its needs, in cycle order.

"Have" was computed per need as every matching machine of its cluster. That
is exact while the needs' masks do not overlap, and wrong when they do: a
production need and a batch need with the same requirements each counted
all the cluster's machines, so with the nodes full of batch pods both looked
covered and the production pods waited for batch to finish; two gangs that
chose one rack each counted the other's machines (ADR 0126).

So when some held machine matches more than one need, the needs *claim*
machines in cycle order (priority descending, then arrival): each takes the
share of what is left in its mask that covers its aggregate — the largest
ratio over the resources it asks for, the same fraction of every matching
profile, at most all of it. A need's own supply is the cluster's supply less
what the *other* needs claimed: its claim plus anything nobody claimed, so a
spare machine is still excess for Phase 3 and no machine counts twice.
Fractions keep this one vector operation per need; where masks are the same
or disjoint it is exact.

Pure functions on arrays; Phase 1 and Phase 3 call them only for clusters
whose needs overlap on a held machine.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shard_engine.linear import combine

__all__ = ["Claims", "claim"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


class Claims:
    """Per need, the supply it may count (``own``) over the held profiles ``held``."""

    __slots__ = ("held", "own", "shapes", "sub")

    def __init__(self, held: IntArray, own: FloatArray, sub: BoolArray, shapes: FloatArray):
        self.held = held
        self.own = own
        self.sub = sub
        self.shapes = shapes

    def have(self, row: int) -> FloatArray:
        """Allocatable per resource need ``row`` may count."""
        result = combine(self.own[row] * self.sub[row], self.shapes)
        return result

    def supply(self, row: int, width: int) -> FloatArray:
        """Machines per profile (``width`` of them) need ``row`` may count."""
        out = np.zeros(width)
        out[self.held] = self.own[row]
        return out


def claim(
    matrix: BoolArray, aggregate: FloatArray, supply: IntArray, alloc: FloatArray
) -> Claims | None:
    """The needs' claims on the cluster's ``supply``, or None when no held machine is shared.

    ``matrix[i, p]``: profile ``p`` may serve need ``i`` (rows in cycle
    order); ``aggregate[i]`` what need ``i`` asks for; ``supply`` machines
    per profile the cluster holds (any width up to the catalog's).
    """
    width = min(len(supply), matrix.shape[1])
    held = np.flatnonzero(supply[:width])
    if len(held) == 0 or matrix.shape[0] < 2:
        return None
    sub = matrix[:, held]
    if not (sub.sum(axis=0) > 1).any():
        return None
    shapes = alloc[held]
    if len(held) > _SMALL:
        return _claim_wide(sub, aggregate, supply[held].astype(np.float64), held, shapes)
    # Plain Python over the few held profiles and resources: numpy's per-call
    # overhead is most of the cost at these sizes (a cluster holds a handful of shapes).
    shape_rows = shapes.tolist()
    left = supply[held].astype(np.float64).tolist()
    masks = sub.tolist()
    asks = aggregate.tolist()
    dims = range(shapes.shape[1])
    claims = np.zeros((matrix.shape[0], len(held)))
    for i, mask in enumerate(masks):
        wanted = asks[i]
        share = 0.0
        for d in dims:
            if wanted[d] <= 0:
                continue
            offered = 0.0
            for p, inside in enumerate(mask):
                if inside:
                    offered += left[p] * shape_rows[p][d]
            if offered > 0:
                share = max(share, wanted[d] / offered)
        if share <= 0:
            continue
        share = min(share, 1.0)
        row = claims[i]
        for p, inside in enumerate(mask):
            if inside and left[p] > 0:
                taken = left[p] * share
                row[p] = taken
                left[p] -= taken
    own = supply[held].astype(np.float64) - claims.sum(axis=0) + claims
    return Claims(held, own, sub, shapes)


_SMALL = 12
"""Held profiles up to which :func:`claim` loops in plain Python (numpy overhead wins below)."""


def _claim_wide(
    sub: BoolArray, aggregate: FloatArray, supply: FloatArray, held: IntArray, shapes: FloatArray
) -> Claims:
    """:func:`claim` with one vector step per need, for clusters holding many shapes."""
    left = supply.copy()
    claims = np.zeros((sub.shape[0], len(held)))
    for i in range(sub.shape[0]):
        mine = left * sub[i]
        offered = combine(mine, shapes)
        usable = (aggregate[i] > 0) & (offered > 0)
        if not usable.any():
            continue
        share = min(1.0, float((aggregate[i][usable] / offered[usable]).max()))
        taken = mine * share
        claims[i] = taken
        left -= taken
    return Claims(held, supply - claims.sum(axis=0) + claims, sub, shapes)
