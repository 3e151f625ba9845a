"""The shard's lease: whether this process may act for its shard, and at which epoch.

    take        acquire_lease (PostgreSQL CAS) -> a new epoch; stand by while another holds it
    renew       every ttl/3 -> still allowed to act
    lose        LeaseLost, LeaseHeld or a store error on renewal -> not acting
    fenced      a provider refused our token -> not acting
    re-take     the next renewal round takes the lease again, with a new epoch

The epoch rides on every provider call in a :class:`FencingToken`. Everything
that acts for the shard asks :meth:`LeaseKeeper.check_active` first, so the
moment the lease cannot be proven nothing mutates a provider or starts a
workflow. Acting again needs a fresh epoch, so a provider that saw a
successor's epoch keeps refusing this process's old one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable

from activities.context import ShardInactive
from bigfleet.store import LeaseLost, Store
from bigfleet.store.repository import LeaseHeld, ShardRemoved
from providers.client import FencingToken

log = logging.getLogger(__name__)

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """Takes, renews and gives up one shard's lease; the source of its fencing tokens."""

    def __init__(self, store: Store, *, shard_id: str, holder: str, ttl_s: float) -> None:
        self._store = store
        self.shard_id = shard_id
        self.holder = holder
        self.ttl_s = ttl_s
        self.epoch = 0
        self.lease_ok = False
        self.fenced = False
        self.standing_by = False
        # Where this process serves sessions; kept on the lease row for redirects.
        self.address = ""
        self._seq = itertools.count(1)

    # ----------------------------------------------------------- may we act?

    @property
    def active(self) -> bool:
        """True while the lease is proven and no provider has fenced this epoch."""
        return self.lease_ok and not self.fenced

    def check_active(self) -> None:
        """Raise :class:`ShardInactive` if this process may no longer act."""
        if self.fenced:
            raise ShardInactive(f"shard {self.shard_id} epoch {self.epoch} was fenced")
        if not self.lease_ok:
            raise ShardInactive(f"shard {self.shard_id} does not hold its lease")

    def next_token(self) -> FencingToken:
        """A fresh fencing token: this epoch and a new sequence number."""
        return FencingToken(self.shard_id, self.epoch, next(self._seq))

    def on_fenced(self, provider: str, machine_id: str, detail: str) -> None:
        """A provider refused our token: stop acting until the lease is re-taken."""
        if not self.fenced:
            log.error(
                "shard %s epoch %d fenced by %s on %s (%s): stopping all actuation",
                self.shard_id,
                self.epoch,
                provider,
                machine_id,
                detail,
            )
        self.fenced = True

    def lost(self, err: LeaseLost) -> ShardInactive:
        """The store said another epoch holds the lease: stop acting; the error to raise."""
        self.lease_ok = False
        return ShardInactive(str(err))

    # ------------------------------------------------------------ take, renew

    async def take_or_stand_by(self) -> None:
        """Take the lease; while another live process holds it, stand by and retry.

        Two processes started for one shard: exactly one acts, the other waits
        here until the first stops renewing (its lease expires) or gives up.
        """
        while True:
            try:
                await self.take()
                self.standing_by = False
                return
            except ShardRemoved:
                raise  # nothing will ever free this lease: do not wait for it
            except LeaseHeld as err:
                if not self.standing_by:
                    log.info("standing by: %s", err)
                self.standing_by = True
                await asyncio.sleep(max(0.2, self.ttl_s / 3))

    async def take(self) -> None:
        """Acquire the lease at a new epoch (raises ``LeaseHeld`` while another holds it)."""
        self.epoch = await self._store.acquire_lease(
            self.shard_id, self.holder, ttl_seconds=self.ttl_s, address=self.address
        )
        self.lease_ok = True
        self.fenced = False
        log.info("shard %s took its lease at epoch %d", self.shard_id, self.epoch)

    async def publish_address(self, address: str) -> None:
        """Record where this process serves sessions (moved clusters are sent there)."""
        self.address = address
        await self._store.publish_address(self.shard_id, self.holder, self.epoch, address)

    async def keep(self, on_retaken: Callable[[], Awaitable[None]]) -> None:
        """Renew every ``ttl/3`` for as long as the task runs; re-take after a loss.

        ``on_retaken`` runs after each re-take (a new epoch), before acting resumes.
        """
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            await self.renew_or_retake(on_retaken)

    async def renew_or_retake(self, on_retaken: Callable[[], Awaitable[None]]) -> None:
        """One round of :meth:`keep`: never raises; a failure only stops acting."""
        try:
            if self.fenced or not self.lease_ok:
                await self.take()
                await on_retaken()
            else:
                await self._store.renew_lease(
                    self.shard_id, self.holder, self.epoch, ttl_seconds=self.ttl_s
                )
        except LeaseLost:
            log.error("shard %s lost its lease at epoch %d; not acting", self.shard_id, self.epoch)
            self.lease_ok = False
        except LeaseHeld as err:
            log.error("shard %s cannot take its lease: %s", self.shard_id, err)
            self.lease_ok = False
        except Exception:  # the store is down: we cannot prove the lease, so do not act
            log.exception("lease renewal failed; not acting until it succeeds")
            self.lease_ok = False

    async def release(self) -> None:
        """Give the lease up (clean stop) so a successor need not wait for it to expire."""
        if self.lease_ok:
            try:
                await self._store.release_lease(self.shard_id, self.holder, self.epoch)
            except Exception:
                log.warning("shard %s: releasing the lease failed", self.shard_id, exc_info=True)
        self.lease_ok = False
