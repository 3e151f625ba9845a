"""The coordinator's record: its term (fencing every instruction) and the instructions it
sent, each persisted before it is carried out and finished with its outcome."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from bigfleet.store.pool import Repository

__all__ = ["InstructionRepository", "InstructionRow"]


@dataclass(frozen=True)
class InstructionRow:
    """One coordinator instruction and what became of it."""

    id: int
    term: int
    seq: int
    kind: str
    donor_shard: str | None
    receiver_shard: str | None
    payload: Mapping[str, object]
    status: str
    outcome: str | None
    created_at: datetime


class InstructionRepository(Repository):
    """The coordinator term and the instruction log."""

    async def take_term(self) -> int:
        """Start a new coordinator term (previous + 1) and return it."""
        async with self._engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO coordinator (id, term) VALUES (1, 0) ON CONFLICT (id) DO NOTHING")
            )
            row = (
                await conn.execute(text("UPDATE coordinator SET term = term + 1 RETURNING term"))
            ).one()
            return int(row[0])

    async def term(self) -> int:
        async with self._engine.connect() as conn:
            row = (await conn.execute(text("SELECT term FROM coordinator WHERE id = 1"))).first()
            return int(row[0]) if row else 0

    async def record_instruction(
        self,
        *,
        term: int,
        seq: int,
        kind: str,
        donor: str | None,
        receiver: str | None,
        payload: Mapping[str, object],
    ) -> int:
        """Persist an instruction before it is carried out (idempotent on (term, seq))."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        INSERT INTO coordinator_instructions
                               (term, seq, kind, donor_shard, receiver_shard, payload)
                        VALUES (:term, :seq, :kind, :donor, :receiver, CAST(:payload AS jsonb))
                        ON CONFLICT (term, seq) DO UPDATE SET term = EXCLUDED.term
                        RETURNING id
                        """
                    ),
                    {
                        "term": term,
                        "seq": seq,
                        "kind": kind,
                        "donor": donor,
                        "receiver": receiver,
                        "payload": json.dumps(payload, sort_keys=True, default=str),
                    },
                )
            ).one()
            return int(row[0])

    async def finish_instruction(self, *, term: int, seq: int, status: str, outcome: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(
                text(
                    """
                    UPDATE coordinator_instructions
                       SET status = :status, outcome = :outcome, updated_at = now()
                     WHERE term = :term AND seq = :seq
                    """
                ),
                {"term": term, "seq": seq, "status": status, "outcome": outcome},
            )

    async def instructions(self, *, limit: int = 50) -> list[InstructionRow]:
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text(
                    """
                    SELECT id, term, seq, kind, donor_shard, receiver_shard, payload, status,
                           outcome, created_at
                      FROM coordinator_instructions ORDER BY id DESC LIMIT :limit
                    """
                ),
                {"limit": limit},
            )
            return [InstructionRow(*r) for r in rows]
