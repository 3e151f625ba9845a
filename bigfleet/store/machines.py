"""The machine aggregate: each machine's owner shard, cluster binding, operation sequence,
quarantine, and the append-only assignment log.

Every write is a compare-and-set: an outcome lands only while its writer
still holds its shard's epoch and its operation sequence is newer; a
transfer only moves rows the donor still owns and no newer term moved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from bigfleet.store.pool import Repository
from bigfleet.store.shards import LeaseLost

__all__ = ["MachineAssignment", "MachineRepository"]


@dataclass(frozen=True)
class MachineAssignment:
    machine_id: str
    shard_id: str
    provider: str
    cluster_id: str | None
    operation_seq: int
    version: int
    shard_metadata: Mapping[str, str] = field(default_factory=dict)


class MachineRepository(Repository):
    """Machines: ownership and binding (CAS on epoch and sequence), quarantine, the log."""

    async def machines(
        self, shard_id: str | None = None, *, cluster_id: str | None = None
    ) -> list[MachineAssignment]:
        """Machine assignments, optionally of one shard and/or bound to one cluster."""
        sql = (
            "SELECT id, shard_id, provider, cluster_id, operation_seq, version, shard_metadata "
            "FROM machines"
        )
        params: dict[str, str] = {}
        where: list[str] = []
        if shard_id is not None:
            where.append("shard_id = :sid")
            params["sid"] = shard_id
        if cluster_id is not None:
            where.append("cluster_id = :cid")
            params["cid"] = cluster_id
        if where:
            sql += " WHERE " + " AND ".join(where)
        async with self._engine.connect() as conn:
            rows = await conn.execute(text(sql + " ORDER BY id"), params)
            return [MachineAssignment(*r) for r in rows]

    async def machines_by_id(self, machine_ids: Sequence[str]) -> list[MachineAssignment]:
        if not machine_ids:
            return []
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT id, shard_id, provider, cluster_id, operation_seq, version, "
                    "shard_metadata FROM machines WHERE id = ANY(:ids) ORDER BY id"
                ),
                {"ids": list(machine_ids)},
            )
            return [MachineAssignment(*r) for r in rows]

    async def owners(self, machine_ids: Sequence[str] | None = None) -> dict[str, str]:
        """machine id -> owning shard (all machines when ``machine_ids`` is None)."""
        sql = "SELECT id, shard_id FROM machines"
        params: dict[str, object] = {}
        if machine_ids is not None:
            sql += " WHERE id = ANY(:ids)"
            params["ids"] = list(machine_ids)
        async with self._engine.connect() as conn:
            return {str(r[0]): str(r[1]) for r in await conn.execute(text(sql), params)}

    async def record_operation(
        self,
        *,
        machine_id: str,
        shard_id: str,
        shard_epoch: int,
        provider: str,
        cluster_id: str | None,
        operation: str,
        operation_seq: int,
        shard_metadata: Mapping[str, str] | None = None,
        detail: str = "",
    ) -> bool:
        """Record the outcome of operation ``operation_seq`` on a machine, exactly once.

        The ownership row changes only when the writer still holds
        ``shard_epoch`` for ``shard_id``, the machine is owned by that shard
        (or unknown), and ``operation_seq`` is newer than the stored one.
        The assignment log gets the outcome once per (machine, sequence,
        operation) either way: an outcome that a newer operation superseded
        is logged as such, so no finished operation is missing from the
        history. Returns True when the row changed, False when this outcome
        was already recorded or superseded — which is what an activity retry
        sees. Raises :class:`LeaseLost` when the epoch is no longer current.
        """
        meta = json.dumps(dict(shard_metadata or {}), sort_keys=True)
        async with self._engine.begin() as conn:
            await _hold_epoch(conn, shard_id, shard_epoch)
            changed = (
                await conn.execute(
                    text(
                        """
                        INSERT INTO machines (id, shard_id, provider, cluster_id, operation_seq,
                                              version, shard_metadata, updated_at)
                        VALUES (:mid, :sid, :provider, :cid, :seq, 1, CAST(:meta AS jsonb), now())
                        ON CONFLICT (id) DO UPDATE
                           SET cluster_id = EXCLUDED.cluster_id,
                               operation_seq = EXCLUDED.operation_seq,
                               provider = EXCLUDED.provider,
                               shard_metadata = EXCLUDED.shard_metadata,
                               version = machines.version + 1,
                               updated_at = now()
                         WHERE machines.shard_id = EXCLUDED.shard_id
                           AND machines.operation_seq < EXCLUDED.operation_seq
                     RETURNING version
                        """
                    ),
                    {
                        "mid": machine_id,
                        "sid": shard_id,
                        "provider": provider,
                        "cid": cluster_id,
                        "seq": operation_seq,
                        "meta": meta,
                    },
                )
            ).first()
            if changed is None:
                # Superseded or a repeat. The upsert locked the row, so this check
                # and the insert below are not raced by a concurrent retry.
                logged = (
                    await conn.execute(
                        text(
                            "SELECT 1 FROM assignment_log WHERE machine_id = :mid "
                            "AND operation_seq = :seq AND operation = :op LIMIT 1"
                        ),
                        {"mid": machine_id, "seq": operation_seq, "op": operation},
                    )
                ).first()
                if logged is not None:
                    return False
                current = (
                    await conn.execute(
                        text("SELECT shard_id, operation_seq FROM machines WHERE id = :mid"),
                        {"mid": machine_id},
                    )
                ).one()
                detail = (
                    f"superseded: the ownership row is at sequence {current[1]} "
                    f"of shard {current[0]}" + (f"; {detail}" if detail else "")
                )
            await _log_outcome(
                conn,
                machine_id=machine_id,
                shard_id=shard_id,
                shard_epoch=shard_epoch,
                cluster_id=cluster_id,
                operation=operation,
                operation_seq=operation_seq,
                detail=detail,
            )
            return changed is not None

    async def reconcile_binding(
        self,
        *,
        machine_id: str,
        shard_id: str,
        shard_epoch: int,
        expected_cluster: str | None,
        cluster_id: str | None,
        detail: str,
    ) -> bool:
        """Set a machine's recorded binding to what its provider reports (the reconcile loop).

        Compare-and-set: changes the row only while ``shard_id`` still holds
        ``shard_epoch``, owns the machine, and the row still names
        ``expected_cluster`` (what the loop saw). The operation sequence is
        left alone; the change is logged as operation ``reconcile`` with
        ``detail``. Returns True when the row changed. Raises
        :class:`LeaseLost` when the epoch is no longer current.
        """
        async with self._engine.begin() as conn:
            await _hold_epoch(conn, shard_id, shard_epoch)
            row = (
                await conn.execute(
                    text(
                        """
                        UPDATE machines
                           SET cluster_id = CAST(:cid AS text), version = version + 1,
                               updated_at = now()
                         WHERE id = :mid AND shard_id = :sid
                           AND cluster_id IS NOT DISTINCT FROM CAST(:expected AS text)
                     RETURNING operation_seq
                        """
                    ),
                    {
                        "mid": machine_id,
                        "sid": shard_id,
                        "cid": cluster_id,
                        "expected": expected_cluster,
                    },
                )
            ).first()
            if row is None:
                return False
            await _log_outcome(
                conn,
                machine_id=machine_id,
                shard_id=shard_id,
                shard_epoch=shard_epoch,
                cluster_id=cluster_id,
                operation="reconcile",
                operation_seq=int(row[0]),
                detail=detail,
            )
            return True

    async def assign_unowned(
        self, shard_id: str, provider: str, machine_ids: Sequence[str], *, term: int
    ) -> list[str]:
        """Give machines nobody owns yet to ``shard_id``; returns those actually assigned.

        Only an active shard receives machines (a draining or removed one gets none).
        """
        if not machine_ids:
            return []
        async with self._engine.begin() as conn:
            rows = await conn.execute(
                text(
                    """
                    INSERT INTO machines (id, shard_id, provider, operation_seq, version,
                                          assigned_term)
                    SELECT unnest(CAST(:ids AS text[])), CAST(:sid AS text), :provider, 0, 1, :term
                     WHERE EXISTS (SELECT 1 FROM shards
                                    WHERE id = CAST(:sid AS text) AND state = 'active' FOR SHARE)
                    ON CONFLICT (id) DO NOTHING
                    RETURNING id
                    """
                ),
                {"ids": list(machine_ids), "sid": shard_id, "provider": provider, "term": term},
            )
            return [str(r[0]) for r in rows]

    async def transfer(
        self,
        *,
        donor: str,
        receiver: str,
        machine_ids: Sequence[str],
        term: int,
        seq: int,
    ) -> list[str]:
        """Move unbound machines from ``donor`` to ``receiver`` by compare-and-set.

        Only rows still owned by the donor, bound to no cluster, and not
        already moved by a newer term change hands, and only to an active
        receiver (a draining shard takes nothing new); the rest are left alone.
        Returns the ids that moved. Re-running the same (term, seq) moves
        nothing more, so a retried activity is harmless.
        """
        if not machine_ids:
            return []
        async with self._engine.begin() as conn:
            rows = await conn.execute(
                text(
                    """
                    UPDATE machines
                       SET shard_id = :receiver, version = version + 1,
                           assigned_term = :term, updated_at = now()
                     WHERE id = ANY(:ids) AND shard_id = :donor AND cluster_id IS NULL
                       AND assigned_term <= :term
                       AND EXISTS (SELECT 1 FROM shards
                                    WHERE id = CAST(:receiver AS text) AND state = 'active'
                                      FOR SHARE)
                 RETURNING id, operation_seq
                    """
                ),
                {"ids": list(machine_ids), "donor": donor, "receiver": receiver, "term": term},
            )
            moved = [(str(r[0]), int(r[1])) for r in rows]
            for machine_id, op_seq in moved:
                await conn.execute(
                    text(
                        """
                        INSERT INTO assignment_log (machine_id, shard_id, shard_epoch, cluster_id,
                                                    operation, operation_seq, detail)
                        VALUES (:mid, :receiver, 0, NULL, 'transfer', :op_seq, :detail)
                        """
                    ),
                    {
                        "mid": machine_id,
                        "receiver": receiver,
                        "op_seq": op_seq,
                        "detail": f"from {donor} by coordinator term {term} seq {seq}",
                    },
                )
            return [m for m, _ in moved]

    # ---------------------------------------------------------------- quarantine

    async def quarantine(self, machine_id: str, shard_id: str, reason: str) -> bool:
        """Record that ``shard_id`` stopped using its machine, and why.

        Marks only a machine row owned by that shard (the shard records the
        operation first, which creates the row). Repeating it replaces the
        reason. Returns False when there is no such row.
        """
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        UPDATE machines SET quarantined_reason = :reason, updated_at = now()
                         WHERE id = :mid AND shard_id = :sid
                     RETURNING id
                        """
                    ),
                    {"mid": machine_id, "sid": shard_id, "reason": reason},
                )
            ).first()
            return row is not None

    async def release_quarantine(self, machine_id: str) -> bool:
        """Put a quarantined machine back in use; True if it was quarantined."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        UPDATE machines SET quarantined_reason = NULL, updated_at = now()
                         WHERE id = :mid AND quarantined_reason IS NOT NULL
                     RETURNING id
                        """
                    ),
                    {"mid": machine_id},
                )
            ).first()
            return row is not None

    async def quarantined(self, shard_id: str) -> dict[str, str]:
        """The shard's quarantined machines: machine id -> reason."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT id, quarantined_reason FROM machines "
                    "WHERE shard_id = :sid AND quarantined_reason IS NOT NULL ORDER BY id"
                ),
                {"sid": shard_id},
            )
            return {str(r[0]): str(r[1]) for r in rows}

    async def assignment_log(self, machine_id: str) -> Sequence[tuple[str, int, str | None]]:
        """(operation, operation_seq, cluster_id) for a machine, oldest first."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT operation, operation_seq, cluster_id FROM assignment_log "
                    "WHERE machine_id = :mid ORDER BY id"
                ),
                {"mid": machine_id},
            )
            return [(str(r[0]), int(r[1]), r[2]) for r in rows]


async def _hold_epoch(conn: AsyncConnection, shard_id: str, shard_epoch: int) -> None:
    """Share-lock ``shard_id``'s row; raise :class:`LeaseLost` unless it is at ``shard_epoch``.

    The row stays share-locked until the transaction ends, so a lease
    take-over (which updates the epoch) waits for the write that checked it:
    a compare-and-set on the epoch cannot be overtaken between its check and
    its write.
    """
    live = (
        await conn.execute(
            text("SELECT epoch FROM shards WHERE id = :sid FOR SHARE"), {"sid": shard_id}
        )
    ).first()
    if live is None or int(live[0]) != shard_epoch:
        raise LeaseLost(shard_id, shard_epoch)


async def _log_outcome(
    conn: AsyncConnection,
    *,
    machine_id: str,
    shard_id: str,
    shard_epoch: int,
    cluster_id: str | None,
    operation: str,
    operation_seq: int,
    detail: str,
) -> None:
    """Append one line to the assignment log, in the caller's transaction."""
    await conn.execute(
        text(
            """
            INSERT INTO assignment_log (machine_id, shard_id, shard_epoch, cluster_id,
                                        operation, operation_seq, detail)
            VALUES (:mid, :sid, :epoch, :cid, :op, :seq, :detail)
            """
        ),
        {
            "mid": machine_id,
            "sid": shard_id,
            "epoch": shard_epoch,
            "cid": cluster_id,
            "op": operation,
            "seq": operation_seq,
            "detail": detail,
        },
    )
