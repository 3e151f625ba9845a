"""Lifecycle round trips over the wire: every legal edge, in order, with the
field-shape rules holding at each stable stop."""

from __future__ import annotations

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.errors import Unimplemented
from tests.integration.providers.provider_harness import Harness


async def test_create_configure_drain_round_trip_returns_to_idle_unbound(
    harness: Harness,
) -> None:
    shard = harness.shard()
    machine = await harness.machine()
    assert not machine.HasField("host")

    for round_number in range(3):
        if round_number == 0:
            ack = await harness.client.create(machine.id, shard.token())
            assert ack.machine.state == pb.MACHINE_STATE_CREATING
            assert not ack.machine.HasField("host")
            idle = await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
            assert idle.host.ref and idle.host.provider

        cluster = f"cluster-{round_number}"
        ack = await harness.client.configure(
            machine.id, cluster, b"#!ipxe\n", shard.token(), {"round": str(round_number)}
        )
        assert ack.machine.state == pb.MACHINE_STATE_CONFIGURING
        assert ack.machine.cluster == cluster
        configured = await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
        assert configured.cluster == cluster
        assert dict(configured.shard_metadata) == {"round": str(round_number)}
        assert configured.host == idle.host

        ack = await harness.client.drain(machine.id, 0, shard.token())
        assert ack.machine.state == pb.MACHINE_STATE_DRAINING
        assert ack.machine.cluster == cluster
        back = await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
        assert back.cluster == ""
        assert dict(back.shard_metadata) == {}
        assert back.last_error == ""
        assert back.host == idle.host


async def test_delete_returns_a_cloud_machine_to_speculative_without_host(
    harness: Harness,
) -> None:
    shard = harness.shard()
    idle = await harness.idle(shard)
    if not harness.has_delete:
        try:
            await harness.client.delete(idle.id, shard.token())
        except Unimplemented:
            return
        raise AssertionError("bare metal must answer Delete with UNIMPLEMENTED")
    ack = await harness.client.delete(idle.id, shard.token())
    assert ack.machine.state == pb.MACHINE_STATE_DELETING
    speculative = await harness.wait_state(idle.id, pb.MACHINE_STATE_SPECULATIVE)
    assert not speculative.HasField("host")
    assert speculative.cluster == ""
    # The slot is reusable: a new Create obtains a new host.
    await harness.client.create(idle.id, shard.token())
    again = await harness.wait_state(idle.id, pb.MACHINE_STATE_IDLE)
    assert again.host.ref != idle.host.ref


async def test_each_new_transition_gets_a_fresh_operation_id(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.machine()
    ids = [(await harness.client.create(machine.id, shard.token())).operation_id]
    await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
    ids.append((await harness.client.configure(machine.id, "c", b"", shard.token())).operation_id)
    await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    ids.append((await harness.client.drain(machine.id, 0, shard.token())).operation_id)
    await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
    ids.append((await harness.client.configure(machine.id, "c", b"", shard.token())).operation_id)
    assert all(ids) and len(set(ids)) == len(ids)
