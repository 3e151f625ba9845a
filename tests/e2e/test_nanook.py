"""End to end: a Nanook-like scheduler scales a worker pool through BigFleet's adapter.

The real stack (Temporal dev server from its wheel, PostgreSQL, the simulated
cloud over loopback gRPC, a shard process) plus ``bigfleet nanook serve``'s
adapter on free ports. The scheduler side is :mod:`nanook.client`, which
follows seed 003's retry rules, over REST and over gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bigfleet.devstack import DevStack, DevStackOptions
from bigfleet.v1alpha1 import capacity_pb2, provider_pb2
from clusters.operator import DemandPattern, SimulatedCluster
from nanook.adapter import NanookAdapter, NanookServers
from nanook.client import GrpcScalingClient, RestScalingClient, ScalingError, Scheduler
from nanook.config import parse_pool_config
from nanook.pool import ScaleConfig
from shard_engine.config import EngineConfig
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLUSTER = "nanook-e2e"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


@dataclass
class Rig:
    dev: DevStack
    adapter: NanookAdapter
    servers: NanookServers
    pool_file: Path

    @property
    def rest_url(self) -> str:
        return f"http://{self.servers.rest_address}"

    def workers(self) -> set[str]:
        """Machines the shard has bound to the Nanook cluster, configured."""
        assert self.dev.shard is not None
        return {
            m.id
            for m in self.dev.shard.engine.machines()
            if m.cluster == CLUSTER and m.state.name == "CONFIGURED"
        }


def pool_document(worker_cpu: str, *, maximum: int | None = 8) -> dict[str, Any]:
    return {
        "worker": {
            "resources": {"cpu": worker_cpu, "memory": "8Gi"},
            "requirements": [{"key": INSTANCE_TYPE, "operator": "In", "values": ["m6i.xlarge"]}],
        },
        "priority": 100_000,
        "interruption_penalty": 8,
        "reclamation_penalty": 64,
        "min": 0,
        "max": maximum,
        "rollup_interval_seconds": 0.5,
        "bootstrap": {"leader": "nanook-leader.internal:5000"},
    }


@pytest.fixture
async def rig(tmp_path: Path, empty_database_url: str) -> AsyncIterator[Rig]:
    options = DevStackOptions(
        data_dir=tmp_path,
        database_url=empty_database_url,
        temporal_port=0,
        ui=False,
        shard_listen="127.0.0.1:0",
        coordinator_interval_s=1.0,
        time_factor=0.005,
        # The scheduler decides its own scale-downs: reclaim at once (ADR 0090).
        engine=EngineConfig(
            reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
        ),
        cycle_interval_s=0.3,
        observe_interval_s=0.3,
        report_interval_s=0.5,
        clusters=(),
        catalog_path=FIXTURES / "nanook_cloud.json",
        persist=False,
    )
    dev = DevStack(options)
    await dev.start()
    try:
        assert dev.shard is not None and dev.store is not None
        # One worker per machine: the worker asks for the machine's whole allocatable CPU.
        provider = next(iter(dev.provider_clients.values()))
        listing = await provider.list(states=[provider_pb2.MACHINE_STATE_SPECULATIVE])
        worker_cpu = listing.machines[0].allocatable.resources["cpu"]
        pool_file = tmp_path / "pool.yaml"
        pool_file.write_text(yaml.safe_dump(pool_document(worker_cpu)))
        await dev.store.assign_cluster(CLUSTER)
        adapter = NanookAdapter(
            parse_pool_config(yaml.safe_load(pool_file.read_text())),
            cluster_id=CLUSTER,
            shard_address=dev.shard.address,
            config_path=pool_file,
            reload_interval_s=0.2,
        )
        adapter.start()
        servers = await NanookServers.start(
            adapter, rest_listen="127.0.0.1:0", grpc_listen="127.0.0.1:0"
        )
        try:
            await eventually(lambda: adapter.pool.connected, within=60, what="the shard session")
            # The shard's supply hints reach the adapter once it owns the cloud's 8 machines.
            await eventually(
                lambda: adapter.pool.supply() == 8, within=30, what="supply hints for 8 machines"
            )
            yield Rig(dev, adapter, servers, pool_file)
        finally:
            await servers.stop()
            await adapter.stop()
    finally:
        await dev.stop()


async def test_a_scheduler_scales_0_to_6_to_2_over_rest_keeping_its_named_workers(
    rig: Rig,
) -> None:
    scheduler = Scheduler(RestScalingClient(rig.rest_url), reread_interval_s=0.5)
    first = await scheduler.start()
    assert (first.desired, first.available, first.min) == (0, 0, 0)
    assert rig.adapter.pool.shard_honours_release

    assert await scheduler.scale(6)
    # desired reports the new target at once, before any machine exists.
    assert (await scheduler.client.scale_config()).desired == 6
    await eventually(
        lambda: scheduler.config is not None and scheduler.config.available == 6,
        within=90,
        what="six workers available (re-read by the scheduler)",
    )
    workers = rig.workers()
    assert workers == {w.machine_id for w in rig.adapter.pool.workers.values() if w.available}
    keep = sorted(workers)[:3]

    # Three queries run on three workers: going to 2 cannot keep them all, so it is refused.
    assert not await scheduler.scale(2, keep=keep)
    assert scheduler.refused[-1].status == "409"
    assert "workers_to_keep" in scheduler.refused[-1].message
    assert (await scheduler.client.scale_config()).desired == 6

    # One query finished: two workers to keep, and the scale-down is accepted.
    keep = keep[:2]
    assert await scheduler.scale(2, keep=keep)
    await eventually(lambda: len(rig.workers()) == 2, within=90, what="the pool down to two")
    assert rig.workers() == set(keep)
    await eventually(
        lambda: scheduler.config is not None and scheduler.config.available == 2,
        within=60,
        what="available down to 2",
    )
    await scheduler.stop()


async def test_bad_rest_requests_get_the_seeds_answers_and_change_nothing(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:

        async def post(body: str) -> tuple[int, dict[str, Any]]:
            async with http.post(
                rig.rest_url + "/scale_to",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as resp:
                return resp.status, ({} if resp.status == 204 else await resp.json())

        cases = {
            '{"amount": -1}': "amount",
            '{"amount": 2.5}': "amount",
            '{"amount": "3"}': "amount",
            '{"amount": 9}': "amount",  # above max (8)
            '{"amount": 4294967296}': "amount",
            '{"amount": 1, "workers": []}': "workers",
            '{"workers_to_keep": []}': "amount",
            '{"amount": 1, "workers_to_keep": "a"}': "workers_to_keep",
            '{"amount": 1, "workers_to_keep": [1]}': "workers_to_keep[0]",
            "[1, 2]": "(body)",
            "{not json": "(body)",
            "": "(body)",
        }
        for body, field in cases.items():
            status, error = await post(body)
            assert status == 400, body
            assert error["field"] == field and error["error"], (body, error)
        async with http.get(rig.rest_url + "/scale_config") as resp:
            assert resp.status == 200
            assert await resp.json() == {"desired": 0, "available": 0, "min": 0, "max": 8}
        async with http.get(rig.rest_url + "/no_such_thing") as resp:
            assert resp.status == 404 and "error" in await resp.json()
        async with http.get(rig.rest_url + "/openapi.json") as resp:
            doc = await resp.json()
            assert set(doc["components"]["schemas"]) == {"ScaleConfigResponse", "ScaleToBody"}

        # A lost shard session: ScaleTo answers 503 (retryable), the config still answers.
        await rig.adapter.session.stop()
        status, error = await post('{"amount": 1}')
        assert status == 503 and error["field"] == "session"
        async with http.get(rig.rest_url + "/scale_config") as resp:
            assert resp.status == 200
        rig.adapter.session.start()
        await eventually(lambda: rig.adapter.pool.connected, within=60, what="the session back")
        status, _ = await post('{"amount": 1, "workers_to_keep": null, "workers_to_delete": null}')
        assert status == 204


async def test_over_grpc_a_higher_priority_cluster_preempts_the_pool_and_the_stream_shows_it(
    rig: Rig,
) -> None:
    client = GrpcScalingClient(rig.servers.grpc_address)
    seen: list[ScaleConfig] = []

    async def follow() -> None:
        async for state in client.watch():
            seen.append(state)

    follower = asyncio.create_task(follow())
    try:
        await eventually(lambda: seen, within=60, what="the first ScaleConfig message")
        assert (seen[0].desired, seen[0].min) == (0, 0)

        await client.scale_to(6)
        await eventually(
            lambda: seen[-1].available == 6, within=90, what="six workers in the stream"
        )
        assert seen[-1].desired == 6
        # The shard's supply hints bound max: 6 live workers + 2 free machines = 8.
        await eventually(lambda: seen[-1].max == 8, within=60, what="max from the supply hints")

        # An administrator lowers the pool's max: the stream shows it without a restart.
        document = yaml.safe_load(rig.pool_file.read_text())
        document["max"] = 7
        rig.pool_file.write_text(yaml.safe_dump(document))
        await eventually(lambda: seen[-1].max == 7, within=60, what="max 7 streamed")
        with pytest.raises(ScalingError) as above:
            await client.scale_to(8)
        assert above.value.status == "INVALID_ARGUMENT"

        # A cluster at a much higher priority wants four machines of the same shape:
        # two are free, two are preempted from the pool (reclaim instruction, acked).
        assert rig.dev.shard is not None and rig.dev.store is not None
        await rig.dev.store.assign_cluster("urgent")
        cpu = float(rig.adapter.pool.config.worker_amounts["cpu"])
        urgent = SimulatedCluster(
            "urgent",
            rig.dev.shard.address,
            DemandPattern(
                cpu=4 * cpu,
                memory_gib=8,
                priority=900_000,
                min_unit_cpu=cpu,
                min_unit_memory_gib=1,
                requirements=(
                    (
                        INSTANCE_TYPE,
                        capacity_pb2.NodeSelectorRequirement.OPERATOR_IN,
                        ("m6i.xlarge",),
                    ),
                ),
            ),
            rollup_interval_s=0.5,
        )
        urgent.start()
        try:
            await eventually(
                lambda: seen[-1].available == 4, within=120, what="the pool preempted down to 4"
            )
            assert seen[-1].desired == 6  # the target stands; BigFleet could not keep it
            assert rig.adapter.pool.reclaimed_total >= 2
            await eventually(
                lambda: seen[-1].max == 4, within=60, what=f"max down to 4 ({seen[-1]})"
            )
            # Meanwhile nothing higher is accepted than the pool can get.
            with pytest.raises(ScalingError):
                await client.scale_to(6 + 1)
        finally:
            await urgent.stop()

        # Lost session: ScaleTo is UNAVAILABLE, which the scheduler retries until it is back.
        await rig.adapter.session.stop()

        attempts_before = client.attempts

        async def come_back() -> None:
            # Back once the first request was refused (a retry is sent only after a
            # refusal), whenever that is on a loaded machine.
            await eventually(
                lambda: client.attempts >= attempts_before + 2, within=60, what="a retry"
            )
            rig.adapter.session.start()

        back = asyncio.create_task(come_back())
        await client.scale_to(4)
        await back
        assert client.attempts - attempts_before >= 2
        await eventually(lambda: seen[-1].desired == 4, within=60, what="desired 4 streamed")
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await client.close()
