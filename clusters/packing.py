"""Vector bin packing: which pods go on which node (seed 004, "Tetris in d dimensions").

A pod is a vector of demands (CPU, memory, GPUs, ...), a node a vector of
capacities; a pod fits when it fits in *every* dimension. Finding the fewest
nodes is NP-hard, so we use the heuristics Panigrahy, Talwar, Uyeda and
Wieder compare (2011), in two families:

item-centric (first fit decreasing, FFD)
    sort the pods by a scalar size, biggest first, and drop each into the
    first open node it fits, opening a new node when none does.
    ``ffd-sum`` sorts by the plain sum of the normalised demands,
    ``ffd-avg`` by the sum weighted with each dimension's average demand
    (FFDAvgSum: scarce dimensions count more), ``ffd-prod`` by the product.

bin-centric (geometric)
    open one node and keep asking which remaining pod best fills the space
    left; close the node when nothing fits. ``dot-product`` picks the pod
    maximising ``Σ a_i · I_i · r_i`` (it points the way the free space does),
    ``l2`` the pod minimising ``Σ a_i · (r_i − I_i)²`` (its shape is closest
    to the free space).

Demands are normalised by the node's capacity before scoring, and ``a`` is
the vector of average normalised demands. ``python -m bench packing``
replays the seed's construction (80 anti-correlated pods, 200 seeded runs)
and prints every heuristic's mean node count side by side; the winner there
is :data:`DEFAULT_HEURISTIC`.

The same scores choose a node for one pod on a live cluster
(:func:`choose_node`): first fit for the FFD family, best dot product or
closest L2 for the geometric ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_HEURISTIC",
    "Heuristic",
    "Packing",
    "choose_node",
    "lower_bound",
    "pack",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Slack for float rounding when summing normalised demands (a node filled
# exactly to 1.0 by 1/3 + 1/3 + 1/3 must still count as fitting).
_EPS = 1e-9


class Heuristic(Enum):
    """A packing heuristic, by its configuration name."""

    FFD_SUM = "ffd-sum"
    FFD_AVG = "ffd-avg"
    FFD_PROD = "ffd-prod"
    DOT_PRODUCT = "dot-product"
    L2 = "l2"

    @property
    def bin_centric(self) -> bool:
        """True for the geometric heuristics (open a node, then pick pods)."""
        return self in (Heuristic.DOT_PRODUCT, Heuristic.L2)

    @classmethod
    def parse(cls, name: str) -> Heuristic:
        """The heuristic called ``name``; a ``ValueError`` lists the choices."""
        for member in cls:
            if member.value == name:
                return member
        choices = ", ".join(m.value for m in cls)
        raise ValueError(f"packing heuristic: unknown {name!r}; choose from {choices}")


DEFAULT_HEURISTIC = Heuristic.DOT_PRODUCT
"""The default: Dot Product uses the fewest nodes on the benchmark (docs/adr/0080)."""


@dataclass(frozen=True, slots=True)
class Packing:
    """The result of packing: ``assignment[i]`` is pod i's node, ``-1`` if it fits on no node.

    ``loads`` is each node's summed demand in the caller's units.
    """

    assignment: IntArray
    loads: FloatArray

    @property
    def nodes(self) -> int:
        """How many nodes were opened."""
        return int(self.loads.shape[0])

    @property
    def unplaced(self) -> int:
        """Pods larger than an empty node in some dimension."""
        return int(np.count_nonzero(self.assignment < 0))


def _normalise(items: FloatArray, capacity: FloatArray) -> FloatArray:
    cap = np.where(capacity > 0, capacity, 1.0)
    out: FloatArray = items / cap
    # A demand in a dimension the node does not have can never fit.
    out[:, capacity <= 0] = np.where(items[:, capacity <= 0] > 0, np.inf, 0.0)
    return out


def _weights(norm: FloatArray, weights: FloatArray | None) -> FloatArray:
    if weights is not None:
        return np.asarray(weights, dtype=np.float64)
    finite = np.where(np.isfinite(norm), norm, 0.0)
    mean: FloatArray = finite.mean(axis=0) if len(finite) else np.ones(norm.shape[1])
    return np.where(mean > 0, mean, 1.0)


def lower_bound(items: FloatArray, capacity: FloatArray) -> int:
    """⌈max_i Σ_ℓ I^ℓ_i⌉: no packing uses fewer nodes (seed 004's lower bound)."""
    norm = _normalise(np.asarray(items, dtype=np.float64), np.asarray(capacity, dtype=np.float64))
    if len(norm) == 0:
        return 0
    return int(np.ceil(norm.sum(axis=0).max() - _EPS))


def pack(
    items: FloatArray,
    capacity: FloatArray,
    heuristic: Heuristic = DEFAULT_HEURISTIC,
    *,
    weights: FloatArray | None = None,
) -> Packing:
    """Pack ``items`` (pods × dimensions) onto identical nodes of ``capacity``.

    Pods that exceed an empty node in some dimension are left unplaced
    (``assignment`` −1) rather than opening a node they cannot use.
    """
    items = np.asarray(items, dtype=np.float64)
    capacity = np.asarray(capacity, dtype=np.float64)
    if items.ndim != 2 or items.shape[1] != capacity.shape[0]:
        raise ValueError(
            f"items: expected shape (pods, {capacity.shape[0]}), got {tuple(items.shape)}"
        )
    if np.any(~np.isfinite(items)) or np.any(items < 0):
        raise ValueError("items: demands must be finite and non-negative")
    norm = _normalise(items, capacity)
    a = _weights(norm, weights)
    fits_empty = np.all(norm <= 1.0 + _EPS, axis=1)
    if heuristic.bin_centric:
        assignment, count = _pack_bin_centric(norm, a, fits_empty, heuristic)
    else:
        assignment, count = _pack_ffd(norm, a, fits_empty, heuristic)
    loads = np.zeros((count, items.shape[1]))
    placed = assignment >= 0
    np.add.at(loads, assignment[placed], items[placed])
    return Packing(assignment=assignment, loads=loads)


def _ffd_key(norm: FloatArray, a: FloatArray, heuristic: Heuristic) -> FloatArray:
    finite = np.where(np.isfinite(norm), norm, 0.0)
    if heuristic is Heuristic.FFD_SUM:
        key: FloatArray = finite.sum(axis=1)
    elif heuristic is Heuristic.FFD_AVG:
        key = finite @ a
    else:
        key = np.prod(np.where(finite > 0, finite, 1.0), axis=1)
    return key


def _pack_ffd(
    norm: FloatArray, a: FloatArray, fits_empty: npt.NDArray[np.bool_], heuristic: Heuristic
) -> tuple[IntArray, int]:
    """Item-centric: biggest first, each into the first open node with room."""
    n, d = norm.shape
    order = np.argsort(-_ffd_key(norm, a, heuristic), kind="stable")
    assignment = np.full(n, -1, dtype=np.int64)
    loads = np.zeros((max(n, 1), d))
    count = 0
    for i in order:
        if not fits_empty[i]:
            continue
        item = norm[i]
        if count:
            ok = np.all(loads[:count] + item <= 1.0 + _EPS, axis=1)
            hit = int(np.argmax(ok)) if ok.any() else -1
        else:
            hit = -1
        if hit < 0:
            hit = count
            count += 1
        loads[hit] += item
        assignment[i] = hit
    return assignment, count


def _pack_bin_centric(
    norm: FloatArray, a: FloatArray, fits_empty: npt.NDArray[np.bool_], heuristic: Heuristic
) -> tuple[IntArray, int]:
    """Bin-centric: fill one node at a time with the pod that best fits what is left."""
    n, _ = norm.shape
    assignment = np.full(n, -1, dtype=np.int64)
    remaining = fits_empty.copy()
    count = 0
    while remaining.any():
        residual = np.ones(norm.shape[1])
        node = count
        count += 1
        while True:
            fits = remaining & np.all(norm <= residual + _EPS, axis=1)
            if not fits.any():
                break
            candidates = np.flatnonzero(fits)
            chosen = norm[candidates]
            if heuristic is Heuristic.DOT_PRODUCT:
                pick = int(np.argmax(chosen @ (a * residual)))
            else:
                pick = int(np.argmin(((residual - chosen) ** 2) @ a))
            i = int(candidates[pick])
            assignment[i] = node
            remaining[i] = False
            residual = residual - norm[i]
    return assignment, count


def choose_node(
    item: FloatArray,
    free: FloatArray,
    capacity: FloatArray,
    heuristic: Heuristic = DEFAULT_HEURISTIC,
    *,
    weights: FloatArray | None = None,
) -> int:
    """The node (row of ``free``) one pod goes to on a live cluster, or −1 if none has room.

    ``free`` is each node's free capacity, ``capacity`` each node's size
    (rows, or one row for identical nodes). FFD heuristics take the first
    node with room; Dot Product the node whose free space points the way
    the pod does (cosine, ties to the fullest node); L2 the node whose free
    space is closest to the pod (best fit).
    """
    if len(free) == 0:
        return -1
    fits = np.all(free + _EPS >= item, axis=1)
    if not fits.any():
        return -1
    if not heuristic.bin_centric:
        return int(np.argmax(fits))
    cap = np.where(capacity > 0, capacity, 1.0)
    unit = item / cap
    residual = free / cap
    a = np.ones(item.shape[0]) if weights is None else weights
    if heuristic is Heuristic.DOT_PRODUCT:
        # Direction, not size: the cosine between the pod and each node's free
        # space, so a pod goes where it fills the space the way it is shaped.
        # (The raw dot product would prefer the emptiest node and spread pods.)
        # Ties go to the node with the least room left (best fit).
        dot = (residual * unit * a).sum(axis=1)
        norms = np.sqrt((residual**2 * a).sum(axis=1)) * np.sqrt((unit**2 * a).sum(axis=-1))
        cosine = dot / np.where(norms > 0, norms, 1.0)
        left = residual.sum(axis=1)
        score = np.where(fits, np.round(cosine, 9) - 1e-6 * left, -np.inf)
        return int(np.argmax(score))
    dist = ((residual - unit) ** 2 * a).sum(axis=1)
    dist = np.where(fits, dist, np.inf)
    return int(np.argmin(dist))
