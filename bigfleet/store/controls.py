"""Pause and dry run per shard, durable in PostgreSQL (table ``shard_controls``).

An operator's kill switch must outlive the process it stops: a paused
shard that crashes, restarts or loses its lease to a standby comes back
paused, because every holder reads this table rather than remembering.
The row ``*`` applies to every shard; a shard's effective control is its
own row OR'd with ``*`` (pausing all and resuming one leaves that one
paused until ``*`` is resumed — the safe reading of two switches).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["ALL_SHARDS", "Control", "ControlStore"]

ALL_SHARDS = "*"
"""The ``shard_id`` of the row that applies to every shard."""


@dataclass(frozen=True, slots=True)
class Control:
    """What an operator asked of a shard (or of all, ``shard_id == '*'``)."""

    shard_id: str
    paused: bool = False
    dry_run: bool = False
    reason: str = ""
    changed_by: str = ""
    changed_at: datetime | None = None
    version: int = 0
    #: The process holding the shard runs in shadow mode (it says so itself at start).
    shadow: bool = False

    def combined(self, fleet: Control | None) -> Control:
        """This shard's control with the fleet-wide row applied on top."""
        if fleet is None or not (fleet.paused or fleet.dry_run):
            return self
        reasons = [r for r in (self.reason, fleet.reason) if r]
        return Control(
            shard_id=self.shard_id,
            paused=self.paused or fleet.paused,
            dry_run=self.dry_run or fleet.dry_run,
            reason="; ".join(dict.fromkeys(reasons)),
            changed_by=fleet.changed_by if fleet.paused or fleet.dry_run else self.changed_by,
            changed_at=max(
                (t for t in (self.changed_at, fleet.changed_at) if t is not None), default=None
            ),
            version=self.version + fleet.version,
            shadow=self.shadow,
        )


class ControlStore:
    """Reads and writes ``shard_controls``. Writes are upserts that bump ``version``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def set(
        self,
        shard_id: str,
        *,
        paused: bool | None = None,
        dry_run: bool | None = None,
        reason: str = "",
        changed_by: str = "",
    ) -> Control:
        """Change a shard's (or ``*``'s) pause and/or dry run; None leaves a switch as it is.

        Raises ``ValueError`` for an empty shard id, or for pausing without a reason
        (the reason is what the next operator reads in ``bigfleet shards``).
        """
        if not shard_id:
            raise ValueError("shard: must name a shard or '*' for all")
        if (paused or dry_run) and not reason.strip():
            raise ValueError("reason: say why (it is shown to everyone who looks at the shard)")
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        INSERT INTO shard_controls
                               (shard_id, paused, dry_run, reason, changed_by, changed_at)
                        VALUES (:sid, COALESCE(:paused, false), COALESCE(:dry, false),
                                :reason, :by, now())
                        ON CONFLICT (shard_id) DO UPDATE SET
                               paused = COALESCE(:paused, shard_controls.paused),
                               dry_run = COALESCE(:dry, shard_controls.dry_run),
                               reason = :reason, changed_by = :by, changed_at = now(),
                               version = shard_controls.version + 1
                     RETURNING shard_id, paused, dry_run, reason, changed_by, changed_at, version,
                               shadow
                        """
                    ),
                    {
                        "sid": shard_id,
                        "paused": paused,
                        "dry": dry_run,
                        "reason": reason.strip(),
                        "by": changed_by,
                    },
                )
            ).one()
            return _control(row)

    async def publish_shadow(self, shard_id: str, *, shadow: bool) -> None:
        """Record whether the process now holding ``shard_id`` runs in shadow mode."""
        async with self._engine.begin() as conn:
            await conn.execute(
                text(
                    """
                    INSERT INTO shard_controls (shard_id, shadow) VALUES (:sid, :shadow)
                    ON CONFLICT (shard_id) DO UPDATE SET shadow = :shadow
                    """
                ),
                {"sid": shard_id, "shadow": shadow},
            )

    async def get(self, shard_id: str) -> Control:
        """The effective control of one shard (its row combined with ``*``)."""
        rows = await self._rows([shard_id, ALL_SHARDS])
        own = rows.get(shard_id, Control(shard_id))
        return own.combined(rows.get(ALL_SHARDS))

    async def all(self) -> dict[str, Control]:
        """Every row, by shard id (``*`` included when set)."""
        return await self._rows(None)

    async def _rows(self, ids: list[str] | None) -> dict[str, Control]:
        query = (
            "SELECT shard_id, paused, dry_run, reason, changed_by, changed_at, version, shadow "
            "FROM shard_controls"
        )
        params: dict[str, object] = {}
        if ids is not None:
            query += " WHERE shard_id = ANY(:ids)"
            params["ids"] = ids
        async with self._engine.connect() as conn:
            result = await conn.execute(text(query), params)
            return {str(r[0]): _control(r) for r in result}


def _control(row: Row[Any]) -> Control:
    shard_id, paused, dry_run, reason, changed_by, changed_at, version, shadow = tuple(row)
    return Control(
        shard_id=str(shard_id),
        paused=bool(paused),
        dry_run=bool(dry_run),
        reason=str(reason),
        changed_by=str(changed_by),
        changed_at=changed_at,
        version=int(version),
        shadow=bool(shadow),
    )
