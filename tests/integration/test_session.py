"""Shard/Session over real gRPC: the handshake, roll-ups, bootstrap correlation, coalescing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from bigfleet.shard.sessions import (
    SessionHub,
    SessionUnavailable,
    ShardServicer,
    ShardUnavailable,
)
from bigfleet.v1alpha1 import capacity_pb2, provider_pb2, shard_pb2, shard_pb2_grpc
from clusters.operator import DemandPattern, SimulatedCluster
from nanook.config import parse_pool_config
from nanook.pool import WorkerPool
from nanook.session import ShardSession
from shard_engine.engine import ShardEngine
from shard_engine.model import Rollup
from tests.integration.multishard import eventually
from tests.rollups import apply
from workflows.contracts import RequirementSpec


@dataclass
class EngineSink:
    """The RollupSink contract over a real engine, as the shard process provides it."""

    engine: ShardEngine = field(default_factory=ShardEngine)
    refuse: set[str] = field(default_factory=set)
    opened: list[str] = field(default_factory=list)
    not_acting: bool = False

    async def admit_cluster(self, cluster_id: str) -> None:
        if self.not_acting:
            raise ShardUnavailable("shard s1 is not acting; reconnect")
        if cluster_id in self.refuse:
            raise PermissionError(f"cluster {cluster_id!r} is served by shard 'other'")

    def apply_rollup(self, rollup: Rollup) -> str:
        outcome = apply(self.engine, rollup, now=0.0)
        return "rollup" if outcome.status == "applied" else f"rollup-{outcome.status}"

    def ack_fields(self) -> tuple[int, int]:
        return 4, 9


@dataclass
class Served:
    hub: SessionHub
    sink: EngineSink
    stub: shard_pb2_grpc.ShardAsyncStub
    address: str


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    hub, sink = SessionHub(), EngineSink()
    server = grpc.aio.server()
    shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(hub, sink), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(hub, sink, shard_pb2_grpc.ShardStub(channel), f"127.0.0.1:{port}")
    finally:
        await channel.close(None)
        await server.stop(None)


class Operator:
    """A scripted operator end of one session."""

    def __init__(self, stub: shard_pb2_grpc.ShardAsyncStub) -> None:
        self.queue: asyncio.Queue[shard_pb2.OperatorMessage | None] = asyncio.Queue()
        self.call = stub.Session(self._requests())
        # Once the call ends, end the request stream too (or gRPC's task feeding it waits).
        self.call.add_done_callback(lambda _: self.queue.put_nowait(None))

    async def _requests(self) -> AsyncIterator[shard_pb2.OperatorMessage]:
        while (msg := await self.queue.get()) is not None:
            yield msg

    async def send(self, **payload: object) -> None:
        await self.queue.put(shard_pb2.OperatorMessage(**payload))  # type: ignore[arg-type]

    async def recv(self) -> shard_pb2.ShardMessage:
        frame = await asyncio.wait_for(self.call.read(), timeout=60)
        assert isinstance(frame, shard_pb2.ShardMessage)
        return frame

    async def hello(self, cluster_id: str = "c1") -> shard_pb2.ShardMessage:
        await self.send(hello=shard_pb2.Hello(cluster_id=cluster_id, protocol_version="v1alpha1"))
        return await self.recv()


def _rollup(cpu: str, ts: int, cluster: str = "c1") -> capacity_pb2.ClusterCapacityNeeds:
    return capacity_pb2.ClusterCapacityNeeds(
        cluster_id=cluster,
        timestamp_unix_nanos=ts,
        needs=[capacity_pb2.CapacityNeed(aggregate_resources={"cpu": cpu}, priority=10)],
    )


async def test_hello_is_acknowledged_with_term_and_epoch(served: Served) -> None:
    op = Operator(served.stub)
    ack = (await op.hello()).ack
    assert (ack.echo, ack.coordinator_term, ack.shard_epoch) == ("hello", 4, 9)
    assert list(ack.extensions) == ["release", "do-not-disrupt", "gang-name"]
    assert served.hub.clusters() == ["c1"]


async def test_a_first_frame_other_than_hello_is_invalid(served: Served) -> None:
    op = Operator(served.stub)
    await op.send(rollup=_rollup("1", 1))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await op.recv()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_hello_without_cluster_id_is_invalid(served: Served) -> None:
    op = Operator(served.stub)
    await op.send(hello=shard_pb2.Hello(cluster_id=""))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await op.recv()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cluster_id" in (caught.value.details() or "")


async def test_a_cluster_owned_by_another_shard_is_turned_away(served: Served) -> None:
    served.sink.refuse.add("c9")
    op = Operator(served.stub)
    await op.send(hello=shard_pb2.Hello(cluster_id="c9"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await op.recv()
    assert caught.value.code() == grpc.StatusCode.ABORTED


async def test_rollups_are_acknowledged_and_replace_the_clusters_needs(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    await op.send(rollup=_rollup("4", 1))
    assert (await op.recv()).ack.echo == "rollup"
    await op.send(rollup=_rollup("8", 2))
    assert (await op.recv()).ack.echo == "rollup"
    assert served.sink.engine.summary().needs == 1


async def test_an_invalid_rollup_is_rejected_and_the_previous_needs_stay(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    await op.send(rollup=_rollup("4", 1))
    assert (await op.recv()).ack.echo == "rollup"
    await op.send(rollup=_rollup("four", 2))
    echo = (await op.recv()).ack.echo
    assert echo.startswith("rollup-rejected: needs[0].aggregate_resources[cpu]")
    assert served.sink.engine.summary().needs == 1
    # The session survives the rejection.
    await op.send(rollup=_rollup("6", 3))
    assert (await op.recv()).ack.echo == "rollup"


async def test_a_rollup_naming_machines_to_release_reaches_the_engine(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    named = _rollup("4", 1)
    named.release.machine_ids.extend(["m-1", "m-2"])
    await op.send(rollup=named)
    assert (await op.recv()).ack.echo == "rollup"
    assert served.sink.engine._table.releases() == {0: frozenset({"m-1", "m-2"})}
    empty_id = _rollup("4", 2)
    empty_id.release.machine_ids.append("")
    await op.send(rollup=empty_id)
    assert (await op.recv()).ack.echo.startswith("rollup-rejected: release.machine_ids[0]")


async def test_an_older_rollup_is_ignored_as_stale(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    await op.send(rollup=_rollup("4", 10))
    await op.recv()
    await op.send(rollup=_rollup("8", 5))
    assert (await op.recv()).ack.echo == "rollup-stale"


async def test_bootstrap_answers_are_correlated_by_request_id(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    reqs = [RequirementSpec("zone", 1, ["a"])]
    first = asyncio.create_task(served.hub.request_bootstrap("c1", reqs, wait_seconds=5))
    second = asyncio.create_task(served.hub.request_bootstrap("c1", reqs, wait_seconds=5))
    r1 = (await op.recv()).bootstrap_request
    r2 = (await op.recv()).bootstrap_request
    assert r1.request_id != r2.request_id and r1.cluster_id == "c1"
    assert r1.requirements[0].key == "zone"
    # Answer out of order; each waiter gets its own blob.
    await op.send(
        bootstrap_response=shard_pb2.BootstrapBlobResponse(
            request_id=r2.request_id, user_data=b"two", ttl_seconds=60
        )
    )
    await op.send(
        bootstrap_response=shard_pb2.BootstrapBlobResponse(
            request_id=r1.request_id, error="kubelet version out of skew"
        )
    )
    blob1, blob2 = await first, await second
    assert blob2.user_data == b"two" and blob2.ttl_seconds == 60 and not blob2.error
    assert blob1.error == "kubelet version out of skew"


async def test_a_bootstrap_request_without_a_session_is_retryable(served: Served) -> None:
    with pytest.raises(SessionUnavailable):
        await served.hub.request_bootstrap("nobody", [], wait_seconds=0.1)


async def test_a_bootstrap_request_that_goes_unanswered_times_out(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    with pytest.raises(SessionUnavailable, match="did not answer"):
        await served.hub.request_bootstrap("c1", [], wait_seconds=0.2)


async def test_node_updates_reach_the_operator(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    frame = shard_pb2.ShardMessage(
        node_state_update=shard_pb2.NodeStateUpdate(
            supersedes_key="node:m1",
            machine_id="m1",
            cluster_id="c1",
            state=provider_pb2.MACHINE_STATE_CONFIGURED,
        )
    )
    assert served.hub.send("c1", frame, key="node:m1")
    update = (await op.recv()).node_state_update
    assert (update.machine_id, update.state) == ("m1", 5)
    assert not served.hub.send("c2", frame)


async def test_a_reconnecting_cluster_replaces_its_old_session(served: Served) -> None:
    old = Operator(served.stub)
    await old.hello()
    new = Operator(served.stub)
    await new.hello()
    assert served.hub.clusters() == ["c1"]
    served.hub.send(
        "c1", shard_pb2.ShardMessage(ack=shard_pb2.Acknowledgement(echo="ping")), key=""
    )
    assert (await new.recv()).ack.echo == "ping"


async def test_every_hello_is_reported_so_the_shard_can_resync_the_node_view(
    served: Served,
) -> None:
    served.hub.on_open(served.sink.opened.append)
    await Operator(served.stub).hello()
    await Operator(served.stub).hello()
    assert served.sink.opened == ["c1", "c1"]


async def test_a_shard_that_stops_acting_ends_its_sessions_unavailable(served: Served) -> None:
    op = Operator(served.stub)
    await op.hello()
    served.hub.close_all(unavailable="shard s1 is not acting (lease deadline); reconnect")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await op.recv()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not acting" in (caught.value.details() or "")


async def test_a_hello_to_a_shard_that_is_not_acting_is_refused_unavailable(
    served: Served,
) -> None:
    served.sink.not_acting = True
    served.hub.on_open(served.sink.opened.append)
    op = Operator(served.stub)
    await op.send(hello=shard_pb2.Hello(cluster_id="c1"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await op.recv()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert served.sink.opened == []


def _request_feeders() -> set[asyncio.Task[Any]]:
    """gRPC's running tasks that feed a client's request stream from its iterator."""
    return {
        t
        for t in asyncio.all_tasks()
        if not t.done() and "_consume_request_iterator" in repr(t.get_coro())
    }


def _simulated(address: str) -> tuple[Callable[[], int], SimulatedCluster]:
    demand = DemandPattern(cpu=1, memory_gib=1, min_unit_cpu=1, min_unit_memory_gib=1)
    cluster = SimulatedCluster("c1", address, demand, rollup_interval_s=0.2)
    return (lambda: cluster.acks.count("hello")), cluster


def _nanook(address: str) -> tuple[Callable[[], int], ShardSession]:
    pool = WorkerPool(parse_pool_config({"worker": {"resources": {"cpu": "4"}}}))
    session = ShardSession("c1", address, pool)
    return (lambda: session.sessions), session


@pytest.mark.parametrize("make", [_simulated, _nanook], ids=["simulated-cluster", "nanook"])
async def test_an_operator_whose_sessions_the_shard_ends_leaves_no_request_stream_running(
    served: Served, make: Callable[[str], tuple[Callable[[], int], Any]]
) -> None:
    before = _request_feeders()
    sessions, operator = make(served.address)
    operator.start()
    try:
        for n in (1, 2, 3):
            await eventually(lambda: sessions() >= n, within=30, what=f"session {n}")  # noqa: B023
            if n < 3:
                served.hub.close_all(unavailable="shard s1 is not acting; reconnect")
    finally:
        await operator.stop()
    # Two sessions the shard ended and one the operator closed: no feeder of any is left
    # (each would wait on its session's queue for as long as the process lives).
    await eventually(
        lambda: not _request_feeders() - before,
        within=60,
        what="the request streams of the ended sessions to end",
    )
