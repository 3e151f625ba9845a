"""The worksheet: a cycle's tentative view of the inventory.

Phases decide one after another and each must see what the previous ones
took: a machine assigned in Phase 1 is not a victim in Phase 2, a victim
taken for one need is not taken again for the next, and supply moved toward
a cluster counts for its later needs. None of that touches the inventory
while the cycle runs. The worksheet records it as overlays (per-pool counts
taken from the tail, per-cluster supply rows, free counts) plus the
actions it plans, recorded as segments in an
:class:`~shard_engine.actions.ActionLog` that the engine commits if — and
only if — the plan is committed. A dry run simply throws the worksheet away.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shard_engine.actions import ActionLog
from shard_engine.binding import Bindings, PoolCodes
from shard_engine.claims import Claims
from shard_engine.inventory import Inventory
from shard_engine.pools import TIER_BOUND, TIER_IDLE, TIER_SPECULATIVE, PoolKey

__all__ = ["ClusterMemo", "MemoKey", "Starved", "Worksheet"]

IntArray = npt.NDArray[np.int64]


MemoKey = tuple[int, int, int, int, int]
"""Inventory and bindings versions of the cluster, needs version, profiles, dimensions."""
Counted = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]
"""Bound machines per need over the profiles counted (``kernels.bound_tally``)."""


@dataclass(frozen=True, slots=True)
class Starved:
    """A need Phase 1 could give nothing to, and the state that made it so.

    While its cluster and needs are unchanged (``key``) and no machine has
    entered a free pool for any profile it could use (``arrivals``), Phase 1
    would give it nothing again, so its outcome is reused as is.
    """

    key: MemoKey
    arrivals: int
    deficit: npt.NDArray[np.float64]
    mask: npt.NDArray[np.bool_]
    block: str
    scope: npt.NDArray[np.bool_]
    domain: str = ""


@dataclass(slots=True)
class ClusterMemo:
    """Per-cluster results that only change when the cluster's supply or needs change.

    ``have`` holds each cluster's per-need supply and which needs were
    short; ``claims`` what its needs claimed of its machines; ``quiet`` the
    clusters Phase 3 found nothing to reclaim from; ``release_after`` per
    idle pool (indexed by pool, ``-inf`` where unknown), the earliest
    instant any of its machines can reach the end of its hold. The
    per-cluster ones are keyed by (inventory and bindings versions of the
    cluster, needs version, profiles, dimensions), so a stale entry is
    never used; a cycle only recomputes clusters that something touched
    since.
    """

    have: dict[int, tuple[MemoKey, npt.NDArray[np.float64], list[int]]] = field(
        default_factory=dict
    )
    claims: dict[int, tuple[MemoKey, Claims | None]] = field(default_factory=dict)
    quiet: dict[int, MemoKey] = field(default_factory=dict)
    release_after: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    reclaim_cursor: int = 0
    victims: dict[int, tuple[tuple[int, int, int], tuple[Any, ...]]] = field(default_factory=dict)
    starved: dict[tuple[int, str], Starved] = field(default_factory=dict)
    bound: dict[tuple[int, bool], tuple[tuple[Any, ...], Counted | None]] = field(
        default_factory=dict
    )
    # Per bound pool, its members per binding code, under the pool's generation.
    pool_codes: PoolCodes = field(default_factory=PoolCodes)


@dataclass(slots=True)
class Worksheet:
    """Tentative state of one cycle (see module docstring)."""

    inventory: Inventory
    now: float
    memo: ClusterMemo = field(default_factory=ClusterMemo)
    consumed: dict[int, int] = field(default_factory=dict)
    supply: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)
    free: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)
    log: ActionLog = field(default_factory=ActionLog)
    dropped: list[int] = field(default_factory=list)
    # Machines named other than from a pool's tail (promised, released, named, verified).
    taken: set[int] = field(default_factory=set)
    drawn: set[int] = field(default_factory=set)
    gang_choices: dict[tuple[int, str], int] = field(default_factory=dict)
    # What each machine was placed for, and the rows in flight toward a cluster.
    bindings: Bindings | None = None
    flying: Callable[[int], Sequence[int]] | None = None
    # Per cluster: (from need, to need, profile, machines) a higher-priority need
    # took over from a lower one; committing rebinds that many machines.
    rebinds: dict[int, list[tuple[str, str, int, float]]] = field(default_factory=dict)
    # Per cluster, machines this cycle took from the tails of its bound pools.
    tails: dict[int, int] = field(default_factory=dict)
    # Per cluster, machines this cycle placed for each (need key, profile): bound to
    # that need once committed, so counted as bound to it already (``counted``).
    picked: dict[int, dict[tuple[str, int], int]] = field(default_factory=dict)
    # Per cluster, the last count with its picks added: (count read, keys, result); a
    # pick for the cluster drops it.
    _with_picked: dict[int, tuple[Counted | None, Sequence[str], Counted | None]] = field(
        default_factory=dict
    )
    # This cycle's bound counts per (cluster, settled only), with what they depend on.
    seen_bound: dict[tuple[int, bool], tuple[tuple[Any, ...], tuple[int, int], Counted | None]] = (
        field(default_factory=dict)
    )
    # This cycle's claims per (cluster, needs version, bound tails taken, machines
    # named, supply row's bytes): what a claim reads (``phase1.claims_now``).
    claims: dict[tuple[int, int, int, int, bytes], Claims | None] = field(default_factory=dict)
    # ``taken`` sorted, with those of its rows in a bound pool and their pools.
    _skip: tuple[IntArray, IntArray, IntArray] | None = None
    # Per cluster, how many named machines its counts leave out, at a size of ``taken``.
    _named: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Clusters whose pools' counts per binding code were brought up to date.
    _refreshed: set[int] = field(default_factory=set)
    # Per cluster no move touched yet, its supply row as the inventory holds it, read
    # once a cycle (the inventory does not change until the commit); never written to.
    _unmoved: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free[TIER_IDLE] = self.inventory.free_idle.astype(np.int64)
        self.free[TIER_SPECULATIVE] = self.inventory.free_speculative.astype(np.int64)

    # -- supply -------------------------------------------------------------------
    def supply_row(self, cluster: int) -> npt.NDArray[np.int64]:
        """Machines counting toward ``cluster`` per profile, this cycle's moves included."""
        row = self.supply.get(cluster)
        if row is not None:
            return row
        row = self._unmoved.get(cluster)
        if row is None:
            row = self._unmoved[cluster] = self.inventory.supply_row(cluster).astype(np.int64)
        return row

    def touched(self, cluster: int) -> bool:
        """True when this cycle moved supply toward or away from ``cluster``."""
        return cluster in self.supply

    def move_supply(self, cluster: int, profile: int, machines: int) -> None:
        """Add (or with a negative count remove) machines to ``cluster``'s supply."""
        if cluster < 0:
            return
        row = self.supply.get(cluster)
        if row is None:
            row = self.inventory.supply_row(cluster).astype(np.int64)
            self.supply[cluster] = row
        row[profile] += machines

    def bound(
        self,
        cluster: int,
        keys: Sequence[str],
        columns: npt.NDArray[np.int64],
        *,
        settled_only: bool = False,
    ) -> npt.NDArray[np.float64] | None:
        """Machines per (need, profile) counting toward ``cluster`` that were placed for its needs.

        Counts settled configured machines not taken this cycle and, unless
        ``settled_only``, machines in flight or promised toward the cluster;
        ``keys`` are the cluster's needs in cycle order, ``columns`` the
        profiles to count (sorted; a claim's held profiles), one column
        each. None when no such machine is bound to any of them.
        """
        found = self.counted(cluster, keys, settled_only=settled_only)
        if found is None:
            return None
        import shard_engine.kernels as kernels  # numba loads with the first count, not with the CLI

        placed: npt.NDArray[np.float64] = kernels.columns_of(found[0], found[1], columns)
        return placed if np.count_nonzero(placed) else None

    def counted(
        self, cluster: int, keys: Sequence[str], *, settled_only: bool = False
    ) -> Counted | None:
        """:meth:`bound` over every profile with a bound machine: (profiles, counts), or None.

        The profiles are sorted, one column of ``counts`` each, a row per key;
        what :func:`~shard_engine.claims.claim` reads as ``counted``.
        """
        if self.bindings is None:
            return None
        found = self._counted(cluster, keys, settled_only=settled_only)
        picked = self.picked.get(cluster)
        if not picked or settled_only:
            return found
        # A claim reads the count once per supply row, and a cycle reads it again for
        # every need that looks: the merge is kept while the count, picks and keys hold.
        seen = self._with_picked.get(cluster)
        if seen is not None and seen[0] is found and (seen[1] is keys or seen[1] == keys):
            return seen[2]
        merged = _with_picks(found, keys, picked)
        self._with_picked[cluster] = (found, keys, merged)
        return merged

    def pick(self, cluster: int, key: str, profile: int, machines: int) -> None:
        """Record that this cycle placed ``machines`` of ``profile`` for need ``key``.

        Bindings are made at commit, so without this a later need of the
        cluster would claim a share of machines the cycle just took for an
        earlier one, look covered, and buy its own only at the next cycle.
        """
        if machines <= 0:
            return
        mine = self.picked.setdefault(cluster, {})
        mine[(key, profile)] = mine.get((key, profile), 0) + machines
        self._with_picked.pop(cluster, None)

    def _counted(self, cluster: int, keys: Sequence[str], *, settled_only: bool) -> Counted | None:
        """:meth:`bound` per profile counted (``kernels.bound_tally``), kept while it holds."""
        assert self.bindings is not None
        if settled_only and (self.flying is None or not self.flying(cluster)):
            # Nothing is in flight toward the cluster, so its settled machines are all
            # its bound machines: Phase 3 reads the count Phase 1 read (same memo).
            settled_only = False
        # The count changes with the cluster's inventory and bindings (between
        # cycles) and with what this cycle took of its bound pools or named.
        memo_key = (
            self.inventory.version(cluster),
            self.bindings.version(cluster),
            settled_only,
            tuple(keys),
        )
        state = self.count_state(cluster)
        seen = self.seen_bound.get((cluster, settled_only))
        if seen is not None and seen[0] == memo_key and seen[1] == state:
            return seen[2]
        untouched = state == (0, 0)
        if untouched:
            cached = self.memo.bound.get((cluster, settled_only))
            if cached is not None and cached[0] == memo_key:
                return cached[1]
        found = self._bound(cluster, keys, settled_only=settled_only)
        self.seen_bound[(cluster, settled_only)] = (memo_key, state, found)
        if untouched:
            self.memo.bound[(cluster, settled_only)] = (memo_key, found)
        return found

    def _bound(self, cluster: int, keys: Sequence[str], *, settled_only: bool) -> Counted | None:
        assert self.bindings is not None
        lookup = self.bindings.lookup(cluster, keys)
        if lookup is None:
            return None
        pools = self.inventory.pools
        mine = pools.bound_of(cluster)
        plus = _NO_ROWS
        if not settled_only and self.flying is not None:
            flying = self.flying(cluster)
            if flying:
                plus = np.asarray(flying, dtype=np.int64)
        if not len(mine) and not len(plus):
            return None
        skip = self._skipped()
        codes = self.bindings.codes
        kept = self.memo.pool_codes
        if cluster not in self._refreshed:  # nothing moves between pools within a cycle
            kept.refresh(pools, mine, codes)
            self._refreshed.add(cluster)
        import shard_engine.kernels as kernels  # numba loads with the first count, not with the CLI

        minus = self._not_counted(cluster, mine)
        # Compiled for writeable arrays: an empty one is the kernels' own.
        present, out = kernels.bound_tally(
            mine,
            pools.profile,
            kept.width,
            kept.code,
            kept.count,
            minus if len(minus) else kernels.NOTHING,
            plus if len(plus) else kernels.NOTHING,
            skip if len(skip) else kernels.NOTHING,
            self.inventory.profile,
            codes,
            lookup,
            len(keys),
        )
        return (present, out) if len(present) else None

    def count_state(self, cluster: int) -> tuple[int, int]:
        """What this cycle did that a count of ``cluster``'s bound machines reads.

        Machines taken from the tails of its bound pools, and machines the
        cycle named that sit in one of those pools or are in flight toward it
        (either is left out of the count). Both only grow within a cycle, so
        an unchanged pair is an unchanged count, and (0, 0) is the count with
        nothing taken, which holds across cycles under the cluster's versions.
        """
        tails = self.tails.get(cluster, 0)
        if not self.taken:
            return tails, 0
        kept = self._named.get(cluster)
        if kept is not None and kept[0] == len(self.taken):
            return tails, kept[1]
        self._skipped()
        assert self._skip is not None
        _, _, pool_of = self._skip
        named = int(np.count_nonzero(self.inventory.pools.cluster[pool_of] == cluster))
        if self.flying is not None:
            taken = self.taken
            named += sum(1 for row in self.flying(cluster) if row in taken)
        self._named[cluster] = (len(self.taken), named)
        return tails, named

    def _skipped(self) -> IntArray:
        """``taken`` sorted, read again only when it grew (it only grows in a cycle)."""
        if not self.taken:
            return _NO_ROWS
        if self._skip is None or len(self._skip[0]) != len(self.taken):
            rows = np.sort(np.fromiter(self.taken, np.int64, len(self.taken)))
            self._skip = (rows, *self.inventory.bound_pools_of(rows))
        return self._skip[0]

    def _not_counted(self, cluster: int, mine: IntArray) -> IntArray:
        """Rows of ``cluster``'s bound pools this cycle took: their tails, and named rows."""
        pools = self.inventory.pools
        parts: list[IntArray] = []
        if self.tails.get(cluster, 0):
            for pool in mine.tolist():
                tail = self.consumed.get(pool, 0)
                if tail:
                    end = pools.count(pool)
                    parts.append(pools.members(pool)[end - tail : end].astype(np.int64))
        if self.taken:
            # Named rows still in a head of one of the cluster's pools (a row
            # in a consumed tail is counted out with it already).
            assert self._skip is not None  # ``_skipped`` read ``taken`` first
            _, rows, pool_of = self._skip
            mine_only = pools.cluster[pool_of] == cluster
            named = zip(rows[mine_only].tolist(), pool_of[mine_only].tolist(), strict=True)
            heads = [
                row
                for row, pool in named
                if pools.position(row) < pools.count(pool) - self.consumed.get(pool, 0)
            ]
            if heads:
                parts.append(np.array(heads, dtype=np.int64))
        if not parts:
            return _NO_ROWS
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    # -- taking machines -----------------------------------------------------------------
    def available(self, pool: int | None) -> int:
        """Machines still in ``pool`` after this cycle's takes."""
        if pool is None:
            return 0
        return self.inventory.pools.count(pool) - self.consumed.get(pool, 0)

    def take(self, key: PoolKey, machines: int) -> tuple[IntArray, int]:
        """Take up to ``machines`` rows from the tail of pool ``key``; returns them and the pool.

        Rows are taken in the order committing removes them (the pool's
        tail, last first), so a commit can shorten each pool by what the
        cycle consumed from it.
        """
        pools = self.inventory.pools
        pool = pools.find(key)
        if pool is None or machines <= 0:
            return _NO_ROWS, -1
        skip = self.consumed.get(pool, 0)
        rows = pools.tail(pool, skip, machines)
        taken = len(rows)
        self.consumed[pool] = skip + taken
        if key.tier != TIER_BOUND:
            self.free[key.tier][key.profile] -= taken
        else:
            self.tails[key.cluster] = self.tails.get(key.cluster, 0) + taken
        return rows, pool

    def take_tail(self, key: PoolKey, pool: int, rows: IntArray) -> None:
        """Record ``rows`` — exactly what :meth:`take` would hand out now — as taken.

        For a caller that had to read the tail first (to check it) and so
        need not read it twice.
        """
        self.consumed[pool] = self.consumed.get(pool, 0) + len(rows)
        if key.tier != TIER_BOUND:
            self.free[key.tier][key.profile] -= len(rows)
        else:
            self.tails[key.cluster] = self.tails.get(key.cluster, 0) + len(rows)

    def is_taken(self, row: int) -> bool:
        """True when this cycle already named the machine: picked, or taken from its pool's tail.

        Tail takes are not listed one by one (``consumed`` says how many of
        each pool's last machines are gone), so a machine in a pool is taken
        when its position lies in that consumed tail.
        """
        if row in self.taken:
            return True
        inventory = self.inventory
        key = inventory.pool_key(row)
        pool = None if key is None else inventory.pools.find(key)
        if pool is None:
            return False
        consumed = self.consumed.get(pool, 0)
        pools = inventory.pools
        return consumed > 0 and pools.position(row) >= pools.count(pool) - consumed

    def take_named(self, key: PoolKey, named: set[int], machines: int) -> IntArray:
        """Take up to ``machines`` rows of pool ``key`` that are in ``named``.

        Unlike :meth:`take` the rows need not sit at the pool's tail, so they
        are not counted in ``consumed``: only a phase that is the last to
        take from the pool in a cycle may use this (Phase 3's reclaim of a
        cluster that named the machines it releases). Rows already taken
        this cycle, or consumed from the tail, are skipped.
        """
        pools = self.inventory.pools
        pool = pools.find(key)
        if pool is None or machines <= 0 or not named:
            return _NO_ROWS
        members = pools.members(pool)[: pools.count(pool) - self.consumed.get(pool, 0)]
        rows = [row for row in members.tolist() if row in named and row not in self.taken]
        rows = rows[:machines]
        self.taken.update(rows)
        return np.array(rows, dtype=np.int64)


_NO_ROWS: IntArray = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


def _with_picks(
    found: Counted | None, keys: Sequence[str], picked: dict[tuple[str, int], int]
) -> Counted | None:
    """``found`` (bound machines per need over its profiles) with this cycle's picks added."""
    extra = [(keys.index(key), profile, n) for (key, profile), n in picked.items() if key in keys]
    if not extra:
        return found
    wanted = {profile for _, profile, _ in extra}
    if found is None:
        known = sorted(wanted)
        profiles = np.array(known, dtype=np.int64)
        counts = np.zeros((len(keys), len(known)))
    else:
        profiles, counts = found
        known = profiles.tolist()
        new = wanted.difference(known)
        if new:
            # Profiles the cluster held none of: widen the count, its columns in place.
            known = sorted(new.union(known))
            profiles = np.array(known, dtype=np.int64)
            counts = np.zeros((len(keys), len(known)))
            counts[:, np.searchsorted(profiles, found[0])] = found[1]
        else:
            counts = counts.copy()
    for row, profile, n in extra:
        counts[row, bisect_left(known, profile)] += n
    return profiles, counts
