"""What a command connects to, found and opened in one place on top of ``bigfleet.bootstrap``.

    --database-url / --address flags
      ──► BIGFLEET_* variables ──► a running ``make dev`` stack (bigfleet.endpoints)
      ──► bootstrap.open_store (no migration) / bootstrap.temporal_client
      ──► the providers' machines (the stack's providers, else BIGFLEET_PROVIDERS)

Each helper records what it is about to reach in :data:`runtime.REACHING`,
so an unreachable peer ends the command with one line naming it. The
bootstrap module is imported when a command connects, not when the command
line loads: ``bigfleet config`` and ``bigfleet health`` stay quick.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from bigfleet.cli.runtime import REACHING, fail, settings
from bigfleet.config import ConfigError, Settings
from bigfleet.endpoints import Endpoints

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.service import TLSConfig

    from bigfleet.store import Store
    from bigfleet.v1alpha1 import provider_pb2

__all__ = [
    "endpoints",
    "open_store",
    "provider_machines",
    "temporal_address",
    "temporal_client",
    "temporal_tls",
]


def endpoints(database_url: str | None = None, address: str | None = None) -> Endpoints:
    """Flags, then BIGFLEET_* variables, then a running ``make dev`` stack (bigfleet.endpoints)."""
    return Endpoints.resolve(
        data_dir=settings().data_dir,
        environment=os.environ,
        database_url=database_url,
        temporal_address=address,
    )


@contextlib.asynccontextmanager
async def open_store(database_url: str | None = None) -> AsyncIterator[Store]:
    """The store of ``--database-url``, BIGFLEET_DATABASE_URL or the running dev stack.

    Commands read and change rows; they never migrate (``bigfleet migrate`` does).
    """
    from bigfleet import bootstrap

    url = endpoints(database_url=database_url).need_database()
    REACHING.append(f"PostgreSQL at {_without_password(url)}")
    db, store = await bootstrap.open_store(url, migrate=False)
    try:
        yield store
    finally:
        await db.close()


async def provider_machines(found: Endpoints, current: Settings) -> list[provider_pb2.Machine]:
    """Every machine every provider lists: the running stack's providers, else BIGFLEET_PROVIDERS.

    Providers are asked one at a time in name order, each over the process's
    mutual TLS when configured, and each connection is closed before the
    next is opened; the machines come back in that order. The first provider
    that cannot be reached ends the command naming it (:data:`runtime.REACHING`).
    """
    from bigfleet.identity import client_security
    from providers.client import ProviderClient

    providers = dict(found.providers) or {p.name: p.address for p in current.providers}
    security = client_security(current.tls)
    machines: list[provider_pb2.Machine] = []
    for name, provider_address in sorted(providers.items()):
        REACHING.append(f"provider {name} at {provider_address}")
        provider = ProviderClient(provider_address, security=security, name=name)
        try:
            listing = await provider.list_all()
        finally:
            await provider.close()
        machines.extend(listing.machines)
    return machines


def temporal_address(address: str | None) -> str:
    """``--address``, BIGFLEET_TEMPORAL_ADDRESS or the running dev stack's Temporal."""
    found = endpoints(address=address).need_temporal()
    REACHING.append(f"Temporal at {found}")
    return found


async def temporal_client(address: str | None, namespace: str) -> Client:
    """A Temporal client for ``namespace`` at :func:`temporal_address` (mutual TLS when asked)."""
    from bigfleet import bootstrap

    found = temporal_address(address)
    try:
        return await bootstrap.temporal_client(settings(), address=found, namespace=namespace)
    except ConfigError as err:
        fail(str(err))


def temporal_tls(current: Settings) -> TLSConfig | None:
    """The process's certificate for Temporal, when BIGFLEET_TEMPORAL_TLS asks for it."""
    from bigfleet.bootstrap import temporal_tls_of

    try:
        return temporal_tls_of(current)
    except ConfigError as err:
        fail(str(err))


def _without_password(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
