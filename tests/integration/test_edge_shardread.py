"""ShardRead (why-not) on an edge's port: the engine's answer, as a shard without edges gives it.

A real :class:`ShardProcess` with ``edges=1`` starts a real edge process
(``python -m bigfleet.edge``) that serves ``Shard/Session`` and
``ShardRead/InspectNeeds`` on loopback gRPC (ADR 0147). Clusters send
roll-ups through the edge, a cycle runs, and the edge's answers are
compared, message for message, with those of the Session port a shard
without edges serves (``IngestServer`` asking the same engine on its loop).
An edge whose engine is away, in this process, refuses the question
UNAVAILABLE, and under mutual TLS checks the caller first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bigfleet.edge.process import EdgeOptions, EdgeProcess
from bigfleet.identity import Identity, Role, channel
from bigfleet.shard.process import ShardProcess
from bigfleet.shard.server import IngestOptions, IngestServer
from bigfleet.shard.sessions import SessionHub
from bigfleet.shard.shardread import SHARD_READ_SERVICE
from bigfleet.v1alpha1 import (
    capacity_pb2,
    shard_pb2,
    shard_pb2_grpc,
    shardread_pb2,
    shardread_pb2_grpc,
)
from shard_engine.model import Rollup
from tests.integration.pki import Pki
from tests.shard_stack import shard_process
from tests.waiting import eventually

SHARD = "shard-edge-read"

Frames = list[shardread_pb2.InspectNeedsResponse]


class IdleSink:
    """The sink of a Session port that only answers why-not here (no roll-ups reach it)."""

    async def admit_cluster(self, cluster_id: str) -> None:
        return None

    def apply_rollup(self, rollup: Rollup) -> str:
        raise AssertionError("no roll-up is sent to this port")

    def ack_fields(self) -> tuple[int, int]:
        return 0, 0


@dataclass
class Ports:
    shard: ShardProcess
    edge: grpc.aio.Channel  # the shard's Session port: its edge process
    alone: grpc.aio.Channel  # a Session port without edges, over the same engine


@pytest.fixture
async def ports(empty_database_url: str) -> AsyncIterator[Ports]:
    # Cycles run when the test says (run_cycle), so both ports describe the same one.
    async with shard_process(
        empty_database_url, SHARD, edges=1, cycle_interval_s=3600.0
    ) as process:
        engine = process.engine
        alone = IngestServer(
            SessionHub(),
            IdleSink(),
            IngestOptions(listen="127.0.0.1:0"),
            inspect=lambda cluster_id, limit: engine.inspect_needs(cluster_id, limit=limit),
        )
        try:
            address = await alone.start()
            async with (
                grpc.aio.insecure_channel(process.address) as edge,
                grpc.aio.insecure_channel(address) as here,
            ):
                yield Ports(process, edge, here)
        finally:
            await alone.stop()


def _rollup(cluster: str, ts: int, cpu: str, priority: int) -> shard_pb2.OperatorMessage:
    return shard_pb2.OperatorMessage(
        rollup=capacity_pb2.ClusterCapacityNeeds(
            cluster_id=cluster,
            timestamp_unix_nanos=ts,
            needs=[capacity_pb2.CapacityNeed(aggregate_resources={"cpu": cpu}, priority=priority)],
        )
    )


async def _ask(chan: grpc.aio.Channel, cluster_id: str = "", limit: int = 0) -> Frames:
    stub = shardread_pb2_grpc.ShardReadStub(chan)
    request = shardread_pb2.InspectNeedsRequest(cluster_id=cluster_id, limit=limit)
    return [frame async for frame in stub.InspectNeeds(request)]


async def _refusal(chan: grpc.aio.Channel, limit: int = 0) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _ask(chan, limit=limit)
    return caught.value.code(), caught.value.details() or ""


async def test_the_edge_answers_why_not_as_a_shard_without_edges(ports: Ports) -> None:
    shard = ports.shard
    health = health_pb2_grpc.HealthStub(ports.edge)
    served = await health.Check(health_pb2.HealthCheckRequest(service=SHARD_READ_SERVICE))
    assert served.status == health_pb2.HealthCheckResponse.SERVING
    session = shard_pb2_grpc.ShardStub(ports.edge)
    streams: list[Any] = []
    for cluster, cpu, priority in (("edge-a", "4", 10), ("edge-b", "2", 1_000)):
        stream: Any = session.Session()  # type: ignore[call-arg]
        await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id=cluster)))
        assert (await stream.read()).ack.echo == "hello"
        await stream.write(_rollup(cluster, 1, cpu, priority))
        assert (await stream.read()).ack.echo == "rollup"
        streams.append(stream)
    await eventually(
        lambda: all(shard.engine.needs_of(c) for c in ("edge-a", "edge-b")),
        within=30,
        what="both roll-ups applied by the engine",
    )
    await shard.run_cycle()

    through_edge = await _ask(ports.edge)
    assert [f.WhichOneof("frame") for f in through_edge] == ["header", "need", "need"]
    assert through_edge[0].header.cycle >= 1 and through_edge[0].header.total_needs == 2
    assert [f.need.cluster_id for f in through_edge[1:]] == ["edge-b", "edge-a"]
    assert not through_edge[1].need.satisfied and through_edge[1].need.unmet_detail
    assert through_edge == await _ask(ports.alone)

    # A cluster filter and a limit, asked of both.
    for cluster_id, limit in (("edge-a", 0), ("", 1), ("nobody", 0)):
        expected = await _ask(ports.alone, cluster_id, limit)
        assert await _ask(ports.edge, cluster_id, limit) == expected, (cluster_id, limit)

    # An invalid request is refused before the engine is asked, in the same words.
    refused = await _refusal(ports.edge, limit=-1)
    assert refused[0] == grpc.StatusCode.INVALID_ARGUMENT and "limit" in refused[1]
    assert refused == await _refusal(ports.alone, limit=-1)

    for stream in streams:
        await stream.done_writing()


@contextlib.asynccontextmanager
async def _edge_without_engine(tmp_path: Path, pki: Pki | None) -> AsyncIterator[str]:
    """A real edge (in this process) whose engine never came: its Session port's address."""
    options = EdgeOptions(socket=str(tmp_path / "nobody.sock"), listen="127.0.0.1:0")
    tls = pki.source(Identity(Role.SHARD, "s0")) if pki is not None else None
    edge = EdgeProcess(options, tls=tls)
    running = asyncio.create_task(edge.run())
    try:
        yield await eventually(lambda: edge.server.address, within=30, what="the edge serving")
    finally:
        edge.link.stop()
        await running


async def test_an_edge_whose_engine_is_away_refuses_why_not_unavailable(tmp_path: Path) -> None:
    async with (
        _edge_without_engine(tmp_path, None) as address,
        grpc.aio.insecure_channel(address) as chan,
    ):
        code, details = await _refusal(chan)
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "engine restarting" in details
        # The request is judged first, as in a shard without edges.
        assert (await _refusal(chan, limit=-1))[0] == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("who", "code"),
    [
        (Identity(Role.READONLY), grpc.StatusCode.UNAVAILABLE),  # let through, to the engine
        (Identity(Role.ADMIN), grpc.StatusCode.UNAVAILABLE),
        (Identity(Role.CLUSTER, "ml"), grpc.StatusCode.PERMISSION_DENIED),
        (Identity(Role.SHARD, "s1"), grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_under_mutual_tls_an_edge_lets_only_readonly_and_admin_ask(
    tmp_path: Path, who: Identity, code: grpc.StatusCode
) -> None:
    pki = Pki(tmp_path)
    async with _edge_without_engine(tmp_path, pki) as address:
        client = channel(address, pki.client(who))
        try:
            assert (await _refusal(client))[0] == code
        finally:
            await client.close(None)
