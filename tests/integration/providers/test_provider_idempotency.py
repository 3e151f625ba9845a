"""Idempotency on (machine_id, target state): concurrent identical retries,
over one connection or many, collapse to one operation that runs once."""

from __future__ import annotations

import asyncio

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import FencingToken, ProviderClient
from providers.errors import Fenced, InvalidTransition
from tests.integration.providers.provider_harness import Harness

RETRIES = 16


async def test_concurrent_identical_creates_share_one_operation(harness: Harness) -> None:
    machine = await harness.machine()
    acks = await asyncio.gather(*(harness.client.create(machine.id, None) for _ in range(RETRIES)))
    assert len({a.operation_id for a in acks}) == 1 and acks[0].operation_id
    assert {a.machine.state for a in acks} <= {pb.MACHINE_STATE_CREATING, pb.MACHINE_STATE_IDLE}
    idle = await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
    # One launch: a second one would have minted a second host.
    again = await harness.client.create(machine.id, None)
    assert again.operation_id == acks[0].operation_id
    assert again.machine.host == idle.host


async def test_retries_across_connections_with_fresh_sequences_share_one_operation(
    harness: Harness,
) -> None:
    """Retries re-stamped with fresh sequence numbers race each other; the
    ones that arrive out of order are fenced, every other one answers with
    the same operation id."""
    shard = harness.shard()
    machine = await harness.machine()
    clients = [ProviderClient(harness.address) for _ in range(4)]
    try:
        tokens = [shard.token() for _ in range(RETRIES)]
        results = await asyncio.gather(
            *(
                clients[i % len(clients)].create(machine.id, token)
                for i, token in enumerate(tokens)
            ),
            return_exceptions=True,
        )
    finally:
        for client in clients:
            await client.close()
    acks = [r for r in results if isinstance(r, pb.TransitionAck)]
    others = [r for r in results if not isinstance(r, pb.TransitionAck)]
    assert acks, results
    assert all(isinstance(r, Fenced) for r in others), others
    assert len({a.operation_id for a in acks}) == 1
    await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)


async def test_concurrent_identical_configures_share_one_operation(harness: Harness) -> None:
    machine = await harness.idle()
    metadata = {"owner": "need-7"}
    acks = await asyncio.gather(
        *(
            harness.client.configure(machine.id, "cluster-a", b"blob", None, metadata)
            for _ in range(RETRIES)
        )
    )
    assert len({a.operation_id for a in acks}) == 1
    settled = await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    assert dict(settled.shard_metadata) == metadata


async def test_concurrent_identical_drains_share_one_operation(harness: Harness) -> None:
    machine = await harness.configured(metadata={"a": "1"})
    acks = await asyncio.gather(
        *(harness.client.drain(machine.id, 0, None) for _ in range(RETRIES))
    )
    assert len({a.operation_id for a in acks}) == 1
    settled = await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
    assert settled.cluster == "" and dict(settled.shard_metadata) == {}


async def test_concurrent_identical_deletes_share_one_operation(harness: Harness) -> None:
    if not harness.has_delete:
        pytest.skip("bare metal has no Delete")
    machine = await harness.idle()
    acks = await asyncio.gather(*(harness.client.delete(machine.id, None) for _ in range(RETRIES)))
    assert len({a.operation_id for a in acks}) == 1
    await harness.wait_state(machine.id, pb.MACHINE_STATE_SPECULATIVE)


async def test_a_configure_for_another_cluster_is_refused_not_merged(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    await harness.client.configure(machine.id, "cluster-a", b"", shard.token(), {"k": "a"})
    with pytest.raises(InvalidTransition):
        await harness.client.configure(machine.id, "cluster-b", b"", shard.token(), {"k": "b"})
    settled = await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    assert settled.cluster == "cluster-a" and dict(settled.shard_metadata) == {"k": "a"}


async def test_racing_conflicting_mutations_leave_one_well_defined_state(
    harness: Harness,
) -> None:
    machine = await harness.idle()
    shard = harness.shard()
    results = await asyncio.gather(
        harness.client.configure(machine.id, "cluster-a", b"", FencingToken(shard.shard_id, 1, 1)),
        harness.client.drain(machine.id, 0, FencingToken(shard.shard_id, 1, 2)),
        return_exceptions=True,
    )
    assert any(isinstance(r, pb.TransitionAck) for r in results)
    settled = await harness.client.get(machine.id)
    assert settled.state in {
        pb.MACHINE_STATE_CONFIGURING,
        pb.MACHINE_STATE_CONFIGURED,
        pb.MACHINE_STATE_IDLE,
    }


async def test_different_machines_get_different_operations(harness: Harness) -> None:
    machines = [await harness.machine() for _ in range(6)]
    shard = harness.shard()
    acks = await asyncio.gather(*(harness.client.create(m.id, shard.token()) for m in machines))
    assert len({a.operation_id for a in acks}) == len(machines)
    for machine in machines:
        await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
