"""Phase 3: reclaim and release (placeholder until Phase 3 lands)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shard_engine.catalog import ProfileCatalog
from shard_engine.config import EngineConfig
from shard_engine.needs import Demand
from shard_engine.worksheet import Worksheet

__all__ = ["reclaim_excess", "release_idle"]


def reclaim_excess(
    *,
    sheet: Worksheet,
    demands: list[Demand],
    catalog: ProfileCatalog,
    config: EngineConfig,
    tolerance: float,
) -> None:
    """Nothing yet."""


def release_idle(
    *,
    sheet: Worksheet,
    catalog: ProfileCatalog,
    config: EngineConfig,
    recent_draw: npt.NDArray[np.float64],
) -> None:
    """Nothing yet."""
