"""Phase 2: preemption (placeholder until the victim scoring lands)."""

from __future__ import annotations

from collections.abc import Mapping

from shard_engine.catalog import ProfileCatalog
from shard_engine.config import EngineConfig
from shard_engine.needs import Demand
from shard_engine.pending import PendingNeed
from shard_engine.worksheet import Worksheet

__all__ = ["preempt"]


def preempt(
    *,
    sheet: Worksheet,
    pending: list[PendingNeed],
    demands: Mapping[int, Demand],
    catalog: ProfileCatalog,
    config: EngineConfig,
    drain_seconds: Mapping[int, float],
    tolerance: float,
) -> list[PendingNeed]:
    """Return the needs still short (no preemption yet)."""
    return pending
