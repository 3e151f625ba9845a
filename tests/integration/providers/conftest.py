"""Fixtures of the provider conformance suite.

Every test talks to a real gRPC server on loopback through `ProviderClient`,
once per provider kind (see provider_harness.py for the helpers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from providers.client import ProviderClient
from tests.integration.providers.provider_harness import KINDS, Harness, serve


@pytest.fixture(scope="session", params=KINDS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """The shared provider of one kind, over the wire."""
    kind: str = request.param
    running = await serve(kind)
    client = ProviderClient(running.address)
    try:
        yield Harness(kind, running, client)
    finally:
        await client.close()
        await running.stop(grace=None)
