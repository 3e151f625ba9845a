"""Announced interruptions: a machine its provider says is about to go is replaced, not trusted.

A cloud warns before it takes a spot machine back (EC2 gives two minutes,
and a rebalance recommendation earlier still); the provider reports that as
the machine's interruption probability (0.99 for a warning, after the Go
reference's poller). Until then the engine treated such a machine like any
other configured one: it counted as supply, so nothing replaced it until
the cloud had already taken it and its cluster was short for a whole
launch.

So before Phase 1, every settled configured machine whose interruption
probability is at least ``interruption_drain_threshold`` is taken out of
its cluster's supply and drained (an ``INTERRUPT`` action: a ``Reclaim``
with reason ``interruption`` and ``interruption_grace_seconds``). Its
cluster's need is then short by exactly that machine, and Phase 1 covers
it the same cycle, from idle or new capacity, like any deficit. Such a
drain is not excess: reclaim's hysteresis, minimum age and per-cycle caps
do not apply, and a disruption budget holds it only when the budget names
the ``interruption`` reason. An idle machine under such a warning is not
offered to anyone (it would be handed out just before it vanishes); its
hold runs out and it is released, or the provider reports it gone.

A machine already in flight keeps its operation: a drain in progress
finishes, a machine being configured is judged when it settles.

Pure: it reads the worksheet's inventory and catalog and records into the
worksheet.
"""

from __future__ import annotations

import numpy as np

from shard_engine.actions import ActionKind
from shard_engine.catalog import ProfileCatalog
from shard_engine.pools import TIER_BOUND, TIER_IDLE, TIER_SPECULATIVE, PoolKey
from shard_engine.worksheet import Worksheet

__all__ = ["drain_warned"]


def drain_warned(
    *,
    sheet: Worksheet,
    catalog: ProfileCatalog,
    threshold: float,
    grace_seconds: int,
) -> int:
    """Drain every settled configured machine at or above ``threshold``; returns how many.

    Also withholds idle and speculative capacity of such profiles from this
    cycle's offers. Costs one comparison over the profiles when no machine
    is warned.
    """
    probability = catalog.interruption_probability
    warned = np.flatnonzero(probability >= threshold)
    if len(warned) == 0:
        return 0
    for tier in (TIER_IDLE, TIER_SPECULATIVE):
        free = sheet.free[tier]
        free[warned[warned < len(free)]] = 0
    pools = sheet.inventory.pools
    n = len(pools)
    hit = np.flatnonzero(
        (pools.tier[:n] == TIER_BOUND) & (pools.counts[:n] > 0) & np.isin(pools.profile[:n], warned)
    )
    drained = 0
    for pool in hit.tolist():
        key: PoolKey = pools.key(pool)
        rows, found = sheet.take(key, sheet.available(pool))
        if len(rows) == 0:
            continue
        sheet.move_supply(key.cluster, key.profile, -len(rows))
        sheet.log.add(
            ActionKind.INTERRUPT, rows, cluster=key.cluster, pool=found, grace=grace_seconds
        )
        drained += len(rows)
    return drained
