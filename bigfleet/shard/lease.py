"""The shard's lease: whether this process may act for its shard, and at which epoch.

    take        acquire_lease (PostgreSQL CAS) -> a new epoch; stand by while another holds it
    renew       every ttl/3 -> the acting deadline moves to (send time + ttl - margin)
    expire      the acting deadline passes on this process's monotonic clock -> not acting,
                whether or not the database ever answers (ADR 0100)
    lose        LeaseLost or LeaseHeld from the store -> not acting
    fenced      a provider refused our token -> not acting
    re-take     the next round takes the lease again, with a new epoch

The lease ends on the holder's own clock. Every renewal that succeeds sets
the *acting deadline* to the monotonic time at which the renewal was sent,
plus ``ttl - margin``. PostgreSQL wrote the expiry as its ``now() + ttl``
at some moment after that send, and a standby takes the lease only once the
expiry has passed on the database's clock; so the holder stops at least
``margin`` before any standby can start, as long as the two clocks drift
apart by less than that margin over one ttl. A database that never answers
changes nothing: the deadline passes and the process stops on its own.

Every database call on the lease path runs under a timeout shorter than the
margin. A call that times out is abandoned (left to finish or fail in the
background), never awaited, so a silent database cannot hold the keeper.

The epoch rides on every provider call in a :class:`FencingToken`; provider
fencing is the second line of defence, not the first. Everything that acts
for the shard asks :meth:`LeaseKeeper.check_active` first; a provider
mutation's deadline is cut to :meth:`LeaseKeeper.remaining_s`, so it cannot
land after the lease may have ended. Acting again needs a fresh epoch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from activities.context import ShardInactive
from bigfleet.aio import wait_set
from bigfleet.store import LeaseHeld, LeaseLost, ShardRemoved, Store
from providers.client import FencingToken

log = logging.getLogger(__name__)

__all__ = ["LeaseKeeper", "LeaseTiming", "StoreTimeout"]

T = TypeVar("T")


class StoreTimeout(TimeoutError):
    """A database call on the lease path did not answer within its timeout."""


class LeaseTiming:
    """TTL, renewal interval, margin and the database call timeout of one lease (ADR 0100).

    ``margin`` defaults to a quarter of the TTL and the call timeout to two
    thirds of the margin; both must leave the invariants ``call_timeout < margin < ttl - renew``
    intact, so a renewal that times out still leaves time for another before
    the acting deadline.
    """

    def __init__(
        self,
        ttl_s: float,
        *,
        margin_s: float | None = None,
        call_timeout_s: float | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl: {ttl_s} must be positive")
        self.ttl_s = ttl_s
        self.renew_s = ttl_s / 3
        self.margin_s = ttl_s / 4 if margin_s is None else margin_s
        self.call_timeout_s = self.margin_s * 2 / 3 if call_timeout_s is None else call_timeout_s
        if not 0 < self.margin_s < self.ttl_s - self.renew_s:
            raise ValueError(
                f"lease margin: {self.margin_s:g} s must be positive and below ttl - renew "
                f"interval ({self.ttl_s - self.renew_s:g} s)"
            )
        if not 0 < self.call_timeout_s < self.margin_s:
            raise ValueError(
                f"lease call timeout: {self.call_timeout_s:g} s must be positive and below "
                f"the margin ({self.margin_s:g} s)"
            )

    @property
    def acting_window_s(self) -> float:
        """How long after a renewal was sent the holder may act: ``ttl - margin``."""
        return self.ttl_s - self.margin_s

    @property
    def retry_s(self) -> float:
        """Pause before another attempt after a failed renewal (a fraction of the margin)."""
        return max(0.05, self.margin_s / 4)


async def bounded(call: Coroutine[Any, Any, T], *, timeout_s: float, what: str) -> T:
    """Await ``call`` for at most ``timeout_s``; past that, abandon it and raise StoreTimeout.

    The abandoned call is cancelled but not awaited: its clean-up (a
    rollback on a silent connection) may itself hang, and the lease keeper
    must not wait for it.
    """
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_swallow)
    raise StoreTimeout(f"{what}: no answer from the database within {timeout_s:g} s")


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class LeaseKeeper:
    """Takes, renews and gives up one shard's lease; the source of its fencing tokens."""

    def __init__(
        self,
        store: Store,
        *,
        shard_id: str,
        holder: str,
        ttl_s: float,
        margin_s: float | None = None,
        call_timeout_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.shard_id = shard_id
        self.holder = holder
        self.timing = LeaseTiming(ttl_s, margin_s=margin_s, call_timeout_s=call_timeout_s)
        self._monotonic = monotonic
        self.epoch = 0
        self.lease_ok = False
        self.fenced = False
        self.standing_by = False
        # How often a live holder refused this process the lease (standing by).
        self.refusals = 0
        # Monotonic time after which this process must not act (0: never acted).
        self.deadline = 0.0
        # Where this process serves sessions; kept on the lease row for redirects.
        self.address = ""
        self._seq = itertools.count(1)
        self._stop_listeners: list[Callable[[str], None]] = []
        self._acting = False
        # True between re-taking the lease and the end of the view's rebuild.
        self._resuming = False
        self._deadline_moved = asyncio.Event()

    @property
    def ttl_s(self) -> float:
        return self.timing.ttl_s

    # ----------------------------------------------------------- may we act?

    @property
    def active(self) -> bool:
        """True while the lease is proven, its acting deadline has not passed, and no
        provider has fenced this epoch."""
        return (
            self.lease_ok
            and not self.fenced
            and not self._resuming
            and self._monotonic() < self.deadline
        )

    def remaining_s(self) -> float:
        """Seconds this process may still act (0 when it may not)."""
        if not (self.lease_ok and not self.fenced and not self._resuming):
            return 0.0
        return max(0.0, self.deadline - self._monotonic())

    def check_active(self) -> None:
        """Raise :class:`ShardInactive` unless this process may act now."""
        if self.fenced:
            raise ShardInactive(f"shard {self.shard_id} epoch {self.epoch} was fenced")
        if not self.lease_ok:
            raise ShardInactive(f"shard {self.shard_id} does not hold its lease")
        if self._resuming:
            raise ShardInactive(
                f"shard {self.shard_id} epoch {self.epoch} is rebuilding its view after "
                "re-taking its lease"
            )
        late = self._monotonic() - self.deadline
        if late >= 0:
            self._note_stopped("its lease deadline passed before it was renewed")
            raise ShardInactive(
                f"shard {self.shard_id} epoch {self.epoch}: its lease was not renewed in "
                f"time ({late:.1f} s past the acting deadline)"
            )

    def on_stop(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` each time this process stops acting (once per epoch)."""
        self._stop_listeners.append(listener)

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
        self._note_stopped(f"fenced by provider {provider}")

    def lost(self, err: LeaseLost) -> ShardInactive:
        """The store said another epoch holds the lease: stop acting; the error to raise."""
        self.lease_ok = False
        self._note_stopped("another epoch holds the lease")
        return ShardInactive(str(err))

    def _note_stopped(self, reason: str, *, level: int = logging.ERROR) -> None:
        """The moment acting ends: tell the listeners once (sessions close, loops idle).

        An error unless the process chose to stop (``level``): a clean shutdown
        is not an incident.
        """
        if not self._acting:
            return
        self._acting = False
        log.log(level, "shard %s epoch %d stops acting: %s", self.shard_id, self.epoch, reason)
        for listener in self._stop_listeners:
            try:
                listener(reason)
            except Exception:
                log.exception("shard %s: a stop listener failed", self.shard_id)

    # ------------------------------------------------------------ take, renew

    async def _call(self, what: str, call: Coroutine[Any, Any, T]) -> T:
        return await bounded(call, timeout_s=self.timing.call_timeout_s, what=what)

    async def take_or_stand_by(self) -> None:
        """Take the lease; while another live process holds it, stand by and retry.

        Two processes started for one shard: exactly one acts, the other waits
        here until the first stops renewing (its lease expires on the
        database's clock) or gives up.
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
                self.refusals += 1
            except StoreTimeout as err:
                log.warning("shard %s: %s; trying again", self.shard_id, err)
            await asyncio.sleep(max(0.2, self.timing.renew_s))

    async def take(self) -> None:
        """Acquire the lease at a new epoch (raises ``LeaseHeld`` while another holds it)."""
        sent = self._monotonic()
        self.epoch = await self._call(
            "acquire the lease",
            self._store.acquire_lease(
                self.shard_id, self.holder, ttl_seconds=self.ttl_s, address=self.address
            ),
        )
        self.lease_ok = True
        self.fenced = False
        self._extend(sent)
        log.info("shard %s took its lease at epoch %d", self.shard_id, self.epoch)

    def _extend(self, sent: float) -> None:
        self.deadline = sent + self.timing.acting_window_s
        self._acting = self.active
        self._deadline_moved.set()

    async def publish_address(self, address: str) -> None:
        """Record where this process serves sessions (moved clusters are sent there)."""
        self.address = address
        await self._call(
            "publish the session address",
            self._store.publish_address(self.shard_id, self.holder, self.epoch, address),
        )

    async def keep(self, on_retaken: Callable[[], Awaitable[None]]) -> None:
        """Renew every ``ttl/3`` for as long as the task runs; re-take after a loss.

        A watchdog beside the renewals stops acting at the deadline even
        while a renewal is still waiting for the database. ``on_retaken``
        runs after each re-take (a new epoch), before acting resumes.
        """
        watchdog = asyncio.create_task(self._watch(), name=f"lease-watchdog-{self.shard_id}")
        try:
            while True:
                ok = await self.renew_or_retake(on_retaken)
                await asyncio.sleep(self.timing.renew_s if ok else self.timing.retry_s)
        finally:
            watchdog.cancel()

    async def _watch(self) -> None:
        """Stop acting the moment the deadline passes (tells the stop listeners)."""
        while True:
            self._deadline_moved.clear()
            left = self.deadline - self._monotonic()
            if left <= 0 or not self.lease_ok:
                self._note_stopped(
                    f"no renewal was confirmed within {self.timing.acting_window_s:g} s "
                    f"(ttl {self.ttl_s:g} s - margin {self.timing.margin_s:g} s)"
                )
                await self._deadline_moved.wait()
                continue
            await wait_set(self._deadline_moved, left)

    async def renew_or_retake(self, on_retaken: Callable[[], Awaitable[None]]) -> bool:
        """One round of :meth:`keep`: never raises. True when the lease was confirmed.

        While acting, a failed renewal only logs: the acting deadline, not
        the failure, decides when to stop. Once stopped (deadline passed,
        fenced, or lost), the next round takes the lease again at a new epoch.
        """
        try:
            if not self.active:
                self._resuming = True
                try:
                    await self.take()
                    try:
                        await on_retaken()
                    except Exception:
                        # Not acting on a view that was not rebuilt: the next round
                        # takes the lease again (another new epoch) and retries.
                        self.lease_ok = False
                        raise
                finally:
                    self._resuming = False
                self._acting = self.active
            else:
                sent = self._monotonic()
                await self._call(
                    "renew the lease",
                    self._store.renew_lease(
                        self.shard_id, self.holder, self.epoch, ttl_seconds=self.ttl_s
                    ),
                )
                self._extend(sent)
            return True
        except LeaseLost:
            log.error("shard %s lost its lease at epoch %d; not acting", self.shard_id, self.epoch)
            self.lease_ok = False
            self._note_stopped("another epoch holds the lease")
        except LeaseHeld as err:
            log.error("shard %s cannot take its lease: %s", self.shard_id, err)
            self.lease_ok = False
            self._note_stopped("another process holds the lease")
        except Exception as err:  # the store is down or silent: the deadline decides
            log.warning(
                "shard %s: lease renewal failed (%s); %.1f s left to act",
                self.shard_id,
                err,
                self.remaining_s(),
            )
        return False

    async def release(self) -> None:
        """Give the lease up (clean stop) so a successor need not wait for it to expire."""
        if self.lease_ok:
            try:
                await self._call(
                    "release the lease",
                    self._store.release_lease(self.shard_id, self.holder, self.epoch),
                )
            except Exception:
                log.warning("shard %s: releasing the lease failed", self.shard_id, exc_info=True)
        self.lease_ok = False
        self._note_stopped("it gave its lease up", level=logging.INFO)
