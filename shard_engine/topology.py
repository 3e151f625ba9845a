"""Topology: gangs that share one domain (``Same``) and spread with a maximum skew.

Both constraints are about *label values of profiles*: a domain is the value
of a topology label (a rack, a zone). A need's machines are counted per
domain, and the choice of which profiles may take the next machine depends
on those counts. Constraints never cross shard boundaries: a gang the shard
cannot hold in one domain is unsatisfiable here, whatever other shards have.
"""

from __future__ import annotations

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
    "same_keys",
]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
CodeArray = npt.NDArray[np.int64]


def same_keys(need: Need) -> tuple[str, ...]:
    """Label keys the need's machines must all share one value of (sorted)."""
    return tuple(sorted({r.key for r in need.requirements if r.operator == Operator.SAME}))


def domain_codes(catalog: ProfileCatalog, keys: Sequence[str]) -> CodeArray:
    """One domain code per profile for the combination of ``keys``; -1 where a key is absent.

    Several ``Same`` keys (rack and zone, say) combine into one code in mixed
    radix, so "the same rack and the same zone" is one domain.
    """
    total = len(catalog)
    out = np.zeros(total, dtype=np.int64)
    absent = np.zeros(total, dtype=np.bool_)
    for key in keys:
        column = catalog.label_column(key)
        codes = column.codes[:total].astype(np.int64)
        absent |= codes < 0
        out = out * (len(column.values) + 1) + codes + 1
    out[absent] = -1
    return out


@dataclass(frozen=True, slots=True)
class GangChoice:
    """The domain a gang goes to, or why there is none."""

    domain: int | None
    reason: str = ""


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
) -> GangChoice:
    """Pick one domain that can hold the whole gang.

    ``held`` is machines per profile already counting for the need (the
    cluster's supply), ``available`` machines per profile that could be
    added (free, or preemptible in Phase 2). A domain qualifies when what it
    holds plus what it could add covers the whole aggregate. Among those the
    one already holding the largest share of the gang wins, so a gang never
    moves while it can stay; at equal coverage the previous choice wins
    (sticky), then the lowest code for determinism.
    """
    eligible = mask & (codes >= 0)
    if not eligible.any():
        return GangChoice(None, "no profile carries the gang's topology label")
    doms = codes[eligible]
    uniq, inverse = np.unique(doms, return_inverse=True)
    dims = alloc.shape[1]
    held_by = np.zeros((len(uniq), dims))
    room_by = np.zeros((len(uniq), dims))
    np.add.at(held_by, inverse, held[eligible][:, None] * alloc[eligible])
    np.add.at(room_by, inverse, (held[eligible] + available[eligible])[:, None] * alloc[eligible])
    need = aggregate
    fits = np.all(room_by >= need * (1.0 - tolerance) - tolerance, axis=1)
    if not fits.any():
        return GangChoice(None, "no single domain can hold the whole gang")
    positive = need > 0
    if positive.any():
        coverage = np.minimum(held_by[:, positive], need[positive]) / need[positive]
        score = coverage.sum(axis=1)
    else:
        score = np.zeros(len(uniq))
    score = np.where(fits, score, -1.0)
    best = float(score.max())
    candidates = uniq[score >= best - 1e-12]
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
    silently lopsided.
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
        self.counts: list[dict[int, float]] = []
        self.hard: list[bool] = []
        for spread in self.spreads:
            codes = domain_codes(catalog, (spread.topology_key,))
            eligible = mask & present & (codes >= 0)
            counts: dict[int, float] = {int(d): 0.0 for d in np.unique(codes[eligible])}
            held_mask = mask & (codes >= 0) & (held > 0)
            for d, n in zip(codes[held_mask].tolist(), held[held_mask].tolist(), strict=True):
                counts[int(d)] = counts.get(int(d), 0.0) + float(n)
            self.codes.append(codes)
            self.counts.append(counts)
            self.hard.append(spread.when_unsatisfiable != WhenUnsatisfiable.SCHEDULE_ANYWAY)

    def allowed(self, profiles: npt.NDArray[np.int64]) -> BoolArray:
        """Which candidate profiles may take one more machine under every hard spread."""
        ok = np.ones(len(profiles), dtype=np.bool_)
        for codes, counts, hard, spread in zip(
            self.codes, self.counts, self.hard, self.spreads, strict=True
        ):
            doms = codes[profiles]
            if hard:
                ok &= doms >= 0
                if not counts:
                    continue
                floor = min(counts.values())
                current = np.array([counts.get(int(d), 0.0) for d in doms.tolist()])
                ok &= current + 1 - floor <= spread.max_skew
        return ok

    def level(self, profiles: npt.NDArray[np.int64]) -> FloatArray:
        """Sum over spreads of the candidate's domain count: lower is emptier, preferred."""
        total = np.zeros(len(profiles))
        for codes, counts in zip(self.codes, self.counts, strict=True):
            doms = codes[profiles]
            total += np.array([counts.get(int(d), 0.0) for d in doms.tolist()])
        return total

    def add(self, profile: int, machines: int) -> None:
        """Record ``machines`` more machines of ``profile`` for the need."""
        for codes, counts in zip(self.codes, self.counts, strict=True):
            d = int(codes[profile])
            if d >= 0:
                counts[d] = counts.get(d, 0.0) + machines
