"""Bindings: each machine remembers the need of its cluster it was placed for.

Claims (ADR 0128) decide which need of a cluster a held machine counts for,
because the inventory keeps supply per cluster, not per need. Re-divided
from scratch every cycle, they let a broad need claim a share of machines
that were bought for a narrower one after it, which then looked short and
bought again the next cycle (the strict expected failure of ADR 0128; the
500K-machine cycle bench ran 100 needs short for good, 120 ms a cycle where
7 ms had been enough). So the engine records, per machine row, the (cluster,
need key) an AssignIdle, Provision or Preempt placed it for, or that the
provider echoes back in the machine's attribution after a restart; a need
claims the machines bound to it before anything else, and claims only
divide what nobody is bound to or a need no longer wants.

A binding is a hint, never a count: it is read only for machines that count
toward the same cluster at the moment (:meth:`Worksheet.bound`), and a
need key the cluster no longer sends simply matches no need. So nothing has
to unbind a machine when it drains, fails or moves; the next placement
binds it anew. Codes for (cluster, need key) pairs are interned; their
number grows with the distinct needs ever placed for, which is small next
to the machines.

Because a binding is read only where its machine counts, a cluster's
:meth:`Bindings.version` moves only for bindings that can enter its counts:
an idle machine placed anew is still bound to the need of the cluster it
last served, and rebinding it does not change that cluster's counts (it
left them, and the inventory's version of that cluster moved then), so it
does not make the cluster's claims be computed again (``holds``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from shard_engine.linear import combine
from shard_engine.pools import Pools

__all__ = ["NO_BINDING", "Bindings", "PoolCodes", "pinned_first"]

NO_BINDING = -1
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class Bindings:
    """A (cluster, need key) code per machine row; see the module docstring."""

    __slots__ = (
        "_changes",
        "_cluster",
        "_codes",
        "_key",
        "_lookups",
        "_rows",
        "holds",
        "on_change",
    )

    def __init__(
        self,
        on_change: Callable[[IntArray], None] | None = None,
        holds: Callable[[IntArray, IntArray], BoolArray] | None = None,
    ) -> None:
        self._rows: npt.NDArray[np.int32] = np.full(0, NO_BINDING, dtype=np.int32)
        self._codes: dict[tuple[int, str], int] = {}
        self._key: list[str] = []
        self._cluster: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self._changes: dict[int, int] = {}
        self._lookups: dict[int, tuple[tuple[str, ...], int, IntArray | None]] = {}
        # Told the rows whose binding changed: the engine marks their bound
        # pools changed, so counts kept per pool are read again.
        self.on_change = on_change
        # Per (row, cluster) pair, whether the row may enter that cluster's counts
        # now (a superset is safe). Without it every old binding counts as held.
        self.holds = holds

    def _code(self, cluster: int, key: str) -> int:
        code = self._codes.get((cluster, key))
        if code is None:
            code = len(self._key)
            self._codes[(cluster, key)] = code
            self._key.append(key)
            if code >= len(self._cluster):
                self._cluster = np.resize(self._cluster, max(64, 2 * len(self._cluster)))
            self._cluster[code] = cluster
        return code

    def _fit(self, top: int) -> None:
        if top >= len(self._rows):
            grown = np.full(max(top + 1, 2 * len(self._rows), 1024), NO_BINDING, dtype=np.int32)
            grown[: len(self._rows)] = self._rows
            self._rows = grown

    def bind(self, rows: Sequence[int] | IntArray, cluster: int, key: str) -> None:
        """Record that ``rows`` were placed for need ``key`` of ``cluster``."""
        index = np.asarray(rows, dtype=np.int64)
        if len(index) == 0:
            return
        if cluster < 0 or not key:
            self.unbind(index)
            return
        self._fit(int(index.max()))
        self._changed(index, bumped={cluster})
        self._assign(index, cluster, key, notify=True)

    def _assign(self, index: IntArray, cluster: int, key: str, *, notify: bool) -> None:
        """Bind ``index`` to need ``key`` of ``cluster``: their codes, its version, the hook."""
        self._rows[index] = self._code(cluster, key)
        self._changes[cluster] = self._changes.get(cluster, 0) + 1
        if notify and self.on_change is not None:
            self.on_change(index)

    def bind_all(
        self,
        batches: Sequence[tuple[IntArray, int, str]],
        *,
        holds: Callable[[IntArray, IntArray], BoolArray] | None = None,
    ) -> None:
        """:meth:`bind` for each (rows, cluster, key) of ``batches``, in one pass.

        A commit binds every machine its plan placed, a few hundred
        segments, each machine once (a plan names a machine once).
        ``holds``, when given, stands in for the one the bindings were made
        with: a caller that knows more about these rows (the commit: they
        are in flight toward the cluster they are bound to now) can answer
        it without looking each row up.
        """
        placing = [(rows, c, k) for rows, c, k in batches if len(rows) and c >= 0 and k]
        if any(len(rows) and (c < 0 or not k) for rows, c, k in batches):
            # Rare: a placement without a need unbinds; order matters only then.
            for rows, cluster, key in batches:
                self.bind(rows, cluster, key)
            return
        if not placing:
            return
        index = np.concatenate([np.asarray(rows, dtype=np.int64) for rows, _, _ in placing])
        codes = np.repeat(
            np.array([self._code(c, k) for _, c, k in placing], dtype=np.int32),
            [len(rows) for rows, _, _ in placing],
        )
        self._fit(int(index.max()))
        self._changed(index, bumped={c for _, c, _ in placing}, holds=holds)
        self._rows[index] = codes
        for _, cluster, _ in placing:
            self._changes[cluster] = self._changes.get(cluster, 0) + 1
        if self.on_change is not None:
            self.on_change(index)

    def unbind(self, rows: Sequence[int] | IntArray) -> None:
        """Forget what ``rows`` were placed for (a new machine on a reused row, a removal)."""
        index = np.asarray(rows, dtype=np.int64)
        index = index[index < len(self._rows)]
        self._changed(index)
        self._rows[index] = NO_BINDING
        if self.on_change is not None and len(index):
            self.on_change(index)

    def _changed(
        self,
        index: IntArray,
        bumped: set[int] | None = None,
        holds: Callable[[IntArray, IntArray], BoolArray] | None = None,
    ) -> None:
        """Count a change for every cluster some of ``index`` are bound to now and count for.

        ``bumped`` are clusters the caller counts a change for anyway (the
        clusters it binds to): a version is only compared for equality, so
        rows bound to them need no ``holds`` check. A rebind moves rows within
        one cluster, so it checks none.
        """
        codes = self._rows[index]
        bound = codes >= 0
        if not np.count_nonzero(bound):  # the usual case: new machines, bound for the first time
            return
        rows = index[bound]
        clusters = self._cluster[codes[bound]].astype(np.int64)
        if bumped:  # clusters are never negative here
            known = np.zeros(max(int(clusters.max()), *bumped) + 1, dtype=np.bool_)
            known[list(bumped)] = True
            other = ~known[clusters]
            rows, clusters = rows[other], clusters[other]
        holds = self.holds if holds is None else holds
        if holds is not None and len(rows):
            clusters = clusters[holds(rows, clusters)]
        for cluster in np.unique(clusters).tolist():
            self._changes[cluster] = self._changes.get(cluster, 0) + 1

    def version(self, cluster: int) -> int:
        """Changes whenever a machine is bound to, or unbound from, a need of ``cluster``.

        With the inventory's version of the cluster, what a result read from
        the cluster's bindings may be reused under (``Worksheet.bound``).
        """
        return self._changes.get(cluster, 0)

    def rebind(
        self,
        rows: IntArray | npt.NDArray[np.int32],
        *,
        cluster: int,
        was: str,
        now: str,
        machines: int,
        notify: bool = True,
    ) -> int:
        """Move up to ``machines`` of ``rows`` bound to need ``was`` over to ``now``; how many.

        The rows stay bound to ``cluster``, so no other cluster's version
        moves and none needs the ``holds`` check :meth:`bind` makes. With
        ``notify`` False, ``on_change`` is not told: the caller marks the
        rows' pool changed itself (a commit rebinds within one pool).
        """
        code = self._codes.get((cluster, was))
        if code is None or machines <= 0:
            return 0
        inside = rows[rows < len(self._rows)]
        mine = inside[self._rows[inside] == code][:machines]
        if len(mine) == 0:
            return 0
        if cluster < 0 or not now:
            self.bind(mine, cluster, now)  # unbinds them
        else:
            self._assign(mine.astype(np.int64), cluster, now, notify=notify)
        return len(mine)

    def need_of(self, row: int) -> tuple[int, str] | None:
        """(cluster, need key) ``row`` is bound to, or None."""
        if row >= len(self._rows) or self._rows[row] < 0:
            return None
        code = int(self._rows[row])
        return int(self._cluster[code]), self._key[code]

    @property
    def codes(self) -> npt.NDArray[np.int32]:
        """The (cluster, need key) code per row; ``NO_BINDING`` (and rows past its end): none."""
        return self._rows

    def lookup(self, cluster: int, keys: Sequence[str]) -> IntArray | None:
        """Per code, the index in ``keys`` of the need of ``cluster`` it stands for, else -1.

        None when no machine was ever bound to any of those needs. Codes
        past the end of the array stand for none of them. Kept per cluster
        while its keys and the codes known stay the same (do not modify).
        """
        asked = tuple(keys)
        kept = self._lookups.get(cluster)
        if kept is not None and kept[1] == len(self._key) and kept[0] == asked:
            return kept[2]
        codes = [self._codes.get((cluster, key), -1) for key in asked]
        top = max(codes, default=-1)
        lookup = None
        if top >= 0:
            lookup = np.full(top + 1, -1, dtype=np.int64)
            for i, code in enumerate(codes):
                if code >= 0:
                    lookup[code] = i
        self._lookups[cluster] = (asked, len(self._key), lookup)
        return lookup


class PoolCodes:
    """Per pool, how many of its members are bound to each code, kept under its generation.

    A cluster's bound machines are counted per need many times a cycle
    (:meth:`Worksheet.bound`), and between two cycles most of its pools do
    not change. Each pool's counts are read again only when its generation
    (``Pools.generation``: members or their bindings changed) moved. Stored
    as tables, one row per pool and as many columns as the most codes any
    pool holds (usually one: a pool is one profile, mostly bought for one
    need), so a count reads a cluster's pools in one compiled pass.
    """

    __slots__ = ("code", "count", "generation", "width")

    def __init__(self) -> None:
        self.generation: IntArray = np.zeros(0, dtype=np.int64)
        self.width: IntArray = np.zeros(0, dtype=np.int64)
        self.code: IntArray = np.zeros((0, 1), dtype=np.int64)
        self.count: IntArray = np.zeros((0, 1), dtype=np.int64)

    def refresh(self, pools: Pools, mine: IntArray, codes: npt.NDArray[np.int32]) -> None:
        """Count again those of pools ``mine`` whose generation moved since they were counted."""
        if len(mine) == 0:
            return
        if len(pools) > len(self.generation):
            size = max(len(pools), 2 * len(self.generation), 64)
            grown = np.full(size, -1, dtype=np.int64)
            grown[: len(self.generation)] = self.generation
            self.generation = grown
            self.width = np.resize(self.width, size)
            self.code = _grown(self.code, size, self.code.shape[1])
            self.count = _grown(self.count, size, self.count.shape[1])
        import shard_engine.kernels as kernels  # numba loads with the first count, not with the CLI

        # The stale pools counted in one compiled pass over the pools' arena, in place.
        while True:
            wider = kernels.refresh_codes(
                mine,
                pools.generation,
                pools.arena,
                pools.begin,
                pools.counts,
                codes,
                self.generation,
                self.width,
                self.code,
                self.count,
            )
            if not wider:
                return
            self.code = _grown(self.code, len(self.code), wider)
            self.count = _grown(self.count, len(self.count), wider)


def _grown(table: IntArray, rows: int, columns: int) -> IntArray:
    out = np.zeros((rows, columns), dtype=np.int64)
    out[: table.shape[0], : table.shape[1]] = table
    return out


def pinned_first(
    placed: FloatArray | None,
    pinned: Sequence[bool],
    loose: Sequence[bool],
    matrix: npt.NDArray[np.bool_],
    aggregate: FloatArray,
    alloc: FloatArray,
) -> FloatArray | None:
    """Bindings read as the cluster runs them: a pinned gang's rack is its own first.

    ``placed`` is machines per (need, profile) bound to each of a cluster's
    needs (:meth:`Worksheet.bound`), over the same profiles as ``matrix``
    and ``alloc`` (a claim's held profiles); ``pinned[i]`` says need ``i`` is a gang
    whose running pods hold the domain its ``Same`` requirement names, so
    ``matrix[i]`` is that domain's profiles; ``loose[i]`` a gang that names
    none (no pod of it runs).

    A cluster's scheduler does not know which gang a machine was bought
    for: a gang of three that arrived first starts its pods on the two
    servers bought for a later gang of two, and is pinned to their rack. The
    bindings still say "the gang of two", which then counts them and looks
    served, while the pinned gang looks short of all three and asks for a
    whole rack no donor can give beside its own running pods (scarce fleet,
    seed 1, ADR 0160). A loose gang runs nothing, so a machine bound to it in
    a pinned gang's domain is idle or runs that pinned gang: it counts for
    the pinned gang first, as many as cover it. Returns ``placed`` itself
    when nothing moves (never modified: the caller's copy may be memoised).
    """
    if placed is None:
        return None
    rows = min(len(pinned), placed.shape[0])
    if not any(pinned[:rows]) or not any(loose[:rows]):
        return placed
    width = min(placed.shape[1], matrix.shape[1])
    out: FloatArray | None = None
    for i in range(rows):
        if not pinned[i]:
            continue
        asked = aggregate[i] > 0
        domain = np.flatnonzero(matrix[i, :width])
        current = placed if out is None else out
        have = combine(current[i, domain], alloc[domain])
        for p in domain.tolist():
            for j in range(rows):
                if not loose[j] or current[j, p] <= 0:
                    continue
                while current[j, p] > 0 and (have[asked] < aggregate[i][asked]).any():
                    if out is None:
                        out = placed.copy()
                        current = out
                    moved = min(1.0, float(current[j, p]))
                    current[j, p] -= moved
                    current[i, p] += moved
                    have = have + moved * alloc[p]
    return placed if out is None else out
