"""Wiring: the pool, its shard session, and the two transports, built in one place.

:class:`NanookAdapter` owns the :class:`~nanook.pool.WorkerPool` and the
:class:`~nanook.session.ShardSession`, turns every state change into a
notification for ``ScaleConfig`` streams, and (optionally) reloads the pool
file when it changes. :class:`NanookServers` serves REST and gRPC on the
given addresses; :func:`serve` is what ``bigfleet nanook serve`` runs.

Servers and the shard channel are created here and in
:mod:`nanook.session` only, so transport security plugs in at those points.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
from aiohttp import web

from nanook.config import PoolConfig, PoolConfigError, load_pool_config
from nanook.pool import ScaleConfig, WorkerPool
from nanook.rest import rest_app
from nanook.service import add_scaling_service
from nanook.session import ChannelFactory, ShardSession, insecure_channel

log = logging.getLogger(__name__)

__all__ = ["NanookAdapter", "NanookServers", "serve"]


class NanookAdapter:
    """One Nanook worker pool served through BigFleet (see module docstring)."""

    def __init__(
        self,
        config: PoolConfig,
        *,
        cluster_id: str,
        shard_address: str,
        config_path: Path | None = None,
        reload_interval_s: float = 5.0,
        channel_factory: ChannelFactory = insecure_channel,
    ) -> None:
        self.cluster_id = cluster_id
        self.pool = WorkerPool(config)
        self.session = ShardSession(
            cluster_id,
            shard_address,
            self.pool,
            on_change=self._changed,
            channel_factory=channel_factory,
        )
        self.config_path = config_path
        self.reload_interval_s = reload_interval_s
        self._changes = asyncio.Event()
        self._version = 0
        self._reloader: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.session.start()
        if self.config_path is not None:
            self._reloader = asyncio.create_task(self._reload_loop(), name="nanook-reload")

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
        await self.session.stop()

    # -- the scaling service -------------------------------------------------------------------
    def scale_config(self) -> ScaleConfig:
        return self.pool.scale_config()

    def scale_to(
        self, amount: int, *, keep: Iterable[str] | None, delete: Iterable[str] | None
    ) -> None:
        """Accept a target (raises :class:`~nanook.pool.ScaleRefused`); answers at once."""
        self.pool.scale_to(amount, keep=keep, delete=delete)
        log.info("nanook %s: scale to %d (keep %d)", self.cluster_id, amount, len(self.pool.keep))
        self.session.kick()
        self._changed()

    async def watch(self) -> AsyncIterator[ScaleConfig]:
        """The current state at once, then every time it changes."""
        last: ScaleConfig | None = None
        while True:
            event = self._changes
            current = self.pool.scale_config()
            if current != last:
                yield current
                last = current
            await event.wait()

    def _changed(self) -> None:
        self._version += 1
        event, self._changes = self._changes, asyncio.Event()
        event.set()

    # -- configuration reload ----------------------------------------------------------------
    async def _reload_loop(self) -> None:
        assert self.config_path is not None
        seen = _stamp(self.config_path)
        while True:
            await asyncio.sleep(self.reload_interval_s)
            stamp = _stamp(self.config_path)
            if stamp == seen:
                continue
            seen = stamp
            self.reload()

    def reload(self) -> bool:
        """Read the pool file again; a valid one replaces the configuration. True if applied."""
        assert self.config_path is not None
        try:
            config = load_pool_config(self.config_path)
        except PoolConfigError as err:
            log.error("nanook %s: pool file not reloaded: %s", self.cluster_id, err)
            return False
        self.pool.config = config
        self.pool.desired = max(self.pool.desired, config.min)
        log.info(
            "nanook %s: pool file reloaded (min %s, max %s)",
            self.cluster_id,
            config.min,
            config.max,
        )
        self.session.kick()
        self._changed()
        return True


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime, st.st_size


@dataclass
class NanookServers:
    """The REST and gRPC servers of one adapter, on their bound addresses."""

    rest_address: str
    grpc_address: str
    _runner: web.AppRunner
    _grpc: grpc.aio.Server

    @classmethod
    async def start(
        cls, adapter: NanookAdapter, *, rest_listen: str, grpc_listen: str
    ) -> NanookServers:
        """Bind both transports (port 0 picks a free port)."""
        runner = web.AppRunner(rest_app(adapter), access_log=None)
        await runner.setup()
        host, port = _split(rest_listen, "--rest-listen")
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        server = grpc.aio.server()
        add_scaling_service(server, adapter)
        grpc_port = server.add_insecure_port(grpc_listen)
        if grpc_port == 0:
            await runner.cleanup()
            raise OSError(f"--grpc-listen {grpc_listen}: cannot bind")
        await server.start()
        ghost = grpc_listen.rpartition(":")[0]
        return cls(f"{host}:{bound}", f"{ghost}:{grpc_port}", runner, server)

    async def stop(self) -> None:
        await self._grpc.stop(1.0)
        await self._runner.cleanup()


def _split(address: str, flag: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{flag}: expected HOST:PORT, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


async def serve(
    config_path: Path,
    *,
    rest_listen: str,
    grpc_listen: str,
    shard: str,
    cluster_id: str,
    ready: asyncio.Event | None = None,
    channel_factory: ChannelFactory = insecure_channel,
) -> None:
    """Run the adapter until cancelled (``bigfleet nanook serve``).

    ``channel_factory`` opens the Session channel (mutual TLS with a
    ``bigfleet://cluster/<id>`` certificate when the application configures it).
    """
    config = load_pool_config(config_path)
    adapter = NanookAdapter(
        config,
        cluster_id=cluster_id,
        shard_address=shard,
        config_path=config_path,
        channel_factory=channel_factory,
    )
    adapter.start()
    servers = await NanookServers.start(adapter, rest_listen=rest_listen, grpc_listen=grpc_listen)
    log.info(
        "nanook %s: REST on %s, gRPC on %s, shard %s",
        cluster_id,
        servers.rest_address,
        servers.grpc_address,
        shard,
    )
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await servers.stop()
        await adapter.stop()
