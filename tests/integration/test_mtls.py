"""Mutual TLS over real gRPC: who may open a Session, who may call a provider, rotation."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from prometheus_client import REGISTRY

from bigfleet import identity
from bigfleet.identity import (
    PROVIDER_SERVICE,
    ChannelSecurity,
    Identity,
    KeyPair,
    KeyPairSource,
    Role,
    channel,
    presented_identity,
    provider_security,
    server_credentials,
)
from bigfleet.shard.sessions import SHARD_SERVICE, SessionHub, ShardServicer
from bigfleet.v1alpha1 import capacity_pb2, shard_pb2, shard_pb2_grpc
from nanook.config import parse_pool_config
from nanook.pool import WorkerPool
from nanook.session import ChannelFactory, ShardSession
from providers.client import FencingToken, ProviderClient
from providers.config import ProviderConfig
from providers.errors import ProviderError, ProviderUnavailable
from providers.model import State
from providers.server import RunningProvider, start_provider_server
from shard_engine.engine import ShardEngine
from shard_engine.model import Rollup
from tests.integration.multishard import eventually
from tests.integration.pki import Pki
from tests.rollups import apply

CLUSTER = Identity(Role.CLUSTER, "c1")
OTHER_CLUSTER = Identity(Role.CLUSTER, "c2")
SHARD = Identity(Role.SHARD, "s0")
ADMIN = Identity(Role.ADMIN)
READONLY = Identity(Role.READONLY)


def refusals(service: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "bigfleet_identity_refusals_total", {"service": service, "reason": reason}
    )
    return value or 0.0


class EngineSink:
    """The RollupSink contract over a real engine, as the shard process provides it."""

    def __init__(self) -> None:
        self.engine = ShardEngine()

    async def admit_cluster(self, cluster_id: str) -> None:
        return None

    def apply_rollup(self, rollup: Rollup) -> str:
        outcome = apply(self.engine, rollup, now=time.time())
        return "rollup" if outcome.status == "applied" else f"rollup-{outcome.status}"

    def ack_fields(self) -> tuple[int, int]:
        return 1, 1


@dataclass
class TlsShard:
    pki: Pki
    source: KeyPairSource
    hub: SessionHub
    sink: EngineSink
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
async def shard(tmp_path: Path) -> AsyncIterator[TlsShard]:
    pki = Pki(tmp_path)
    source = pki.source(SHARD, stem="shard")
    hub, sink = SessionHub(), EngineSink()
    server = grpc.aio.server()
    shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(hub, sink), server)
    port = server.add_secure_port("127.0.0.1:0", server_credentials(source))
    await server.start()
    try:
        yield TlsShard(pki, source, hub, sink, port)
    finally:
        hub.close_all()
        await server.stop(None)


class Operator:
    """A scripted operator end of one session over its own channel."""

    def __init__(self, address: str, security: ChannelSecurity | None) -> None:
        self.channel = channel(address, security)
        self.queue: asyncio.Queue[shard_pb2.OperatorMessage | None] = asyncio.Queue()
        self.call = shard_pb2_grpc.ShardStub(self.channel).Session(self._requests())

    async def _requests(self) -> AsyncIterator[shard_pb2.OperatorMessage]:
        while (msg := await self.queue.get()) is not None:
            yield msg

    async def hello(self, cluster_id: str = "c1") -> shard_pb2.ShardMessage:
        await self.queue.put(
            shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id=cluster_id))
        )
        return await self.recv()

    async def rollup(self, cpu: str, ts: int, cluster: str = "c1") -> shard_pb2.ShardMessage:
        needs = capacity_pb2.ClusterCapacityNeeds(
            cluster_id=cluster,
            timestamp_unix_nanos=ts,
            needs=[capacity_pb2.CapacityNeed(aggregate_resources={"cpu": cpu}, priority=10)],
        )
        await self.queue.put(shard_pb2.OperatorMessage(rollup=needs))
        return await self.recv()

    async def recv(self) -> shard_pb2.ShardMessage:
        frame = await asyncio.wait_for(self.call.read(), timeout=60)
        assert isinstance(frame, shard_pb2.ShardMessage)
        return frame

    async def close(self) -> None:
        await self.queue.put(None)
        await self.channel.close(None)


async def refused_code(op: Operator, cluster_id: str = "c1") -> grpc.StatusCode:
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await op.hello(cluster_id)
        return caught.value.code()
    finally:
        await op.close()


# ------------------------------------------------------------------ Session


async def test_a_cluster_certificate_opens_a_session_for_its_own_cluster(shard: TlsShard) -> None:
    op = Operator(shard.address, shard.pki.client(CLUSTER))
    assert (await op.hello("c1")).ack.echo == "hello"
    assert (await op.rollup("4", 1)).ack.echo == "rollup"
    assert shard.hub.clusters() == ["c1"]
    assert shard.sink.engine.summary().needs == 1
    await op.close()


async def test_a_cluster_certificate_cannot_speak_for_another_cluster(shard: TlsShard) -> None:
    before = refusals(SHARD_SERVICE, "name-mismatch")
    op = Operator(shard.address, shard.pki.client(OTHER_CLUSTER))
    assert await refused_code(op, "c1") == grpc.StatusCode.PERMISSION_DENIED
    assert refusals(SHARD_SERVICE, "name-mismatch") == before + 1
    assert shard.hub.clusters() == []


async def test_a_rollup_in_another_clusters_name_is_rejected_on_an_own_session(
    shard: TlsShard,
) -> None:
    op = Operator(shard.address, shard.pki.client(CLUSTER))
    await op.hello("c1")
    echo = (await op.rollup("4", 1, cluster="c2")).ack.echo
    assert echo.startswith("rollup-rejected: cluster_id")
    assert shard.sink.engine.summary().needs == 0
    await op.close()


async def test_a_certificate_without_a_bigfleet_identity_is_refused(shard: TlsShard) -> None:
    before = refusals(SHARD_SERVICE, "no-identity")
    op = Operator(shard.address, shard.pki.client(None))
    assert await refused_code(op) == grpc.StatusCode.PERMISSION_DENIED
    assert refusals(SHARD_SERVICE, "no-identity") == before + 1


async def test_a_certificate_with_two_identities_is_refused(shard: TlsShard) -> None:
    before = refusals(SHARD_SERVICE, "several-identities")
    op = Operator(shard.address, shard.pki.client(CLUSTER, extra_uris=["bigfleet://admin"]))
    assert await refused_code(op) == grpc.StatusCode.PERMISSION_DENIED
    assert refusals(SHARD_SERVICE, "several-identities") == before + 1


@pytest.mark.parametrize("identity", [READONLY, SHARD, Identity(Role.PROVIDER, "p")])
async def test_a_certificate_of_the_wrong_role_cannot_open_a_session(
    shard: TlsShard, identity: Identity
) -> None:
    before = refusals(SHARD_SERVICE, "wrong-role")
    op = Operator(shard.address, shard.pki.client(identity))
    assert await refused_code(op) == grpc.StatusCode.PERMISSION_DENIED
    assert refusals(SHARD_SERVICE, "wrong-role") == before + 1


async def test_an_admin_certificate_may_open_a_session_for_any_cluster(shard: TlsShard) -> None:
    op = Operator(shard.address, shard.pki.client(ADMIN))
    assert (await op.hello("c7")).ack.echo == "hello"
    await op.close()


async def test_a_certificate_from_another_ca_fails_the_handshake(
    shard: TlsShard, tmp_path: Path
) -> None:
    stranger = Pki(tmp_path, name="another CA")
    files = stranger.files(CLUSTER)
    # The client trusts the shard's CA, but presents a certificate the shard does not.
    security = ChannelSecurity(
        KeyPairSource(type(files)(files.cert, files.key, shard.pki.ca_path), check_every_s=0)
    )
    op = Operator(shard.address, security)
    assert await refused_code(op) == grpc.StatusCode.UNAVAILABLE
    assert shard.hub.clusters() == []


async def test_an_expired_certificate_fails_the_handshake(shard: TlsShard) -> None:
    op = Operator(shard.address, shard.pki.client(CLUSTER, expired=True))
    assert await refused_code(op) == grpc.StatusCode.UNAVAILABLE
    assert shard.hub.clusters() == []


async def test_a_plaintext_client_cannot_reach_a_tls_shard(shard: TlsShard) -> None:
    op = Operator(shard.address, None)
    assert await refused_code(op) == grpc.StatusCode.UNAVAILABLE


async def test_refusals_of_one_peer_are_logged_once_and_counted_each_time(
    shard: TlsShard, caplog: pytest.LogCaptureFixture
) -> None:
    security = shard.pki.client(Identity(Role.CLUSTER, "c3"))
    before = refusals(SHARD_SERVICE, "name-mismatch")
    with caplog.at_level(logging.WARNING, logger="bigfleet.identity"):
        for _ in range(3):
            assert (
                await refused_code(Operator(shard.address, security), "c1")
                == grpc.StatusCode.PERMISSION_DENIED
            )
    assert refusals(SHARD_SERVICE, "name-mismatch") == before + 3
    lines = [r for r in caplog.records if "bigfleet://cluster/c3" in r.getMessage()]
    assert len(lines) == 1


def _served_serial(port: int, pki: Pki, client_files_source: KeyPairSource) -> int:
    """Serial number of the certificate the server presents on a fresh handshake."""
    pair = client_files_source.current()
    ctx = ssl.create_default_context(cafile=str(pki.ca_path))
    ctx.set_alpn_protocols(["h2"])
    ctx.load_cert_chain(client_files_source.files.cert, client_files_source.files.key)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None and pair.cert
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_rotated_certificate_is_served_to_new_peers_while_live_sessions_go_on(
    shard: TlsShard,
) -> None:
    live = Operator(shard.address, shard.pki.client(CLUSTER))
    await live.hello("c1")
    assert (await live.rollup("4", 1)).ack.echo == "rollup"
    probe = shard.pki.source(ADMIN)
    first = await asyncio.to_thread(_served_serial, shard.port, shard.pki, probe)

    # Rotate the shard's certificate in place, as cert-manager does with a mounted secret.
    shard.pki.files(SHARD, stem="shard")
    second = await asyncio.to_thread(_served_serial, shard.port, shard.pki, probe)
    assert second != first
    assert shard.source.current().generation == 1

    # The session opened before the rotation is still served.
    assert (await live.rollup("8", 2)).ack.echo == "rollup"
    assert shard.hub.clusters() == ["c1"]
    # And a new operator connects under the new certificate.
    fresh = Operator(shard.address, shard.pki.client(OTHER_CLUSTER))
    assert (await fresh.hello("c2")).ack.echo == "hello"
    assert shard.hub.clusters() == ["c1", "c2"]
    await live.close()
    await fresh.close()


async def test_a_half_written_rotation_keeps_the_previous_certificate(shard: TlsShard) -> None:
    served = shard.source.current()
    # A new certificate beside the old key: not a usable pair yet.
    other = shard.pki.files(SHARD, stem="other")
    shard.source.files.cert.write_bytes(other.cert.read_bytes())
    assert shard.source.current() is served
    op = Operator(shard.address, shard.pki.client(CLUSTER))
    assert (await op.hello("c1")).ack.echo == "hello"
    await op.close()
    # The key arrives: the pair is coherent again and is taken.
    shard.source.files.key.write_bytes(other.key.read_bytes())
    assert shard.source.current().generation == served.generation + 1


# ----------------------------------------------------------------- providers


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[tuple[Pki, RunningProvider]]:
    pki = Pki(tmp_path)
    security = provider_security(pki.source(Identity(Role.PROVIDER, "simcloud")))
    running = await start_provider_server(
        ProviderConfig(kind="sim-cloud", time_factor=0.001), "127.0.0.1:0", security=security
    )
    try:
        yield pki, running
    finally:
        await running.stop(grace=None)


def _speculative(running: RunningProvider) -> str:
    for machine_id in running.provider.machine_ids():
        if running.provider.get(machine_id).state == State.SPECULATIVE:
            return machine_id
    raise AssertionError("the simulated cloud has no speculative slot")


async def test_a_shard_may_mutate_with_its_own_fencing_token(
    provider: tuple[Pki, RunningProvider],
) -> None:
    pki, running = provider
    machine = _speculative(running)
    async with ProviderClient(running.address, security=pki.client(SHARD)) as client:
        ack = await client.create(machine, FencingToken("s0", 1, 1))
        assert ack.operation_id
        assert (await client.get(machine)).id == machine


async def test_a_shard_cannot_use_another_shards_fencing_token(
    provider: tuple[Pki, RunningProvider],
) -> None:
    pki, running = provider
    machine = _speculative(running)
    before = refusals(PROVIDER_SERVICE, "name-mismatch")
    async with ProviderClient(running.address, security=pki.client(SHARD)) as client:
        with pytest.raises(ProviderError, match="may act only as"):
            await client.create(machine, FencingToken("s1", 1, 1))
    assert refusals(PROVIDER_SERVICE, "name-mismatch") == before + 1
    assert running.provider.get(machine).state == State.SPECULATIVE


async def test_readonly_may_list_but_not_mutate(provider: tuple[Pki, RunningProvider]) -> None:
    pki, running = provider
    machine = _speculative(running)
    async with ProviderClient(running.address, security=pki.client(READONLY)) as client:
        assert len((await client.list_all()).machines) > 0
        with pytest.raises(ProviderError, match="may not call"):
            await client.create(machine, FencingToken("s0", 1, 1))


async def test_a_cluster_certificate_may_not_call_a_provider(
    provider: tuple[Pki, RunningProvider],
) -> None:
    pki, running = provider
    async with ProviderClient(running.address, security=pki.client(CLUSTER)) as client:
        with pytest.raises(ProviderError, match="may not call"):
            await client.list_all()


async def test_admin_may_mutate_for_any_shard(provider: tuple[Pki, RunningProvider]) -> None:
    pki, running = provider
    machine = _speculative(running)
    async with ProviderClient(running.address, security=pki.client(ADMIN)) as client:
        assert (await client.create(machine, FencingToken("s9", 1, 1))).operation_id


async def test_a_shard_calls_a_provider_only_if_it_presents_the_configured_name(
    provider: tuple[Pki, RunningProvider],
) -> None:
    pki, running = provider
    security = pki.client(SHARD)
    async with ProviderClient(running.address, security=security, name="simcloud") as client:
        assert len((await client.list_all()).machines) > 0
    machine = _speculative(running)
    async with ProviderClient(running.address, security=security, name="baremetal") as client:
        with pytest.raises(ProviderUnavailable, match="presents bigfleet://provider/simcloud"):
            await client.create(machine, FencingToken("s0", 1, 1))
    assert running.provider.get(machine).state == State.SPECULATIVE


async def test_calls_that_arrive_together_share_one_identity_check(
    provider: tuple[Pki, RunningProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    pki, running = provider
    handshakes: list[str] = []
    real = identity.presented_identity

    async def counted(address: str, pair: KeyPair, **kw: float) -> Identity:
        handshakes.append(address)
        return await real(address, pair, **kw)

    monkeypatch.setattr(identity, "presented_identity", counted)
    security = pki.client(SHARD)
    async with ProviderClient(running.address, security=security, name="simcloud") as client:
        listings = await asyncio.gather(*(client.list_all() for _ in range(20)))
        assert all(len(listing.machines) > 0 for listing in listings)
        await client.list_all()
    assert handshakes == [running.address]


async def test_a_provider_with_a_shards_certificate_is_not_trusted_as_a_provider(
    tmp_path: Path,
) -> None:
    pki = Pki(tmp_path)
    impostor = await start_provider_server(
        ProviderConfig(kind="sim-cloud", time_factor=0.001),
        "127.0.0.1:0",
        security=provider_security(pki.source(Identity(Role.SHARD, "s0"))),
    )
    try:
        async with ProviderClient(
            impostor.address, security=pki.client(SHARD), name="simcloud"
        ) as client:
            with pytest.raises(ProviderUnavailable, match="presents bigfleet://shard/s0"):
                await client.list_all()
    finally:
        await impostor.stop(grace=None)


async def test_presented_identity_reads_the_providers_certificate(
    provider: tuple[Pki, RunningProvider],
) -> None:
    pki, running = provider
    pair = pki.source(SHARD).current()
    # It does not wait for a TLS close_notify the gRPC server never sends: a
    # graceful close held every check (and a shard's start, once per provider)
    # for asyncio's 30 s SSL shutdown timeout. 20 s is a hang bound, not a speed.
    presented = await asyncio.wait_for(presented_identity(running.address, pair), 20.0)
    assert presented == Identity(Role.PROVIDER, "simcloud")


async def test_a_provider_refuses_a_client_without_a_certificate(
    provider: tuple[Pki, RunningProvider],
) -> None:
    _, running = provider
    async with ProviderClient(running.address, timeout=3.0) as client:
        with pytest.raises(ProviderError):
            await client.list_all()


async def test_a_client_presents_its_rotated_certificate_on_the_next_call(
    provider: tuple[Pki, RunningProvider],
) -> None:
    pki, running = provider
    source = pki.source(SHARD, stem="client")
    async with ProviderClient(running.address, security=ChannelSecurity(source)) as client:
        assert len((await client.list_all()).machines) > 0
        # Rotate to an identity the provider refuses: the refusal proves the new certificate.
        pki.files(CLUSTER, stem="client")
        with pytest.raises(ProviderError, match="may not call"):
            await client.list_all()


# -------------------------------------------------------------------- nanook


def _nanook_pool() -> WorkerPool:
    config = parse_pool_config({"worker": {"resources": {"cpu": "2"}}, "min": 1, "max": 4})
    return WorkerPool(config)


def _tls_channels(security: ChannelSecurity) -> ChannelFactory:
    def open_channel(address: str) -> grpc.aio.Channel:
        return channel(address, security)

    return open_channel


async def test_the_nanook_adapter_dials_its_shard_with_its_cluster_certificate(
    shard: TlsShard,
) -> None:
    pool = _nanook_pool()
    session = ShardSession(
        "c1", shard.address, pool, channel_factory=_tls_channels(shard.pki.client(CLUSTER))
    )
    session.start()
    try:
        await eventually(
            lambda: shard.sink.engine.summary().needs, within=60, what="the pool's roll-up"
        )
        assert pool.connected and shard.hub.clusters() == ["c1"]
        assert shard.sink.engine.summary().needs == 1
    finally:
        await session.stop()


async def test_the_nanook_adapter_cannot_speak_for_another_cluster(shard: TlsShard) -> None:
    before = refusals(SHARD_SERVICE, "name-mismatch")
    pool = _nanook_pool()
    session = ShardSession(
        "c1", shard.address, pool, channel_factory=_tls_channels(shard.pki.client(OTHER_CLUSTER))
    )
    session.start()
    try:
        await eventually(
            lambda: refusals(SHARD_SERVICE, "name-mismatch") > before,
            within=60,
            what="the refusal",
        )
        assert refusals(SHARD_SERVICE, "name-mismatch") > before
        assert not pool.connected and shard.hub.clusters() == []
    finally:
        await session.stop()
