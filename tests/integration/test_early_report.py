"""A shard tells the coordinator of a new shortfall at once, not at its report interval.

Real parts: Temporal dev server, PostgreSQL, a simulated cloud over gRPC,
one shard process, simulated operators. The shard owns no machine, so
every need is a shortfall only the fleet could answer. Its report interval
is ten minutes; the coordinator's workflow runs with no worker, so each
report the shard sends stays in its history as a ``report`` signal, where
the test counts them (ADR 0184).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from bigfleet import temporal
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import Database, Store
from clusters.operator import DemandPattern, SimulatedCluster
from providers.client import ProviderClient
from providers.config import ProviderConfig
from providers.kinds import build_provider
from providers.server import RunningProvider, start_provider_server
from tests.integration.multishard import TINY_CLOUD, eventually
from workflows import coordinator as co
from workflows import coordinator_contracts as cc

pytestmark = pytest.mark.e2e

SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))
WANTS = DemandPattern(cpu=2, memory_gib=4, requirements=(SMALL,))


@dataclass
class World:
    env: WorkflowEnvironment
    provider: RunningProvider
    client: ProviderClient
    shard: ShardProcess
    coordinator: WorkflowHandle[co.CoordinatorWorkflow, None]


@pytest.fixture
async def world(database: Database) -> AsyncIterator[World]:
    env = await temporal.start_dev_server(ui=False)
    config = ProviderConfig(kind="sim-cloud", catalog_path=TINY_CLOUD, time_factor=0.02)
    provider = await start_provider_server(config, "127.0.0.1:0", provider=build_provider(config))
    client = ProviderClient(provider.address)
    # Nobody polls the coordinator's queue: the signals wait in its history.
    coordinator = await env.client.start_workflow(
        co.CoordinatorWorkflow.run,
        cc.CoordinatorInput(term=1, interval_s=30.0, max_share=0.05),
        id=co.COORDINATOR_ID,
        task_queue=co.COORDINATOR_QUEUE,
    )
    shard = ShardProcess(
        ShardOptions(
            shard_id="shard-0",
            holder="early-report-test",
            cycle_interval_s=0.3,
            observe_interval_s=0.3,
            report_interval_s=600.0,
            early_report_gap_s=1.0,
        ),
        store=Store(database.engine),
        temporal=env.client,
        providers={"simcloud": client},
    )
    await shard.start()
    try:
        yield World(env, provider, client, shard, coordinator)
    finally:
        await shard.stop()
        await client.close()
        await provider.stop()
        await env.shutdown()


async def _reports(world: World) -> int:
    history = await world.coordinator.fetch_history()
    return sum(
        1
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and event.workflow_execution_signaled_event_attributes.signal_name == "report"
    )


async def test_a_new_shortfall_is_reported_at_once_and_a_known_one_waits_its_interval(
    world: World,
) -> None:
    first = SimulatedCluster("c-first", world.shard.address, WANTS, rollup_interval_s=0.5)
    second = SimulatedCluster("c-second", world.shard.address, WANTS, rollup_interval_s=0.5)
    first.start()
    news = world.shard.parts.reporter.news
    try:
        # The shard reports once at start (it had not reported yet) and, the roll-up
        # landing before or after that, the shortfall at once in any case.
        await eventually(
            lambda: {c for c, _ in news.carried} == {"c-first"}, within=30, what="a report"
        )
        told = await _reports(world)
        assert 1 <= told <= 2
        # The same shortfall, cycle after cycle (0.3 s), for three gaps: not news.
        await asyncio.sleep(3.0)
        assert await _reports(world) == told
        second.start()
        await eventually(
            lambda: {c for c, _ in news.carried} == {"c-first", "c-second"},
            within=30,
            what="a report of the second",
        )
        assert await _reports(world) == told + 1
    finally:
        await first.stop()
        await second.stop()
