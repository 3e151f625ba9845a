"""The simulation's timing on a manual clock, where it is exact: latencies,
the time factor, deadlines, the launch token bucket, commissioning, spot
interruptions; and the recording fake built on the same core."""

from __future__ import annotations

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.bare_metal import COMMISSIONED_LABEL
from providers.clock import ManualScheduler
from providers.config import LatencyRange, ProviderConfig
from providers.core import ProviderCore
from providers.errors import NotFound, ProviderUnavailable
from providers.fake import FakeProvider
from providers.kinds import build_provider
from providers.model import CapacityType, State


def make(kind: str = "sim-cloud", **overrides: object) -> tuple[ProviderCore, ManualScheduler]:
    scheduler = ManualScheduler()
    settings: dict[str, object] = {"quota_scale": 0.1, "interruption_scale": 0.0}
    settings.update(overrides)
    config = ProviderConfig(kind=kind, **settings)  # type: ignore[arg-type]
    provider = build_provider(config, scheduler=scheduler)
    provider.start()
    return provider, scheduler


def first(provider: ProviderCore, *, account: str | None = None) -> list[str]:
    return [
        m.id
        for m in provider.list([State.SPECULATIVE]).machines
        if account is None or m.labels.get("bigfleet.io/account") == account
    ]


def test_a_cloud_create_takes_between_30_and_90_simulated_seconds() -> None:
    provider, clock = make()
    machine = first(provider)[0]
    provider.create(machine)
    clock.advance(29.99)
    assert provider.get(machine).state is State.CREATING
    clock.advance(60.02)
    assert provider.get(machine).state is State.IDLE


def test_the_time_factor_scales_every_latency() -> None:
    provider, clock = make(time_factor=0.001)
    machine = first(provider)[0]
    provider.create(machine)
    clock.advance(0.02999)
    assert provider.get(machine).state is State.CREATING
    clock.advance(0.06002)
    assert provider.get(machine).state is State.IDLE


def test_a_stuck_transition_fails_exactly_at_its_deadline() -> None:
    provider, clock = make(stuck_rate={"create": 1.0}, deadlines_s={"create": 120.0})
    machine = first(provider)[0]
    provider.create(machine)
    clock.advance(119.9)
    assert provider.get(machine).state is State.CREATING
    clock.advance(0.2)
    failed = provider.get(machine)
    assert failed.state is State.FAILED and "deadline" in failed.last_error


def test_deadlines_can_differ_per_capacity_type() -> None:
    provider, clock = make(
        stuck_rate={"create": 1.0},
        deadlines_s={"create": 500.0},
        deadline_overrides_s={"spot": {"create": 100.0}},
    )
    spot = next(m.id for m in provider.list().machines if m.capacity_type is CapacityType.SPOT)
    other = next(m.id for m in provider.list().machines if m.capacity_type is not CapacityType.SPOT)
    provider.create(spot)
    provider.create(other)
    clock.advance(101)
    assert provider.get(spot).state is State.FAILED
    assert provider.get(other).state is State.CREATING


def test_the_launch_bucket_spaces_launches_beyond_its_burst() -> None:
    provider, clock = make(
        run_instances_per_second=1.0,
        run_instances_burst=2,
        create_latency_s=LatencyRange(10.0, 10.0),
    )
    machines = first(provider, account="fleet-a")[:5]
    for machine in machines:
        provider.create(machine)
    assert provider.stats["launches_queued_by_rate_limit"] == 3

    def idle() -> int:
        return sum(provider.get(m).state is State.IDLE for m in machines)

    clock.advance(9.999)
    assert idle() == 0
    clock.advance(0.002)  # t = 10.001: the burst of two launched at once
    assert idle() == 2
    for expected in (3, 4, 5):  # then one launch per second
        clock.advance(1.0)
        assert idle() == expected


def test_accounts_have_separate_buckets() -> None:
    provider, _ = make(run_instances_per_second=1.0, run_instances_burst=1)
    provider.create(first(provider, account="fleet-a")[0])
    provider.create(first(provider, account="fleet-b")[0])
    assert provider.stats["launches_queued_by_rate_limit"] == 0


def test_spot_interruptions_follow_the_declared_probability() -> None:
    """With p = 0.5 per hour, about half of the spot machines are lost in a
    simulated hour (the seed makes it exact)."""
    provider, clock = make(quota_scale=1.0, interruption_scale=1.0)
    spot = [
        m.id
        for m in provider.list([State.SPECULATIVE]).machines
        if m.capacity_type is CapacityType.SPOT
    ]
    for machine in spot:
        provider.create(machine)
    clock.advance(100)
    hosted = [m for m in spot if provider.get(m).state is State.IDLE]
    clock.advance(3600)
    lost = [m for m in hosted if provider.get(m).state is State.FAILED]
    probabilities = [provider.get(m).interruption_probability for m in hosted]
    expected = sum(probabilities)
    assert len(lost) > 0
    assert abs(len(lost) - expected) < 4 * expected**0.5 + 1
    for machine in lost:
        assert provider.get(machine).last_error.startswith("spot interruption")


def test_an_uncommissioned_rack_is_ready_after_the_commissioning_time() -> None:
    provider, clock = make("bare-metal", quota_scale=1.0, commission_s=600.0)
    pending = [m.id for m in provider.list().machines if m.labels[COMMISSIONED_LABEL] == "false"]
    ready = next(m.id for m in provider.list().machines if m.labels[COMMISSIONED_LABEL] == "true")
    provider.create(pending[0])
    provider.create(ready)
    clock.advance(1.5)
    assert provider.get(ready).state is State.IDLE  # near-instant claim
    assert provider.get(pending[0]).state is State.CREATING
    clock.advance(598)
    assert provider.get(pending[0]).state is State.CREATING
    clock.advance(2)
    assert provider.get(pending[0]).state is State.IDLE
    assert all(provider.get(m).labels[COMMISSIONED_LABEL] == "true" for m in pending)


def test_bare_metal_prices_are_zero_or_amortised() -> None:
    zero, _ = make("bare-metal")
    amortised, _ = make("bare-metal", bare_metal_pricing="amortised")
    assert {m.price_per_hour for m in zero.list().machines} == {0.0}
    assert all(m.price_per_hour > 0 for m in amortised.list().machines)
    assert {m.interruption_probability for m in amortised.list().machines} == {0.0}


def test_the_same_seed_builds_the_same_inventory() -> None:
    a, _ = make(seed=3)
    b, _ = make(seed=3)
    assert [(m.id, m.price_per_hour) for m in a.list().machines] == [
        (m.id, m.price_per_hour) for m in b.list().machines
    ]


def test_quota_scale_shrinks_the_inventory() -> None:
    small, _ = make(quota_scale=0.05)
    full, _ = make(quota_scale=1.0)
    assert 0 < len(small.machine_ids()) < len(full.machine_ids()) / 10


def test_a_closed_provider_is_unavailable() -> None:
    provider, _ = make()
    provider.close()
    with pytest.raises(ProviderUnavailable):
        provider.list()


# ---------------------------------------------------------------------- the fake


async def test_the_fake_records_calls_and_injects_errors() -> None:
    fake = FakeProvider()
    machine = fake.speculative()[0]
    fake.next_error_for["create"] = ProviderUnavailable("injected")
    with pytest.raises(ProviderUnavailable):
        await fake.create(machine.id, None)
    ack = await fake.create(machine.id, None)
    assert ack.machine.state == pb.MACHINE_STATE_CREATING
    fake.advance(120)
    assert (await fake.get(machine.id)).state == pb.MACHINE_STATE_IDLE
    assert [c.method for c in fake.calls] == ["create", "create", "get"]
    assert fake.calls_to("create")[0].args == {"machine_id": machine.id, "token": None}

    fake.next_error = NotFound("any method")
    with pytest.raises(NotFound):
        await fake.list_all()
    fake.reset()
    assert fake.calls == [] and fake.next_error is None
    listing = await fake.list_all()
    assert listing.machines and listing.revision


async def test_the_fake_speaks_the_same_contract_as_the_wire() -> None:
    fake = FakeProvider(config=ProviderConfig(kind="bare-metal", quota_scale=0.2))
    machine = fake.speculative()[0]
    await fake.create(machine.id, None)
    fake.advance(5)
    await fake.configure(machine.id, "c", b"", None, {"k": "v"})
    fake.advance(600)
    configured = await fake.get(machine.id)
    assert configured.cluster == "c" and dict(configured.shard_metadata) == {"k": "v"}
