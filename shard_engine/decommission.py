"""Proportional decommission: retiring machines of a domain takes them evenly from all shards.

When a zone, rack or hall is being retired in part, no single shard should
lose its whole slice of it while others keep theirs. Every shard gives up the
same *share* of what it holds in the domain, so each keeps the same fraction
(with equal holdings that is the same number from each). Rounding uses the
largest remainder, ties to the lower shard id, so the counts add up exactly
and the plan is reproducible. Within a shard the caller's order decides which
machines go (put unbound ones first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["take_evenly"]


def take_evenly(holdings: Mapping[str, Sequence[str]], count: int) -> dict[str, list[str]]:
    """Choose ``count`` machines from ``holdings`` (shard -> machines in the domain, in
    the order they should go) in proportion to each shard's holding.

    Raises ``ValueError`` when asked for more machines than the domain has.
    """
    total = sum(len(ids) for ids in holdings.values())
    if count < 0 or count > total:
        raise ValueError(f"count: {count} is not between 0 and the {total} machines held")
    if count == 0:
        return {}
    exact = {s: count * len(ids) / total for s, ids in holdings.items()}
    quota = {s: math.floor(v) for s, v in exact.items()}
    short = count - sum(quota.values())
    for s in sorted(holdings, key=lambda s: (-(exact[s] - quota[s]), s))[:short]:
        quota[s] += 1
    return {s: list(holdings[s][:n]) for s, n in sorted(quota.items()) if n > 0}
