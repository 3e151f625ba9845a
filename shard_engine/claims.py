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
   the plan commits, with the lower need's spare bound machines the higher
   one took in pass 2 (else the lower need would claim the same machines
   again from its remaining bound ones), so the next cycle counts them all
   as the higher need's and the takeover happens once.

A need's own supply is the cluster's supply less what the *other* needs
claimed: its claim plus anything nobody claimed, so a spare machine is
still excess for Phase 3 and no machine counts twice. Claims are fractions
of machines (shares, not placements).

Pure functions on arrays; Phase 1 and Phase 3 call them only for clusters
whose needs overlap on a held machine. The passes are compiled (numba,
ADR 0162): a claim is a few hundred small sequential steps over one
cluster's needs and held profiles, where numpy's per-call overhead was
most of the cycle. The compiled code does the same floating-point
operations in the same order as the numpy it replaced, so every decision
is bit for bit what it was.
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
        # took from a lower one, plus the lower one's unclaimed bound machines it
        # took as anyone's; committing them rebinds that many machines.
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
    bound: Callable[[IntArray], FloatArray | None] | None = None,
    priority: IntArray | None = None,
    *,
    counted: Callable[[], tuple[IntArray, FloatArray] | None] | None = None,
) -> Claims | None:
    """The needs' claims on the cluster's ``supply``, or None when no held machine is shared.

    ``matrix[i, p]``: profile ``p`` may serve need ``i`` (rows in cycle
    order); ``aggregate[i]`` what need ``i`` asks for; ``supply`` machines
    per profile the cluster holds (any width up to the catalog's);
    ``bound(held)``, asked only when some machine is shared, gives how many
    of them were placed for each need (rows for the first needs, one column
    per profile of ``held``, the profiles the cluster holds;
    :class:`~shard_engine.binding.Bindings`): a need claims those first.
    With ``priority`` (per row, descending), a need still short then takes
    what strictly lower-priority needs claimed, the lowest first: the
    cluster's scheduler puts its higher-priority pods first, so the lowest
    need is the one shown short (``Claims.displaced`` says what moved).

    ``counted``, given instead of ``bound``, reads the bound machines per
    (need, profile) over every profile they are on, without the held
    profiles (``Worksheet.counted``: sorted profiles, one column each): the
    claim is then one compiled call (``kernels.claim_all``), the same
    result as with the equivalent ``bound``.
    """
    width = min(len(supply), matrix.shape[1])
    if matrix.shape[0] < 2:
        return None
    import shard_engine.kernels as kernels  # numba loads with the first claim, not with the CLI

    if counted is not None:
        return _claim_at_once(matrix, aggregate, supply, alloc, width, counted(), priority)

    held, sub, shapes, counts, several = kernels.gather(
        np.ascontiguousarray(matrix, dtype=np.bool_),
        np.ascontiguousarray(supply, dtype=np.int64),
        np.asarray(alloc, dtype=np.float64),  # the catalog's columns: a view, not copied
        width,
    )
    if len(held) == 0 or not several:
        return None
    placed = bound(held) if bound is not None else None
    ranked = priority is not None and len(priority) >= sub.shape[0]
    own, moves = kernels.divide(
        sub,
        counts,
        shapes,
        np.ascontiguousarray(aggregate[: sub.shape[0]], dtype=np.float64),
        kernels.NO_PLACED if placed is None else np.ascontiguousarray(placed, dtype=np.float64),
        placed is not None,
        held,
        np.ascontiguousarray(priority, dtype=np.int64) if ranked else kernels.NO_PRIORITY,
        ranked,
    )
    return _claims(held, own, sub, shapes, moves)


def _claim_at_once(
    matrix: BoolArray,
    aggregate: FloatArray,
    supply: IntArray,
    alloc: FloatArray,
    width: int,
    found: tuple[IntArray, FloatArray] | None,
    priority: IntArray | None,
) -> Claims | None:
    """:func:`claim` with its bound machines already read, as one compiled call."""
    import shard_engine.kernels as kernels

    needs = matrix.shape[0]
    ranked = priority is not None and len(priority) >= needs
    shared, held, sub, shapes, own, moves = kernels.claim_all(
        np.ascontiguousarray(matrix, dtype=np.bool_),
        np.ascontiguousarray(supply, dtype=np.int64),
        np.asarray(alloc, dtype=np.float64),  # the catalog's columns: a view, not copied
        width,
        np.ascontiguousarray(aggregate[:needs], dtype=np.float64),
        kernels.NOTHING if found is None else found[0],
        kernels.NO_PLACED if found is None else found[1],
        found is not None,
        np.ascontiguousarray(priority, dtype=np.int64) if ranked else kernels.NO_PRIORITY,
        ranked,
    )
    if not shared:
        return None
    return _claims(held, own, sub, shapes, moves)


def _claims(
    held: IntArray, own: FloatArray, sub: BoolArray, shapes: FloatArray, moves: FloatArray
) -> Claims:
    """The division's result as :class:`Claims`, its moves (rows of four) as tuples."""
    displaced = tuple((int(j), int(i), int(p), m) for j, i, p, m in moves.tolist())
    return Claims(held, own, sub, shapes, displaced)
