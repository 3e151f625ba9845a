"""ShardRead/InspectNeeds over real gRPC, on the same port as Shard/Session.

Two clients ask: ours (the generated stub) and one built only from the Go
reference's wire shape of ``shardread.proto`` — message and field numbers,
types and names as the reference declares them, and none of BigFleet's own
fields (100 and up). The reference-shaped client must decode every frame.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from bigfleet.identity import Identity, Role, channel
from bigfleet.shard.server import IngestOptions, IngestServer
from bigfleet.shard.sessions import SessionHub
from bigfleet.v1alpha1 import (
    shardread_pb2,
    shardread_pb2_grpc,
)
from shard_engine.engine import ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState, Need, Rollup
from shard_engine.verdicts import Inspection
from tests.integration.pki import Pki
from tests.reference_wire import REFERENCE_REASONS, reference_shardread
from tests.rollups import apply


class IdleSink:
    """A Session sink for a shard surface that only needs to be there (no roll-ups sent)."""

    async def admit_cluster(self, cluster_id: str) -> None:
        return None

    def apply_rollup(self, rollup: Rollup) -> str:
        raise AssertionError("no roll-up is sent in these tests")

    def ack_fields(self) -> tuple[int, int]:
        return 0, 0


GI = 2.0**30


def record(machine_id: str, state: MachineState, cluster: str = "") -> MachineRecord:
    return MachineRecord(
        id=machine_id,
        state=state,
        provider="sim",
        instance_type="m.xlarge",
        zone="zone-a",
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=0.2,
        interruption_probability=0.0,
        allocatable={"cpu": 4.0, "memory": 16 * GI},
        cluster=cluster if state.has_host else "",
        host_ref=f"h-{machine_id}" if state.has_host else "",
    )


def inspector(engine: ShardEngine) -> Callable[[str, int], Inspection]:
    """What the shard process hands its Session server: the engine's answer, on the shard loop."""
    return lambda cluster_id, limit: engine.inspect_needs(cluster_id, limit=limit)


@dataclass
class Shard:
    engine: ShardEngine
    channel: grpc.aio.Channel


@pytest.fixture
async def shard() -> AsyncIterator[Shard]:
    """A shard's gRPC surface: Session and ShardRead on one port, over a real engine."""
    engine = ShardEngine()
    for i in range(3):
        engine.upsert_machine(record(f"low-{i}", MachineState.CONFIGURED, "batch"), now=0)
    engine.upsert_machine(record("idle-0", MachineState.IDLE), now=0)
    wanted = {"cpu": 8.0, "memory": 8 * GI}
    apply(engine, Rollup("batch", 1, (Need((), {"cpu": 12.0}, priority=10),)), now=0)
    apply(engine, Rollup("web", 1, (Need((), wanted, priority=1_000_000),)), now=0)
    gpus = Need((), {"nvidia.com/gpu": 2.0}, priority=500, min_unit={"nvidia.com/gpu": 1.0})
    apply(engine, Rollup("ml", 1, (gpus,)), now=0)
    engine.cycle(now=100.0)

    server = IngestServer(
        SessionHub(), IdleSink(), IngestOptions(listen="127.0.0.1:0"), inspect=inspector(engine)
    )
    address = await server.start()
    channel = grpc.aio.insecure_channel(address)
    try:
        yield Shard(engine, channel)
    finally:
        await channel.close(None)
        await server.stop()


async def test_inspect_needs_streams_a_header_then_one_view_per_need_by_priority(
    shard: Shard,
) -> None:
    stub = shardread_pb2_grpc.ShardReadStub(shard.channel)

    frames = [f async for f in stub.InspectNeeds(shardread_pb2.InspectNeedsRequest())]

    assert frames[0].WhichOneof("frame") == "header"
    header = frames[0].header
    assert (header.cycle, header.total_needs) == (1, 3)
    assert header.computed_at_unix_nanos == 100 * 10**9
    views = [f.need for f in frames[1:]]
    assert [v.cluster_id for v in views] == ["web", "ml", "batch"]
    web, ml, _ = views
    assert web.satisfied and web.preemption.victims_found == 1 and web.need_key
    assert web.need.aggregate_resources == {"cpu": "8", "memory": "8Gi"}
    assert not ml.satisfied
    assert ml.unmet_reason == shardread_pb2.UNMET_REASON_NO_MATCHING_SUPPLY
    assert ml.residual_deficit.resources == {"nvidia.com/gpu": "2"}
    assert ml.unmet_detail.startswith("no matching supply")
    assert ml.age_cycles_unmet == 1


async def test_a_cluster_filter_and_a_limit_cut_the_list_but_not_the_total(shard: Shard) -> None:
    stub = shardread_pb2_grpc.ShardReadStub(shard.channel)

    one = [f async for f in stub.InspectNeeds(shardread_pb2.InspectNeedsRequest(cluster_id="ml"))]
    capped = [f async for f in stub.InspectNeeds(shardread_pb2.InspectNeedsRequest(limit=1))]

    assert [f.need.cluster_id for f in one[1:]] == ["ml"]
    assert capped[0].header.total_needs == 3 and len(capped) == 2


async def test_a_negative_limit_is_refused_naming_the_field(shard: Shard) -> None:
    stub = shardread_pb2_grpc.ShardReadStub(shard.channel)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [f async for f in stub.InspectNeeds(shardread_pb2.InspectNeedsRequest(limit=-1))]

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit" in (caught.value.details() or "")


async def test_a_client_built_from_the_reference_shape_reads_every_frame(shard: Shard) -> None:
    ref = reference_shardread()
    call = shard.channel.unary_stream(
        "/bigfleet.v1alpha1.ShardRead/InspectNeeds",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=ref["InspectNeedsResponse"].FromString,
    )

    frames = [f async for f in call(ref["InspectNeedsRequest"](cluster_id="", limit=0))]

    assert frames[0].WhichOneof("frame") == "header"
    assert frames[0].header.total_needs == 3
    by_cluster = {f.need.cluster_id: f.need for f in frames[1:]}
    ml = by_cluster["ml"]
    assert ml.unmet_reason == REFERENCE_REASONS["UNMET_REASON_NO_MATCHING_SUPPLY"]
    assert dict(ml.residual_deficit.resources) == {"nvidia.com/gpu": "2"}
    assert ml.matching_supply.speculative == 0 and not ml.satisfied
    assert by_cluster["web"].preemption.victims_found == 1
    assert dict(by_cluster["web"].need.aggregate_resources)["cpu"] == "8"


@pytest.mark.parametrize(
    ("who", "allowed"),
    [
        (Identity(Role.READONLY), True),
        (Identity(Role.ADMIN), True),
        (Identity(Role.CLUSTER, "ml"), False),
        (Identity(Role.SHARD, "s1"), False),
    ],
)
async def test_under_mutual_tls_only_readonly_and_admin_may_inspect(
    tmp_path: Path, who: Identity, allowed: bool
) -> None:
    pki = Pki(tmp_path)
    engine = ShardEngine()
    apply(engine, Rollup("ml", 1, (Need((), {"cpu": 1.0}, priority=1),)), now=0)
    engine.cycle(now=1.0)
    server = IngestServer(
        SessionHub(),
        IdleSink(),
        IngestOptions(listen="127.0.0.1:0"),
        tls=pki.source(Identity(Role.SHARD, "s0")),
        inspect=inspector(engine),
    )
    address = await server.start()
    client = channel(address, pki.client(who))
    try:
        stub = shardread_pb2_grpc.ShardReadStub(client)
        request = shardread_pb2.InspectNeedsRequest()
        if allowed:
            frames = [f async for f in stub.InspectNeeds(request)]
            assert frames[0].header.total_needs == 1
        else:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                _ = [f async for f in stub.InspectNeeds(request)]
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await client.close(None)
        await server.stop()
