"""The Session port in an edge process: acked there, applied in the engine, answered back.

A real :class:`ShardProcess` (PostgreSQL, a Temporal dev server) with
``edges=1`` starts a real edge process (``python -m bigfleet.edge``) that
serves ``Shard/Session`` on loopback gRPC and relays to the engine over
its Unix-domain socket (ADR 0147). An operator's roll-ups are acknowledged
by the edge and reach the engine's needs; node updates and a bootstrap
request travel the way back on the same session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from bigfleet.shard.process import ShardProcess
from bigfleet.v1alpha1 import capacity_pb2, provider_pb2, shard_pb2, shard_pb2_grpc
from tests.shard_stack import shard_process
from tests.waiting import eventually

SHARD = "shard-edge"


def _rollup(cluster: str, ts: int, cpu: str) -> shard_pb2.OperatorMessage:
    return shard_pb2.OperatorMessage(
        rollup=capacity_pb2.ClusterCapacityNeeds(
            cluster_id=cluster,
            timestamp_unix_nanos=ts,
            needs=[capacity_pb2.CapacityNeed(aggregate_resources={"cpu": cpu}, priority=10)],
        )
    )


def node_update(cluster: str, machine: str) -> shard_pb2.ShardMessage:
    return shard_pb2.ShardMessage(
        node_state_update=shard_pb2.NodeStateUpdate(
            supersedes_key=f"node:{machine}",
            machine_id=machine,
            cluster_id=cluster,
            state=provider_pb2.MACHINE_STATE_CONFIGURED,
            node_name=machine,
        )
    )


@pytest.fixture
async def shard(empty_database_url: str) -> AsyncIterator[ShardProcess]:
    async with shard_process(empty_database_url, SHARD, edges=1, cycle_interval_s=0.5) as process:
        yield process


async def test_rollups_acked_by_the_edge_reach_the_engine_and_updates_come_back(
    shard: ShardProcess,
) -> None:
    link = shard.edge_link
    assert link is not None and len(link.edges()) == 1, "the edge process joined"
    assert shard.address == link.edges()[0].address
    async with grpc.aio.insecure_channel(shard.address) as channel:
        stream: Any = shard_pb2_grpc.ShardStub(channel).Session()  # type: ignore[call-arg]
        await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id="edge-a")))
        hello = (await stream.read()).ack
        assert hello.echo == "hello" and "release" in hello.extensions
        assert hello.shard_epoch == shard.epoch, "the edge stamps the engine's lease epoch"

        await stream.write(_rollup("edge-a", 1, "4"))
        assert (await stream.read()).ack.echo == "rollup"
        await eventually(
            lambda: [n.aggregate for n in shard.engine.needs_of("edge-a")] == [{"cpu": 4.0}],
            within=30,
            what="the edge's roll-up applied by the engine",
        )
        # A re-send of the same needs travels without them; a change with them.
        await stream.write(_rollup("edge-a", 2, "4"))
        assert (await stream.read()).ack.echo == "rollup"
        await stream.write(_rollup("edge-a", 3, "8"))
        assert (await stream.read()).ack.echo == "rollup"
        await eventually(
            lambda: [n.aggregate for n in shard.engine.needs_of("edge-a")] == [{"cpu": 8.0}],
            within=30,
            what="the changed roll-up applied",
        )
        assert link.received == 3

        # The way back: a node update the engine sends reaches the operator's stream.
        await eventually(lambda: shard.hub.clusters() == ["edge-a"], within=30, what="opened")
        assert shard.hub.send("edge-a", node_update("edge-a", "m-1"), key="node:m-1")
        update = await stream.read()
        assert update.node_state_update.machine_id == "m-1"

        # A bootstrap request goes out through the edge and its answer comes back.
        asked = asyncio.create_task(shard.hub.request_bootstrap("edge-a", [], wait_seconds=20))
        request = (await stream.read()).bootstrap_request
        assert request.cluster_id == "edge-a"
        await stream.write(
            shard_pb2.OperatorMessage(
                bootstrap_response=shard_pb2.BootstrapBlobResponse(
                    request_id=request.request_id, user_data=b"join", ttl_seconds=60
                )
            )
        )
        blob = await asked
        assert (blob.user_data, blob.ttl_seconds) == (b"join", 60)
        await stream.done_writing()
    await eventually(lambda: shard.hub.clusters() == [], within=30, what="the close relayed")


async def test_an_edge_reports_its_loop_and_collector_into_the_shards_metrics(
    shard: ShardProcess,
) -> None:
    from prometheus_client import REGISTRY

    link = shard.edge_link
    assert link is not None

    def sample(name: str, **labels: str) -> float | None:
        value: float | None = REGISTRY.get_sample_value(name, {"shard": SHARD, **labels})
        return value

    # The edge collects once a second after it starts (and freezes what survives), so its
    # collector total is above zero within a few reports.
    await eventually(
        lambda: 0 in link.loads and link.loads[0].gc_total_s > 0,
        within=30,
        what="the edge's report of its collector's pauses",
    )
    load = link.loads[0]
    assert 0.0 <= load.busy <= 1.0
    assert (sample("bigfleet_gc_pause_seconds_total", process="edge-0") or 0.0) >= load.gc_total_s
    assert sample("bigfleet_session_loop_lag_seconds", loop="edge-0") is not None
    assert sample("bigfleet_session_loop_busy_ratio", loop="edge-0") is not None
    assert sample("bigfleet_gc_pause_max_seconds", process="edge-0") is not None
    # The engine's own collector, reported after every cycle.
    await eventually(
        lambda: sample("bigfleet_gc_pause_max_seconds", process="engine") is not None,
        within=30,
        what="the engine's collector in its metrics",
    )


async def test_an_edge_that_dies_is_started_again_and_serves_the_same_port(
    shard: ShardProcess,
) -> None:
    import os
    import signal

    link = shard.edge_link
    assert link is not None
    [first] = link.pids()
    os.kill(first, signal.SIGKILL)  # a crash: no goodbye on the link
    await eventually(
        lambda: len(link.edges()) == 1 and link.pids() not in ([], [first]),
        within=60,
        what="a new edge process joined in place of the killed one",
    )
    assert link.edges()[0].address == shard.address, "the same Session port"
    async with grpc.aio.insecure_channel(shard.address) as channel:
        stream: Any = shard_pb2_grpc.ShardStub(channel).Session()  # type: ignore[call-arg]
        await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id="edge-r")))
        assert (await stream.read()).ack.echo == "hello"
        await stream.write(_rollup("edge-r", 1, "2"))
        assert (await stream.read()).ack.echo == "rollup"
        await eventually(
            lambda: [n.aggregate for n in shard.engine.needs_of("edge-r")] == [{"cpu": 2.0}],
            within=30,
            what="the new edge's roll-up applied",
        )
        await stream.done_writing()
