"""Leases end on the holder's clock: a silent database cannot keep a shard acting.

    LeaseKeeper ──FaultProxy──▶ PostgreSQL          (the holder, whose path we break)
    LeaseKeeper ─────────────▶ PostgreSQL           (a standby with a direct path)

The proxy's blackhole holds connections open and moves no byte, the failure
that let a shard act for minutes after its standby took over (issue 9).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import pytest

from activities.context import ShardInactive
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.store import Database, Store
from tests.chaos.faultproxy import FaultProxy
from tests.integration.multishard import eventually

TTL = 3.0


def through(url: str, address: str) -> str:
    """``url`` with its host and port replaced by ``address`` (a proxy in front of it)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{address}" if userinfo else address
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass
class Stops:
    """When (monotonic) and why a keeper stopped acting."""

    at: list[float] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    def __call__(self, reason: str) -> None:
        self.at.append(time.monotonic())
        self.why.append(reason)


@dataclass
class Rig:
    proxy: FaultProxy
    proxied: Store
    direct: Store


@pytest.fixture
async def rig(database: Database) -> AsyncIterator[Rig]:
    host = urlsplit(database.url)
    proxy = await FaultProxy(f"{host.hostname}:{host.port or 5432}").start()
    proxied_db = Database.connect(through(database.url, proxy.address))
    try:
        yield Rig(proxy, Store(proxied_db.engine), Store(database.engine))
    finally:
        proxy.heal()
        await proxy.stop()
        await asyncio.wait_for(proxied_db.close(), timeout=10)


async def _nothing() -> None:
    return None


async def test_a_holder_stops_acting_on_its_own_clock_when_the_database_goes_silent(
    rig: Rig,
) -> None:
    keeper = LeaseKeeper(rig.proxied, shard_id="s1", holder="a", ttl_s=TTL)
    stops = Stops()
    keeper.on_stop(stops)
    await keeper.take()
    keeping = asyncio.create_task(keeper.keep(_nothing))
    try:
        rig.proxy.blackhole()
        silenced = time.monotonic()
        await eventually(
            lambda: any(t >= silenced for t in stops.at), within=TTL * 3, what="the holder to stop"
        )
        # It stopped while the database was still silent: nothing answered "no".
        assert not keeper.active and rig.proxy.mode == "blackhole"
        assert "renewal" in stops.why[-1]
        with pytest.raises(ShardInactive, match="not renewed in time"):
            keeper.check_active()
    finally:
        keeping.cancel()


async def test_a_standby_with_a_direct_path_takes_over_only_after_the_holder_stopped(
    rig: Rig,
) -> None:
    holder = LeaseKeeper(rig.proxied, shard_id="s1", holder="a", ttl_s=TTL)
    standby = LeaseKeeper(rig.direct, shard_id="s1", holder="b", ttl_s=TTL)
    stops = Stops()
    holder.on_stop(stops)
    await holder.take()
    old_epoch = holder.epoch
    keeping = asyncio.create_task(holder.keep(_nothing))
    try:
        rig.proxy.blackhole()
        await standby.take_or_stand_by()
        took_over = time.monotonic()
        assert standby.epoch == old_epoch + 1 and standby.active
        # The two never acted together: the holder stopped, on its own clock,
        # before the standby's acquisition succeeded on the database's.
        assert stops.at and stops.at[-1] < took_over
        assert not holder.active
    finally:
        keeping.cancel()
    # The path heals: the old holder learns it lost and does not act again.
    rig.proxy.heal()
    assert await holder.renew_or_retake(_nothing) is False
    assert not holder.active and holder.epoch == old_epoch
    assert standby.active


async def test_a_holder_cut_off_from_the_database_resumes_only_with_a_new_epoch(
    rig: Rig,
) -> None:
    keeper = LeaseKeeper(rig.proxied, shard_id="s1", holder="a", ttl_s=TTL)
    retaken: list[int] = []

    async def rebuilt() -> None:
        retaken.append(keeper.epoch)

    await keeper.take()
    first = keeper.epoch
    keeping = asyncio.create_task(keeper.keep(rebuilt))
    try:
        rig.proxy.cut()
        await eventually(lambda: not keeper.active, within=TTL * 3, what="the holder to stop")
        rig.proxy.heal()
        await eventually(lambda: keeper.active, within=TTL * 3, what="the holder to re-take")
        assert keeper.epoch > first
        assert retaken == [keeper.epoch]
    finally:
        keeping.cancel()


async def test_the_time_left_to_act_shrinks_to_nothing_without_renewals(rig: Rig) -> None:
    """A provider mutation's deadline is cut to this, so none lands after the lease ends."""
    keeper = LeaseKeeper(rig.proxied, shard_id="s1", holder="a", ttl_s=TTL)
    await keeper.take()
    assert 0 < keeper.remaining_s() <= keeper.timing.acting_window_s
    await eventually(lambda: keeper.remaining_s() == 0, within=TTL * 2, what="the window to end")
    with pytest.raises(ShardInactive):
        keeper.check_active()
