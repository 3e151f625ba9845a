"""Shortfalls and why-not: what the shard could not meet, and the reason.

A shortfall is a need still short after Phase 1 and Phase 2 — counting
machines already on their way — so it is blocked *locally*. The shard
reports at most ``max_shortfalls`` of them (highest priority first, older
first among equals), each with its residual deficit vector, priority,
penalty and age in cycles; one unsatisfied for more than
``escalate_after_cycles`` cycles is flagged for human attention.

Every short need also gets a reason for the inspection CLI, from the
evidence the phases left on its :class:`~shard_engine.pending.PendingNeed`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shard_engine.config import EngineConfig
from shard_engine.inventory import Inventory
from shard_engine.model import Operator, Requirement, Shortfall
from shard_engine.pending import (
    REASON_AWAITING_TRANSFER,
    REASON_NO_SUPPLY,
    REASON_PREEMPTION_EXHAUSTED,
    REASON_PRIORITY_STARVED,
    REASON_TOPOLOGY,
    PendingNeed,
)

__all__ = ["awaits_idle", "collect", "explain", "reported_requirements"]


def explain(pending: PendingNeed, inventory: Inventory) -> str:
    """Why a need is still short, as ``"<category>: <detail>"``.

    Categories, first match wins: topology unsatisfiable (a gang or hard
    spread cannot be placed), no matching supply (no machine of any state
    in this shard fits the requirements and ``min_unit``), preemption
    exhausted (lower-priority victims existed and were all taken), and
    priority-starved (every matching machine is held at equal or higher
    priority, or already in motion).
    """
    if pending.awaiting_transfer:
        return f"{REASON_AWAITING_TRANSFER}: a matching idle machine is held by another shard"
    if pending.topology_block:
        return f"{REASON_TOPOLOGY}: {pending.topology_block}"
    members = inventory.members
    alloc = inventory.catalog.alloc
    short = alloc[:, : len(pending.deficit)][:, pending.deficit > 0]
    offers: npt.NDArray[np.bool_] = np.asarray((short > 0).any(axis=1), dtype=np.bool_)
    matching = pending.mask[: len(members)] & (members > 0) & offers[: len(members)]
    if not matching.any():
        return f"{REASON_NO_SUPPLY}: no machine in this shard fits the requirements and min_unit"
    if pending.victims_available > 0 or pending.victims_taken > 0:
        return (
            f"{REASON_PREEMPTION_EXHAUSTED}: {pending.victims_taken} lower-priority machines "
            "preempted, no further victim fits"
        )
    machines = int(members[matching].sum())
    return (
        f"{REASON_PRIORITY_STARVED}: all {machines} matching machines are held at priority "
        f">= {pending.priority}, in motion, or promised"
    )


def awaits_idle(reason: str) -> bool:
    """Is this :func:`explain` reason a need held back for another shard's idle machine?

    The coordinator answers such a shortfall with idle machines only (ADR 0129);
    a report carries only the reason, so this reads it back.
    """
    return reason.startswith(REASON_AWAITING_TRANSFER)


def reported_requirements(
    requirements: Sequence[Requirement], domain: str
) -> tuple[Requirement, ...]:
    """A shortfall's requirements as a report carries them.

    A gang short in a domain it holds part of (``Shortfall.domain``) names
    it: its ``Same`` requirement allows that value only, as a pinned gang's
    roll-up already does (ADRs 0160 and 0180), so a donor's machines of
    another domain never answer it.
    """
    if not domain:
        return tuple(requirements)
    return tuple(
        Requirement(r.key, Operator.SAME, (domain,)) if r.operator is Operator.SAME else r
        for r in requirements
    )


def collect(
    *,
    pending: Sequence[PendingNeed],
    inventory: Inventory,
    names: Sequence[str],
    ages: dict[tuple[int, str], int],
    config: EngineConfig,
) -> tuple[tuple[Shortfall, ...], dict[int, dict[str, str]]]:
    """Shortfalls (bounded, ordered) and per-cluster reasons for this cycle.

    ``ages`` is updated in place: needs short again age by one, needs no
    longer short are forgotten.
    """
    found: list[Shortfall] = []
    why: dict[int, dict[str, str]] = {}
    aged: dict[tuple[int, str], int] = {}
    for item in pending:
        if not item.unsatisfied:
            continue
        key = (item.cluster, item.key)
        age = ages.get(key, 0) + 1
        aged[key] = age
        reason = explain(item, inventory)
        why.setdefault(item.cluster, {})[item.key] = reason
        deficit = {
            names[d]: float(item.deficit[d]) for d in np.flatnonzero(item.deficit > 0).tolist()
        }
        found.append(
            Shortfall(
                cluster_id=inventory.clusters.name(item.cluster),
                need_key=item.key,
                priority=item.priority,
                deficit=deficit,
                age_cycles=age,
                escalated=age > config.escalate_after_cycles,
                reason=reason,
                interruption_penalty=item.need.interruption_penalty,
                domain=item.domain,
            )
        )
    ages.clear()
    ages.update(aged)
    found.sort(key=lambda s: (-s.priority, -s.age_cycles))
    return tuple(found[: config.max_shortfalls]), why
