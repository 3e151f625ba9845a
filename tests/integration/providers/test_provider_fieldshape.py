"""Field-shape rules on every machine the providers expose and at every
state a machine passes through: costs in range, host iff a real machine,
cluster iff bound, the labels and allocatable BigFleet relies on."""

from __future__ import annotations

import math
import re

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import ProviderClient
from tests.integration.providers.provider_harness import KINDS, Harness, serve

#: The machine-id prefix of each kind (its default provider name).
ID_PREFIX = {"sim-cloud": "simcloud-", "bare-metal": "bm-", "ec2": "ec2-"}

HOSTLESS = {pb.MACHINE_STATE_SPECULATIVE, pb.MACHINE_STATE_CREATING}
BOUND = {pb.MACHINE_STATE_CONFIGURING, pb.MACHINE_STATE_CONFIGURED, pb.MACHINE_STATE_DRAINING}
REQUIRED_LABELS = (
    "topology.kubernetes.io/zone",
    "node.kubernetes.io/instance-type",
    "bigfleet.io/capacity-type",
)
CAPACITY_LABELS = {
    pb.CAPACITY_TYPE_SPOT: "spot",
    pb.CAPACITY_TYPE_ON_DEMAND: "on-demand",
    pb.CAPACITY_TYPE_RESERVED: "reserved",
    pb.CAPACITY_TYPE_BARE_METAL: "bare-metal",
}
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
#: Bare top-level field names must not be smuggled into labels.
LEAK_KEYS = {"zone", "instance-type", "instance_type", "capacity-type", "capacity_type"}


def check_shape(machine: pb.Machine, kind: str) -> None:
    """Every field-shape rule, for one observation of one machine."""
    where = f"{machine.id} in {pb.MachineState.Name(machine.state)}"
    assert machine.id and machine.state != pb.MACHINE_STATE_UNSPECIFIED, where
    assert machine.instance_type and machine.zone, where
    assert math.isfinite(machine.price_per_hour) and machine.price_per_hour >= 0, where
    p = machine.interruption_probability
    assert math.isfinite(p) and 0 <= p <= 1, where
    if machine.capacity_type == pb.CAPACITY_TYPE_SPOT:
        assert p > 0, where
    has_host = machine.HasField("host") and bool(machine.host.ref or machine.host.provider)
    assert has_host == (machine.state not in HOSTLESS), where
    assert bool(machine.cluster) == (machine.state in BOUND), where
    if not machine.cluster:
        assert dict(machine.shard_metadata) == {}, where
    assert bool(machine.last_error) == (machine.state == pb.MACHINE_STATE_FAILED), where

    labels = dict(machine.labels)
    for key in REQUIRED_LABELS:
        assert labels.get(key), (where, key)
    assert not LEAK_KEYS & labels.keys(), where
    assert labels["topology.kubernetes.io/zone"] == machine.zone, where
    assert labels["node.kubernetes.io/instance-type"] == machine.instance_type, where
    assert labels["bigfleet.io/capacity-type"] == CAPACITY_LABELS[machine.capacity_type], where

    allocatable = dict(machine.allocatable.resources)
    for key in ("cpu", "memory", "ephemeral-storage"):
        assert QUANTITY.match(allocatable.get(key, "")), (where, key, allocatable)
    gpu_shape = "nvidia.com/gpu.product" in labels
    assert ("nvidia.com/gpu" in allocatable) == gpu_shape, where
    if gpu_shape:
        assert int(allocatable["nvidia.com/gpu"]) > 0, where
    assert dict(machine.resources.resources), where

    if kind == "bare-metal":
        assert machine.capacity_type == pb.CAPACITY_TYPE_BARE_METAL, where
        assert machine.interruption_probability == 0, where
        assert labels.get("topology.kubernetes.io/rack"), where
        assert machine.id.startswith("bm-"), where
    else:
        assert machine.capacity_type in {
            pb.CAPACITY_TYPE_SPOT,
            pb.CAPACITY_TYPE_ON_DEMAND,
            pb.CAPACITY_TYPE_RESERVED,
        }, where
        assert machine.id.startswith(ID_PREFIX[kind]), where


async def test_every_machine_in_the_inventory_is_in_shape(harness: Harness) -> None:
    listing = await harness.client.list_all()
    assert listing.machines
    for machine in listing.machines:
        check_shape(machine, harness.kind)
    capacity = {m.capacity_type for m in listing.machines}
    if harness.kind == "sim-cloud":
        assert capacity == {
            pb.CAPACITY_TYPE_SPOT,
            pb.CAPACITY_TYPE_ON_DEMAND,
            pb.CAPACITY_TYPE_RESERVED,
        }
        assert any("nvidia.com/gpu" in m.allocatable.resources for m in listing.machines)


async def test_every_state_a_machine_passes_through_is_in_shape(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.machine()
    observations = [machine]
    observations.append((await harness.client.create(machine.id, shard.token())).machine)
    observations.append(await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE))
    configure = await harness.client.configure(machine.id, "c", b"", shard.token(), {"k": "v"})
    observations.append(configure.machine)
    observations.append(await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED))
    observations.append((await harness.client.drain(machine.id, 0, shard.token())).machine)
    observations.append(await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE))
    if harness.has_delete:
        observations.append((await harness.client.delete(machine.id, shard.token())).machine)
        observations.append(await harness.wait_state(machine.id, pb.MACHINE_STATE_SPECULATIVE))
    for observation in observations:
        check_shape(observation, harness.kind)
    hosts = {o.host.provider for o in observations if o.HasField("host")}
    assert len(hosts) == 1  # a stable host identity


async def test_a_failed_machine_is_in_shape() -> None:
    for kind in KINDS:
        running = await serve(kind, error_rate={"configure": 1.0})
        try:
            async with ProviderClient(running.address) as client:
                h = Harness(kind, running, client)
                shard = h.shard()
                machine = await h.idle(shard)
                await client.configure(machine.id, "c", b"", shard.token(), {"k": "v"})
                failed = await h.wait_state(machine.id, pb.MACHINE_STATE_FAILED)
                check_shape(failed, kind)
        finally:
            await running.stop(grace=None)


@pytest.mark.parametrize("scale", [0.05, 1.0])
async def test_machine_ids_are_unique_across_providers(scale: float) -> None:
    servers = [
        await serve("sim-cloud", quota_scale=scale),
        await serve("bare-metal", quota_scale=scale),
        await serve("sim-cloud", quota_scale=scale, name="simcloud-two"),
    ]
    try:
        ids: list[str] = []
        for running in servers:
            async with ProviderClient(running.address) as client:
                ids.extend(m.id for m in (await client.list_all()).machines)
        assert len(ids) == len(set(ids))
        assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", i) for i in ids)
    finally:
        for running in servers:
            await running.stop(grace=None)
