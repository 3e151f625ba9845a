"""Claims: each machine of a cluster counts for one of its needs, in cycle order.

"Have" was computed per need as every matching machine of its cluster. That
is exact while the needs' masks do not overlap, and wrong when they do: a
production need and a batch need with the same requirements each counted
all the cluster's machines, so with the nodes full of batch pods both looked
covered and the production pods waited for batch to finish; two gangs that
chose one rack each counted the other's machines (ADR 0126).

So when some held machine matches more than one need, the needs claim
machines in three passes (cycle order: priority descending, then arrival):

1. each need takes back the machines *bound* to it (placed for it by a
   commit, or echoed by its provider after a restart; ``binding``), as many
   as cover its aggregate; the rest of them are anyone's (ADR 0152);
2. each need still short takes from what nobody holds, the profiles the
   fewest later needs can use first, so a broad need leaves a narrower
   one's machines alone;
3. with priorities, a need still short takes over what strictly
   lower-priority needs claimed, the lowest first: the cluster's scheduler
   puts its higher-priority pods first, so the lowest need is the one shown
   short and bought for; the engine rebinds the machines taken over when
   the plan commits, so the next cycle counts them as the higher need's.

A need's own supply is the cluster's supply less what the *other* needs
claimed: its claim plus anything nobody claimed, so a spare machine is
still excess for Phase 3 and no machine counts twice. Claims are fractions
of machines (shares, not placements).

Pure functions on arrays; Phase 1 and Phase 3 call them only for clusters
whose needs overlap on a held machine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from shard_engine.linear import combine

__all__ = ["Claims", "claim"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


class Claims:
    """Per need, the supply it may count (``own``) over the held profiles ``held``."""

    __slots__ = ("displaced", "held", "own", "shapes", "sub")

    def __init__(
        self,
        held: IntArray,
        own: FloatArray,
        sub: BoolArray,
        shapes: FloatArray,
        displaced: tuple[tuple[int, int, int, float], ...] = (),
    ):
        self.held = held
        self.own = own
        self.sub = sub
        self.shapes = shapes
        # (from need, to need, profile, machines): claims a higher-priority need
        # took from a lower one; committing them rebinds those machines.
        self.displaced = displaced

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
    matrix: BoolArray,
    aggregate: FloatArray,
    supply: IntArray,
    alloc: FloatArray,
    bound: Callable[[], FloatArray | None] | None = None,
    priority: IntArray | None = None,
) -> Claims | None:
    """The needs' claims on the cluster's ``supply``, or None when no held machine is shared.

    ``matrix[i, p]``: profile ``p`` may serve need ``i`` (rows in cycle
    order); ``aggregate[i]`` what need ``i`` asks for; ``supply`` machines
    per profile the cluster holds (any width up to the catalog's);
    ``bound()``, asked only when some machine is shared, gives how many of
    them were placed for each need (rows for the first needs, by profile;
    :class:`~shard_engine.binding.Bindings`): a need claims those first.
    With ``priority`` (per row, descending), a need still short then takes
    what strictly lower-priority needs claimed, the lowest first: the
    cluster's scheduler puts its higher-priority pods first, so the lowest
    need is the one shown short (``Claims.displaced`` says what moved).
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
    # How many later needs (in cycle order) could use each held profile: a need
    # takes the profiles fewest later needs can use first, so a broad need does
    # not take what a narrower one after it depends on.
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
        # First every need takes back the machines placed for it, as far as it
        # still wants them; what it no longer wants is anyone's.
        if (own_bound.sum(axis=0) <= counts).all():
            # The usual case, in one step: no profile is bound beyond what is
            # held, and a need bound to machines of one shape takes as many of
            # them as cover what it asks for (what it takes from one profile
            # does not depend on the others, so the needs are independent).
            single = (own_bound > 0).sum(axis=1) == 1
            rows = np.flatnonzero(single)
            if len(rows):
                at = (own_bound[rows] > 0).argmax(axis=1)
                shape = shapes[at]
                ask = wanted[rows]
                per = np.divide(ask, shape, out=np.zeros_like(ask), where=(ask > 0) & (shape > 0))
                taken = np.minimum(own_bound[rows, at], per.max(axis=1))
                claims[rows, at] = taken
                np.subtract.at(left, at, taken)
                wanted[rows] = np.maximum(ask - taken[:, None] * shape, 0.0)
            partial_rows = np.flatnonzero(~single & own_bound.any(axis=1)).tolist()
        else:
            partial_rows = np.flatnonzero(own_bound.any(axis=1)).tolist()
        for i in partial_rows:
            available = np.minimum(own_bound[i], left)
            taken = _take(wanted[i], available, later[i], shapes)
            claims[i] += taken
            left -= taken
            wanted[i] = np.maximum(wanted[i] - combine(taken, shapes), 0.0)
    # Only needs still wanting with something left in their mask; what is
    # left only shrinks, so a need with nothing left now gets nothing later.
    open_rows = np.flatnonzero(wanted.any(axis=1) & (sub & (left > 0)).any(axis=1))
    for i in open_rows.tolist():
        if not (left * sub[i]).any():
            continue
        taken = _take(wanted[i], left * sub[i], later[i], shapes)
        claims[i] += taken
        left -= taken
        wanted[i] = np.maximum(wanted[i] - combine(taken, shapes), 0.0)
    displaced: list[tuple[int, int, int, float]] = []
    if priority is not None and len(priority) >= sub.shape[0]:
        for i in np.flatnonzero(wanted.any(axis=1)).tolist():
            for j in range(sub.shape[0] - 1, i, -1):  # the lowest priority first
                if not wanted[i].any():
                    break
                if priority[j] >= priority[i]:
                    break
                offered = claims[j] * sub[i]
                if not offered.any():
                    continue
                taken = _take(wanted[i], offered, later[i], shapes)
                moved = np.flatnonzero(taken > 0)
                if len(moved) == 0:
                    continue
                claims[j] -= taken
                claims[i] += taken
                wanted[i] = np.maximum(wanted[i] - combine(taken, shapes), 0.0)
                displaced.extend((j, i, int(held[p]), float(taken[p])) for p in moved.tolist())
    own = counts - claims.sum(axis=0) + claims
    return Claims(held, own, sub, shapes, tuple(displaced))


_SMALL = 12
"""Candidate profiles up to which a take loops in plain Python (numpy overhead wins below)."""


def _take(
    wanted: FloatArray, available: FloatArray, contest: IntArray, shapes: FloatArray
) -> FloatArray:
    """Machines per profile that cover ``wanted``, least contested profiles first.

    Whole profiles while some asked resource is still short, the last one in
    part (a fraction of a machine: claims are shares, not placements). Ties
    in contest go to the lower profile.
    """
    taken = np.zeros(len(available))
    asked = wanted > 0
    if not asked.any():
        return taken
    inside = np.flatnonzero(available > 0)
    if len(inside) == 0:
        return taken
    if len(inside) > _SMALL:
        return _take_wide(wanted, asked, available, contest, shapes, inside, taken)
    # Plain Python over the few candidate profiles: numpy's per-call overhead
    # is most of the cost at these sizes.
    rest = wanted.tolist()
    dims = range(len(rest))
    have = available[inside].tolist()
    rows = shapes[inside].tolist()
    for _, k in sorted(zip(contest[inside].tolist(), range(len(have)), strict=True)):
        shape = rows[k]
        machines = 0.0
        for d in dims:
            if rest[d] > 0 and shape[d] > 0:
                machines = max(machines, rest[d] / shape[d])
        if machines <= 0:
            continue
        count = min(have[k], machines)
        taken[inside[k]] = count
        done = True
        for d in dims:
            if rest[d] > 0:
                rest[d] = max(0.0, rest[d] - count * shape[d])
                done = done and rest[d] <= 0
        if done:
            break
    return taken


def _take_wide(
    wanted: FloatArray,
    asked: BoolArray,
    available: FloatArray,
    contest: IntArray,
    shapes: FloatArray,
    inside: IntArray,
    taken: FloatArray,
) -> FloatArray:
    """:func:`_take` in vector steps, for many candidate profiles (``inside``).

    A running sum in the order of contest finds the profiles ahead of which
    some asked resource is still short: those are taken whole, the last of
    them in part.
    """
    useful = inside[(shapes[inside][:, asked] > 0).any(axis=1)]
    if len(useful) == 0:
        return taken
    order = useful[np.lexsort((useful, contest[useful]))]
    offered = available[order][:, None] * shapes[order]
    before = np.add.accumulate(offered, axis=0) - offered  # cover of the profiles ahead
    take = order[((before < wanted) & asked).any(axis=1)]
    if len(take) == 0:
        return taken
    taken[take] = available[take]
    last = take[-1]
    rest = np.maximum(wanted - before[len(take) - 1], 0.0)
    usable = asked & (shapes[last] > 0)
    if usable.any():
        taken[last] = min(taken[last], float((rest[usable] / shapes[last][usable]).max()))
    return taken
