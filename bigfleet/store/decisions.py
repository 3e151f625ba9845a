"""The decision log in PostgreSQL (table ``decision_log``): append in batches, prune, ask "why".

Bounded on two axes, both per shard and enforced by the writer itself
(``prune``): rows older than the retention age go, and beyond the row cap
the oldest go. The defaults (``bigfleet.decisions.LogLimits``) keep a week
and at most a million rows per shard, which at ~300 bytes a row is about
300 MB per shard at the cap. Appends are one statement per batch, made off
the cycle's path by ``bigfleet.decisions.DecisionLog``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bigfleet.decisions.entries import Decision

__all__ = ["DecisionStore"]

_COLUMNS = (
    "shard_id, decided_at, cycle, mode, kind, machine_id, cluster_id, need_key, reason, inputs"
)


class DecisionStore:
    """Reads and writes ``decision_log``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def append(self, entries: Sequence[Decision]) -> int:
        """Insert a batch in one statement (arrays unnested server-side). Returns rows written."""
        if not entries:
            return 0
        async with self._engine.begin() as conn:
            await conn.execute(
                text(
                    f"""
                    INSERT INTO decision_log ({_COLUMNS})
                    SELECT s, to_timestamp(t), c, m, k, mi, cl, n, r, i::jsonb
                      FROM unnest(CAST(:s AS text[]), CAST(:t AS float8[]),
                                  CAST(:c AS bigint[]), CAST(:m AS text[]),
                                  CAST(:k AS text[]), CAST(:mi AS text[]),
                                  CAST(:cl AS text[]), CAST(:n AS text[]),
                                  CAST(:r AS text[]), CAST(:i AS text[]))
                           AS u(s, t, c, m, k, mi, cl, n, r, i)
                    """
                ),
                {
                    "s": [e.shard_id for e in entries],
                    "t": [e.decided_at for e in entries],
                    "c": [e.cycle for e in entries],
                    "m": [e.mode for e in entries],
                    "k": [e.kind for e in entries],
                    "mi": [e.machine_id for e in entries],
                    "cl": [e.cluster_id for e in entries],
                    "n": [e.need_key for e in entries],
                    "r": [e.reason for e in entries],
                    "i": [json.dumps(e.inputs, sort_keys=True) for e in entries],
                },
            )
        return len(entries)

    async def prune(self, shard_id: str, *, retention_seconds: float, max_rows: int) -> int:
        """Drop the shard's rows past the retention age and beyond the row cap; returns how many."""
        async with self._engine.begin() as conn:
            aged = await conn.execute(
                text(
                    "DELETE FROM decision_log WHERE shard_id = :s "
                    "AND decided_at < now() - make_interval(secs => :age)"
                ),
                {"s": shard_id, "age": retention_seconds},
            )
            capped = await conn.execute(
                text(
                    """
                    DELETE FROM decision_log WHERE shard_id = :s AND id <= (
                        SELECT id FROM decision_log WHERE shard_id = :s
                         ORDER BY id DESC OFFSET :cap LIMIT 1)
                    """
                ),
                {"s": shard_id, "cap": max_rows},
            )
            return int(aged.rowcount or 0) + int(capped.rowcount or 0)

    async def about_machine(
        self, machine_id: str, *, at: datetime | None = None, limit: int = 20
    ) -> list[Decision]:
        """The latest decisions naming a machine at or before ``at`` (now), newest first."""
        return await self._select("machine_id = :mid", {"mid": machine_id}, at=at, limit=limit)

    async def about_need(
        self, cluster_id: str, need_key: str, *, at: datetime | None = None, limit: int = 20
    ) -> list[Decision]:
        """The latest decisions about a need (its actions, holds, unmet verdicts), newest first.

        ``need_key`` may be a prefix of the key (keys are 16 hex digits)."""
        return await self._select(
            "cluster_id = :cl AND need_key LIKE :nk",
            {"cl": cluster_id, "nk": need_key.replace("%", "") + "%"},
            at=at,
            limit=limit,
        )

    async def window(
        self, *, since: datetime, until: datetime, cluster_id: str = ""
    ) -> list[Decision]:
        """Every decision in ``[since, until)``, oldest first (the shadow report's input)."""
        where = "decided_at >= :since AND decided_at < :until"
        params: dict[str, object] = {"since": since, "until": until}
        if cluster_id:
            where += " AND cluster_id = :cl"
            params["cl"] = cluster_id
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text(f"SELECT {_COLUMNS} FROM decision_log WHERE {where} ORDER BY decided_at, id"),
                params,
            )
            return [_decision(r) for r in rows]

    async def _select(
        self, where: str, params: dict[str, object], *, at: datetime | None, limit: int
    ) -> list[Decision]:
        params = dict(params, at=at or datetime.now(UTC), lim=max(1, limit))
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text(
                    f"SELECT {_COLUMNS} FROM decision_log WHERE {where} AND decided_at <= :at "
                    "ORDER BY decided_at DESC, id DESC LIMIT :lim"
                ),
                params,
            )
            return [_decision(r) for r in rows]


def _decision(row: Row[Any]) -> Decision:
    shard_id, decided_at, cycle, mode, kind, machine_id, cluster_id, need_key, reason, inputs = (
        tuple(row)
    )
    return Decision(
        shard_id=str(shard_id),
        decided_at=decided_at.timestamp(),
        cycle=int(cycle),
        mode=str(mode),
        kind=str(kind),
        machine_id=str(machine_id),
        cluster_id=str(cluster_id),
        need_key=str(need_key),
        reason=str(reason),
        inputs=dict(inputs) if isinstance(inputs, dict) else json.loads(inputs),
    )
