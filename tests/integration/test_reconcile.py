"""The reconcile loop heals drift between the provider, PostgreSQL and the engine.

Real parts: Temporal dev server, PostgreSQL, a simulated cloud over gRPC, one
shard process, one simulated operator. The drift is made the way the issue
saw it: a machine configured at the provider for a cluster, no binding in
PostgreSQL, held in flight by the engine for a workflow that ended without
settling it (a leaked machine, paid for and never reclaimed).
"""

from __future__ import annotations

import json
import time
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
from providers.model import FencingToken
from providers.server import RunningProvider, start_provider_server
from shard_engine.config import EngineConfig
from shard_engine.drift import RepairKind
from tests.integration.multishard import TINY_CLOUD, eventually
from workflows.contracts import PollPolicy

pytestmark = pytest.mark.e2e

PERIOD = 2.0
SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))


@dataclass
class World:
    env: WorkflowEnvironment
    store: Store
    provider: RunningProvider
    client: ProviderClient
    shard: ShardProcess


@pytest.fixture
async def world(database: Database) -> AsyncIterator[World]:
    env = await temporal.start_dev_server(ui=False)
    store = Store(database.engine)
    config = ProviderConfig(kind="sim-cloud", catalog_path=TINY_CLOUD, time_factor=0.02)
    provider = await start_provider_server(config, "127.0.0.1:0", provider=build_provider(config))
    client = ProviderClient(provider.address)
    # The shard owns the small machines (what the coordinator would have handed it).
    await store.acquire_lease("shard-0", "setup", ttl_seconds=0.001)
    small = [m.id for m in (await client.list()).machines if "m6i" in m.instance_type]
    await store.assign_unowned("shard-0", "simcloud", small, term=1)
    shard = ShardProcess(
        ShardOptions(
            shard_id="shard-0",
            holder="reconcile-test",
            cycle_interval_s=0.3,
            observe_interval_s=0.3,
            reconcile_interval_s=PERIOD,
            poll=PollPolicy(initial_s=0.2, max_s=1.0),
            # A leaked machine nobody wants is reclaimed at once here (ADR 0090's
            # persistence rules are tested with the engine).
            engine=EngineConfig(
                reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
            ),
        ),
        store=store,
        temporal=env.client,
        providers={"simcloud": client},
    )
    await shard.start()
    try:
        yield World(env, store, provider, client, shard)
    finally:
        await shard.stop()
        await client.close()
        await provider.stop()
        await env.shutdown()


async def _leak(world: World, cluster: str) -> str:
    """Configure an owned machine behind the shard's back, leave it unrecorded and in flight."""
    machine_id = sorted(world.shard.owned)[0]
    old = FencingToken("shard-0", 0, 1)  # an older epoch of this shard: its last words
    await world.client.create(machine_id, old)
    await eventually(
        lambda: _state(world, machine_id, provider_pb2.MACHINE_STATE_IDLE), what="created"
    )
    await world.client.configure(machine_id, cluster, b"blob", FencingToken("shard-0", 0, 2))
    await eventually(
        lambda: _state(world, machine_id, provider_pb2.MACHINE_STATE_CONFIGURED),
        what="configured",
    )
    # The workflow that did this ended without settling: the engine still holds it.
    assert world.shard.engine.claim(
        machine_id, operation="provision", target_cluster=cluster, now=time.time() - 600
    )
    return machine_id


async def _state(world: World, machine_id: str, state: int) -> bool:
    return (await world.client.get(machine_id)).state == state


async def test_a_leaked_machine_is_recorded_and_reclaimed_within_one_period(
    world: World,
) -> None:
    cluster = SimulatedCluster(
        "c-leak",
        world.shard.address,
        DemandPattern(cpu=0, memory_gib=0, requirements=(SMALL,)),  # wants nothing
        rollup_interval_s=0.5,
    )
    cluster.start()
    try:
        await eventually(lambda: cluster.acks, what="the operator's first roll-up")
        machine_id = await _leak(world, "c-leak")
        leaked_at = time.monotonic()
        (row,) = await world.store.machines_by_id([machine_id])
        assert row.cluster_id is None

        await eventually(
            lambda: _bound_to(world, machine_id, "c-leak"),
            within=PERIOD * 3 + 5,
            what="the binding to be recorded",
        )
        recorded_after = time.monotonic() - leaked_at
        await eventually(
            lambda: (
                machine_id not in world.shard.engine.in_flight()
                or world.shard.engine.in_flight()[machine_id] == ""
            ),
            within=PERIOD * 3 + 5,
            what="the stale in-flight mark to be released",
        )
        # Reclaimable: the cluster wants nothing, so Phase 3 drains it back to idle.
        await eventually(
            lambda: _state(world, machine_id, provider_pb2.MACHINE_STATE_IDLE),
            within=60,
            what="the leaked machine to be reclaimed",
        )
        reclaimed_after = time.monotonic() - leaked_at
        log = await world.store.assignment_log(machine_id)
        assert ("reconcile", 0, "c-leak") in log
        kinds = {r.kind for rnd in world.shard.parts.reconciler.rounds for r in rnd.applied}
        assert {RepairKind.BINDING_RECORDED, RepairKind.STALE_FLIGHT} <= kinds
        # The drain's outcome cleared the binding again: provider and record agree.
        await eventually(
            lambda: _bound_to(world, machine_id, None), within=30, what="binding cleared"
        )
        print(
            json.dumps(
                {
                    "figure": "reconcile-leak",
                    "period_s": PERIOD,
                    "recorded_after_s": round(recorded_after, 2),
                    "reclaim_started_within_s": round(reclaimed_after, 2),
                }
            )
        )
    finally:
        await cluster.stop()


async def _bound_to(world: World, machine_id: str, cluster: str | None) -> bool:
    (row,) = await world.store.machines_by_id([machine_id])
    return row.cluster_id == cluster


async def test_a_binding_the_provider_dropped_is_cleared_from_the_record(world: World) -> None:
    machine_id = sorted(world.shard.owned)[1]
    # PostgreSQL says the machine serves a cluster; the provider has it speculative.
    await world.store.record_operation(
        machine_id=machine_id,
        shard_id="shard-0",
        shard_epoch=world.shard.epoch,
        provider="simcloud",
        cluster_id="c-gone",
        operation="provision",
        operation_seq=world.shard.epoch * 1_000_000_000 + 1,
    )

    await eventually(
        lambda: _bound_to(world, machine_id, None),
        within=PERIOD * 3 + 5,
        what="the stale binding to be cleared",
    )
    log = await world.store.assignment_log(machine_id)
    assert log[-1][0] == "reconcile" and log[-1][2] is None


async def test_a_machine_recorded_as_the_shards_but_not_held_is_adopted(world: World) -> None:
    """A hand-over whose receiving step failed for good: the row names this shard, the
    shard never loaded the machine. One reconcile period later it holds and plans it."""
    listed = (await world.client.list()).machines
    machine_id = next(m.id for m in listed if m.id not in world.shard.owned)
    await world.store.assign_unowned("shard-0", "simcloud", [machine_id], term=1)
    assert machine_id not in world.shard.owned

    async def held() -> bool:
        return (
            machine_id in world.shard.owned and world.shard.engine.machine(machine_id) is not None
        )

    await eventually(held, within=60.0, what="the unheld machine to be adopted")
    kinds = {r.kind for rnd in world.shard.parts.reconciler.rounds for r in rnd.applied}
    assert RepairKind.ADOPTED in kinds
