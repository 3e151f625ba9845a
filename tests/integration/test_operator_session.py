"""The operator-side Session client every operator shares, against real Shard/Session servers:
Hello with the protocol version, a standby tried after UNAVAILABLE, a redirect followed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from bigfleet.shard.sessions import ClusterElsewhere, SessionHub, ShardServicer, ShardUnavailable
from bigfleet.v1alpha1 import shard_pb2, shard_pb2_grpc
from clusters.session import PROTOCOL_VERSION, OperatorSession
from shard_engine.model import Rollup
from tests.waiting import eventually


@dataclass
class Sink:
    """A shard's admission rules, scripted: not acting, or the cluster lives elsewhere."""

    not_acting: bool = False
    elsewhere: str = ""
    hellos: list[str] = field(default_factory=list)

    async def admit_cluster(self, cluster_id: str) -> None:
        if self.not_acting:
            raise ShardUnavailable("shard is not acting; reconnect")
        if self.elsewhere:
            raise ClusterElsewhere(cluster_id, "shard-b", self.elsewhere)
        self.hellos.append(cluster_id)

    def apply_rollup(self, rollup: Rollup) -> str:
        return "rollup"

    def ack_fields(self) -> tuple[int, int]:
        return 1, 1


@dataclass
class Shard:
    sink: Sink
    hub: SessionHub
    address: str


@pytest.fixture
async def shards() -> AsyncIterator[list[Shard]]:
    started: list[tuple[grpc.aio.Server, Shard]] = []
    for _ in range(2):
        hub, sink = SessionHub(), Sink()
        server = grpc.aio.server()
        shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(hub, sink), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        started.append((server, Shard(sink, hub, f"127.0.0.1:{port}")))
    try:
        yield [shard for _, shard in started]
    finally:
        for server, _ in started:
            await server.stop(None)


@dataclass
class Recorder:
    """A handler that records what the client told it and sends one frame per session."""

    opened_acks: list[str] = field(default_factory=list)
    endings: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    session: OperatorSession | None = None

    def opened(self, ack: shard_pb2.Acknowledgement) -> None:
        self.opened_acks.append(ack.echo)

    async def sending(self) -> None:
        assert self.session is not None
        await self.session.send(
            shard_pb2.OperatorMessage(reclaim_ack=shard_pb2.ReclaimAck(instruction_id="r1"))
        )
        await asyncio.Event().wait()

    async def received(self, frame: shard_pb2.ShardMessage) -> None:
        self.frames.append(frame.WhichOneof("payload") or "")

    def closed(self, ending: str) -> None:
        self.endings.append(ending)


async def _run(
    handler: Recorder, address: str, *, standbys: tuple[str, ...] = ()
) -> OperatorSession:
    session = OperatorSession("c1", address, handler, standbys=standbys)
    handler.session = session
    session.start()
    return session


async def test_a_session_says_hello_with_the_protocol_version_and_the_handler_sees_it_open(
    shards: list[Shard],
) -> None:
    handler = Recorder()
    session = await _run(handler, shards[0].address)
    try:
        await eventually(lambda: handler.opened_acks == ["hello"], what="the Hello's ack")
        assert shards[0].sink.hellos == ["c1"] and session.sessions == 1
        assert PROTOCOL_VERSION == "bigfleet.v1alpha1"
    finally:
        await session.stop()
    assert handler.endings, "the handler hears that the session ended when the client stops"


async def test_an_unavailable_shard_sends_the_operator_to_its_standby(shards: list[Shard]) -> None:
    primary, standby = shards
    primary.sink.not_acting = True
    handler = Recorder()
    session = await _run(handler, primary.address, standbys=(standby.address,))
    try:
        await eventually(lambda: standby.sink.hellos == ["c1"], what="a Hello at the standby")
        assert "UNAVAILABLE" in session.endings
        assert session.shard_address == standby.address
        assert session.redirects == []  # rotating to a standby is not a redirect
        await eventually(lambda: handler.opened_acks == ["hello"], what="the standby's ack")
    finally:
        await session.stop()


async def test_a_cluster_served_elsewhere_follows_the_address_the_shard_names(
    shards: list[Shard],
) -> None:
    old, new = shards
    old.sink.elsewhere = new.address
    handler = Recorder()
    session = await _run(handler, old.address)
    try:
        await eventually(lambda: new.sink.hellos == ["c1"], what="a Hello at the new shard")
        assert session.redirects == [new.address] and session.shard_address == new.address
        assert "ABORTED" in session.endings and old.sink.hellos == []
    finally:
        await session.stop()


async def test_a_dropped_session_is_redialled(shards: list[Shard]) -> None:
    handler = Recorder()
    session = await _run(handler, shards[0].address)
    try:
        await eventually(lambda: session.sessions == 1, what="the first session")
        session.drop()
        await eventually(lambda: session.sessions == 2, what="a second session after the drop")
        assert "CANCELLED" in session.endings
        assert shards[0].sink.hellos == ["c1", "c1"]
    finally:
        await session.stop()
