"""Cluster IDs <-> small integers shared by the needs table and the inventory.

Columns store a cluster as an ``int32`` (``-1`` for "none"); the names live
here once. Indices are never reused: a cluster that stops sending roll-ups
keeps its number, which costs a few bytes and keeps every cached table valid.
"""

from __future__ import annotations

__all__ = ["NO_CLUSTER", "ClusterIndex"]

NO_CLUSTER = -1
"""Column value meaning "bound to no cluster"."""


class ClusterIndex:
    """Bidirectional map between cluster IDs and dense indices."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._names: list[str] = []

    def __len__(self) -> int:
        return len(self._names)

    def index_of(self, cluster_id: str) -> int:
        """Index of ``cluster_id`` (``NO_CLUSTER`` for ""), creating it when new."""
        if not cluster_id:
            return NO_CLUSTER
        found = self._index.get(cluster_id)
        if found is None:
            found = len(self._names)
            self._names.append(cluster_id)
            self._index[cluster_id] = found
        return found

    def find(self, cluster_id: str) -> int | None:
        """Index of ``cluster_id`` or None when never seen."""
        return self._index.get(cluster_id)

    @property
    def names(self) -> list[str]:
        """Every cluster ID by index. Only ever appended to; callers must not change it."""
        return self._names

    def name(self, index: int) -> str:
        """Cluster ID of ``index`` ("" for ``NO_CLUSTER``)."""
        return "" if index < 0 else self._names[index]
