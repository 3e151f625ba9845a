"""Pools: machines grouped by what a phase may do with them, with O(1) moves.

A phase never scans half a million rows. It asks for "idle machines of
profile 17" or "configured machines of cluster 4, profile 17" and takes some
from the end of that pool. Each pool is a growable stack of ``int32`` rows
(all of them in one arena, so a compiled pass can read many pools at once);
each row remembers its position, and the inventory can always say which
pool a row is in (it is a function of the row's columns), so removing a
machine is a swap with the pool's last element. Every machine is in at most
one pool.

Within a cycle, phases take machines *tentatively* by counting how many they
have consumed from the end of each pool (see ``worksheet``); nothing moves
until the plan is committed, which is what makes dry runs free.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["TIER_BOUND", "TIER_IDLE", "TIER_SPECULATIVE", "PoolKey", "Pools"]

IntArray = npt.NDArray[np.int32]

TIER_IDLE = 0
"""Idle machines with a host, free for any cluster."""
TIER_SPECULATIVE = 1
"""Speculative slots: creatable on demand."""
TIER_BOUND = 2
"""Configured machines of one cluster, settled: victims and reclaim candidates."""


class PoolKey(NamedTuple):
    """Identity of a pool: tier, cluster index (-1 for free tiers), profile id."""

    tier: int
    cluster: int
    profile: int


class Pools:
    """All pools, plus each machine's pool and position."""

    def __init__(self) -> None:
        self._keys: list[PoolKey] = []
        self._id_of: dict[PoolKey, int] = {}
        # Every pool's stack lives in one arena: pool ``p``'s rows are
        # ``arena[begin[p] : begin[p] + counts[p]]``, with room for ``_room[p]``.
        # A compiled pass can then read any pool's rows (``PoolCodes``). A stack
        # that outgrows its room moves to the arena's end with twice the room;
        # the room it left is not reused (a pool's room only grows, so what is
        # left behind is at most what the pools hold room for).
        self._arena: IntArray = np.empty(1024, dtype=np.int32)
        self._used = 0
        self.begin: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._begin: list[int] = []
        self._room: list[int] = []
        self.counts: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self.tier: npt.NDArray[np.int8] = np.zeros(0, dtype=np.int8)
        self.cluster: IntArray = np.zeros(0, dtype=np.int32)
        self.profile: IntArray = np.zeros(0, dtype=np.int32)
        # Per pool, bumped whenever its members (or what they are bound to) change.
        self.generation: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._pos: IntArray = np.zeros(0, dtype=np.int32)
        self.by_cluster: dict[int, list[int]] = {}
        self._bound_of: dict[int, npt.NDArray[np.int64]] = {}

    # -- sizing ---------------------------------------------------------------
    def ensure_rows(self, rows: int) -> None:
        """Make the per-machine columns at least ``rows`` long."""
        if rows > len(self._pos):
            capacity = max(rows, 2 * len(self._pos), 1024)
            self._pos = np.resize(self._pos, capacity)

    def __len__(self) -> int:
        return len(self._keys)

    # -- pools ----------------------------------------------------------------
    def pool(self, key: PoolKey) -> int:
        """Id of the pool ``key`` (created empty when new)."""
        found = self._id_of.get(key)
        if found is None:
            found = len(self._keys)
            self._keys.append(key)
            self._id_of[key] = found
            self._begin.append(0)
            self._room.append(0)
            if found >= len(self.counts):
                capacity = max(16, 2 * len(self.counts))
                self.begin = np.resize(self.begin, capacity)
                self.counts = np.resize(self.counts, capacity)
                self.tier = np.resize(self.tier, capacity)
                self.cluster = np.resize(self.cluster, capacity)
                self.profile = np.resize(self.profile, capacity)
                self.generation = np.resize(self.generation, capacity)
            self.counts[found] = 0
            self._move(found, 0, 4)
            self.generation[found] = 0
            self.tier[found] = key.tier
            self.cluster[found] = key.cluster
            self.profile[found] = key.profile
            if key.tier == TIER_BOUND:
                self.by_cluster.setdefault(key.cluster, []).append(found)
                self._bound_of.pop(key.cluster, None)
        return found

    def bound_of(self, cluster: int) -> npt.NDArray[np.int64]:
        """Ids of ``cluster``'s bound pools (``by_cluster``) as an array; do not modify."""
        ids = self._bound_of.get(cluster)
        if ids is None:
            ids = np.array(self.by_cluster.get(cluster, []), dtype=np.int64)
            self._bound_of[cluster] = ids
        return ids

    def find(self, key: PoolKey) -> int | None:
        """Id of the pool ``key`` or None when it never existed."""
        return self._id_of.get(key)

    def key(self, pool: int) -> PoolKey:
        """Key of pool id ``pool``."""
        return self._keys[pool]

    def count(self, pool: int) -> int:
        """How many machines the pool holds."""
        return int(self.counts[pool])

    def position(self, row: int) -> int:
        """Where ``row`` sits in its pool's stack (meaningful only while it is in one)."""
        return int(self._pos[row])

    def members(self, pool: int) -> IntArray:
        """Rows in the pool (a view; do not keep across mutations)."""
        begin = self._begin[pool]
        return self._arena[begin : begin + int(self.counts[pool])]

    @property
    def arena(self) -> IntArray:
        """Every pool's rows: pool ``p``'s are ``arena[begin[p] : begin[p] + counts[p]]``.

        For compiled passes over many pools; do not keep across mutations.
        """
        return self._arena

    def tail(self, pool: int, skip: int, take: int) -> npt.NDArray[np.int64]:
        """``take`` rows from the end of the pool after skipping ``skip`` already taken."""
        begin = self._begin[pool]
        end = int(self.counts[pool]) - skip
        start = max(0, end - take)
        return self._arena[begin + start : begin + end][::-1].astype(np.int64)

    def _move(self, pool: int, size: int, room: int) -> int:
        """Give ``pool`` room for ``room`` rows at the arena's end, its ``size`` rows with it."""
        begin = self._used
        if begin + room > len(self._arena):
            # Doubling keeps growth amortised; np.resize would also cost ~5x a plain copy.
            grown = np.empty(max(2 * len(self._arena), begin + room), dtype=np.int32)
            grown[:begin] = self._arena[:begin]
            self._arena = grown
        old = self._begin[pool]
        self._arena[begin : begin + size] = self._arena[old : old + size]
        self._begin[pool] = begin
        self.begin[pool] = begin
        self._room[pool] = room
        self._used = begin + room
        return begin

    # -- membership ---------------------------------------------------------------
    def add(self, row: int, pool: int) -> None:
        """Put ``row`` into ``pool`` (it must not be in any pool)."""
        size = int(self.counts[pool])
        begin = self._begin[pool]
        if size == self._room[pool]:
            begin = self._move(pool, size, max(8, 2 * size))
        self._arena[begin + size] = row
        self._pos[row] = size
        self.counts[pool] = size + 1
        self.generation[pool] += 1

    def remove_tail(self, pool: int, rows: list[int]) -> bool:
        """Remove ``rows`` at once if they are exactly the pool's last entries; else do nothing.

        A cycle takes machines from the tails of pools and commits them in
        the same order, so this is the usual case and costs one comparison.
        """
        size = int(self.counts[pool])
        count = len(rows)
        if count > size:
            return False
        begin = self._begin[pool]
        tail = self._arena[begin + size - count : begin + size]
        if not np.array_equal(np.sort(tail), np.sort(np.asarray(rows, dtype=np.int32))):
            return False
        self.counts[pool] = size - count
        self.generation[pool] += 1
        return True

    def shorten(self, pools: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> None:
        """Drop ``counts[i]`` rows from the tail of ``pools[i]`` (a pool may repeat).

        The bulk form of :meth:`remove_tail` for a caller that knows the rows
        are exactly those tails (``Inventory.mark_taken_in_flight``).
        """
        np.subtract.at(self.counts, pools, counts)
        self.generation[pools] += 1

    def touch(self, pool: int) -> None:
        """Record that what ``pool``'s members are bound to changed (``generation``)."""
        self.generation[pool] += 1

    def remove(self, row: int, pool: int) -> None:
        """Take ``row`` out of ``pool`` (the pool the inventory says it is in)."""
        begin = self._begin[pool]
        last = int(self.counts[pool]) - 1
        at = int(self._pos[row])
        moved = int(self._arena[begin + last])
        self._arena[begin + at] = moved
        self._pos[moved] = at
        self.counts[pool] = last
        self.generation[pool] += 1
