"""The shard aggregate: membership (active, draining, removed), leases and epochs, addresses.

Leases: a shard process takes its shard's lease by bumping ``epoch`` in one
UPDATE that only matches when the lease is free, expired, or already its own.
The returned epoch is the fencing epoch for all of that process's provider
calls. Machine writes elsewhere are guarded by the writer's epoch (read from
this table), so a process that lost its lease cannot change an assignment.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from bigfleet.store.pool import Repository

__all__ = [
    "LeaseHeld",
    "LeaseLost",
    "MembershipError",
    "ShardNotEmpty",
    "ShardRemoved",
    "ShardRepository",
    "ShardRow",
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
class ShardRow:
    id: str
    epoch: int
    lease_holder: str | None
    lease_expires_at: datetime | None
    address: str | None
    state: str
    clusters: int
    machines: int


class ShardRepository(Repository):
    """Shards: who holds each lease at which epoch, where it serves, whether it drains."""

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

    # ------------------------------------------------------------- membership

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

    async def shard(self, shard_id: str) -> ShardRow | None:
        return next((r for r in await self.shards() if r.id == shard_id), None)

    async def active_shards(self) -> list[str]:
        """Shards that take new clusters and quota."""
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT id FROM shards WHERE state = 'active' ORDER BY id")
            )
            return [str(r[0]) for r in rows]

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
