"""The roll-up quarantine: a safety rail against a cluster's demand vanishing at once.

An operator that restarts with an empty cache, or a bug that drops most
CapacityRequests, produces a roll-up that looks like "the cluster needs
almost nothing" — and Phase 3 would dutifully reclaim the whole cluster. A
real scale-down rarely removes nine need rows out of ten in ten seconds, so
such a roll-up is held back until further roll-ups confirm it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["QuarantineRule"]


@dataclass(frozen=True, slots=True)
class QuarantineRule:
    """When to hold a roll-up back, and how many confirmations release it.

    A roll-up is suspicious when the previous applied roll-up had at least
    ``min_rows`` need rows and the new one keeps fewer than
    ``keep_fraction`` of them (by need key). It is applied once
    ``confirmations`` further consecutive roll-ups are suspicious too.
    """

    min_rows: int = 10
    keep_fraction: float = 0.10
    confirmations: int = 3

    def suspicious(self, previous: Collection[str], incoming: Collection[str]) -> bool:
        """True when ``incoming`` keeps too few of ``previous``'s need keys."""
        if len(previous) < self.min_rows:
            return False
        # The usual roll-up keeps every key; counting them one by one would say the same.
        kept = (
            len(previous) if incoming == previous else sum(1 for key in incoming if key in previous)
        )
        return kept < self.keep_fraction * len(previous)
