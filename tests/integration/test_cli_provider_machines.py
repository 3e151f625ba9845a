"""The CLI's provider listing: every provider's machines, in name order, each named first.

``bigfleet machines`` and ``bigfleet budgets`` both read the providers'
machines through ``connections.provider_machines``; it is tested here
against two real provider servers on loopback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bigfleet.cli import connections, runtime
from bigfleet.config import ProviderEndpoint, Settings
from bigfleet.endpoints import Endpoints
from providers.client import ProviderClient
from providers.server import RunningProvider
from tests.integration.providers.provider_harness import serve


@pytest.fixture
async def providers() -> AsyncIterator[dict[str, RunningProvider]]:
    running = {"z-metal": await serve("bare-metal"), "a-cloud": await serve("sim-cloud")}
    try:
        yield running
    finally:
        for provider in running.values():
            await provider.stop()


async def _ids(provider: RunningProvider) -> list[str]:
    client = ProviderClient(provider.address)
    try:
        return [m.id for m in (await client.list_all()).machines]
    finally:
        await client.close()


async def test_machines_come_from_every_provider_in_name_order(
    providers: dict[str, RunningProvider],
) -> None:
    found = Endpoints(providers={name: p.address for name, p in providers.items()})
    runtime.REACHING.clear()

    machines = await connections.provider_machines(found, Settings())

    expected = await _ids(providers["a-cloud"]) + await _ids(providers["z-metal"])
    assert [m.id for m in machines] == expected and expected
    reached = list(runtime.REACHING)
    assert reached == [
        f"provider a-cloud at {providers['a-cloud'].address}",
        f"provider z-metal at {providers['z-metal'].address}",
    ]


async def test_without_a_running_stack_the_configured_providers_are_asked(
    providers: dict[str, RunningProvider],
) -> None:
    metal = providers["z-metal"]
    settings = Settings(providers=(ProviderEndpoint("z-metal", metal.address),))

    machines = await connections.provider_machines(Endpoints(), settings)

    assert [m.id for m in machines] == await _ids(metal)
