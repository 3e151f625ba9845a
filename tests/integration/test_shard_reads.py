"""A shard reads a batch of machines from a real provider over gRPC, several at once.

What a transfer adopts or hands over is read by ``ProviderObserver.read_many``:
in the order given, at most ``READS_IN_FLIGHT`` Gets in flight, and a machine
the provider does not know (or a provider the shard was not given) reads as
None without failing the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from bigfleet.shard.observer import READS_IN_FLIGHT, ProviderObserver
from bigfleet.shard.state import ShardState
from bigfleet.v1alpha1 import provider_pb2
from providers.client import ProviderClient
from providers.config import ProviderConfig
from providers.server import RunningProvider, start_provider_server
from shard_engine.engine import EngineConfig, ShardEngine
from tests.integration.multishard import TINY_CLOUD
from workflows.contracts import MachineTarget


class Counting(ProviderClient):
    """The real client, counting the Gets it has in flight (each a little way off)."""

    in_flight = 0
    most = 0
    ended = 0

    async def get(self, machine_id: str) -> provider_pb2.Machine:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.005)
            if machine_id == "breaks-the-client":
                raise RuntimeError("not a provider's error: a fault of the client itself")
            return await super().get(machine_id)
        finally:
            self.in_flight -= 1
            self.ended += 1


@pytest.fixture
async def provider() -> AsyncIterator[RunningProvider]:
    config = ProviderConfig(kind="sim-cloud", catalog_path=TINY_CLOUD, time_factor=0.05)
    running = await start_provider_server(config, "127.0.0.1:0")
    try:
        yield running
    finally:
        await running.stop(grace=None)


@dataclass
class Reader:
    """The counting client over the provider, the shard state and the observer reading it."""

    client: Counting
    ids: list[str]
    state: ShardState[ShardEngine]
    observer: ProviderObserver


@pytest.fixture
async def reader(provider: RunningProvider) -> AsyncIterator[Reader]:
    client = Counting(provider.address)
    try:
        ids = [m.id for m in (await client.list()).machines]
        state = ShardState(ShardEngine(EngineConfig()), clock=lambda: 0.0)
        yield Reader(client, ids, state, ProviderObserver({"simcloud": client}, state=state))
    finally:
        await client.close()


async def test_a_batch_is_read_in_order_with_a_bounded_number_of_gets_in_flight(
    reader: Reader,
) -> None:
    ids, client = reader.ids, reader.client
    assert len(ids) == 12  # the tiny cloud: four GPU slots and eight small ones
    # Every machine three times, an unknown one, and one of a provider not given.
    targets = [MachineTarget(m, "simcloud") for m in ids * 3]
    targets.insert(5, MachineTarget("no-such-machine", "simcloud"))
    targets.insert(20, MachineTarget(ids[0], "elsewhere"))

    sightings = await reader.observer.read_many(targets)

    assert len(sightings) == len(targets) == 38
    read = [s.record.id if s is not None else None for s in sightings]
    expected = [t.machine_id if t.provider == "simcloud" else None for t in targets]
    expected[5] = None
    assert read == expected
    assert 1 < client.most <= READS_IN_FLIGHT
    assert client.in_flight == 0
    # Read, not folded in: the shard's state holds none of them.
    assert list(reader.state.machines()) == [] and not reader.state.owned
    assert await reader.observer.read_many([]) == []


async def test_an_error_that_is_not_the_providers_is_raised_after_every_read_has_ended(
    reader: Reader,
) -> None:
    targets = [MachineTarget(m, "simcloud") for m in reader.ids * 3]
    targets.insert(3, MachineTarget("breaks-the-client", "simcloud"))
    with pytest.raises(RuntimeError, match="a fault of the client itself"):
        await reader.observer.read_many(targets)
    # Raised once every Get had ended: none is left running behind the error.
    assert reader.client.in_flight == 0 and reader.client.ended == len(targets)
