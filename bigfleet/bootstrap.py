"""One bootstrap: builds the store, the Temporal client, the provider clients and the processes.

    Settings (BIGFLEET_* environment) ──► connect() ──► Wiring
        /metrics (BIGFLEET_METRICS_LISTEN)   prometheus_client
        Database (migrated) + Store          PostgreSQL
        Temporal client (+ search attributes, mutual TLS when asked)
        ProviderClient per configured provider (mutual TLS when configured)
    Wiring ──► shard_process(options)        ShardProcess (its parts: bigfleet.shard.parts)
    Wiring ──► coordinator_process(...)      CoordinatorProcess

What each worker serves is listed once: ``activities.registry``
(``shard_activities``, ``coordinator_activities``) and ``workflows.registry``
(``ALL_WORKFLOWS``, ``COORDINATOR_WORKFLOWS``). The CLI (``bigfleet shard``,
``bigfleet coordinator run``, and every command's store and Temporal client
through ``bigfleet.cli.connections``) and the dev stack call this module;
nothing connects at import time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from temporalio.client import Client
from temporalio.service import TLSConfig

from activities.context import ProviderCalls
from bigfleet import temporal
from bigfleet.backoff import retrying
from bigfleet.config import ConfigError, Settings
from bigfleet.coordinator import CoordinatorProcess
from bigfleet.identity import KeyPairSource, client_security, temporal_tls
from bigfleet.metrics import MetricsServer
from bigfleet.metrics import serve as serve_metrics
from bigfleet.shard.options import ShardOptions
from bigfleet.shard.process import ShardProcess
from bigfleet.store import Database, Store
from providers.client import ProviderClient
from workflows.contracts import Deadlines, default_deadline_overrides

__all__ = [
    "Wiring",
    "connect",
    "coordinator_process",
    "open_store",
    "shard_options",
    "shard_process",
    "temporal_client",
    "temporal_tls_of",
]


@dataclass
class Wiring:
    """The connections one process holds; ``close`` releases them all."""

    db: Database
    store: Store
    temporal: Client
    providers: dict[str, ProviderClient] = field(default_factory=dict)
    # The process's own certificate (the Session port, provider calls), when configured.
    tls: KeyPairSource | None = None
    # /metrics, when BIGFLEET_METRICS_LISTEN asks for it.
    metrics: MetricsServer | None = None

    async def close(self) -> None:
        for client in self.providers.values():
            with contextlib.suppress(Exception):
                await client.close()
        await self.db.close()
        if self.metrics is not None:
            self.metrics.stop()


async def open_store(
    database_url: str, *, migrate: bool = True, retry_s: float = 0.0, revision: str = "head"
) -> tuple[Database, Store]:
    """The database (upgraded to ``revision`` unless ``migrate`` is False) and its store.

    With ``retry_s`` the first connection (and the migration) is retried with
    back-off for that long while PostgreSQL is not reachable yet.
    """
    db = Database.connect(database_url)

    async def ready() -> None:
        if migrate:
            await db.migrate(revision)
        else:
            await Store(db.engine).term()

    try:
        if retry_s > 0:
            await retrying("PostgreSQL", ready, within_s=retry_s)
        elif migrate:
            await db.migrate(revision)
    except BaseException:
        await db.close()
        raise
    return db, Store(db.engine)


def temporal_tls_of(settings: Settings) -> TLSConfig | None:
    """The process's certificate for Temporal, when BIGFLEET_TEMPORAL_TLS asks for it."""
    if not settings.temporal_tls:
        return None
    if settings.tls is None:
        raise ConfigError(
            "BIGFLEET_TEMPORAL_TLS", "needs BIGFLEET_TLS_CERT, BIGFLEET_TLS_KEY and BIGFLEET_TLS_CA"
        )
    return temporal_tls(KeyPairSource(settings.tls))


async def temporal_client(settings: Settings, *, address: str, namespace: str) -> Client:
    """A Temporal client for a short-lived command (no metrics runtime, no retrying).

    Mutual TLS when BIGFLEET_TEMPORAL_TLS asks for it; raises :class:`ConfigError`
    when it does without the certificate variables.
    """
    return await temporal.connect(address, namespace, tls=temporal_tls_of(settings))


@contextlib.asynccontextmanager
async def connect(settings: Settings, *, search_attributes: bool = True) -> AsyncIterator[Wiring]:
    """Everything a shard or coordinator process connects to, closed on exit.

    Raises :class:`ConfigError` naming the variable when one it needs is unset.
    """
    if not settings.database_url:
        raise ConfigError("BIGFLEET_DATABASE_URL", "must be set")
    if not settings.temporal_address:
        raise ConfigError("BIGFLEET_TEMPORAL_ADDRESS", "must be set")
    tls = temporal_tls_of(settings)
    served = serve_metrics(settings.metrics_listen) if settings.metrics_listen else None
    db, store = await open_store(settings.database_url, retry_s=settings.connect_timeout_s)
    try:
        address = settings.temporal_address
        runtime = temporal.runtime(settings.temporal_metrics_listen)

        async def reach_temporal() -> Client:
            found = await temporal.connect(
                address, settings.temporal_namespace, tls=tls, runtime=runtime
            )
            if search_attributes:
                await temporal.ensure_search_attributes(found, settings.temporal_namespace)
            return found

        client = await retrying(
            f"Temporal at {address}", reach_temporal, within_s=settings.connect_timeout_s
        )
    except BaseException:
        await db.close()
        if served is not None:
            served.stop()
        raise
    security = client_security(settings.tls)
    wiring = Wiring(
        db=db,
        store=store,
        temporal=client,
        providers={
            p.name: ProviderClient(p.address, security=security, name=p.name)
            for p in settings.providers
        },
        tls=security.source if security is not None else None,
        metrics=served,
    )
    try:
        yield wiring
    finally:
        await wiring.close()


def shard_options(settings: Settings) -> ShardOptions:
    """A shard's tunables from the environment (deadlines scaled by BIGFLEET_DEADLINE_SCALE)."""
    scale = settings.deadline_scale
    return ShardOptions(
        shard_id=settings.shard_id,
        listen=settings.shard_listen,
        advertise=settings.shard_advertise,
        holder=settings.holder,
        lease_ttl_s=settings.lease_ttl_s,
        lease_margin_s=settings.lease_margin_s,
        cycle_interval_s=settings.cycle_interval_s,
        observe_interval_s=settings.observe_interval_s,
        report_interval_s=settings.report_interval_s,
        early_report_gap_s=settings.early_report_gap_s,
        reconcile_interval_s=settings.reconcile_interval_s,
        deadlines=Deadlines(**{k: v * scale for k, v in vars(Deadlines()).items()}),
        deadline_overrides={
            key: {name: secs * scale for name, secs in fields.items()}
            for key, fields in default_deadline_overrides().items()
        },
        engine=settings.engine_config(),
        shadow=settings.mode == "shadow",
        budgets=settings.budgets,
        edges=settings.shard_edges,
        edge_socket=settings.shard_edge_socket,
    )


def shard_process(
    options: ShardOptions,
    *,
    store: Store,
    temporal: Client,
    providers: Mapping[str, ProviderCalls],
    tls: KeyPairSource | None = None,
    clock: Callable[[], float] = time.time,
) -> ShardProcess:
    """One shard process over the given connections (not started)."""
    return ShardProcess(
        options, store=store, temporal=temporal, providers=providers, clock=clock, tls=tls
    )


def coordinator_process(
    *,
    store: Store,
    temporal: Client,
    providers: Mapping[str, ProviderCalls],
    interval_s: float = 30.0,
    max_share: float = 0.05,
) -> CoordinatorProcess:
    """The coordinator process over the given connections (not started)."""
    return CoordinatorProcess(
        store=store,
        temporal=temporal,
        providers=providers,
        interval_s=interval_s,
        max_share=max_share,
    )
