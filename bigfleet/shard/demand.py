"""The needs of each cluster's last applied roll-up, as the shard process keeps them.

The engine folds needs into arrays; the process keeps the needs themselves
for the two places that need a need's full description: the coordinator
report (a shortfall's requirements and ``min_unit``) and cross-shard victim
choice (the penalties and app class of the need a machine serves).
"""

from __future__ import annotations

from shard_engine.model import Need, Rollup

__all__ = ["AppliedNeeds"]


class AppliedNeeds:
    """cluster -> need key -> the need, from the last roll-up the engine applied."""

    def __init__(self) -> None:
        self._needs: dict[str, dict[str, Need]] = {}

    def remember(self, rollup: Rollup) -> None:
        """Keep the needs of an applied roll-up (full replacement per cluster)."""
        self._needs[rollup.cluster_id] = {n.key: n for n in rollup.needs}

    def need(self, cluster_id: str, need_key: str) -> Need | None:
        """The need, or None when the cluster's last roll-up did not list it."""
        return self._needs.get(cluster_id, {}).get(need_key)
