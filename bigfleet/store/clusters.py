"""The cluster aggregate: which shard serves each cluster (first contact, permanent; moved
only while its shard drains)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from bigfleet.store.pool import Repository

__all__ = ["ClusterAssignment", "ClusterMove", "ClusterRepository"]


@dataclass(frozen=True)
class ClusterMove:
    """What :meth:`ClusterRepository.move_cluster` did: the cluster's owner afterwards and what
    moved."""

    cluster_id: str
    owner: str | None
    moved: bool
    machines: tuple[tuple[str, str], ...] = ()  # (machine id, provider)


@dataclass(frozen=True)
class ClusterAssignment:
    cluster_id: str
    shard_id: str
    first_seen_at: datetime


class ClusterRepository(Repository):
    """Clusters and their shard; a move carries the cluster's bound machines along."""

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
