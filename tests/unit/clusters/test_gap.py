"""Orbit's gap: best-effort pods borrow reserved-but-unused capacity and leave first."""

from __future__ import annotations

import numpy as np

from clusters.gap import best_effort_room, evict_for_gap, fit_in_gap


def test_room_is_free_space_plus_the_guaranteed_pods_gap() -> None:
    allocatable = np.array([[8.0, 32.0]])
    # A latency-sensitive pod placed at its limit (6 cores) but reserving 2.
    reserved = np.array([[2.0, 8.0]])
    room = best_effort_room(allocatable, reserved, np.zeros((1, 2)))
    assert room.tolist() == [[6.0, 24.0]]
    assert best_effort_room(allocatable, reserved, np.array([[7.0, 0.0]])).tolist() == [[0.0, 24.0]]


def test_best_effort_pods_fit_into_the_gap_until_it_is_full() -> None:
    room = np.array([[4.0, 8.0], [1.0, 1.0]])
    capacity = np.array([[8.0, 32.0], [8.0, 32.0]])
    limits = np.array([[3.0, 2.0], [1.0, 1.0], [2.0, 2.0]])
    placed = fit_in_gap(limits, room, capacity)
    assert placed[0] == 0  # biggest first, only node 0 holds it
    assert (placed >= 0).sum() == 2  # 3+1 on node 0 and 1 on node 1; the 2-core pod has no room
    used = np.zeros_like(room)
    for i, node in enumerate(placed):
        if node >= 0:
            used[node] += limits[i]
    assert np.all(used <= room)
    assert room.tolist() == [[4.0, 8.0], [1.0, 1.0]], "the caller's room is not modified"


def test_when_the_gap_closes_the_lowest_priority_best_effort_pods_leave_first() -> None:
    allocatable = np.array([8.0, 32.0])
    reserved = np.array([6.0, 8.0])  # a guaranteed pod just arrived
    borrowed = np.array([[1.0, 1.0], [2.0, 1.0], [1.0, 1.0]])
    priorities = np.array([5, 1, 1], dtype=np.int64)
    order = evict_for_gap(allocatable, reserved, borrowed, priorities)
    # Over by 2 cores: the 2-core pod at priority 1 leaves (largest among the lowest) and suffices.
    assert order == [1]
    assert evict_for_gap(allocatable, np.array([1.0, 1.0]), borrowed, priorities) == []
    # Over by 4: both priority-1 pods, then the priority-5 one.
    assert evict_for_gap(allocatable, np.array([8.0, 8.0]), borrowed, priorities) == [1, 2, 0]
