"""Error-code discipline: INVALID_ARGUMENT for malformed requests (before
fencing, so the mark does not move), NOT_FOUND for unknown machines,
UNIMPLEMENTED for Delete on bare metal, and no partial transitions."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from bigfleet.v1alpha1 import provider_pb2_grpc
from providers.client import FencingToken
from providers.errors import InvalidArgument, NotFound, Unimplemented
from providers.validation import (
    MAX_BOOTSTRAP_BYTES,
    MAX_ID_LENGTH,
    MAX_METADATA_BYTES,
    MAX_METADATA_ENTRIES,
)
from tests.integration.providers.provider_harness import Harness


async def test_empty_machine_ids_are_invalid_arguments(harness: Harness) -> None:
    token = harness.shard().token()
    with pytest.raises(InvalidArgument):
        await harness.client.get("")
    with pytest.raises(InvalidArgument):
        await harness.client.create("", token)
    with pytest.raises(InvalidArgument):
        await harness.client.configure("", "c", b"", token)
    with pytest.raises(InvalidArgument):
        await harness.client.drain("", 0, token)
    with pytest.raises(InvalidArgument if harness.has_delete else Unimplemented):
        await harness.client.delete("", token)
    with pytest.raises(InvalidArgument):
        await harness.client.create("x" * (MAX_ID_LENGTH + 1), token)


async def test_negative_epoch_or_sequence_is_invalid_and_moves_no_mark(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.machine()
    with pytest.raises(InvalidArgument):
        await harness.client.create(machine.id, FencingToken(shard.shard_id, -1, 5))
    with pytest.raises(InvalidArgument):
        await harness.client.create(machine.id, FencingToken(shard.shard_id, 1, -5))
    assert (await harness.client.get(machine.id)).state == pb.MACHINE_STATE_SPECULATIVE
    await harness.client.create(machine.id, FencingToken(shard.shard_id, 0, 0))


async def test_negative_grace_is_invalid_and_leaves_the_machine_configured(
    harness: Harness,
) -> None:
    shard = harness.shard()
    machine = await harness.configured(shard=shard)
    token = shard.token()
    with pytest.raises(InvalidArgument):
        await harness.client.drain(machine.id, -1, token)
    assert (await harness.client.get(machine.id)).state == pb.MACHINE_STATE_CONFIGURED
    # The refused request did not move the mark: the same token still passes.
    await harness.client.drain(machine.id, 0, token)


async def test_configure_needs_a_cluster(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    with pytest.raises(InvalidArgument):
        await harness.client.configure(machine.id, "", b"", shard.token())
    assert (await harness.client.get(machine.id)).state == pb.MACHINE_STATE_IDLE


async def test_oversized_bootstrap_blobs_are_refused_without_a_partial_transition(
    harness: Harness,
) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    with pytest.raises(InvalidArgument):
        await harness.client.configure(
            machine.id, "c", b"\x00" * (MAX_BOOTSTRAP_BYTES + 1), shard.token()
        )
    after = await harness.client.get(machine.id)
    assert after.state == pb.MACHINE_STATE_IDLE and after.cluster == ""
    # Exactly at the cap is fine.
    await harness.client.configure(machine.id, "c", b"\xff" * MAX_BOOTSTRAP_BYTES, shard.token())


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": "" for i in range(MAX_METADATA_ENTRIES + 1)},
        {"big": "v" * (MAX_METADATA_BYTES + 1)},
    ],
    ids=["too-many-entries", "too-many-bytes"],
)
async def test_oversized_metadata_is_refused_without_a_partial_transition(
    harness: Harness, metadata: dict[str, str]
) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    with pytest.raises(InvalidArgument):
        await harness.client.configure(machine.id, "c", b"", shard.token(), metadata)
    after = await harness.client.get(machine.id)
    assert after.state == pb.MACHINE_STATE_IDLE
    assert dict(after.shard_metadata) == {} and after.cluster == ""


async def test_unknown_machines_are_not_found(harness: Harness) -> None:
    token = harness.shard().token
    with pytest.raises(NotFound):
        await harness.client.get("no-such-machine")
    with pytest.raises(NotFound):
        await harness.client.create("no-such-machine", token())
    with pytest.raises(NotFound):
        await harness.client.configure("no-such-machine", "c", b"", token())
    with pytest.raises(NotFound):
        await harness.client.drain("no-such-machine", 0, token())
    with pytest.raises(NotFound if harness.has_delete else Unimplemented):
        await harness.client.delete("no-such-machine", token())


async def test_bare_metal_answers_delete_with_unimplemented(harness: Harness) -> None:
    if harness.has_delete:
        pytest.skip("cloud providers implement Delete")
    shard = harness.shard()
    machine = await harness.idle(shard)
    with pytest.raises(Unimplemented):
        await harness.client.delete(machine.id, shard.token())
    assert (await harness.client.get(machine.id)).state == pb.MACHINE_STATE_IDLE


async def test_bad_list_filters_are_invalid_arguments(harness: Harness) -> None:
    with pytest.raises(InvalidArgument):
        await harness.client.list(max_results=-1)
    with pytest.raises(InvalidArgument):
        await harness.client.list(states=[pb.MACHINE_STATE_UNSPECIFIED])


async def test_the_wire_codes_are_the_documented_ones(harness: Harness) -> None:
    """Raw status codes, not just the client's mapping of them."""
    async with grpc.aio.insecure_channel(harness.address) as channel:
        stub = provider_pb2_grpc.CapacityProviderStub(channel)
        shard = harness.shard()
        machine = await harness.configured(shard=shard)
        cases: list[tuple[Awaitable[object], grpc.StatusCode]] = [
            (stub.Get(pb.MachineRef(id="")), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.Get(pb.MachineRef(id="nope")), grpc.StatusCode.NOT_FOUND),
            (stub.Create(pb.CreateRequest(machine_id=machine.id)), grpc.StatusCode.ABORTED),
            (
                stub.Drain(
                    pb.DrainRequest(
                        machine_id=machine.id,
                        shard_id=shard.shard_id,
                        shard_epoch=0,
                        sequence_number=0,
                    )
                ),
                grpc.StatusCode.FAILED_PRECONDITION,
            ),
        ]
        if not harness.has_delete:
            cases.append(
                (
                    stub.Delete(pb.DeleteRequest(machine_id=machine.id)),
                    grpc.StatusCode.UNIMPLEMENTED,
                )
            )
        for call, code in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == code


@pytest.mark.parametrize("bad", ["m\x001", " ", "m 1", "x" * 10_000, "mé"])
async def test_machine_ids_with_nul_bytes_whitespace_or_no_end_are_invalid(
    harness: Harness, bad: str
) -> None:
    token = harness.shard().token()
    with pytest.raises(InvalidArgument, match="machine_id"):
        await harness.client.get(bad)
    with pytest.raises(InvalidArgument, match="machine_id"):
        await harness.client.create(bad, token)


@pytest.mark.parametrize("bad", ["c\x00", "   ", "Prod", "x" * 10_000, "-c"])
async def test_configure_refuses_a_cluster_id_that_is_not_a_dns_subdomain(
    harness: Harness, bad: str
) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    with pytest.raises(InvalidArgument, match="cluster_id"):
        await harness.client.configure(machine.id, bad, b"", shard.token())
    assert (await harness.client.get(machine.id)).state == pb.MACHINE_STATE_IDLE


async def test_a_shard_id_with_a_nul_byte_is_invalid_and_moves_no_mark(harness: Harness) -> None:
    machine = await harness.machine()
    with pytest.raises(InvalidArgument, match="shard_id"):
        await harness.client.create(machine.id, FencingToken("shard\x00", 1, 1))
    assert (await harness.client.get(machine.id)).state == pb.MACHINE_STATE_SPECULATIVE
