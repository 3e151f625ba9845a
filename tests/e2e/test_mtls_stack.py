"""End to end over mutual TLS: the dev stack with ``--tls`` provisions a cluster's machines.

Every edge is TLS with development certificates: the operator presents
``cluster/<id>``, the shard ``shard/shard-0`` to the provider (which checks
it against each fencing token), the coordinator ``admin``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from bigfleet.devstack import DevStack
from bigfleet.identity import ChannelSecurity, Identity, Role
from bigfleet.v1alpha1 import provider_pb2, shard_pb2, shard_pb2_grpc
from clusters.operator import DemandPattern
from shard_engine.quantity import parse_quantity
from tests.e2e.stacks import one_shard

pytestmark = pytest.mark.e2e

CLUSTER = "tls-alpha"


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    options = one_shard(
        tmp_path,
        empty_database_url,
        ((CLUSTER, DemandPattern(cpu=8, memory_gib=16, priority=500_000)),),
        tls=True,
    )
    dev = DevStack(options)
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def _hello(address: str, security: ChannelSecurity | None, cluster: str) -> str:
    """Open a session and return the first answer: the ack's echo, or the status code."""
    creds = security.current() if security is not None else None
    chan = grpc.aio.secure_channel(address, creds) if creds else grpc.aio.insecure_channel(address)

    async def frames() -> AsyncIterator[shard_pb2.OperatorMessage]:
        yield shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id=cluster))
        await asyncio.sleep(60)

    try:
        call = shard_pb2_grpc.ShardStub(chan).Session(frames())
        frame = await asyncio.wait_for(call.read(), timeout=60)
        assert isinstance(frame, shard_pb2.ShardMessage)
        call.cancel()
        return frame.ack.echo
    except grpc.aio.AioRpcError as err:
        return err.code().name
    finally:
        await chan.close(None)


async def test_the_dev_stack_over_mutual_tls_provisions_a_clusters_machines(
    stack: DevStack,
) -> None:
    assert stack.shard is not None and stack.certs_dir is not None
    provider = next(iter(stack.provider_clients.values()))

    async def configured_cpu() -> float:
        listing = await provider.list(states=[provider_pb2.MACHINE_STATE_CONFIGURED])
        return sum(
            parse_quantity(m.allocatable.resources["cpu"])
            for m in listing.machines
            if m.cluster == CLUSTER
        )

    deadline = time.monotonic() + 90
    while await configured_cpu() < 8:
        assert time.monotonic() < deadline, "8 cores were not configured over mutual TLS"
        await asyncio.sleep(0.25)
    (cluster,) = stack.clusters
    assert "rollup" in cluster.acks and cluster.bootstrap_requests >= 1

    # The shard's port refuses plaintext, and another cluster's certificate.
    address = stack.shard.address
    assert await _hello(address, None, CLUSTER) == "UNAVAILABLE"
    other = stack._tls(Identity(Role.CLUSTER, "intruder"))
    assert other is not None
    assert await _hello(address, ChannelSecurity(other), CLUSTER) == "PERMISSION_DENIED"
