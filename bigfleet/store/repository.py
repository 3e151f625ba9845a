"""The store's operations. Every contended write is a compare-and-set.

Leases: a shard process takes its shard's lease by bumping ``epoch`` in one
UPDATE that only matches when the lease is free, expired, or already its own.
The returned epoch is the fencing epoch for all of that process's provider
calls. Machine writes are guarded by the writer's epoch, so a process that
lost its lease cannot change an assignment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "ClusterAssignment",
    "ClusterMove",
    "InstructionRow",
    "LeaseHeld",
    "LeaseLost",
    "MachineAssignment",
    "MembershipError",
    "ShardNotEmpty",
    "ShardRemoved",
    "ShardRow",
    "Store",
]


class LeaseHeld(RuntimeError):
    """Another live process holds the shard's lease."""

    def __init__(self, shard_id: str, holder: str, expires_at: datetime | None) -> None:
        self.shard_id, self.holder, self.expires_at = shard_id, holder, expires_at
        super().__init__(f"shard {shard_id!r} is leased by {holder!r} until {expires_at}")


class LeaseLost(RuntimeError):
    """This process no longer holds the lease at the epoch it believes it has."""

    def __init__(self, shard_id: str, epoch: int) -> None:
        self.shard_id, self.epoch = shard_id, epoch
        super().__init__(f"lease on shard {shard_id!r} at epoch {epoch} was lost")


class ShardRemoved(LeaseHeld):
    """The shard was removed from the fleet; no process may take its lease again."""

    def __init__(self, shard_id: str) -> None:
        RuntimeError.__init__(self, f"shard {shard_id!r} was removed from the fleet")
        self.shard_id, self.holder, self.expires_at = shard_id, "", None


class MembershipError(RuntimeError):
    """A membership change (drain, remove) is not allowed in the shard's current state."""


class ShardNotEmpty(MembershipError):
    """A shard cannot be removed while it still owns clusters or machines."""

    def __init__(self, shard_id: str, clusters: int, machines: int) -> None:
        self.shard_id, self.clusters, self.machines = shard_id, clusters, machines
        super().__init__(
            f"shard {shard_id!r} still owns {clusters} cluster(s) and {machines} machine(s); "
            "it can be removed once draining has moved them all"
        )


@dataclass(frozen=True)
class ClusterMove:
    """What :meth:`Store.move_cluster` did: the cluster's owner afterwards and what moved."""

    cluster_id: str
    owner: str | None
    moved: bool
    machines: tuple[tuple[str, str], ...] = ()  # (machine id, provider)


@dataclass(frozen=True)
class ShardRow:
    id: str
    epoch: int
    lease_holder: str | None
    lease_expires_at: datetime | None
    address: str | None
    state: str
    clusters: int
    machines: int


@dataclass(frozen=True)
class ClusterAssignment:
    cluster_id: str
    shard_id: str
    first_seen_at: datetime


@dataclass(frozen=True)
class MachineAssignment:
    machine_id: str
    shard_id: str
    provider: str
    cluster_id: str | None
    operation_seq: int
    version: int
    shard_metadata: Mapping[str, str] = field(default_factory=dict)


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


class Store:
    """Typed access to the BigFleet schema over one async engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @property
    def engine(self) -> AsyncEngine:
        """The connection pool, for repositories of other aggregates to share."""
        return self._engine

    # ------------------------------------------------------------------ leases

    async def acquire_lease(
        self, shard_id: str, holder: str, *, ttl_seconds: float, address: str = ""
    ) -> int:
        """Take the shard's lease and return the new epoch (previous epoch + 1).

        Succeeds when the lease is free, expired, or held by ``holder`` already
        (a restarted process with the same identity still gets a new epoch).
        Raises :class:`LeaseHeld` when another live holder has it.
        """
        async with self._engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO shards (id) VALUES (:id) ON CONFLICT (id) DO NOTHING"),
                {"id": shard_id},
            )
            row = (
                await conn.execute(
                    text(
                        """
                        UPDATE shards
                           SET epoch = epoch + 1,
                               lease_holder = :holder,
                               lease_expires_at = now() + make_interval(secs => :ttl),
                               address = :address
                         WHERE id = :id
                           AND state <> 'removed'
                           AND (lease_holder IS NULL OR lease_holder = :holder
                                OR lease_expires_at < now())
                     RETURNING epoch
                        """
                    ),
                    {"id": shard_id, "holder": holder, "ttl": ttl_seconds, "address": address},
                )
            ).first()
            if row is not None:
                return int(row[0])
            current = (
                await conn.execute(
                    text("SELECT lease_holder, lease_expires_at, state FROM shards WHERE id = :id"),
                    {"id": shard_id},
                )
            ).one()
            if current[2] == "removed":
                raise ShardRemoved(shard_id)
            raise LeaseHeld(shard_id, str(current[0]), current[1])

    async def renew_lease(
        self, shard_id: str, holder: str, epoch: int, *, ttl_seconds: float
    ) -> datetime:
        """Extend the lease; raises :class:`LeaseLost` if the epoch or holder moved on."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        """
                        UPDATE shards
                           SET lease_expires_at = now() + make_interval(secs => :ttl)
                         WHERE id = :id AND lease_holder = :holder AND epoch = :epoch
                     RETURNING lease_expires_at
                        """
                    ),
                    {"id": shard_id, "holder": holder, "epoch": epoch, "ttl": ttl_seconds},
                )
            ).first()
        if row is None:
            raise LeaseLost(shard_id, epoch)
        expires: datetime = row[0]
        return expires

    async def release_lease(self, shard_id: str, holder: str, epoch: int) -> None:
        """Give the lease up (clean shutdown) so a successor need not wait for expiry."""
        async with self._engine.begin() as conn:
            await conn.execute(
                text(
                    """
                    UPDATE shards SET lease_holder = NULL, lease_expires_at = NULL
                     WHERE id = :id AND lease_holder = :holder AND epoch = :epoch
                    """
                ),
                {"id": shard_id, "holder": holder, "epoch": epoch},
            )

    async def publish_address(self, shard_id: str, holder: str, epoch: int, address: str) -> None:
        """Record where the lease holder serves sessions (clusters are redirected there)."""
        async with self._engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE shards SET address = :address "
                    "WHERE id = :id AND lease_holder = :holder AND epoch = :epoch"
                ),
                {"id": shard_id, "holder": holder, "epoch": epoch, "address": address},
            )

    async def shards(self) -> list[ShardRow]:
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text(
                    """
                    SELECT s.id, s.epoch, s.lease_holder, s.lease_expires_at, s.address, s.state,
                           (SELECT count(*) FROM clusters c WHERE c.shard_id = s.id),
                           (SELECT count(*) FROM machines m WHERE m.shard_id = s.id)
                      FROM shards s ORDER BY s.id
                    """
                )
            )
            return [ShardRow(*r) for r in rows]

    # ---------------------------------------------------------------- clusters

    async def assign_cluster(self, cluster_id: str) -> str:
        """Return the cluster's shard, assigning it to the least-loaded active shard first.

        Permanent: once written, the row is never changed by this call. Two
        concurrent first contacts race on the primary key; one wins, both read it.
        """
        if not cluster_id:
            raise ValueError("cluster_id: must not be empty")
        async with self._engine.connect() as conn:
            # The common case (every reconnection) reads one row by primary key,
            # without ranking the shards by load.
            known = (
                await conn.execute(
                    text("SELECT shard_id FROM clusters WHERE id = :cid"), {"cid": cluster_id}
                )
            ).first()
        if known is not None:
            return str(known[0])
        async with self._engine.begin() as conn:
            await conn.execute(
                text(
                    """
                    INSERT INTO clusters (id, shard_id)
                    SELECT :cid, s.id
                      FROM shards s
                     WHERE s.state = 'active'
                     ORDER BY (SELECT count(*) FROM clusters c WHERE c.shard_id = s.id), s.id
                     LIMIT 1
                    ON CONFLICT (id) DO NOTHING
                    """
                ),
                {"cid": cluster_id},
            )
            row = (
                await conn.execute(
                    text("SELECT shard_id FROM clusters WHERE id = :cid"), {"cid": cluster_id}
                )
            ).first()
        if row is None:
            raise RuntimeError("no active shard exists to take cluster " + repr(cluster_id))
        return str(row[0])

    async def assign_clusters(self, cluster_ids: Sequence[str]) -> dict[str, str]:
        """:meth:`assign_cluster` for many clusters in two round trips: cluster -> shard.

        Known clusters keep their shard. The new ones all go to the active
        shard that is least loaded when the batch is written (a storm of first
        contacts is spread batch by batch, not cluster by cluster).
        """
        ids = sorted(set(cluster_ids))
        if any(not cid for cid in ids):
            raise ValueError("cluster_id: must not be empty")
        if not ids:
            return {}
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT id, shard_id FROM clusters WHERE id = ANY(:ids)"), {"ids": ids}
            )
            owners = {str(r[0]): str(r[1]) for r in rows}
        new = [cid for cid in ids if cid not in owners]
        if new:
            async with self._engine.begin() as conn:
                await conn.execute(
                    text(
                        """
                        INSERT INTO clusters (id, shard_id)
                        SELECT w.id, t.id
                          FROM unnest(CAST(:ids AS text[])) AS w(id),
                               (SELECT s.id FROM shards s
                                 WHERE s.state = 'active'
                                 ORDER BY (SELECT count(*) FROM clusters c
                                            WHERE c.shard_id = s.id), s.id
                                 LIMIT 1) AS t
                        ON CONFLICT (id) DO NOTHING
                        """
                    ),
                    {"ids": new},
                )
                rows = await conn.execute(
                    text("SELECT id, shard_id FROM clusters WHERE id = ANY(:ids)"), {"ids": new}
                )
                owners.update({str(r[0]): str(r[1]) for r in rows})
        missing = [cid for cid in ids if cid not in owners]
        if missing:
            raise RuntimeError("no active shard exists to take cluster " + repr(missing[0]))
        return owners

    async def clusters(self, shard_id: str | None = None) -> list[ClusterAssignment]:
        sql = "SELECT id, shard_id, first_seen_at FROM clusters"
        params: dict[str, str] = {}
        if shard_id is not None:
            sql += " WHERE shard_id = :sid"
            params["sid"] = shard_id
        async with self._engine.connect() as conn:
            rows = await conn.execute(text(sql + " ORDER BY id"), params)
            return [ClusterAssignment(*r) for r in rows]

    # ---------------------------------------------------------------- machines

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
            live = (
                await conn.execute(
                    text("SELECT epoch FROM shards WHERE id = :sid FOR SHARE"), {"sid": shard_id}
                )
            ).first()
            if live is None or int(live[0]) != shard_epoch:
                raise LeaseLost(shard_id, shard_epoch)
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
            live = (
                await conn.execute(
                    text("SELECT epoch FROM shards WHERE id = :sid FOR SHARE"), {"sid": shard_id}
                )
            ).first()
            if live is None or int(live[0]) != shard_epoch:
                raise LeaseLost(shard_id, shard_epoch)
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
            await conn.execute(
                text(
                    """
                    INSERT INTO assignment_log (machine_id, shard_id, shard_epoch, cluster_id,
                                                operation, operation_seq, detail)
                    VALUES (:mid, :sid, :epoch, :cid, 'reconcile', :seq, :detail)
                    """
                ),
                {
                    "mid": machine_id,
                    "sid": shard_id,
                    "epoch": shard_epoch,
                    "cid": cluster_id,
                    "seq": int(row[0]),
                    "detail": detail,
                },
            )
            return True

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

    # ------------------------------------------------------------ coordinator

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

    async def active_shards(self) -> list[str]:
        """Shards that take new clusters and quota."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT id FROM shards WHERE state = 'active' ORDER BY id")
            )
            return [str(r[0]) for r in rows]

    async def owners(self, machine_ids: Sequence[str] | None = None) -> dict[str, str]:
        """machine id -> owning shard (all machines when ``machine_ids`` is None)."""
        sql = "SELECT id, shard_id FROM machines"
        params: dict[str, object] = {}
        if machine_ids is not None:
            sql += " WHERE id = ANY(:ids)"
            params["ids"] = list(machine_ids)
        async with self._engine.connect() as conn:
            return {str(r[0]): str(r[1]) for r in await conn.execute(text(sql), params)}

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

    # ------------------------------------------------------------- membership

    async def shard(self, shard_id: str) -> ShardRow | None:
        return next((r for r in await self.shards() if r.id == shard_id), None)

    async def drain_shard(self, shard_id: str) -> None:
        """Mark a shard 'draining': it takes no new clusters or quota, and everything it owns
        is moved to active shards by the coordinator.

        Idempotent for a shard already draining. Raises :class:`KeyError` for
        an unknown shard and :class:`MembershipError` for a removed one, or
        when no other active shard would remain to take its clusters.
        """
        async with self._engine.begin() as conn:
            # Lock every active shard: two concurrent drains cannot both pass the check below.
            active = [
                str(r[0])
                for r in await conn.execute(
                    text("SELECT id FROM shards WHERE state = 'active' ORDER BY id FOR UPDATE")
                )
            ]
            row = (
                await conn.execute(
                    text("SELECT state FROM shards WHERE id = :id FOR UPDATE"), {"id": shard_id}
                )
            ).first()
            if row is None:
                raise KeyError(f"shard {shard_id!r} does not exist")
            if row[0] == "draining":
                return
            if row[0] == "removed":
                raise MembershipError(f"shard {shard_id!r} was removed; there is nothing to drain")
            if not [s for s in active if s != shard_id]:
                raise MembershipError(
                    f"shard {shard_id!r} is the only active shard: nothing could take its clusters"
                )
            await conn.execute(
                text("UPDATE shards SET state = 'draining' WHERE id = :id"), {"id": shard_id}
            )

    async def remove_shard(self, shard_id: str) -> None:
        """Mark a drained, empty shard 'removed' and fence whichever process still runs it.

        Refuses (:class:`ShardNotEmpty`) while it owns any cluster or machine,
        and (:class:`MembershipError`) unless it is draining: removal is the
        last step of a drain. The epoch is bumped and the lease cleared, so a
        process still running for it can neither renew nor write. Idempotent
        for a shard already removed.
        """
        async with self._engine.begin() as conn:
            # FOR UPDATE conflicts with the key-share lock every insert or update
            # referencing the shard takes, so the counts below include them all.
            row = (
                await conn.execute(
                    text("SELECT state FROM shards WHERE id = :id FOR UPDATE"), {"id": shard_id}
                )
            ).first()
            if row is None:
                raise KeyError(f"shard {shard_id!r} does not exist")
            if row[0] == "removed":
                return
            if row[0] != "draining":
                raise MembershipError(
                    f"shard {shard_id!r} is {row[0]}: drain it first (bigfleet shards drain)"
                )
            counts = (
                await conn.execute(
                    text(
                        "SELECT (SELECT count(*) FROM clusters WHERE shard_id = :id), "
                        "(SELECT count(*) FROM machines WHERE shard_id = :id)"
                    ),
                    {"id": shard_id},
                )
            ).one()
            if counts[0] or counts[1]:
                raise ShardNotEmpty(shard_id, int(counts[0]), int(counts[1]))
            await conn.execute(
                text(
                    """
                    UPDATE shards SET state = 'removed', epoch = epoch + 1,
                                      lease_holder = NULL, lease_expires_at = NULL
                     WHERE id = :id
                    """
                ),
                {"id": shard_id},
            )

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

    async def move_cluster(
        self,
        *,
        cluster_id: str,
        donor: str,
        receiver: str,
        machine_ids: Sequence[str],
        term: int,
        seq: int,
    ) -> ClusterMove:
        """Move a cluster and its bound machines from a draining donor to an active receiver.

        One transaction, compare-and-set throughout: the cluster row changes
        only while the donor still has it, the donor is draining and the
        receiver is active; machines change only while the donor still owns
        them and no newer term assigned them. ``machine_ids`` are the machines
        the donor holds for the cluster; they are recorded as bound to it.
        When the cluster is not the donor's any more, nothing changes and the
        result names its current owner (``moved`` False) with the machines
        that owner holds for it, so a retried move can finish its adoption.
        """
        async with self._engine.begin() as conn:
            states = {
                str(r[0]): str(r[1])
                for r in await conn.execute(
                    text(
                        "SELECT id, state FROM shards WHERE id IN (:donor, :receiver) "
                        "ORDER BY id FOR SHARE"
                    ),
                    {"donor": donor, "receiver": receiver},
                )
            }
            current = (
                await conn.execute(
                    text("SELECT shard_id FROM clusters WHERE id = :cid FOR UPDATE"),
                    {"cid": cluster_id},
                )
            ).first()
            owner = str(current[0]) if current is not None else None
            if (
                owner != donor
                or states.get(donor) != "draining"
                or states.get(receiver) != "active"
            ):
                held: tuple[tuple[str, str], ...] = ()
                if owner is not None:
                    held = tuple(
                        (str(r[0]), str(r[1]))
                        for r in await conn.execute(
                            text(
                                "SELECT id, provider FROM machines "
                                "WHERE shard_id = :owner AND cluster_id = :cid ORDER BY id"
                            ),
                            {"owner": owner, "cid": cluster_id},
                        )
                    )
                return ClusterMove(cluster_id, owner, False, held)
            await conn.execute(
                text("UPDATE clusters SET shard_id = :receiver WHERE id = :cid"),
                {"receiver": receiver, "cid": cluster_id},
            )
            rows = await conn.execute(
                text(
                    """
                    UPDATE machines
                       SET shard_id = :receiver, cluster_id = :cid, version = version + 1,
                           assigned_term = :term, updated_at = now()
                     WHERE id = ANY(:ids) AND shard_id = :donor AND assigned_term <= :term
                 RETURNING id, provider, operation_seq
                    """
                ),
                {
                    "ids": list(machine_ids),
                    "donor": donor,
                    "receiver": receiver,
                    "cid": cluster_id,
                    "term": term,
                },
            )
            moved = sorted((str(r[0]), str(r[1]), int(r[2])) for r in rows)
            for machine_id, _, op_seq in moved:
                await conn.execute(
                    text(
                        """
                        INSERT INTO assignment_log (machine_id, shard_id, shard_epoch, cluster_id,
                                                    operation, operation_seq, detail)
                        VALUES (:mid, :receiver, 0, :cid, 'cluster-move', :op_seq, :detail)
                        """
                    ),
                    {
                        "mid": machine_id,
                        "receiver": receiver,
                        "cid": cluster_id,
                        "op_seq": op_seq,
                        "detail": f"from draining {donor} by coordinator term {term} seq {seq}",
                    },
                )
            return ClusterMove(cluster_id, receiver, True, tuple((m, p) for m, p, _ in moved))
