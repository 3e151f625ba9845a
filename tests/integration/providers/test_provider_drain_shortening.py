"""A repeated Drain with a smaller grace shortens the drain in flight: same
operation id, finished no later than the new grace from now; a larger or
equal grace never extends it. Over gRPC for both kinds, plus exact timing and
persistence on a manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import ProviderClient
from providers.clock import ManualScheduler
from providers.config import LatencyRange, ProviderConfig
from providers.core import ProviderCore
from providers.kinds import build_provider
from providers.model import State
from providers.store import StateStore
from tests.integration.providers.provider_harness import (
    KINDS,
    SIMULATED_KINDS,
    Harness,
    Shard,
    serve,
)

#: Workloads that take a million simulated seconds to leave: about 17 real
#: minutes at the suite's time factor, far beyond any wait in these tests, so
#: a drain finishes within a test only if its grace forces it.
SLOW_WORKLOADS = LatencyRange(1_000_000.0, 1_000_000.0)
LONG_GRACE = 1_000_000
#: About one real second at the suite's time factor.
SHORT_GRACE = 1_000


@pytest.fixture(scope="module", params=KINDS)
async def slow(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """A provider of one kind whose drains only finish when the grace forces them."""
    kind: str = request.param
    running = await serve(kind, drain_latency_s=SLOW_WORKLOADS)
    client = ProviderClient(running.address)
    try:
        yield Harness(kind, running, client)
    finally:
        await client.close()
        await running.stop(grace=None)


async def draining(slow: Harness, shard: Shard, grace: int) -> tuple[str, str]:
    """A configured machine put into a drain with ``grace``: (id, operation id)."""
    machine = await slow.configured(shard=shard)
    ack = await slow.client.drain(machine.id, grace, shard.token())
    assert ack.machine.state == pb.MACHINE_STATE_DRAINING
    return machine.id, ack.operation_id


async def test_a_smaller_grace_keeps_the_operation_and_finishes_the_drain_sooner(
    slow: Harness,
) -> None:
    shard = slow.shard()
    machine_id, operation_id = await draining(slow, shard, LONG_GRACE)

    again = await slow.client.drain(machine_id, 0, shard.token())

    assert again.operation_id == operation_id
    assert again.machine.state == pb.MACHINE_STATE_DRAINING
    # The original grace would keep it DRAINING for about 17 real minutes.
    idle = await slow.wait_state(machine_id, pb.MACHINE_STATE_IDLE)
    assert idle.cluster == "" and not idle.shard_metadata and idle.last_error == ""
    after = await slow.client.drain(machine_id, 0, shard.token())
    assert after.operation_id == operation_id, "the finished drain is still the answer"


async def test_a_larger_grace_does_not_extend_a_drain(slow: Harness) -> None:
    shard = slow.shard()
    machine_id, operation_id = await draining(slow, shard, SHORT_GRACE)

    again = await slow.client.drain(machine_id, LONG_GRACE, shard.token())

    assert again.operation_id == operation_id
    # Forced at the first grace (about a real second), not the larger one.
    await slow.wait_state(machine_id, pb.MACHINE_STATE_IDLE)


async def test_a_shortened_drain_is_not_lengthened_again(slow: Harness) -> None:
    shard = slow.shard()
    machine_id, operation_id = await draining(slow, shard, LONG_GRACE)
    await slow.client.drain(machine_id, SHORT_GRACE, shard.token())

    again = await slow.client.drain(machine_id, LONG_GRACE, shard.token())

    assert again.operation_id == operation_id
    await slow.wait_state(machine_id, pb.MACHINE_STATE_IDLE)


async def test_a_fenced_drain_does_not_shorten_anything(slow: Harness) -> None:
    shard = slow.shard()
    machine_id, _ = await draining(slow, shard, LONG_GRACE)
    before = slow.core.stats["drains_shortened"]
    stale = Shard(shard.shard_id, shard.epoch, 0)

    with pytest.raises(Exception, match="not newer"):
        await slow.client.drain(machine_id, 0, stale.token())

    assert slow.core.stats["drains_shortened"] == before
    machine = await slow.client.get(machine_id)
    assert machine.state == pb.MACHINE_STATE_DRAINING


# ---------------------------------------------------------------- manual clock


def manual(kind: str, **overrides: object) -> tuple[ProviderCore, ManualScheduler]:
    scheduler = ManualScheduler()
    settings: dict[str, object] = {
        "quota_scale": 0.15 if kind == "sim-cloud" else 1.0,
        "interruption_scale": 0.0,
        "commission_s": 0.0,
        "drain_latency_s": LatencyRange(500.0, 500.0),
    }
    settings.update(overrides)
    provider = build_provider(ProviderConfig(kind=kind, **settings), scheduler=scheduler)  # type: ignore[arg-type]
    provider.start()
    return provider, scheduler


def configured(provider: ProviderCore, clock: ManualScheduler) -> str:
    machine_id = provider.list([State.SPECULATIVE]).machines[0].id
    provider.create(machine_id)
    clock.advance(10_000)
    provider.configure(machine_id, "cluster-a")
    clock.advance(10_000)
    assert provider.get(machine_id).state is State.CONFIGURED
    return machine_id


@pytest.mark.parametrize("kind", SIMULATED_KINDS)
def test_the_shortened_drain_finishes_exactly_at_the_new_grace(kind: str) -> None:
    provider, clock = manual(kind)
    machine_id = configured(provider, clock)
    first = provider.drain(machine_id, 300)  # would finish after 300 s + 1..5 s
    clock.advance(100)

    again = provider.drain(machine_id, 50)

    assert again.operation_id == first.operation_id
    clock.advance(49.99)
    assert provider.get(machine_id).state is State.DRAINING
    clock.advance(0.02)
    assert provider.get(machine_id).state is State.IDLE


@pytest.mark.parametrize("kind", SIMULATED_KINDS)
def test_a_smaller_grace_that_would_finish_later_changes_nothing(kind: str) -> None:
    """Workloads that leave by themselves in 20 s finish then, whatever the grace."""
    provider, clock = manual(kind, drain_latency_s=LatencyRange(20.0, 20.0))
    machine_id = configured(provider, clock)
    provider.drain(machine_id, 300)  # finishes after 20 s + 1..5 s
    provider.drain(machine_id, 200)
    clock.advance(25.01)
    assert provider.get(machine_id).state is State.IDLE


@pytest.mark.parametrize("kind", SIMULATED_KINDS)
def test_the_scheduled_completion_honours_the_time_factor(kind: str) -> None:
    provider, clock = manual(kind, time_factor=0.01)
    machine_id = configured(provider, clock)
    provider.drain(machine_id, 300)
    provider.drain(machine_id, 100)
    clock.advance(0.999)
    assert provider.get(machine_id).state is State.DRAINING
    clock.advance(0.002)
    assert provider.get(machine_id).state is State.IDLE


@pytest.mark.parametrize("kind", SIMULATED_KINDS)
def test_a_stuck_drain_stays_stuck_and_fails_at_its_deadline(kind: str) -> None:
    provider, clock = manual(kind, stuck_rate={"drain": 1.0}, deadlines_s={"drain": 60.0})
    machine_id = configured(provider, clock)
    provider.drain(machine_id, 300)
    provider.drain(machine_id, 0)
    clock.advance(359.99)
    assert provider.get(machine_id).state is State.DRAINING
    clock.advance(0.02)
    assert provider.get(machine_id).state is State.FAILED


@pytest.mark.parametrize("kind", SIMULATED_KINDS)
def test_the_lowered_grace_is_journaled(kind: str, tmp_path: Path) -> None:
    state = tmp_path / "provider.json"
    provider, clock = manual(kind, state_path=state)
    machine_id = configured(provider, clock)
    provider.drain(machine_id, 300)
    provider.drain(machine_id, 40)
    provider.drain(machine_id, 90)  # larger: changes nothing

    doc = StateStore(state).load()

    assert doc is not None
    assert doc["machines"][machine_id]["drain_grace"] == 40
    assert provider.stats["drains_shortened"] == 1
    provider.close()
