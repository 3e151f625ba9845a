"""The base every repository shares: one async engine (the connection pool) per database.

A repository is the typed access to one aggregate of the schema (shards,
clusters, machines, the coordinator's record). Each is built over the same
engine, so a process opens one pool whatever it uses; ``Store`` composes them
all for the process wiring, while a part that uses one aggregate is handed
that repository (or a Protocol of its own that it satisfies).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["Repository"]


class Repository:
    """Typed access to one aggregate of the BigFleet schema over a shared engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @property
    def engine(self) -> AsyncEngine:
        """The connection pool, for repositories of other aggregates to share."""
        return self._engine
