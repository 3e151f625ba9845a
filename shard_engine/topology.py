"""Topology: gangs that share one domain (``Same``) and spread with a maximum skew.

Both constraints are about *label values of profiles*: a domain is the value
of a topology label (a rack, a zone). A need's machines are counted per
domain, and the choice of which profiles may take the next machine depends
on those counts. Constraints never cross shard boundaries: a gang the shard
cannot hold in one domain is unsatisfiable here, whatever other shards have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shard_engine.catalog import ProfileCatalog
from shard_engine.model import Need, Operator, TopologySpread, WhenUnsatisfiable

__all__ = [
    "GangChoice",
    "SpreadState",
    "choose_gang_domain",
    "domain_codes",
    "is_pinned",
    "same_keys",
]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
CodeArray = npt.NDArray[np.int64]


def same_keys(need: Need) -> tuple[str, ...]:
    """Label keys the need's machines must all share one value of (sorted)."""
    return tuple(sorted({r.key for r in need.requirements if r.operator == Operator.SAME}))


def is_pinned(need: Need) -> bool:
    """A gang whose Same requirement names its domain (its pods run there, ADR 0158)."""
    return any(r.operator is Operator.SAME and r.values for r in need.requirements)


def domain_codes(catalog: ProfileCatalog, keys: Sequence[str]) -> CodeArray:
    """One domain code per profile for the combination of ``keys`` (see the catalog)."""
    return catalog.domain_codes(tuple(keys))


@dataclass(frozen=True, slots=True)
class GangChoice:
    """The domain a gang goes to, or why there is none."""

    domain: int | None
    reason: str = ""


def _distinct(codes: CodeArray) -> tuple[CodeArray, CodeArray]:
    """``np.unique(codes, return_inverse=True)`` for non-negative codes, without sorting.

    Domain codes are small dense integers (the catalog numbers label
    values), so a presence table and its running count give the sorted
    distinct codes and each code's rank directly; ``np.unique`` sorts, which
    costs several times more at the sizes a gang sees. Codes spread too
    thinly for a table (several topology keys combined) take ``np.unique``.
    """
    size = int(codes.max()) + 1
    if size > 4 * len(codes) + 1024:
        uniq, dense = np.unique(codes, return_inverse=True)
        return uniq, dense.reshape(-1)
    present = np.zeros(size, dtype=np.bool_)
    present[codes] = True
    rank = present.cumsum() - 1
    return present.nonzero()[0].astype(np.int64), rank[codes].astype(np.int64)


def distinct_rows(table: CodeArray) -> tuple[CodeArray, CodeArray]:
    """``np.unique(table, axis=0, return_inverse=True)`` for a table of integer codes.

    The distinct rows in lexicographic order, and each row's position among
    them. ``np.unique`` with an axis sorts the rows as structured records,
    hundreds of microseconds for a hundred rows; here each row becomes one
    integer (its codes in mixed radix, the first column most significant, so
    integer order is row order) ranked by :func:`_distinct`. A table whose
    keys would not fit in 62 bits takes ``np.unique``.
    """
    rows, columns = table.shape
    if rows == 0 or columns == 0:
        return np.zeros((min(rows, 1), columns), dtype=np.int64), np.zeros(rows, dtype=np.int64)
    low = table.min(axis=0)
    spans = (table.max(axis=0) - low + 1).tolist()
    if sum(math.log2(span) for span in spans) > 62:
        uniq, which = np.unique(table, axis=0, return_inverse=True)
        return uniq.astype(np.int64), which.reshape(-1).astype(np.int64)
    shifted = table - low
    key = shifted[:, 0].astype(np.int64)
    for column in range(1, columns):
        key = key * spans[column] + shifted[:, column]
    _, which = _distinct(key)
    first = np.empty(int(which.max()) + 1, dtype=np.int64)
    first[which[::-1]] = np.arange(rows - 1, -1, -1, dtype=np.int64)
    return table[first].astype(np.int64), which


def choose_gang_domain(
    *,
    codes: CodeArray,
    mask: BoolArray,
    held: FloatArray,
    available: FloatArray,
    aggregate: FloatArray,
    alloc: FloatArray,
    previous: int | None,
    tolerance: float,
    idle: FloatArray | None = None,
) -> GangChoice:
    """Pick one domain that can hold the whole gang.

    ``held`` is machines per profile already counting for the need (the
    cluster's supply), ``available`` machines per profile that could be
    added (free, or preemptible in Phase 2). A domain qualifies when what it
    holds plus what it could add covers the whole aggregate. Among those the
    one already holding the largest share of the gang wins, so a gang never
    moves while it can stay. At equal coverage, with ``idle`` (machines per
    profile already paid for and idle, part of ``available``), the domain
    whose held and idle machines cover more of the gang wins: a rack of idle
    servers holds the gang without claiming new ones, which bare metal bills
    until the end (ADR 0172). Then the previous choice wins (sticky), then
    the lowest code for determinism.
    """
    eligible = np.flatnonzero(mask & (codes >= 0))
    if len(eligible) == 0:
        return GangChoice(None, "no profile carries the gang's topology label")
    uniq, dense = _distinct(codes[eligible])
    count = len(uniq)
    shapes = alloc[eligible]
    have = held[eligible]
    room = have + available[eligible]
    dims = alloc.shape[1]
    held_by = np.empty((count, dims))
    room_by = np.empty((count, dims))
    for d in range(dims):
        held_by[:, d] = np.bincount(dense, weights=have * shapes[:, d], minlength=count)
        room_by[:, d] = np.bincount(dense, weights=room * shapes[:, d], minlength=count)
    need = aggregate
    fits = np.all(room_by >= need * (1.0 - tolerance) - tolerance, axis=1)
    if not fits.any():
        return GangChoice(None, "no single domain can hold the whole gang")
    positive = need > 0
    if positive.any():
        coverage = np.minimum(held_by[:, positive], need[positive]) / need[positive]
        score = coverage.sum(axis=1)
    else:
        score = np.zeros(count)
    score = np.where(fits, score, -1.0)
    best = float(score.max())
    tied = score >= best - 1e-12
    if idle is not None and positive.any() and np.count_nonzero(tied) > 1:
        paid = have + idle[eligible]
        paid_by = np.empty((count, int(np.count_nonzero(positive))))
        for k, d in enumerate(np.flatnonzero(positive).tolist()):
            paid_by[:, k] = np.bincount(dense, weights=paid * shapes[:, d], minlength=count)
        reuse = (np.minimum(paid_by, need[positive]) / need[positive]).sum(axis=1)
        reuse = np.where(tied, reuse, -1.0)
        tied = reuse >= float(reuse.max()) - 1e-12
    candidates = uniq[tied]
    if previous is not None and previous in candidates:
        return GangChoice(int(previous))
    return GangChoice(int(candidates.min()))


class SpreadState:
    """Machine counts per domain for each spread constraint of one need.

    Used machine by machine: :meth:`allowed` says which profiles may take
    the next machine without breaking a hard skew, :meth:`level` ranks the
    allowed ones (emptiest domains first) and :meth:`add` records a choice.
    Eligible domains are those of profiles that match the need and that the
    shard has any machine of; an eligible but empty domain holds the minimum
    at zero, which is what makes a hard spread unsatisfiable rather than
    silently lopsided. Counts are arrays indexed by domain code.
    """

    def __init__(
        self,
        *,
        catalog: ProfileCatalog,
        spreads: Sequence[TopologySpread],
        mask: BoolArray,
        present: BoolArray,
        held: FloatArray,
    ) -> None:
        self.spreads = tuple(spreads)
        self.codes: list[CodeArray] = []
        self.counts: list[FloatArray] = []
        self.eligible: list[BoolArray] = []
        self.hard: list[bool] = []
        for spread in self.spreads:
            codes = domain_codes(catalog, (spread.topology_key,))
            # At least one slot: a spread over a label no profile has still indexes its counts.
            size = max(int(codes.max()) + 1, 1) if len(codes) else 1
            usable = mask & (codes >= 0)
            eligible = np.zeros(size, dtype=np.bool_)
            eligible[codes[usable & present]] = True
            holding = usable & (held > 0)
            eligible[codes[holding]] = True
            counts = np.bincount(codes[holding], weights=held[holding], minlength=size)
            self.codes.append(codes)
            self.counts.append(counts.astype(np.float64))
            self.eligible.append(eligible)
            self.hard.append(spread.when_unsatisfiable != WhenUnsatisfiable.SCHEDULE_ANYWAY)

    def allowed(self, profiles: npt.NDArray[np.int64]) -> BoolArray:
        """Which candidate profiles may take one more machine under every hard spread."""
        ok = np.ones(len(profiles), dtype=np.bool_)
        for codes, counts, eligible, hard, spread in zip(
            self.codes, self.counts, self.eligible, self.hard, self.spreads, strict=True
        ):
            if not hard:
                continue
            doms = codes[profiles]
            ok &= doms >= 0
            if not eligible.any():
                continue
            floor = float(counts[eligible].min())
            current = counts[np.maximum(doms, 0)]
            ok &= current + 1 - floor <= spread.max_skew
        return ok

    def level(self, profiles: npt.NDArray[np.int64]) -> FloatArray:
        """Sum over spreads of the candidate's domain count: lower is emptier, preferred."""
        total = np.zeros(len(profiles))
        for codes, counts in zip(self.codes, self.counts, strict=True):
            doms = codes[profiles]
            total += np.where(doms >= 0, counts[np.maximum(doms, 0)], 0.0)
        return total

    def add(self, profile: int, machines: int) -> None:
        """Record ``machines`` more machines of ``profile`` for the need."""
        for codes, counts, eligible in zip(self.codes, self.counts, self.eligible, strict=True):
            d = int(codes[profile])
            if d >= 0:
                counts[d] += machines
                eligible[d] = True
