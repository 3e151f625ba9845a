"""The Nanook adapter against a real shard Session server (real gRPC, real engine).

The shard side is the production ``ShardServicer`` over a ``SessionHub`` and a
real ``ShardEngine``; the adapter runs in process or as ``bigfleet nanook
serve``. What the shard does with the roll-ups (provisioning) is the e2e
tier's business; here: what travels on the wire, and how each transport
answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml

from bigfleet.shard.capacity_hints import CapacityHints
from bigfleet.shard.sessions import SessionHub, ShardServicer
from bigfleet.v1alpha1 import provider_pb2, shard_pb2, shard_pb2_grpc
from nanook.adapter import NanookAdapter, NanookServers
from nanook.client import GrpcScalingClient, ScalingError
from nanook.config import parse_pool_config
from shard_engine.engine import ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState, Rollup
from tests.ports import free_port
from tests.rollups import apply
from tests.waiting import eventually

CLUSTER = "nanook-it"
POOL: dict[str, Any] = {
    "worker": {
        "resources": {"cpu": "4", "memory": "16Gi"},
        "requirements": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m.xl"]}
        ],
    },
    "priority": 5000,
    "max": 10,
    "rollup_interval_seconds": 0.2,
}


@dataclass
class Sink:
    engine: ShardEngine = field(default_factory=ShardEngine)
    rollups: list[Rollup] = field(default_factory=list)

    async def admit_cluster(self, cluster_id: str) -> None:
        return None

    def apply_rollup(self, rollup: Rollup) -> str:
        self.rollups.append(rollup)
        outcome = apply(self.engine, rollup, now=time.time())
        return "rollup" if outcome.status == "applied" else f"rollup-{outcome.status}"

    def ack_fields(self) -> tuple[int, int]:
        return 1, 1


@dataclass
class Shard:
    address: str
    hub: SessionHub
    sink: Sink
    server: grpc.aio.Server


@pytest.fixture
async def shard() -> AsyncIterator[Shard]:
    hub, sink = SessionHub(), Sink()
    server = grpc.aio.server()
    shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(hub, sink), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Shard(f"127.0.0.1:{port}", hub, sink, server)
    finally:
        await server.stop(None)


@pytest.fixture
async def served(shard: Shard) -> AsyncIterator[tuple[NanookAdapter, NanookServers]]:
    adapter = NanookAdapter(
        parse_pool_config(POOL), cluster_id=CLUSTER, shard_address=shard.address
    )
    adapter.start()
    servers = await NanookServers.start(
        adapter, rest_listen="127.0.0.1:0", grpc_listen="127.0.0.1:0"
    )
    try:
        await eventually(lambda: adapter.pool.connected)
        yield adapter, servers
    finally:
        await servers.stop()
        await adapter.stop()


def node_update(machine_id: str, state: int) -> shard_pb2.ShardMessage:
    return shard_pb2.ShardMessage(
        node_state_update=shard_pb2.NodeStateUpdate(
            supersedes_key=f"node:{machine_id}",
            machine_id=machine_id,
            cluster_id=CLUSTER,
            state=state,  # type: ignore[arg-type]
            node_name=machine_id,
        )
    )


async def test_a_scale_to_becomes_a_rollup_of_amount_workers_with_an_empty_release_list(
    shard: Shard, served: tuple[NanookAdapter, NanookServers]
) -> None:
    adapter, _ = served
    client = GrpcScalingClient(served[1].grpc_address)
    try:
        await client.scale_to(3)
    finally:
        await client.close()
    rollup = await eventually(
        lambda: next((r for r in reversed(shard.sink.rollups) if r.needs), None)
    )
    (need,) = rollup.needs
    assert need.aggregate == {"cpu": 12.0, "memory": 48 * 2**30}
    assert need.min_unit == {"cpu": 4.0, "memory": 16 * 2**30}
    assert need.priority == 5000
    assert rollup.release == frozenset()  # present and empty: nothing may be reclaimed
    assert adapter.pool.shard_honours_release


async def test_bootstrap_requests_get_the_pools_blob_and_reclaims_are_acknowledged(
    shard: Shard, served: tuple[NanookAdapter, NanookServers]
) -> None:
    adapter, _ = served
    blob = await shard.hub.request_bootstrap(CLUSTER, [], wait_seconds=5)
    assert b"polars-nanook-compute" in blob.user_data and blob.ttl_seconds == 900

    for machine_id in ("m-1", "m-2", "m-3"):
        shard.hub.send(CLUSTER, node_update(machine_id, provider_pb2.MACHINE_STATE_CONFIGURED))
    await eventually(lambda: adapter.pool.available() == 3)
    shard.hub.send(
        CLUSTER,
        shard_pb2.ShardMessage(
            reclaim_instruction=shard_pb2.ReclaimInstruction(
                instruction_id="preempt-1", nodes=["m-2"], grace_period_seconds=10
            )
        ),
    )
    await eventually(lambda: adapter.pool.available() == 2)
    assert adapter.scale_config().available == 2


async def test_the_shards_capacity_hints_bound_max_and_the_stream_shows_each_change(
    shard: Shard, served: tuple[NanookAdapter, NanookServers]
) -> None:
    _, servers = served
    client = GrpcScalingClient(servers.grpc_address)
    seen: list[int | None] = []

    async def follow() -> None:
        async for state in client.watch():
            seen.append(state.max)

    follower = asyncio.create_task(follow())
    engine = ShardEngine()
    for i in range(4):
        engine.upsert_machine(
            MachineRecord(
                id=f"spec-{i}",
                state=MachineState.SPECULATIVE,
                provider="sim",
                instance_type="m.xl",
                zone="z",
                capacity_type=CapacityType.ON_DEMAND,
                price_per_hour=0.2,
                interruption_probability=0.0,
                allocatable={"cpu": 4.0, "memory": 16 * 2**30},
                labels={"node.kubernetes.io/instance-type": "m.xl"},
            ),
            now=0,
        )
    hints = CapacityHints(shard.hub, engine)
    try:
        await eventually(lambda: seen == [10])
        assert hints.publish() == 1
        await eventually(lambda: seen[-1] == 4)
        assert hints.publish() == 0  # unchanged: nothing sent
        engine.remove_machine("spec-0")
        assert hints.publish() == 1
        await eventually(lambda: seen[-1] == 3)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await client.close()


async def test_without_a_shard_session_scale_to_is_unavailable_and_the_config_still_answers(
    tmp_path: Path,
) -> None:
    adapter = NanookAdapter(
        parse_pool_config(POOL), cluster_id=CLUSTER, shard_address="127.0.0.1:1"
    )
    adapter.start()
    servers = await NanookServers.start(
        adapter, rest_listen="127.0.0.1:0", grpc_listen="127.0.0.1:0"
    )
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    client = GrpcScalingClient(servers.grpc_address, sleep=record)
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://{servers.rest_address}"
            async with http.post(url + "/scale_to", json={"amount": 1}) as resp:
                assert resp.status == 503 and resp.headers["Retry-After"] == "1"
                assert (await resp.json())["field"] == "session"
            async with http.get(url + "/scale_config") as resp:
                assert resp.status == 200
                assert await resp.json() == {"desired": 0, "available": 0, "min": 0, "max": 10}
        with pytest.raises(ScalingError) as caught:
            await client.scale_to(1)
        assert caught.value.status == "UNAVAILABLE" and caught.value.attempts == 5
        assert waits == [1.0, 2.0, 3.0, 4.0]

        # Malformed bytes are INVALID_ARGUMENT, not the framework's INTERNAL.
        async with grpc.aio.insecure_channel(servers.grpc_address) as channel:
            raw = channel.unary_unary(
                "/compute_scaling.client.v1.ScalingService/ScaleTo",
                request_serializer=None,
                response_deserializer=None,
            )
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await raw(b"\xff\xff\xff", timeout=5)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        state = await client.scale_config()
        assert (state.desired, state.max) == (0, 10)
    finally:
        await client.close()
        await servers.stop()
        await adapter.stop()


async def test_bigfleet_nanook_serve_runs_the_adapter_until_terminated(
    shard: Shard, tmp_path: Path
) -> None:
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(POOL))
    rest_port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bigfleet",
        "nanook",
        "serve",
        "--config",
        str(pool_file),
        "--cluster-id",
        CLUSTER,
        "--shard",
        shard.address,
        "--rest-listen",
        f"127.0.0.1:{rest_port}",
        "--grpc-listen",
        "127.0.0.1:0",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def accepted() -> bool:
                try:
                    async with http.post(
                        f"http://127.0.0.1:{rest_port}/scale_to", json={"amount": 2}
                    ) as resp:
                        return resp.status == 204
                except aiohttp.ClientConnectionError:
                    return False

            await eventually(accepted, within=30)
        await eventually(lambda: any(r.needs for r in shard.sink.rollups))
        assert shard.hub.clusters() == [CLUSTER]
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()[-2000:]
