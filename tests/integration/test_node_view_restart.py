"""A machine that left its cluster while no shard process ran is announced on restart.

Real parts: Temporal dev server, PostgreSQL, a simulated cloud over gRPC, one
shard process, one simulated operator. PostgreSQL records a machine as bound
to a cluster; the provider has it unbound (it left while the shard was down).
The restarted process has never shown the machine to anyone, yet the cluster's
operator must hear that it left (ADR 0104), or its view keeps a node forever.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from temporalio.testing import WorkflowEnvironment

from bigfleet import temporal
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import Database, Store
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern, SimulatedCluster
from providers.client import ProviderClient
from providers.config import ProviderConfig
from providers.kinds import build_provider
from providers.server import RunningProvider, start_provider_server
from tests.integration.multishard import TINY_CLOUD, eventually
from tests.ports import free_port
from workflows.contracts import PollPolicy

pytestmark = pytest.mark.e2e


@dataclass
class World:
    env: WorkflowEnvironment
    store: Store
    provider: RunningProvider
    client: ProviderClient


@pytest.fixture
async def world(database: Database) -> AsyncIterator[World]:
    env = await temporal.start_dev_server(port=free_port(), ui=False)
    store = Store(database.engine)
    config = ProviderConfig(kind="sim-cloud", catalog_path=TINY_CLOUD, time_factor=0.02)
    provider = await start_provider_server(config, "127.0.0.1:0", provider=build_provider(config))
    client = ProviderClient(provider.address)
    try:
        yield World(env, store, provider, client)
    finally:
        await client.close()
        await provider.stop()
        await env.shutdown()


async def test_a_machine_that_left_while_the_shard_was_down_is_announced_on_restart(
    world: World,
) -> None:
    # The shard owns one machine; an earlier process recorded it serving c-left.
    await world.store.acquire_lease("shard-0", "earlier-process", ttl_seconds=0.001)
    machine_id = sorted(m.id for m in (await world.client.list()).machines)[0]
    await world.store.assign_unowned("shard-0", "simcloud", [machine_id], term=1)
    assert await world.store.record_operation(
        machine_id=machine_id,
        shard_id="shard-0",
        shard_epoch=1,
        provider="simcloud",
        cluster_id="c-left",
        operation="provision",
        operation_seq=1_000_000_001,
    )
    # ... but at the provider it serves nobody now (speculative: never created here).
    seen = await world.client.get(machine_id)
    assert not seen.cluster

    shard = ShardProcess(
        ShardOptions(
            shard_id="shard-0",
            holder="restarted-process",
            cycle_interval_s=0.3,
            observe_interval_s=0.3,
            poll=PollPolicy(initial_s=0.2, max_s=1.0),
        ),
        store=world.store,
        temporal=world.env.client,
        providers={"simcloud": world.client},
    )
    await shard.start()
    cluster = SimulatedCluster(
        "c-left",
        shard.address,
        DemandPattern(cpu=0, memory_gib=0),
        rollup_interval_s=0.5,
    )
    cluster.start()
    try:
        node = await eventually(
            lambda: cluster.nodes.get(machine_id),
            within=30,
            what="the operator to hear about the machine that left",
        )
        assert node.state == int(seen.state)
        assert node.state != provider_pb2.MACHINE_STATE_CONFIGURED
        # Told once, as a departure: the shard no longer counts it as the cluster's.
        assert shard.parts.nodes.shown_to(machine_id) == ""
    finally:
        await cluster.stop()
        await shard.stop()
