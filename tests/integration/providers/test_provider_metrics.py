"""Provider calls are measured on both ends: by method and code, with latency, and fenced ones."""

from __future__ import annotations

import contextlib

from prometheus_client import REGISTRY

from providers.client import FencingToken, ProviderClient
from providers.config import ProviderConfig
from providers.errors import ProviderError
from providers.server import start_provider_server


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_calls_are_counted_by_method_and_code_and_fenced_ones_noted() -> None:
    config = ProviderConfig(kind="sim-cloud", name="metered", time_factor=1e-5)
    running = await start_provider_server(config)
    client = ProviderClient(running.address, name="metered")
    try:
        listing = await client.list_all()
        machine = listing.machines[0].id
        before_ok = sample(
            "bigfleet_provider_requests_total", provider="metered", method="Create", code="OK"
        )
        await client.create(machine, FencingToken("s0", 5, 1))
        with contextlib.suppress(ProviderError):
            await client.create(machine, FencingToken("s0", 4, 1))  # an older epoch
    finally:
        await client.close()
        await running.stop(None)

    assert (
        sample("bigfleet_provider_requests_total", provider="metered", method="Create", code="OK")
        == before_ok + 1
    )
    assert sample("bigfleet_provider_fenced_total", provider="metered", method="Create") >= 1
    assert (
        sample(
            "bigfleet_provider_client_calls_total",
            provider="metered",
            method="Create",
            code="FAILED_PRECONDITION",
        )
        >= 1
    )
    assert (
        sample(
            "bigfleet_provider_client_call_duration_seconds_count",
            provider="metered",
            method="List",
        )
        >= 1
    )
