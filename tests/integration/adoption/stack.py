"""The real stack the adoption tests run: Temporal dev server, PostgreSQL, a simulated cloud
over gRPC, the coordinator; and a recorder of every mutating call the cloud receives."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from bigfleet import temporal
from bigfleet.coordinator import CoordinatorProcess
from bigfleet.store import Database, Store
from providers.client import ProviderClient
from providers.config import ProviderConfig
from providers.core import ProviderCore
from providers.kinds import build_provider
from providers.server import RunningProvider, start_provider_server
from tests.integration.multishard import TINY_CLOUD
from tests.ports import free_port

__all__ = ["MUTATIONS", "Mutations", "World", "world"]

MUTATIONS = ("create", "configure", "drain", "delete")
"""The provider calls that change the world (List and Get only read it)."""


@dataclass
class Mutations:
    """Every mutating call the simulated cloud accepted or refused, as (call, machine id)."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    def attach(self, core: ProviderCore) -> None:
        for name in MUTATIONS:
            original: Callable[..., Any] = getattr(core, name)

            def recorded(
                machine_id: str, *args: Any, _n: str = name, _o: Any = original, **kw: Any
            ) -> Any:
                self.calls.append((_n, machine_id))
                return _o(machine_id, *args, **kw)

            setattr(core, name, recorded)

    def of(self, name: str) -> list[str]:
        return [m for n, m in self.calls if n == name]


@dataclass
class World:
    env: WorkflowEnvironment
    db: Database
    store: Store
    provider: RunningProvider
    client: ProviderClient
    mutations: Mutations
    coordinator: CoordinatorProcess
    url: str

    @property
    def temporal_address(self) -> str:
        return self.env.client.service_client.config.target_host

    async def workflows(self) -> list[str]:
        """Every workflow id Temporal knows of, in any state."""
        return [w.id async for w in self.env.client.list_workflows()]


@pytest.fixture
async def world(empty_database_url: str) -> AsyncIterator[World]:
    env = await temporal.start_dev_server(port=free_port(), ui=False)
    db = Database.connect(empty_database_url)
    await db.migrate()
    store = Store(db.engine)
    mutations = Mutations()
    config = ProviderConfig(kind="sim-cloud", catalog_path=TINY_CLOUD, time_factor=0.05)
    core = build_provider(config)
    mutations.attach(core)
    provider = await start_provider_server(config, "127.0.0.1:0", provider=core)
    client = ProviderClient(provider.address)
    coordinator = CoordinatorProcess(
        store=store, temporal=env.client, providers={"simcloud": client}, interval_s=0.5
    )
    try:
        yield World(env, db, store, provider, client, mutations, coordinator, empty_database_url)
    finally:
        await coordinator.stop()
        await client.close()
        await provider.stop()
        await db.close()
        await env.shutdown()
