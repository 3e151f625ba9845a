"""Health: configured machines their cluster stopped reporting get verified.

BigFleet never discovers machines; the cluster's node list is only a second
opinion. A configured machine missing from ``threshold`` consecutive
roll-ups that report nodes becomes a *suspect*; the next cycle asks the
provider about it (a ``Verify`` action). If the provider says
it is dead the settled record is FAILED (or gone), it stops counting as
supply, and Phase 1 replaces it like any other deficit.
"""

from __future__ import annotations

import numpy as np

from shard_engine.actions import ActionKind
from shard_engine.inventory import Inventory
from shard_engine.model import MachineState
from shard_engine.worksheet import Worksheet

__all__ = ["observe_rollup", "verify"]

_MISSED_CAP = 15


def observe_rollup(
    *,
    inventory: Inventory,
    cluster: int,
    reported: frozenset[str] | None,
    threshold: int,
    suspects: set[int],
) -> None:
    """Count one more missed report for each configured machine the roll-up did not list.

    A roll-up that does not report nodes (``None``) says nothing about
    health and changes nothing. A listed machine's count resets.
    """
    if reported is None:
        return
    pools = inventory.pools
    parts = [pools.members(pool) for pool in pools.by_cluster.get(cluster, [])]
    if not parts:
        return
    rows = np.concatenate(parts)
    for row, machine_id in zip(rows.tolist(), inventory.ids.ids_of(rows), strict=True):
        if machine_id in reported:
            inventory.set_missed(row, 0)
            suspects.discard(row)
            continue
        count = min(_MISSED_CAP, inventory.missed(row) + 1)
        inventory.set_missed(row, count)
        if count >= threshold:
            suspects.add(row)


def verify(*, sheet: Worksheet, suspects: set[int], in_flight: set[int] | None = None) -> None:
    """Plan a provider check for every suspect not already acted on this cycle."""
    inventory = sheet.inventory
    busy = in_flight or set()
    for row in sorted(suspects):
        if row in busy or sheet.is_taken(row):
            continue
        if int(inventory.state[row]) != int(MachineState.CONFIGURED):
            continue
        cluster = int(inventory.cluster[row])
        sheet.taken.add(row)
        sheet.log.add(ActionKind.VERIFY, np.array([row], dtype=np.int64), cluster=cluster)
