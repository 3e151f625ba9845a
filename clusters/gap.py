"""Orbit's reclaimable gap (seed 001): where best-effort work runs, and who leaves first.

A node's **room for best-effort work** is its allocatable minus the
*reservations* of the guaranteed pods on it (latency-sensitive and batch)
minus the *limits* of the best-effort pods already borrowing it. It holds
the node's free space plus every guaranteed pod's gap (limit −
reservation): a latency-sensitive pod placed at its limit but expected to
use its reservation leaves the difference to borrow.

Best-effort pods reserve nothing, so placing one never blocks a guaranteed
pod; when a guaranteed pod's arrival (or a reservation that grows) closes
the gap, best-effort pods on that node are evicted first — lowest priority,
then largest — until the node's reservations and borrowings fit again.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from clusters.packing import DEFAULT_HEURISTIC, FloatArray, Heuristic, IntArray, choose_node

__all__ = ["best_effort_room", "evict_for_gap", "fit_in_gap"]

_EPS = 1e-9


def best_effort_room(
    allocatable: FloatArray, reserved: FloatArray, borrowed: FloatArray
) -> FloatArray:
    """Per node: allocatable − reservations − borrowed best-effort limits, floored at 0."""
    room: FloatArray = np.maximum(allocatable - reserved - borrowed, 0.0)
    return room


def fit_in_gap(
    limits: FloatArray,
    room: FloatArray,
    capacity: FloatArray,
    heuristic: Heuristic = DEFAULT_HEURISTIC,
) -> IntArray:
    """Place best-effort pods (rows of ``limits``) into the nodes' ``room``, biggest first.

    Returns each pod's node, or −1 for a pod the gap cannot hold. ``room`` is
    not modified. ``capacity`` (per node) normalises the heuristic's scores.
    """
    left = np.array(room, dtype=np.float64, copy=True)
    out = np.full(len(limits), -1, dtype=np.int64)
    if len(limits) == 0 or len(left) == 0:
        return out
    scale = np.where(capacity.max(axis=0) > 0, capacity.max(axis=0), 1.0)
    order = np.argsort(-(limits / scale).sum(axis=1), kind="stable")
    for i in order:
        node = choose_node(limits[i], left, capacity, heuristic)
        if node >= 0:
            left[node] -= limits[i]
            out[i] = node
    return out


def evict_for_gap(
    allocatable: FloatArray,
    reserved: FloatArray,
    borrowed: FloatArray,
    priorities: npt.NDArray[np.int64],
) -> list[int]:
    """Which best-effort pods on one node leave so reservations and borrowings fit again.

    ``borrowed`` holds the limits of the node's best-effort pods (one row
    each), ``priorities`` their priorities. Lowest priority goes first, the
    largest pod first among equals; returns their row indices in eviction
    order (empty when the node is not over-committed).
    """
    over = reserved + borrowed.sum(axis=0) - allocatable
    if np.all(over <= _EPS) or len(borrowed) == 0:
        return []
    size = borrowed.sum(axis=1)
    order = np.lexsort((-size, priorities))
    out: list[int] = []
    for i in order:
        if np.all(over <= _EPS):
            break
        out.append(int(i))
        over = over - borrowed[i]
    return out
