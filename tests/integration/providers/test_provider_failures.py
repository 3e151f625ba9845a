"""Failures over the wire: injected errors, stuck transitions that hit their
deadline, late completions that are discarded, FAILED as terminal, spot
interruptions, launch rate limits and rack commissioning."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import ProviderClient
from providers.errors import Fenced, InvalidTransition, ProviderError, Unimplemented
from tests.integration.providers.provider_harness import KINDS, Harness, serve


@asynccontextmanager
async def provider(kind: str, **overrides: object) -> AsyncIterator[Harness]:
    running = await serve(kind, **overrides)
    client = ProviderClient(running.address)
    try:
        yield Harness(kind, running, client)
    finally:
        await client.close()
        await running.stop(grace=None)


async def assert_terminal(h: Harness, machine_id: str) -> None:
    """FAILED refuses every mutation (never as fenced) and keeps last_error."""
    failed = await h.client.get(machine_id)
    assert failed.state == pb.MACHINE_STATE_FAILED and failed.last_error
    shard = h.shard()
    attempts = [
        h.client.create(machine_id, shard.token()),
        h.client.configure(machine_id, "c", b"", shard.token()),
        h.client.drain(machine_id, 0, shard.token()),
        h.client.delete(machine_id, shard.token()),
    ]
    for attempt in attempts:
        with pytest.raises(ProviderError) as caught:
            await attempt
        assert isinstance(caught.value, InvalidTransition | Unimplemented)
        assert not isinstance(caught.value, Fenced)
    for _ in range(3):
        again = await h.client.get(machine_id)
        assert again.state == pb.MACHINE_STATE_FAILED
        assert again.last_error == failed.last_error
    listed = await h.client.list([pb.MACHINE_STATE_FAILED])
    assert machine_id in {m.id for m in listed.machines}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_create_that_errors_goes_failed_and_stays_there(kind: str) -> None:
    async with provider(kind, error_rate={"create": 1.0}) as h:
        machine = await h.machine()
        await h.client.create(machine.id, h.shard().token())
        failed = await h.wait_state(machine.id, pb.MACHINE_STATE_FAILED)
        assert "create failed" in failed.last_error
        assert failed.HasField("host")  # the host that failed to come up
        await assert_terminal(h, machine.id)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stuck_configure_fails_at_its_deadline_with_the_binding_cleared(
    kind: str,
) -> None:
    async with provider(kind, stuck_rate={"configure": 1.0}) as h:
        machine = await h.idle()
        ack = await h.client.configure(machine.id, "cluster-x", b"", None, {"k": "v"})
        assert ack.machine.state == pb.MACHINE_STATE_CONFIGURING
        failed = await h.wait_state(machine.id, pb.MACHINE_STATE_FAILED)
        assert "deadline" in failed.last_error and "cluster-x" in failed.last_error
        assert failed.cluster == "" and dict(failed.shard_metadata) == {}
        await assert_terminal(h, machine.id)
        assert h.core.stats["deadlines_missed"] >= 1


@pytest.mark.parametrize("kind", KINDS)
async def test_a_late_completion_is_discarded(kind: str) -> None:
    async with provider(kind, late_rate={"drain": 1.0}) as h:
        machine = await h.configured()
        await h.client.drain(machine.id, 0, None)
        await h.wait_state(machine.id, pb.MACHINE_STATE_FAILED)
        stats = h.core.stats
        # Wait (bounded) for the late completion to arrive, then check it changed nothing.
        await h.wait_until(lambda: stats["late_completions_discarded"] >= 1)
        settled = await h.client.get(machine.id)
        assert settled.state == pb.MACHINE_STATE_FAILED and settled.cluster == ""


@pytest.mark.parametrize("kind", KINDS)
async def test_a_drain_with_zero_grace_ends_idle_never_stuck(kind: str) -> None:
    async with provider(kind) as h:
        machine = await h.configured()
        await h.client.drain(machine.id, 0, None)
        settled = await h.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
        assert settled.cluster == ""


@pytest.mark.parametrize("kind", KINDS)
async def test_failed_machines_are_released_after_the_cleanup_hold(kind: str) -> None:
    async with provider(kind, error_rate={"create": 1.0}, failed_cleanup_s=60.0) as h:
        machine = await h.machine()
        await h.client.create(machine.id, None)
        await h.wait_state(machine.id, pb.MACHINE_STATE_FAILED)
        released = await h.wait_state(machine.id, pb.MACHINE_STATE_SPECULATIVE)
        assert not released.HasField("host") and released.last_error == ""


async def test_an_operator_can_clear_a_failed_machine() -> None:
    async with provider("sim-cloud", error_rate={"configure": 1.0}) as h:
        machine = await h.idle()
        await h.client.configure(machine.id, "c", b"", None)
        await h.wait_state(machine.id, pb.MACHINE_STATE_FAILED)
        h.core.clear_failed(machine.id)
        cleared = await h.client.get(machine.id)
        assert cleared.state == pb.MACHINE_STATE_SPECULATIVE
        await h.client.create(machine.id, None)
        await h.wait_state(machine.id, pb.MACHINE_STATE_IDLE)


async def test_spot_machines_are_interrupted_and_the_shard_can_see_it() -> None:
    # Interruptions ~10^5 times likelier than declared: within milliseconds.
    async with provider("sim-cloud", interruption_scale=1e5) as h:
        spot = await h.machine(lambda m: m.capacity_type == pb.CAPACITY_TYPE_SPOT)
        on_demand = await h.machine(lambda m: m.capacity_type == pb.CAPACITY_TYPE_ON_DEMAND)
        assert spot.interruption_probability > 0 and on_demand.interruption_probability == 0
        await h.client.create(spot.id, None)
        await h.client.create(on_demand.id, None)
        failed = await h.wait_state(spot.id, pb.MACHINE_STATE_FAILED)
        assert failed.last_error.startswith("spot interruption")
        assert h.core.stats["spot_interruptions"] >= 1
        # The on-demand launch may still be in flight: it ends idle, never failed.
        idle = await h.wait_state(on_demand.id, pb.MACHINE_STATE_IDLE)
        assert idle.last_error == ""


async def test_launches_beyond_the_account_rate_limit_are_queued_not_refused() -> None:
    """One launch token per 200 ms of real time and a burst of 2: five
    simultaneous creates on one account all succeed, some after queueing.
    (The exact schedule is checked on a manual clock in test_provider_clock.)"""
    async with provider(
        "sim-cloud",
        run_instances_per_second=0.005,
        run_instances_burst=2,
        deadlines_s={"create": 1e5},
    ) as h:
        first = await h.machine()
        account = first.labels["bigfleet.io/account"]
        machines = [first]
        while len(machines) < 5:
            machines.append(await h.machine(lambda m: m.labels["bigfleet.io/account"] == account))
        await asyncio.gather(*(h.client.create(m.id, None) for m in machines))
        for machine in machines:
            await h.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
        assert h.core.stats["launches_queued_by_rate_limit"] >= 1


async def test_a_rack_being_commissioned_delays_create_until_it_is_ready() -> None:
    async with provider("bare-metal", commission_s=200.0) as h:
        pending = await h.machine(lambda m: m.labels["bigfleet.io/commissioned"] == "false")
        rack = pending.labels["topology.kubernetes.io/rack"]
        ack = await h.client.create(pending.id, None)
        assert ack.machine.state == pb.MACHINE_STATE_CREATING
        idle = await h.wait_state(pending.id, pb.MACHINE_STATE_IDLE)
        assert idle.labels["bigfleet.io/commissioned"] == "true"
        rack_mates = [
            m
            for m in (await h.client.list_all()).machines
            if m.labels["topology.kubernetes.io/rack"] == rack
        ]
        assert rack_mates and all(
            m.labels["bigfleet.io/commissioned"] == "true" for m in rack_mates
        )
