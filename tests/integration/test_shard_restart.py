"""A shard process killed with transitions in flight comes back with nothing lost,
nothing owned twice, and no transition started twice.

The first shard runs as a real subprocess (``bigfleet shard``) and is
SIGKILLed mid-provisioning. Its successor runs in this process so its
rebuilt inventory can be compared with PostgreSQL and the provider.

The deadlines are long on purpose: on a loaded machine a fresh Python process
takes 15-25 s of wall time just to import the shard (about 1.5 s of CPU), and
every step after it (lease, quota, Hello, cycle, workflow, Create) waits its
turn for the CPU too. They bound a hang; they do not measure speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from bigfleet import temporal
from bigfleet.coordinator import CoordinatorProcess
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import Database, Store
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern, SimulatedCluster
from providers.client import ProviderClient
from providers.config import ProviderConfig
from providers.core import ProviderCore
from providers.kinds import build_provider
from providers.server import RunningProvider, start_provider_server
from shard_engine.quantity import parse_quantity
from tests.integration.multishard import TINY_CLOUD, eventually
from tests.ports import free_port
from workflows.contracts import PollPolicy

pytestmark = pytest.mark.e2e

SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))


class CreateLog:
    """Records the operation id the provider gave every accepted Create, per machine."""

    def __init__(self) -> None:
        self.ops: dict[str, set[str]] = defaultdict(set)

    def attach(self, core: ProviderCore) -> None:
        original: Callable[..., Any] = core.create

        def create(machine_id: str, *args: Any, **kwargs: Any) -> Any:
            ack = original(machine_id, *args, **kwargs)
            self.ops[machine_id].add(ack.operation_id)
            return ack

        core.create = create  # type: ignore[method-assign]


@dataclass
class World:
    env: WorkflowEnvironment
    db: Database
    store: Store
    provider: RunningProvider
    client: ProviderClient
    creates: CreateLog
    coordinator: CoordinatorProcess
    address: str
    url: str


@pytest.fixture
async def world(empty_database_url: str) -> AsyncIterator[World]:
    env = await temporal.start_dev_server(ui=False)
    db = Database.connect(empty_database_url)
    await db.migrate()
    store = Store(db.engine)
    creates = CreateLog()
    config = ProviderConfig(kind="sim-cloud", catalog_path=TINY_CLOUD, time_factor=0.05)
    core = build_provider(config)
    creates.attach(core)
    provider = await start_provider_server(config, "127.0.0.1:0", provider=core)
    client = ProviderClient(provider.address)
    coordinator = CoordinatorProcess(
        store=store, temporal=env.client, providers={"simcloud": client}, interval_s=0.5
    )
    world = World(
        env,
        db,
        store,
        provider,
        client,
        creates,
        coordinator,
        env.client.service_client.config.target_host,
        empty_database_url,
    )
    try:
        yield world
    finally:
        await coordinator.stop()
        await client.close()
        await provider.stop()
        await db.close()
        await env.shutdown()


def _spawn_shard(world: World, listen: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        BIGFLEET_DATABASE_URL=world.url,
        BIGFLEET_TEMPORAL_ADDRESS=world.address,
        BIGFLEET_PROVIDERS=f"simcloud={world.provider.address}",
        BIGFLEET_SHARD_ID="shard-0",
        BIGFLEET_SHARD_LISTEN=listen,
        BIGFLEET_CYCLE_SECONDS="0.3",
        BIGFLEET_OBSERVE_SECONDS="0.3",
        BIGFLEET_REPORT_SECONDS="0.5",
        BIGFLEET_LEASE_TTL_SECONDS="3",
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bigfleet", "shard"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def _in_state(world: World, state: int) -> list[provider_pb2.Machine]:
    listing = await world.client.list(states=[state])
    return [m for m in listing.machines if m.cluster == "c-restart" or state != 5]


async def test_a_killed_shard_restarts_without_losing_or_duplicating_anything(
    world: World, tmp_path: Path
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    log = tmp_path / "shard-0.log"
    first = _spawn_shard(world, listen, log)
    try:
        await eventually(
            lambda: _lease_taken(world), within=180, what="the subprocess shard to take its lease"
        )
        await world.coordinator.start()
        await eventually(
            lambda: _owned(world, 12), within=120, what="the coordinator to give the shard quota"
        )
        cluster = SimulatedCluster(
            "c-restart",
            listen,
            DemandPattern(
                # Units of 0.95 cores fit two to a machine (ADR 0127 counts by units).
                cpu=8,
                memory_gib=8,
                min_unit_cpu=0.95,
                min_unit_memory_gib=1,
                requirements=(SMALL,),
            ),
            rollup_interval_s=0.5,
        )
        cluster.start()
        try:
            # Kill the shard while machines are being created for the cluster.
            await eventually(
                lambda: _in_state(world, provider_pb2.MACHINE_STATE_CREATING),
                within=180,
                what="a Create in flight",
            )
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            before = await world.store.owners()

            successor = ShardProcess(
                ShardOptions(
                    shard_id="shard-0",
                    listen=listen,
                    holder="successor",
                    lease_ttl_s=3,
                    cycle_interval_s=0.3,
                    observe_interval_s=0.3,
                    report_interval_s=0.5,
                    poll=PollPolicy(initial_s=0.2, max_s=1.0),
                ),
                store=world.store,
                temporal=world.env.client,
                providers={"simcloud": world.client},
            )
            await successor.start()  # stands by until the dead process's lease expires
            try:
                configured = await eventually(
                    lambda: _enough(world),
                    within=300,
                    what="the cluster's demand to be met after the restart",
                )
                # Nothing lost, nothing owned twice.
                after = await world.store.owners()
                assert after == before
                assert set(successor.owned) == {m for m, s in after.items() if s == "shard-0"}
                rebuilt = {m.id for m in successor.engine.machines()}
                assert rebuilt == set(successor.owned)
                # No transition started twice: one Create operation per machine.
                doubled = {m: ops for m, ops in world.creates.ops.items() if len(ops) > 1}
                assert doubled == {}
                assert successor.epoch >= 2
                assert {m.id for m in configured} <= set(successor.owned)
                # Not provisioned twice: 8 cores need exactly five m6i.large (1.93 cores each),
                # however many more cycles run.
                cycles = successor.cycles
                await eventually(
                    lambda: successor.cycles >= cycles + 3, within=120, what="three more cycles"
                )
                bound = [
                    m
                    for m in (await world.client.list()).machines
                    if m.cluster == "c-restart" or m.id in successor.engine.in_flight()
                ]
                assert len(bound) == 5, [(m.id, m.state) for m in bound]
            finally:
                await successor.stop()
        finally:
            await cluster.stop()
    except BaseException:
        # The subprocess's own account of what it did, for whoever reads the failure.
        print(log.read_text(errors="replace")[-20_000:])
        raise
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


async def _lease_taken(world: World) -> bool:
    return any(r.id == "shard-0" and r.lease_holder for r in await world.store.shards())


async def _owned(world: World, count: int) -> bool:
    return len([s for s in (await world.store.owners()).values() if s == "shard-0"]) == count


async def _enough(world: World) -> list[provider_pb2.Machine] | None:
    listing = await world.client.list(states=[provider_pb2.MACHINE_STATE_CONFIGURED])
    mine = [m for m in listing.machines if m.cluster == "c-restart"]
    cpu = sum(parse_quantity(m.allocatable.resources["cpu"]) for m in mine)
    return mine if cpu >= 8 else None
