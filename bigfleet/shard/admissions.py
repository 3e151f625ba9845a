"""Which shard serves a cluster, asked for many Hellos at once.

A Hello needs the cluster's shard from PostgreSQL (assigned on first
contact, permanent). One query per Hello does not survive a reconnection
storm: thousands of Hellos queue for a handful of pooled connections and
time out. ``Admissions`` gathers the Hellos that arrive while a query is in
flight into the next query (``Store.assign_clusters``), so a storm of
20,000 Hellos costs tens of round trips, not 20,000.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger(__name__)

__all__ = ["Admissions"]

Lookup = Callable[[Sequence[str]], Awaitable[dict[str, str]]]


class Admissions:
    """Batches cluster -> shard look-ups; at most ``max_batch`` clusters per query."""

    def __init__(self, lookup: Lookup, *, max_batch: int = 1000) -> None:
        self._lookup = lookup
        self._max_batch = max_batch
        self._waiting: dict[str, list[asyncio.Future[str]]] = {}
        self._running: asyncio.Task[None] | None = None
        self.queries = 0

    async def owner(self, cluster_id: str) -> str:
        """The shard that serves ``cluster_id`` (assigning it on first contact)."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(cluster_id, []).append(fut)
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._drain(), name="cluster-admissions")
        return await fut

    async def _drain(self) -> None:
        while self._waiting:
            batch = dict(list(self._waiting.items())[: self._max_batch])
            for cluster_id in batch:
                del self._waiting[cluster_id]
            self.queries += 1
            try:
                owners = await self._lookup(list(batch))
            except Exception as err:  # every waiter of the batch gets the failure
                for futures in batch.values():
                    for fut in futures:
                        if not fut.done():
                            fut.set_exception(err)
                continue
            for cluster_id, futures in batch.items():
                for fut in futures:
                    if not fut.done():
                        fut.set_result(owners[cluster_id])
